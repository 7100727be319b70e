//! Foreign keys: references by id or endpoint key resolved, and set on the entity.

use super::HashMap;
use std::sync::Arc;

use super::*;

/// The ids foreign keys point at, each allocated once and shared by every key naming it:
/// by the parent's position for nested children (no hashing: a 100k-consumer load spent 10%
/// more time hashing each consumer's id), by id for references, which also find the ids of
/// nested children's parents (gathered at the first reference).
pub(super) struct SharedIds {
    by_item: Vec<Option<Arc<str>>>,
    by_id: Option<std::collections::HashSet<Arc<str>, foldhash::fast::RandomState>>,
}

impl SharedIds {
    pub(super) fn new(items: usize) -> SharedIds {
        SharedIds {
            by_item: vec![None; items],
            by_id: None,
        }
    }

    /// The id of item `i`, `id`.
    pub(super) fn of_item(&mut self, i: usize, id: &str) -> Arc<str> {
        let a = self.by_item[i].get_or_insert_with(|| id.into()).clone();
        if let Some(set) = &mut self.by_id {
            set.insert(a.clone());
        }
        a
    }

    pub(super) fn intern(&mut self, id: &str) -> Arc<str> {
        let by_item = &self.by_item;
        let set = self
            .by_id
            .get_or_insert_with(|| by_item.iter().flatten().cloned().collect());
        if let Some(a) = set.get(id) {
            return a.clone();
        }
        let a: Arc<str> = id.into();
        set.insert(a.clone());
        a
    }
}

pub(super) fn set_fk(cfg: &mut Config, kind: Kind, slot: usize, field: &str, id: Arc<str>) {
    let fk = Some(ForeignKey::new(id.clone()));
    match (kind, field) {
        (Kind::Route, "service") => std::sync::Arc::make_mut(&mut cfg.routes[slot]).service = fk,
        (Kind::Plugin, "service") => cfg.plugins[slot].service = fk,
        (Kind::Plugin, "route") => cfg.plugins[slot].route = fk,
        (Kind::Plugin, "consumer") => cfg.plugins[slot].consumer = fk,
        (Kind::Target, "upstream") => cfg.targets[slot].upstream = ForeignKey::new(id),
        (Kind::Sni, "certificate") => cfg.snis[slot].certificate = ForeignKey::new(id),
        (Kind::Credential(_), "consumer") => cfg.credentials[slot].consumer = ForeignKey::new(id),
        (Kind::Record(_), f) => {
            cfg.records[slot]
                .fields
                .insert(f.to_string(), serde_json::json!({ "id": &*id }));
        }
        _ => {}
    }
}

/// Looks entities up by id or by endpoint key (name, username).
pub(super) struct KeyIndex {
    map: HashMap<(&'static str, String), String>,
}

impl KeyIndex {
    pub(super) fn build(cfg: &Config) -> KeyIndex {
        let mut map = HashMap::default();
        for s in &cfg.services {
            map.insert(("services", s.id.clone()), s.id.clone());
            if let Some(n) = &s.name {
                map.entry(("services", n.clone()))
                    .or_insert_with(|| s.id.clone());
            }
        }
        for r in &cfg.routes {
            map.insert(("routes", r.id.clone()), r.id.clone());
            if let Some(n) = &r.name {
                map.entry(("routes", n.clone()))
                    .or_insert_with(|| r.id.clone());
            }
        }
        for c in &cfg.consumers {
            map.insert(("consumers", c.id.clone()), c.id.clone());
            if let Some(n) = &c.username {
                map.entry(("consumers", n.clone()))
                    .or_insert_with(|| c.id.clone());
            }
        }
        for u in &cfg.upstreams {
            map.insert(("upstreams", u.id.clone()), u.id.clone());
            map.entry(("upstreams", u.name.clone()))
                .or_insert_with(|| u.id.clone());
        }
        for c in &cfg.certificates {
            map.insert(("certificates", c.id.clone()), c.id.clone());
        }
        for r in &cfg.records {
            let table = r.table();
            map.insert((table, r.id.clone()), r.id.clone());
            let ek = records::RECORDS[r.spec].endpoint_key;
            if let Some(n) = r.fields.get(ek).and_then(|v| v.as_str()) {
                map.entry((table, n.to_string()))
                    .or_insert_with(|| r.id.clone());
            }
        }
        KeyIndex { map }
    }

    pub(super) fn resolve(&self, table: &'static str, key: &str) -> Option<String> {
        self.map
            .get(&(table, key.to_string()))
            .or_else(|| self.map.get(&(table, key.to_ascii_lowercase())))
            .cloned()
    }
}
