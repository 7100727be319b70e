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

/// Upstream connections opened and requests sent to one peer (host:port).
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerTally {
    pub connections_opened: u64,
    pub requests: u64,
}

/// A worker's per-peer tallies, indexed by peer id (ids are dense, see `upstream::peer::Peers`):
/// counting is an index and an add. Published to readers once a second.
#[derive(Default, Debug)]
pub struct PeerTallies {
    counts: std::cell::RefCell<Vec<PeerTally>>,
    changed: std::cell::Cell<bool>,
}

impl PeerTallies {
    #[inline]
    fn slot(&self, peer: u64, f: impl FnOnce(&mut PeerTally)) {
        let mut counts = self.counts.borrow_mut();
        let i = peer as usize;
        if i >= counts.len() {
            counts.resize(i + 1, PeerTally::default());
        }
        self.changed.set(true);
        f(&mut counts[i])
    }

    #[inline]
    pub fn opened(&self, peer: u64) {
        self.slot(peer, |t| t.connections_opened += 1)
    }

    #[inline]
    pub fn request(&self, peer: u64) {
        self.slot(peer, |t| t.requests += 1)
    }

    /// Copies the tallies where readers see them, when they changed.
    pub fn publish(&self, to: &WorkerStats) {
        if self.changed.replace(false) {
            *to.peers.lock().unwrap_or_else(|e| e.into_inner()) = self.counts.borrow().clone();
        }
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
    /// Client connections with a request being handled (nginx's "writing"); owner-written.
    pub connections_writing: AtomicI64,
    /// Idle upstream connections in the worker's pool (published once a second).
    pub pool_idle: AtomicU64,
    /// The worker's per-peer tallies as last published (at most a second old).
    pub peers: std::sync::Mutex<Vec<PeerTally>>,
}

#[derive(Default, Debug)]
pub struct Stats {
    pub workers: Vec<Arc<WorkerStats>>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsTotals {
    pub connections_accepted: u64,
    pub connections_active: i64,
    pub connections_writing: i64,
    pub pool_idle: u64,
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

    /// Per-peer tallies summed over the workers, indexed by peer id.
    pub fn peer_totals(&self) -> Vec<PeerTally> {
        let mut sum: Vec<PeerTally> = Vec::new();
        for w in &self.workers {
            let peers = w.peers.lock().unwrap_or_else(|e| e.into_inner());
            if sum.len() < peers.len() {
                sum.resize(peers.len(), PeerTally::default());
            }
            for (s, p) in sum.iter_mut().zip(peers.iter()) {
                s.connections_opened += p.connections_opened;
                s.requests += p.requests;
            }
        }
        sum
    }

    pub fn totals(&self) -> StatsTotals {
        let mut t = StatsTotals::default();
        for w in &self.workers {
            t.connections_accepted += w.connections_accepted.get();
            t.connections_active += w.connections_active.load(Ordering::Relaxed);
            t.connections_writing += w.connections_writing.load(Ordering::Relaxed);
            t.pool_idle += w.pool_idle.load(Ordering::Relaxed);
            t.requests += w.requests.get();
            t.upstream_connections_opened += w.upstream_connections_opened.get();
            t.upstream_requests += w.upstream_requests.get();
        }
        t
    }
}
