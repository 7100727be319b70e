//! Config sync: turns the store's contents into the data plane's config whenever the config
//! version moves. A node learns of a change from its own writes (at once), from PostgreSQL's
//! LISTEN/NOTIFY (other nodes' writes, within milliseconds), and from a periodic version poll
//! (the fallback after a lost notification connection, Kong's `db_update_frequency`).
//!
//! Building the config (parsing the rows, validation, the router compile) runs on one dedicated
//! thread at the control plane's lower CPU priority ([`CONTROL_PLANE_NICE`]): neither the Admin API nor the proxy waits for it,
//! and when the cores are busy the proxy workers win, so a burst of writes delays the new
//! config a little rather than the traffic. The proxy keeps serving the previous snapshot until
//! the new one is swapped in. Every applied config is also written to the prefix so a node
//! that restarts while the database is down still serves its last good config.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{watch, Notify};
use turnpike_config::declarative::{self, Changes};
use turnpike_config::Config;

use crate::{Backend, Store, StoreError, NOTIFY_CHANNEL};

/// Installs a validated config into the data plane (the gateway's atomic swap). With
/// `Changes`, the config is the previous one with those changes applied, and the data plane
/// may patch what it compiled rather than compile the whole again.
pub type ApplyFn = dyn Fn(Config, Option<&Changes>) -> Result<(), String> + Send + Sync;

/// Work for the builder thread.
enum Job {
    /// Every row: build the config from scratch.
    Full {
        version: i64,
        raw: crate::crud::RawExport,
    },
    /// The rows changed since `from`: patch the config the builder holds (at `from`).
    Delta {
        from: i64,
        version: i64,
        delta: crate::crud::Delta,
    },
}

struct Build {
    job: Job,
    reply: tokio::sync::oneshot::Sender<Result<(), String>>,
}

/// The shortest time from one sync to the next: at 1,500 token writes a second, a sync per
/// write (five round trips) cost the node and PostgreSQL more than the writes themselves; a
/// change still reaches the data plane within milliseconds (Kong's `db_update_frequency` is
/// 5 s).
const SYNC_GAP: Duration = Duration::from_millis(10);

/// The shortest time to the next sync after one that found only cached credentials changed
/// (oauth2 tokens written by a token service, keys added): such writes come in streams, and
/// at 150 token writes a second a sync every [`SYNC_GAP`] was a sync per write, three of the
/// five statements a write cost (`bench/experiments/token-write-cost.sh`: 296–313 µs of the
/// node's CPU and 470–530 of PostgreSQL's a write before, 196–203 and 336–363 with this gap
/// and [`Announcer`]). A revoked token, or a config change that comes next, reaches the data
/// plane within this gap and [`NOTIFY_GAP`] of its write (measured on another node while
/// tokens stream in: up to 55 ms, against 14 before), inside the 100 ms propagation bound;
/// the first change after a quiet spell is applied at once, and after a sync that applied
/// config changes the gap is [`SYNC_GAP`] again.
const CREDENTIAL_SYNC_GAP: Duration = Duration::from_millis(50);

/// The shortest time from one NOTIFY of this node's writes to the next. A NOTIFY a write
/// cost PostgreSQL a heavyweight lock at commit, a signal to every listening backend and a
/// message to every node, each of which then woke to read it: at 1,500 token writes a second
/// that was a sixth of PostgreSQL's CPU per write, and it grows with the nodes listening. The
/// writes of one gap share one NOTIFY, sent after the first of them commits and again after
/// the last (a change reaches other nodes at most this much later; the propagation bound is
/// 100 ms).
pub const NOTIFY_GAP: Duration = Duration::from_millis(5);

