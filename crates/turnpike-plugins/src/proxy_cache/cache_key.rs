//! Kong's proxy-cache key (`cache_key.lua`): the SHA-256, in hex, of
//! `prefix|method|uri|params|headers`, where
//! - prefix is `consumer_id:route_id`, the route's id, or `default`;
//! - uri is nginx's request line with everything from `?` on removed (so a request line without
//!   a query keeps its ` HTTP/1.1`), lowercased with `ignore_uri_case`;
//! - params are the query arguments named by `vary_query_params` (all of them, sorted by name,
//!   when none are named), each `name=value`, several values sorted and joined by `,`, a bare
//!   name as itself, joined by `:`;
//! - headers are the request headers named by `vary_headers`, the same way (none when unset).

use http::HeaderMap;
use sha2::{Digest, Sha256};

use crate::form::percent_decode;

/// What of a request goes into its key.
pub struct Request<'a> {
    pub consumer_id: Option<&'a str>,
    pub route_id: &'a str,
    pub method: &'a str,
    /// The request target as the client sent it (path and query).
    pub target: &'a str,
    pub version: http::Version,
    pub query: Option<&'a str>,
    pub headers: &'a HeaderMap,
}

/// The text Kong hashes into the key. A look-up goes by this text (hashing it costs ~7,000
/// instructions, more than the rest of a hit); its digest, the key Kong shows, is made for a
/// miss and kept with the entry.
pub fn text(
    r: &Request<'_>,
    ignore_uri_case: bool,
    vary_query_params: &[String],
    vary_headers: &[String],
) -> String {
    let mut text = String::with_capacity(128 + r.target.len());
    match (r.consumer_id.filter(|c| !c.is_empty()), r.route_id) {
        (Some(c), route) if !route.is_empty() => {
            text.push_str(c);
            text.push(':');
            text.push_str(route);
        }
        (_, route) if !route.is_empty() => text.push_str(route),
        _ => text.push_str("default"),
    }
    text.push('|');
    text.push_str(r.method);
    text.push('|');
    let uri_start = text.len();
    // nginx's `$request`: "GET /path?query HTTP/1.1", cut at the first `?`.
    text.push_str(r.method);
    text.push(' ');
    match r.target.split_once('?') {
        Some((path, _)) => text.push_str(path),
        None => {
            text.push_str(r.target);
            text.push(' ');
            text.push_str(version_text(r.version));
        }
    }
    if ignore_uri_case {
        let lower = text[uri_start..].to_lowercase();
        text.truncate(uri_start);
        text.push_str(&lower);
    }
    text.push('|');
    let args = query_args(r.query.unwrap_or(""));
    if vary_query_params.is_empty() {
        let mut names: Vec<&str> = args.iter().map(|(n, _)| n.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        push_fields(&mut text, names.into_iter(), |n| arg_values(&args, n));
    } else {
        push_fields(
            &mut text,
            vary_query_params.iter().map(String::as_str),
            |n| arg_values(&args, n),
        );
    }
    text.push('|');
    push_fields(&mut text, vary_headers.iter().map(String::as_str), |n| {
        let values: Vec<String> = r
            .headers
            .get_all(n.to_ascii_lowercase().as_str())
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect();
        match values.len() {
            0 => None,
            1 => Some(Value::One(values.into_iter().next().unwrap_or_default())),
            _ => Some(Value::Many(values)),
        }
    });
    text
}

/// Kong's cache key: the SHA-256 of the text, in lowercase hex.
pub fn digest(text: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let d = Sha256::digest(text.as_bytes());
    let mut out = String::with_capacity(64);
    for b in d {
        out.push(HEX[(b >> 4) as usize] as char);
        out.push(HEX[(b & 15) as usize] as char);
    }
    out
}

fn version_text(v: http::Version) -> &'static str {
    match v {
        http::Version::HTTP_10 => "HTTP/1.0",
        http::Version::HTTP_2 => "HTTP/2.0",
        http::Version::HTTP_3 => "HTTP/3.0",
        http::Version::HTTP_09 => "HTTP/0.9",
        _ => "HTTP/1.1",
    }
}

