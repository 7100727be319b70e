//! Who a request is: the consumer a credential names (or the anonymous one), and the
//! `X-Consumer-*` / `X-Credential-Identifier` headers that tell the upstream.

use bytes::Bytes;
use http::{HeaderName, HeaderValue};

/// An authenticated (or anonymous) consumer, as the upstream is told about it.
///
/// A snapshot holds one per credential (100k consumers with keys: 100k of these), so its
/// strings live back to back in one buffer: the consumer's id, username and custom id, the
/// credential's id and the identifier the upstream is told. The upstream headers are slices of
/// that buffer (a reference count, no copy); which parts are valid header values is decided
/// once, here.
#[derive(Debug)]
pub struct Identity {
    text: Bytes,
    /// Where each part ends in `text`; a part starts where the one before it ends (an absent
    /// part is empty, with its bit clear in `present`). Ends alone, not `[start, end)` pairs,
    /// keep an identity in an 80-byte allocation rather than 96 (1.6 MB at 100k keys).
    ends: [u32; PARTS],
    /// Bit `i`: part `i` is present; bit [`SHARED`]: the identifier is the credential's id,
    /// whose bytes it shares.
    present: u8,
    /// Bit `i`: part `i` is a valid header value.
    valid: u8,
}

const PARTS: usize = 5;
const CONSUMER_ID: usize = 0;
const USERNAME: usize = 1;
const CUSTOM_ID: usize = 2;
const CREDENTIAL_ID: usize = 3;
/// The value of `X-Credential-Identifier` (the credential's id unless a plugin says another).
const IDENTIFIER: usize = 4;
const SHARED: u8 = 1 << 7;

/// The upstream headers in order, with the part each carries (`None`: `X-Anonymous-Consumer`).
static HEADERS: [(&HeaderName, Option<usize>); PARTS] = [
    (&X_CONSUMER_ID, Some(CONSUMER_ID)),
    (&X_CONSUMER_CUSTOM_ID, Some(CUSTOM_ID)),
    (&X_CONSUMER_USERNAME, Some(USERNAME)),
    (&X_CREDENTIAL_IDENTIFIER, Some(IDENTIFIER)),
    (&X_ANONYMOUS_CONSUMER, None),
];

impl Identity {
    pub fn new(
        consumer_id: &str,
        username: Option<&str>,
        custom_id: Option<&str>,
        credential_id: Option<&str>,
    ) -> Identity {
        Identity::from_parts([
            Some(consumer_id),
            username,
            custom_id,
            credential_id,
            credential_id,
        ])
    }

    fn from_parts(parts: [Option<&str>; PARTS]) -> Identity {
        // Exactly the bytes kept (the identifier shared with the credential's id is not
        // counted twice): a vector with spare room would keep it for the identity's life, and
        // `Bytes` would box a header for it (60 bytes a key-auth key, 6 MB at 100k keys).
        let shared = parts[IDENTIFIER].is_some() && parts[IDENTIFIER] == parts[CREDENTIAL_ID];
        let len: usize = parts.iter().flatten().map(|s| s.len()).sum::<usize>()
            - if shared {
                parts[IDENTIFIER].map_or(0, str::len)
            } else {
                0
            };
        let mut text = Vec::with_capacity(len);
        let mut ends = [0u32; PARTS];
        let (mut present, mut valid) = (0u8, 0u8);
        for (i, part) in parts.iter().enumerate() {
            if let Some(s) = part {
                present |= 1 << i;
                if HeaderValue::from_str(s).is_ok() {
                    valid |= 1 << i;
                }
                // The identifier is most often the credential's id: share its bytes.
                if i == IDENTIFIER && shared {
                    present |= SHARED;
                } else {
                    text.extend_from_slice(s.as_bytes());
                }
            }
            ends[i] = text.len() as u32;
        }
        debug_assert_eq!(text.len(), text.capacity(), "no spare room kept");
        Identity {
            text: Bytes::from(text),
            ends,
            present,
            valid,
        }
    }

    /// Part `i`'s `[start, end)` in `text`.
    fn range(&self, i: usize) -> (u32, u32) {
        if i == IDENTIFIER && self.present & SHARED != 0 {
            return self.range(CREDENTIAL_ID);
        }
        (if i == 0 { 0 } else { self.ends[i - 1] }, self.ends[i])
    }

    fn part(&self, i: usize) -> Option<&str> {
        if self.present & (1 << i) == 0 {
            return None;
        }
        let (a, b) = self.range(i);
        // SAFETY: `text` is the concatenation of `&str`s and every range spans exactly one
        // of them, so each slice is whole UTF-8.
        Some(unsafe { std::str::from_utf8_unchecked(&self.text[a as usize..b as usize]) })
    }

