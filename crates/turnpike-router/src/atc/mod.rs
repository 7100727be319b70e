//! Routes as ATC matchers (Kong's `router_flavor = expressions`): a route's `expression`, or
//! its traditional fields translated as Kong translates them, with the `net.protocol` clause,
//! parsed by Kong's engine and evaluated against the request.
//!
//! So that routing stays an index, each matcher also states what its expression implies of
//! the request's host and path (an `http.host ==` or an `http.path ^=` every match must
//! satisfy): the router files it under those keys, and evaluates the whole expression only
//! for the candidates a request's host and path select.

pub mod eval;
pub mod translate;

use std::sync::Arc;

use turnpike_config::atc::{self, BinaryOperator, Expression, LogicalExpression, Value};
use turnpike_config::declarative::Route;

/// One compiled matcher of a route.
#[derive(Debug)]
pub struct Program {
    pub expr: Expression,
    /// Host keys (lower case) one of which every match has; `None`: any host.
    pub hosts: Option<Vec<Arc<str>>>,
    /// Path prefixes one of which every matched path starts with; `None`: any path.
    pub paths: Option<Vec<Arc<str>>>,
}

/// Kong's `EXPRESSION_ONLY_BIT`: an expression route ranks above translated ones.
pub const EXPRESSION_ONLY: u64 = 0xFF << 56;

/// A route's matchers under the expressions flavor, as ATC source: (expression, priority,
/// tie-break id). `traditional_priority` gives Kong's priority of one group of its paths.
pub fn sources(
    route: &Route,
    traditional_priority: impl Fn(&[&str]) -> u64,
) -> Result<Vec<(String, u64, uuid::Uuid)>, String> {
    let id = uuid::Uuid::parse_str(&route.id).unwrap_or_default();
    let clause = translate::protocol_clause(route);
    let with_clause = |e: String| match &clause {
        Some(c) => format!("{e} && {c}"),
        None => e,
    };
    if let Some(e) = route
        .expression
        .as_ref()
        .and_then(|e| e.expression.as_ref())
    {
        let priority = route.expression.as_ref().map_or(0, |e| e.priority);
        let src = with_clause(atc::amend(e).into_owned());
        return Ok(vec![(src, EXPRESSION_ONLY | priority, id)]);
    }
    let paths: Vec<String> = route.paths.as_deref().unwrap_or_default().to_vec();
    let mut groups = translate::path_groups(&paths);
    if groups.is_empty() {
        groups.push(Vec::new());
    }
    let split = groups.len() > 1;
    let mut out = Vec::new();
    for (i, g) in groups.iter().enumerate() {
        let Some(src) = translate::expression(route, g) else {
            return Err("no field to match on".into());
        };
        let uid = if split {
            translate::split_id(&route.id, i + 1)
        } else {
            id
        };
        out.push((with_clause(src), traditional_priority(g), uid));
    }
    Ok(out)
}

/// The route's matchers compiled: (program, priority, tie-break id). An error is the
/// engine's message for an expression that does not compile.
pub fn programs(
    route: &Route,
    traditional_priority: impl Fn(&[&str]) -> u64,
) -> Result<Vec<(Program, u64, uuid::Uuid)>, String> {
    let schema = atc::schema_for(route.protocols.first());
    sources(route, traditional_priority)?
        .into_iter()
        .map(|(src, priority, id)| Ok((program(&src, schema)?, priority, id)))
        .collect()
}

fn program(src: &str, schema: &atc::Schema) -> Result<Program, String> {
    let expr = atc::parse(src, schema)?;
    let hosts = implied(&expr, &|f, op| {
        f == "http.host" && op == &BinaryOperator::Equals
    })
    .map(|v| {
        v.into_iter()
            .map(|h| h.to_ascii_lowercase().into())
            .collect()
    });
    let paths = implied(&expr, &|f, op| {
        f == "http.path" && matches!(op, BinaryOperator::Equals | BinaryOperator::Prefix)
    })
    .map(|v| v.into_iter().map(Arc::from).collect());
    Ok(Program { expr, hosts, paths })
}

/// The string literals one of which every match of `e` has for a field (`take` picks the
/// field and operators), when `e` implies such a set: a predicate without transformations,
/// an `||` of such sets, an `&&` with one on either side.
fn implied(e: &Expression, take: &dyn Fn(&str, &BinaryOperator) -> bool) -> Option<Vec<String>> {
    match e {
        Expression::Predicate(p) => match &p.rhs {
            Value::String(s)
                if p.lhs.transformations.is_empty() && take(&p.lhs.var_name, &p.op) =>
            {
                Some(vec![s.clone()])
            }
            _ => None,
        },
        Expression::Logical(l) => match l.as_ref() {
            LogicalExpression::And(a, b) => implied(a, take).or_else(|| implied(b, take)),
            LogicalExpression::Or(a, b) => {
                let mut x = implied(a, take)?;
                x.extend(implied(b, take)?);
                Some(x)
            }
            LogicalExpression::Not(_) => None,
        },
    }
}

#[cfg(test)]
pub(crate) mod tests;
