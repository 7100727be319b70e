//! A loaded configuration: its entities, its export, and changes applied to it row by row.

use serde_json::{Map, Value};

use super::*;

/// A validated, fully-resolved configuration: every reference is an id, every default filled.
#[derive(Debug, Clone, Default)]
pub struct Config {
    pub format_version: String,
    pub transform: bool,
    pub services: Vec<Service>,
    /// Shared: a config patched by one change (`apply_change`) and the snapshots built from it
    /// share all but the changed part of the list ([`SharedList`]).
    pub routes: SharedList<Route>,
    pub upstreams: Vec<Upstream>,
    pub targets: Vec<Target>,
    pub consumers: SharedList<Consumer>,
    pub plugins: Vec<Plugin>,
    pub certificates: Vec<Certificate>,
    pub snis: Vec<Sni>,
    pub ca_certificates: Vec<CaCertificate>,
    pub credentials: SharedList<Credential>,
    /// Key sets, keys and vaults ([`records`]).
    pub records: Vec<records::Record>,
    /// A digest of the input, as Kong's `configuration_hash` (32 hex characters).
    pub hash: String,
    /// Stored entities that no longer validate and were left out when the config was read
    /// from a database (one line each): a config is applied without them, never refused whole.
    pub left_out: Vec<String>,
    /// Where each route, consumer and credential stands, by id (see [`Positions`]).
    pub positions: ListPositions,
}

/// [`Positions`] of the config's [`SharedList`]s.
#[derive(Debug, Clone, Default)]
pub struct ListPositions {
    pub routes: Positions,
    pub consumers: Positions,
    pub credentials: Positions,
}

/// A list of the config's largest kinds (routes, consumers, credentials): a persistent vector
/// (a tree of shared chunks) of shared entities. A copy shares the whole; a change copies one
/// chunk and its path. With a plain vector of `Arc`s, the copy the database sync makes of the
/// running config for every write, and the drop of the one it replaces, touched the counts of
/// 100k routes each time: two thirds of a node's CPU under 50 writes a second at 100k routes.
pub type SharedList<T> = imbl::Vector<std::sync::Arc<T>>;

/// What one step of changes (`Config::apply_change` per changed row) did to a config: the
/// data plane patches what it compiled from the config named `from` (its `hash`) rather than
/// compiling the whole again.
#[derive(Debug, Default, Clone)]
pub struct Changes {
    /// The `hash` of the config the changes were applied to.
    pub from: String,
    /// Ids of the routes added, updated or deleted.
    pub routes: Vec<String>,
    /// Whether any entity other than a route changed.
    pub others: bool,
}

impl Config {
    /// The entities as Kong's `POST /config` echoes them and `GET /config` exports them.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self.json()).unwrap_or(Value::Null)
    }

    /// The entities of one table (`services`, `keyauth_credentials`, ...) as [`Config::to_json`]
    /// has them, each made a value only when the iterator reaches it: the bulk import checks
    /// and writes them as it goes, so the 100 ms that turning 130k entities into values took
    /// before its first statement is spent while the database executes the previous one.
    pub fn table_json<'a>(&'a self, table: &'a str) -> Box<dyn Iterator<Item = Value> + 'a> {
        self.table(table).1
    }

    /// How many entities [`Config::table_json`] gives for `table`.
    pub fn table_len(&self, table: &str) -> usize {
        self.table(table).0
    }

    /// One table's entities: how many, and (lazily) their values.
    fn table<'a>(&'a self, table: &'a str) -> (usize, Box<dyn Iterator<Item = Value> + 'a>) {
        fn values<'a, T: serde::Serialize + 'a>(
            items: impl Iterator<Item = &'a T> + Clone + 'a,
        ) -> (usize, Box<dyn Iterator<Item = Value> + 'a>) {
            let len = items.clone().count();
            let values = items.map(|e| serde_json::to_value(e).unwrap_or(Value::Null));
            (len, Box::new(values))
        }
        match table {
            "services" => values(self.services.iter()),
            "routes" => values(self.routes.iter()),
            "upstreams" => values(self.upstreams.iter()),
            "targets" => values(self.targets.iter()),
            "consumers" => values(self.consumers.iter()),
            "plugins" => values(self.plugins.iter()),
            "certificates" => values(self.certificates.iter()),
            "snis" => values(self.snis.iter()),
            "ca_certificates" => values(self.ca_certificates.iter()),
            _ => match records::RECORDS.iter().position(|r| r.table == table) {
                Some(k) => values(self.records.iter().filter(move |r| r.spec == k)),
                None => values(self.credentials.iter().filter(move |c| c.table == table)),
            },
        }
    }

    /// The same, written straight to text by serde (`serde_json::to_vec(&cfg.json())`):
    /// building the values first cost 95 MB to echo a 10k-service config.
    pub fn json(&self) -> ConfigJson<'_> {
        ConfigJson(self)
    }
}

