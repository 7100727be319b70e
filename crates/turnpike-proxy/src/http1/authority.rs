//! The request's host, one and the same for routing and forwarding (RFC 9112 §3.2, RFC 9113
//! §8.3.1): protocol-level checks both HTTP/1 and HTTP/2 servers apply before a request
//! reaches the pipeline.

use http::{header, HeaderMap, HeaderValue, Uri};

/// Is `v` a valid Host value: `host [ ":" port ]` with `host` an IP literal in brackets, or a
/// registered name / IPv4 address made of RFC 3986's unreserved, percent-encoded and sub-delims
/// characters? No userinfo, no path, no space: nginx answers 400 to those too.
pub fn valid_host(v: &[u8]) -> bool {
    if v.first() == Some(&b'[') {
        return valid_ip_literal(v);
    }
    // One pass over the name (the common case: a name or an IPv4 address, then maybe a
    // port): the first byte that is not a reg-name character ends it, and must be the port's
    // colon. Two passes (find the colon, then check the name) cost ~270 instructions for
    // `127.0.0.1:8000`.
    let end = v
        .iter()
        .position(|&b| !REG_NAME[b as usize])
        .unwrap_or(v.len());
    end > 0 && port_ok(&v[end..])
}

/// `[v6 or vfuture]` with an optional port.
fn valid_ip_literal(v: &[u8]) -> bool {
    let Some(end) = v.iter().position(|b| *b == b']') else {
        return false;
    };
    let inner = &v[1..end];
    !inner.is_empty()
        && inner
            .iter()
            .all(|b| b.is_ascii_hexdigit() || matches!(b, b':' | b'.'))
        && port_ok(&v[end + 1..])
}

/// Nothing, or `:` and at most five digits.
fn port_ok(rest: &[u8]) -> bool {
    match rest.split_first() {
        None => true,
        Some((b':', digits)) => digits.len() <= 5 && digits.iter().all(u8::is_ascii_digit),
        Some(_) => false,
    }
}

/// RFC 3986's reg-name characters (unreserved, sub-delims, `%`), as a table: one load a byte.
static REG_NAME: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        t[i] = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'%'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
            );
        i += 1;
    }
    t
};

/// Why a request's host is refused (answered 400).
#[derive(Debug, PartialEq, Eq)]
pub struct BadHost;

/// Makes the request's Host header the one host both the router and the upstream see.
///
/// - A target with an authority (HTTP/1 absolute-form, HTTP/2 `:authority`) names the host;
///   HTTP/1 replaces any Host header with it (RFC 9112 §3.2.2: a proxy MUST generate Host from
///   the target), HTTP/2 refuses a Host that differs (RFC 9113 §8.3.1: malformed).
/// - More than one Host header, an invalid one, or (`host_required`: HTTP/1.1) none: refused.
pub fn settle_host(
    uri: &Uri,
    headers: &mut HeaderMap,
    host_required: bool,
    replace: bool,
) -> Result<(), BadHost> {
    let mut hosts = headers.get_all(header::HOST).iter();
    let first = hosts.next();
    if hosts.next().is_some() {
        return Err(BadHost);
    }
    if let Some(h) = first {
        if !valid_host(h.as_bytes()) {
            return Err(BadHost);
        }
    }
    match uri.authority() {
        Some(a) => {
            let a = a.as_str();
            if !valid_host(a.as_bytes()) {
                return Err(BadHost);
            }
            match first {
                Some(h) if h.as_bytes().eq_ignore_ascii_case(a.as_bytes()) => Ok(()),
                Some(_) if !replace => Err(BadHost),
                _ => {
                    let v = HeaderValue::from_str(a).map_err(|_| BadHost)?;
                    headers.insert(header::HOST, v);
                    Ok(())
                }
            }
        }
        None if first.is_none() && host_required => Err(BadHost),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_valid_and_not() {
        for ok in [
            "a.example",
            "A.Example:8000",
            "127.0.0.1",
            "[::1]:80",
            "[::1]",
            "under_score.example",
            "x:",
        ] {
            assert!(valid_host(ok.as_bytes()), "{ok}");
        }
        for bad in [
            "",
            "a b@c",
            "a.example/evil",
            "user@a.example",
            "a.example:80x",
            "a.example:123456",
            "[::1",
            "[zz]",
            "a\\b",
            "a\tb",
            ":80",
        ] {
            assert!(!valid_host(bad.as_bytes()), "{bad}");
        }
    }

    /// The one-pass check says what the definition says (the name up to the first colon made
    /// of reg-name characters, then nothing or a port) on every string of up to five bytes
    /// from an alphabet of each class.
    #[test]
    fn one_pass_host_check_agrees_with_the_definition() {
        fn definition(v: &[u8]) -> bool {
            if v.first() == Some(&b'[') {
                return super::valid_ip_literal(v);
            }
            let (host, rest) = match v.iter().position(|b| *b == b':') {
                Some(i) => (&v[..i], &v[i..]),
                None => (v, &v[v.len()..]),
            };
            !host.is_empty() && super::port_ok(rest) && host.iter().all(|&b| REG_NAME[b as usize])
        }
        let alphabet = b"a1.:-/ @[]%";
        let mut checked = 0;
        let mut stack: Vec<Vec<u8>> = vec![Vec::new()];
        while let Some(v) = stack.pop() {
            assert_eq!(
                valid_host(&v),
                definition(&v),
                "{:?}",
                String::from_utf8_lossy(&v)
            );
            checked += 1;
            if v.len() < 5 {
                for &b in alphabet {
                    let mut w = v.clone();
                    w.push(b);
                    stack.push(w);
                }
            }
        }
        assert!(checked > 170_000, "{checked}");
    }

    fn headers(hosts: &[&str]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for h in hosts {
            m.append(header::HOST, HeaderValue::from_str(h).unwrap());
        }
        m
    }

    #[test]
    fn one_host_for_routing_and_forwarding() {
        let origin: Uri = "/secret".parse().unwrap();
        let absolute: Uri = "http://public.example/secret".parse().unwrap();
        // HTTP/1: the target's host replaces the header.
        let mut h = headers(&["admin.example"]);
        settle_host(&absolute, &mut h, true, true).unwrap();
        assert_eq!(h[header::HOST], "public.example");
        // HTTP/2: a differing host header is malformed; an equal one (any case) is fine.
        let mut h = headers(&["admin.example"]);
        assert_eq!(settle_host(&absolute, &mut h, false, false), Err(BadHost));
        let mut h = headers(&["Public.Example"]);
        assert!(settle_host(&absolute, &mut h, false, false).is_ok());
        let mut h = headers(&[]);
        settle_host(&absolute, &mut h, false, false).unwrap();
        assert_eq!(h[header::HOST], "public.example");
        // Duplicates, invalid values and a missing HTTP/1.1 Host are refused.
        let mut h = headers(&["a.example", "b.example"]);
        assert_eq!(settle_host(&origin, &mut h, true, true), Err(BadHost));
        let mut h = headers(&["a.example", "a.example"]);
        assert_eq!(settle_host(&origin, &mut h, true, true), Err(BadHost));
        let mut h = headers(&["a.example/evil"]);
        assert_eq!(settle_host(&origin, &mut h, true, true), Err(BadHost));
        let mut h = headers(&[]);
        assert_eq!(settle_host(&origin, &mut h, true, true), Err(BadHost));
        assert!(settle_host(&origin, &mut h, false, true).is_ok());
        let userinfo: Uri = "http://u@public.example/".parse().unwrap();
        let mut h = headers(&[]);
        assert_eq!(settle_host(&userinfo, &mut h, true, true), Err(BadHost));
    }
}
