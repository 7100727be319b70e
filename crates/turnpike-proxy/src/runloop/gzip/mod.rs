//! Response compression, as nginx's gzip filter does it for Kong (`conf::GzipConf`, from
//! `nginx_proxy_gzip*`): responses of status 200, 403 or 404, of a listed type, not already
//! encoded, not shorter than `min_length`, to a client that accepts gzip over HTTP/1.1 (and,
//! through a proxy, as `gzip_proxied` allows), are compressed as they stream: each piece the
//! upstream sends goes out compressed and flushed, the whole response is never held.
//! `gzip_vary` adds `Vary: Accept-Encoding` to every response that could be compressed, as
//! nginx does, whether or not this client accepts gzip.

use std::cell::RefCell;
use std::rc::Rc;

use flate2::{Compress, Crc, FlushCompress, Status};

mod fixed;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, StatusCode, Version};
use turnpike_config::conf::{GzipConf, Proxied};

/// What the response check needs of the request (taken before the request is consumed).
#[derive(Clone, Copy, Debug, Default)]
pub struct GzipRequest {
    /// The client accepts gzip, over an HTTP version the config allows.
    accepts: bool,
    /// It came through a proxy (`Via`).
    via: bool,
    /// It carries credentials (`Authorization`).
    auth: bool,
    head: bool,
}

/// Kong's Accept-Encoding check (nginx's `ngx_http_gzip_accept_encoding`): `gzip` without
/// `q=0`.
fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.split(';');
            let name = parts.next().unwrap_or("").trim();
            let zero = parts.any(|p| {
                p.trim()
                    .strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    .is_some_and(|q| q == 0.0)
            });
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !zero
        })
}

pub fn request<B>(conf: &GzipConf, req: &Request<B>) -> GzipRequest {
    let version_ok = match req.version() {
        Version::HTTP_09 => false,
        Version::HTTP_10 => conf.http_1_0,
        _ => true,
    };
    GzipRequest {
        accepts: version_ok && accepts_gzip(req.headers()),
        via: req.headers().contains_key(header::VIA),
        auth: req.headers().contains_key(header::AUTHORIZATION),
        head: req.method() == Method::HEAD,
    }
}

/// The response's media type (no parameters), lower-cased.
fn media_type(h: &HeaderMap) -> Option<String> {
    let ct = h.get(header::CONTENT_TYPE)?.to_str().ok()?;
    Some(ct.split(';').next()?.trim().to_ascii_lowercase())
}

fn type_listed(conf: &GzipConf, h: &HeaderMap) -> bool {
    if conf.any_type {
        return true;
    }
    let Some(t) = media_type(h) else {
        return false;
    };
    t == "text/html" || conf.types.contains(&t)
}

/// `gzip_proxied`: whether a request that came through a proxy may get compression.
fn proxied_ok(conf: &GzipConf, r: &GzipRequest, h: &HeaderMap) -> bool {
    let cache_control = |token: &str| {
        h.get_all(header::CACHE_CONTROL)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.split(',').any(|d| d.trim().eq_ignore_ascii_case(token)))
    };
    conf.proxied.iter().any(|p| match p {
        Proxied::Any => true,
        Proxied::Expired => h.contains_key(header::EXPIRES),
        Proxied::NoCache => cache_control("no-cache"),
        Proxied::NoStore => cache_control("no-store"),
        Proxied::Private => cache_control("private"),
        Proxied::NoLastModified => !h.contains_key(header::LAST_MODIFIED),
        Proxied::NoEtag => !h.contains_key(header::ETAG),
        Proxied::Auth => r.auth,
    })
}

/// Whether [`apply`] can do anything to this response, from what is known without its header
/// map (the status, a HEAD request, the Content-Length): when not, the response goes out as
/// if gzip were off, its head written straight from the upstream's (a response below
/// `gzip_min_length` costs nothing, as in nginx).
pub fn may_apply(
    conf: &GzipConf,
    r: &GzipRequest,
    status: StatusCode,
    content_length: Option<u64>,
) -> bool {
    matches!(status.as_u16(), 200 | 403 | 404)
        && !r.head
        && content_length.is_none_or(|n| n >= conf.min_length)
        // Without gzip_vary, a client that does not take gzip gets nothing from it.
        && (r.accepts || conf.vary)
}

