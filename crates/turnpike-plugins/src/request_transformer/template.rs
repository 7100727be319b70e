//! Kong's request-transformer templates: `$(headers.x)`, `$(query_params["y"])`,
//! `$(uri_captures.z)` (or `uri_captures[1]`), alternatives joined by `or`, and quoted
//! strings (`$('$(kept)')` writes `$(kept)`). Kong evaluates the inside of `$(...)` as Lua in a
//! sandbox; here the expressions Kong documents are parsed once, when the config is built, and
//! anything else is refused then. A reference that finds nothing renders as an empty string,
//! as Penlight's templates do. Values come from the request as it arrived (Kong renders from
//! a copy taken before any change).

use http::HeaderMap;

/// One compiled value: text with expressions in it.
#[derive(Debug, Clone, PartialEq)]
pub struct Template(Vec<Piece>);

#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    /// Alternatives: the first that finds a value.
    Expr(Vec<Term>),
}

#[derive(Debug, Clone, PartialEq)]
enum Term {
    Header(String),
    Query(String),
    CaptureName(String),
    CaptureIndex(usize),
    Literal(String),
}

/// What templates read: the request as it arrived.
pub struct Env<'a> {
    pub headers: &'a HeaderMap,
    pub query: Option<&'a str>,
    pub captures: Option<&'a [(Option<String>, String)]>,
}

impl Template {
    /// Parses `text`; an expression Kong's documentation does not describe is an error.
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find("$(") {
            if at > 0 {
                pieces.push(Piece::Text(rest[..at].to_string()));
            }
            let inner_start = at + 2;
            let end = closing(&rest[inner_start..])
                .ok_or_else(|| format!("unclosed template in '{text}'"))?;
            let expr = &rest[inner_start..inner_start + end];
            pieces.push(Piece::Expr(parse_expr(expr).map_err(|e| {
                format!("unsupported template expression '$({expr})': {e}")
            })?));
            rest = &rest[inner_start + end + 1..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_string()));
        }
        Ok(Template(pieces))
    }

    /// Whether the value is the same for every request (no expression to evaluate).
    pub fn literal(&self) -> Option<String> {
        let mut out = String::new();
        for p in &self.0 {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Expr(terms) => match terms.as_slice() {
                    [Term::Literal(l), ..] => out.push_str(l),
                    _ => return None,
                },
            }
        }
        Some(out)
    }

    pub fn render(&self, env: &Env<'_>) -> String {
        let mut out = String::new();
        for p in &self.0 {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Expr(terms) => {
                    if let Some(v) = terms.iter().find_map(|t| t.eval(env)) {
                        out.push_str(&v);
                    }
                }
            }
        }
        out
    }
}

impl Term {
    fn eval(&self, env: &Env<'_>) -> Option<String> {
        match self {
            Term::Header(name) => {
                // ngx.req.get_headers: case-insensitive, `_` standing for `-`.
                let name = name.to_ascii_lowercase().replace('_', "-");
                let v = env.headers.get(name.as_str())?;
                Some(String::from_utf8_lossy(v.as_bytes()).into_owned())
            }
            Term::Query(name) => env
                .query
                .and_then(|q| crate::form::pairs(q).find_map(|(k, v)| (k == *name).then_some(v))),
            Term::CaptureName(name) => env.captures.and_then(|c| {
                c.iter()
                    .find(|(n, _)| n.as_deref() == Some(name.as_str()))
                    .map(|(_, v)| v.clone())
            }),
            Term::CaptureIndex(i) => env
                .captures
                .and_then(|c| c.get(i.checked_sub(1)?))
                .map(|(_, v)| v.clone()),
            Term::Literal(l) => Some(l.clone()),
        }
    }
}

/// The position of the `)` closing an expression, quotes and brackets respected.
fn closing(s: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '(' | '[') => depth += 1,
            (None, ']') => depth = depth.saturating_sub(1),
            (None, ')') if depth == 0 => return Some(i),
            (None, ')') => depth -= 1,
            _ => {}
        }
    }
    None
}

