//! What the plugins keep while a node runs, beside their configs: credential caches, counters,
//! queues, writers. One per node, made with its plugin registry and handed to every plugin
//! as it is built (`BuildContext::runtime`); each plugin keeps the part it uses. Nothing of it
//! is a process-wide static: two nodes in one process (the tests) never share a counter.

use std::sync::Arc;

use crate::*;

pub struct Runtime {
    /// Where credentials come from on a database node (`credentials::Store::install`).
    pub credentials: Arc<credentials::Store>,
    pub key_auth: Arc<key_auth::State>,
    pub basic_auth: Arc<basic_auth::State>,
    pub jwt: Arc<jwt::State>,
    pub hmac_auth: Arc<hmac_auth::State>,
    pub ldap_auth: Arc<ldap_auth::State>,
    pub oauth2: Arc<oauth2::State>,
    /// session's `storage = kong` sessions, read through the credential cache.
    pub session: Arc<session::State>,
    pub rate_limiting: Arc<rate_limiting::State>,
    pub response_ratelimiting: Arc<response_ratelimiting::State>,
    pub http_log: Arc<http_log::State>,
    pub file_log: Arc<file_log::State>,
    /// tcp-log's and udp-log's senders, by destination.
    pub log_senders: Arc<crate::log_sender::Senders>,
    pub prometheus: Arc<prometheus::State>,
    /// The tracing properties and opentelemetry's span queues.
    pub opentelemetry: Arc<opentelemetry::State>,
    /// zipkin's span queues.
    pub zipkin: http_log::State,
    /// proxy-cache's shared dictionaries (sized at start from the properties).
    pub proxy_cache: Arc<proxy_cache::State>,
    /// The `untrusted_lua*` properties (`lua::State::configure`, at start).
    pub lua: lua::State,
    /// Where the syslog plugin writes (the `syslog_socket` property, set at start).
    pub syslog_socket: std::sync::OnceLock<std::path::PathBuf>,
    /// Starts the log senders' and writers' threads at the priority of the thread that made
    /// this runtime (see [`crate::spawner`]).
    pub spawner: crate::spawner::Spawner,
    /// The `.proto` files grpc-gateway and grpc-web configs name, compiled once per version
    /// of each file.
    pub protos: crate::grpc_proto::Cache,
    /// The external plugin servers (`pluginserver_names`), read at start.
    pub pluginservers: std::sync::OnceLock<crate::pluginserver::Servers>,
}

impl Runtime {
    pub fn new() -> Arc<Runtime> {
        let credentials = Arc::new(credentials::Store::default());
        Arc::new(Runtime {
            key_auth: Arc::new(key_auth::State::new(credentials.clone())),
            basic_auth: Arc::new(basic_auth::State::new(credentials.clone())),
            jwt: Arc::new(jwt::state(credentials.clone())),
            hmac_auth: Arc::new(hmac_auth::state(credentials.clone())),
            ldap_auth: Arc::default(),
            oauth2: Arc::new(oauth2::State::new(credentials.clone())),
            session: Arc::new(session::State::new(credentials.clone())),
            credentials,
            rate_limiting: Arc::default(),
            response_ratelimiting: Arc::default(),
            http_log: Arc::default(),
            file_log: Arc::default(),
            log_senders: Arc::default(),
            prometheus: Arc::default(),
            opentelemetry: Arc::default(),
            zipkin: http_log::State::default(),
            proxy_cache: Arc::default(),
            lua: lua::State::default(),
            syslog_socket: std::sync::OnceLock::new(),
            spawner: crate::spawner::Spawner::new(),
            protos: Default::default(),
            pluginservers: Default::default(),
        })
    }
}
