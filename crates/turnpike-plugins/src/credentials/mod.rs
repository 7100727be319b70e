//! Credentials of a database node: looked up by unique key in the store on first use and kept
//! in a bounded cache, so that a credential table of any size costs neither snapshot memory
//! nor rebuild time, and the steady state never waits on the database.
//!
//! Kong's lesson (token look-ups through a general data layer took sites down): one look-up
//! by a unique column per credential, then memory. Misses are cached too (negative entries:
//! a client repeating a wrong key costs one query, not one per request). Entries are dropped
//! exactly when the store says their row or their consumer changed (the config sync's change
//! log, through [`crate::Registry`]'s `invalidate`), and can also be refreshed after
//! `db_cache_ttl`/`db_cache_neg_ttl` (Kong's properties; 0, the default, never). When the
//! database is down, cached entries keep serving, stale ones included; a credential never seen
//! before gets Kong's 500.
//!
//! DB-less nodes do not use this: their credentials come with the declarative file, in the
//! snapshot.

use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

/// A credential row found in the store, with its consumer's identity fields.
#[derive(Debug, Clone)]
pub struct Found {
    pub id: String,
    pub fields: Map<String, Value>,
    pub consumer_id: String,
    pub username: Option<String>,
    pub custom_id: Option<String>,
}

pub type Lookup = Pin<Box<dyn Future<Output = Result<Option<Found>, String>> + Send>>;

/// The store, as the data plane sees it: a look-up by one unique column, and the writes of
/// the entities the data plane itself makes (oauth2's tokens and authorization codes).
pub trait CredentialSource: Send + Sync {
    fn find(&self, table: &'static str, field: &'static str, value: String) -> Lookup;
    /// The database's name as Kong's `db.system` span attribute gives it (`postgres`).
    fn system(&self) -> &'static str {
        "postgres"
    }
    /// One write, validated and stored as an Admin API write is; answers the stored entity
    /// (`None` for a delete).
    fn write(&self, write: Write) -> Written;
}

/// A write of the data plane (each one transaction of the store).
#[derive(Debug)]
pub enum Write {
    Insert {
        table: &'static str,
        entity: Map<String, Value>,
    },
    /// Merges `patch` into the entity `id`.
    Update {
        table: &'static str,
        id: String,
        patch: Map<String, Value>,
    },
    Delete {
        table: &'static str,
        id: String,
    },
}

pub type Written = Pin<Box<dyn Future<Output = Result<Option<Map<String, Value>>, String>> + Send>>;

/// One store look-up a plugin made for a request: what Kong's `kong.database.query` span
/// says of it (the `db_query` instrumentation).
#[derive(Debug, Clone)]
pub struct DbQuery {
    pub start: Instant,
    pub end: Instant,
    pub system: &'static str,
    pub table: &'static str,
    pub field: &'static str,
}

impl DbQuery {
    /// The statement, as the store runs it (by one unique column).
    pub fn statement(&self) -> String {
        format!("SELECT * FROM {} WHERE {} = $1", self.table, self.field)
    }
}

/// Keeps a look-up (when there was one) with the request, in its plugin context, for a
/// tracing plugin's log phase.
pub fn record(query: Option<DbQuery>, req: &mut crate::AccessRequest<'_>) {
    let Some(q) = query else { return };
    match req.ctx.get_mut::<DbQueries>() {
        Some(all) => all.0.push(q),
        None => req.ctx.insert(DbQueries(vec![q])),
    }
}

/// The store look-ups made for a request, in order.
#[derive(Debug, Default)]
pub struct DbQueries(pub Vec<DbQuery>);

/// Cache settings (Kong's `db_cache_ttl`, `db_cache_neg_ttl`, `mem_cache_size`).
#[derive(Debug, Clone, Copy)]
pub struct CacheSettings {
    /// Refresh found entries after this; `None`: never (invalidation keeps them right).
    pub ttl: Option<Duration>,
    /// Refresh negative entries after this; `None`: never.
    pub neg_ttl: Option<Duration>,
    /// Bound on the cache's approximate size in bytes.
    pub max_bytes: u64,
}

struct Installed {
    source: Arc<dyn CredentialSource>,
    settings: CacheSettings,
}

