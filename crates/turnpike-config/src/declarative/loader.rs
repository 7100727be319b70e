//! The loader's steps after the entities are collected: ids, each entity read into the config
//! (`read`, entity by entity, so a reader that streams the document can drop each entity's
//! text once read), then references, the checks across entities and uniqueness (`finish`).
//!
//! Only what the later steps need is kept per entity (its kind and its place in the config's
//! lists, 24 bytes); errors and references are kept only where there are some.

use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use super::*;

pub(super) struct Loader<'p> {
    plugins: &'p dyn PluginRegistry,
    now: i64,
    pub(super) cfg: Config,
    /// Per entity, by its number in document order: its kind and its index in its list.
    read: Vec<(Kind, u32)>,
    /// Errors by entity number.
    pub(super) errs: BTreeMap<usize, Vec<(String, String)>>,
    pub(super) top_errors: Vec<(String, String)>,
    /// References by id or endpoint key (entity, field, value), resolved once all are read.
    refs: Vec<(usize, &'static str, String)>,
    /// Certificates' plain `snis` names (the certificate's id, the names).
    transient_snis: Vec<(String, Vec<String>)>,
    /// One copy of each id that foreign keys name, whatever the number of children.
    shared_ids: SharedIds,
    /// The running config's routes by id, when a reload is read against it.
    previous: Option<Previous<'p>>,
    /// Children read before their parent (a streamed list of a service's routes): their kind,
    /// place and the foreign key their parent sets (`adopt`).
    orphans: Vec<(Kind, usize, &'static str)>,
    /// Equal tag and method lists, host names and service paths, one copy each.
    interner: entities::Interner,
}

impl<'p> Loader<'p> {
    pub(super) fn new(
        plugins: &'p dyn PluginRegistry,
        format_version: String,
        transform: bool,
    ) -> Loader<'p> {
        Loader {
            plugins,
            now: now_secs(),
            cfg: Config {
                format_version,
                transform,
                ..Default::default()
            },
            read: Vec::new(),
            errs: BTreeMap::new(),
            top_errors: Vec::new(),
            refs: Vec::new(),
            transient_snis: Vec::new(),
            shared_ids: SharedIds::new(0),
            orphans: Vec::new(),
            previous: None,
            interner: entities::Interner::default(),
        }
    }

    /// Every list at its exact size when all entities are known ahead: grown by doubling, a
    /// 100k-route config's list kept 31% of its 46 MB empty for the snapshot's life.
    pub(super) fn reserve(&mut self, items: &[Item]) {
        let count = |of: fn(Kind) -> bool| items.iter().filter(|it| of(it.kind)).count();
        let cfg = &mut self.cfg;
        cfg.services.reserve_exact(count(|k| k == Kind::Service));
        cfg.upstreams.reserve_exact(count(|k| k == Kind::Upstream));
        cfg.targets.reserve_exact(count(|k| k == Kind::Target));
        cfg.plugins.reserve_exact(count(|k| k == Kind::Plugin));
        self.read.reserve_exact(items.len());
    }

    /// Reads a reload against the running config: a route equal to the running one (its
    /// timestamps aside) is the running one's `Arc`, so that a reload of 100k routes does not
    /// hold them twice.
    pub(super) fn against(&mut self, previous: &'p Config) {
        self.previous = Some(Previous::new(previous, self.plugins));
    }

    /// Whether an error was found so far.
    pub(super) fn failed(&self) -> bool {
        !self.errs.is_empty() || !self.top_errors.is_empty()
    }

    /// How many entities were read.
    pub(super) fn count(&self) -> usize {
        self.read.len()
    }

    /// Gives `items` (entities collected together: an entity and its nested children, or a
    /// whole document) their ids and reads them into the config. Their numbers follow the
    /// entities read before; an item's `parent` is its parent's index in `items`.
    pub(super) fn read(&mut self, items: &mut [Item], base: usize) {
        debug_assert_eq!(base, self.read.len());
        // Ids: given, or Kong's deterministic UUIDv5, or random where Kong uses a random one.
        for i in 0..items.len() {
            let id = match items[i].map.get("id") {
                Some(Value::String(s)) => s.to_ascii_lowercase(),
                _ => generate_id(items, i),
            };
            items[i].id = id;
        }
        let (plugins, now) = (self.plugins, self.now);
        for (i, it) in items.iter().enumerate() {
            let id = it.id.as_str();
            let mut e: Vec<(String, String)> = Vec::new();
            let mut refs: Vec<(&'static str, String)> = Vec::new();
            let cfg = &mut self.cfg;
            let slot = match it.kind {
                Kind::Service => {
                    let (mut s, er) = entities::service(it.map, id, now);
                    e.extend(er);
                    self.interner.list(&mut s.tags);
                    self.interner.str(&mut s.host);
                    if let Some(path) = &mut s.path {
                        self.interner.str(path);
                    }
                    cfg.services.push(s);
                    cfg.services.len() - 1
                }
                Kind::Route => {
                    let (mut r, svc, er) =
                        entities::route(it.map, id, now, plugins.router_flavor());
                    e.extend(er);
                    self.interner.list(&mut r.tags);
                    self.interner.list(&mut r.methods);
                    if let Some(s) = svc {
                        refs.push(("service", s));
                    }
                    cfg.routes.push_back(match &self.previous {
                        Some(p) => p.share(r),
                        None => Arc::new(r),
                    });
                    cfg.routes.len() - 1
                }
                Kind::Upstream => {
                    let (u, er) = entities::upstream(it.map, id, now);
                    e.extend(er);
                    cfg.upstreams.push(u);
                    cfg.upstreams.len() - 1
                }
                Kind::Target => {
                    let (t, up, er) = entities::target(it.map, id, now * 1000);
                    e.extend(er);
                    if let Some(u) = up {
                        refs.push(("upstream", u));
                    }
                    cfg.targets.push(t);
                    cfg.targets.len() - 1
                }
                Kind::Consumer => {
                    let (mut c, er) = entities::consumer(it.map, id, now);
                    e.extend(er);
                    self.interner.list(&mut c.tags);
                    cfg.consumers.push_back(match &self.previous {
                        Some(p) => p.share_consumer(c),
                        None => Arc::new(c),
                    });
                    cfg.consumers.len() - 1
                }
                Kind::Plugin => {
                    let (mut p, r, er) = entities::plugin(it.map, id, now);
                    e.extend(er);
                    e.extend(check_plugin_config(plugins, &mut p));
                    refs.extend(r.given());
                    cfg.plugins.push(p);
                    cfg.plugins.len() - 1
                }
                Kind::Certificate => {
                    let (c, names, er) = entities::certificate(it.map, id, now);
                    e.extend(er);
                    if let Some(n) = names {
                        self.transient_snis.push((id.to_string(), n));
                    }
                    cfg.certificates.push(c);
                    cfg.certificates.len() - 1
                }
                Kind::Sni => {
                    let (s, cert, er) = entities::sni(it.map, id, now);
                    e.extend(er);
                    if let Some(c) = cert {
                        refs.push(("certificate", c));
                    }
                    cfg.snis.push(s);
                    cfg.snis.len() - 1
                }
                Kind::CaCertificate => {
                    let (c, er) = entities::ca_certificate(it.map, id, now);
                    e.extend(er);
                    cfg.ca_certificates.push(c);
                    cfg.ca_certificates.len() - 1
                }
                Kind::Credential(k) => {
                    let (c, consumer, er) = entities::credential(k, it.map, id, now);
                    e.extend(er);
                    if let Some(c) = consumer {
                        refs.push(("consumer", c));
                    }
                    cfg.credentials.push_back(match &self.previous {
                        Some(p) => p.share_credential(c, k, it),
                        None => Arc::new(c),
                    });
                    cfg.credentials.len() - 1
                }
                Kind::Record(k) => {
                    let (r, parent, er) = records::read(k, it.map, id, now);
                    e.extend(er);
                    if let (Some(p), Some((field, _))) = (parent, records::RECORDS[k].parent) {
                        refs.push((field, p));
                    }
                    cfg.records.push(r);
                    cfg.records.len() - 1
                }
            };
            // A nested list is not a field of the entity holding it.
            if it.nested {
                e.retain(|(field, msg)| {
                    !(msg == "unknown field" && it.is_child_key(field, plugins))
                });
            }
            // A child nested under a parent takes the parent's id, and may not name another.
            if let Some(ck) = it.child_key {
                if refs.iter().any(|(f, _)| *f == ck) {
                    e.push((ck.into(), "value must be null".into()));
                }
                refs.retain(|(f, _)| *f != ck);
                match it.parent {
                    Some(p) => {
                        let p = p as usize;
                        let pid = self.parent_id(base + p, &items[p].id);
                        set_fk(&mut self.cfg, it.kind, slot, ck, pid);
                    }
                    // Its parent is read after it.
                    None => self.orphans.push((it.kind, slot, ck)),
                }
            }
            let n = base + i;
            self.read.push((it.kind, slot as u32));
            self.refs.extend(refs.into_iter().map(|(f, v)| (n, f, v)));
            if !e.is_empty() {
                self.errs.insert(n, e);
            }
        }
    }

    /// How many children wait for their parent.
    pub(super) fn orphans(&self) -> usize {
        self.orphans.len()
    }

    /// Gives the children read since `first` orphan their parent: entity number `parent`,
    /// whose id is `id`.
    pub(super) fn adopt(&mut self, first: usize, parent: usize, id: &str) {
        for (kind, slot, ck) in self.orphans.split_off(first) {
            let pid = self.parent_id(parent, id);
            set_fk(&mut self.cfg, kind, slot, ck, pid);
        }
    }

    /// The id children of entity number `n` (whose id is `id`) point at: the consumer's or
    /// service's own when the parent is one.
    fn parent_id(&mut self, n: usize, id: &str) -> Arc<str> {
        let own = match self.read.get(n) {
            Some(&(Kind::Consumer, slot)) => Some(self.cfg.consumers[slot as usize].id.clone()),
            Some(&(Kind::Service, slot)) => Some(self.cfg.services[slot as usize].id.clone()),
            _ => None,
        };
        self.shared_ids
            .of_item(n, || own.unwrap_or_else(|| id.into()))
    }

    fn err(&mut self, n: usize, e: (String, String)) {
        self.errs.entry(n).or_default().push(e);
    }

    /// Certificates' plain snis, references, the checks across entities and uniqueness.
    pub(super) fn finish(&mut self) {
        let now = self.now;
        // Transient certificate `snis` become sni entities (ids from their names, as Kong does).
        for (cert, names) in std::mem::take(&mut self.transient_snis) {
            let cert: Arc<str> = cert.into();
            for name in names {
                let id = ids::entity_id("snis", &name.to_ascii_lowercase());
                self.cfg.snis.push(Sni {
                    id,
                    created_at: now,
                    updated_at: now,
                    name: name.to_ascii_lowercase(),
                    certificate: ForeignKey { id: cert.clone() },
                    tags: None,
                });
            }
        }
        self.resolve_references();
        self.check_across();
        self.check_unique();
    }

    /// References by id or endpoint key: looked up first, set after (the index borrows the
    /// entities the keys are set on).
    fn resolve_references(&mut self) {
        let target_of = |field: &str| match field {
            "service" => "services",
            "route" => "routes",
            "consumer" => "consumers",
            "upstream" => "upstreams",
            "certificate" => "certificates",
            "set" => "key_sets",
            _ => unreachable!(),
        };
        let mut tables: Vec<&'static str> = Vec::new();
        for (_, f, _) in &self.refs {
            if !tables.contains(&target_of(f)) {
                tables.push(target_of(f));
            }
        }
        if tables.is_empty() {
            return;
        }
        let mut resolved: Vec<(usize, &'static str, Arc<str>)> = Vec::new();
        let mut bad: Vec<(usize, (String, String))> = Vec::new();
        let index = KeyIndex::build(&self.cfg, &tables);
        for (n, field, value) in std::mem::take(&mut self.refs) {
            let target = target_of(field);
            match index.resolve(target, &value) {
                Some(id) => resolved.push((n, field, self.shared_ids.intern(id))),
                None => bad.push((
                    n,
                    (
                        "@entity".into(),
                        format!(
                            "invalid reference '{field}: {value}' (no such entry in '{target}')"
                        ),
                    ),
                )),
            }
        }
        for (n, field, id) in resolved {
            let (kind, slot) = self.read[n];
            set_fk(&mut self.cfg, kind, slot as usize, field, id);
        }
        for (n, e) in bad {
            self.err(n, e);
        }
    }

    /// Required foreign keys, and plugins' scopes.
    fn check_across(&mut self) {
        let mut found = Vec::new();
        let cfg = &self.cfg;
        for (n, &(kind, slot)) in self.read.iter().enumerate() {
            let s = slot as usize;
            let e: Option<(String, String)> = match kind {
                Kind::Target if cfg.targets[s].upstream.id.is_empty() => {
                    Some(("upstream".into(), fields::REQUIRED.into()))
                }
                Kind::Sni if cfg.snis[s].certificate.id.is_empty() => {
                    Some(("certificate".into(), fields::REQUIRED.into()))
                }
                Kind::Credential(k) if !k.spec.foreign.iter().any(|f| f.field == "consumer") => {
                    Some((
                        "@entity".into(),
                        format!(
                            "{} are kept in a database only; a declarative config cannot hold them",
                            k.spec.table
                        ),
                    ))
                }
                Kind::Credential(_) if cfg.credentials[s].consumer.id.is_empty() => {
                    Some(("consumer".into(), fields::REQUIRED.into()))
                }
                Kind::Plugin => check_plugin_scope(self.plugins, &cfg.plugins[s]),
                _ => None,
            };
            if let Some(e) = e {
                found.push((n, e));
            }
        }
        for (n, e) in found {
            self.err(n, e);
        }
    }

    /// Uniqueness: primary keys per table and Kong's unique fields. Keys borrowed from the
    /// entities (a 100k-consumer config cloned 51 MB of them), their (table, field) numbered:
    /// 24-byte entries rather than 64 (34 MB of a 10k-service, 100k-consumer load's peak).
    fn check_unique(&mut self) {
        let target_keys: Vec<String> = self
            .cfg
            .targets
            .iter()
            .map(|t| format!("{}:{}", t.upstream.id, t.target))
            .collect();
        for (n, e) in unique_errors(&self.cfg, &self.read, &target_keys) {
            self.err(n, e);
        }
        let mut sni_seen = std::collections::HashSet::new();
        for s in &self.cfg.snis {
            if !sni_seen.insert(s.name.as_str()) {
                self.top_errors.push((
                    "snis".into(),
                    format!(
                        "uniqueness violation: 'snis' entity with name set to '{}' already declared",
                        s.name
                    ),
                ));
            }
        }
    }
}

/// The uniqueness violations of the entities read, by entity number.
fn unique_errors<'a>(
    cfg: &'a Config,
    read: &[(Kind, u32)],
    target_keys: &'a [String],
) -> Vec<(usize, (String, String))> {
    // An entity's unique keys, (field, value): at most three (a consumer's id, username and
    // custom id).
    let keys = |n: usize| -> [(&'static str, Option<&'a str>); 3] {
        let (kind, slot) = read[n];
        let s = slot as usize;
        let none = ("", None);
        match kind {
            Kind::Service => {
                let x = &cfg.services[s];
                [("id", Some(&x.id)), ("name", x.name.as_deref()), none]
            }
            Kind::Route => {
                let x = &cfg.routes[s];
                [("id", Some(&x.id)), ("name", x.name.as_deref()), none]
            }
            Kind::Upstream => {
                let x = &cfg.upstreams[s];
                [("id", Some(&x.id)), ("name", Some(&x.name)), none]
            }
            Kind::Consumer => {
                let c = &cfg.consumers[s];
                [
                    ("id", Some(&c.id)),
                    ("username", c.username.as_deref()),
                    ("custom_id", c.custom_id.as_deref()),
                ]
            }
            Kind::Sni => {
                let x = &cfg.snis[s];
                [("id", Some(&x.id)), ("name", Some(&x.name)), none]
            }
            Kind::Record(k) => {
                let x = &cfg.records[s];
                let ek = records::RECORDS[k].endpoint_key;
                let v = x.fields.get(ek).and_then(|v| v.as_str());
                [("id", Some(&x.id)), (ek, v), none]
            }
            Kind::Target => [
                ("id", Some(&cfg.targets[s].id)),
                ("target", Some(&target_keys[s])),
                none,
            ],
            Kind::Credential(k) => {
                let x = &cfg.credentials[s];
                let ek = k.spec.endpoint_key;
                let v = ek.and_then(|f| x.fields.get(f)).and_then(|v| v.as_str());
                [("id", Some(&x.id)), (ek.unwrap_or(""), v), none]
            }
            Kind::Plugin => [("id", Some(&cfg.plugins[s].id)), none, none],
            Kind::Certificate => [("id", Some(&cfg.certificates[s].id)), none, none],
            Kind::CaCertificate => [("id", Some(&cfg.ca_certificates[s].id)), none, none],
        }
    };
    // The keys seen, each as its entity's number and the key's place (`n * 4 + k`), the key
    // read back from the entity: 4 bytes an entry. A set of (group, &str) was 24 bytes an
    // entry, 13 MB of a 100k-consumer reload's peak.
    let key_of = |e: u32| {
        let (n, k) = ((e / 4) as usize, (e % 4) as usize);
        let (field, v) = keys(n)[k];
        (read[n].0.table(), field, v.unwrap_or(""))
    };
    let state = foldhash::fast::RandomState::default();
    let mut seen = hashbrown::HashTable::<u32>::with_capacity(read.len() * 2);
    let mut found = Vec::new();
    for (n, (kind, _)) in read.iter().enumerate() {
        let table = kind.table();
        for (k, (field, v)) in keys(n).into_iter().enumerate() {
            let Some(v) = v else { continue };
            let key = (table, field, v);
            let hash = state.hash_one(key);
            match seen.entry(hash, |&e| key_of(e) == key, |&e| state.hash_one(key_of(e))) {
                hashbrown::hash_table::Entry::Vacant(slot) => {
                    slot.insert((n * 4 + k) as u32);
                }
                hashbrown::hash_table::Entry::Occupied(_) => {
                    let what = if field == "id" { "primary key" } else { field };
                    let e = format!(
                        "uniqueness violation: '{table}' entity with {what} set to '{v}' already declared"
                    );
                    found.push((n, ("@entity".into(), e)));
                }
            }
        }
    }
    found
}

/// Positions in a list by a key read back from the entry at that position: 4 bytes a
/// position (maps from borrowed keys were 24 to 40 bytes an entry, 14 MB of a 100k-consumer
/// reload's peak).
struct Positions {
    table: hashbrown::HashTable<u32>,
    state: foldhash::fast::RandomState,
}

impl Positions {
    fn new<K: std::hash::Hash + Eq>(n: usize, key: impl Fn(usize) -> Option<K>) -> Positions {
        let state = foldhash::fast::RandomState::default();
        let mut table = hashbrown::HashTable::with_capacity(n);
        for i in 0..n {
            let Some(k) = key(i) else { continue };
            let eq = |&e: &u32| key(e as usize).as_ref() == Some(&k);
            let rehash = |&e: &u32| key(e as usize).map_or(0, |k| state.hash_one(k));
            match table.entry(state.hash_one(&k), eq, rehash) {
                // The last of equal keys wins, as a map's insert.
                hashbrown::hash_table::Entry::Occupied(mut o) => *o.get_mut() = i as u32,
                hashbrown::hash_table::Entry::Vacant(v) => {
                    v.insert(i as u32);
                }
            }
        }
        Positions { table, state }
    }

    fn get<K: std::hash::Hash + Eq>(
        &self,
        k: &K,
        key: impl Fn(usize) -> Option<K>,
    ) -> Option<usize> {
        let found = self.table.find(self.state.hash_one(k), |&e| {
            key(e as usize).as_ref() == Some(k)
        });
        found.map(|&e| e as usize)
    }
}

/// The running config's routes and consumers by id, and its credentials by id and by their
/// endpoint key (a key-auth key's id is random when the file gives none).
pub(super) struct Previous<'p> {
    cfg: &'p Config,
    plugins: &'p dyn PluginRegistry,
    routes: Positions,
    consumers: Positions,
    credentials: Positions,
    credential_keys: Positions,
}

