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

    /// The id of item `i`: `id()`, the entity's own when it keeps its id shared (a
    /// consumer: its credentials point at it with no copy of their own, 56 bytes each).
    pub(super) fn of_item(&mut self, i: usize, id: impl FnOnce() -> Arc<str>) -> Arc<str> {
        if i >= self.by_item.len() {
            self.by_item.resize(i + 1, None);
        }
        let a = self.by_item[i].get_or_insert_with(id).clone();
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
        // A route shared with the running config already names its service (`Previous`).
        (Kind::Route, "service") if cfg.routes[slot].service != fk => {
            std::sync::Arc::make_mut(&mut cfg.routes[slot]).service = fk
        }
        (Kind::Plugin, "service") => cfg.plugins[slot].service = fk,
        (Kind::Plugin, "route") => cfg.plugins[slot].route = fk,
        (Kind::Plugin, "consumer") => cfg.plugins[slot].consumer = fk,
        (Kind::Target, "upstream") => cfg.targets[slot].upstream = ForeignKey::new(id),
        (Kind::Sni, "certificate") => cfg.snis[slot].certificate = ForeignKey::new(id),
        (Kind::Credential(_), "consumer") => {
            let fk = ForeignKey::new(id);
            if cfg.credentials[slot].consumer != fk {
                std::sync::Arc::make_mut(&mut cfg.credentials[slot]).consumer = fk;
            }
        }
        (Kind::Record(_), f) => {
            cfg.records[slot]
                .fields
                .insert(f.to_string(), serde_json::json!({ "id": &*id }));
        }
        _ => {}
    }
}

/// Looks entities up by id or by endpoint key (name, username), for the tables references
/// name. Keys and ids are borrowed from the entities: the index cloned every id and name of a
/// 100k-consumer config (50 MB of its load's peak) even when nothing referenced a consumer.
pub(super) struct KeyIndex<'a> {
    map: HashMap<(&'static str, &'a str), &'a str>,
}

impl<'a> KeyIndex<'a> {
    /// The index of the tables in `tables` (those some reference names).
    pub(super) fn build(cfg: &'a Config, tables: &[&'static str]) -> KeyIndex<'a> {
        let mut map: HashMap<(&'static str, &'a str), &'a str> = HashMap::default();
        let mut add = |table: &'static str, id: &'a str, key: Option<&'a str>| {
            map.insert((table, id), id);
            if let Some(k) = key {
                map.entry((table, k)).or_insert(id);
            }
        };
        let wanted = |t: &str| tables.contains(&t);
        if wanted("services") {
            for s in &cfg.services {
                add("services", &s.id, s.name.as_deref());
            }
        }
        if wanted("routes") {
            for r in &cfg.routes {
                add("routes", &r.id, r.name.as_deref());
            }
        }
        if wanted("consumers") {
            for c in &cfg.consumers {
                add("consumers", &c.id, c.username.as_deref());
            }
        }
        if wanted("upstreams") {
            for u in &cfg.upstreams {
                add("upstreams", &u.id, Some(&u.name));
            }
        }
        if wanted("certificates") {
            for c in &cfg.certificates {
                add("certificates", &c.id, None);
            }
        }
        for r in &cfg.records {
            let table = r.table();
            if wanted(table) {
                let ek = records::RECORDS[r.spec].endpoint_key;
                add(table, &r.id, r.fields.get(ek).and_then(|v| v.as_str()));
            }
        }
        KeyIndex { map }
    }

    pub(super) fn resolve(&self, table: &'static str, key: &str) -> Option<&'a str> {
        if let Some(id) = self.map.get(&(table, key)) {
            return Some(id);
        }
        let lower = key.to_ascii_lowercase();
        self.map.get(&(table, lower.as_str())).copied()
    }
}