/// Where a node's credentials come from: a store (a database node, set at start with
/// [`Store::install`]) or, when none is installed, the snapshot. Part of the plugins'
/// [`crate::Runtime`].
#[derive(Default)]
pub struct Store {
    installed: OnceLock<Installed>,
    /// Bumped by every invalidation: a look-up that started before one does not cache its
    /// answer, which may predate the change.
    generation: AtomicU64,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.installed() {
            "credentials::Store(installed)"
        } else {
            "credentials::Store(none)"
        })
    }
}

impl Store {
    /// Makes this node look credentials up in `source` (a database node, at start).
    pub fn install(&self, source: Arc<dyn CredentialSource>, settings: CacheSettings) {
        let _ = self.installed.set(Installed { source, settings });
    }

    /// Whether credentials come from a store (and so not from the snapshot).
    pub fn installed(&self) -> bool {
        self.installed.get().is_some()
    }

    /// A row by one of its unique columns, uncached (what is read once and then changed: an
    /// authorization code, a refresh token).
    pub async fn find(
        &self,
        table: &'static str,
        field: &'static str,
        value: String,
    ) -> Result<Option<Found>, String> {
        let installed = self.installed.get().ok_or("no credential store")?;
        installed.source.find(table, field, value).await
    }

    /// Writes through the installed store.
    pub async fn write(&self, write: Write) -> Result<Option<Map<String, Value>>, String> {
        let installed = self.installed.get().ok_or("no credential store")?;
        installed.source.write(write).await
    }
}

/// A cached answer: the value (`None`: no such credential) and when it was fetched.
#[derive(Clone)]
pub struct Entry<V> {
    pub value: Option<V>,
    /// Milliseconds since the cache's epoch ([`Cache::now`]).
    fetched: u64,
    /// A credential with a `ttl` (key-auth keys): it stops working then on this node too,
    /// whatever the cache's own TTL (as `fetched`; `u64::MAX`: never).
    expires: u64,
    /// The credential's and its consumer's ids, and the stored value looked up (a key's
    /// digest, a username), for invalidation.
    credential_id: Option<RowId>,
    consumer_id: Option<Arc<str>>,
    lookup: Arc<str>,
    /// Its number in the index by row ([`Cache::indexed_by_row`]; 0 without one).
    row: u64,
}

/// Bytes of a cached credential, unless its cache says otherwise: the key presented, its
/// stored form, the credential's identity, the cache's own bookkeeping (its arrays' growth
/// headroom included). key-auth's take 632 (`a_cached_key_weighs_what_it_takes`, glibc's
/// count; 973 in moka, first counted at 512). basic-auth, hmac-auth, jwt and oauth2 count
/// their own, measured alike.
pub const DEFAULT_WEIGHT: u32 = 704;

/// Bytes of a cached miss (a key that no credential has), unless its cache says otherwise
/// ([`Cache::missing_weighs`]): the key, its stored form, the cache's bookkeeping. key-auth's
/// take 342 (its stored form is a digest; `a_cached_miss_weighs_what_it_takes`; 571 in moka).
/// They were first counted at 96: a flood of made-up keys filled about 5 times
/// `mem_cache_size`.
pub const MISS_WEIGHT: u32 = 384;

/// Row id -> the key of its entry, and that entry's number.
type RowIndex<K> = dashmap::DashMap<RowId, (K, u64)>;

/// A row's id as the cache keeps it: a UUID (what the store draws) in its 16 bytes, any other
/// id as text. Half a million cached tokens held their ids in 32 MB of 36-byte strings.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum RowId {
    /// As two halves: a `u128`'s alignment would make the id, and every entry, 8 bytes larger.
    Uuid([u64; 2]),
    Text(Arc<str>),
}

impl RowId {
    fn new(id: &str) -> RowId {
        uuid_bits(id).map_or_else(|| RowId::Text(Arc::from(id)), RowId::Uuid)
    }

    fn is(&self, id: &str) -> bool {
        match self {
            RowId::Uuid(u) => uuid_bits(id) == Some(*u),
            RowId::Text(t) => &**t == id,
        }
    }

