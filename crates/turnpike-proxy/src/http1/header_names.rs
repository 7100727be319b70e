//! Header names as the HTTP/1.1 parsers meet them, recognised from a table fixed at compile
//! time instead of through `HeaderName::from_bytes` (which lower-cases the name into a scratch
//! buffer, then matches it against every standard name: ~117 instructions a name, and an
//! allocation for a custom one). The names a client or an upstream sends on nearly every
//! request are compared here in one or two 8-byte words, case-insensitively; any other name
//! takes the general path.

use http::header::{self, HeaderName, InvalidHeaderName};

/// The non-standard names the gateway reads and writes, spelled once: the parser's tables
/// below and the request path (`proxy.rs`) both take them from here.
pub mod names {
    use http::HeaderName;

    pub const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
    pub const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
    pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
    pub const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
    pub const X_FORWARDED_PORT: HeaderName = HeaderName::from_static("x-forwarded-port");
    pub const X_FORWARDED_PATH: HeaderName = HeaderName::from_static("x-forwarded-path");
    pub const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
    pub const X_KONG_REQUEST_ID: HeaderName = HeaderName::from_static("x-kong-request-id");
    pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
    pub const X_FORWARDED_PREFIX: HeaderName = HeaderName::from_static("x-forwarded-prefix");
    pub const X_KONG_PROXY_LATENCY: HeaderName = HeaderName::from_static("x-kong-proxy-latency");
    pub const X_KONG_UPSTREAM_STATUS: HeaderName =
        HeaderName::from_static("x-kong-upstream-status");
    pub const X_KONG_UPSTREAM_LATENCY: HeaderName =
        HeaderName::from_static("x-kong-upstream-latency");
    pub const X_KONG_RESPONSE_LATENCY: HeaderName =
        HeaderName::from_static("x-kong-response-latency");
}

/// What a request's header names tell the request path before it looks anything up: one bit
/// per group of names it would otherwise search the header map for. A clear bit means no such
/// header was sent, so the look-up (a hash of the name) or the pass over every name is skipped.
pub mod seen {
    /// Hop-by-hop headers (Connection, Keep-Alive, TE, Trailer, Transfer-Encoding, Upgrade,
    /// Proxy-Connection, Proxy-Authenticate).
    pub const HOP_BY_HOP: u32 = 1 << 0;
    /// X-Forwarded-* and X-Real-IP.
    pub const FORWARDED: u32 = 1 << 1;
    pub const ACCEPT: u32 = 1 << 2;
    /// Kong's own response headers (X-Kong-*), in an upstream's response.
    pub const KONG: u32 = 1 << 3;
    /// Nothing known: every look-up is done (HTTP/2, or headers a plugin may have changed).
    pub const ALL: u32 = u32::MAX;
}

