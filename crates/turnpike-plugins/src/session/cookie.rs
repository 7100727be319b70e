//! lua-resty-session 4's cookie, byte for byte (Kong 3.9 pins 4.0.5): a session made on Kong
//! opens here and one made here opens on Kong, so a site that switches keeps its users signed
//! in, and can switch back.
//!
//! The cookie is a header and, with the `cookie` storage, the payload after it, both
//! base64url without padding:
//!
//! ```text
//! [ type 1 | flags 2 | sid 32 | created 5 | rolling offset 4 | data size 3 | tag 16 | idling offset 3 | mac 16 ]
//! ```
//!
//! Numbers are little-endian. `ikm` is SHA-256 of the plugin's `secret`; the payload is the
//! session's JSON sealed with AES-256-GCM under a key and IV drawn from `ikm` and the session
//! id (HKDF-SHA256, info `encryption:<sid>`, 44 bytes; PBKDF2-HMAC-SHA256 with 10,000 rounds
//! for the `remember` cookie, lua-resty-session's default `remember_safety`), with the header's
//! first 47 bytes as additional data; the MAC is HMAC-SHA256 under a key drawn with info
//! `authentication:<sid>`, over everything before it, cut to 16 bytes. With the `kong` storage
//! the cookie holds the header alone and the payload is kept in the `sessions` entity, under
//! the base64url session id.
//!
//! The session's JSON is a list of `[data, audience, subject]`, one per audience; Kong's data
//! is `[consumer id, credential id, authenticated groups]`.

use base64::Engine;
use ring::{aead, hkdf, hmac, pbkdf2};
use serde_json::Value;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

pub const SID_SIZE: usize = 32;
const TAG_SIZE: usize = 16;
const MAC_SIZE: usize = 16;
/// Type, flags, sid, created, rolling offset, data size: what the payload is sealed with.
const HEADER_TAG_SIZE: usize = 1 + 2 + SID_SIZE + 5 + 4 + 3;
/// ... and the tag: what a touch keeps.
const HEADER_TOUCH_SIZE: usize = HEADER_TAG_SIZE + TAG_SIZE;
/// ... and the idling offset: what the MAC covers.
const HEADER_MAC_SIZE: usize = HEADER_TOUCH_SIZE + 3;
pub const HEADER_SIZE: usize = HEADER_MAC_SIZE + MAC_SIZE;
/// base64url of 82 bytes.
pub const HEADER_ENCODED_SIZE: usize = 110;

const COOKIE_TYPE: u8 = 1;
pub const FLAG_STORAGE: u16 = 0x0001;
const FLAG_DEFLATE: u16 = 0x0010;

const MAX_ROLLING_OFFSET: i64 = (1 << 32) - 1;
const MAX_IDLING_OFFSET: i64 = (1 << 24) - 1;
const MAX_DATA_SIZE: usize = (1 << 24) - 1;
/// 400 days: the longest a cookie or a stored session is kept.
pub const MAX_TTL: i64 = 34_560_000;
const MAX_COOKIE_SIZE: usize = 4096;
const MAX_COOKIES: usize = 9;
/// lua-resty-session's `compression_threshold` (Kong keeps the default): JSON longer than this
/// is deflated (raw deflate, zlib's default level) when that makes it smaller.
const COMPRESSION_THRESHOLD: usize = 1024;

/// A session's keys, from the plugin's secret.
pub struct Keys {
    ikm: [u8; 32],
    prk: hkdf::Prk,
}

struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

