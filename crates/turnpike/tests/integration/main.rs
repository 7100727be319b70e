//! Integration tests: each module starts the real `turnpike` binary (with real upstreams, and
//! real PostgreSQL, Redis and dnsmasq where a module needs them) and talks to it over the network.
//!
//! One test binary rather than one per file: every test binary links the whole dependency tree,
//! and twenty of them took tens of gigabytes of disk and most of the link time in CI.

mod common;

mod admin_api;
mod admin_fuzz;
mod balancing;
mod compression;
mod config_faults;
mod conformance;
mod custom_plugins;
mod deck;
mod dns;
mod doctor;
mod expressions;
mod external_plugins;
mod faults;
mod gokong;
mod grpc;
mod health;
mod hybrid;
mod idle_connections;
mod kong_manager;
mod lifecycle;
mod observability;
mod plugins;
mod postgres;
mod proxy_protocol;
mod request_buffering;
mod routing;
mod stream_plugins;
mod streams;
mod transport;
mod upstream_tls;
