//! Kong's bundled plugins, compiled in. Each plugin lives in its own folder with its handler
//! (`mod.rs`) and its config schema (`schema.rs`) side by side, as Kong keeps `handler.lua` and
//! `schema.lua`.
//!
//! A plugin is configured once per config snapshot ([`PluginSpec::build`] turns the validated
//! `config` into a [`Handler`] with everything precomputed); the proxy compiles, per route, the
//! chain of handlers that apply to it, in Kong's PRIORITY order, and per request only walks that
//! chain. A route without plugins pays one empty-slice check.

pub mod acl;
pub mod anonymous;
pub mod basic_auth;
pub mod bot_detection;
pub mod correlation_id;
pub mod cors;
pub mod credentials;
pub mod custom;
pub mod datadog;
pub mod file_log;
pub mod grpc_gateway;
pub mod grpc_proto;
pub mod grpc_web;
pub mod hmac_auth;
pub mod http_log;
pub mod ip_restriction;
pub mod jwt;
pub mod key_auth;
pub mod ldap_auth;
pub mod log;
pub mod log_sender;
pub mod lua;
pub mod oauth2;
pub mod opentelemetry;
pub mod pluginserver;
pub mod post_function;
pub mod pre_function;
pub mod prometheus;
pub mod proxy_cache;
pub mod rate_limiting;
pub mod redirect;
pub mod request_logs;
pub mod request_size_limiting;
pub mod request_termination;
pub mod request_transformer;
pub mod response_ratelimiting;
pub mod response_transformer;
pub mod session;
pub mod spans;
pub mod spawner;
pub mod statsd;
pub mod syslog;
pub mod tcp_log;
pub mod tls_client;
pub mod udp_log;
pub mod zipkin;
pub use turnpike_config::schema;

mod build;
pub mod clock;
pub mod form;
mod identity;
pub mod multipart;
mod phase;
mod registry;
mod runtime;
#[cfg(test)]
mod testing;

pub use build::*;
pub use clock::*;
pub use identity::*;
pub use phase::*;
pub use registry::*;
pub use runtime::Runtime;
#[cfg(test)]
pub(crate) use testing::*;

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderName, HeaderValue};
    use std::sync::Arc;

    /// Plugins after authentication see the identity headers the upstream will get, over the
    /// client's (rate-limiting's `limit_by = header`, request-termination's trigger).
    #[test]
    fn request_headers_show_the_consumer_over_the_client() {
        let mut headers = HeaderMap::new();
        headers.insert(&X_CONSUMER_ID, HeaderValue::from_static("spoofed"));
        headers.insert(&X_ANONYMOUS_CONSUMER, HeaderValue::from_static("true"));
        headers.insert("x-other", HeaderValue::from_static("kept"));
        let mut response_headers = Vec::new();
        let mut ctx = PluginCtx::default();
        let mut upstream = UpstreamRequest::default();
        let mut req = AccessRequest {
            route_id: "r",
            ..AccessRequest::new(
                "GET",
                "/",
                None,
                &mut headers,
                &mut response_headers,
                false,
                "127.0.0.1".parse().unwrap(),
                &mut ctx,
                &mut upstream,
            )
        };
        assert_eq!(*req.header(&X_CONSUMER_ID).unwrap(), "spoofed");
        req.set_consumer(Arc::new(Identity::new(
            "c-1",
            Some("alice"),
            None,
            Some("cred-1"),
        )));
        assert_eq!(*req.header(&X_CONSUMER_ID).unwrap(), "c-1");
        assert_eq!(*req.header(&X_CONSUMER_USERNAME).unwrap(), "alice");
        // Not anonymous: the client's claim is dropped, as upstream.
        assert!(req.header(&X_ANONYMOUS_CONSUMER).is_none());
        assert!(req.header(&X_CONSUMER_CUSTOM_ID).is_none());
        assert_eq!(
            *req.header(&HeaderName::from_static("x-other")).unwrap(),
            "kept"
        );
    }
}