/// A config as Kong exports it: `_format_version`, `_transform`, then each non-empty list of
/// entities (credentials by table, in the order their tables first appear).
pub struct ConfigJson<'a>(&'a Config);

impl serde::Serialize for ConfigJson<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        struct Seq<I>(std::cell::Cell<Option<I>>);
        impl<I: Iterator<Item = T>, T: serde::Serialize> serde::Serialize for Seq<I> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq(self.0.take().into_iter().flatten())
            }
        }
        let c = self.0;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("_format_version", "3.0")?;
        m.serialize_entry("_transform", &false)?;
        macro_rules! list {
            ($name:expr, $v:expr) => {
                if !$v.is_empty() {
                    m.serialize_entry($name, &$v)?;
                }
            };
        }
        list!("services", c.services);
        list!("routes", c.routes);
        list!("upstreams", c.upstreams);
        list!("targets", c.targets);
        list!("consumers", c.consumers);
        list!("plugins", c.plugins);
        list!("certificates", c.certificates);
        list!("snis", c.snis);
        list!("ca_certificates", c.ca_certificates);
        let mut tables: Vec<&'static str> = Vec::new();
        for cr in &c.credentials {
            if !tables.contains(&cr.table) {
                tables.push(cr.table);
            }
        }
        for table in tables {
            let creds = c.credentials.iter().filter(move |cr| cr.table == table);
            m.serialize_entry(table, &Seq(std::cell::Cell::new(Some(creds))))?;
        }
        for (k, spec) in records::RECORDS.iter().enumerate() {
            if c.records.iter().any(|r| r.spec == k) {
                let list = c.records.iter().filter(move |r| r.spec == k);
                m.serialize_entry(spec.table, &Seq(std::cell::Cell::new(Some(list))))?;
            }
        }
        m.end()
    }
}

/// Checks a plugin's config against the plugin registry and fills in its defaults; returns
/// the violations (an unknown plugin, a bad config) as (field path, message).
pub fn check_plugin_config(plugins: &dyn PluginRegistry, p: &mut Plugin) -> Vec<(String, String)> {
    if p.name.is_empty() {
        return Vec::new();
    }
    let mut errs = check_plugin_protocols(plugins, p);
    errs.extend(check_config(plugins, p));
    errs
}

pub use crate::schema::HTTP_PROTOCOLS;

/// An HTTP-only plugin's `protocols` hold only HTTP ones (Kong refuses `tcp` for key-auth
/// with its set's element message, at the element's position).
fn check_plugin_protocols(plugins: &dyn PluginRegistry, p: &Plugin) -> Vec<(String, String)> {
    if !plugins.http_only(&p.name) {
        return Vec::new();
    }
    p.protocols
        .iter()
        .enumerate()
        .filter(|(_, proto)| !HTTP_PROTOCOLS.contains(&proto.as_str()))
        .map(|(i, _)| {
            (
                format!("protocols.{}", i + 1),
                format!("expected one of: {}", HTTP_PROTOCOLS.join(", ")),
            )
        })
        .collect()
}

