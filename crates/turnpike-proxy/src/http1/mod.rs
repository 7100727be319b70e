//! HTTP/1.1 on both sides: the request-head and response-head parsers, chunked coding,
//! known header names, the server side (a client's connection) and the client side (an
//! upstream connection). Protocol code: it never imports the request pipeline (`runloop`).

pub mod authority;
pub mod chunked;
pub mod client;
pub mod header_names;
pub mod parse;
pub mod raw_head;
pub mod server;