/// Whether to compress this response (and, with `gzip_vary`, adds `Vary`): if so, the
/// headers are changed (Content-Encoding set, Content-Length gone) and the caller wraps the
/// body in [`Encoder`].
pub fn apply(conf: &GzipConf, r: &GzipRequest, status: StatusCode, h: &mut HeaderMap) -> bool {
    let eligible = matches!(status.as_u16(), 200 | 403 | 404)
        && h.get(header::CONTENT_ENCODING).is_none_or(|v| v.is_empty())
        && h.get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .is_none_or(|n| n >= conf.min_length)
        && type_listed(conf, h)
        && !r.head;
    if !eligible {
        return false;
    }
    if conf.vary {
        h.append(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    }
    if !r.accepts || (r.via && !proxied_ok(conf, r, h)) {
        return false;
    }
    h.remove(header::CONTENT_LENGTH);
    h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    true
}

/// Deflate states kept for the next response, per worker: setting one up costs more than
/// compressing a small response, resetting one costs less (zlib-rs clears its 128 KiB hash
/// table; miniz_oxide, the backend before, cleared 320 KiB of tables).
///
/// nginx sizes its window and hash to a small response's Content-Length; zlib-rs's hash
/// table is the same size whatever the window (`HASH_SIZE`), and a fresh small-window state
/// measured dearer than a pooled full one (callgrind, 3-byte body: +324,138 instructions
/// against +191,786).
pub type EncoderPool = Rc<RefCell<Vec<Compress>>>;

/// The most deflate states a worker keeps (each holds its window and tables, ~300 KB).
const POOL_MAX: usize = 16;

/// nginx's gzip header (no name, no time, OS unix).
const GZIP_HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3];

/// The body filter that compresses: each piece is compressed and flushed (a client reading
/// a stream gets it as it comes), the gzip trailer at the end. A body whose Content-Length
/// says it is small ([`fixed::MAX`]) is gathered and coded in one go by [`fixed`], which clears
/// no 176 KiB of zlib-rs state for it.
pub struct Encoder {
    deflate: Option<Compress>,
    level: u32,
    pool: EncoderPool,
    crc: Crc,
    started: bool,
    /// A small body, gathered until its end.
    small: Option<Vec<u8>>,
}

impl Encoder {
    /// `content_length`: what the response's head announced, if anything.
    pub fn new(level: u32, pool: &EncoderPool, content_length: Option<u64>) -> Encoder {
        let small = content_length
            .filter(|n| *n as usize <= fixed::MAX)
            .map(|n| Vec::with_capacity(n as usize));
        Encoder {
            deflate: None,
            level,
            pool: pool.clone(),
            crc: Crc::new(),
            started: false,
            small,
        }
    }

    /// Deflates `input` into `out` with `flush`, until all of it is in.
    fn deflate(c: &mut Compress, mut input: &[u8], out: &mut Vec<u8>, flush: FlushCompress) {
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(input.len() / 2 + 4096);
            }
            let before = c.total_in();
            let status = c.compress_vec(input, out, flush);
            input = &input[(c.total_in() - before) as usize..];
            let room_left = out.len() < out.capacity();
            match status {
                Ok(Status::StreamEnd) => return,
                Ok(_) if input.is_empty() && room_left && flush != FlushCompress::Finish => return,
                Ok(_) => {}
                Err(_) => return,
            }
        }
    }

    /// A piece of a streamed body, through zlib-rs.
    fn stream(&mut self, piece: &[u8], eof: bool) -> bytes::Bytes {
        let (level, pool) = (self.level, &self.pool);
        let c = self.deflate.get_or_insert_with(|| {
            pool.borrow_mut()
                .pop()
                .unwrap_or_else(|| Compress::new(flate2::Compression::new(level), false))
        });
        let mut out = Vec::with_capacity(piece.len() / 2 + 64);
        if !self.started {
            out.extend_from_slice(&GZIP_HEADER);
            self.started = true;
        }
        self.crc.update(piece);
        let flush = if eof {
            FlushCompress::Finish
        } else {
            FlushCompress::Sync
        };
        Self::deflate(c, piece, &mut out, flush);
        if eof {
            out.extend_from_slice(&self.crc.sum().to_le_bytes());
            out.extend_from_slice(&self.crc.amount().to_le_bytes());
        }
        bytes::Bytes::from(out)
    }
}

impl Drop for Encoder {
    fn drop(&mut self) {
        if let Some(mut c) = self.deflate.take() {
            let mut pool = self.pool.borrow_mut();
            if pool.len() < POOL_MAX {
                c.reset();
                pool.push(c);
            }
        }
    }
}

