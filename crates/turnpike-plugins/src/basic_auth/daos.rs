//! basic-auth's entity (Kong's `kong/plugins/basic-auth/daos.lua`): `basicauth_credentials`,
//! a consumer's username and (hashed) password, at `/basic-auths` and
//! `/consumers/{c}/basic-auth`.

use std::sync::Arc;

use turnpike_config::entity::{EntitySpec, FieldKind, PluginEntity, CONSUMER};

pub const TABLE: &str = "basicauth_credentials";

pub static BASICAUTH_CREDENTIALS: PluginEntity = PluginEntity {
    spec: EntitySpec {
        table: TABLE,
        path: "basic-auths",
        nested_path: "basic-auth",
        endpoint_key: Some("username"),
        unique: &["username"],
        cache_key: &[],
        foreign: CONSUMER,
    },
    fields: &[
        ("username", FieldKind::Required),
        ("password", FieldKind::Required),
    ],
    sample: r#"{"username": "u", "password": "p"}"#,
    check: None,
};

/// Every basic-auth credential of the snapshot by username, with the consumer it
/// authenticates: built once per snapshot (`BuildContext::shared`).
pub fn index(ctx: &crate::BuildContext<'_>) -> super::CredentialIndex {
    let mut m = super::CredentialIndex::default();
    for cred in ctx.config.credentials.iter().filter(|c| c.table == TABLE) {
        let (Some(username), Some(stored), Some(who)) = (
            cred.fields.get("username").and_then(|v| v.as_str()),
            cred.fields.get("password").and_then(|v| v.as_str()),
            ctx.consumer(&cred.consumer.id),
        ) else {
            continue;
        };
        m.insert(
            username.into(),
            Arc::new(super::Credential {
                who: Arc::new(
                    crate::Identity::new(
                        who.consumer_id(),
                        who.username(),
                        who.custom_id(),
                        Some(&cred.id),
                    )
                    .identified_by(username),
                ),
                secret: super::password::Secret::from_stored(stored, &cred.consumer.id),
                stored: stored.into(),
            }),
        );
    }
    m
}