    /// The id as the store writes it.
    fn text(&self) -> String {
        match self {
            RowId::Uuid([hi, lo]) => uuid::Uuid::from_u128(u128::from(*hi) << 64 | u128::from(*lo))
                .hyphenated()
                .to_string(),
            RowId::Text(t) => t.to_string(),
        }
    }
}

/// The bits of a UUID written as the store writes it (lower-case, hyphenated); `None` for
/// any other text, which then stays text (so that one id has one form).
fn uuid_bits(id: &str) -> Option<[u64; 2]> {
    let b = id.as_bytes();
    if b.len() != 36 {
        return None;
    }
    let mut bits = 0u128;
    for (i, &c) in b.iter().enumerate() {
        let digit = match c {
            b'-' if matches!(i, 8 | 13 | 18 | 23) => continue,
            b'0'..=b'9' if !matches!(i, 8 | 13 | 18 | 23) => c - b'0',
            b'a'..=b'f' if !matches!(i, 8 | 13 | 18 | 23) => c - b'a' + 10,
            _ => return None,
        };
        bits = bits << 4 | u128::from(digit);
    }
    Some([(bits >> 64) as u64, bits as u64])
}

/// The entries: quick_cache, whose bookkeeping is a slot in an array and an index in its table
/// (moka's took ~224 of a cached token's 823 bytes: its access-order and write-order queues'
/// nodes, its frequency sketch, its hash table's buckets). With the other savings, the default
/// `mem_cache_size` holds about half as many tokens again.
type Entries<K, V> =
    quick_cache::sync::Cache<K, Entry<V>, Weigher<V>, quick_cache::DefaultHashBuilder, Unindex<K>>;

/// Bytes of an entry, against `mem_cache_size`.
#[derive(Clone)]
struct Weigher<V> {
    /// Approximate bytes of a found entry (key, value, the map's overhead).
    found: u32,
    /// A found entry's bytes by its value, where they differ by kind (a jwt secret with a
    /// parsed public key against an HMAC one); `found` otherwise.
    weigh: Option<fn(&V) -> u32>,
    /// Approximate bytes of a negative entry.
    missing: u32,
}

impl<K, V> quick_cache::Weighter<K, Entry<V>> for Weigher<V> {
    fn weight(&self, _: &K, e: &Entry<V>) -> u64 {
        u64::from(match (&e.value, self.weigh) {
            (Some(v), Some(weigh)) => weigh(v),
            (Some(_), None) => self.found,
            (None, _) => self.missing,
        })
    }
}

/// Takes an evicted entry out of the index by row, unless the index already names a newer
/// entry of its row.
#[derive(Clone)]
struct Unindex<K>(Option<Arc<RowIndex<K>>>);

impl<K: Hash + Eq, V> quick_cache::Lifecycle<K, Entry<V>> for Unindex<K> {
    /// The evicted entries, dropped once the cache's lock is released.
    type RequestState = [Option<Entry<V>>; 2];

    fn begin_request(&self) -> Self::RequestState {
        [None, None]
    }

    fn on_evict(&self, state: &mut Self::RequestState, _: K, e: Entry<V>) {
        if let (Some(rows), Some(id)) = (&self.0, &e.credential_id) {
            rows.remove_if(id, |_, (_, row)| *row == e.row);
        }
        if let Some(slot) = state.iter_mut().find(|s| s.is_none()) {
            *slot = Some(e);
        }
    }
}

/// One credential table's cache.
pub struct Cache<K, V> {
    store: Arc<Store>,
    table: &'static str,
    field: &'static str,
    /// Bytes of an entry, against `mem_cache_size`.
    weigher: Weigher<V>,
    entries: OnceLock<Entries<K, V>>,
    /// Row id -> key of its cached entry, for tables written at a high rate (oauth2 tokens):
    /// a write then drops its entries by key, where a scan of the whole cache per write
    /// (`invalidate_entries_if`) cost more than the reads it served.
    /// With each key, the number of the entry it indexes: an entry's removal is reported
    /// later (at the cache's next housekeeping), by when a new entry of the same row and key
    /// may be in its place, whose index it must not remove.
    rows: Option<Arc<RowIndex<K>>>,
    /// The last entry number given.
    row_numbers: AtomicU64,
    /// What entries' times count from.
    epoch: Instant,
    /// Bumped by a write of a row ([`Cache::invalidate_row`]) at the stripes of the row's id
    /// and of the key it was written under: a look-up that started before and meets either
    /// does not cache its answer, while look-ups of other rows and keys still do (with one
    /// count for the whole store, a thousand token writes a second left nothing cached).
    stripes: [AtomicU64; STRIPES],
    /// Ids that many entries share (a consumer's, a service's), one allocation each rather
    /// than one an entry: 64 of a cached oauth2 token's bytes.
    shared_ids: moka::sync::Cache<Box<str>, Arc<str>>,
}

