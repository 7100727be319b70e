//! Kong's router flavors and the ATC expression language of its routes, parsed and checked by
//! Kong's own engine (the `atc-router` crate, the Rust library Kong's router runs on), so that
//! the grammar, the operator and type rules and the messages are Kong's by construction.
//!
//! What is Kong's and not the crate's is here too: the HTTP and stream schemas
//! (`kong/router/fields.lua`), the `net.port` amendment and the `http.path.segments.*` shape
//! check (`kong/router/transform.lua`, `kong/db/schema/entities/routes.lua`). Limits on size
//! and nesting keep a hostile expression from exhausting the stack of the thread that reads it
//! (Kong has none; an expression past them is refused with a message that says which).

use std::sync::LazyLock;

pub use atc_router::ast::{
    BinaryOperator, Expression, Lhs, LhsTransformations, LogicalExpression, Predicate, Type, Value,
};
pub use atc_router::schema::Schema;
use atc_router::semantics::Validate;

/// `router_flavor` in kong.conf.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RouterFlavor {
    /// Kong's 2.x router: routes ordered by their fields, then by creation time.
    Traditional,
    /// Kong 3.x's default: traditional routes translated to ATC matchers, ordered by Kong's
    /// 64-bit priority, ties by route id.
    #[default]
    TraditionalCompatible,
    /// Routes may carry an `expression` and a `priority`.
    Expressions,
}

impl RouterFlavor {
    pub fn parse(s: &str) -> Option<RouterFlavor> {
        Some(match s {
            "traditional" => RouterFlavor::Traditional,
            "traditional_compatible" => RouterFlavor::TraditionalCompatible,
            "expressions" => RouterFlavor::Expressions,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            RouterFlavor::Traditional => "traditional",
            RouterFlavor::TraditionalCompatible => "traditional_compatible",
            RouterFlavor::Expressions => "expressions",
        }
    }

    /// Whether routes are validated as Kong's ATC flavors validate them.
    pub fn is_atc(self) -> bool {
        self != RouterFlavor::Traditional
    }
}

/// Kong's `HTTP_FIELDS` (`kong/router/fields.lua`).
pub static HTTP_SCHEMA: LazyLock<Schema> = LazyLock::new(|| {
    let mut s = Schema::default();
    for f in [
        "net.protocol",
        "tls.sni",
        "http.method",
        "http.host",
        "http.path",
        "http.path.segments.*",
        "http.headers.*",
        "http.queries.*",
    ] {
        s.add_field(f, Type::String);
    }
    for f in ["net.src.port", "net.dst.port", "http.path.segments.len"] {
        s.add_field(f, Type::Int);
    }
    for f in ["net.src.ip", "net.dst.ip"] {
        s.add_field(f, Type::IpAddr);
    }
    s
});

/// Kong's `STREAM_FIELDS`.
pub static STREAM_SCHEMA: LazyLock<Schema> = LazyLock::new(|| {
    let mut s = Schema::default();
    for f in ["net.protocol", "tls.sni"] {
        s.add_field(f, Type::String);
    }
    for f in ["net.src.port", "net.dst.port"] {
        s.add_field(f, Type::Int);
    }
    for f in ["net.src.ip", "net.dst.ip"] {
        s.add_field(f, Type::IpAddr);
    }
    s
});

/// The schema an expression is checked against: the stream one when the route's first
/// protocol is a stream protocol (Kong's `atc.schema(protocols)`).
pub fn schema_for(first_protocol: Option<&str>) -> &'static Schema {
    match first_protocol {
        Some("tcp" | "udp" | "tls" | "tls_passthrough") => &STREAM_SCHEMA,
        _ => &HTTP_SCHEMA,
    }
}

/// The longest expression read (64 KiB): far past any route written by hand or by decK.
pub const MAX_EXPRESSION_LEN: usize = 64 * 1024;
/// The deepest nesting of parentheses read.
pub const MAX_NESTING: usize = 64;
/// The most predicates in one expression.
pub const MAX_PREDICATES: usize = 2048;

/// Kong's prefix of every expression error shown by the Admin API.
pub const FAILED: &str = "Router Expression failed validation: ";