    /// The consumer's id; empty for a credential that maps to no consumer (ldap-auth).
    pub fn consumer_id(&self) -> &str {
        self.part(CONSUMER_ID).unwrap_or("")
    }

    pub fn username(&self) -> Option<&str> {
        self.part(USERNAME)
    }

    pub fn custom_id(&self) -> Option<&str> {
        self.part(CUSTOM_ID)
    }

    /// The credential that authenticated the request; `None` for the anonymous consumer.
    pub fn credential_id(&self) -> Option<&str> {
        self.part(CREDENTIAL_ID)
    }

    /// The same identity with `X-Credential-Identifier` set to `identifier`: Kong tells the
    /// upstream a credential's id for key-auth, but its username (basic-auth, hmac-auth) or
    /// key (jwt) for others, while logs and `limit_by = credential` use the id.
    pub fn identified_by(self, identifier: &str) -> Identity {
        if self.credential_id().is_none() {
            return self;
        }
        Identity::from_parts([
            self.part(CONSUMER_ID),
            self.username(),
            self.custom_id(),
            self.credential_id(),
            Some(identifier),
        ])
    }

    /// A credential that maps to no consumer (ldap-auth): the upstream gets
    /// `X-Credential-Identifier` and no `X-Consumer-*` (what the client sent under those names
    /// is removed).
    pub fn credential_only(identifier: &str) -> Identity {
        Identity::from_parts([None, None, None, Some(identifier), Some(identifier)])
    }
}

pub static X_CONSUMER_ID: HeaderName = HeaderName::from_static("x-consumer-id");
pub static X_CONSUMER_CUSTOM_ID: HeaderName = HeaderName::from_static("x-consumer-custom-id");
pub static X_CONSUMER_USERNAME: HeaderName = HeaderName::from_static("x-consumer-username");
pub static X_AUTHENTICATED_GROUPS: HeaderName = HeaderName::from_static("x-authenticated-groups");

/// The groups the request was authenticated with (Kong's `ngx.ctx.authenticated_groups`), as
/// the session plugin restores them from its cookie; acl checks them in place of the
/// consumer's own groups.
#[derive(Clone, Debug)]
pub struct AuthenticatedGroups(pub Vec<String>);

/// The request's authenticated groups, where Kong's acl looks for them: Lua code's
/// `kong.ctx.shared.authenticated_groups`, then `ngx.ctx.authenticated_groups` (what a
/// session restored, or what Lua code set).
pub fn authenticated_groups(ctx: &crate::PluginCtx) -> Option<Vec<String>> {
    if let Some(shared) = ctx
        .get::<crate::lua::LuaCtx>()
        .and_then(|l| l.shared_authenticated_groups())
    {
        return Some(shared);
    }
    ngx_authenticated_groups(ctx)
}

/// `ngx.ctx.authenticated_groups` alone (what the session plugin keeps in a new session):
/// what a session restored, or what Lua code set.
pub fn ngx_authenticated_groups(ctx: &crate::PluginCtx) -> Option<Vec<String>> {
    if let Some(g) = ctx.get::<AuthenticatedGroups>() {
        return Some(g.0.clone());
    }
    let lua = ctx.get::<crate::lua::LuaCtx>()?;
    lua.ngx_authenticated_groups()
}

pub static X_CREDENTIAL_IDENTIFIER: HeaderName = HeaderName::from_static("x-credential-identifier");
pub static X_ANONYMOUS_CONSUMER: HeaderName = HeaderName::from_static("x-anonymous-consumer");

impl Identity {
    /// The value of one of the identity's headers: `None` to drop what the client sent.
    fn value(&self, carries: Option<usize>) -> Option<HeaderValue> {
        let Some(i) = carries else {
            return self
                .credential_id()
                .is_none()
                .then(|| HeaderValue::from_static("true"));
        };
        if self.present & self.valid & (1 << i) == 0 {
            return None;
        }
        let (a, b) = self.range(i);
        // SAFETY: part `i` passed `HeaderValue::from_str` when the identity was built, and
        // `text` never changes.
        Some(unsafe {
            HeaderValue::from_maybe_shared_unchecked(self.text.slice(a as usize..b as usize))
        })
    }