/// Stripes of [`Cache::stripes`]: a look-up of ~2 ms under 1,000 writes a second loses its
/// answer about once in 16.
const STRIPES: usize = 64;

/// What a look-up found.
pub enum Outcome<V> {
    Found(V),
    Missing,
    /// The store failed and nothing was cached.
    Failed(String),
}

impl<K, V> Cache<K, V>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    pub fn new(store: Arc<Store>, table: &'static str, field: &'static str) -> Cache<K, V> {
        Cache::weighing(store, table, field, DEFAULT_WEIGHT)
    }

    /// A cache whose found entries weigh about `weight` bytes each (a credential whose
    /// identity is shared with others weighs less than one with its own).
    pub fn weighing(
        store: Arc<Store>,
        table: &'static str,
        field: &'static str,
        weight: u32,
    ) -> Cache<K, V> {
        Cache {
            store,
            table,
            field,
            weigher: Weigher {
                found: weight,
                weigh: None,
                missing: MISS_WEIGHT,
            },
            entries: OnceLock::new(),
            rows: None,
            row_numbers: AtomicU64::new(0),
            epoch: Instant::now(),
            stripes: std::array::from_fn(|_| AtomicU64::new(0)),
            shared_ids: moka::sync::Cache::new(10_000),
        }
    }

    /// `id` as the one shared copy this cache holds of it.
    pub fn shared_id(&self, id: &str) -> Arc<str> {
        if let Some(shared) = self.shared_ids.get(id) {
            return shared;
        }
        let shared: Arc<str> = Arc::from(id);
        self.shared_ids.insert(id.into(), shared.clone());
        shared
    }

    /// Milliseconds since the cache's epoch, as entries keep their times.
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn stripe_of<Q: Hash + ?Sized>(key: &Q) -> usize {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let h = BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
            .hash_one(key);
        h as usize % STRIPES
    }

    fn stripe<Q: Hash + ?Sized>(&self, key: &Q) -> &AtomicU64 {
        &self.stripes[Self::stripe_of(key)]
    }

    /// The counts a look-up's answer is cached against: the store's, then every stripe's (the
    /// row's id is known only once found).
    fn generations(&self) -> Vec<u64> {
        std::iter::once(&self.store.generation)
            .chain(&self.stripes)
            .map(|g| g.load(Ordering::Acquire))
            .collect()
    }

    /// Whether no invalidation met the key or the row since `before` ([`Cache::generations`]).
    fn unchanged<Q: Hash + ?Sized>(&self, before: &[u64], key: &Q, id: Option<&str>) -> bool {
        let at = |i: usize| before[1 + i] == self.stripes[i].load(Ordering::Acquire);
        before[0] == self.store.generation.load(Ordering::Acquire)
            && at(Self::stripe_of(key))
            && id.is_none_or(|id| at(Self::stripe_of(id)))
    }

    /// Weighs each found entry by `weigh` (its value's bytes with the entry's own).
    pub fn weighed_by(mut self, weigh: fn(&V) -> u32) -> Self {
        self.weigher.weigh = Some(weigh);
        self
    }

    /// Counts each negative entry at `weight` bytes (its key's size differs by plugin).
    pub fn missing_weighs(mut self, weight: u32) -> Self {
        self.weigher.missing = weight;
        self
    }

    /// Keeps an index from row id to key, so that [`Cache::invalidate_row`] needs no scan.
    pub fn indexed_by_row(mut self) -> Self {
        self.rows = Some(Arc::default());
        self
    }

    fn entries(&self) -> &Entries<K, V> {
        self.entries.get_or_init(|| {
            let max = self
                .store
                .installed
                .get()
                .map_or(16 << 20, |i| i.settings.max_bytes)
                .max(1 << 20);
            let options = quick_cache::OptionsBuilder::new()
                .estimated_items_capacity((max / u64::from(self.weigher.found)) as usize)
                .weight_capacity(max)
                // Evicted keys remembered (a key asked for again soon after its eviction is
                // let in as hot): a quarter of the entries, where quick_cache's default half
                // took ~60 bytes a token of a full cache, each in an entry's slot.
                .ghost_allocation(0.25)
                .build()
                .expect("cache options");
            quick_cache::sync::Cache::with_options(
                options,
                self.weigher.clone(),
                Default::default(),
                Unindex(self.rows.clone()),
            )
        })
    }

    /// The cached answer, if any and still fresh.
    pub fn get<Q>(&self, key: &Q) -> Option<Entry<V>>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let e = self.entries().get(key)?;
        // The clock is read only for an entry that can run out (a key with a `ttl`, a
        // `db_cache_ttl`): most hits read none.
        if e.expires != u64::MAX && self.now() >= e.expires {
            return None;
        }
        let ttl = self.store.installed.get().and_then(|i| {
            if e.value.is_some() {
                i.settings.ttl
            } else {
                i.settings.neg_ttl
            }
        });
        match ttl {
            Some(t) if u128::from(self.now().saturating_sub(e.fetched)) > t.as_millis() => None,
            _ => Some(e),
        }
    }

    /// Looks `value` up in the store (for `key`), caches the answer and returns it, filed
    /// under `token` (what a write of the credential invalidates: the value, or a form of it
    /// that every stored form maps to); `build` turns a found row into what the plugin keeps.
    /// A failed look-up serves a stale cached answer when there is one. With the answer, the
    /// look-up's times, for a `kong.database.query` span (`None`: no store to ask).
    pub async fn load(
        &self,
        key: K,
        value: String,
        token: impl Into<Arc<str>>,
        build: impl FnOnce(&Found) -> Option<V>,
    ) -> (Outcome<V>, Option<DbQuery>) {
        let Some(installed) = self.store.installed.get() else {
            return (Outcome::Failed("no credential store".into()), None);
        };
        let before = self.generations();
        let lookup: Arc<str> = token.into();
        let start = Instant::now();
        let found = installed.source.find(self.table, self.field, value).await;
        let query = Some(DbQuery {
            start,
            end: Instant::now(),
            system: installed.source.system(),
            table: self.table,
            field: self.field,
        });
        let outcome = match found {
            Ok(found) => {
                let now = self.now();
                let expires = found
                    .as_ref()
                    .and_then(|f| f.fields.get("ttl").and_then(|t| t.as_u64()))
                    .filter(|t| *t > 0)
                    .map_or(u64::MAX, |t| now.saturating_add(t.saturating_mul(1000)));
                let found_id = found.as_ref().map(|f| f.id.as_str());
                let (value, credential_id, consumer_id) = match &found {
                    Some(f) => (
                        build(f),
                        Some(RowId::new(&f.id)),
                        Some(self.shared_id(&f.consumer_id)),
                    ),
                    None => (None, None, None),
                };
                if self.unchanged(&before, &key, found_id) {
                    let mut row = 0;
                    if let (Some(rows), Some(id)) = (&self.rows, &credential_id) {
                        row = self.row_numbers.fetch_add(1, Ordering::Relaxed) + 1;
                        rows.insert(id.clone(), (key.clone(), row));
                    }
                    self.entries().insert(
                        key.clone(),
                        Entry {
                            value: value.clone(),
                            fetched: now,
                            expires,
                            credential_id,
                            consumer_id,
                            lookup,
                            row,
                        },
                    );
                    // An invalidation counts first, then drops: one that came between the
                    // check and the insert is seen now, and its drop is done here.
                    if !self.unchanged(&before, &key, found_id) {
                        self.entries().remove(&key);
                    }
                }
                match value {
                    Some(v) => Outcome::Found(v),
                    None => Outcome::Missing,
                }
            }
            // A stale answer while the store fails, unless the credential itself has expired.
            Err(e) => match self
                .entries()
                .get(&key)
                .filter(|en| self.now() < en.expires)
            {
                Some(Entry { value: Some(v), .. }) => Outcome::Found(v),
                Some(Entry { value: None, .. }) => Outcome::Missing,
                None => Outcome::Failed(e),
            },
        };
        (outcome, query)
    }

    /// Drops entries of a credential or consumer that changed, and those looked up by
    /// `lookup` (a negative answer for a key that now exists).
    pub fn invalidate(&self, id: &str, lookup: Option<&str>) {
        self.store.generation.fetch_add(1, Ordering::AcqRel);
        let Some(entries) = self.entries.get() else {
            return;
        };
        entries.retain(|_, e| {
            let drop = e.credential_id.as_ref().is_some_and(|c| c.is(id))
                || e.consumer_id.as_deref() == Some(id)
                || lookup == Some(&*e.lookup);
            if let (true, Some(rows), Some(id)) = (drop, &self.rows, &e.credential_id) {
                rows.remove_if(id, |_, (_, row)| *row == e.row);
            }
            !drop
        });
    }

    /// Drops the entries of one row that was written: the one under `lookup` (a negative
    /// answer for a key that now exists, or the row's own) and the one the row was cached
    /// under (its key may have changed, or it was deleted). By key, without a scan; needs
    /// [`Cache::indexed_by_row`] (else it scans, as [`Cache::invalidate`]).
    pub fn invalidate_row<Q>(&self, id: &str, lookup: Option<&Q>)
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let Some(rows) = &self.rows else {
            return self.invalidate(id, None);
        };
        // Counted first, then dropped (see `load`).
        if let Some(l) = lookup {
            self.stripe(l).fetch_add(1, Ordering::AcqRel);
        }
        self.stripe(id).fetch_add(1, Ordering::AcqRel);
        let Some(entries) = self.entries.get() else {
            return;
        };
        if let Some(l) = lookup {
            entries.remove(l);
        }
        if let Some((_, (key, _))) = rows.remove(&RowId::new(id)) {
            entries.remove(&key);
        }
    }

    /// What is cached under `key`, as Kong's `cache:probe` sees it (the Admin API's
    /// `GET /cache/{key}`): `None` when nothing (or nothing fresh), `Some(None)` for a
    /// remembered miss, `Some(Some(id))` for a credential, by its row's id.
    pub fn probe<Q>(&self, key: &Q) -> Option<Option<String>>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.entries.get()?;
        let e = self.get(key)?;
        Some(match e.value {
            Some(_) => Some(e.credential_id.as_ref()?.text()),
            None => None,
        })
    }

    /// Drops the entry under `key` alone (the Admin API's `DELETE /cache/{key}`); a look-up
    /// under way then does not file its answer (see `load`).
    pub fn forget<Q>(&self, key: &Q)
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.store.generation.fetch_add(1, Ordering::AcqRel);
        let Some(entries) = self.entries.get() else {
            return;
        };
        if let Some((_, e)) = entries.remove(key) {
            if let (Some(rows), Some(id)) = (&self.rows, &e.credential_id) {
                rows.remove_if(id, |_, (_, row)| *row == e.row);
            }
        }
    }

    pub fn invalidate_all(&self) {
        self.store.generation.fetch_add(1, Ordering::AcqRel);
        if let Some(entries) = self.entries.get() {
            entries.clear();
        }
        if let Some(rows) = &self.rows {
            rows.clear();
        }
    }

    pub fn debug_memory(&self) {
        let m = self.entries().memory_used();
        eprintln!(
            "DEBUG entries {} map {} rows cap {} sizeof entry {} rowid {}",
            m.entries,
            m.map,
            self.rows.as_ref().map_or(0, |r| r.capacity()),
            std::mem::size_of::<Entry<V>>(),
            std::mem::size_of::<Option<RowId>>()
        );
    }
    /// Entries held (for tests and status).
    pub fn len(&self) -> u64 {
        self.entries.get().map_or(0, |e| e.len() as u64)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests;