fn parse_expr(expr: &str) -> Result<Vec<Term>, String> {
    let mut terms = Vec::new();
    let mut rest = expr.trim();
    loop {
        let (term, after) = parse_term(rest)?;
        terms.push(term);
        let after = after.trim_start();
        if after.is_empty() {
            return Ok(terms);
        }
        if let (Some(name), Some(rest)) = (last_name(&terms), after.strip_prefix('-')) {
            // Lua reads `headers.x-v` as a subtraction.
            let word: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                .collect();
            return Err(format!(
                "a name with '-' is written headers[\"{name}-{word}\"] or headers.{}_{}",
                name,
                word.replace('-', "_")
            ));
        }
        rest = after
            .strip_prefix("or")
            .filter(|r| r.starts_with(|c: char| c.is_whitespace() || c == '\'' || c == '"'))
            .ok_or("expected `or` between alternatives")?
            .trim_start();
    }
}

/// The name the last term read with `.name`, if any.
fn last_name(terms: &[Term]) -> Option<&str> {
    match terms.last()? {
        Term::Header(n) | Term::Query(n) | Term::CaptureName(n) => Some(n),
        _ => None,
    }
}

/// A quoted string at the start of `s`: its text and what follows.
fn quoted(s: &str) -> Option<(String, &str)> {
    let q = s.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let end = s[1..].find(q)? + 1;
    Some((s[1..end].to_string(), &s[end + 1..]))
}

fn parse_term(s: &str) -> Result<(Term, &str), String> {
    if let Some((text, rest)) = quoted(s) {
        return Ok((Term::Literal(text), rest));
    }
    let ident_end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    let (source, rest) = s.split_at(ident_end);
    if !matches!(source, "headers" | "query_params" | "uri_captures") {
        return Err(format!(
            "only headers, query_params and uri_captures can be read, not '{source}'"
        ));
    }
    // `.name` or `["name"]` / `[1]`.
    let (key, index, rest) = if let Some(r) = rest.strip_prefix('.') {
        let end = r
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(r.len());
        if end == 0 {
            return Err("a name must follow '.'".into());
        }
        (r[..end].to_string(), None, &r[end..])
    } else if let Some(r) = rest.strip_prefix('[') {
        let r = r.trim_start();
        let (key, index, after) = if let Some((text, after)) = quoted(r) {
            (text, None, after)
        } else {
            let end = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
            let n: usize = r[..end]
                .parse()
                .map_err(|_| "expected a quoted name or a number in [...]")?;
            (String::new(), Some(n), &r[end..])
        };
        let after = after.trim_start().strip_prefix(']').ok_or("expected ']'")?;
        (key, index, after)
    } else {
        return Err(format!(
            "'{source}' needs a name: {source}.name or {source}[\"name\"]"
        ));
    };
    let term = match (source, index) {
        ("uri_captures", Some(i)) => Term::CaptureIndex(i),
        ("uri_captures", None) => Term::CaptureName(key),
        (_, Some(_)) => return Err(format!("{source} are read by name")),
        ("headers", None) => Term::Header(key),
        _ => Term::Query(key),
    };
    Ok((term, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_render(t: &str, headers: &[(&str, &str)], query: Option<&str>) -> String {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        let caps = vec![
            (None, "42".to_string()),
            (Some("user".to_string()), "bob".to_string()),
        ];
        Template::parse(t).unwrap().render(&Env {
            headers: &h,
            query,
            captures: Some(&caps),
        })
    }

    #[test]
    fn kong_documented_templates() {
        assert_eq!(env_render("v:$(headers.x_a)", &[("x-a", "1")], None), "v:1");
        assert_eq!(env_render("$(headers['X-A'])", &[("x-a", "1")], None), "1");
        assert_eq!(
            env_render("$(query_params.q)-x", &[], Some("q=a%20b")),
            "a b-x"
        );
        assert_eq!(
            env_render("$(uri_captures.user)/$(uri_captures[1])", &[], None),
            "bob/42"
        );
        assert_eq!(
            env_render("$(query_params.missing or headers.h or 'none')", &[], None),
            "none"
        );
        assert_eq!(env_render("[$(headers.missing)]", &[], None), "[]");
        assert_eq!(env_render("$('$(escaped)')", &[], None), "$(escaped)");
        assert_eq!(
            Template::parse("plain").unwrap().literal().as_deref(),
            Some("plain")
        );
        assert!(Template::parse("$(headers.a)").unwrap().literal().is_none());
    }

    #[test]
    fn unsupported_expressions_are_refused_when_parsed() {
        for bad in [
            "$(os.exit())",
            "$(headers)",
            "$(headers.a",
            "$(headers.a and 1)",
            "$(query_params[1])",
        ] {
            assert!(Template::parse(bad).is_err(), "{bad}");
        }
    }
}
