//! The loader's steps after the entities are collected: ids, each entity read into the config
//! (`read`, entity by entity, so a reader that streams the document can drop each entity's
//! text once read), then references, the checks across entities and uniqueness (`finish`).
//!
//! Only what the later steps need is kept per entity (its kind and its place in the config's
//! lists, 24 bytes); errors and references are kept only where there are some.

use std::collections::BTreeMap;
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
        }
    }

    /// Every list at its exact size when all entities are known ahead: grown by doubling, a
    /// 100k-route config's list kept 31% of its 46 MB empty for the snapshot's life.
    pub(super) fn reserve(&mut self, items: &[Item]) {
        let count = |of: fn(Kind) -> bool| items.iter().filter(|it| of(it.kind)).count();
        let cfg = &mut self.cfg;
        cfg.services.reserve_exact(count(|k| k == Kind::Service));
        cfg.routes.reserve_exact(count(|k| k == Kind::Route));
        cfg.upstreams.reserve_exact(count(|k| k == Kind::Upstream));
        cfg.targets.reserve_exact(count(|k| k == Kind::Target));
        cfg.consumers.reserve_exact(count(|k| k == Kind::Consumer));
        cfg.plugins.reserve_exact(count(|k| k == Kind::Plugin));
        cfg.credentials
            .reserve_exact(count(|k| matches!(k, Kind::Credential(_))));
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
                    let (s, er) = entities::service(it.map, id, now);
                    e.extend(er);
                    cfg.services.push(s);
                    cfg.services.len() - 1
                }
                Kind::Route => {
                    let (r, svc, er) = entities::route(it.map, id, now);
                    e.extend(er);
                    if let Some(s) = svc {
                        refs.push(("service", s));
                    }
                    cfg.routes.push(match &self.previous {
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
                    let (c, er) = entities::consumer(it.map, id, now);
                    e.extend(er);
                    cfg.consumers.push(match &self.previous {
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
                    cfg.credentials.push(match &self.previous {
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
                        let pid = self.shared_ids.of_item(base + p, &items[p].id);
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
            let pid = self.shared_ids.of_item(parent, id);
            set_fk(&mut self.cfg, kind, slot, ck, pid);
        }
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
    {
        let mut seen = Unique::with_capacity(read.len() * 2);
        let mut found = Vec::new();
        for (n, &(kind, slot)) in read.iter().enumerate() {
            let table = kind.table();
            let s = slot as usize;
            let mut check = |field: &'static str, v: Option<&'a str>| {
                if let Some(e) = seen.check(table, field, v) {
                    found.push((n, e));
                }
            };
            match kind {
                Kind::Service => {
                    let x = &cfg.services[s];
                    check("id", Some(&x.id));
                    check("name", x.name.as_deref());
                }
                Kind::Route => {
                    let x = &cfg.routes[s];
                    check("id", Some(&x.id));
                    check("name", x.name.as_deref());
                }
                Kind::Upstream => {
                    let x = &cfg.upstreams[s];
                    check("id", Some(&x.id));
                    check("name", Some(&x.name));
                }
                Kind::Consumer => {
                    let c = &cfg.consumers[s];
                    check("id", Some(&c.id));
                    check("username", c.username.as_deref());
                    check("custom_id", c.custom_id.as_deref());
                }
                Kind::Sni => {
                    let x = &cfg.snis[s];
                    check("id", Some(&x.id));
                    check("name", Some(&x.name));
                }
                Kind::Record(k) => {
                    let x = &cfg.records[s];
                    check("id", Some(&x.id));
                    let ek = records::RECORDS[k].endpoint_key;
                    check(ek, x.fields.get(ek).and_then(|v| v.as_str()));
                }
                Kind::Target => {
                    check("id", Some(&cfg.targets[s].id));
                    check("target", Some(&target_keys[s]));
                }
                Kind::Credential(k) => {
                    let x = &cfg.credentials[s];
                    check("id", Some(&x.id));
                    if let Some(f) = k.spec.endpoint_key {
                        check(f, x.fields.get(f).and_then(|v| v.as_str()));
                    }
                }
                Kind::Plugin => check("id", Some(&cfg.plugins[s].id)),
                Kind::Certificate => check("id", Some(&cfg.certificates[s].id)),
                Kind::CaCertificate => check("id", Some(&cfg.ca_certificates[s].id)),
            }
        }
        found
    }
}

/// Kong's uniqueness rule: a value of a unique field already declared by another entity of
/// the table is an error of this one. Values are kept per (table, field) group, by number.
struct Unique<'a> {
    groups: Vec<(&'static str, &'static str)>,
    seen: std::collections::HashSet<(u16, &'a str), foldhash::fast::RandomState>,
}

impl<'a> Unique<'a> {
    fn with_capacity(n: usize) -> Unique<'a> {
        Unique {
            groups: Vec::new(),
            seen: std::collections::HashSet::with_capacity_and_hasher(n, Default::default()),
        }
    }

    fn check(
        &mut self,
        table: &'static str,
        field: &'static str,
        value: Option<&'a str>,
    ) -> Option<(String, String)> {
        let v = value?;
        let g = match self.groups.iter().position(|x| *x == (table, field)) {
            Some(g) => g,
            None => {
                self.groups.push((table, field));
                self.groups.len() - 1
            }
        };
        if self.seen.insert((g as u16, v)) {
            return None;
        }
        let what = if field == "id" { "primary key" } else { field };
        Some((
            "@entity".into(),
            format!(
                "uniqueness violation: '{table}' entity with {what} set to '{v}' already declared"
            ),
        ))
    }
}

/// The running config's routes and consumers by id, and its credentials by id and by their
/// endpoint key (a key-auth key's id is random when the file gives none).
pub(super) struct Previous<'p> {
    cfg: &'p Config,
    routes: std::collections::HashMap<&'p str, usize, foldhash::fast::RandomState>,
    consumers: std::collections::HashMap<&'p str, usize, foldhash::fast::RandomState>,
    credentials: std::collections::HashMap<(&'p str, &'p str), usize, foldhash::fast::RandomState>,
}

impl<'p> Previous<'p> {
    fn new(cfg: &'p Config, plugins: &dyn PluginRegistry) -> Previous<'p> {
        let ids = |ids: Vec<&'p str>| ids.into_iter().enumerate().map(|(i, id)| (id, i)).collect();
        let mut credentials = std::collections::HashMap::default();
        for (i, c) in cfg.credentials.iter().enumerate() {
            credentials.insert(("", c.id.as_str()), i);
            let key = plugins
                .entities()
                .iter()
                .find(|e| e.spec.table == c.table)
                .and_then(|e| e.spec.endpoint_key)
                .and_then(|k| c.fields.get(k))
                .and_then(|v| v.as_str());
            if let Some(k) = key {
                credentials.insert((c.table, k), i);
            }
        }
        Previous {
            cfg,
            routes: ids(cfg.routes.iter().map(|r| r.id.as_str()).collect()),
            consumers: ids(cfg.consumers.iter().map(|c| c.id.as_str()).collect()),
            credentials,
        }
    }

    /// The running consumer when it equals `c` but for its timestamps; otherwise `c`.
    fn share_consumer(&self, mut c: Consumer) -> Arc<Consumer> {
        let Some(&i) = self.consumers.get(c.id.as_str()) else {
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
        let by_key = spec
            .spec
            .endpoint_key
            .and_then(|k| c.fields.get(k))
            .and_then(|v| v.as_str())
            .and_then(|k| self.credentials.get(&(c.table, k)));
        let Some(&i) = self.credentials.get(&("", c.id.as_str())).or(by_key) else {
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
        let Some(&i) = self.routes.get(r.id.as_str()) else {
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