/// A query argument or header as Kong's `get_query`/`get_headers` give it.
enum Value {
    /// A name without `=`.
    Flag,
    One(String),
    Many(Vec<String>),
}

/// The query's arguments, decoded, in order: `None` for a name without `=`.
fn query_args(q: &str) -> Vec<(String, Option<String>)> {
    q.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (percent_decode(k), Some(percent_decode(v))),
            None => (percent_decode(kv), None),
        })
        .collect()
}

fn arg_values(args: &[(String, Option<String>)], name: &str) -> Option<Value> {
    let mut found = args.iter().filter(|(n, _)| n == name).map(|(_, v)| v);
    let first = found.next()?;
    let rest: Vec<&Option<String>> = found.collect();
    if rest.is_empty() {
        return Some(match first {
            None => Value::Flag,
            Some(v) => Value::One(v.clone()),
        });
    }
    // Several: Kong's table of values (a bare name counts as `true`, which sorts and joins
    // as "true").
    let text = |v: &Option<String>| v.clone().unwrap_or_else(|| "true".into());
    Some(Value::Many(
        std::iter::once(first).chain(rest).map(text).collect(),
    ))
}

/// Kong's `generate_key_from`: `name=value` per field present, joined by `:`.
fn push_fields<'n>(
    out: &mut String,
    names: impl Iterator<Item = &'n str>,
    value: impl Fn(&str) -> Option<Value>,
) {
    let mut first = true;
    for name in names {
        let Some(v) = value(name) else { continue };
        if !first {
            out.push(':');
        }
        first = false;
        out.push_str(name);
        match v {
            Value::Flag => {}
            Value::One(s) => {
                out.push('=');
                out.push_str(&s);
            }
            Value::Many(mut all) => {
                all.sort();
                out.push('=');
                out.push_str(&all.join(","));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_text(r: &Request<'_>, vq: &[&str], vh: &[&str]) -> String {
        let vq: Vec<String> = vq.iter().map(|s| s.to_string()).collect();
        let vh: Vec<String> = vh.iter().map(|s| s.to_string()).collect();
        digest(&text(r, false, &vq, &vh))
    }

    fn sha(s: &str) -> String {
        hex::encode(Sha256::digest(s.as_bytes()))
    }

    #[test]
    fn the_key_is_kongs() {
        let mut h = HeaderMap::new();
        h.append("accept", "b".parse().unwrap());
        h.append("accept", "a".parse().unwrap());
        let r = Request {
            consumer_id: None,
            route_id: "r-1",
            method: "GET",
            target: "/x?b=2&a=1&a=0&flag",
            version: http::Version::HTTP_11,
            query: Some("b=2&a=1&a=0&flag"),
            headers: &h,
        };
        assert_eq!(
            key_text(&r, &[], &[]),
            sha("r-1|GET|GET /x|a=0,1:b=2:flag|")
        );
        assert_eq!(
            key_text(&r, &["b", "missing"], &["Accept", "none"]),
            sha("r-1|GET|GET /x|b=2|Accept=a,b")
        );
        // No query: nginx's request line keeps its protocol.
        let r = Request {
            consumer_id: Some("c-1"),
            target: "/X",
            query: None,
            version: http::Version::HTTP_10,
            ..r
        };
        assert_eq!(key_text(&r, &[], &[]), sha("c-1:r-1|GET|GET /X HTTP/1.0||"));
        assert_eq!(
            digest(&text(&r, true, &[], &[])),
            sha("c-1:r-1|GET|get /x http/1.0||")
        );
        let r = Request { route_id: "", ..r };
        assert_eq!(key_text(&r, &[], &[]), sha("default|GET|GET /X HTTP/1.0||"));
    }
}