/// Kong's `amending_expression`: the deprecated `net.port` field read as `net.dst.port`
/// (`(net\.port)(\s*)([=><!])` replaced by `net.dst.port$2$3`).
pub fn amend(expr: &str) -> std::borrow::Cow<'_, str> {
    if !expr.contains("net.port") {
        return expr.into();
    }
    static NET_PORT: LazyLock<regex::Regex> =
        LazyLock::new(|| regex::Regex::new(r"(net\.port)(\s*)([=><!])").unwrap());
    NET_PORT.replace_all(expr, "net.dst.port$2$3")
}

/// Nesting depth of parentheses outside string literals, and the number of comparison
/// operators (an upper bound on the predicates), found without parsing.
fn shape(expr: &str) -> (usize, usize) {
    let b = expr.as_bytes();
    let (mut depth, mut max, mut ops) = (0usize, 0usize, 0usize);
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
            }
            b'r' if b.get(i + 1) == Some(&b'#') && b.get(i + 2) == Some(&b'"') => {
                i += 3;
                while i + 1 < b.len() && !(b[i] == b'"' && b[i + 1] == b'#') {
                    i += 1;
                }
                i += 1;
            }
            b'(' => {
                depth += 1;
                max = max.max(depth);
            }
            b')' => depth = depth.saturating_sub(1),
            b'=' | b'~' | b'>' | b'<' => {
                ops += 1;
                // `==`, `>=`, `^=`... count once.
                if matches!(b.get(i + 1), Some(b'=') | Some(b'^')) {
                    i += 1;
                }
            }
            b'i' if b.get(i + 1) == Some(&b'n') => ops += 1,
            _ => {}
        }
        i += 1;
    }
    (max, ops)
}

/// Parses and checks `expr` (already amended) against `schema` as Kong's
/// `router.validate` does, then Kong's `http.path.segments.*` shape rule. The error is the
/// engine's own text (without Kong's prefix), cut at Kong's 4 KiB error buffer.
pub fn parse(expr: &str, schema: &Schema) -> Result<Expression, String> {
    if expr.len() > MAX_EXPRESSION_LEN {
        return Err(format!("expression longer than {MAX_EXPRESSION_LEN} bytes"));
    }
    let (depth, ops) = shape(expr);
    if depth > MAX_NESTING {
        return Err(format!(
            "parentheses nested deeper than {MAX_NESTING} levels"
        ));
    }
    if ops > MAX_PREDICATES * 2 {
        return Err(format!("more than {MAX_PREDICATES} predicates"));
    }
    let ast = atc_router::parser::parse(expr).map_err(|e| kong_error(e.to_string()))?;
    if count_predicates(&ast) > MAX_PREDICATES {
        return Err(format!("more than {MAX_PREDICATES} predicates"));
    }
    ast.validate(schema).map_err(kong_error)?;
    let mut bad_segments = false;
    visit_predicates(&ast, &mut |p| {
        if let Some(suffix) = p.lhs.var_name.strip_prefix("http.path.segments.") {
            bad_segments |= suffix != "len" && !segments_shape(suffix);
        }
    });
    if bad_segments {
        return Err("illformed http.path.segments.* field".into());
    }
    Ok(ast)
}

/// Kong's `^(0|[1-9]\d*)(_([1-9]\d*))?$` with the first index below the second.
fn segments_shape(s: &str) -> bool {
    let num = |t: &str| {
        (!t.is_empty()
            && t.bytes().all(|b| b.is_ascii_digit())
            && (t == "0" || !t.starts_with('0')))
        .then(|| t.parse::<u64>().ok())
        .flatten()
    };
    match s.split_once('_') {
        None => num(s).is_some(),
        Some((a, b)) => match (num(a), num(b)) {
            (Some(a), Some(b)) => b != 0 && a < b,
            _ => false,
        },
    }
}

/// Kong reads the error into a 4 KiB buffer.
fn kong_error(mut e: String) -> String {
    if e.len() > 4096 {
        let mut cut = 4096;
        while !e.is_char_boundary(cut) {
            cut -= 1;
        }
        e.truncate(cut);
    }
    e
}

