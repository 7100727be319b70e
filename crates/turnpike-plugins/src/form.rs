//! `application/x-www-form-urlencoded` text (query strings, form bodies) as Kong's
//! `get_query`/`get_body` read it: lenient, a malformed escape is kept as written.

/// A query value as Kong's `get_query` gives it: `%XX` and `+` decoded.
pub fn percent_decode(s: &str) -> String {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The name/value pairs of a query string or form body, decoded, in order.
pub fn pairs(s: &str) -> impl Iterator<Item = (String, String)> + '_ {
    s.split('&').filter(|kv| !kv.is_empty()).map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (percent_decode(k), percent_decode(v))
    })
}

/// Percent-encodes `s` as Kong's `encode_args` (`ngx.escape_uri`) does: all but unreserved
/// characters.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoding_is_lenient_and_pairs_keep_order() {
        assert_eq!(percent_decode("a%2Eb"), "a.b");
        assert_eq!(percent_decode("a%zz"), "a%zz");
        assert_eq!(percent_decode("%"), "%");
        assert_eq!(percent_decode("a+b"), "a b");
        let p: Vec<_> = pairs("b=1&a=x%20y&&c").collect();
        assert_eq!(
            p,
            [
                ("b".into(), "1".into()),
                ("a".into(), "x y".into()),
                ("c".into(), String::new())
            ]
        );
        assert_eq!(
            escape("https://x.test/cb?a=b c"),
            "https%3A%2F%2Fx.test%2Fcb%3Fa%3Db%20c"
        );
    }
}
