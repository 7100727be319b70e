//! hmac-auth's entity (Kong's `kong/plugins/hmac-auth/daos.lua`): `hmacauth_credentials`, at
//! `/hmac-auths` and `/consumers/{c}/hmac-auth`.

use std::sync::Arc;

use turnpike_config::entity::{EntitySpec, FieldKind, PluginEntity, CONSUMER};

use crate::Identity;

pub const TABLE: &str = "hmacauth_credentials";

pub static HMACAUTH_CREDENTIALS: PluginEntity = PluginEntity {
    spec: EntitySpec {
        table: TABLE,
        path: "hmac-auths",
        nested_path: "hmac-auth",
        endpoint_key: Some("username"),
        unique: &["username"],
        cache_key: &[],
        foreign: CONSUMER,
    },
    fields: &[
        ("username", FieldKind::Required),
        ("secret", FieldKind::Auto),
    ],
    sample: r#"{"username": "u"}"#,
    check: None,
};

/// A credential as the plugin checks signatures with it.
pub struct Credential {
    pub who: Arc<Identity>,
    pub secret: Box<[u8]>,
}

impl Credential {
    pub fn from_fields(
        fields: &impl turnpike_config::declarative::FieldMap,
        who: impl FnOnce() -> Identity,
    ) -> Option<Arc<Credential>> {
        let secret = fields.field_str("secret")?;
        Some(Arc::new(Credential {
            who: Arc::new(who()),
            secret: secret.as_bytes().into(),
        }))
    }
}

/// hmacauth_credentials by username (FxHash: only the config inserts usernames).
pub type CredentialIndex = rustc_hash::FxHashMap<Box<str>, Arc<Credential>>;

/// Every hmac-auth credential of the snapshot by username: built once per snapshot
/// (`BuildContext::shared`).
pub fn index(ctx: &crate::BuildContext<'_>) -> CredentialIndex {
    let mut m = CredentialIndex::default();
    for cred in ctx.config.credentials.iter().filter(|c| c.table == TABLE) {
        let (Some(username), Some(who)) = (
            cred.fields.get("username").and_then(|v| v.as_str()),
            ctx.consumer(&cred.consumer.id),
        ) else {
            continue;
        };
        let c = Credential::from_fields(&cred.fields, || {
            Identity::new(
                who.consumer_id(),
                who.username(),
                who.custom_id(),
                Some(&cred.id),
            )
            .identified_by(username)
        });
        if let Some(c) = c {
            m.insert(username.into(), c);
        }
    }
    m
}
