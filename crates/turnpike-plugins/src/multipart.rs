//! `multipart/form-data` bodies as Kong's plugins see them (the `multipart` Lua library that
//! `kong.request.get_body` and request-transformer use): parts in order, each with its header
//! lines and value; a name finds its last part; `set_simple` replaces a part in place or adds
//! one at the end with only a `Content-Disposition` header; the body is written back with the
//! boundary it came with.

/// One part: its header lines (as they came, without line ends), its field name, its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Part<'a> {
    pub headers: Vec<std::borrow::Cow<'a, str>>,
    pub name: String,
    pub value: std::borrow::Cow<'a, [u8]>,
}

/// A parsed body, borrowing from the bytes it was read from.
#[derive(Debug)]
pub struct Multipart<'a> {
    boundary: &'a str,
    parts: Vec<Part<'a>>,
}

/// The boundary of a `multipart/form-data` content type (quotes taken off), if it is one.
pub fn boundary(content_type: &str) -> Option<&str> {
    let (mime, params) = content_type.split_once(';')?;
    if !mime.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.split(';').find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        let v = v.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(v);
        (k.trim().eq_ignore_ascii_case("boundary") && !v.is_empty()).then_some(v)
    })
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(hay, needle)
}

/// The field name of a part from its `Content-Disposition` header line.
fn field_name(line: &str) -> Option<String> {
    let (k, v) = line.split_once(':')?;
    if !k.trim().eq_ignore_ascii_case("content-disposition") {
        return None;
    }
    v.split(';').find_map(|p| {
        let (pk, pv) = p.trim().split_once('=')?;
        pk.trim()
            .eq_ignore_ascii_case("name")
            .then(|| pv.trim().trim_matches('"').to_string())
    })
}

impl<'a> Multipart<'a> {
    /// A body without parts (what `add` starts from when the client sent none).
    pub fn empty(boundary: &'a str) -> Multipart<'a> {
        Multipart {
            boundary,
            parts: Vec::new(),
        }
    }

    /// Reads `body`; `None` when it is not a well-formed multipart body with this boundary
    /// (the caller then leaves the body as it is).
    pub fn parse(body: &'a [u8], boundary: &'a str) -> Option<Multipart<'a>> {
        let delimiter = format!("--{boundary}");
        let d = delimiter.as_bytes();
        let mut parts = Vec::new();
        // The preamble, up to the first delimiter, is dropped.
        let start = find(body, d)?;
        let mut rest = &body[start + d.len()..];
        loop {
            if rest.starts_with(b"--") {
                return Some(Multipart { boundary, parts });
            }
            rest = rest.strip_prefix(b"\r\n")?;
            let end = find(rest, d)?;
            // A part ends with CRLF before the next delimiter.
            let raw = rest[..end].strip_suffix(b"\r\n")?;
            let (head, value) = match find(raw, b"\r\n\r\n") {
                Some(split) => (&raw[..split], &raw[split + 4..]),
                // Headers and no value: the blank line is the part's last bytes.
                None => (raw.strip_suffix(b"\r\n")?, &b""[..]),
            };
            let head = std::str::from_utf8(head).ok()?;
            let headers: Vec<std::borrow::Cow<'a, str>> =
                head.split("\r\n").map(std::borrow::Cow::Borrowed).collect();
            let name = headers.iter().find_map(|l| field_name(l))?;
            parts.push(Part {
                headers,
                name,
                value: std::borrow::Cow::Borrowed(value),
            });
            rest = &rest[end + d.len()..];
        }
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.parts.iter().rposition(|p| p.name == name)
    }

    /// The part named `name` (the last one, when the name is given twice).
    pub fn get(&self, name: &str) -> Option<&Part<'a>> {
        self.index(name).map(|i| &self.parts[i])
    }

    /// Sets field `name` to `value`: in its part's place when there is one, else at the end.
    pub fn set_simple(&mut self, name: &str, value: Vec<u8>) {
        let part = Part {
            headers: vec![std::borrow::Cow::Owned(format!(
                "Content-Disposition: form-data; name=\"{name}\""
            ))],
            name: name.to_string(),
            value: std::borrow::Cow::Owned(value),
        };
        match self.index(name) {
            Some(i) => self.parts[i] = part,
            None => self.parts.push(part),
        }
    }

    /// Removes the part named `name` (the last one); whether there was one.
    pub fn delete(&mut self, name: &str) -> bool {
        match self.index(name) {
            Some(i) => {
                self.parts.remove(i);
                true
            }
            None => false,
        }
    }

    /// Removes every part named `name`.
    pub fn delete_all(&mut self, name: &str) {
        self.parts.retain(|p| p.name != name);
    }

    /// The body again, with the boundary it came with (empty when no part is left).
    pub fn encode(&self) -> Vec<u8> {
        if self.parts.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        for p in &self.parts {
            out.extend_from_slice(b"--");
            out.extend_from_slice(self.boundary.as_bytes());
            out.extend_from_slice(b"\r\n");
            for h in &p.headers {
                out.extend_from_slice(h.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(&p.value);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"--");
        out.extend_from_slice(self.boundary.as_bytes());
        out.extend_from_slice(b"--\r\n");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &[u8] = b"preamble\r\n--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\none\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f.txt\"\r\nContent-Type: text/plain\r\n\r\nline1\r\nline2\r\n--XyZ--\r\n";

    #[test]
    fn boundaries_from_content_types() {
        assert_eq!(boundary("multipart/form-data; boundary=XyZ"), Some("XyZ"));
        assert_eq!(
            boundary("Multipart/Form-Data; charset=x; boundary=\"a b\""),
            Some("a b")
        );
        assert_eq!(boundary("multipart/form-data"), None);
        assert_eq!(boundary("multipart/form-data; boundary="), None);
        assert_eq!(boundary("application/json; boundary=x"), None);
    }

    #[test]
    fn parts_keep_their_headers_and_values() {
        let m = Multipart::parse(BODY, "XyZ").unwrap();
        assert_eq!(&m.get("a").unwrap().value[..], b"one");
        let f = m.get("file").unwrap();
        assert_eq!(&f.value[..], b"line1\r\nline2");
        assert_eq!(f.headers.len(), 2);
        // Written back without the preamble, otherwise byte for byte.
        assert_eq!(m.encode(), BODY[b"preamble\r\n".len()..].to_vec());
    }

    #[test]
    fn set_replaces_in_place_or_appends_and_delete_removes() {
        let mut m = Multipart::parse(BODY, "XyZ").unwrap();
        m.set_simple("a", b"two".to_vec());
        m.set_simple("new", b"v".to_vec());
        assert!(m.delete("file"));
        assert!(!m.delete("file"));
        assert_eq!(
            m.encode(),
            b"--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\ntwo\r\n--XyZ\r\nContent-Disposition: form-data; name=\"new\"\r\n\r\nv\r\n--XyZ--\r\n".to_vec()
        );
        m.delete_all("a");
        m.delete_all("new");
        assert!(m.encode().is_empty());
    }

    #[test]
    fn malformed_bodies_are_refused() {
        assert!(Multipart::parse(b"--XyZ\r\ngarbage", "XyZ").is_none());
        assert!(Multipart::parse(b"no delimiter", "XyZ").is_none());
        assert!(Multipart::parse(b"--XyZ\r\nX-No-Name: 1\r\n\r\nv\r\n--XyZ--", "XyZ").is_none());
    }
}
