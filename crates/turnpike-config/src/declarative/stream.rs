//! A JSON declarative config read entity by entity: each top-level entity is parsed, read
//! into the config and dropped before the next is parsed, and so is each of a nested list of
//! children whose ids do not depend on their parent (a service's routes, a consumer's keys),
//! read before the parent and given its id after. The document is never held whole as
//! `serde_json` values, which were the largest part of a load's peak: about 1.3 KB per
//! consumer with a key (130 MB of a 10k-service, 100k-consumer config's 290 MB), 77 MB for
//! 100k routes of one service.
//!
//! The first error stops the reader, and the caller reads the document again the usual way
//! (`load`), which reports every error in Kong's shape; so do documents this reader leaves to
//! it: formats 1.1 and 2.1 (migrated whole), a `_format_version` after the entities, a field
//! given twice.

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

use super::ids::{hash_of_parts, Part, RecordsHasher};
use super::*;

/// The config of a JSON document, or `None` when the usual reader must read it (an error, or
/// a document this one leaves to it).
pub(super) fn load_json<'p>(
    text: &str,
    plugins: &'p dyn PluginRegistry,
    previous: Option<&'p Config>,
) -> Option<Config> {
    let mut doc = Document::new(plugins, previous);
    let mut de = serde_json::Deserializer::from_str(text);
    (&mut doc).deserialize(&mut de).ok()?;
    de.end().ok()?;
    doc.finish()
}

impl<'p> Document<'p> {
    fn new(plugins: &'p dyn PluginRegistry, previous: Option<&'p Config>) -> Document<'p> {
        Document {
            plugins,
            previous,
            loader: None,
            transform: true,
            parts: Vec::new(),
        }
    }

    fn finish(self) -> Option<Config> {
        let doc = self;
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
        cfg.upstreams.shrink_to_fit();
        cfg.targets.shrink_to_fit();
        cfg.plugins.shrink_to_fit();
        Some(cfg)
    }
}

struct Document<'p> {
    plugins: &'p dyn PluginRegistry,
    /// The running config, for a reload: routes it has unchanged are shared with it.
    previous: Option<&'p Config>,
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
                            let mut loader = Loader::new(self.plugins, s.clone(), true);
                            if let Some(p) = self.previous {
                                loader.against(p);
                            }
                            self.loader = Some(loader);
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
                | "_plugin_configs" | "workspaces" => ids::digest(&map.next_value::<Value>()?),
                // Extension keys (`x-defaults: &defaults ...`, YAML anchors for reuse as decK
                // files write them): not entities; digested as the whole-document path does.
                extension if extension.starts_with("x-") => {
                    ids::digest(&map.next_value::<Value>()?)
                }
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
        let mut digest = RecordsHasher::new();
        let mut pos = 0;
        loop {
            pos += 1;
            let seed = Entity {
                plugins: self.plugins,
                loader: &mut *self.loader,
                kind: self.kind,
                pos,
                digest: &mut digest,
            };
            if seq.next_element_seed(seed)?.is_none() {
                break;
            }
        }
        Ok(digest.finish().as_value_digest())
    }
}

/// The nested list of `kind` children under an entity of `parent`, and the foreign key the
/// parent sets, when the children can be read before their parent: their ids do not depend
/// on it.
fn streamed_child(
    parent: Kind,
    key: &str,
    plugins: &dyn PluginRegistry,
) -> Option<(Kind, &'static str)> {
    let (table, fk) = parent
        .children(plugins)
        .find(|(t, _)| *t == key && !(parent == Kind::Certificate && *t == "snis"))?;
    let kind = Kind::from_table(table, plugins)?;
    let independent = match kind {
        Kind::Route => true,
        Kind::Credential(e) => !e.spec.identity().contains(&"consumer"),
        _ => false,
    };
    independent.then_some((kind, fk))
}

/// One entity of a list (top-level, or a child read before its parent), read field by field:
/// its fields are kept as values but for lists of children it can read first, which are read
/// one by one.
struct Entity<'l, 'p, 'd> {
    plugins: &'p dyn PluginRegistry,
    loader: &'l mut Loader<'p>,
    kind: Kind,
    pos: usize,
    /// The list's digest, which the entity joins.
    digest: &'d mut RecordsHasher,
}

impl<'de> DeserializeSeed<'de> for Entity<'_, '_, '_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Entity<'_, '_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an entity")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut own = Map::new();
        let mut lists = Vec::new();
        let first_orphan = self.loader.orphans();
        while let Some(key) = map.next_key::<String>()? {
            if own.contains_key(&key) || lists.iter().any(|(k, _)| *k == key) {
                return Err(stop());
            }
            match streamed_child(self.kind, &key, self.plugins) {
                Some((kind, fk)) => {
                    let d = map.next_value_seed(Children {
                        plugins: self.plugins,
                        loader: &mut *self.loader,
                        kind,
                        fk,
                    })?;
                    lists.push((key, d));
                }
                None => {
                    own.insert(key, map.next_value::<Value>()?);
                }
            }
        }
        let parts = own
            .iter()
            .map(|(k, v)| (k.as_str(), Part::Value(v)))
            .chain(lists.iter().map(|(k, d)| (k.as_str(), Part::Records(*d))))
            .collect();
        self.digest.push(parts);
        let v = Value::Object(own);
        let (parent, id) = read_entity(self.loader, self.plugins, self.kind, &v, self.pos, None)?;
        // The children read before it.
        if self.loader.orphans() > first_orphan {
            self.loader.adopt(first_orphan, parent, &id);
        }
        Ok(())
    }
}

/// Reads one entity value (its nested children kept in it included) into the loader: its
/// number and id.
fn read_entity<E: de::Error>(
    loader: &mut Loader,
    plugins: &dyn PluginRegistry,
    kind: Kind,
    v: &Value,
    pos: usize,
    child_key: Option<&'static str>,
) -> Result<(usize, String), E> {
    let mut items = Vec::new();
    let mut top_errors = Vec::new();
    collect_entity(
        plugins,
        kind,
        v,
        pos,
        None,
        child_key,
        &[],
        &mut items,
        &mut top_errors,
    );
    if !top_errors.is_empty() {
        return Err(stop());
    }
    let base = loader.count();
    loader.read(&mut items, base);
    if loader.failed() {
        return Err(stop());
    }
    let id = std::mem::take(&mut items.first_mut().ok_or_else(stop)?.id);
    Ok((base, id))
}

/// A list of children read before their parent, one by one; its digest.
struct Children<'l, 'p> {
    plugins: &'p dyn PluginRegistry,
    loader: &'l mut Loader<'p>,
    kind: Kind,
    fk: &'static str,
}

impl<'de> DeserializeSeed<'de> for Children<'_, '_> {
    type Value = super::ids::RecordsDigest;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Children<'_, '_> {
    type Value = super::ids::RecordsDigest;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array of entities")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut digest = RecordsHasher::new();
        let mut pos = 0;
        while let Some(v) = seq.next_element::<Value>()? {
            pos += 1;
            let Value::Object(m) = &v else {
                return Err(stop());
            };
            digest.push(
                m.iter()
                    .map(|(k, v)| (k.as_str(), Part::Value(v)))
                    .collect(),
            );
            read_entity(self.loader, self.plugins, self.kind, &v, pos, Some(self.fk))?;
        }
        Ok(digest.finish())
    }
}