fn check_config(plugins: &dyn PluginRegistry, p: &mut Plugin) -> Vec<(String, String)> {
    match plugins.check(&p.name, &p.config) {
        None => vec![(
            "name".into(),
            format!(
                "plugin '{}' not enabled; add it to the 'plugins' configuration property",
                p.name
            ),
        )],
        Some(Ok(full)) => {
            p.config = full;
            Vec::new()
        }
        Some(Err(v)) => v
            .into_iter()
            // A path with a leading `/` names a field of the plugin entity itself (Kong's
            // plugin-level entity checks, e.g. pre-function's `at_least_one_of`).
            .map(|(f, m)| match f.strip_prefix('/') {
                Some(top) => (top.to_string(), m),
                None => (format!("config.{f}"), m),
            })
            .collect(),
    }
}

/// Kong's message for a plugin that may not be scoped to a consumer (`typedefs.no_consumer`:
/// the authentication plugins, which run before a consumer is known, and a few others).
pub const NO_CONSUMER: &str = "value must be null";

/// The violation, if any, of scoping plugin `p` to a consumer.
pub fn check_plugin_scope(plugins: &dyn PluginRegistry, p: &Plugin) -> Option<(String, String)> {
    (p.consumer.is_some() && !plugins.allows_consumer(&p.name))
        .then(|| ("consumer".to_string(), NO_CONSUMER.to_string()))
}

/// Reads a stored foreign key (`{"id": ...}`) of an entity that the store has already checked.
fn stored_fk(map: &Map<String, Value>, field: &str) -> Option<ForeignKey> {
    // As the store keeps it (`{"id": ...}`), or as Kong's export writes it (the bare id).
    map.get(field)
        .and_then(|v| match v {
            Value::String(id) => Some(id.as_str()),
            other => other.get("id").and_then(|v| v.as_str()),
        })
        .map(ForeignKey::new)
}

/// Whether two entity ids are equal. Finding one id among 100k (a change applied to a big
/// config) spent most of its time calling `memcmp`: ids that differ (nearly all) differ in
/// their first eight bytes, compared here inline.
#[inline]
pub fn same_id(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    if a.len() >= 8 && a[..8] != b[..8] {
        return false;
    }
    a == b
}

/// Replaces the entity with `id` in `list`, or appends it.
fn replace_or_push<T>(list: &mut Vec<T>, id: &str, item: T, id_of: impl Fn(&T) -> &str) {
    match list.iter().position(|e| same_id(id_of(e), id)) {
        Some(i) => list[i] = item,
        None => list.push(item),
    }
}

/// The position of `id` in a [`SharedList`].
fn position_of<T: HasId>(list: &SharedList<T>, pos: &mut Positions, id: &str) -> Option<usize> {
    pos.find(list.len(), |i| list.get(i).map(|e| e.entity_id()), id)
}

/// [`replace_or_push`] for a [`SharedList`], found by its [`Positions`].
fn replace_or_push_shared<T: HasId>(
    list: &mut SharedList<T>,
    pos: &mut Positions,
    id: &str,
    item: std::sync::Arc<T>,
) {
    match position_of(list, pos, id) {
        Some(i) => {
            list.set(i, item);
        }
        None => {
            list.push_back(item);
            pos.pushed(id, list.len() - 1);
        }
    }
}

/// Removes the entity `id` from a [`SharedList`], keeping the others' order (among routes of
/// equal priority and creation time, the order decides which matches).
fn remove_shared<T: HasId>(list: &mut SharedList<T>, pos: &mut Positions, id: &str) {
    if let Some(i) = position_of(list, pos, id) {
        list.remove(i);
        pos.removed(id);
    }
}