/// A known name: its lower-case bytes (the form `HeaderName` keeps), the name, its `seen` bit.
pub type Known = (&'static [u8], HeaderName, u32);

static LEN2: [Known; 1] = [(b"te", header::TE, seen::HOP_BY_HOP)];
static LEN3: [Known; 2] = [(b"via", header::VIA, 0), (b"age", header::AGE, 0)];
static LEN4: [Known; 4] = [
    (b"host", header::HOST, 0),
    (b"date", header::DATE, 0),
    (b"etag", header::ETAG, 0),
    (b"vary", header::VARY, 0),
];
static LEN5: [Known; 2] = [(b"range", header::RANGE, 0), (b"allow", header::ALLOW, 0)];
static LEN6: [Known; 7] = [
    (b"server", header::SERVER, 0),
    (b"accept", header::ACCEPT, seen::ACCEPT),
    (b"cookie", header::COOKIE, 0),
    (b"origin", header::ORIGIN, 0),
    (b"apikey", HeaderName::from_static("apikey"), 0),
    (b"expect", header::EXPECT, 0),
    (b"pragma", header::PRAGMA, 0),
];
static LEN7: [Known; 4] = [
    (b"upgrade", header::UPGRADE, seen::HOP_BY_HOP),
    (b"trailer", header::TRAILER, seen::HOP_BY_HOP),
    (b"expires", header::EXPIRES, 0),
    (b"referer", header::REFERER, 0),
];
static LEN8: [Known; 1] = [(b"location", header::LOCATION, 0)];
static LEN9: [Known; 2] = [
    (b"x-api-key", HeaderName::from_static("x-api-key"), 0),
    (b"x-real-ip", names::X_REAL_IP, seen::FORWARDED),
];
static LEN10: [Known; 4] = [
    (b"connection", header::CONNECTION, seen::HOP_BY_HOP),
    (b"user-agent", header::USER_AGENT, 0),
    (b"keep-alive", names::KEEP_ALIVE, seen::HOP_BY_HOP),
    (b"set-cookie", header::SET_COOKIE, 0),
];
static LEN12: [Known; 1] = [(b"content-type", header::CONTENT_TYPE, 0)];
static LEN13: [Known; 5] = [
    (b"authorization", header::AUTHORIZATION, 0),
    (b"cache-control", header::CACHE_CONTROL, 0),
    (b"last-modified", header::LAST_MODIFIED, 0),
    (b"accept-ranges", header::ACCEPT_RANGES, 0),
    (b"if-none-match", header::IF_NONE_MATCH, 0),
];
static LEN14: [Known; 1] = [(b"content-length", header::CONTENT_LENGTH, 0)];
static LEN15: [Known; 3] = [
    (b"accept-encoding", header::ACCEPT_ENCODING, 0),
    (b"accept-language", header::ACCEPT_LANGUAGE, 0),
    (b"x-forwarded-for", names::X_FORWARDED_FOR, seen::FORWARDED),
];
static LEN16: [Known; 5] = [
    (b"content-encoding", header::CONTENT_ENCODING, 0),
    (
        b"x-forwarded-host",
        names::X_FORWARDED_HOST,
        seen::FORWARDED,
    ),
    (
        b"x-forwarded-port",
        names::X_FORWARDED_PORT,
        seen::FORWARDED,
    ),
    (
        b"x-forwarded-path",
        names::X_FORWARDED_PATH,
        seen::FORWARDED,
    ),
    (
        b"proxy-connection",
        names::PROXY_CONNECTION,
        seen::HOP_BY_HOP,
    ),
];
static LEN17: [Known; 4] = [
    (b"x-kong-request-id", names::X_KONG_REQUEST_ID, seen::KONG),
    (
        b"transfer-encoding",
        header::TRANSFER_ENCODING,
        seen::HOP_BY_HOP,
    ),
    (b"if-modified-since", header::IF_MODIFIED_SINCE, 0),
    (
        b"x-forwarded-proto",
        names::X_FORWARDED_PROTO,
        seen::FORWARDED,
    ),
];
static LEN18: [Known; 2] = [
    (
        b"x-forwarded-prefix",
        names::X_FORWARDED_PREFIX,
        seen::FORWARDED,
    ),
    (
        b"proxy-authenticate",
        header::PROXY_AUTHENTICATE,
        seen::HOP_BY_HOP,
    ),
];

static LEN20: [Known; 1] = [(
    b"x-kong-proxy-latency",
    names::X_KONG_PROXY_LATENCY,
    seen::KONG,
)];
static LEN22: [Known; 1] = [(
    b"x-kong-upstream-status",
    names::X_KONG_UPSTREAM_STATUS,
    seen::KONG,
)];
static LEN23: [Known; 2] = [
    (
        b"x-kong-upstream-latency",
        names::X_KONG_UPSTREAM_LATENCY,
        seen::KONG,
    ),
    (
        b"x-kong-response-latency",
        names::X_KONG_RESPONSE_LATENCY,
        seen::KONG,
    ),
];

/// The known names of a length.
fn known(len: usize) -> &'static [Known] {
    match len {
        2 => &LEN2,
        3 => &LEN3,
        4 => &LEN4,
        5 => &LEN5,
        6 => &LEN6,
        7 => &LEN7,
        8 => &LEN8,
        9 => &LEN9,
        10 => &LEN10,
        12 => &LEN12,
        13 => &LEN13,
        14 => &LEN14,
        15 => &LEN15,
        16 => &LEN16,
        17 => &LEN17,
        18 => &LEN18,
        20 => &LEN20,
        22 => &LEN22,
        23 => &LEN23,
        _ => &[],
    }
}

const FOLD8: u64 = 0x2020_2020_2020_2020;
const FOLD4: u32 = 0x2020_2020;

