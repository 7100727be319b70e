//! The upstream side: keepalive pools, load balancing over targets, health checks and DNS.

pub mod balancer;
pub mod connect;
pub mod dns;
pub mod health;
pub mod peer;
pub mod pool;
