//! Who a request is: the consumer a credential names (or the anonymous one), and the
//! `X-Consumer-*` / `X-Credential-Identifier` headers that tell the upstream.

use http::{HeaderName, HeaderValue};

/// An authenticated (or anonymous) consumer, as the upstream is told about it.
#[derive(Debug)]
pub struct Identity {
    pub consumer_id: String,
    pub username: Option<String>,
    pub custom_id: Option<String>,
    /// The credential that authenticated the request; `None` for the anonymous consumer.
    pub credential_id: Option<String>,
    /// The upstream headers for this identity, built once with the snapshot: (name, value or
    /// `None` to remove what the client sent).
    headers: [(&'static HeaderName, Option<HeaderValue>); 5],
}

impl Identity {
    pub fn new(
        consumer_id: String,
        username: Option<String>,
        custom_id: Option<String>,
        credential_id: Option<String>,
    ) -> Identity {
        let v = |s: Option<&str>| s.and_then(|s| HeaderValue::from_str(s).ok());
        let headers = [
            (&X_CONSUMER_ID, v(Some(&consumer_id))),
            (&X_CONSUMER_CUSTOM_ID, v(custom_id.as_deref())),
            (&X_CONSUMER_USERNAME, v(username.as_deref())),
            (&X_CREDENTIAL_IDENTIFIER, v(credential_id.as_deref())),
            (
                &X_ANONYMOUS_CONSUMER,
                credential_id
                    .is_none()
                    .then(|| HeaderValue::from_static("true")),
            ),
        ];
        Identity {
            consumer_id,
            username,
            custom_id,
            credential_id,
            headers,
        }
    }
}

impl Identity {
    /// The same identity with `X-Credential-Identifier` set to `identifier`: Kong tells the
    /// upstream a credential's id for key-auth, but its username (basic-auth, hmac-auth) or
    /// key (jwt) for others, while logs and `limit_by = credential` use the id.
    /// A credential that maps to no consumer (ldap-auth): the upstream gets
    /// `X-Credential-Identifier` and no `X-Consumer-*` (what the client sent under those names
    /// is removed).
    pub fn credential_only(identifier: &str) -> Identity {
        let mut who = Identity::new(String::new(), None, None, Some(identifier.to_string()));
        who.headers[0].1 = None;
        who
    }

    pub fn identified_by(mut self, identifier: &str) -> Identity {
        if self.credential_id.is_some() {
            self.headers[3].1 = HeaderValue::from_str(identifier).ok();
        }
        self
    }
}

pub static X_CONSUMER_ID: HeaderName = HeaderName::from_static("x-consumer-id");
pub static X_CONSUMER_CUSTOM_ID: HeaderName = HeaderName::from_static("x-consumer-custom-id");
pub static X_CONSUMER_USERNAME: HeaderName = HeaderName::from_static("x-consumer-username");
pub static X_CREDENTIAL_IDENTIFIER: HeaderName = HeaderName::from_static("x-credential-identifier");
pub static X_ANONYMOUS_CONSUMER: HeaderName = HeaderName::from_static("x-anonymous-consumer");

impl Identity {
    /// The upstream headers for this identity: (name, value, or `None` to drop what the
    /// client sent). The proxy writes them into the upstream request head, replacing any the
    /// client sent under those names.
    pub fn upstream_headers(&self) -> &[(&'static HeaderName, Option<HeaderValue>)] {
        &self.headers
    }

    /// `Some(value or None)` when `name` is one of the identity's headers.
    pub(crate) fn header(&self, name: &HeaderName) -> Option<Option<&HeaderValue>> {
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_ref())
    }
}
