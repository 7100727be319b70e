//! Evaluates an ATC expression (the `atc-router` crate's syntax tree) against a request, with
//! the engine's semantics (its `interpreter.rs`): every value of a multi-valued field must
//! match unless `any()` wraps it, a field the request lacks fails every operator, `lower()`
//! lower-cases (Unicode), `~` is unanchored, `&&` and `||` short-circuit, and `==`, `^=`,
//! `=^` and `~` record the value they matched (`~` its whole match and its groups).
//!
//! The engine's own interpreter reads values from a `Context` built per request (a hash map
//! of owned strings); this one reads them from the request where they are, so a request pays
//! only for the fields the candidate routes ask for. `tests::the_engine_agrees` runs both on
//! the same expressions and requests.

use std::borrow::Cow;
use std::net::IpAddr;

use turnpike_config::atc::{BinaryOperator, Expression, LogicalExpression, Predicate, Value};

use crate::RequestView;

/// What a successful evaluation recorded: the matched `http.path` value (Kong strips its
/// length when the route strips its path) and the regex captures.
#[derive(Debug, Default)]
pub struct Record {
    pub path: Option<usize>,
    /// Group names (`None` for a numbered group past the whole match) and values.
    pub captures: Vec<(Option<String>, String)>,
}

/// One field's values for the request.
enum Values<'r> {
    None,
    One(FieldValue<'r>),
    Many(Vec<FieldValue<'r>>),
}

enum FieldValue<'r> {
    Str(Cow<'r, str>),
    Int(i64),
    Ip(IpAddr),
}

/// The request's fields, the costly ones (segments, query arguments) split once.
pub struct Fields<'a, 'r> {
    req: &'a RequestView<'r>,
    segments: Option<Vec<&'r str>>,
    queries: Option<Vec<(Cow<'r, str>, Cow<'r, str>)>>,
}

impl<'a, 'r> Fields<'a, 'r> {
    pub fn new(req: &'a RequestView<'r>) -> Self {
        Fields {
            req,
            segments: None,
            queries: None,
        }
    }

    fn segments(&mut self) -> &[&'r str] {
        let path: &'r str = self.req.path;
        self.segments.get_or_insert_with(|| {
            // ngx.re.split(uri, "/") from the second byte, which drops trailing empty
            // fields as Perl's split does: "/a/b/" is a and b (Kong's spec: "/foo/" has one
            // segment).
            let rest = path.get(1..).unwrap_or("");
            let mut segs: Vec<&str> = rest.split('/').collect();
            while segs.last() == Some(&"") {
                segs.pop();
            }
            segs
        })
    }

    fn values(&mut self, field: &str) -> Values<'r> {
        let req = self.req;
        let one = |s: &'r str| Values::One(FieldValue::Str(Cow::Borrowed(s)));
        match field {
            "http.path" => one(req.path),
            "http.method" => one(req.method),
            "http.host" => one(split_host_port(req.authority).0),
            "net.protocol" => one(req
                .protocol
                .unwrap_or(if req.tls { "https" } else { "http" })),
            "tls.sni" => req.sni.map_or(Values::None, one),
            "net.src.ip" => req
                .peer
                .map_or(Values::None, |p| Values::One(FieldValue::Ip(p.ip()))),
            "net.src.port" => req.peer.map_or(Values::None, |p| {
                Values::One(FieldValue::Int(p.port() as i64))
            }),
            "net.dst.ip" => req
                .local_ip
                .map_or(Values::None, |ip| Values::One(FieldValue::Ip(ip))),
            "net.dst.port" => Values::One(FieldValue::Int(
                split_host_port(req.authority).1.unwrap_or(req.port) as i64,
            )),
            "http.path.segments.len" => Values::One(FieldValue::Int(self.segments().len() as i64)),
            f => {
                if let Some(name) = f.strip_prefix("http.headers.") {
                    let name = name.replace('_', "-");
                    let mut out: Vec<FieldValue<'r>> = req
                        .headers
                        .get_all(name.as_str())
                        .iter()
                        .filter_map(|v| v.to_str().ok())
                        .map(|s| FieldValue::Str(Cow::Borrowed(s)))
                        .collect();
                    return match out.len() {
                        0 => Values::None,
                        1 => Values::One(out.pop().unwrap()),
                        _ => Values::Many(out),
                    };
                }
                if let Some(name) = f.strip_prefix("http.queries.") {
                    let query = req.query;
                    let qs = self.queries.get_or_insert_with(|| parse_query(query));
                    let mut out: Vec<FieldValue<'r>> = qs
                        .iter()
                        .filter(|(k, _)| k == name)
                        .map(|(_, v)| FieldValue::Str(v.clone()))
                        .collect();
                    return match out.len() {
                        0 => Values::None,
                        1 => Values::One(out.pop().unwrap()),
                        _ => Values::Many(out),
                    };
                }
                if let Some(range) = f.strip_prefix("http.path.segments.") {
                    let segs = self.segments();
                    return match segment(segs, range) {
                        Some(s) => Values::One(FieldValue::Str(s)),
                        None => Values::None,
                    };
                }
                Values::None
            }
        }
    }
}

