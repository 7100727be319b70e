//! What travels on `/v1/outlet`: the data plane's `basic_info` and the control plane's
//! `reconfigure` (gzip-compressed JSON), and the export it carries in Kong's
//! `declarative.export_config()` shape.

use std::collections::BTreeSet;
use std::io::{Read, Write};

use md5::Digest as _;
use serde_json::{json, Map, Value};

use crate::hash::{self, Hashes};

/// Kong's `export_config()` from the store's export (`_format_version`, `_transform` and one
/// list per table): disabled services, their routes and the plugins on either are left out, as
/// are disabled plugins; a foreign key is the bare id. Also returns the names of the plugins
/// configured (what a data plane must have to take it).
pub fn export_config(mut store_export: Value) -> (Value, BTreeSet<String>) {
    let mut configured = BTreeSet::new();
    let Some(top) = store_export.as_object_mut() else {
        return (store_export, configured);
    };
    top.insert("_format_version".into(), json!("3.0"));
    top.insert("_transform".into(), json!(false));
    let enabled = |row: &Value| row.get("enabled").and_then(Value::as_bool) != Some(false);
    let id_of = |v: &Value| v.get("id").and_then(Value::as_str).map(str::to_string);
    let mut disabled: BTreeSet<String> = BTreeSet::new();
    if let Some(Value::Array(services)) = top.get_mut("services") {
        services.retain(|s| {
            if enabled(s) {
                return true;
            }
            disabled.extend(id_of(s));
            false
        });
    }
    if let Some(Value::Array(routes)) = top.get_mut("routes") {
        routes.retain(|r| {
            let service = r
                .get("service")
                .and_then(|s| s.get("id"))
                .and_then(Value::as_str);
            if service.is_some_and(|s| disabled.contains(s)) {
                disabled.extend(id_of(r));
                return false;
            }
            true
        });
    }
    for (table, rows) in top.iter_mut() {
        let Value::Array(rows) = rows else { continue };
        if table == "plugins" {
            rows.retain(enabled);
        }
        rows.retain_mut(|row| {
            let Value::Object(m) = row else { return true };
            for v in m.values_mut() {
                // A foreign key: `{"id": ...}` becomes the id.
                let fk = match v {
                    Value::Object(f) if f.len() == 1 => f.get("id").and_then(Value::as_str),
                    _ => None,
                };
                if let Some(id) = fk {
                    if disabled.contains(id) {
                        return false;
                    }
                    *v = Value::String(id.to_string());
                }
            }
            true
        });
        if table == "plugins" {
            for p in rows.iter() {
                if let Some(name) = p.get("name").and_then(Value::as_str) {
                    configured.insert(name.to_string());
                }
            }
        }
    }
    (store_export, configured)
}

/// A `reconfigure` message ready to send to every data plane, and what a Turnpike data plane
/// holding the previous config needs instead (a `turnpike_delta`).
#[derive(Debug)]
pub struct Reconfigure {
    /// The gzip-compressed JSON message.
    pub deflated: bytes::Bytes,
    pub hashes: Hashes,
    /// The plugins the config uses.
    pub configured: BTreeSet<String>,
    /// The uncompressed size, for the log and the benchmarks.
    pub inflated_len: usize,
    /// Each entity's digest, by table and id: what the next config is compared with.
    pub rows: Rows,
    /// The changes from the previous config (its hash, and the compressed message), when
    /// there was one.
    pub delta: Option<Delta>,
}

/// The digest of every entity of a config, by table and id.
pub type Rows = std::collections::HashMap<(String, String), [u8; 16]>;

/// A `turnpike_delta` message: the entities added, changed or removed since `base`.
#[derive(Debug)]
pub struct Delta {
    pub base: String,
    pub deflated: bytes::Bytes,
    pub changes: usize,
}

/// Turnpike's own message type: sent only to data planes that said they read it.
pub const DELTA_TYPE: &str = "turnpike_delta";

/// What a Turnpike data plane adds to `basic_info` (a Kong control plane reads no other key
/// than its own, so it never sees it): the message types it reads beside Kong's.
pub const CAPABILITIES_KEY: &str = "turnpike_capabilities";

fn row_digests(config: &Value) -> Rows {
    let mut rows = Rows::new();
    let Some(top) = config.as_object() else {
        return rows;
    };
    for (table, list) in top {
        let Value::Array(list) = list else { continue };
        for row in list {
            let Some(id) = row.get("id").and_then(Value::as_str) else {
                continue;
            };
            let text = serde_json::to_vec(row).unwrap_or_default();
            rows.insert(
                (table.clone(), id.to_string()),
                md5::Md5::digest(&text).into(),
            );
        }
    }
    rows
}

