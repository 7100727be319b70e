//! The `redis` policy with `sync_rate > 0`: counted on the node, pushed to Redis every
//! `sync_rate` seconds (Kong's batching), so a request waits on nothing.
//!
//! Each window counter keeps the total Redis held at the last sync (`remote`) and the requests
//! this node admitted since (`pending`). A request is admitted while `remote + pending` is under
//! the limit (one compare-and-swap, so a single node never overshoots). Every `sync_rate`, the
//! pending count is added to Redis with INCRBY (which also returns the new total, everyone's
//! increments included) and `remote` takes that total. A failed push keeps the count pending
//! for the next one: no admitted request is lost from the shared count.
//!
//! The bound, documented for operators: between two syncs every node admits at most what was
//! left of the limit at its last sync, so with N nodes a window admits at most
//! `limit + (N - 1) × (limit - count at the last sync)` — at most N × limit in the worst case
//! (all nodes start a window at once), and exactly `limit` once the count is known everywhere.
//! Use `sync_rate = -1` (the default) for an exact limit.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;

use super::redis::RedisTarget;

/// One window's counter on this node.
pub struct Batched {
    /// Redis's total at the last sync.
    remote: AtomicU64,
    /// Admitted here since the last sync.
    pending: AtomicU64,
    limit: u64,
    /// Unix seconds: the window's end (the Redis key's expiry).
    end: u64,
    target: Arc<RedisTarget>,
}

impl Batched {
    /// Takes a slot; false when the window is full as far as this node knows.
    pub fn take(&self) -> bool {
        let remote = self.remote.load(Ordering::Acquire);
        self.pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
                (remote + p < self.limit).then_some(p + 1)
            })
            .is_ok()
    }

    /// Gives a slot back (the request was refused by another window).
    pub fn give_back(&self) {
        let _ = self
            .pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| p.checked_sub(1));
    }

    /// The count as this node knows it (this request included when taken).
    pub fn used(&self) -> u64 {
        self.remote.load(Ordering::Acquire) + self.pending.load(Ordering::Acquire)
    }
}

/// The node's batched counters, part of its rate-limiting state; their sync thread runs
/// while they exist.
#[derive(Default)]
pub struct Batches {
    /// Counters by Redis key, with their sync period.
    counters: DashMap<String, (Arc<Batched>, Duration), rustc_hash::FxBuildHasher>,
    syncer: Mutex<bool>,
    failing: AtomicBool,
}

/// The counter for `key`, created at its first request (and the sync thread with the first).
pub fn counter(
    batches: &Arc<Batches>,
    key: &str,
    limit: u64,
    end: u64,
    target: &Arc<RedisTarget>,
    sync_rate: Duration,
) -> Arc<Batched> {
    if let Some(c) = batches.counters.get(key) {
        return c.0.clone();
    }
    start_syncer(batches);
    batches
        .counters
        .entry(key.to_string())
        .or_insert_with(|| {
            (
                Arc::new(Batched {
                    remote: AtomicU64::new(0),
                    pending: AtomicU64::new(0),
                    limit,
                    end,
                    target: target.clone(),
                }),
                sync_rate,
            )
        })
        .0
        .clone()
}

fn start_syncer(batches: &Arc<Batches>) {
    let mut started = batches.syncer.lock().unwrap_or_else(|e| e.into_inner());
    if *started {
        return;
    }
    *started = true;
    let spawned = std::thread::Builder::new()
        .name("ratelimit-sync".into())
        .spawn({
            // Weak: the thread ends once the node's plugin state is gone.
            let batches = Arc::downgrade(batches);
            move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!("rate-limiting: cannot start the sync thread: {e}");
                        return;
                    }
                };
                rt.block_on(sync_loop(batches));
            }
        });
    if let Err(e) = spawned {
        tracing::error!("rate-limiting: cannot start the sync thread: {e}");
        *started = false;
    }
}

/// Pushes pending counts and reads totals, each counter on its own period.
async fn sync_loop(batches: std::sync::Weak<Batches>) {
    let mut last_sync: std::collections::HashMap<String, std::time::Instant> = Default::default();
    loop {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let Some(batches) = batches.upgrade() else {
            return;
        };
        let now = std::time::Instant::now();
        let unix = super::now_secs();
        let due: Vec<(String, Arc<Batched>)> = batches
            .counters
            .iter()
            .filter(|e| {
                last_sync
                    .get(e.key())
                    .is_none_or(|t| now.duration_since(*t) >= e.value().1)
            })
            .map(|e| (e.key().clone(), e.value().0.clone()))
            .collect();
        for (key, c) in due {
            last_sync.insert(key.clone(), now);
            // The pushed requests stay counted in `pending` until `remote` includes them
            // (counting them twice for a moment is the safe side); a failed push leaves them
            // pending for the next one.
            let pending = c.pending.load(Ordering::Acquire);
            match super::redis::add(&c.target, &key, pending, c.end + 1).await {
                Ok(total) => {
                    c.remote.store(total.max(0) as u64, Ordering::Release);
                    // Saturating: a slot given back after the push (the request was refused
                    // by another window) stays counted in Redis, the safe side.
                    let _ = c
                        .pending
                        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
                            Some(p.saturating_sub(pending))
                        });
                    if batches.failing.swap(false, Ordering::Relaxed) {
                        tracing::warn!("rate-limiting: batched counts reach redis again");
                    }
                }
                Err(e) => {
                    if !batches.failing.swap(true, Ordering::Relaxed) {
                        tracing::error!(
                            "rate-limiting: pushing batched counts to redis failed ({e}); \
                             counting on this node until it answers"
                        );
                    }
                }
            }
        }
        // Windows that have ended, once their last count is pushed.
        batches.counters.retain(|k, (c, _)| {
            let keep = c.end + 1 >= unix || c.pending.load(Ordering::Acquire) > 0;
            if !keep {
                last_sync.remove(k);
            }
            keep
        });
    }
}