#[cfg(test)]
impl Fields<'_, '_> {
    /// The field's values as Kong's engine takes them in its `Context`.
    pub fn engine_values(&mut self, field: &str) -> Vec<Value> {
        let conv = |v: FieldValue| match v {
            FieldValue::Str(s) => Value::String(s.into_owned()),
            FieldValue::Int(i) => Value::Int(i),
            FieldValue::Ip(ip) => Value::IpAddr(ip),
        };
        match self.values(field) {
            Values::None => Vec::new(),
            Values::One(v) => vec![conv(v)],
            Values::Many(vs) => vs.into_iter().map(conv).collect(),
        }
    }
}

/// Kong's `split_host_port`: the port after the first `:` when it is a number (so an IPv6
/// literal keeps its colons and gets no port).
pub fn split_host_port(authority: &str) -> (&str, Option<u16>) {
    match authority.split_once(':') {
        Some((h, p)) => match p.parse::<u16>() {
            Ok(port) => (h, Some(port)),
            Err(_) => (authority, None),
        },
        None => (authority, None),
    }
}

/// `http.path.segments.N` (0-based) or `N_M` (segments N to M joined with `/`).
fn segment<'r>(segs: &[&'r str], range: &str) -> Option<Cow<'r, str>> {
    match range.split_once('_') {
        None => {
            let i: usize = range.parse().ok()?;
            segs.get(i).map(|s| Cow::Borrowed(*s))
        }
        Some((a, b)) => {
            let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
            if a >= b || a > segs.len() || b >= segs.len() {
                return None;
            }
            Some(Cow::Owned(segs[a..=b].join("/")))
        }
    }
}

/// The query string's arguments as nginx's `get_uri_args` decodes them: `+` is a space,
/// `%XX` a byte, a bare `name` is the empty string.
fn parse_query(query: Option<&str>) -> Vec<(Cow<'_, str>, Cow<'_, str>)> {
    let Some(q) = query else { return Vec::new() };
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(p), Cow::Borrowed("")),
        })
        .collect()
}

