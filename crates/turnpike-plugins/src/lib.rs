//! Kong's bundled plugins, compiled in. Each plugin lives in its own folder with its handler
//! (`mod.rs`) and its config schema (`schema.rs`) side by side, as Kong keeps `handler.lua` and
//! `schema.lua`.
//!
//! A plugin is configured once per config snapshot ([`PluginSpec::build`] turns the validated
//! `config` into a [`Handler`] with everything precomputed); the proxy compiles, per route, the
//! chain of handlers that apply to it, in Kong's PRIORITY order, and per request only walks that
//! chain. A route without plugins pays one empty-slice check.

pub mod correlation_id;
pub mod ip_restriction;
pub mod request_termination;
pub mod schema;

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde_json::Value;
use turnpike_config::declarative::PluginRegistry;

/// What a plugin sees of a request in the access phase, and what it may change.
pub struct AccessRequest<'a> {
    pub method: &'a str,
    /// The normalised request path.
    pub path: &'a str,
    pub query: Option<&'a str>,
    /// The request headers, as they will go upstream: plugins may add or remove some.
    pub headers: &'a mut HeaderMap,
    /// Headers to add to the response the client gets (upstream's or a plugin's), for plugins
    /// whose header_filter phase only adds headers.
    pub response_headers: &'a mut Vec<(HeaderName, HeaderValue)>,
    pub tls: bool,
    /// The client's address: the connection's peer, or the X-Real-IP a trusted proxy sent.
    pub client_ip: std::net::IpAddr,
}

impl AccessRequest<'_> {
    /// The first value of a query argument (not percent-decoded).
    pub fn query_arg(&self, name: &str) -> Option<&str> {
        self.query?.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k == name).then_some(v)
        })
    }
}

/// A response a plugin produces instead of proxying (Kong's `kong.response.exit`).
#[derive(Debug)]
pub struct Exit {
    pub status: StatusCode,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Bytes,
}

impl Exit {
    /// `kong.response.exit(status, {message = ...})`: a JSON body with a message.
    pub fn message(status: StatusCode, message: &str) -> Exit {
        let body =
            serde_json::to_vec(&serde_json::json!({ "message": message })).unwrap_or_default();
        Exit {
            status,
            headers: vec![(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json; charset=utf-8"),
            )],
            body: Bytes::from(body),
        }
    }
}

/// The outcome of a plugin's access phase.
pub enum Access {
    Continue,
    Exit(Exit),
}

/// A configured plugin instance.
pub trait Handler: Send + Sync {
    fn access(&self, req: &mut AccessRequest<'_>) -> Access;
}

/// A plugin: its identity, its config schema and how it turns a config into a handler.
pub trait PluginSpec: Send + Sync {
    fn name(&self) -> &'static str;
    /// Kong's PRIORITY: higher runs first.
    fn priority(&self) -> i32;
    fn version(&self) -> &'static str {
        "3.9.1"
    }
    fn fields(&self) -> &'static [schema::Field];
    /// Checks that span several fields (Kong's `entity_checks`), on a config with defaults.
    fn entity_checks(&self, _config: &Value) -> Vec<(String, String)> {
        Vec::new()
    }
    fn build(&self, config: &Value) -> Result<Arc<dyn Handler>, String>;
}

/// The plugins this build carries.
pub struct Registry {
    plugins: Vec<&'static dyn PluginSpec>,
}

/// Every plugin compiled in (Kong's `plugins = bundled`).
pub fn bundled() -> Registry {
    Registry {
        plugins: vec![
            &correlation_id::CorrelationId,
            &ip_restriction::IpRestriction,
            &request_termination::RequestTermination,
        ],
    }
}

impl Registry {
    pub fn get(&self, name: &str) -> Option<&'static dyn PluginSpec> {
        self.plugins.iter().copied().find(|p| p.name() == name)
    }

    pub fn all(&self) -> impl Iterator<Item = &'static dyn PluginSpec> + '_ {
        self.plugins.iter().copied()
    }
}

impl PluginRegistry for Registry {
    fn check(&self, name: &str, config: &Value) -> Option<Result<Value, Vec<(String, String)>>> {
        let p = self.get(name)?;
        Some(schema::validate(p.fields(), config).and_then(|full| {
            let errs = p.entity_checks(&full);
            if errs.is_empty() {
                Ok(full)
            } else {
                Err(errs)
            }
        }))
    }

    fn schema_json(&self, name: &str) -> Option<Value> {
        self.get(name).map(|p| schema::kong_json(p.fields()))
    }

    fn available(&self) -> Vec<(String, String, i32)> {
        self.plugins
            .iter()
            .map(|p| (p.name().to_string(), p.version().to_string(), p.priority()))
            .collect()
    }
}