/// An entity's `id`, for the lists searched by it.
pub trait HasId {
    fn entity_id(&self) -> &str;
}

impl HasId for Route {
    fn entity_id(&self) -> &str {
        &self.id
    }
}

impl HasId for Consumer {
    fn entity_id(&self) -> &str {
        &self.id
    }
}

impl HasId for Credential {
    fn entity_id(&self) -> &str {
        &self.id
    }
}

impl Config {
    /// The route `id`, found by its position (not a scan of the routes).
    pub fn route(&mut self, id: &str) -> Option<&std::sync::Arc<Route>> {
        let at = position_of(&self.routes, &mut self.positions.routes, id)?;
        self.routes.get(at)
    }

    /// Applies one stored entity's change to a loaded config: `Some(entity)` inserts or
    /// replaces it, `None` removes it. For the database sync, whose rows were validated when
    /// written and whose references and unique keys the database enforces: only the changed
    /// entity is read again, instead of the whole config (which costs ~70 ms at 10k routes).
    pub fn apply_change(
        &mut self,
        table: &str,
        id: &str,
        entity: Option<&Map<String, Value>>,
        plugins: &dyn PluginRegistry,
    ) -> Result<(), String> {
        let Some(kind) = Kind::from_table(table, plugins) else {
            return Err(format!("unknown table {table}"));
        };
        let Some(map) = entity else {
            match kind {
                Kind::Service => self.services.retain(|e| !same_id(&e.id, id)),
                Kind::Route => remove_shared(&mut self.routes, &mut self.positions.routes, id),
                Kind::Upstream => self.upstreams.retain(|e| !same_id(&e.id, id)),
                Kind::Target => self.targets.retain(|e| !same_id(&e.id, id)),
                Kind::Consumer => {
                    remove_shared(&mut self.consumers, &mut self.positions.consumers, id)
                }
                Kind::Plugin => self.plugins.retain(|e| !same_id(&e.id, id)),
                Kind::Certificate => self.certificates.retain(|e| !same_id(&e.id, id)),
                Kind::Sni => self.snis.retain(|e| !same_id(&e.id, id)),
                Kind::CaCertificate => self.ca_certificates.retain(|e| !same_id(&e.id, id)),
                Kind::Credential(_) => {
                    remove_shared(&mut self.credentials, &mut self.positions.credentials, id)
                }
                Kind::Record(_) => self.records.retain(|e| !same_id(&e.id, id)),
            }
            return Ok(());
        };
        let now = now_secs();
        let fail = |errs: Vec<(String, String)>| -> Result<(), String> {
            if errs.is_empty() {
                Ok(())
            } else {
                let list: Vec<String> = errs.iter().map(|(f, m)| format!("{f}: {m}")).collect();
                Err(format!("{table} {id}: {}", list.join("; ")))
            }
        };
        match kind {
            Kind::Service => {
                let (e, errs) = entities::service(map, id, now);
                fail(errs)?;
                replace_or_push(&mut self.services, id, e, |x| &x.id);
            }
            Kind::Route => {
                let (mut e, _, errs) = entities::route(map, id, now, plugins.router_flavor());
                fail(errs)?;
                e.service = stored_fk(map, "service");
                replace_or_push_shared(
                    &mut self.routes,
                    &mut self.positions.routes,
                    id,
                    std::sync::Arc::new(e),
                );
            }
            Kind::Upstream => {
                let (e, errs) = entities::upstream(map, id, now);
                fail(errs)?;
                replace_or_push(&mut self.upstreams, id, e, |x| &x.id);
            }
            Kind::Target => {
                let (mut e, _, errs) = entities::target(map, id, now * 1000);
                fail(errs)?;
                e.upstream = stored_fk(map, "upstream").unwrap_or(ForeignKey::new(String::new()));
                replace_or_push(&mut self.targets, id, e, |x| &x.id);
            }
            Kind::Consumer => {
                let (e, errs) = entities::consumer(map, id, now);
                fail(errs)?;
                replace_or_push_shared(
                    &mut self.consumers,
                    &mut self.positions.consumers,
                    id,
                    std::sync::Arc::new(e),
                );
            }
            Kind::Plugin => {
                let (mut e, _, errs) = entities::plugin(map, id, now);
                fail(errs)?;
                fail(check_plugin_config(plugins, &mut e))?;
                e.route = stored_fk(map, "route");
                e.service = stored_fk(map, "service");
                e.consumer = stored_fk(map, "consumer");
                replace_or_push(&mut self.plugins, id, e, |x| &x.id);
            }
            Kind::Certificate => {
                let (e, _, errs) = entities::certificate(map, id, now);
                fail(errs)?;
                replace_or_push(&mut self.certificates, id, e, |x| &x.id);
            }
            Kind::Sni => {
                let (mut e, _, errs) = entities::sni(map, id, now);
                fail(errs)?;
                e.certificate =
                    stored_fk(map, "certificate").unwrap_or(ForeignKey::new(String::new()));
                replace_or_push(&mut self.snis, id, e, |x| &x.id);
            }
            Kind::CaCertificate => {
                let (e, errs) = entities::ca_certificate(map, id, now);
                fail(errs)?;
                replace_or_push(&mut self.ca_certificates, id, e, |x| &x.id);
            }
            Kind::Credential(k) => {
                let (mut e, _, errs) = entities::credential(k, map, id, now);
                fail(errs)?;
                e.consumer = stored_fk(map, "consumer").unwrap_or(ForeignKey::new(String::new()));
                replace_or_push_shared(
                    &mut self.credentials,
                    &mut self.positions.credentials,
                    id,
                    std::sync::Arc::new(e),
                );
            }
            Kind::Record(k) => {
                let (mut e, _, errs) = records::read(k, map, id, now);
                fail(errs)?;
                if let Some((p, _)) = records::RECORDS[k].parent {
                    if let Some(fk) = stored_fk(map, p) {
                        e.fields.insert(p.into(), serde_json::json!({"id": fk.id}));
                    }
                }
                replace_or_push(&mut self.records, id, e, |x| &x.id);
            }
        }
        Ok(())
    }
}