impl<'p> Previous<'p> {
    fn new(cfg: &'p Config, plugins: &'p dyn PluginRegistry) -> Previous<'p> {
        let mut p = Previous {
            cfg,
            plugins,
            routes: Positions::new(cfg.routes.len(), |i| Some(cfg.routes[i].id.as_str())),
            consumers: Positions::new(cfg.consumers.len(), |i| Some(&*cfg.consumers[i].id)),
            credentials: Positions::new(cfg.credentials.len(), |i| {
                Some(cfg.credentials[i].id.as_str())
            }),
            credential_keys: Positions::new(0, |_| None::<(&str, &str)>),
        };
        p.credential_keys = Positions::new(cfg.credentials.len(), |i| p.credential_key(i));
        p
    }

    /// The running route with this id, by its place.
    fn route_at(&self, id: &str) -> Option<usize> {
        let cfg = self.cfg;
        self.routes.get(&id, |i| Some(cfg.routes[i].id.as_str()))
    }

    /// The running consumer with this id, by its place.
    fn consumer_at(&self, id: &str) -> Option<usize> {
        let cfg = self.cfg;
        self.consumers.get(&id, |i| Some(&*cfg.consumers[i].id))
    }

    /// The running credential `i`'s table and endpoint key (a key-auth key), when it has one.
    fn credential_key(&self, i: usize) -> Option<(&'p str, &'p str)> {
        let c = &self.cfg.credentials[i];
        let key = self
            .plugins
            .entities()
            .iter()
            .find(|e| e.spec.table == c.table)
            .and_then(|e| e.spec.endpoint_key)
            .and_then(|k| c.fields.get(k))
            .and_then(|v| v.as_str())?;
        Some((c.table, key))
    }

    /// The running consumer when it equals `c` but for its timestamps; otherwise `c`.
    fn share_consumer(&self, mut c: Consumer) -> Arc<Consumer> {
        let Some(i) = self.consumer_at(&c.id) else {
            return Arc::new(c);
        };
        let old = &self.cfg.consumers[i];
        let mine = (c.created_at, c.updated_at);
        (c.created_at, c.updated_at) = (old.created_at, old.updated_at);
        if c == **old {
            return old.clone();
        }
        (c.created_at, c.updated_at) = mine;
        Arc::new(c)
    }

    /// The running credential when it equals `c` (as read from `it`) but for its timestamp,
    /// its consumer (set after) and, when the file gives none, its id; otherwise `c`.
    fn share_credential(
        &self,
        mut c: Credential,
        spec: &'static crate::entity::PluginEntity,
        it: &Item,
    ) -> Arc<Credential> {
        let cfg = self.cfg;
        let by_id = self
            .credentials
            .get(&c.id.as_str(), |i| Some(cfg.credentials[i].id.as_str()));
        let by_key = || {
            let k = spec
                .spec
                .endpoint_key
                .and_then(|k| c.fields.get(k))?
                .as_str()?;
            self.credential_keys
                .get(&(c.table, k), |i| self.credential_key(i))
        };
        let Some(i) = by_id.or_else(by_key) else {
            return Arc::new(c);
        };
        let old = &self.cfg.credentials[i];
        // The reader leaves the consumer unset (its parent or its reference sets it after,
        // copying a shared credential whose consumer differs): compared as the running one's.
        let consumer = std::mem::replace(&mut c.consumer, old.consumer.clone());
        let mine = (c.created_at, c.id.clone());
        c.created_at = old.created_at;
        if !it.map.contains_key("id") {
            c.id.clone_from(&old.id);
        }
        if c == **old {
            return old.clone();
        }
        (c.created_at, c.id, c.consumer) = (mine.0, mine.1, consumer);
        Arc::new(c)
    }

    /// The running route when it equals `r` but for its timestamps; otherwise `r`.
    fn share(&self, mut r: Route) -> Arc<Route> {
        let Some(i) = self.route_at(&r.id) else {
            return Arc::new(r);
        };
        let old = &self.cfg.routes[i];
        // The reader leaves the service unset (its parent or its reference sets it after,
        // copying a shared route whose service differs): compared as the running one's.
        let mine = (r.created_at, r.updated_at, r.service.take());
        r.service = old.service.clone();
        (r.created_at, r.updated_at) = (old.created_at, old.updated_at);
        if r == **old {
            return old.clone();
        }
        (r.created_at, r.updated_at, r.service) = mine;
        Arc::new(r)
    }
}
