//! The data plane: listeners and workers ([`server`]), TLS ([`tls`]), configuration snapshots
//! with their compiled router and balancers ([`snapshot`]), upstream keepalive pools
//! ([`pool`]) and the request path ([`proxy`]).

pub mod access_log;
pub mod authority;
pub mod balancer;
pub mod body;
pub mod chunked;
pub mod deadline;
pub mod dns;
pub mod errors;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod h1;
pub mod h1_parse;
pub mod h1_server;
pub mod header_names;
pub mod health;
pub mod log;
pub mod pool;
pub mod proxy;
pub mod readahead;
pub mod server;
pub mod snapshot;
pub mod spool;
pub mod state;
pub mod stats;
pub mod tls;

pub use state::{Gateway, Settings, BUILD_PROFILE, VERSION};
