//! Keys in request bodies (`key_in_body`), in the three forms Kong reads
//! (`kong.request.get_body`): URL-encoded forms, JSON objects and multipart forms. Each can
//! also give the body back without the key (`hide_credentials`).

use bytes::Bytes;
use serde_json::Value;

use crate::multipart::{self, Multipart};

enum Form<'a> {
    UrlEncoded,
    Json,
    Multipart(&'a str),
}

fn form(content_type: &str) -> Option<Form<'_>> {
    let mime = content_type
        .split_once(';')
        .map_or(content_type, |(m, _)| m);
    match mime.trim().to_ascii_lowercase().as_str() {
        "application/x-www-form-urlencoded" => Some(Form::UrlEncoded),
        "application/json" => Some(Form::Json),
        "multipart/form-data" => multipart::boundary(content_type).map(Form::Multipart),
        _ => None,
    }
}

/// `application/x-www-form-urlencoded` decoding of one name or value.
fn url_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let h = std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?;
                out.push(u8::from_str_radix(h, 16).ok()?);
                i += 2;
            }
            b'%' => return None,
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// The value of field `name` in the body, when it is a string.
pub fn key(content_type: &str, body: &[u8], name: &str) -> Option<String> {
    match form(content_type)? {
        Form::UrlEncoded => std::str::from_utf8(body).ok()?.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (url_decode(k)? == name).then(|| url_decode(v)).flatten()
        }),
        Form::Json => match serde_json::from_slice::<Value>(body).ok()? {
            Value::Object(mut m) => match m.remove(name)? {
                Value::String(s) => Some(s),
                _ => None,
            },
            _ => None,
        },
        Form::Multipart(boundary) => Multipart::parse(body, boundary)?
            .get(name)
            .and_then(|p| String::from_utf8(p.value.to_vec()).ok()),
    }
}

/// The body without field `name` (same form), for `hide_credentials`.
pub fn without(content_type: &str, body: &[u8], name: &str) -> Option<Bytes> {
    match form(content_type)? {
        Form::UrlEncoded => {
            let kept: Vec<&str> = std::str::from_utf8(body)
                .ok()?
                .split('&')
                .filter(|kv| {
                    let k = kv.split_once('=').map_or(*kv, |(k, _)| k);
                    url_decode(k).as_deref() != Some(name)
                })
                .collect();
            Some(Bytes::from(kept.join("&")))
        }
        Form::Json => match serde_json::from_slice::<Value>(body).ok()? {
            Value::Object(mut m) => {
                m.remove(name);
                serde_json::to_vec(&Value::Object(m)).ok().map(Bytes::from)
            }
            _ => None,
        },
        Form::Multipart(boundary) => {
            let mut m = Multipart::parse(body, boundary)?;
            m.delete_all(name);
            Some(Bytes::from(m.encode()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_encoded_forms() {
        let ct = "application/x-www-form-urlencoded; charset=utf-8";
        let body = b"a=1&api%5Fkey=s%20e+c&b=2";
        assert_eq!(key(ct, body, "api_key").as_deref(), Some("s e c"));
        assert_eq!(key(ct, body, "nope"), None);
        assert_eq!(&without(ct, body, "api_key").unwrap()[..], b"a=1&b=2");
        assert_eq!(key(ct, b"k=%zz", "k"), None);
        assert_eq!(key(ct, b"k=%4", "k"), None);
    }

    #[test]
    fn json_objects() {
        let ct = "application/json";
        assert_eq!(
            key(ct, br#"{"apikey": "k1", "x": [1]}"#, "apikey").as_deref(),
            Some("k1")
        );
        assert_eq!(key(ct, br#"{"apikey": 5}"#, "apikey"), None);
        assert_eq!(key(ct, b"[1]", "apikey"), None);
        assert_eq!(key(ct, b"{not json", "apikey"), None);
        assert_eq!(
            &without(ct, br#"{"apikey":"k1","x":1}"#, "apikey").unwrap()[..],
            br#"{"x":1}"#
        );
    }

    #[test]
    fn multipart_forms() {
        let ct = "multipart/form-data; boundary=XyZ";
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\nvalue\r\n--XyZ\r\nContent-Disposition: form-data; name=\"apikey\"\r\n\r\nk-multi\r\n--XyZ--\r\n";
        assert_eq!(key(ct, body, "apikey").as_deref(), Some("k-multi"));
        let stripped = without(ct, body, "apikey").unwrap();
        assert_eq!(key(ct, &stripped, "apikey"), None);
        assert_eq!(key(ct, &stripped, "other").as_deref(), Some("value"));
        assert_eq!(key(ct, b"--XyZ\r\ngarbage", "apikey"), None);
        assert_eq!(key("text/plain", body, "apikey"), None);
    }
}