impl Keys {
    pub fn new(secret: &str) -> Keys {
        let mut ikm = [0u8; 32];
        ikm.copy_from_slice(
            ring::digest::digest(&ring::digest::SHA256, secret.as_bytes()).as_ref(),
        );
        // OpenSSL's HKDF with an empty salt (lua-resty-session's): HMAC under an empty key.
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &[]).extract(&ikm);
        Keys { ikm, prk }
    }

    fn expand(&self, usage: &str, sid: &[u8], out: &mut [u8]) {
        let info = [usage.as_bytes(), b":", sid];
        // Lengths of 32 and 44 are far below HKDF's limit: this cannot fail.
        if let Ok(okm) = self.prk.expand(&info, Len(out.len())) {
            let _ = okm.fill(out);
        }
    }

    /// The AES-256-GCM key and IV of a session (`remember`: the remember cookie's).
    fn cipher(&self, sid: &[u8], remember: bool) -> (aead::LessSafeKey, aead::Nonce) {
        let mut bytes = [0u8; 44];
        if remember {
            let mut salt = b"encryption:".to_vec();
            salt.extend_from_slice(sid);
            pbkdf2::derive(
                pbkdf2::PBKDF2_HMAC_SHA256,
                std::num::NonZeroU32::new(10_000).unwrap_or(std::num::NonZeroU32::MIN),
                &salt,
                &self.ikm,
                &mut bytes,
            );
        } else {
            self.expand("encryption", sid, &mut bytes);
        }
        let key = aead::UnboundKey::new(&aead::AES_256_GCM, &bytes[..32])
            .map(aead::LessSafeKey::new)
            .unwrap_or_else(|_| unreachable!("a 32-byte key"));
        let mut iv = [0u8; 12];
        iv.copy_from_slice(&bytes[32..]);
        (key, aead::Nonce::assume_unique_for_key(iv))
    }

    fn mac(&self, sid: &[u8], msg: &[u8]) -> [u8; MAC_SIZE] {
        let mut k = [0u8; 32];
        self.expand("authentication", sid, &mut k);
        let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &k), msg);
        let mut out = [0u8; MAC_SIZE];
        out.copy_from_slice(&tag.as_ref()[..MAC_SIZE]);
        out
    }
}

/// The timeouts a cookie is opened under, in seconds (0: none).
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub idling: f64,
    pub rolling: f64,
    pub absolute: f64,
}

/// A session's header, decoded and checked.
#[derive(Clone, Debug)]
pub struct Header {
    pub flags: u16,
    pub sid: [u8; SID_SIZE],
    pub created: i64,
    pub rolling_offset: i64,
    /// Size of the base64url payload.
    pub data_size: usize,
    pub idling_offset: i64,
    /// The header as sent.
    pub raw: [u8; HEADER_SIZE],
}

fn le(bytes: &[u8]) -> i64 {
    bytes
        .iter()
        .rev()
        .fold(0i64, |v, b| (v << 8) | i64::from(*b))
}

fn put_le(out: &mut Vec<u8>, v: i64, size: usize) {
    for i in 0..size {
        out.push((v >> (8 * i)) as u8);
    }
}

/// base64url's length of `n` bytes, without padding.
pub fn base64_size(n: usize) -> usize {
    (n * 4).div_ceil(3)
}

/// How many cookies a payload of `data_size` takes under `name` (lua-resty-session splits at
/// 4 KiB a cookie, nine at most).
pub fn chunks(name_size: usize, data_size: usize) -> Option<usize> {
    let mut needed = name_size + 1 + HEADER_ENCODED_SIZE + data_size;
    if needed > MAX_COOKIES * MAX_COOKIE_SIZE {
        return None;
    }
    if needed <= MAX_COOKIE_SIZE {
        return Some(1);
    }
    for i in 2..=MAX_COOKIES {
        needed += name_size + 2;
        if needed > MAX_COOKIES * MAX_COOKIE_SIZE {
            return None;
        }
        if needed <= MAX_COOKIE_SIZE * i {
            return Some(i);
        }
    }
    None
}