/// Calls `f` on every predicate, left to right.
pub fn visit_predicates<'e>(e: &'e Expression, f: &mut impl FnMut(&'e Predicate)) {
    // An explicit stack: a long chain of `&&` is a deep tree.
    let mut stack = vec![e];
    while let Some(e) = stack.pop() {
        match e {
            Expression::Predicate(p) => f(p),
            Expression::Logical(l) => match l.as_ref() {
                LogicalExpression::And(a, b) | LogicalExpression::Or(a, b) => {
                    stack.push(b);
                    stack.push(a);
                }
                LogicalExpression::Not(a) => stack.push(a),
            },
        }
    }
}

fn count_predicates(e: &Expression) -> usize {
    let mut n = 0;
    visit_predicates(e, &mut |_| n += 1);
    n
}

/// Kong's `escape_str`: a raw string unless the value holds `"#`.
pub fn escape_str(s: &str) -> String {
    if !s.contains("\"#") {
        return format!("r#\"{s}\"#");
    }
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(e: &str) -> String {
        parse(&amend(e), &HTTP_SCHEMA).unwrap_err()
    }

    #[test]
    fn kong_messages_come_from_the_engine() {
        assert_eq!(
            err("! a == 1"),
            " --> 1:1\n  |\n1 | ! a == 1\n  | ^---\n  |\n  = expected term"
        );
        assert_eq!(err(r#"http.foo == "x""#), "Unknown LHS field");
        assert_eq!(
            err(r#"http.path == 1"#),
            "Type mismatch between the LHS and RHS values of predicate"
        );
        assert_eq!(
            err(r#"net.src.port ~ "1""#),
            "Regex operators only supports string operands"
        );
        assert_eq!(
            err(r#"http.path.segments.2_1 == "x""#),
            "illformed http.path.segments.* field"
        );
        assert_eq!(
            err(r#"http.path.segments.01 == "x""#),
            "illformed http.path.segments.* field"
        );
        assert!(parse(r#"http.path.segments.0_2 == "a/b""#, &HTTP_SCHEMA).is_ok());
        assert!(parse(r#"http.path.segments.len == 2"#, &HTTP_SCHEMA).is_ok());
        assert!(err(r#"http.path ~ "(""#).contains("regex parse error"));
        assert_eq!(
            err(r#"http.path == "/a""#.replace("http", "tls").as_str()),
            "Unknown LHS field"
        );
        // The stream schema has no http fields.
        assert_eq!(
            parse(r#"http.path == "/""#, &STREAM_SCHEMA).unwrap_err(),
            "Unknown LHS field"
        );
    }

    #[test]
    fn net_port_is_read_as_net_dst_port() {
        assert_eq!(amend("net.port == 80"), "net.dst.port == 80");
        assert_eq!(amend("net.port>=80"), "net.dst.port>=80");
        assert!(parse(&amend("net.port == 80"), &HTTP_SCHEMA).is_ok());
    }

    /// Hostile sizes are refused before the engine's recursion can exhaust a small stack.
    #[test]
    fn hostile_expressions_are_refused_on_a_small_stack() {
        std::thread::Builder::new()
            .stack_size(2 * 1024 * 1024)
            .spawn(|| {
                let deep = format!(
                    "{}http.path == \"/\"{}",
                    "(".repeat(10_000),
                    ")".repeat(10_000)
                );
                assert!(err(&deep).contains("nested deeper"));
                let long = vec![r#"http.path == "/""#; 60_000].join(" && ");
                assert!(err(&long).contains("longer than"));
                let many = vec![r#"net.src.port==1"#; 3000].join("||");
                assert!(err(&many).contains("predicates"));
                let ok = vec![r#"http.path == "/""#; 2000].join(" && ");
                assert!(parse(&ok, &HTTP_SCHEMA).is_ok());
            })
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn escape_str_as_kong() {
        assert_eq!(escape_str("/a"), r##"r#"/a"#"##);
        assert_eq!(escape_str(r##"a"#b\c"##), r##""a\"#b\\c""##);
    }
}
