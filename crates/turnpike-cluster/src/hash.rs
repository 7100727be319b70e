//! Kong's config hash (`kong/clustering/config_helper.lua` `calculate_config_hash`), bit for
//! bit: the md5 of a canonical text of the config, per group (routes, services, plugins,
//! upstreams, targets, the rest) and over the groups' hashes.
//!
//! The canonical text (`to_sorted_string`): `null` is `/null/`; strings and numbers as Lua
//! writes them (numbers `%.14g`); booleans `true`/`false`; an empty array or object `{}`; an
//! array of one to five elements joined by `;`, a longer one with `;` after every element; an
//! object's pairs `k:v;` by key order (bytes). Whenever the text passes 1,000,000 bytes, before
//! the next value is written, it is replaced by its binary md5.

use md5::{Digest, Md5};
use serde_json::Value;

/// Kong's `DECLARATIVE_EMPTY_CONFIG_HASH`: the hash of nothing.
pub const EMPTY_HASH: &str = "00000000000000000000000000000000";

/// The groups Kong hashes apart, in the order their hashes make the config's.
pub const GROUPS: [&str; 5] = ["routes", "services", "plugins", "upstreams", "targets"];

/// A config's hashes as Kong sends them beside it (`hashes`): `config` and one per group.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Hashes {
    pub config: String,
    #[serde(default = "empty")]
    pub routes: String,
    #[serde(default = "empty")]
    pub services: String,
    #[serde(default = "empty")]
    pub plugins: String,
    #[serde(default = "empty")]
    pub upstreams: String,
    #[serde(default = "empty")]
    pub targets: String,
}

fn empty() -> String {
    EMPTY_HASH.to_string()
}

impl Hashes {
    /// The hashes of the groups in [`GROUPS`] order.
    pub fn groups(&self) -> [&str; 5] {
        [
            &self.routes,
            &self.services,
            &self.plugins,
            &self.upstreams,
            &self.targets,
        ]
    }
}

/// Past this many bytes the canonical text is folded into its md5.
const FOLD_AT: usize = 1_000_000;

/// The text being digested, folded as Kong folds it.
struct Text(Vec<u8>);

impl Text {
    fn put(&mut self, value: &Value) -> Result<(), String> {
        if self.0.len() > FOLD_AT {
            let folded = Md5::digest(&self.0);
            self.0.clear();
            self.0.extend_from_slice(&folded);
        }
        match value {
            Value::Null => self.0.extend_from_slice(b"/null/"),
            Value::String(s) => self.0.extend_from_slice(s.as_bytes()),
            Value::Number(n) => {
                let text = match (n.as_i64(), n.as_f64()) {
                    // Lua holds every number as a double, written `%.14g`.
                    (_, Some(f)) => lua_number(f),
                    (Some(i), None) => lua_number(i as f64),
                    (None, None) => return Err(format!("unsupported number {n}")),
                };
                self.0.extend_from_slice(text.as_bytes());
            }
            Value::Bool(b) => self
                .0
                .extend_from_slice(if *b { b"true" } else { b"false" }),
            Value::Array(items) if items.is_empty() => self.0.extend_from_slice(b"{}"),
            Value::Object(m) if m.is_empty() => self.0.extend_from_slice(b"{}"),
            Value::Array(items) if items.len() <= 5 => {
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        self.0.push(b';');
                    }
                    self.put(item)?;
                }
            }
            Value::Array(items) => {
                for item in items {
                    self.put(item)?;
                    self.0.push(b';');
                }
            }
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
                for k in keys {
                    self.0.extend_from_slice(k.as_bytes());
                    self.0.push(b':');
                    self.put(&m[k.as_str()])?;
                    self.0.push(b';');
                }
            }
        }
        Ok(())
    }
}