impl turnpike_plugins::BodyFilter for Encoder {
    fn filter(&mut self, piece: bytes::Bytes, eof: bool) -> bytes::Bytes {
        if let Some(body) = self.small.as_mut() {
            body.extend_from_slice(&piece);
            if body.len() > fixed::MAX {
                // Longer than its head said: a stream after all.
                let gathered = std::mem::take(body);
                self.small = None;
                return self.stream(&gathered, eof);
            }
            if !eof {
                return bytes::Bytes::new();
            }
            let body = self.small.take().unwrap_or_default();
            let deflated = fixed::deflate(&body);
            let mut out = Vec::with_capacity(GZIP_HEADER.len() + deflated.len() + 8);
            out.extend_from_slice(&GZIP_HEADER);
            out.extend_from_slice(&deflated);
            self.crc.update(&body);
            out.extend_from_slice(&self.crc.sum().to_le_bytes());
            out.extend_from_slice(&self.crc.amount().to_le_bytes());
            self.started = true;
            return bytes::Bytes::from(out);
        }
        if piece.is_empty() && !eof {
            return bytes::Bytes::new();
        }
        self.stream(&piece, eof)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use turnpike_plugins::BodyFilter;

    #[test]
    fn accept_encoding_as_nginx_reads_it() {
        let h = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert(header::ACCEPT_ENCODING, v.parse().unwrap());
            m
        };
        assert!(accepts_gzip(&h("gzip, deflate, br")));
        assert!(accepts_gzip(&h("br;q=1.0, gzip;q=0.5")));
        assert!(!accepts_gzip(&h("gzip;q=0")));
        assert!(!accepts_gzip(&h("identity")));
    }

    #[test]
    fn what_gzip_cannot_touch_is_known_without_the_header_map() {
        let conf = GzipConf {
            types: vec!["text/plain".into()],
            any_type: false,
            min_length: 20,
            level: 1,
            vary: false,
            proxied: Vec::new(),
            http_1_0: false,
        };
        let client = GzipRequest {
            accepts: true,
            ..GzipRequest::default()
        };
        let ok = StatusCode::OK;
        assert!(may_apply(&conf, &client, ok, Some(20)));
        assert!(
            may_apply(&conf, &client, ok, None),
            "chunked: unknown length"
        );
        assert!(
            !may_apply(&conf, &client, ok, Some(3)),
            "below gzip_min_length"
        );
        assert!(!may_apply(
            &conf,
            &client,
            StatusCode::NOT_MODIFIED,
            Some(100)
        ));
        let head = GzipRequest {
            head: true,
            ..client
        };
        assert!(!may_apply(&conf, &head, ok, Some(100)));
        let plain_client = GzipRequest::default();
        assert!(!may_apply(&conf, &plain_client, ok, Some(100)));
        // With gzip_vary, a client that does not take gzip still gets `Vary`.
        let vary = GzipConf { vary: true, ..conf };
        assert!(may_apply(&vary, &plain_client, ok, Some(100)));
        // Whatever may_apply refuses, apply would not have touched.
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, "text/plain".parse().unwrap());
        h.insert(header::CONTENT_LENGTH, "3".parse().unwrap());
        assert!(!apply(&vary, &client, ok, &mut h));
        assert!(h.get(header::VARY).is_none());
    }

    #[test]
    fn pieces_come_out_compressed_and_whole() {
        let pool = EncoderPool::default();
        let mut e = Encoder::new(6, &pool, None);
        let mut out = Vec::new();
        for piece in ["hello ", "streaming ", "world"] {
            let b = e.filter(bytes::Bytes::from(piece), false);
            assert!(!b.is_empty(), "each piece is flushed");
            out.extend_from_slice(&b);
        }
        out.extend_from_slice(&e.filter(bytes::Bytes::new(), true));
        let mut text = String::new();
        flate2::read::GzDecoder::new(&out[..])
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "hello streaming world");
        // The deflate state goes back to the worker's pool, and serves the next response.
        drop(e);
        assert_eq!(pool.borrow().len(), 1);
        let mut e = Encoder::new(6, &pool, None);
        let mut out = e.filter(bytes::Bytes::from("again"), false).to_vec();
        out.extend_from_slice(&e.filter(bytes::Bytes::new(), true));
        let mut text = String::new();
        flate2::read::GzDecoder::new(&out[..])
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "again");
        assert!(pool.borrow().is_empty());
    }

    #[test]
    fn a_small_body_is_gathered_and_coded_whole() {
        let pool = EncoderPool::default();
        let body = "{\"id\": 1, \"name\": \"item-7\", \"status\": \"active\"}\n".repeat(3);
        let (a, b) = body.split_at(40);
        let mut e = Encoder::new(1, &pool, Some(body.len() as u64));
        assert!(e
            .filter(bytes::Bytes::from(a.to_string()), false)
            .is_empty());
        assert!(e
            .filter(bytes::Bytes::from(b.to_string()), false)
            .is_empty());
        let out = e.filter(bytes::Bytes::new(), true);
        let mut text = String::new();
        flate2::read::GzDecoder::new(&out[..])
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, body);
        // No zlib-rs state was taken or made for it.
        drop(e);
        assert!(pool.borrow().is_empty());
        // A body longer than its head said goes on as a stream, whole.
        let mut e = Encoder::new(1, &pool, Some(10));
        let mut out = e
            .filter(bytes::Bytes::from(body.repeat(300)), false)
            .to_vec();
        out.extend_from_slice(&e.filter(bytes::Bytes::new(), true));
        let mut text = String::new();
        flate2::read::GzDecoder::new(&out[..])
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, body.repeat(300));
    }
}
