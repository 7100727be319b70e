//! Counters kept per worker (each written only by its own thread, so no cache line is shared
//! on the request path) and summed when read.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Default, Debug)]
#[repr(align(128))]
pub struct Counter(AtomicU64);

impl Counter {
    #[inline]
    pub fn inc(&self) {
        // Only the owning worker writes: a relaxed load + store avoids a locked instruction.
        self.0
            .store(self.0.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[derive(Default, Debug)]
pub struct WorkerStats {
    pub connections_accepted: Counter,
    pub requests: Counter,
    pub upstream_connections_opened: Counter,
    pub upstream_requests: Counter,
    /// Open client connections (incremented and decremented by the owner only).
    pub connections_active: AtomicI64,
}

#[derive(Default, Debug)]
pub struct Stats {
    pub workers: Vec<Arc<WorkerStats>>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsTotals {
    pub connections_accepted: u64,
    pub connections_active: i64,
    pub requests: u64,
    pub upstream_connections_opened: u64,
    pub upstream_requests: u64,
}

impl Stats {
    pub fn new(workers: usize) -> Self {
        Stats {
            workers: (0..workers)
                .map(|_| Arc::new(WorkerStats::default()))
                .collect(),
        }
    }

    pub fn totals(&self) -> StatsTotals {
        let mut t = StatsTotals::default();
        for w in &self.workers {
            t.connections_accepted += w.connections_accepted.get();
            t.connections_active += w.connections_active.load(Ordering::Relaxed);
            t.requests += w.requests.get();
            t.upstream_connections_opened += w.upstream_connections_opened.get();
            t.upstream_requests += w.upstream_requests.get();
        }
        t
    }
}
