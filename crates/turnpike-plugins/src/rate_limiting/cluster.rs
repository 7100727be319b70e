//! The `cluster` policy: counters in the node's database (SQLite for one node, PostgreSQL
//! shared by many), as Kong keeps them in its `ratelimiting_metrics` table.
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

/// The database, as the rate-limiting plugin sees it.
pub trait CounterStore: Send + Sync {
    fn count(&self, windows: Vec<Window>) -> Counted;
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
        count(self, windows).await
    }
}

async fn count(cluster: &Cluster, windows: Vec<Window>) -> Result<Vec<i64>, String> {
    let (store, down) = (&cluster.store, &cluster.down);
    let result = match store.get() {
        Some(s) => s.count(windows).await,
        None => Err("the cluster policy needs a database (database = sqlite or postgres)".into()),
    };
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