impl Header {
    /// The header at the start of `cookie`, checked against the times, the storage and the
    /// MAC, as lua-resty-session's `open` checks it (its error messages).
    pub fn open(
        cookie: &str,
        keys: &Keys,
        storage: bool,
        remember: bool,
        t: Timeouts,
        now: i64,
    ) -> Result<Header, &'static str> {
        let encoded = cookie
            .get(..HEADER_ENCODED_SIZE)
            .ok_or("invalid session header")?;
        let bytes = B64
            .decode(encoded)
            .map_err(|_| "unable to base64url decode session header")?;
        let mut raw = [0u8; HEADER_SIZE];
        if bytes.len() != HEADER_SIZE {
            return Err("invalid session header");
        }
        raw.copy_from_slice(&bytes);
        if raw[0] != COOKIE_TYPE {
            return Err("invalid session cookie type");
        }
        let flags = le(&raw[1..3]) as u16;
        if (flags & FLAG_STORAGE != 0) != storage {
            return Err("invalid session flags");
        }
        let mut sid = [0u8; SID_SIZE];
        sid.copy_from_slice(&raw[3..35]);
        let created = le(&raw[35..40]);
        let absolute_elapsed = now - created;
        if absolute_elapsed > MAX_ROLLING_OFFSET {
            return Err("session lifetime exceeded");
        }
        let over = |elapsed: i64, limit: f64| limit != 0.0 && elapsed as f64 > limit;
        if over(absolute_elapsed, t.absolute) {
            return Err(if remember {
                "session remember absolute timeout exceeded"
            } else {
                "session absolute timeout exceeded"
            });
        }
        let rolling_offset = le(&raw[40..44]);
        let rolling_elapsed = now - created - rolling_offset;
        if over(rolling_elapsed, t.rolling) {
            return Err(if remember {
                "session remember rolling timeout exceeded"
            } else {
                "session rolling timeout exceeded"
            });
        }
        let data_size = le(&raw[44..47]) as usize;
        let idling_offset = le(&raw[63..66]);
        if remember {
            if idling_offset != 0 {
                return Err("invalid session idling offset");
            }
        } else if over(rolling_elapsed - idling_offset, t.idling) {
            return Err("session idling timeout exceeded");
        }
        let mac = keys.mac(&sid, &raw[..HEADER_MAC_SIZE]);
        if !constant_eq(&mac, &raw[HEADER_MAC_SIZE..]) {
            return Err("invalid session message authentication code");
        }
        Ok(Header {
            flags,
            sid,
            created,
            rolling_offset,
            data_size,
            idling_offset,
            raw,
        })
    }

    /// The session's entries, from the base64url payload (the rest of the cookie, or what the
    /// storage keeps).
    pub fn decrypt(
        &self,
        payload: &str,
        keys: &Keys,
        remember: bool,
    ) -> Result<Value, &'static str> {
        if payload.len() != self.data_size {
            return Err("invalid session payload");
        }
        let mut sealed = B64
            .decode(payload)
            .map_err(|_| "unable to base64url decode session data")?;
        sealed.extend_from_slice(&self.raw[HEADER_TAG_SIZE..HEADER_TOUCH_SIZE]);
        let (key, iv) = keys.cipher(&self.sid, remember);
        let plain = key
            .open_in_place(
                iv,
                aead::Aad::from(&self.raw[..HEADER_TAG_SIZE]),
                &mut sealed,
            )
            .map_err(|_| "unable to decrypt session data")?;
        let plain = if self.flags & FLAG_DEFLATE != 0 {
            use std::io::Read;
            let mut out = Vec::new();
            flate2::read::DeflateDecoder::new(&plain[..])
                .take(MAX_DATA_SIZE as u64)
                .read_to_end(&mut out)
                .map_err(|_| "unable to inflate session data")?;
            out
        } else {
            plain.to_vec()
        };
        serde_json::from_slice(&plain).map_err(|_| "unable to json decode session data")
    }

    /// The header again with the idling clock set to `now` (lua-resty-session's `touch`):
    /// same id, same payload.
    pub fn touch(&mut self, keys: &Keys, now: i64) -> String {
        let idling = (now - self.created - self.rolling_offset).clamp(0, MAX_IDLING_OFFSET);
        let mut raw = self.raw[..HEADER_TOUCH_SIZE].to_vec();
        put_le(&mut raw, idling, 3);
        let mac = keys.mac(&self.sid, &raw);
        raw.extend_from_slice(&mac);
        self.raw.copy_from_slice(&raw);
        self.idling_offset = idling;
        B64.encode(self.raw)
    }

    /// The session id as lua-resty-session shows and stores it.
    pub fn id(&self) -> String {
        B64.encode(self.sid)
    }
}

fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// A session sealed: its header (base64url), its payload (base64url) and the header decoded.
pub struct Sealed {
    pub header: String,
    pub payload: String,
    pub decoded: Header,
}