/// An entity's timestamps, set aside when two versions of it are compared.
trait Stamps: PartialEq {
    type T: Copy;
    fn stamps(&self) -> Self::T;
    fn set_stamps(&mut self, t: Self::T);
}

macro_rules! stamps {
    ($($ty:ty: $t:ty, $($f:ident),+;)*) => {$(
        impl Stamps for $ty {
            type T = $t;
            fn stamps(&self) -> $t {
                ($(self.$f),+)
            }
            #[allow(unused_parens)]
            fn set_stamps(&mut self, t: $t) {
                ($(self.$f),+) = t;
            }
        }
    )*};
}

stamps! {
    Service: (i64, i64), created_at, updated_at;
    Route: (i64, i64), created_at, updated_at;
    Upstream: (i64, i64), created_at, updated_at;
    Target: (f64, f64), created_at, updated_at;
    Consumer: (i64, i64), created_at, updated_at;
    Plugin: (i64, i64), created_at, updated_at;
    Certificate: (i64, i64), created_at, updated_at;
    Sni: (i64, i64), created_at, updated_at;
    CaCertificate: (i64, i64), created_at, updated_at;
    Credential: i64, created_at;
    records::Record: (i64, i64), created_at, updated_at;
}

/// Whether `new` is `old` but for its timestamps; if so it takes `old`'s, so that an entity
/// a reload leaves alone keeps its `created_at` (and its place among routes of equal
/// priority, which `created_at` orders).
fn unchanged<E: Stamps>(new: &mut E, old: &E) -> bool {
    let mine = new.stamps();
    new.set_stamps(old.stamps());
    if new == old {
        return true;
    }
    new.set_stamps(mine);
    false
}