/// The changes from `previous` to `config` as `[table, id, entity or null]` entries: every
/// entity whose digest is new or differs, and every one that is gone.
fn changes(previous: &Rows, current: &Rows, config: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    if let Some(top) = config.as_object() {
        for (table, list) in top {
            let Value::Array(list) = list else { continue };
            for row in list {
                let Some(id) = row.get("id").and_then(Value::as_str) else {
                    continue;
                };
                let key = (table.clone(), id.to_string());
                if previous.get(&key) != current.get(&key) {
                    out.push(json!([table, id, row]));
                }
            }
        }
    }
    let mut gone: Vec<&(String, String)> = previous
        .keys()
        .filter(|k| !current.contains_key(*k))
        .collect();
    gone.sort();
    for (table, id) in gone {
        out.push(json!([table, id, null]));
    }
    out
}

impl Reconfigure {
    /// Hashes the exported config, writes the message and compresses it; with the previous
    /// config's, also the delta from it.
    pub fn build(config: Value, configured: BTreeSet<String>) -> Result<Reconfigure, String> {
        Reconfigure::build_after(config, configured, None)
    }

    /// [`Reconfigure::build`], with the delta from `previous` (the config it replaces).
    pub fn build_after(
        config: Value,
        configured: BTreeSet<String>,
        previous: Option<&Reconfigure>,
    ) -> Result<Reconfigure, String> {
        let hashes = hash::config_hash(&config)?;
        let rows = row_digests(&config);
        let delta = match previous {
            Some(p) => {
                let changes = changes(&p.rows, &rows, &config);
                let n = changes.len();
                let msg = json!({
                    "type": DELTA_TYPE,
                    "base": p.hashes.config,
                    "config_hash": hashes.config,
                    "hashes": hashes,
                    "changes": changes,
                });
                let text = serde_json::to_vec(&msg).map_err(|e| e.to_string())?;
                Some(Delta {
                    base: p.hashes.config.clone(),
                    deflated: gzip(&text)?.into(),
                    changes: n,
                })
            }
            None => None,
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| (d.as_millis() as f64) / 1000.0)
            .unwrap_or(0.0);
        let mut msg = Map::new();
        msg.insert("type".into(), json!("reconfigure"));
        msg.insert("timestamp".into(), json!(now));
        msg.insert("config_table".into(), config);
        msg.insert("config_hash".into(), json!(hashes.config));
        msg.insert(
            "hashes".into(),
            serde_json::to_value(&hashes).map_err(|e| e.to_string())?,
        );
        let text = serde_json::to_vec(&Value::Object(msg)).map_err(|e| e.to_string())?;
        let deflated = gzip(&text)?;
        Ok(Reconfigure {
            deflated: deflated.into(),
            hashes,
            configured,
            inflated_len: text.len(),
            rows,
            delta,
        })
    }
}

pub fn gzip(data: &[u8]) -> Result<Vec<u8>, String> {
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(data.len() / 8),
        flate2::Compression::new(6),
    );
    enc.write_all(data).map_err(|e| e.to_string())?;
    enc.finish().map_err(|e| e.to_string())
}

/// Gunzips at most `limit` bytes: a message that inflates past it (a gzip bomb) is refused.
pub fn gunzip(data: &[u8], limit: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data)
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("cannot inflate the message: {e}"))?;
    if out.len() > limit {
        return Err(format!("the message inflates past {limit} bytes"));
    }
    Ok(out)
}

/// A `reconfigure` message as a data plane reads it: the config's text is kept as it came,
/// for the loader to read entity by entity.
#[derive(serde::Deserialize)]
pub struct Received<'a> {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(borrow, default)]
    pub config_table: Option<&'a serde_json::value::RawValue>,
    #[serde(default)]
    pub config_hash: Option<String>,
    #[serde(default)]
    pub hashes: Option<Value>,
    #[serde(default)]
    pub timestamp: Option<f64>,
}

/// One entity of a delta: its table, its id, and what it is now (`None`: removed).
pub type Change = (String, String, Option<Map<String, Value>>);

/// A `turnpike_delta` as a data plane reads it: `[table, id, entity or null]` changes.
#[derive(serde::Deserialize)]
pub struct ReceivedDelta {
    pub base: String,
    pub config_hash: String,
    pub changes: Vec<Change>,
}

