//! Request path normalisation and the upstream path (Kong's `path_handling` v0 and v1).

use std::borrow::Cow;

/// Normalises a request path as Kong does before routing: percent-encoded unreserved
/// characters are decoded and `.` / `..` segments removed (RFC 3986 §5.2.4). Paths that need
/// neither (the common case) are returned as they are, without allocating.
pub fn normalize_path(path: &str) -> Cow<'_, str> {
    let needs_decode = path.contains('%');
    // A dot segment always starts with "/." (the path starts with '/').
    let needs_dots = path.contains("/.") && path.split('/').any(|s| s == "." || s == "..");
    if !needs_decode && !needs_dots {
        return Cow::Borrowed(path);
    }
    let mut decoded = String::with_capacity(path.len());
    let b = path.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                let c = (h * 16 + l) as u8;
                if c.is_ascii_alphanumeric() || b"-._~".contains(&c) {
                    decoded.push(c as char);
                } else {
                    // Reserved characters stay encoded, with upper-case hex as RFC 3986 advises.
                    decoded.push('%');
                    decoded.push((b[i + 1] as char).to_ascii_uppercase());
                    decoded.push((b[i + 2] as char).to_ascii_uppercase());
                }
                i += 3;
                continue;
            }
        }
        decoded.push(b[i] as char);
        i += 1;
    }
    if !decoded.split('/').any(|s| s == "." || s == "..") {
        return Cow::Owned(decoded);
    }
    let mut out: Vec<&str> = Vec::new();
    let segs: Vec<&str> = decoded.split('/').collect();
    let last = segs.len() - 1;
    for (i, seg) in segs.iter().enumerate() {
        match *seg {
            "." => {
                if i == last {
                    out.push("");
                }
            }
            ".." => {
                if out.len() > 1 {
                    out.pop();
                }
                if i == last {
                    out.push("");
                }
            }
            s => out.push(s),
        }
    }
    let mut joined = out.join("/");
    if !joined.starts_with('/') {
        joined.insert(0, '/');
    }
    Cow::Owned(joined)
}

/// Kong's `sanitize_uri_postfix`.
fn sanitize_postfix(p: &str) -> &str {
    if p == "." || p == ".." {
        ""
    } else if let Some(r) = p.strip_prefix("./") {
        r
    } else if let Some(r) = p.strip_prefix("../") {
        r
    } else {
        p
    }
}

/// Builds the path sent upstream from the service path, the request path and how much of it
/// the route matched (Kong `kong/router/utils.lua` `get_upstream_uri` for v0, `atc.lua` for v1).
pub fn upstream_uri(
    service_path: Option<&str>,
    req_path: &str,
    matched_len: Option<usize>,
    strip_path: bool,
    v1: bool,
) -> String {
    let base = service_path.unwrap_or("/");
    let postfix = match (strip_path, matched_len) {
        (true, Some(n)) => sanitize_postfix(&req_path[n.min(req_path.len())..]),
        _ => req_path.get(1..).unwrap_or(""),
    };
    if v1 {
        return if strip_path {
            if base.ends_with('/') && postfix.starts_with('/') {
                format!("{}{}", &base[..base.len() - 1], postfix)
            } else {
                format!("{base}{postfix}")
            }
        } else {
            format!("{base}{}", req_path.get(1..).unwrap_or(""))
        };
    }
    if let Some(base_no_slash) = base.strip_suffix('/') {
        if strip_path {
            if postfix.is_empty() {
                if base == "/" {
                    "/".to_string()
                } else if req_path.ends_with('/') {
                    base.to_string()
                } else {
                    base_no_slash.to_string()
                }
            } else if postfix.starts_with('/') {
                format!("{base_no_slash}{postfix}")
            } else {
                format!("{base}{postfix}")
            }
        } else {
            format!("{base}{}", req_path.get(1..).unwrap_or(""))
        }
    } else if strip_path {
        if postfix.is_empty() {
            if req_path.len() > 1 && req_path.ends_with('/') {
                format!("{base}/")
            } else {
                base.to_string()
            }
        } else if postfix.starts_with('/') {
            format!("{base}{postfix}")
        } else {
            format!("{base}/{postfix}")
        }
    } else if req_path == "/" {
        base.to_string()
    } else {
        format!("{base}{req_path}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v0_join_rules_of_kongs_get_upstream_uri() {
        // (service path, route path, request, strip_path, expected)
        let cases = [
            ("/s", "/fv0", "/fv0req", false, "/s/fv0req"),
            ("/s", "/fv0", "/fv0req", true, "/s/req"),
            ("/s", "/fv0", "/fv0/req", true, "/s/req"),
            ("/s/", "/fv0", "/fv0req", true, "/s/req"),
            ("/s/", "/fv0", "/fv0/req", true, "/s/req"),
            ("/s", "/fv0", "/fv0", true, "/s"),
            ("/s", "/fv0", "/fv0/", true, "/s/"),
            ("/s/", "/fv0", "/fv0", true, "/s"),
            ("/s/", "/fv0", "/fv0/", true, "/s/"),
            ("/", "/p", "/p/x", true, "/x"),
            ("/", "/p", "/p", true, "/"),
            ("/s", "/p", "/p/x", false, "/s/p/x"),
            ("/s/", "/p", "/p/x", false, "/s/p/x"),
        ];
        for (svc, route, req, strip, want) in cases {
            let got = upstream_uri(Some(svc), req, Some(route.len()), strip, false);
            assert_eq!(
                got, want,
                "service {svc} route {route} request {req} strip {strip}"
            );
        }
        assert_eq!(
            upstream_uri(None, "/anything", None, true, false),
            "/anything"
        );
        assert_eq!(upstream_uri(None, "/", None, true, false), "/");
    }

    #[test]
    fn v1_joins_without_slash_logic() {
        assert_eq!(
            upstream_uri(Some("/s"), "/fv1req", Some(4), true, true),
            "/sreq"
        );
        assert_eq!(
            upstream_uri(Some("/s/"), "/fv1/req", Some(4), true, true),
            "/s/req"
        );
        assert_eq!(
            upstream_uri(Some("/s"), "/fv1/req", Some(4), false, true),
            "/sfv1/req"
        );
    }

    #[test]
    fn normalisation() {
        assert!(matches!(normalize_path("/plain/path"), Cow::Borrowed(_)));
        assert_eq!(normalize_path("/a/./b/../c"), "/a/c");
        assert_eq!(normalize_path("/%61%62c"), "/abc");
        assert_eq!(normalize_path("/a%2fb"), "/a%2Fb");
        assert_eq!(normalize_path("/../../etc"), "/etc");
        assert_eq!(normalize_path("/a/.."), "/");
        assert_eq!(normalize_path("/bad%zz"), "/bad%zz");
        assert_eq!(normalize_path("/x%"), "/x%");
    }
}
