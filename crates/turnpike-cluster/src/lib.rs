//! Hybrid mode as Kong 3.9 speaks it (`/v1/outlet`): a control plane that holds the database
//! and serves its config to data planes over mutual TLS, and data planes without a database
//! that apply it. The control plane's side is `cp`, the data plane's `dp`; both share the
//! wire (`payload`), the config hash (`hash`), the compatibility rules (`compat`) and the
//! TLS set-up (`tls`).

use std::time::Duration;

pub mod compat;
pub mod cp;
pub mod dp;
pub mod hash;
pub mod payload;
pub mod tls;

/// Kong's `CLUSTERING_TIMEOUT`: connects, handshakes and the first frame.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// Kong's `CLUSTERING_PING_INTERVAL`.
pub const PING_INTERVAL: Duration = Duration::from_secs(30);
/// Kong's `PING_WAIT`: a peer silent this long is dropped.
pub const PING_WAIT: Duration = Duration::from_secs(45);

pub(crate) fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// What a node is in the cluster, with the side of the protocol it runs.
#[derive(Clone, Default)]
pub enum Node {
    #[default]
    Traditional,
    ControlPlane(std::sync::Arc<cp::ControlPlane>),
    DataPlane(std::sync::Arc<dp::DataPlane>),
}