/// A node's notifications to the other nodes ([`NOTIFY_GAP`] apart at most). The first write
/// of a gap carries its NOTIFY in the write's own statement (no round trip for it: at 150
/// token writes a second, each a gap apart, a separate NOTIFY was one of every write's
/// statements); a write within the gap leaves it to [`ConfigSync::announce`], which sends one
/// when the gap has passed. Every committed write is followed by a NOTIFY sent after its
/// commit: its own, delivered at the commit, or the announcer's, sent after it is told.
pub(crate) struct Announcer {
    /// Told after a committed write that sent no NOTIFY itself.
    pending: Notify,
    /// When the last NOTIFY was sent or claimed by a write, in milliseconds since `epoch` (0:
    /// none yet).
    last: std::sync::atomic::AtomicU64,
    epoch: std::time::Instant,
    /// [`NOTIFY_GAP`], in milliseconds.
    gap: u64,
}

impl Default for Announcer {
    fn default() -> Self {
        Announcer::with_gap(NOTIFY_GAP)
    }
}

impl Announcer {
    fn with_gap(gap: Duration) -> Announcer {
        Announcer {
            pending: Notify::new(),
            last: Default::default(),
            epoch: std::time::Instant::now(),
            gap: gap.as_millis() as u64,
        }
    }

