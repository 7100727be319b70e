//! A message's header lines kept as they came, as ranges into the head's bytes: an
//! upstream's response headers go back to the client this way, without a header map.

use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue};

/// An upstream response's end-to-end headers as they came: ranges into the head's bytes.
/// Kept on the connection (its line list reuses its allocation) until the body is done.
#[derive(Default)]
pub struct RawHead {
    /// The whole response head.
    pub bytes: Bytes,
    /// Each header kept, in order: name start, name end, value start, value end.
    pub lines: Vec<[u32; 4]>,
    /// The Content-Length among them.
    pub content_length: Option<u64>,
    /// A Date header is among them.
    pub has_date: bool,
}

impl RawHead {
    pub(crate) fn clear(&mut self) {
        self.bytes = Bytes::new();
        self.lines.clear();
        self.content_length = None;
        self.has_date = false;
    }

    /// The name of each kept header, in order.
    pub fn names(&self) -> impl Iterator<Item = &[u8]> {
        self.lines
            .iter()
            .map(|l| &self.bytes[l[0] as usize..l[1] as usize])
    }

    /// Appends the kept headers to `map` and forgets them (they then live in the map only).
    /// Values share the head's bytes: no copy.
    pub fn merge_into(&mut self, map: &mut HeaderMap) {
        map.reserve(self.lines.len());
        for l in self.lines.drain(..) {
            let name = &self.bytes[l[0] as usize..l[1] as usize];
            // h1_parse checked the name's and the value's bytes by the rules `HeaderName`
            // and `HeaderValue` apply; a failure here would be a parser disagreement.
            let Ok((name, _)) = crate::http1::header_names::from_parsed(name) else {
                tracing::debug!("upstream header name refused: {name:?}");
                continue;
            };
            match HeaderValue::from_maybe_shared(self.bytes.slice(l[2] as usize..l[3] as usize)) {
                Ok(v) => {
                    map.append(name, v);
                }
                Err(_) => tracing::debug!("upstream header value refused for {name}"),
            }
        }
        self.content_length = None;
        self.has_date = false;
    }

    /// Writes the kept headers as `name: value` lines. Lines that followed each other in the
    /// upstream's head go out in one copy.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let b = &self.bytes[..];
        let mut i = 0;
        while i < self.lines.len() {
            let start = self.lines[i][0] as usize;
            let mut end = self.lines[i][3] as usize;
            i += 1;
            while i < self.lines.len()
                && self.lines[i][0] as usize == end + 2
                && &b[end..end + 2] == b"\r\n"
            {
                end = self.lines[i][3] as usize;
                i += 1;
            }
            out.extend_from_slice(&b[start..end]);
            out.extend_from_slice(b"\r\n");
        }
    }
}