fn decode(s: &str) -> Cow<'_, str> {
    if !s.bytes().any(|b| b == b'%' || b == b'+') {
        return Cow::Borrowed(s);
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match std::str::from_utf8(&b[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// Evaluates `e`; `rec` gathers what the predicates that succeeded recorded.
pub fn eval(e: &Expression, f: &mut Fields<'_, '_>, rec: &mut Record) -> bool {
    match e {
        Expression::Predicate(p) => predicate(p, f, rec),
        Expression::Logical(l) => match l.as_ref() {
            LogicalExpression::And(a, b) => eval(a, f, rec) && eval(b, f, rec),
            LogicalExpression::Or(a, b) => eval(a, f, rec) || eval(b, f, rec),
            LogicalExpression::Not(a) => !eval(a, f, rec),
        },
    }
}

fn predicate(p: &Predicate, f: &mut Fields<'_, '_>, rec: &mut Record) -> bool {
    let values = f.values(&p.lhs.var_name);
    let (lower, any) = p.lhs.get_transformations();
    let list: &[FieldValue] = match &values {
        Values::None => return false,
        Values::One(v) => std::slice::from_ref(v),
        Values::Many(v) => v,
    };
    let is_path = p.lhs.var_name == "http.path";
    for v in list {
        let lowered;
        let v = match (v, lower) {
            (FieldValue::Str(s), true) => {
                lowered = FieldValue::Str(Cow::Owned(s.to_lowercase()));
                &lowered
            }
            _ => v,
        };
        let matched = one(p, v, is_path, rec);
        if matched && any {
            return true;
        }
        if !matched && !any {
            return false;
        }
    }
    !any
}

/// One value against the predicate, recording as the engine does.
fn one(p: &Predicate, v: &FieldValue, is_path: bool, rec: &mut Record) -> bool {
    let record_rhs = |rec: &mut Record| {
        if is_path {
            if let Value::String(s) = &p.rhs {
                rec.path = Some(s.len());
            }
        }
    };
    match (&p.op, v, &p.rhs) {
        (BinaryOperator::Equals, FieldValue::Str(s), Value::String(r)) => {
            let ok = s.as_ref() == r;
            if ok {
                record_rhs(rec);
            }
            ok
        }
        (BinaryOperator::Equals, FieldValue::Int(i), Value::Int(r)) => i == r,
        (BinaryOperator::Equals, FieldValue::Ip(i), Value::IpAddr(r)) => i == r,
        (BinaryOperator::NotEquals, FieldValue::Str(s), Value::String(r)) => s.as_ref() != r,
        (BinaryOperator::NotEquals, FieldValue::Int(i), Value::Int(r)) => i != r,
        (BinaryOperator::NotEquals, FieldValue::Ip(i), Value::IpAddr(r)) => i != r,
        (BinaryOperator::Regex, FieldValue::Str(s), Value::Regex(re)) => {
            if re.captures_len() == 1 {
                let Some(m) = re.find(s) else { return false };
                if is_path {
                    rec.path = Some(m.as_str().len());
                }
                return true;
            }
            let Some(c) = re.captures(s) else {
                return false;
            };
            if is_path {
                rec.path = Some(c.get(0).map_or(0, |m| m.as_str().len()));
            }
            // The groups of the last regex that matched (the engine merges every regex's
            // groups into one map; two capturing regexes in one route are not seen in
            // practice).
            rec.captures = crate::captures(re, &c);
            true
        }
        (BinaryOperator::Prefix, FieldValue::Str(s), Value::String(r)) => {
            let ok = s.starts_with(r.as_str());
            if ok {
                record_rhs(rec);
            }
            ok
        }
        (BinaryOperator::Postfix, FieldValue::Str(s), Value::String(r)) => {
            let ok = s.ends_with(r.as_str());
            if ok {
                record_rhs(rec);
            }
            ok
        }
        (BinaryOperator::Contains, FieldValue::Str(s), Value::String(r)) => s.contains(r.as_str()),
        (BinaryOperator::Greater, FieldValue::Int(i), Value::Int(r)) => i > r,
        (BinaryOperator::GreaterOrEqual, FieldValue::Int(i), Value::Int(r)) => i >= r,
        (BinaryOperator::Less, FieldValue::Int(i), Value::Int(r)) => i < r,
        (BinaryOperator::LessOrEqual, FieldValue::Int(i), Value::Int(r)) => i <= r,
        (BinaryOperator::In, FieldValue::Ip(i), Value::IpCidr(c)) => c.contains(i),
        (BinaryOperator::NotIn, FieldValue::Ip(i), Value::IpCidr(c)) => !c.contains(i),
        // Validation rules out every other pairing.
        _ => false,
    }
}