#[inline(always)]
fn word8(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

#[inline(always)]
fn word4(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// `name` equals `lower` (lower-case, same length) ignoring ASCII case, compared in words
/// (the last word overlapping the one before). Setting bit 5 of every byte folds A-Z onto
/// a-z; on the bytes `h1_parse` lets through a token it maps no other byte onto a letter, a
/// digit or '-', so the comparison is exact for header names.
#[inline]
fn folded_eq(name: &[u8], lower: &[u8]) -> bool {
    let n = name.len();
    if n != lower.len() {
        return false;
    }
    if n >= 8 {
        let mut i = 0;
        while i + 8 < n {
            if word8(name, i) | FOLD8 != word8(lower, i) | FOLD8 {
                return false;
            }
            i += 8;
        }
        word8(name, n - 8) | FOLD8 == word8(lower, n - 8) | FOLD8
    } else if n >= 4 {
        word4(name, 0) | FOLD4 == word4(lower, 0) | FOLD4
            && word4(name, n - 4) | FOLD4 == word4(lower, n - 4) | FOLD4
    } else {
        name.iter().zip(lower).all(|(x, y)| x | 0x20 == y | 0x20)
    }
}

/// The table's entry for a name the parser (`h1_parse`) accepted, if the name is known: its
/// lower-case bytes, the name and its `seen` bit; nothing is built.
#[inline]
pub fn known_name(name: &[u8]) -> Option<&'static Known> {
    known(name.len())
        .iter()
        .find(|(lower, _, _)| folded_eq(name, lower))
}

/// The `seen` bits of the names a header map holds (one pass: for a request whose plugins may
/// have changed its headers, what the parser saw no longer holds).
pub fn seen_in(headers: &http::HeaderMap) -> u32 {
    headers.keys().fold(0, |m, k| {
        m | known_name(k.as_str().as_bytes()).map_or(0, |(_, _, bit)| *bit)
    })
}

/// The header name for bytes the parser (`h1_parse`) accepted as a field name, and its `seen` bit
/// (0 for names no look-up depends on).
#[inline]
pub fn from_parsed(name: &[u8]) -> Result<(HeaderName, u32), InvalidHeaderName> {
    match known_name(name) {
        Some((_, name_known, bit)) => Ok((name_known.clone(), *bit)),
        None => HeaderName::from_bytes(name).map(|n| (n, 0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_sorted_by_length_and_lower_case() {
        for len in 0..64 {
            for (lower, name, _) in known(len) {
                assert_eq!(lower.len(), len, "{name}");
                assert_eq!(*lower, name.as_str().as_bytes());
            }
        }
    }

    #[test]
    fn a_maps_names_give_their_bits() {
        let mut h = http::HeaderMap::new();
        h.insert("x-custom", "1".parse().unwrap());
        assert_eq!(seen_in(&h), 0);
        h.insert("x-forwarded-for", "1.2.3.4".parse().unwrap());
        h.insert(header::CONNECTION, "close".parse().unwrap());
        h.insert("x-kong-request-id", "r".parse().unwrap());
        assert_eq!(seen_in(&h), seen::FORWARDED | seen::HOP_BY_HOP | seen::KONG);
    }

    #[test]
    fn known_and_unknown_names_match_the_general_path() {
        let names: &[&[u8]] = &[
            b"Host",
            b"HOST",
            b"content-length",
            b"Content-Length",
            b"CONTENT-LENGTH",
            b"Content-Lengtx",
            b"X-Forwarded-For",
            b"X-Forwarded-Fox",
            b"apikey",
            b"ApiKey",
            b"x-custom",
            b"X",
            b"a-very-long-header-name-that-is-not-known",
            b"Transfer-Encoding",
            b"Transfer_Encoding",
        ];
        for n in names {
            assert_eq!(
                from_parsed(n).ok().map(|k| k.0),
                HeaderName::from_bytes(n).ok(),
                "{}",
                String::from_utf8_lossy(n)
            );
        }
        // Every known name, in upper case and with one letter changed.
        for len in 0..64 {
            for (lower, name, _) in known(len) {
                let upper = lower.to_ascii_uppercase();
                assert_eq!(from_parsed(&upper).ok().map(|k| k.0).as_ref(), Some(name));
                for i in 0..upper.len() {
                    let mut other = upper.clone();
                    other[i] = if other[i] == b'Q' { b'Z' } else { b'Q' };
                    assert_eq!(
                        from_parsed(&other).ok().map(|k| k.0),
                        HeaderName::from_bytes(&other).ok()
                    );
                }
            }
        }
        assert!(from_parsed(b"").is_err());
        // Every name the request path would look up or strip sets its group's bit: a name
        // missing here would be skipped by the proxy (a client's X-Forwarded-For lost).
        let groups: &[(&[&str], u32)] = &[
            (
                &[
                    "connection",
                    "keep-alive",
                    "proxy-connection",
                    "te",
                    "trailer",
                    "transfer-encoding",
                    "upgrade",
                    "proxy-authenticate",
                ],
                seen::HOP_BY_HOP,
            ),
            (
                &[
                    "x-forwarded-for",
                    "x-forwarded-proto",
                    "x-forwarded-host",
                    "x-forwarded-port",
                    "x-forwarded-path",
                    "x-forwarded-prefix",
                    "x-real-ip",
                ],
                seen::FORWARDED,
            ),
            (&["accept"], seen::ACCEPT),
            (
                &[
                    "x-kong-request-id",
                    "x-kong-proxy-latency",
                    "x-kong-upstream-latency",
                    "x-kong-upstream-status",
                    "x-kong-response-latency",
                ],
                seen::KONG,
            ),
        ];
        for (names, bit) in groups {
            for n in *names {
                for form in [n.to_string(), n.to_ascii_uppercase()] {
                    let (_, got) = from_parsed(form.as_bytes()).unwrap();
                    assert_eq!(got & bit, *bit, "{form}");
                }
            }
        }
        assert!(from_parsed(b"bad name").is_err());
    }
}
