//! The `cluster` policy: counters in the node's database (SQLite for one node, PostgreSQL
//! shared by many), as Kong keeps them in its `ratelimiting_metrics` table (and, for
//! response-ratelimiting, `response_ratelimiting_metrics`: read when a request comes, added to
//! once its response says what it cost).
//!
//! Exact: the store checks and counts every window in one transaction, each window's row
//! updated only while it is under its limit (an upsert with a condition, which PostgreSQL
//! serialises on the row), and the transaction is rolled back when a window is full. The cost is
//! Kong's: every request waits on a database round trip, which is why `redis` (or `local`) is
//! usually the better choice. Refused on a DB-less node, as Kong does.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

/// One window of one counter.
#[derive(Debug, Clone)]
pub struct Window {
    pub route_id: String,
    pub service_id: String,
    pub identifier: String,
    /// `second` .. `year`.
    pub period: &'static str,
    /// The window's start, in milliseconds (Kong's `period_date`).
    pub period_date: i64,
    pub limit: i64,
    /// When the row may be deleted (the window's end), in seconds.
    pub expire_at: i64,
}

/// `[blocked window (1-based) or 0, count per window...]`, as the redis policy's script
/// answers: counts after the increment when allowed, as they were when blocked.
pub type Counted = Pin<Box<dyn Future<Output = Result<Vec<i64>, String>> + Send>>;

/// One window of one named limit of response-ratelimiting.
#[derive(Debug, Clone)]
pub struct Counter {
    pub route_id: String,
    pub service_id: String,
    pub identifier: String,
    /// The limit's name and the period (`videos_minute`), as Kong keys it.
    pub period: String,
    /// The window's start, in milliseconds (Kong's `period_date`).
    pub period_date: i64,
    /// When the row may be deleted (the window's end), in seconds.
    pub expire_at: i64,
}

/// A write's outcome.
pub type Done = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// The database, as the rate-limiting plugins see it.
pub trait CounterStore: Send + Sync {
    /// rate-limiting: checks and counts a request in every window.
    fn count(&self, windows: Vec<Window>) -> Counted;
    /// response-ratelimiting: what each window has used.
    fn usage(&self, counters: Vec<Counter>) -> Counted;
    /// response-ratelimiting: adds what a response spent.
    fn add(&self, counters: Vec<(Counter, i64)>) -> Done;
}

/// The cluster policy's database, part of the node's rate-limiting state.
#[derive(Default)]
pub struct Cluster {
    store: OnceLock<Arc<dyn CounterStore>>,
    /// Whether the last count failed: failures are logged when this flips, not per request.
    down: std::sync::atomic::AtomicBool,
}

impl Cluster {
    /// Gives the cluster policy its database (a database node, at start).
    pub fn install(&self, store: Arc<dyn CounterStore>) {
        let _ = self.store.set(store);
    }

    pub async fn count(&self, windows: Vec<Window>) -> Result<Vec<i64>, String> {
        let counted = match self.store.get() {
            Some(s) => s.count(windows).await,
            None => Err(NO_DATABASE.into()),
        };
        self.watch(counted)
    }

    /// response-ratelimiting's usage of `counters`' windows.
    pub async fn usage(&self, counters: Vec<Counter>) -> Result<Vec<i64>, String> {
        let used = match self.store.get() {
            Some(s) => s.usage(counters).await,
            None => Err(NO_DATABASE.into()),
        };
        self.watch(used)
    }

    /// Adds what a response spent to its windows.
    pub async fn add(&self, counters: Vec<(Counter, i64)>) -> Result<(), String> {
        let added = match self.store.get() {
            Some(s) => s.add(counters).await,
            None => Err(NO_DATABASE.into()),
        };
        self.watch(added)
    }

    /// Logs when the database stops (or starts again) counting; passes the result on.
    fn watch<T>(&self, result: Result<T, String>) -> Result<T, String> {
        watch(&self.down, result)
    }
}

const NO_DATABASE: &str = "the cluster policy needs a database (database = sqlite or postgres)";

fn watch<T>(down: &std::sync::atomic::AtomicBool, result: Result<T, String>) -> Result<T, String> {
    use std::sync::atomic::Ordering;
    match &result {
        Ok(_) if down.swap(false, Ordering::Relaxed) => {
            tracing::warn!("rate-limiting: the database counts again (cluster policy)")
        }
        Err(e) if !down.swap(true, Ordering::Relaxed) => tracing::error!(
            "rate-limiting: counting in the database failed ({e}); until it works, \
             fault_tolerant configs count on each node and others answer 500"
        ),
        _ => {}
    }
    result
}
