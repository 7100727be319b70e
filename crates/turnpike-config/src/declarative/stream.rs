//! A JSON declarative config read entity by entity: each top-level entity (with its nested
//! children) is parsed, read into the config and dropped before the next is parsed, so the
//! document is never held whole as `serde_json` values. Those were the largest part of a
//! load's peak: about 1.3 KB per consumer with a key (130 MB of a 10k-service, 100k-consumer
//! config's 290 MB).
//!
//! The first error stops the reader, and the caller reads the document again the usual way
//! (`load`), which reports every error in Kong's shape; so do documents this reader leaves to
//! it: formats 1.1 and 2.1 (migrated whole), a `_format_version` after the entities, a field
//! given twice.

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

use super::ids::{hash_of_parts, ArrayDigest};
use super::*;

/// The config of a JSON document, or `None` when the usual reader must read it (an error, or
/// a document this one leaves to it).
pub(super) fn load_json(text: &str, plugins: &dyn PluginRegistry) -> Option<Config> {
    let mut doc = Document {
        plugins,
        loader: None,
        transform: true,
        parts: Vec::new(),
    };
    let mut de = serde_json::Deserializer::from_str(text);
    (&mut doc).deserialize(&mut de).ok()?;
    de.end().ok()?;
    let mut loader = doc.loader?;
    loader.finish();
    if loader.failed() {
        return None;
    }
    let mut cfg = std::mem::take(&mut loader.cfg);
    cfg.transform = doc.transform;
    cfg.hash = hash_of_parts(doc.parts.iter().map(|(k, d)| (k.as_str(), *d)).collect());
    // Lists grown by doubling are cut to their size: the snapshot keeps them.
    cfg.services.shrink_to_fit();
    cfg.routes.shrink_to_fit();
    cfg.upstreams.shrink_to_fit();
    cfg.targets.shrink_to_fit();
    cfg.consumers.shrink_to_fit();
    cfg.plugins.shrink_to_fit();
    cfg.credentials.shrink_to_fit();
    Some(cfg)
}

struct Document<'p> {
    plugins: &'p dyn PluginRegistry,
    /// Made at `_format_version`, which must come before any entity.
    loader: Option<Loader<'p>>,
    transform: bool,
    /// Each top-level field's digest, for the config hash.
    parts: Vec<(String, [u8; 32])>,
}

/// Stops the reader: the usual one takes over.
fn stop<E: de::Error>() -> E {
    E::custom("left to the document reader")
}

impl<'de> DeserializeSeed<'de> for &mut Document<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for &mut Document<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a declarative configuration")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            if self.parts.iter().any(|(k, _)| *k == key) {
                return Err(stop());
            }
            let digest = match key.as_str() {
                "_format_version" => {
                    let v: Value = map.next_value()?;
                    match &v {
                        Value::String(s) if s == "3.0" => {
                            self.loader = Some(Loader::new(self.plugins, s.clone(), true))
                        }
                        _ => return Err(stop()),
                    }
                    ids::digest(&v)
                }
                "_transform" => {
                    let v: Value = map.next_value()?;
                    match &v {
                        Value::Bool(b) => self.transform = *b,
                        Value::Null => {}
                        _ => return Err(stop()),
                    }
                    ids::digest(&v)
                }
                "_comment" | "_ignore" | "_workspace" | "_info" | "_konnect"
                | "_plugin_configs" => ids::digest(&map.next_value::<Value>()?),
                table => {
                    let kind = Kind::from_table(table, self.plugins).ok_or_else(stop)?;
                    let loader = self.loader.as_mut().ok_or_else(stop)?;
                    map.next_value_seed(Entities {
                        plugins: self.plugins,
                        loader,
                        kind,
                    })?
                }
            };
            self.parts.push((key, digest));
        }
        Ok(())
    }
}

/// One top-level list of entities: read one by one; its digest.
struct Entities<'l, 'p> {
    plugins: &'p dyn PluginRegistry,
    loader: &'l mut Loader<'p>,
    kind: Kind,
}

impl<'de> DeserializeSeed<'de> for Entities<'_, '_> {
    type Value = [u8; 32];

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<[u8; 32], D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Entities<'_, '_> {
    type Value = [u8; 32];

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array of entities")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<[u8; 32], A::Error> {
        let mut digest = ArrayDigest::new();
        let mut pos = 0;
        let mut top_errors = Vec::new();
        while let Some(v) = seq.next_element::<Value>()? {
            pos += 1;
            let mut items = Vec::new();
            digest.push(&v);
            collect_entity(
                self.plugins,
                self.kind,
                &v,
                pos,
                None,
                None,
                &[],
                &mut items,
                &mut top_errors,
            );
            if !top_errors.is_empty() {
                return Err(stop());
            }
            let base = self.loader.count();
            self.loader.read(&mut items, base);
            if self.loader.failed() {
                return Err(stop());
            }
        }
        Ok(digest.finish())
    }
}
