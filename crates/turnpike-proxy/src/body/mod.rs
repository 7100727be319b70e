//! Request bodies: the client's body whichever protocol carries it ([`request`]), read whole
//! before the upstream is chosen ([`spool`]), and upstream bodies read ahead of a slow
//! client ([`readahead`]), and upstream bodies that must keep arriving ([`idle`]).

pub mod idle;
pub mod readahead;
pub mod request;
pub mod spool;

pub use request::{BoxError, Http2Body, RequestBody};