/// A number as LuaJIT writes it (`%.14g`).
pub fn lua_number(f: f64) -> String {
    if f.is_nan() {
        return if f.is_sign_negative() { "-nan" } else { "nan" }.into();
    }
    if f.is_infinite() {
        return if f < 0.0 { "-inf" } else { "inf" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0" } else { "0" }.into();
    }
    // The exponent after rounding to 14 significant digits decides the style, as in C.
    let sci = format!("{f:.13e}");
    let (mantissa, exp) = sci.split_once('e').expect("exponent");
    let exp: i32 = exp.parse().expect("exponent digits");
    if !(-4..14).contains(&exp) {
        let m = trim_zeros(mantissa);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{m}e{sign}{:02}", exp.abs());
    }
    let fixed = format!("{f:.prec$}", prec = (13 - exp) as usize);
    trim_zeros(&fixed).to_string()
}

fn trim_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// `calculate_hash`: md5 of the canonical text; [`EMPTY_HASH`] for an absent value.
fn hash_of(value: Option<&Value>) -> Result<String, String> {
    let Some(v) = value else {
        return Ok(EMPTY_HASH.into());
    };
    let mut text = Text(Vec::new());
    text.put(v)?;
    Ok(hex::encode(Md5::digest(&text.0)))
}

/// Kong's `calculate_config_hash`: the config's hash and its groups'. A value that is not an
/// object is hashed whole (its `config` hash only).
pub fn config_hash(config: &Value) -> Result<Hashes, String> {
    let Value::Object(top) = config else {
        let h = hash_of(Some(config))?;
        return Ok(Hashes {
            config: h,
            routes: empty(),
            services: empty(),
            plugins: empty(),
            upstreams: empty(),
            targets: empty(),
        });
    };
    let group = |name: &str| hash_of(top.get(name));
    let (routes, services, plugins, upstreams, targets) = (
        group("routes")?,
        group("services")?,
        group("plugins")?,
        group("upstreams")?,
        group("targets")?,
    );
    // The rest: the config without the five groups (their absence is an empty object's `{}`).
    let rest: serde_json::Map<String, Value> = top
        .iter()
        .filter(|(k, _)| !GROUPS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let rest = hash_of(Some(&Value::Object(rest)))?;
    let joined = format!("{routes}{services}{plugins}{upstreams}{targets}{rest}");
    Ok(Hashes {
        config: hex::encode(Md5::digest(joined.as_bytes())),
        routes,
        services,
        plugins,
        upstreams,
        targets,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // Every expected value below is from Kong 3.9's own spec,
    // spec/01-unit/19-hybrid/02-clustering_spec.lua ("kong.clustering .calculate_config_hash()").

    #[test]
    fn scalars_hash_as_kongs_spec_says() {
        let cases = [
            (Value::Null, "5bf07a8b7343015026657d1108d8206e"),
            (json!(10), "d3d9446802a44259755d38e6d163e820"),
            (json!(0.9), "a894124cc6d5c5c71afe060d5dde0762"),
            (json!(""), "d41d8cd98f00b204e9800998ecf8427e"),
            (json!("hello"), "5d41402abc4b2a76b9719d911017c592"),
            (json!(false), "68934a3e9455fa72420237eb05902327"),
            (json!(true), "b326b5062b2f0e69046810717534cb09"),
        ];
        for (v, want) in cases {
            assert_eq!(config_hash(&v).unwrap().config, want, "{v}");
        }
    }

    #[test]
    fn an_empty_config_and_the_groups_hash_as_kongs_spec_says() {
        let h = config_hash(&json!({})).unwrap();
        assert_eq!(h.config, "2da3c26e4dbd6dd6ea3ab60a3dd7fb3e");
        assert_eq!(h.groups(), [EMPTY_HASH; 5]);

        let h = config_hash(&json!({"routes": [], "services": [], "plugins": []})).unwrap();
        assert_eq!(h.config, "81aac97a81ad03c0cf0b36663806488e");
        assert_eq!(h.routes, "99914b932bd37a50b983c5e7c90ae93b");
        assert_eq!(h.services, "99914b932bd37a50b983c5e7c90ae93b");
        assert_eq!(h.plugins, "99914b932bd37a50b983c5e7c90ae93b");
        assert_eq!(
            (h.upstreams.as_str(), h.targets.as_str()),
            (EMPTY_HASH, EMPTY_HASH)
        );

        let h = config_hash(&json!({"upstreams": [], "targets": []})).unwrap();
        assert_eq!(h.config, "4d60dd9998ea4314039da5ca2f1db96f");
        assert_eq!(h.upstreams, "99914b932bd37a50b983c5e7c90ae93b");
        assert_eq!(h.routes, EMPTY_HASH);
    }

    #[test]
    fn the_complex_table_of_kongs_spec() {
        let a6 = json!(["v1", "v2", "v3", "v4", "v5", "v6"]);
        let mut consumers = Vec::new();
        for i in 1..=1000 {
            consumers.push(json!({ "username": format!("user-{i}") }));
        }
        let value = json!({
            "plugins": [
                { "name": "0", "config": { "param": "value" } },
                { "name": "1", "config": { "param": a6 } },
                { "name": "2", "config": { "param": ["v1", "v2", "v3", "v4", "v5"] } },
                { "name": "3", "config": { "param": ["v1", "v2", "v3", "v4"] } },
                { "name": "4", "config": { "param": ["v1", "v2", "v3"] } },
                { "name": "5", "config": { "param": ["v1", "v2"] } },
                { "name": "6", "config": { "param": ["v1"] } },
                { "name": "7", "config": { "param": {} } },
                { "name": "8", "config": { "param": "value", "array": a6 } },
                { "name": "9", "config": { "bool1": true, "bool2": false, "number": 1, "double": 1.1,
                    "empty": {}, "null": null, "string": "test", "hash": { "k": "v" }, "array": a6 } },
            ],
            "consumers": consumers,
        });
        assert_eq!(
            config_hash(&value).unwrap().config,
            "675ff4b6b1c8cefa5198284110786ad0"
        );
    }

    #[test]
    fn numbers_are_written_as_luajit_writes_them() {
        for (f, want) in [
            (1.0, "1"),
            (60000.0, "60000"),
            (0.5, "0.5"),
            (1.1, "1.1"),
            (1e15, "1e+15"),
            (123456789012345.0, "1.2345678901234e+14"),
            (12345678901234.0, "12345678901234"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5, "-2.5"),
            (1.0 / 3.0, "0.33333333333333"),
        ] {
            assert_eq!(lua_number(f), want, "{f}");
        }
    }

    #[test]
    fn a_long_text_is_folded_into_its_md5_as_kong_folds_it() {
        // Past 1,000,000 bytes the text becomes its binary md5 before the next value: the
        // hash is then the md5 of (md5(first part) + the rest), not of the whole text.
        let big = "x".repeat(1_000_001);
        let v = json!([big, "tail"]);
        // ";" was written before the fold check of "tail", so it is folded with the first part.
        let mut first = big.as_bytes().to_vec();
        first.push(b';');
        let mut want = Md5::digest(&first).to_vec();
        want.extend_from_slice(b"tail");
        assert_eq!(hash_of(Some(&v)).unwrap(), hex::encode(Md5::digest(&want)));
    }
}
