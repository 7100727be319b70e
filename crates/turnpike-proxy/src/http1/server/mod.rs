//! The server side of HTTP/1.1 (a client's connection), written by hand as the upstream side is (`http1::client`): the request
//! head is parsed (`http1::parse`) straight into the request, the response head is encoded into
//! one buffer together with the start of its body, and a keep-alive connection costs one read
//! and one write per request with no timer per request: the keep-alive (and request-head)
//! timeout is a coarse deadline armed only while the connection waits for bytes. hyper's server
//! connection cost ~8.8k instructions per request around our handler (BENCHMARKS.md). HTTP/2
//! stays on hyper (`worker::listen`).

mod conn;
mod head;
mod response;
mod serve;
mod service;
#[cfg(test)]
mod tests;

pub use conn::{Http1Body, Io, PendingUpgrade, Upgraded};
#[cfg(feature = "fuzzing")]
pub(crate) use head::parse_head;
pub use response::{KongHeaders, OutsideHeaders, ResponseBody};
#[cfg(feature = "fuzzing")]
pub(crate) use serve::detached_shared;
pub use serve::serve;
pub(crate) use serve::{LINGER_TIME, LINGER_TIMEOUT};
pub use service::{Limits, Refused, Service};