/// Seals `entries` (the session's JSON) as a new cookie with id `sid`, as lua-resty-session's
/// `save` does: `created` kept from the session it renews (the rolling offset is the time
/// since), the idling offset 0.
pub fn seal(
    keys: &Keys,
    sid: [u8; SID_SIZE],
    entries: &Value,
    created: Option<i64>,
    now: i64,
    flags: u16,
    remember: bool,
) -> Option<Sealed> {
    let (created, rolling_offset) = match created {
        Some(c) => (c, now - c),
        None => (now, 0),
    };
    if !(0..=MAX_ROLLING_OFFSET).contains(&rolling_offset) {
        return None;
    }
    let mut flags = flags;
    let mut data = cjson(entries).into_bytes();
    if data.len() > COMPRESSION_THRESHOLD {
        if let Some(d) = deflate(&data).filter(|d| d.len() < data.len()) {
            flags |= FLAG_DEFLATE;
            data = d;
        }
    }
    let data_size = base64_size(data.len());
    if data_size > MAX_DATA_SIZE {
        return None;
    }
    let mut raw = Vec::with_capacity(HEADER_SIZE);
    raw.push(COOKIE_TYPE);
    put_le(&mut raw, i64::from(flags), 2);
    raw.extend_from_slice(&sid);
    put_le(&mut raw, created, 5);
    put_le(&mut raw, rolling_offset, 4);
    put_le(&mut raw, data_size as i64, 3);
    let (key, iv) = keys.cipher(&sid, remember);
    let mut sealed = data;
    let tag = key
        .seal_in_place_separate_tag(iv, aead::Aad::from(&raw[..]), &mut sealed)
        .ok()?;
    raw.extend_from_slice(tag.as_ref());
    put_le(&mut raw, 0, 3);
    let mac = keys.mac(&sid, &raw);
    raw.extend_from_slice(&mac);
    let mut header = [0u8; HEADER_SIZE];
    header.copy_from_slice(&raw);
    Some(Sealed {
        header: B64.encode(header),
        payload: B64.encode(&sealed),
        decoded: Header {
            flags,
            sid,
            created,
            rolling_offset,
            data_size,
            idling_offset: 0,
            raw: header,
        },
    })
}

/// Raw deflate (zlib's window bits -15), as lua-resty-session's `utils.deflate`.
fn deflate(data: &[u8]) -> Option<Vec<u8>> {
    use std::io::Write;
    let mut e = flate2::write::DeflateEncoder::new(
        Vec::with_capacity(data.len() / 2),
        flate2::Compression::new(6),
    );
    e.write_all(data).ok()?;
    e.finish().ok()
}

/// The cookies (`name`, `name2`, ...) a cookie value is split into, as lua-resty-session
/// splits one past 4 KiB: the first holds the header and what fits beside it, each other
/// what fits beside its name. `None`: more than nine cookies would be needed.
pub fn split<'v>(
    name: &str,
    header: &'v str,
    payload: &'v str,
) -> Option<Vec<(String, &'v str, &'v str)>> {
    let n = chunks(name.len(), payload.len())?;
    if n == 1 {
        return Some(vec![(name.to_string(), header, payload)]);
    }
    let first = (MAX_COOKIE_SIZE - HEADER_ENCODED_SIZE - name.len() - 1).min(payload.len());
    let mut out = vec![(name.to_string(), header, &payload[..first])];
    let mut rest = &payload[first..];
    for i in 2..=n {
        let take = (MAX_COOKIE_SIZE - name.len() - 2).min(rest.len());
        out.push((format!("{name}{i}"), "", &rest[..take]));
        rest = &rest[take..];
    }
    Some(out)
}

/// JSON as Lua's cjson writes it (serde's, with `/` escaped): the bytes sealed are Kong's.
fn cjson(v: &Value) -> String {
    serde_json::to_string(v)
        .unwrap_or_default()
        .replace('/', "\\/")
}

