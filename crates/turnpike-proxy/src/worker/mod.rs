//! A worker: its listeners and accept loop, its per-worker state, its coarse clock and
//! deadlines, its counters and its access-log buffer.

pub mod access_log;
pub mod ctx;
pub mod deadline;
pub mod listen;
pub mod proxy_protocol;
pub mod stats;
