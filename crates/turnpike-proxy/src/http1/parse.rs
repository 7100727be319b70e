//! HTTP/1.x head parsing for both sides of the proxy: the client's request head and the
//! upstream's response head.
//!
//! Why not `httparse`: it is correct and fast on long heads, but on the short heads a proxy
//! mostly sees its per-header costs dominate — run-time SIMD dispatch for every name and value,
//! a `Header` array initialised or handed out slot by slot, and the caller converting slices
//! back into offsets. Under callgrind it took ~240 instructions a header, ~1,250 of a plain
//! proxied request's ~21,000 (`bench/instructions.sh`). This parser hands each field to the
//! caller as byte offsets as soon as it is read, checks values eight bytes at a time, and accepts
//! and refuses exactly what `httparse`'s default configuration does (the differential test below
//! holds it to that on generated heads), so switching changed no verdict:
//!
//! - header names are RFC 9110 tokens, followed directly by `:` (no space before the colon);
//! - values may hold HTAB, SP, visible ASCII and obs-text (0x80–0xFF), nothing else; leading and
//!   trailing SP/HTAB are not part of the value;
//! - lines end in CRLF or a bare LF (RFC 9112 §2.2 allows recognising LF alone); a CR must be
//!   followed by LF;
//! - obs-fold (a line starting with SP or HTAB) is refused, as RFC 9112 §5.2 lets a server do;
//! - empty lines before the request or status line are skipped (RFC 9112 §2.2);
//! - the request line is `token SP target SP HTTP/1.x`, one space each; the target holds bytes
//!   0x21–0x7E (the URI parser checks it further); the status line is
//!   `HTTP/1.x SP 3DIGIT`, then SP and a reason phrase (HTAB, SP, VCHAR, obs-text) or the line end.

/// One header line: byte offsets of the name and of the value (trimmed) in the head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub name_start: usize,
    pub name_end: usize,
    pub value_start: usize,
    pub value_end: usize,
}

/// Why a head is not HTTP/1.x.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseError {
    /// A byte where the grammar does not allow it.
    Invalid(&'static str),
    /// More header lines than the caller takes.
    TooManyHeaders,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParseError::Invalid(what) => write!(f, "invalid {what}"),
            ParseError::TooManyHeaders => f.write_str("too many headers"),
        }
    }
}

/// A parsed request line: method and target as offsets, the minor version (0 or 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLine {
    pub method: (usize, usize),
    pub target: (usize, usize),
    pub minor: u8,
}

/// A parsed status line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusLine {
    pub code: u16,
    pub minor: u8,
}

/// `Ok(None)`: the head is not complete yet. `Ok(Some((line, len)))`: the head is `len` bytes.
pub type Parsed<T> = Result<Option<(T, usize)>, ParseError>;

/// A table of which bytes `$test` accepts, built at compile time.
macro_rules! byte_class {
    (|$b:ident| $test:expr) => {{
        let mut t = [false; 256];
        let mut i = 0;
        while i < 256 {
            let $b = i as u8;
            t[i] = $test;
            i += 1;
        }
        t
    }};
}

/// RFC 9110 §5.6.2 tchar.
static TOKEN: [bool; 256] = byte_class!(|b| {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'!' | b'#'
                | b'$'
                | b'%'
                | b'&'
                | b'\''
                | b'*'
                | b'+'
                | b'-'
                | b'.'
                | b'^'
                | b'_'
                | b'`'
                | b'|'
                | b'~'
        )
});

/// Field-value bytes (RFC 9110 §5.5): HTAB, SP, VCHAR, obs-text.
static VALUE: [bool; 256] = byte_class!(|b| b == b'\t' || (b >= b' ' && b != 0x7f));