    fn now(&self) -> u64 {
        // From 1: 0 is "none yet".
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// Whether a write about to be sent may carry the NOTIFY (none for a gap); if so, the gap
    /// starts now.
    pub(crate) fn claim(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let (now, last) = (self.now(), self.last.load(Relaxed));
        (last == 0 || now >= last + self.gap)
            && self
                .last
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
    }

    /// After a committed write that carried no NOTIFY: one is owed.
    pub(crate) fn owed(&self) {
        self.pending.notify_one();
    }

    /// Waits until a NOTIFY is owed and the gap since the last has passed, and starts a gap.
    async fn next(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        self.pending.notified().await;
        loop {
            let last = self.last.load(Relaxed);
            let due = last + self.gap;
            let now = self.now();
            if last != 0 && now < due {
                tokio::time::sleep(Duration::from_millis(due - now)).await;
                continue;
            }
            if self
                .last
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }
}

/// What a sync applied.
enum Applied {
    Nothing,
    /// Only rows of cached credentials changed (the config is as it was).
    Credentials,
    Config,
}

/// Larger deltas (an import, a long disconnection) are cheaper as a full rebuild.
const MAX_DELTA: usize = 2000;

pub struct ConfigSync {
    pub store: Arc<Store>,
    builder: std::sync::Mutex<std::sync::mpsc::Sender<Build>>,
    last_good: PathBuf,
    applied: watch::Sender<i64>,
    wake: Notify,
    poll_interval: Duration,
}

/// File name of the last applied config under the prefix.
pub const LAST_GOOD_FILE: &str = "last-good-config.json";

impl ConfigSync {
    pub fn new(
        store: Arc<Store>,
        apply: Arc<ApplyFn>,
        prefix: &std::path::Path,
        poll_interval: Duration,
    ) -> Arc<ConfigSync> {
        let (tx, rx) = std::sync::mpsc::channel::<Build>();
        let plugins = store.plugins.clone();
        let last_good = prefix.join(LAST_GOOD_FILE);
        let path = last_good.clone();
        std::thread::Builder::new()
            .name("config-builder".into())
            .spawn(move || {
                lower_priority(CONTROL_PLANE_NICE);
                builder_loop(rx, plugins.as_ref(), apply.as_ref(), &path);
            })
            .expect("spawn the config builder thread");
        Arc::new(ConfigSync {
            store,
            builder: std::sync::Mutex::new(tx),
            last_good,
            applied: watch::channel(-1).0,
            wake: Notify::new(),
            poll_interval,
        })
    }

    /// The config version the data plane runs (-1 before the first sync).
    pub fn applied_version(&self) -> i64 {
        *self.applied.borrow()
    }

    /// Told each time the data plane runs a new version (a hybrid control plane exports then).
    pub fn watch_applied(&self) -> tokio::sync::watch::Receiver<i64> {
        self.applied.subscribe()
    }

    /// Waits (up to `bound`) until the data plane runs the store's current version: a read of
    /// the running state (`/upstreams/{u}/health`) right after a write sees that write.
    pub async fn caught_up(&self, bound: std::time::Duration) {
        let Ok(current) = self.store.config_version().await else {
            return;
        };
        if self.applied_version() >= current {
            return;
        }
        self.trigger();
        let mut rx = self.applied.subscribe();
        let _ = tokio::time::timeout(bound, rx.wait_for(|v| *v >= current)).await;
    }

    /// Asks the sync loop to look at the store now (after a local write).
    pub fn trigger(&self) {
        self.wake.notify_one();
    }

    /// Brings the data plane to the store's current version: by applying only the rows changed
    /// since the running version when the change log covers them, by a full rebuild otherwise.
    /// Returns the version applied.
    pub async fn sync_once(&self) -> Result<i64, StoreError> {
        self.sync().await.map(|(version, _)| version)
    }

    /// [`ConfigSync::sync_once`], and what it applied.
    async fn sync(&self) -> Result<(i64, Applied), StoreError> {
        let applied = self.applied_version();
        if applied >= 0 {
            match self.store.changes_since(applied).await? {
                Some((version, _)) if version == applied => return Ok((version, Applied::Nothing)),
                Some((version, mut delta)) if delta.len() <= MAX_DELTA => {
                    // Credentials the data plane caches: drop what changed, keep them out of
                    // the config.
                    let plugins = self.store.plugins.clone();
                    let cached = plugins.cached_tables();
                    for (table, id, entity) in &delta {
                        let parsed = entity
                            .as_deref()
                            .and_then(|t| serde_json::from_str::<Value>(t).ok());
                        plugins.invalidate(table, id, parsed.as_ref().and_then(|v| v.as_object()));
                    }
                    let changed = !delta.is_empty();
                    delta.retain(|(table, _, _)| !cached.contains(table));
                    let what = if changed && delta.is_empty() {
                        Applied::Credentials
                    } else {
                        Applied::Config
                    };
                    let job = Job::Delta {
                        from: applied,
                        version,
                        delta,
                    };
                    match self.run_job(job).await {
                        Ok(()) => {
                            self.applied.send_replace(version);
                            return Ok((version, what));
                        }
                        Err(e) => tracing::warn!(
                            "config sync: incremental update failed ({e}); rebuilding in full"
                        ),
                    }
                }
                _ => {}
            }
        }
        let cached = self.store.plugins.cached_tables();
        let (version, raw) = self.store.export_raw(cached).await?;
        if version == self.applied_version() {
            return Ok((version, Applied::Nothing));
        }
        if !cached.is_empty() {
            self.store.plugins.invalidate_all();
        }
        self.run_job(Job::Full { version, raw })
            .await
            .map_err(StoreError::Database)?;
        self.applied.send_replace(version);
        Ok((version, Applied::Config))
    }

    async fn run_job(&self, job: Job) -> Result<(), String> {
        let (reply, done) = tokio::sync::oneshot::channel();
        self.builder
            .lock()
            .map_err(|_| "config builder lock poisoned".to_string())?
            .send(Build { job, reply })
            .map_err(|_| "config builder stopped".to_string())?;
        done.await
            .map_err(|_| "config builder stopped".to_string())?
    }

    /// The config saved by the last successful sync, if any (for a start while the database
    /// is unreachable).
    pub fn load_last_good(&self) -> Option<Config> {
        let text = std::fs::read_to_string(&self.last_good).ok()?;
        let v: Value = serde_json::from_str(&text).ok()?;
        declarative::load(&v, self.store.plugins.as_ref()).ok()
    }

    /// Runs forever: syncs when triggered or every poll interval.
    pub async fn run(self: Arc<Self>) {
        let mut failing = false;
        let mut gap = SYNC_GAP;
        loop {
            let woken = tokio::time::timeout(self.poll_interval, self.wake.notified())
                .await
                .is_ok();
            let started = tokio::time::Instant::now();
            // A poll (or a wake-up while the database was failing) first asks whether anything
            // changed; a notification says it did, and the sync reads the version anyway.
            if !woken || failing {
                let current = match self.store.config_version().await {
                    Ok(v) => v,
                    Err(e) => {
                        if !failing {
                            tracing::error!(
                                "config sync: database unreachable, serving the last good config: {e}"
                            );
                            failing = true;
                        }
                        continue;
                    }
                };
                if failing {
                    tracing::info!("config sync: database reachable again");
                    failing = false;
                }
                if current == self.applied_version() {
                    continue;
                }
            }
            // A sync that found nothing new (woken by this node's own NOTIFY after it applied
            // its write) keeps the gap of the one before.
            match self.sync().await {
                Ok((v, what)) => {
                    tracing::debug!("config sync: applied version {v}");
                    match what {
                        Applied::Nothing => {}
                        Applied::Credentials => gap = CREDENTIAL_SYNC_GAP,
                        Applied::Config => gap = SYNC_GAP,
                    }
                }
                Err(e) => {
                    tracing::error!("config sync: keeping the current config: {e}");
                    gap = SYNC_GAP;
                }
            }
            // A burst of writes (a notification each) is applied in batches: one sync per gap
            // at most, the notifications meanwhile kept as one pending wake-up.
            tokio::time::sleep_until(started + gap).await;
        }
    }

    /// PostgreSQL only: tells the other nodes about this node's writes, one NOTIFY per
    /// [`NOTIFY_GAP`] at most, always after the last write ([`Announcer`]: the first write of
    /// a gap sends its own). A NOTIFY that fails (the database went away after the write) is
    /// sent again once it can be; meanwhile the other nodes' polls find the change.
    pub async fn announce(self: Arc<Self>) {
        if self.store.backend != Backend::Postgres {
            return;
        }
        let announcer = self.store.announce_writes_later();
        loop {
            announcer.next().await;
            if let Err(e) = self.store.notify_nodes().await {
                tracing::debug!("config sync: NOTIFY failed: {e}");
                announcer.owed();
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }

    /// PostgreSQL only: wakes the sync loop on every NOTIFY from another node's write, and
    /// after a reconnect (notifications sent meanwhile are lost, so look at the store).
    pub async fn listen(self: Arc<Self>) {
        if self.store.backend != Backend::Postgres {
            return;
        }
        let url = self.store.options().url.clone();
        loop {
            let mut listener = match sqlx::postgres::PgListener::connect(&url).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::debug!("config sync: LISTEN connection failed: {e}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            if let Err(e) = listener.listen(NOTIFY_CHANNEL).await {
                tracing::debug!("config sync: LISTEN failed: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            self.trigger();
            loop {
                match listener.try_recv().await {
                    Ok(Some(_)) => self.trigger(),
                    // The connection dropped; try_recv reconnects on the next call.
                    Ok(None) => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        self.trigger();
                    }
                    Err(e) => {
                        tracing::debug!("config sync: notification connection lost: {e}");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        break;
                    }
                }
            }
        }
    }
}

/// Loads a stored config, leaving out the entities that no longer validate (written by an
/// older version, or directly to the database) and those that then miss what they refer to:
/// one bad row must not keep every later change from applying. Each is named in
/// `Config::left_out` (and so in the log, `/status` and the metrics).
fn load_leaving_out(
    mut export: Value,
    plugins: &dyn turnpike_config::declarative::PluginRegistry,
    hash: String,
) -> Result<Config, String> {
    let mut left_out = Vec::new();
    // Each round removes the entities that failed; what referred to them fails in the next.
    for _ in 0..8 {
        match declarative::load_with_hash(&export, plugins, hash.clone()) {
            Ok(mut cfg) => {
                cfg.left_out = left_out;
                return Ok(cfg);
            }
            Err(e) if !e.entities.is_empty() && e.top.is_empty() && e.message.is_none() => {
                let mut removed = 0;
                for ent in &e.entities {
                    let Some(id) = ent.id.as_deref() else {
                        continue;
                    };
                    if let Some(Value::Array(rows)) = export.get_mut(ent.table) {
                        let before = rows.len();
                        rows.retain(|r| r.get("id").and_then(Value::as_str) != Some(id));
                        if rows.len() < before {
                            removed += 1;
                            let why: Vec<String> = ent
                                .errors
                                .iter()
                                .map(|(f, m)| format!("{f}: {m}"))
                                .collect();
                            left_out.push(format!("{} {id}: {}", ent.table, why.join(", ")));
                        }
                    }
                }
                if removed == 0 {
                    return Err(format!("stored config does not load: {}", e.summary()));
                }
            }
            Err(e) => return Err(format!("stored config does not load: {}", e.summary())),
        }
    }
    Err("stored config does not load: too many entities left out".into())
}

/// The builder thread: holds the config it last built and applies jobs to it. After
/// incremental updates the last good copy is saved once the updates pause (300 ms), so a burst
/// of writes does not re-encode the whole config each time; and at most once in 20 times what
/// the last save took, so that writes a little more than 300 ms apart do not pay for a whole
/// config's encoding each (at 100k routes a save costs ~100 ms of a CPU, a write ~1 ms).
fn builder_loop(
    rx: std::sync::mpsc::Receiver<Build>,
    plugins: &dyn turnpike_config::declarative::PluginRegistry,
    apply: &ApplyFn,
    last_good: &std::path::Path,
) {
    use std::sync::mpsc::RecvTimeoutError;
    let mut state: Option<(i64, Config)> = None;
    let mut unsaved = false;
    // When the last save ended, and what it cost.
    let mut saved = (std::time::Instant::now(), Duration::ZERO);
    loop {
        let msg = if unsaved {
            let pause = Duration::from_millis(300);
            let paced =
                (saved.0 + saved.1 * 20).saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(pause.max(paced)) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => {
                    let t0 = std::time::Instant::now();
                    if let Some((_, cfg)) = &state {
                        // Written straight from the config (no tree of JSON values first).
                        if let Ok(text) = turnpike_config::number::to_vec(&cfg.json()) {
                            save_last_good(last_good, &text);
                        }
                    }
                    saved = (std::time::Instant::now(), t0.elapsed());
                    unsaved = false;
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return,
            }
        } else {
            match rx.recv() {
                Ok(m) => m,
                Err(_) => return,
            }
        };
        let t0 = std::time::Instant::now();
        let result = match msg.job {
            Job::Full { version, raw } => {
                let text = raw_to_text(raw);
                // The version names the config.
                let hash = format!("{version:032x}");
                // Read from the text entity by entity, never whole as JSON values (a
                // 10k-service, 100k-consumer store peaked at 4.2x its steady memory); a store
                // with rows that no longer validate (or that need the document reader) goes
                // the long way, which leaves those rows out.
                let built = match declarative::load_json_streaming(&text, plugins) {
                    Some(mut cfg) => {
                        cfg.hash = hash;
                        Ok(cfg)
                    }
                    None => crate::crud::assemble_document(&text)
                        .map_err(|e| e.to_string())
                        .and_then(|export| load_leaving_out(export, plugins, hash)),
                };
                let built = built.and_then(|cfg| {
                    apply(cfg.clone(), None)
                        .map_err(|e| format!("stored config does not compile: {e}"))?;
                    Ok(cfg)
                });
                match built {
                    Ok(cfg) => {
                        state = Some((version, cfg));
                        save_last_good(last_good, &text);
                        unsaved = false;
                        tracing::debug!(
                            "config version {version}: full rebuild in {:?}",
                            t0.elapsed()
                        );
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            Job::Delta {
                from,
                version,
                delta,
            } => match state.take() {
                // A config that left stored entities out is rebuilt in full on every change,
                // so that a fix or a delete of what failed shows at once.
                Some((at, cfg)) if at == from && !cfg.left_out.is_empty() => {
                    Err("entities were left out of the running config".to_string())
                }
                // Only cached credentials changed (an oauth2 token written, a key added): the
                // caches are right again and the config is as it was; the builder moves to the
                // new version without compiling or swapping anything.
                Some((at, cfg)) if at == from && delta.is_empty() => {
                    state = Some((version, cfg));
                    Ok(())
                }
                Some((at, mut cfg)) if at == from => {
                    let mut changes = Changes {
                        from: std::mem::take(&mut cfg.hash),
                        ..Changes::default()
                    };
                    let patched = delta.iter().try_for_each(|(table, id, text)| {
                        let entity: Option<serde_json::Map<String, Value>> = match text {
                            Some(t) => Some(serde_json::from_str(t).map_err(|e| e.to_string())?),
                            None => None,
                        };
                        if *table == "routes" {
                            changes.routes.push(id.clone());
                        } else {
                            changes.others = true;
                        }
                        cfg.apply_change(table, id, entity.as_ref(), plugins)
                    });
                    cfg.hash = format!("{version:032x}");
                    let t1 = std::time::Instant::now();
                    // A failed patch leaves no state behind: the next sync rebuilds in full.
                    match patched.and_then(|()| apply(cfg.clone(), Some(&changes))) {
                        Ok(()) => {
                            tracing::debug!(
                                "config version {version}: {} changed rows applied in {:?} (patch {:?}, compile and swap {:?})",
                                delta.len(),
                                t0.elapsed(),
                                t1 - t0,
                                t1.elapsed()
                            );
                            state = Some((version, cfg));
                            unsaved = true;
                            Ok(())
                        }
                        Err(e) => Err(e),
                    }
                }
                _ => Err("the builder holds another version".to_string()),
            },
        };
        let _ = msg.reply.send(result);
    }
}

/// The rows as one declarative JSON document, by concatenation; each row's text is freed as
/// it is copied (the rows and the document held whole side by side were 45 of a 10k-service,
/// 100k-consumer SQLite start's 86 MB heap peak).
fn raw_to_text(raw: crate::crud::RawExport) -> String {
    let len: usize = raw
        .iter()
        .flat_map(|(_, v)| v.iter().map(|t| t.len() + 1))
        .sum();
    let mut out = String::with_capacity(len + 256);
    out.push_str("{\"_format_version\":\"3.0\",\"_transform\":false");
    for (table, texts) in raw {
        if texts.is_empty() {
            continue;
        }
        out.push_str(&format!(",\"{table}\":["));
        for (i, t) in texts.into_iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&t);
        }
        out.push(']');
    }
    out.push('}');
    out
}

fn save_last_good(path: &std::path::Path, text: impl AsRef<[u8]>) {
    let tmp = path.with_extension("json.tmp");
    let ok = std::fs::write(&tmp, text)
        .ok()
        .and_then(|_| std::fs::rename(&tmp, path).ok());
    if ok.is_none() {
        tracing::warn!("cannot save the last good config to {}", path.display());
    }
}

/// The CPU priority (nice) of a node's control plane: the Admin API, the config sync, the
/// config builder. The threads that serve or watch traffic (proxy workers, health checks, the
/// status API, DNS, the log plugins' senders) keep the normal one, 0. When the cores are busy they win: with a million
/// oauth2 tokens written at 1,500/s beside 5,000 proxy requests/s on two cores, nice 19 took
/// ~0.3 ms off the write load's effect on the proxy's p99 that nice 5 left, and the write load
/// added 0.62x the worker's wait for its CPU. The price: on a saturated node a config change
/// takes up to ~0.15 s to reach the proxy instead of ~0.05 s (BENCHMARKS.md;
/// `docs/benchmark-history.md`, "the control plane yields to traffic").
pub const CONTROL_PLANE_NICE: i32 = 19;

/// Lowers the calling thread's CPU priority to `nice` (threads it starts afterwards inherit
/// it): when the cores are busy, the proxy workers' threads win.
pub fn lower_priority(nice: i32) {
    // SAFETY: gettid and setpriority take plain integers and touch no memory of ours.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, nice);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_write_of_a_gap_notifies_itself_and_the_others_leave_one_owed() {
        let a = Announcer::with_gap(Duration::from_secs(3600));
        assert!(a.claim(), "the first write carries its NOTIFY");
        assert!(!a.claim(), "a write within the gap does not");
        // Nothing owed: the announcer waits.
        assert!(tokio::time::timeout(Duration::from_millis(20), a.next())
            .await
            .is_err());
        // Owed within the gap: sent when the gap has passed, not before.
        a.owed();
        assert!(tokio::time::timeout(Duration::from_millis(20), a.next())
            .await
            .is_err());
        let none = Announcer::with_gap(Duration::ZERO);
        assert!(none.claim() && none.claim());
        none.owed();
        tokio::time::timeout(Duration::from_secs(10), none.next())
            .await
            .expect("an owed NOTIFY is sent once the gap has passed");
        // The announcer's NOTIFY starts a gap too.
        let b = Announcer::with_gap(Duration::from_secs(3600));
        b.owed();
        tokio::time::timeout(Duration::from_secs(10), b.next())
            .await
            .expect("the first NOTIFY goes at once");
        assert!(!b.claim(), "a write right after the announcer's NOTIFY");
    }

    #[test]
    fn the_joined_document_reads_back_as_the_rows_do() {
        // The document reader's fallback reads the joined text; it must give what the rows
        // give one by one (a `ttl`'s expiry read back as the seconds left: 0 once past, so
        // that the result does not depend on the clock).
        let raw = || -> crate::crud::RawExport {
            vec![(
                "keyauth_credentials",
                vec![
                    format!(
                        r#"{{"id":"a","key":"k","{}":1}}"#,
                        crate::entity::EXPIRES_AT
                    ),
                    r#"{"id":"b","key":"l"}"#.into(),
                ],
            )]
        };
        let rows = crate::crud::assemble(raw()).unwrap();
        let doc = crate::crud::assemble_document(&raw_to_text(raw())).unwrap();
        assert_eq!(doc, rows);
        assert_eq!(doc["keyauth_credentials"][0]["ttl"], 0);
        assert!(doc["keyauth_credentials"][0]
            .get(crate::entity::EXPIRES_AT)
            .is_none());
        assert!(crate::crud::assemble_document("{\"consumers\":[1]}").is_err());
    }

    #[test]
    fn raw_rows_make_a_loadable_document() {
        let raw: crate::crud::RawExport = vec![
            (
                "services",
                vec![
                    r#"{"id":"0b5c8a3e-5d6f-4a8b-9c0d-1e2f3a4b5c6d","name":"a","host":"h","created_at":1,"updated_at":1}"#.into(),
                ],
            ),
            ("routes", vec![]),
        ];
        let text = raw_to_text(raw);
        let v: Value = serde_json::from_str(&text).unwrap();
        let cfg = declarative::load(&v, &turnpike_config::declarative::NoPlugins).unwrap();
        assert_eq!(cfg.services[0].name.as_deref(), Some("a"));
        // The builder reads the same text entity by entity (the document reader only for
        // rows that fail): the rows' document must stay one the streaming reader takes.
        let streamed =
            declarative::load_json_streaming(&text, &turnpike_config::declarative::NoPlugins)
                .expect("the stored rows' text streams");
        assert_eq!(streamed.services, cfg.services);
    }
}