impl Received<'_> {
    /// The config hash sent, or Kong's hash of the config when none was.
    pub fn hash(&self) -> Result<String, String> {
        if let Some(h) = &self.config_hash {
            if h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Ok(h.clone());
            }
            return Err(format!("config_hash '{h}' is not 32 hex characters"));
        }
        let table = self.config_table.ok_or("no config_table")?;
        let v: Value = serde_json::from_str(table.get()).map_err(|e| e.to_string())?;
        Ok(hash::config_hash(&v)?.config)
    }
}

/// The data plane's `basic_info`: its plugins (sorted by name, any case), its configuration
/// without secrets, and its labels.
pub fn basic_info(
    plugins: &[(String, String)],
    process_conf: Value,
    labels: &[(String, String)],
    capabilities: &[&str],
) -> Vec<u8> {
    let mut list: Vec<&(String, String)> = plugins.iter().collect();
    list.sort_by_key(|(n, _)| n.to_lowercase());
    let mut msg = Map::new();
    msg.insert("type".into(), json!("basic_info"));
    msg.insert(
        "plugins".into(),
        Value::Array(
            list.iter()
                .map(|(n, v)| json!({"name": n, "version": v}))
                .collect(),
        ),
    );
    msg.insert("process_conf".into(), process_conf);
    if !capabilities.is_empty() {
        msg.insert(CAPABILITIES_KEY.into(), json!(capabilities));
    }
    if !labels.is_empty() {
        let m: Map<String, Value> = labels
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        msg.insert("labels".into(), Value::Object(m));
    }
    serde_json::to_vec(&Value::Object(msg)).unwrap_or_default()
}

/// The control plane's reading of `basic_info` (`handle_cp_websocket`), with Kong's messages.
pub struct BasicInfo {
    pub plugins: Vec<Value>,
    pub labels: Option<Map<String, Value>>,
    /// A Turnpike data plane reads `turnpike_delta` messages.
    pub reads_deltas: bool,
}