/// Request-target bytes: visible ASCII (the URI parser checks further). No obs-text: a URI
/// cannot hold it (`httparse` refuses it too, on its vectorised paths).
static TARGET: [bool; 256] = byte_class!(|b| b > b' ' && b < 0x7f);

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The offset of the first byte at or after `i` that cannot be inside a field value (a line
/// end, a control byte, or the end of `buf`). Eight bytes at a time while no byte is below
/// 0x20 or equal to 0x7f (the only bytes a value cannot hold; HTAB, rare, goes the slow way).
#[inline]
fn value_end(buf: &[u8], mut i: usize) -> usize {
    while i + 8 <= buf.len() {
        let x = u64::from_le_bytes(buf[i..i + 8].try_into().unwrap());
        // Any byte < 0x20 (exact for "any", see Bit Twiddling Hacks' hasless), or == 0x7f.
        let below = x.wrapping_sub(ONES * 0x20) & !x & HIGHS;
        let y = x ^ (ONES * 0x7f);
        let del = y.wrapping_sub(ONES) & !y & HIGHS;
        if below | del != 0 {
            break;
        }
        i += 8;
    }
    while let Some(&b) = buf.get(i) {
        if !VALUE[b as usize] {
            break;
        }
        i += 1;
    }
    i
}

/// The end of a run of at least one `class` byte from `i` that `delimiter` follows:
/// `Ok(Some(end))` with `buf[end] == delimiter`, `Ok(None)` when the buffer ends first.
#[inline]
fn span(
    buf: &[u8],
    mut i: usize,
    class: &[bool; 256],
    delimiter: u8,
    what: &'static str,
) -> Result<Option<usize>, ParseError> {
    let start = i;
    while let Some(&b) = buf.get(i) {
        if !class[b as usize] {
            break;
        }
        i += 1;
    }
    match buf.get(i) {
        None => Ok(None),
        Some(&b) if b == delimiter && i > start => Ok(Some(i)),
        Some(_) => Err(ParseError::Invalid(what)),
    }
}

/// The end of a line ending at `i`: `Ok(Some(next))` after CRLF or LF, `Ok(None)` when the
/// buffer ends first, an error for anything else.
#[inline]
fn line_end(buf: &[u8], i: usize, what: &'static str) -> Result<Option<usize>, ParseError> {
    match buf.get(i) {
        Some(b'\n') => Ok(Some(i + 1)),
        Some(b'\r') => match buf.get(i + 1) {
            Some(b'\n') => Ok(Some(i + 2)),
            Some(_) => Err(ParseError::Invalid(what)),
            None => Ok(None),
        },
        Some(_) => Err(ParseError::Invalid(what)),
        None => Ok(None),
    }
}

/// Skips empty lines before a start line.
#[inline]
fn skip_empty_lines(buf: &[u8]) -> Result<Option<usize>, ParseError> {
    let mut i = 0;
    loop {
        match buf.get(i) {
            Some(b'\n') => i += 1,
            Some(b'\r') => match buf.get(i + 1) {
                Some(b'\n') => i += 2,
                Some(_) => return Err(ParseError::Invalid("new line")),
                None => return Ok(None),
            },
            Some(_) => return Ok(Some(i)),
            None => return Ok(None),
        }
    }
}

/// `HTTP/1.0` or `HTTP/1.1` at `i`: the minor version. `Ok(None)` while the bytes there are a
/// prefix of one.
#[inline]
fn version(buf: &[u8], i: usize) -> Result<Option<u8>, ParseError> {
    match buf.get(i..i + 8) {
        Some(b"HTTP/1.1") => Ok(Some(1)),
        Some(b"HTTP/1.0") => Ok(Some(0)),
        Some(_) => Err(ParseError::Invalid("version")),
        None => {
            let have = &buf[i.min(buf.len())..];
            let n = have.len().min(7);
            if have[..n] == b"HTTP/1."[..n] {
                Ok(None)
            } else {
                Err(ParseError::Invalid("version"))
            }
        }
    }
}

/// Header lines from `i` to the empty line that ends the head, each handed to `field`.
/// `Ok(Some(len))`: the head ends at `len`.
#[inline]
fn fields(
    buf: &[u8],
    mut i: usize,
    max: usize,
    mut field: impl FnMut(Field),
) -> Result<Option<usize>, ParseError> {
    let mut count = 0;
    loop {
        // An empty line ends the head.
        match buf.get(i) {
            None => return Ok(None),
            Some(b'\r' | b'\n') => return line_end(buf, i, "new line"),
            Some(_) => {}
        }
        let name_start = i;
        let Some(name_end) = span(buf, i, &TOKEN, b':', "header name")? else {
            return Ok(None);
        };
        i = name_end + 1;
        while let Some(b' ' | b'\t') = buf.get(i) {
            i += 1;
        }
        let value_start = i;
        i = value_end(buf, i);
        // Trailing SP/HTAB are not part of the value (no other whitespace got this far).
        let end = value_start + buf[value_start..i].trim_ascii_end().len();
        i = match line_end(buf, i, "header value")? {
            Some(next) => next,
            None => return Ok(None),
        };
        if count == max {
            return Err(ParseError::TooManyHeaders);
        }
        count += 1;
        field(Field {
            name_start,
            name_end,
            value_start,
            value_end: end,
        });
    }
}

/// Parses a request head from the front of `buf`, handing each of at most `max` header lines
/// to `field` (again from the first on every call: an incomplete head is parsed anew when more
/// bytes come, so a caller resets what it gathered when it gets `Ok(None)`).
pub fn request(buf: &[u8], max: usize, field: impl FnMut(Field)) -> Parsed<RequestLine> {
    let Some(mut i) = skip_empty_lines(buf)? else {
        return Ok(None);
    };
    let Some(end) = span(buf, i, &TOKEN, b' ', "method")? else {
        return Ok(None);
    };
    let method = (i, end);
    let Some(end) = span(buf, end + 1, &TARGET, b' ', "request target")? else {
        return Ok(None);
    };
    let target = (method.1 + 1, end);
    i = end + 1;
    let Some(minor) = version(buf, i)? else {
        return Ok(None);
    };
    let Some(i) = line_end(buf, i + 8, "version")? else {
        return Ok(None);
    };
    Ok(fields(buf, i, max, field)?.map(|len| {
        (
            RequestLine {
                method,
                target,
                minor,
            },
            len,
        )
    }))
}

/// Parses a response head from the front of `buf`, as [`request`] does.
pub fn response(buf: &[u8], max: usize, field: impl FnMut(Field)) -> Parsed<StatusLine> {
    let Some(mut i) = skip_empty_lines(buf)? else {
        return Ok(None);
    };
    let Some(minor) = version(buf, i)? else {
        return Ok(None);
    };
    i += 8;
    match buf.get(i) {
        None => return Ok(None),
        Some(b' ') => i += 1,
        Some(_) => return Err(ParseError::Invalid("status")),
    }
    let mut code = 0u16;
    for k in 0..3 {
        match buf.get(i + k) {
            None => return Ok(None),
            Some(&d) if d.is_ascii_digit() => code = code * 10 + u16::from(d - b'0'),
            Some(_) => return Err(ParseError::Invalid("status")),
        }
    }
    i += 3;
    match buf.get(i) {
        None => return Ok(None),
        Some(b' ') => {
            // The reason phrase: never used, but its bytes must be allowed ones.
            i = value_end(buf, i + 1);
        }
        Some(b'\r' | b'\n') => {}
        Some(_) => return Err(ParseError::Invalid("status")),
    }
    let Some(i) = line_end(buf, i, "reason phrase")? else {
        return Ok(None);
    };
    Ok(fields(buf, i, max, field)?.map(|len| (StatusLine { code, minor }, len)))
}

/// The differential check that holds this parser to `httparse`'s verdicts (default
/// configuration): run by the unit test below on generated heads and by the `h1_differential`
/// fuzz target on whatever libFuzzer finds. Panics on a disagreement.
#[cfg(any(test, feature = "fuzzing"))]
pub mod differential {
    use super::*;

    /// Header lines as (name, value) bytes, from each parser's output.
    type Lines = Vec<(Vec<u8>, Vec<u8>)>;
    fn their_lines(headers: &[httparse::Header<'_>]) -> Lines {
        headers
            .iter()
            .map(|f| (f.name.as_bytes().to_vec(), f.value.to_vec()))
            .collect()
    }
    fn our_lines(head: &[u8], fields: &[Field]) -> Lines {
        fields
            .iter()
            .map(|f| {
                (
                    head[f.name_start..f.name_end].to_vec(),
                    head[f.value_start..f.value_end].to_vec(),
                )
            })
            .collect()
    }

    /// The same outcome from both parsers: the same parse, both incomplete, or both refusing
    /// (too many headers for both, or a grammar error for both).
    fn same_verdict<T: PartialEq + std::fmt::Debug>(
        what: &str,
        head: &[u8],
        theirs: &Result<Option<T>, httparse::Error>,
        ours: &Result<Option<T>, ParseError>,
    ) {
        match (theirs, ours) {
            (Ok(t), Ok(o)) => assert_eq!(t, o, "{what} {:?}", String::from_utf8_lossy(head)),
            (Err(httparse::Error::TooManyHeaders), Err(ParseError::TooManyHeaders)) => {}
            (Err(e), Err(ParseError::Invalid(_))) if *e != httparse::Error::TooManyHeaders => {}
            _ => panic!(
                "{what} {:?}: httparse {theirs:?}, ours {ours:?}",
                String::from_utf8_lossy(head)
            ),
        }
    }

    /// Parses `h` as a request and as a response with both parsers and panics unless they
    /// agree; returns httparse's verdict on the request (complete, partial or refused).
    pub fn agrees(h: &[u8]) -> Result<Option<()>, httparse::Error> {
        // Requests.
        let mut slots = [httparse::EMPTY_HEADER; 16];
        let mut theirs = httparse::Request::new(&mut slots);
        let theirs = theirs.parse(h).map(|s| match s {
            httparse::Status::Complete(n) => Some((
                n,
                theirs.method.unwrap().as_bytes().to_vec(),
                theirs.path.unwrap().as_bytes().to_vec(),
                theirs.version.unwrap(),
                their_lines(theirs.headers),
            )),
            httparse::Status::Partial => None,
        });
        let mut out = Vec::new();
        let ours = request(h, 16, |f| out.push(f)).map(|r| {
            r.map(|(line, n)| {
                (
                    n,
                    h[line.method.0..line.method.1].to_vec(),
                    h[line.target.0..line.target.1].to_vec(),
                    line.minor,
                    our_lines(h, &out),
                )
            })
        });
        // httparse lets obs-text into a target on its scalar path and refuses it on its
        // vectorised ones (which one runs depends on the bytes left); we always refuse it.
        let obs_text_target =
            ours == Err(ParseError::Invalid("request target")) && h.iter().any(|&b| b >= 0x80);
        if !obs_text_target {
            same_verdict("request", h, &theirs, &ours);
        }
        let verdict = theirs
            .as_ref()
            .map(|t| t.as_ref().map(|_| ()))
            .map_err(|e| *e);
        // Responses.
        let mut slots = [httparse::EMPTY_HEADER; 16];
        let mut theirs = httparse::Response::new(&mut slots);
        let theirs = theirs.parse(h).map(|s| match s {
            httparse::Status::Complete(n) => Some((
                n,
                theirs.code.unwrap(),
                theirs.version.unwrap(),
                their_lines(theirs.headers),
            )),
            httparse::Status::Partial => None,
        });
        let mut out = Vec::new();
        let ours = response(h, 16, |f| out.push(f))
            .map(|r| r.map(|(line, n)| (n, line.code, line.minor, our_lines(h, &out))));
        same_verdict("response", h, &theirs, &ours);
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A parse's outcome with the header lines as strings.
    type Outcome<T> = Result<Option<(T, usize, Vec<(String, String)>)>, ParseError>;

    fn req(buf: &[u8]) -> Outcome<RequestLine> {
        let mut out = Vec::new();
        let r = request(buf, 100, |f| out.push(f))?;
        Ok(r.map(|(line, len)| (line, len, strings(buf, &out))))
    }

    fn resp(buf: &[u8]) -> Outcome<StatusLine> {
        let mut out = Vec::new();
        let r = response(buf, 100, |f| out.push(f))?;
        Ok(r.map(|(line, len)| (line, len, strings(buf, &out))))
    }

    fn strings(buf: &[u8], fields: &[Field]) -> Vec<(String, String)> {
        fields
            .iter()
            .map(|f| {
                (
                    String::from_utf8_lossy(&buf[f.name_start..f.name_end]).into_owned(),
                    String::from_utf8_lossy(&buf[f.value_start..f.value_end]).into_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn request_heads() {
        let (line, len, fields) =
            req(b"GET /a?b=c HTTP/1.1\r\nHost: x\r\nX-A:  two words \t\r\n\r\nbody")
                .unwrap()
                .unwrap();
        assert_eq!(line.method, (0, 3));
        assert_eq!(line.target, (4, 10));
        assert_eq!(line.minor, 1);
        assert_eq!(len, 51);
        assert_eq!(
            fields,
            [
                ("Host".into(), "x".into()),
                ("X-A".into(), "two words".into())
            ]
        );
        // Bare LF line ends, an empty value, leading empty lines, HTTP/1.0.
        let (line, len, fields) = req(b"\r\n\nPOST / HTTP/1.0\nA:\nB: \x80\xff\n\n")
            .unwrap()
            .unwrap();
        assert_eq!((line.method, line.minor, len), ((3, 7), 0, 29));
        assert_eq!(fields[0], ("A".into(), "".into()));
        assert_eq!(fields[1].1.as_bytes(), "\u{fffd}\u{fffd}".as_bytes());
    }

    #[test]
    fn incomplete_heads_ask_for_more() {
        let full = b"GET / HTTP/1.1\r\nHost: example.test\r\nAccept: */*\r\n\r\n";
        for n in 0..full.len() {
            assert_eq!(req(&full[..n]), Ok(None), "{n} bytes");
        }
        assert!(req(full).unwrap().is_some());
        let full = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n";
        for n in 0..full.len() {
            assert_eq!(resp(&full[..n]), Ok(None), "{n} bytes");
        }
        let (line, len, fields) = resp(full).unwrap().unwrap();
        assert_eq!((line.code, line.minor, len), (200, 1, full.len()));
        assert_eq!(fields, [("Content-Length".into(), "3".into())]);
    }

    #[test]
    fn what_is_refused() {
        let bad: &[&[u8]] = &[
            b"GET / HTTP/1.1\r\nHost : x\r\n\r\n", // space before the colon
            b"GET / HTTP/1.1\r\n Host: x\r\n\r\n", // obs-fold / leading space
            b"GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n", // obs-fold
            b"GET / HTTP/1.1\r\n: x\r\n\r\n",      // empty name
            b"GET / HTTP/1.1\r\nA: b\rc\r\n\r\n",  // CR inside a value
            b"GET / HTTP/1.1\r\nA: b\x00c\r\n\r\n", // NUL
            b"GET / HTTP/1.1\r\nA: b\x7fc\r\n\r\n", // DEL
            b"GET / HTTP/1.1\r\nA: bcdefghijk\x01\r\n\r\n", // control byte after 8
            b"GET / HTTP/1.1\r\nA\r\n\r\n",        // no colon
            b"GET / HTTP/1.1\r\r\n",               // CR without LF
            b"GET  / HTTP/1.1\r\n\r\n",            // two spaces
            b"GET /a b HTTP/1.1\r\n\r\n",          // space in the target
            b"GET / HTTP/2.0\r\n\r\n",             // not HTTP/1.x
            b"GET / HTTP/1.1 \r\n\r\n",            // trailing space
            b"G(T / HTTP/1.1\r\n\r\n",             // not a token
            b"GET /\x7f HTTP/1.1\r\n\r\n",         // DEL in the target
        ];
        for b in bad {
            assert!(req(b).is_err(), "{:?}", String::from_utf8_lossy(b));
        }
        let bad: &[&[u8]] = &[
            b"HTTP/1.1 20 OK\r\n\r\n",
            b"HTTP/1.1 2000 OK\r\n\r\n",
            b"HTTP/1.1  200 OK\r\n\r\n",
            b"HTTP/1.1 200 O\x01K\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nA : b\r\n\r\n",
            b"HTTP/3 200 OK\r\n\r\n",
        ];
        for b in bad {
            assert!(resp(b).is_err(), "{:?}", String::from_utf8_lossy(b));
        }
        // No reason phrase, and an empty one, are fine.
        assert_eq!(resp(b"HTTP/1.1 204\r\n\r\n").unwrap().unwrap().0.code, 204);
        assert_eq!(resp(b"HTTP/1.0 404 \n\n").unwrap().unwrap().0.code, 404);
    }

    #[test]
    fn too_many_headers() {
        let mut head = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..3 {
            head.extend_from_slice(format!("h{i}: v\r\n").as_bytes());
        }
        head.extend_from_slice(b"\r\n");
        assert!(request(&head, 3, |_| {}).unwrap().is_some());
        assert_eq!(request(&head, 2, |_| {}), Err(ParseError::TooManyHeaders));
    }

    /// A small deterministic generator (no dependency, same cases every run).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// Heads built from likely and unlikely pieces, then some bytes changed, cut short or
    /// swapped: the verdicts and fields must be `httparse`'s (default configuration).
    #[test]
    fn agrees_with_httparse() {
        const PIECES: &[&[u8]] = &[
            b"GET",
            b"POST",
            b" ",
            b"  ",
            b"/",
            b"/a?b=c",
            b"/\x80",
            b"*",
            b"HTTP/1.1",
            b"HTTP/1.0",
            b"HTTP/1.",
            b"HTTP/2",
            b"\r\n",
            b"\n",
            b"\r",
            b"Host",
            b"Content-Length",
            b"X-A",
            b":",
            b": ",
            b":\t",
            b"value",
            b"two words",
            b" \t",
            b"\t",
            b"\x00",
            b"\x7f",
            b"\x80\xff",
            b"\x01",
            b"200",
            b"20",
            b"OK",
            b"Not Found",
            b"(",
            b"\"",
            b"12345678901234567",
        ];
        const BYTES: &[u8] = b" \t\r\n:\x00\x7f\x80\x01aZ9-/";
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut heads: Vec<Vec<u8>> = Vec::new();
        let well_formed: &[&[u8]] = &[
            b"GET /x HTTP/1.1\r\nHost: a\r\nX-Long: 0123456789abcdef0123456789\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nServer: nginx\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nok\n",
        ];
        for _ in 0..40_000 {
            let mut h = if rng.below(2) == 0 {
                well_formed[rng.below(well_formed.len())].to_vec()
            } else {
                let mut h = Vec::new();
                for _ in 0..rng.below(14) {
                    h.extend_from_slice(PIECES[rng.below(PIECES.len())]);
                }
                h
            };
            for _ in 0..rng.below(3) {
                if h.is_empty() {
                    break;
                }
                let at = rng.below(h.len());
                match rng.below(3) {
                    0 => h[at] = BYTES[rng.below(BYTES.len())],
                    1 => h.truncate(at),
                    _ => h.insert(at, BYTES[rng.below(BYTES.len())]),
                }
            }
            heads.push(h);
        }
        let mut compared = [0usize; 3];
        for h in &heads {
            let theirs = differential::agrees(h);
            compared[usize::from(theirs.is_ok()) + usize::from(matches!(theirs, Ok(Some(_))))] += 1;
        }
        // The generator must reach every verdict, or the comparison proves little.
        assert!(compared.iter().all(|&n| n > 1_000), "{compared:?}");
    }
}
