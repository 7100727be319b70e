//! jwt's entity (Kong's `kong/plugins/jwt/daos.lua`): `jwt_secrets`, at `/jwts` and
//! `/consumers/{c}/jwt`. A secret's verification key is parsed when the credential is loaded
//! (with the snapshot, or from the store on first use), never per request.

use std::sync::Arc;

use serde_json::{Map, Value};
use turnpike_config::entity::{EntitySpec, FieldKind, PluginEntity, CONSUMER};

use super::token::{self, Alg, Key};
use crate::Identity;

pub const TABLE: &str = "jwt_secrets";

pub static JWT_SECRETS: PluginEntity = PluginEntity {
    spec: EntitySpec {
        table: TABLE,
        path: "jwts",
        nested_path: "jwt",
        endpoint_key: Some("key"),
        unique: &["key"],
        cache_key: &[],
        foreign: CONSUMER,
    },
    fields: &[
        ("key", FieldKind::Auto),
        ("secret", FieldKind::Auto),
        ("algorithm", FieldKind::Optional),
        ("rsa_public_key", FieldKind::Optional),
    ],
    sample: "{}",
    check: Some(&check),
};

/// Kong's `algorithm` (default HS256, one of the supported ones) and its entity check: an
/// asymmetric algorithm needs an `rsa_public_key` that parses as a key for it.
fn check(fields: &mut Map<String, Value>) -> Vec<(String, String)> {
    let alg = match fields.get("algorithm") {
        None | Some(Value::Null) => {
            fields.insert("algorithm".into(), Value::from("HS256"));
            Alg::HS256
        }
        Some(v) => match v.as_str().and_then(Alg::parse) {
            Some(a) => a,
            None => {
                return vec![(
                    "algorithm".into(),
                    format!("expected one of: {}", token::ALG_NAMES.join(", ")),
                )]
            }
        },
    };
    if alg.is_hmac() {
        return Vec::new();
    }
    let failed = || {
        (
            "@entity".to_string(),
            "failed conditional validation given value of field 'algorithm'".to_string(),
        )
    };
    match fields.get("rsa_public_key").and_then(|v| v.as_str()) {
        None => vec![
            failed(),
            ("rsa_public_key".into(), "required field missing".into()),
        ],
        Some(pem) => match Key::public(alg, pem) {
            Ok(_) => Vec::new(),
            Err(e) => vec![failed(), ("rsa_public_key".into(), e)],
        },
    }
}

/// A jwt secret as the plugin checks tokens against it.
pub struct Secret {
    pub who: Arc<Identity>,
    pub alg: Alg,
    /// The key for the secret as written; `None` where it is not a key (Kong: "Invalid
    /// key/secret").
    pub plain: Option<Key>,
    /// An HMAC secret base64-decoded, for routes with `secret_is_base64` (their key is
    /// prepared per request: rare, and it keeps a secret's memory to one key).
    pub decoded: Option<Box<[u8]>>,
}

impl Secret {
    /// From a stored row's fields; `None` if they do not make a secret (a row the checks above
    /// would refuse).
    pub fn from_fields(
        fields: &impl turnpike_config::declarative::FieldMap,
        who: Arc<Identity>,
    ) -> Option<Secret> {
        let alg = match fields.field_str("algorithm") {
            Some(a) => Alg::parse(a)?,
            None => Alg::HS256,
        };
        let (plain, decoded) = if alg.is_hmac() {
            let secret = fields.field_str("secret").unwrap_or("");
            (
                Some(Key::hmac(alg, secret.as_bytes())),
                token::b64_secret(secret).map(Vec::into_boxed_slice),
            )
        } else {
            let pem = fields.field_str("rsa_public_key")?;
            // Kong base64-decodes the PEM text too under `secret_is_base64`, which never
            // yields a key.
            (Key::public(alg, pem).ok(), None)
        };
        Some(Secret {
            who,
            alg,
            plain,
            decoded,
        })
    }
}

/// jwt secrets by key (FxHash: only the config inserts keys).
pub type SecretIndex = rustc_hash::FxHashMap<Box<str>, Arc<Secret>>;

/// Every jwt secret of the snapshot by key, keys parsed: built once per snapshot
/// (`BuildContext::shared`).
pub fn index(ctx: &crate::BuildContext<'_>) -> SecretIndex {
    let mut m = SecretIndex::default();
    for cred in ctx.config.credentials.iter().filter(|c| c.table == TABLE) {
        let (Some(key), Some(who)) = (
            cred.fields.get("key").and_then(|v| v.as_str()),
            ctx.consumer(&cred.consumer.id),
        ) else {
            continue;
        };
        let who = Arc::new(
            Identity::new(
                who.consumer_id(),
                who.username(),
                who.custom_id(),
                Some(&cred.id),
            )
            .identified_by(key),
        );
        if let Some(s) = Secret::from_fields(&cred.fields, who) {
            m.insert(key.into(), Arc::new(s));
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algorithm_defaults_and_is_checked() {
        let mut f = Map::new();
        assert!(check(&mut f).is_empty());
        assert_eq!(f["algorithm"], "HS256");
        let mut f: Map<String, Value> = serde_json::from_str(r#"{"algorithm": "none"}"#).unwrap();
        assert_eq!(check(&mut f)[0].0, "algorithm");
        let mut f: Map<String, Value> = serde_json::from_str(r#"{"algorithm": "RS256"}"#).unwrap();
        let e = check(&mut f);
        assert_eq!(
            e[1],
            ("rsa_public_key".into(), "required field missing".into())
        );
        let mut f: Map<String, Value> =
            serde_json::from_str(r#"{"algorithm": "ES256", "rsa_public_key": "nope"}"#).unwrap();
        assert_eq!(
            check(&mut f)[1],
            ("rsa_public_key".into(), "invalid key".into())
        );
    }
}