/// Whether two lists hold the same entities in the same order, timestamps aside; every
/// unchanged entity of `new` takes its timestamps from `old`.
fn same_list<E: Stamps>(new: &mut [E], old: &[E]) -> bool {
    let mut same = new.len() == old.len();
    for (n, o) in new.iter_mut().zip(old) {
        same &= unchanged(n, o);
    }
    same
}

/// Like `same_list`, for entities kept in `Arc`s: an unchanged entity of `new` becomes
/// `old`'s, shared rather than held twice.
fn same_shared_list<E: Stamps + Clone>(new: &mut SharedList<E>, old: &SharedList<E>) -> bool {
    let mut same = new.len() == old.len();
    for (n, o) in new.iter_mut().zip(old) {
        if std::sync::Arc::ptr_eq(n, o) {
            continue;
        }
        if unchanged(std::sync::Arc::make_mut(n), o) {
            *n = o.clone();
        } else {
            same = false;
        }
    }
    same
}

/// The most changed routes a reload patches into the running router; more are compiled
/// whole (the patch looks each changed route up in the running config).
pub const MAX_PATCHED_ROUTES: usize = 1000;

impl Config {
    /// What a whole new config (a `POST /config` or a reloaded file) changes of `old`, the
    /// running one, when the data plane can patch what it built from `old` rather than build
    /// it all again: the routes added, changed or removed (at most [`MAX_PATCHED_ROUTES`],
    /// the others in the same order), and whether anything else changed. Unchanged routes are
    /// the running config's own (shared, not held twice), and unchanged entities keep their
    /// timestamps. `None` when the whole must be compiled.
    pub fn changes_from(&mut self, old: &Config) -> Option<Changes> {
        use std::sync::Arc;
        let mut others = self.format_version != old.format_version;
        others |= !same_list(&mut self.services, &old.services);
        others |= !same_list(&mut self.upstreams, &old.upstreams);
        others |= !same_list(&mut self.targets, &old.targets);
        others |= !same_shared_list(&mut self.consumers, &old.consumers);
        others |= !same_list(&mut self.plugins, &old.plugins);
        others |= !same_list(&mut self.certificates, &old.certificates);
        others |= !same_list(&mut self.snis, &old.snis);
        others |= !same_list(&mut self.ca_certificates, &old.ca_certificates);
        others |= !same_shared_list(&mut self.credentials, &old.credentials);
        others |= !same_list(&mut self.records, &old.records);
        let by_id: std::collections::HashMap<&str, usize, foldhash::fast::RandomState> = old
            .routes
            .iter()
            .enumerate()
            .map(|(i, r)| (r.id.as_str(), i))
            .collect();
        let mut kept = vec![false; old.routes.len()];
        let mut routes = Vec::new();
        let mut last = None;
        for r in &mut self.routes {
            let Some(&i) = by_id.get(r.id.as_str()) else {
                routes.push(r.id.clone());
                continue;
            };
            // Kept routes in another order: file order breaks ties between routes.
            if last.is_some_and(|l| l > i) {
                return None;
            }
            last = Some(i);
            kept[i] = true;
            let old_route = &old.routes[i];
            // Shared as it was read (`load_json_streaming_against`), or equal.
            if Arc::ptr_eq(r, old_route) || unchanged(Arc::make_mut(r), old_route) {
                *r = old_route.clone();
            } else {
                routes.push(r.id.clone());
            }
            if routes.len() > MAX_PATCHED_ROUTES {
                return None;
            }
        }
        routes.extend(
            old.routes
                .iter()
                .zip(&kept)
                .filter(|(_, k)| !**k)
                .map(|(r, _)| r.id.clone()),
        );
        (routes.len() <= MAX_PATCHED_ROUTES).then(|| Changes {
            from: old.hash.clone(),
            routes,
            others,
        })
    }
}
