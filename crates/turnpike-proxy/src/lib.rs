//! The data plane. Folders by concern: the HTTP/1.1 protocol ([`http1`]), request bodies
//! ([`body`]), the upstream side ([`upstream`]), workers and their listeners ([`worker`]),
//! the request path as Kong's phases ([`runloop`]), the compiled configuration
//! ([`snapshot`]), certificates ([`tls`]), the state workers share ([`state`]) and, beside
//! the HTTP path, the stream (TCP) proxy ([`stream`]).

pub mod body;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod http1;
pub mod runloop;
pub mod snapshot;
pub mod state;
pub mod stream;
pub mod tls;
pub mod upstream;
pub mod worker;

pub use state::{Gateway, Settings, BUILD_PROFILE, VERSION};
