//! Secret references, Kong's `{vault://<vault>/<resource>[/<key>]}`: a plugin config value in a
//! field Kong marks `referenceable` (see `schema::resolve_references`) or a certificate's PEM
//! written as a reference is resolved when the data plane is built, so the stored config and
//! its export keep the reference, never the secret. A reference in any other field is a plain
//! string, as in Kong.
//!
//! `<vault>` is a `vaults` entity's `prefix` or a vault's own name; this build carries Kong
//! OSS's `env` vault: `<resource>` names an environment variable (upper-cased, `-` read as
//! `_`, after the vault entity's `config.prefix`), and `<key>` picks a field of the variable
//! when it holds a JSON object. A reference that cannot be resolved is an error for the entity
//! holding it (the data plane leaves it out or fails it closed), never an empty secret.

use serde_json::Value;

use super::records::Record;

/// Where secrets come from: the process environment (a test passes its own).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

pub use crate::schema::{has_reference, is_reference};

/// Resolves one reference against the config's vaults.
pub fn resolve(reference: &str, vaults: &[Record], env: Env) -> Result<String, String> {
    let inner = reference
        .strip_prefix("{vault://")
        .and_then(|r| r.strip_suffix('}'))
        .ok_or_else(|| format!("'{reference}' is not a vault reference"))?;
    let mut parts = inner.splitn(3, '/');
    let vault = parts.next().unwrap_or_default();
    let resource = parts
        .next()
        .filter(|r| !r.is_empty())
        .ok_or_else(|| format!("vault reference '{reference}' names no secret"))?;
    let key = parts.next().filter(|k| !k.is_empty());
    // A vaults entity by prefix, or the env vault by its own name.
    let entity = vaults.iter().find(|v| {
        v.table() == "vaults" && v.fields.get("prefix").and_then(|p| p.as_str()) == Some(vault)
    });
    let (strategy, var_prefix, base64) = match entity {
        Some(v) => {
            let config = v.fields.get("config");
            (
                v.fields
                    .get("name")
                    .and_then(|n| n.as_str())
                    .unwrap_or_default()
                    .to_string(),
                config
                    .and_then(|c| c.get("prefix"))
                    .and_then(|p| p.as_str())
                    .unwrap_or_default()
                    .to_string(),
                config
                    .and_then(|c| c.get("base64_decode"))
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
            )
        }
        None => (vault.to_string(), String::new(), false),
    };
    if strategy != "env" {
        return Err(format!(
            "vault '{vault}' in '{reference}' is not configured (this build has the env vault)"
        ));
    }
    let name = format!("{var_prefix}{resource}")
        .to_ascii_uppercase()
        .replace('-', "_");
    let value = env(&name).ok_or_else(|| {
        format!("could not resolve '{reference}': environment variable {name} is not set")
    })?;
    // `base64_decode`: the variable holds the secret base64-encoded (Kong decodes it before
    // picking a key from it).
    let value = if base64 {
        use base64::Engine;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(value.trim())
            .map_err(|_| format!("could not resolve '{reference}': {name} is not valid base64"))?;
        String::from_utf8(bytes).map_err(|_| {
            format!("could not resolve '{reference}': {name} does not decode to text")
        })?
    } else {
        value
    };
    match key {
        None => Ok(value),
        Some(k) => match serde_json::from_str::<Value>(&value) {
            Ok(Value::Object(o)) => match o.get(k) {
                Some(Value::String(s)) => Ok(s.clone()),
                Some(other) => Ok(other.to_string()),
                None => Err(format!(
                    "could not resolve '{reference}': no key '{k}' in {name}"
                )),
            },
            _ => Err(format!(
                "could not resolve '{reference}': {name} does not hold a JSON object"
            )),
        },
    }
}