    /// The upstream headers for this identity: (name, value, or `None` to drop what the
    /// client sent). The proxy writes them into the upstream request head, replacing any the
    /// client sent under those names.
    pub fn upstream_headers(
        &self,
    ) -> impl Iterator<Item = (&'static HeaderName, Option<HeaderValue>)> + '_ {
        HEADERS
            .iter()
            .map(|&(name, carries)| (name, self.value(carries)))
    }

    /// Whether `name` is one of the identity's headers.
    pub fn is_identity_header(name: &HeaderName) -> bool {
        HEADERS.iter().any(|(n, _)| *n == name)
    }

    /// `Some(value or None)` when `name` is one of the identity's headers.
    pub(crate) fn header(&self, name: &HeaderName) -> Option<Option<HeaderValue>> {
        HEADERS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, carries)| self.value(carries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(who: &Identity) -> Vec<(&'static str, Option<String>)> {
        who.upstream_headers()
            .map(|(n, v)| (n.as_str(), v.map(|v| v.to_str().unwrap().to_string())))
            .collect()
    }

    #[test]
    fn parts_and_headers_read_back() {
        let who = Identity::new("c-1", Some("alice"), None, Some("k-1"));
        assert_eq!(who.consumer_id(), "c-1");
        assert_eq!(who.username(), Some("alice"));
        assert_eq!(who.custom_id(), None);
        assert_eq!(who.credential_id(), Some("k-1"));
        assert_eq!(
            headers(&who),
            [
                ("x-consumer-id", Some("c-1".into())),
                ("x-consumer-custom-id", None),
                ("x-consumer-username", Some("alice".into())),
                ("x-credential-identifier", Some("k-1".into())),
                ("x-anonymous-consumer", None),
            ]
        );
        // The identifier shares the credential id's bytes.
        assert_eq!(who.text.len(), "c-1alicek-1".len());
        let who = who.identified_by("alice-basic");
        assert_eq!(who.credential_id(), Some("k-1"));
        assert_eq!(
            who.header(&X_CREDENTIAL_IDENTIFIER),
            Some(Some(HeaderValue::from_static("alice-basic")))
        );
    }

    #[test]
    fn anonymous_and_credential_only() {
        let anon = Identity::new("c-2", None, Some("ext"), None);
        assert_eq!(
            anon.header(&X_ANONYMOUS_CONSUMER),
            Some(Some(HeaderValue::from_static("true")))
        );
        assert_eq!(anon.header(&X_CREDENTIAL_IDENTIFIER), Some(None));
        assert_eq!(anon.identified_by("x").credential_id(), None);
        let ldap = Identity::credential_only("bob");
        assert_eq!(ldap.consumer_id(), "");
        assert_eq!(ldap.header(&X_CONSUMER_ID), Some(None));
        assert_eq!(
            ldap.header(&X_CREDENTIAL_IDENTIFIER),
            Some(Some(HeaderValue::from_static("bob")))
        );
        assert_eq!(ldap.header(&X_ANONYMOUS_CONSUMER), Some(None));
    }

    #[test]
    fn a_value_that_is_no_header_value_is_dropped() {
        let who = Identity::new("c-3", Some("bad\nname"), None, Some("k"));
        assert_eq!(who.username(), Some("bad\nname"));
        assert_eq!(who.header(&X_CONSUMER_USERNAME), Some(None));
        assert_eq!(who.header(&X_CONSUMER_ID).unwrap().unwrap(), "c-3");
    }

    #[test]
    fn every_mix_of_parts_reads_back() {
        // Each part present or not, the identifier shared with the credential id or its own.
        for mask in 0..32u8 {
            let on = |b: usize, v: &'static str| (mask & (1 << b) != 0).then_some(v);
            let parts = [
                on(0, "consumer"),
                on(1, "user"),
                on(2, "custom"),
                on(3, "cred"),
                on(4, "ident"),
            ];
            let who = Identity::from_parts(parts);
            for (i, p) in parts.iter().enumerate() {
                assert_eq!(who.part(i), *p, "mask {mask:05b}, part {i}");
            }
            let shared = Identity::from_parts([parts[0], parts[1], parts[2], parts[3], parts[3]]);
            assert_eq!(shared.part(IDENTIFIER), parts[3], "mask {mask:05b}");
            assert_eq!(shared.part(CUSTOM_ID), parts[2], "mask {mask:05b}");
        }
    }

    #[test]
    fn an_identity_fits_an_80_byte_allocation() {
        // An `Arc<Identity>` per key: the reference counts' 16 bytes and the identity.
        assert!(
            16 + size_of::<Identity>() <= 80,
            "{}",
            size_of::<Identity>()
        );
    }
}