pub fn read_basic_info(data: &[u8]) -> Result<BasicInfo, String> {
    let v: Value = serde_json::from_slice(data)
        .map_err(|e| format!("failed to decode websocket basic info data: {e}"))?;
    let Value::Object(mut m) = v else {
        return Err("failed to decode websocket basic info data".into());
    };
    match m.get("type").and_then(Value::as_str) {
        Some("basic_info") => {}
        other => {
            return Err(format!(
                "invalid basic info data type: {}",
                other.unwrap_or("unknown")
            ))
        }
    }
    let plugins = match m.remove("plugins") {
        Some(Value::Array(p)) => p,
        Some(Value::Object(o)) if o.is_empty() => Vec::new(),
        _ => return Err("missing plugins in basic info data".into()),
    };
    let labels = match m.remove("labels") {
        Some(Value::Object(l)) => Some(l),
        _ => None,
    };
    let reads_deltas = m
        .get(CAPABILITIES_KEY)
        .and_then(Value::as_array)
        .is_some_and(|c| c.iter().any(|v| v == DELTA_TYPE));
    Ok(BasicInfo {
        plugins,
        labels,
        reads_deltas,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_export_leaves_out_what_kong_leaves_out_and_flattens_foreign_keys() {
        let export = json!({
            "_format_version": "3.0",
            "services": [
                {"id": "s1", "name": "on", "enabled": true},
                {"id": "s2", "name": "off", "enabled": false},
            ],
            "routes": [
                {"id": "r1", "service": {"id": "s1"}, "paths": ["/a"]},
                {"id": "r2", "service": {"id": "s2"}, "paths": ["/b"]},
            ],
            "plugins": [
                {"id": "p1", "name": "key-auth", "route": {"id": "r1"}, "service": null, "enabled": true, "config": {"key_names": ["apikey"]}},
                {"id": "p2", "name": "acl", "route": {"id": "r2"}, "enabled": true, "config": {}},
                {"id": "p3", "name": "cors", "service": {"id": "s2"}, "enabled": true, "config": {}},
                {"id": "p4", "name": "rate-limiting", "enabled": false, "config": {}},
            ],
        });
        let (out, configured) = export_config(export);
        assert_eq!(out["_transform"], json!(false));
        assert_eq!(
            out["services"],
            json!([{"id": "s1", "name": "on", "enabled": true}])
        );
        assert_eq!(
            out["routes"],
            json!([{"id": "r1", "service": "s1", "paths": ["/a"]}])
        );
        assert_eq!(
            out["plugins"],
            json!([{"id": "p1", "name": "key-auth", "route": "r1", "service": null, "enabled": true, "config": {"key_names": ["apikey"]}}])
        );
        assert_eq!(configured.into_iter().collect::<Vec<_>>(), vec!["key-auth"]);
    }

    #[test]
    fn a_reconfigure_reads_back_with_its_hash() {
        let (config, configured) = export_config(json!({"_format_version": "3.0", "services": []}));
        let r = Reconfigure::build(config, configured).unwrap();
        let text = gunzip(&r.deflated, 1 << 20).unwrap();
        let got: Received = serde_json::from_slice(&text).unwrap();
        assert_eq!(got.kind, "reconfigure");
        assert_eq!(got.hash().unwrap(), r.hashes.config);
        let table: Value = serde_json::from_str(got.config_table.unwrap().get()).unwrap();
        assert_eq!(hash::config_hash(&table).unwrap(), r.hashes);
    }

    #[test]
    fn a_delta_holds_what_changed_and_what_went() {
        let v1 = json!({"_format_version": "3.0", "services": [{"id": "s1", "port": 80}, {"id": "s2", "port": 81}],
            "routes": [{"id": "r1", "service": "s1", "paths": ["/a"]}]});
        let v2 = json!({"_format_version": "3.0", "services": [{"id": "s1", "port": 8080}],
            "routes": [{"id": "r1", "service": "s1", "paths": ["/a"]}, {"id": "r2", "service": "s1", "paths": ["/b"]}]});
        let r1 = Reconfigure::build(v1, BTreeSet::new()).unwrap();
        assert!(r1.delta.is_none());
        let r2 = Reconfigure::build_after(v2.clone(), BTreeSet::new(), Some(&r1)).unwrap();
        let d = r2.delta.as_ref().unwrap();
        assert_eq!((d.base.as_str(), d.changes), (r1.hashes.config.as_str(), 3));
        let got: ReceivedDelta =
            serde_json::from_slice(&gunzip(&d.deflated, 1 << 20).unwrap()).unwrap();
        assert_eq!(got.base, r1.hashes.config);
        assert_eq!(got.config_hash, r2.hashes.config);
        let mut seen: Vec<(String, String, bool)> = got
            .changes
            .iter()
            .map(|(t, i, e)| (t.clone(), i.clone(), e.is_some()))
            .collect();
        seen.sort();
        assert_eq!(
            seen,
            vec![
                ("routes".into(), "r2".into(), true),
                ("services".into(), "s1".into(), true),
                ("services".into(), "s2".into(), false),
            ]
        );
        assert_eq!(r2.hashes, hash::config_hash(&v2).unwrap());
    }

    #[test]
    fn a_gzip_bomb_is_refused() {
        let zeros = vec![0u8; 8 << 20];
        let bomb = gzip(&zeros).unwrap();
        assert!(bomb.len() < 64 << 10);
        assert_eq!(
            gunzip(&bomb, 1 << 20).unwrap_err(),
            "the message inflates past 1048576 bytes"
        );
        assert!(gunzip(b"not gzip", 1 << 20).is_err());
    }

    #[test]
    fn basic_info_as_kong_writes_and_reads_it() {
        let plugins = vec![
            ("rate-limiting".to_string(), "3.9.1".to_string()),
            ("ACL".to_string(), "3.9.1".to_string()),
            ("acme".to_string(), "3.9.1".to_string()),
        ];
        let bytes = basic_info(&plugins, json!({}), &[("region".into(), "eu".into())], &[]);
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        let names: Vec<&str> = v["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["ACL", "acme", "rate-limiting"]);
        assert_eq!(v["labels"], json!({"region": "eu"}));
        let info = read_basic_info(&bytes).unwrap();
        assert_eq!(info.plugins.len(), 3);
        assert!(!info.reads_deltas);
        let turnpike = basic_info(&plugins, json!({}), &[], &[DELTA_TYPE]);
        assert!(read_basic_info(&turnpike).unwrap().reads_deltas);
        assert_eq!(
            read_basic_info(br#"{"type":"hello"}"#).err().unwrap(),
            "invalid basic info data type: hello"
        );
        assert_eq!(
            read_basic_info(br#"{"type":"basic_info"}"#).err().unwrap(),
            "missing plugins in basic info data"
        );
        assert!(read_basic_info(b"[1").is_err());
    }
}