/// A value as the data plane uses it: resolved when it is a reference, borrowed otherwise.
pub fn resolved<'a>(
    s: &'a str,
    vaults: &[Record],
    env: Env,
) -> Result<std::borrow::Cow<'a, str>, String> {
    if is_reference(s) {
        resolve(s, vaults, env).map(std::borrow::Cow::Owned)
    } else {
        Ok(std::borrow::Cow::Borrowed(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::declarative::records;
    use serde_json::json;

    fn env(name: &str) -> Option<String> {
        match name {
            "REDIS_PASSWORD" => Some("s3cret".into()),
            "TP_DB_CREDS" => Some(r#"{"user": "u", "password": "p"}"#.into()),
            // base64 of {"token": "t0k"}, and not base64 at all.
            "B64_API" => Some("eyJ0b2tlbiI6ICJ0MGsifQ==".into()),
            "B64_BAD" => Some("not base64!".into()),
            _ => None,
        }
    }

    #[test]
    fn env_references_resolve_or_fail_clearly() {
        let (v, _, e) = records::read(
            records::by_table("vaults").unwrap(),
            json!({"prefix": "my-env", "name": "env", "config": {"prefix": "TP_"}})
                .as_object()
                .unwrap(),
            "00000000-0000-4000-8000-000000000001",
            0,
        );
        assert!(e.is_empty(), "{e:?}");
        let vaults = vec![v];
        assert_eq!(
            resolve("{vault://env/redis-password}", &vaults, &env).unwrap(),
            "s3cret"
        );
        assert_eq!(
            resolve("{vault://my-env/db-creds/password}", &vaults, &env).unwrap(),
            "p"
        );
        assert!(resolve("{vault://env/missing}", &vaults, &env)
            .unwrap_err()
            .contains("MISSING is not set"));
        assert!(resolve("{vault://aws/x}", &vaults, &env).is_err());
        // A PEM (or any value) that is not a reference is used as written, not copied.
        let pem = "-----BEGIN CERTIFICATE-----";
        assert!(matches!(
            resolved(pem, &vaults, &env).unwrap(),
            std::borrow::Cow::Borrowed(p) if p == pem
        ));
        assert_eq!(
            resolved("{vault://env/redis-password}", &vaults, &env).unwrap(),
            "s3cret"
        );
        let mut config = json!({"redis": {"password": "{vault://env/redis-password}"}, "n": 1});
        assert!(has_reference(&config));
        use crate::schema::{Field, Type};
        const REDIS: &[Field] = &[
            Field::new("password", Type::String).referenceable(),
            Field::new("user", Type::String),
        ];
        let fields = [Field::new("redis", Type::Record(REDIS))];
        config["redis"]["user"] = json!("{vault://env/redis-password}");
        let resolve = |r: &str| resolve(r, &vaults, &env);
        crate::schema::resolve_references(&fields, &mut config, &resolve).unwrap();
        assert_eq!(config["redis"]["password"], "s3cret");
        // Only where the schema allows a reference: elsewhere it is the string it is.
        assert_eq!(config["redis"]["user"], "{vault://env/redis-password}");
    }

    #[test]
    fn the_env_vault_decodes_base64_when_asked() {
        let vault = |config: serde_json::Value| {
            let (v, _, e) = records::read(
                records::by_table("vaults").unwrap(),
                json!({"prefix": "b64", "name": "env", "config": config})
                    .as_object()
                    .unwrap(),
                "00000000-0000-4000-8000-000000000002",
                0,
            );
            assert!(e.is_empty(), "{e:?}");
            v
        };
        let decoding = vec![vault(json!({"prefix": "B64_", "base64_decode": true}))];
        assert_eq!(
            resolve("{vault://b64/api/token}", &decoding, &env).unwrap(),
            "t0k"
        );
        assert!(resolve("{vault://b64/bad}", &decoding, &env)
            .unwrap_err()
            .contains("B64_BAD is not valid base64"));
        // Off by default: the value as it is.
        let plain = vec![vault(json!({"prefix": "B64_"}))];
        assert_eq!(plain[0].fields["config"]["base64_decode"], json!(false));
        assert_eq!(
            resolve("{vault://b64/api}", &plain, &env).unwrap(),
            "eyJ0b2tlbiI6ICJ0MGsifQ=="
        );
    }
}