/// A new session id: 32 random bytes.
pub fn new_sid() -> [u8; SID_SIZE] {
    let mut b = [0u8; SID_SIZE];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Cookies made by lua-resty-session 4.0.5 itself (`scripts/kong-session-vectors.py`).
    fn vectors() -> Value {
        serde_json::from_str(include_str!("testdata/kong-cookies.json")).unwrap()
    }

    fn value(set_cookie: &Value) -> (String, String) {
        let first = set_cookie
            .as_str()
            .unwrap_or_else(|| set_cookie[0].as_str().unwrap());
        let (name, rest) = first.split_once('=').unwrap();
        (
            name.to_string(),
            rest.split(';').next().unwrap().to_string(),
        )
    }

    /// A case's session cookie whole: the first cookie's value and its chunks' (`session2`...).
    fn whole(case: &Value) -> String {
        let (name, mut v) = value(&case["set_cookie"]);
        if let Some(list) = case["set_cookie"].as_array() {
            for (i, c) in list.iter().enumerate().skip(1) {
                let (n, rest) = value(c);
                if n == format!("{name}{}", i + 1) {
                    v.push_str(&rest);
                }
            }
        }
        v
    }

    fn timeouts(c: &Value) -> Timeouts {
        Timeouts {
            idling: c["idling_timeout"].as_f64().unwrap(),
            rolling: c["rolling_timeout"].as_f64().unwrap(),
            absolute: c["absolute_timeout"].as_f64().unwrap(),
        }
    }

    fn sid_of(case: &Value) -> [u8; SID_SIZE] {
        let b = base64::engine::general_purpose::STANDARD
            .decode(case["sid"].as_str().unwrap())
            .unwrap();
        b.try_into().unwrap()
    }

    fn entries(case: &Value) -> Value {
        let mut data = vec![case["consumer"].clone(), case["credential"].clone()];
        if !case["groups"].is_null() {
            data.push(case["groups"].clone());
        }
        json!([[data, case["config"]["audience"], case["subject"]]])
    }

    #[test]
    fn kong_cookies_open_and_ours_are_kongs_byte_for_byte() {
        let v = vectors();
        for case in v["cases"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            let conf = &case["config"];
            let keys = Keys::new(conf["secret"].as_str().unwrap());
            let storage = conf["storage"] == "kong";
            let now = case["now"].as_i64().unwrap();
            let cookie = whole(case);
            let h = Header::open(&cookie, &keys, storage, false, timeouts(conf), now + 5)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(h.created, now, "{name}");
            let payload = if storage {
                let row = &case["stored"][h.id()]["value"];
                let stored: Value = serde_json::from_str(row.as_str().unwrap()).unwrap();
                stored[0].as_str().unwrap().to_string()
            } else {
                cookie[HEADER_ENCODED_SIZE..].to_string()
            };
            let data = h.decrypt(&payload, &keys, false).unwrap();
            assert_eq!(data, entries(case), "{name}");
            // Kong's cookie split as Kong splits it: names and sizes.
            if conf["remember"] != true {
                let flags = "; Path=/; SameSite=Strict; Secure; HttpOnly";
                let (header, payload) = cookie.split_at(HEADER_ENCODED_SIZE);
                let ours: Vec<String> =
                    split(conf["cookie_name"].as_str().unwrap(), header, payload)
                        .unwrap()
                        .into_iter()
                        .map(|(n, h, p)| format!("{n}={h}{p}"))
                        .collect();
                let kongs: Vec<String> = match &case["set_cookie"] {
                    Value::Array(a) => a.iter().map(|c| c.as_str().unwrap().to_string()).collect(),
                    c => vec![c.as_str().unwrap().to_string()],
                };
                let kongs: Vec<String> = kongs
                    .iter()
                    .map(|c| c.split(';').next().unwrap().to_string())
                    .collect();
                assert_eq!(ours, kongs, "{name}");
                if conf["cookie_same_site"] == "Strict" {
                    assert!(case["set_cookie"].to_string().contains(flags), "{name}");
                }
            }
            // Sealed here with the same id and clock: the very same cookie.
            let flags = if storage { FLAG_STORAGE } else { 0 };
            let s = seal(&keys, sid_of(case), &entries(case), None, now, flags, false).unwrap();
            let ours = if storage {
                s.header.clone()
            } else {
                format!("{}{}", s.header, s.payload)
            };
            if name.starts_with("deflated") {
                // Deflated by zlib-rs, not zlib: other bytes (Kong inflates any raw deflate),
                // the same flags, clock and data.
                assert_eq!(s.decoded.flags, FLAG_DEFLATE, "{name}");
                assert_eq!(s.decoded.raw[..44], h.raw[..44], "{name}");
                let again = Header::open(&ours, &keys, false, false, timeouts(conf), now).unwrap();
                let data = again.decrypt(&s.payload, &keys, false).unwrap();
                assert_eq!(data, entries(case), "{name}");
                continue;
            }
            assert_eq!(ours, cookie, "{name}");
            if storage {
                let stored = json!([s.payload]).to_string();
                assert_eq!(case["stored"][h.id()]["value"], stored.as_str(), "{name}");
            }
        }
        let v = vectors();
        let cases = v["cases"].as_array().unwrap();
        let deflated = cases
            .iter()
            .filter(|c| c["name"].as_str().unwrap().starts_with("deflated"));
        assert_eq!(deflated.count(), 2, "the vectors have the deflated cases");
    }

    #[test]
    fn timeouts_touch_and_roll_as_lua_resty_session() {
        let v = vectors();
        let case = &v["cases"][0];
        let conf = &case["config"];
        let keys = Keys::new(conf["secret"].as_str().unwrap());
        let (_, cookie) = value(&case["set_cookie"]);
        let t = timeouts(conf);
        // Touched two minutes on: the library's header, byte for byte.
        let touched = &v["touched"];
        let now = touched["now"].as_i64().unwrap();
        let mut h = Header::open(&cookie, &keys, false, false, t, now).unwrap();
        let header = h.touch(&keys, now);
        let (_, expected) = value(&touched["set_cookie"]);
        assert_eq!(
            format!("{header}{}", &cookie[HEADER_ENCODED_SIZE..]),
            expected
        );
        // Its errors where the library refuses.
        for (k, remember) in [("idle", false), ("other_secret", false)] {
            let case_now = v[k]["now"].as_i64().unwrap();
            let keys = if k == "other_secret" {
                Keys::new("another")
            } else {
                Keys::new(conf["secret"].as_str().unwrap())
            };
            let e = Header::open(&cookie, &keys, false, remember, t, case_now).unwrap_err();
            assert_eq!(e, v[k]["error"].as_str().unwrap(), "{k}");
        }
        let no_idle = &v["cases"][3];
        let (_, cookie) = value(&no_idle["set_cookie"]);
        let t = timeouts(&no_idle["config"]);
        let abs = &v["absolute"];
        let e = Header::open(
            &cookie,
            &keys,
            false,
            false,
            t,
            abs["now"].as_i64().unwrap(),
        )
        .unwrap_err();
        assert_eq!(e, abs["error"].as_str().unwrap());
        // Rolled: a new id, the creation time kept, the library's cookie.
        let rolled = &v["rolled"];
        let now = rolled["now"].as_i64().unwrap();
        let h = Header::open(&cookie, &keys, false, false, t, now).unwrap();
        let sid: [u8; 32] = core::array::from_fn(|i| 3 + i as u8);
        let s = seal(
            &keys,
            sid,
            &entries(no_idle),
            Some(h.created),
            now,
            0,
            false,
        )
        .unwrap();
        let (_, expected) = value(&rolled["set_cookie"]);
        assert_eq!(format!("{}{}", s.header, s.payload), expected);
    }

    #[test]
    fn remember_cookies_are_kongs_too() {
        let v = vectors();
        let case = &v["cases"][4];
        let conf = &case["config"];
        let keys = Keys::new(conf["secret"].as_str().unwrap());
        let now = case["now"].as_i64().unwrap();
        let remember = case["set_cookie"][1].as_str().unwrap();
        let (name, cookie) = value(&json!(remember));
        assert_eq!(name, "remember");
        let t = Timeouts {
            idling: 0.0,
            rolling: conf["remember_rolling_timeout"].as_f64().unwrap(),
            absolute: conf["remember_absolute_timeout"].as_f64().unwrap(),
        };
        let h = Header::open(&cookie, &keys, false, true, t, now + 100_000).unwrap();
        let data = h
            .decrypt(&cookie[HEADER_ENCODED_SIZE..], &keys, true)
            .unwrap();
        assert_eq!(data, entries(case));
        let sid: [u8; 32] = core::array::from_fn(|i| 8 + i as u8);
        let s = seal(&keys, sid, &entries(case), None, now, 0, true).unwrap();
        assert_eq!(format!("{}{}", s.header, s.payload), cookie);
    }

    #[test]
    fn broken_cookies_are_refused_not_panicked_on() {
        let keys = Keys::new("s");
        let t = Timeouts {
            idling: 900.0,
            rolling: 3600.0,
            absolute: 86400.0,
        };
        for c in [
            "",
            "short",
            &"A".repeat(110),
            &"é".repeat(60),
            &"_".repeat(200),
        ] {
            assert!(Header::open(c, &keys, false, false, t, 0).is_err(), "{c}");
        }
        let s = seal(
            &keys,
            [7; 32],
            &json!([[["c", "k"], "default"]]),
            None,
            1000,
            0,
            false,
        )
        .unwrap();
        let h = Header::open(&s.header, &keys, false, false, t, 1001).unwrap();
        assert!(h.decrypt("", &keys, false).is_err());
        let mut bad = s.payload.clone().into_bytes();
        bad[0] = if bad[0] == b'A' { b'B' } else { b'A' };
        assert!(h
            .decrypt(std::str::from_utf8(&bad).unwrap(), &keys, false)
            .is_err());
        assert_eq!(chunks(7, 10), Some(1));
        assert_eq!(chunks(7, 5000), Some(2));
        assert_eq!(chunks(7, 40_000), None);
    }
}
