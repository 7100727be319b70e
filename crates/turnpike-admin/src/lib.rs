//! The Admin API (Kong's surface): `GET /`, `GET /status`, the entity endpoints
//! ([`entities`]), `GET /tags/{tag}`, schemas, and `GET`/`POST /config` in DB-less mode.

mod cache;
mod clustering;
mod entities;
mod forms;
mod gui;
mod health;
pub mod log_level;
mod metrics;
mod profile;
mod schemas;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::watch;
use turnpike_config::declarative::{self, PluginRegistry};
use turnpike_config::Conf;
use turnpike_plugins::KONG_VERSION;
use turnpike_proxy::{Gateway, BUILD_PROFILE, VERSION};
use turnpike_store::crud::percent_decode;

/// Kong's admin body limit (`nginx_admin_client_body_buffer_size = 10m`) is for buffering; a
/// declarative config of 100k routes is larger, so allow more, but bound it.
pub const MAX_BODY: usize = 64 * 1024 * 1024;

/// One entity is small; a larger body is refused before it is parsed.
pub const MAX_ENTITY_BODY: usize = 1024 * 1024;

/// Compares without an early exit, so the time taken says nothing about where a guess differs.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8 | ((a.len() ^ b.len()) >> 8) as u8;
    for (i, expected) in b.iter().enumerate() {
        diff |= a.get(i).copied().unwrap_or(0xff) ^ expected;
    }
    diff == 0 && a.len() == b.len()
}

#[derive(Clone)]
pub struct Admin {
    pub gateway: Arc<Gateway>,
    pub conf: Conf,
    pub plugins: Arc<dyn PluginRegistry>,
    pub node_id: String,
    pub hostname: String,
    /// The entity store; `None` in DB-less mode.
    pub store: Option<Arc<turnpike_store::Store>>,
    pub sync: Option<Arc<turnpike_store::sync::ConfigSync>>,
    /// Changes the log level at run time (`/debug/node/log-level`).
    pub log_levels: Option<Arc<log_level::LevelState>>,
    /// A `POST /config` is being parsed and applied: another gets Kong's 429 meanwhile.
    pub config_loading: Arc<std::sync::atomic::AtomicBool>,
    /// Hands the calling thread's freed memory back to the system (the allocator's collect):
    /// a config load frees as much as the config it parsed.
    pub release_memory: fn(),
    /// Hybrid mode: the control plane's records of its data planes, or the data plane's
    /// connection to its control plane.
    pub cluster: turnpike_cluster::Node,
}

/// Up to this size a `POST /config` body is echoed back as Kong echoes it (the entities);
/// a larger one is answered with its hash and entity counts instead: a 50 MiB config echoed
/// 387 MB and held it in memory while doing so.
pub const MAX_CONFIG_ECHO: usize = 4 * 1024 * 1024;

pub(crate) type Resp = Response<Body>;

/// An Admin API answer's body: whole, or streamed as it is written (`POST /config`'s echo).
pub(crate) type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// A body of `bytes`.
pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

pub(crate) fn json_response(status: StatusCode, v: &Value) -> Resp {
    // Numbers as Kong writes them: typed clients (go-kong) refuse `1.0` for an integer.
    json_bytes(
        status,
        turnpike_config::number::to_vec(v).unwrap_or_default(),
    )
}

/// A JSON body already written.
fn json_bytes(status: StatusCode, body: Vec<u8>) -> Resp {
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    r
}

/// 204 with no body.
pub(crate) fn no_content() -> Resp {
    let mut r = Response::new(full(Bytes::new()));
    *r.status_mut() = StatusCode::NO_CONTENT;
    r
}

pub(crate) fn message(status: StatusCode, msg: &str) -> Resp {
    json_response(status, &json!({ "message": msg }))
}

/// Serves the Admin API on `listener` until `shutdown` turns true.
pub async fn serve(admin: Arc<Admin>, listener: TcpListener, shutdown: watch::Receiver<bool>) {
    serve_as(admin, listener, shutdown, Mode::Admin).await
}

/// Serves the debug listener (`debug_listen`): `GET /debug/profile?seconds=N` (a CPU flame
/// graph), `/status` and `/metrics`. Off by default; bind it to a private address.
pub async fn serve_debug(
    admin: Arc<Admin>,
    listener: TcpListener,
    shutdown: watch::Receiver<bool>,
) {
    serve_as(admin, listener, shutdown, Mode::Debug).await
}

/// Serves Kong Manager (`admin_gui_listen`, when `admin_gui_dir` names a build of it).
pub async fn serve_gui(admin: Arc<Admin>, listener: TcpListener, shutdown: watch::Receiver<bool>) {
    serve_as(admin, listener, shutdown, Mode::Gui).await
}

/// Which API a listener serves.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Admin,
    Status,
    Debug,
    Gui,
}

/// A path segment with `%XX` decoded (for file names under Kong Manager's folder).
pub(crate) fn percent_decode_path(s: &str) -> String {
    turnpike_store::crud::percent_decode(s)
}

/// Serves Kong's Status API (`status_listen`): `GET /status`, `/status/ready` and `/metrics`
/// only, without the admin token (it changes nothing and shows no secret).
pub async fn serve_status(
    admin: Arc<Admin>,
    listener: TcpListener,
    shutdown: watch::Receiver<bool>,
) {
    serve_as(admin, listener, shutdown, Mode::Status).await
}

async fn serve_as(
    admin: Arc<Admin>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
    mode: Mode,
) {
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(_) => { tokio::time::sleep(std::time::Duration::from_millis(50)).await; continue; }
            },
            _ = stopped(&mut shutdown) => return,
        };
        let admin = admin.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let admin = admin.clone();
                async move {
                    Ok::<_, Infallible>(match mode {
                        Mode::Admin => admin.handle(req, peer).await,
                        Mode::Status => admin.handle_status(req, false).await,
                        Mode::Debug => admin.handle_status(req, true).await,
                        Mode::Gui => admin.handle_gui(req).await,
                    })
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(std::time::Duration::from_secs(60))
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// Resolves once `rx` says true (or its sender is gone).
async fn stopped(rx: &mut watch::Receiver<bool>) {
    loop {
        if *rx.borrow_and_update() {
            return;
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

impl Admin {
    /// Kong's tables and the plugins' entities.
    pub fn tables(&self) -> turnpike_store::schema::Tables {
        turnpike_store::schema::Tables::new(&*self.plugins)
    }

    pub async fn handle(&self, req: Request<Incoming>, _peer: SocketAddr) -> Resp {
        let start = std::time::Instant::now();
        // CORS needs the caller's origin after the request is consumed: that header only.
        let origin = req.headers().get(header::ORIGIN).cloned();
        // A browser's preflight carries no credentials: answered before the token check.
        let mut resp = if req.method() == Method::OPTIONS {
            gui::preflight(self, origin.as_ref(), req.headers())
        } else {
            let mut r = self.route(req).await;
            gui::cors(self, origin.as_ref(), &mut r);
            r
        };
        resp.headers_mut().insert(
            header::SERVER,
            HeaderValue::from_str(&format!("turnpike/{VERSION}")).unwrap(),
        );
        if self.gateway.settings.headers.admin_latency {
            resp.headers_mut().insert(
                "x-kong-admin-latency",
                HeaderValue::from(start.elapsed().as_millis() as u64),
            );
        }
        resp
    }

    /// The Status API's paths; the rest is 404.
    pub async fn handle_status(&self, req: Request<Incoming>, debug: bool) -> Resp {
        let path = req.uri().path().trim_end_matches('/');
        let mut resp = match (req.method(), path) {
            (&Method::GET, "/debug/profile") if debug => {
                profile::profile(req.uri().query().unwrap_or("")).await
            }
            (&Method::GET, "/status") => self.status().await,
            (&Method::GET, "/metrics") => self.metrics().await,
            // Kong's readiness probe: ready once a configuration is loaded.
            (&Method::GET, "/status/ready") => {
                if self
                    .gateway
                    .reloads
                    .load(std::sync::atomic::Ordering::Relaxed)
                    > 0
                {
                    json_response(StatusCode::OK, &json!({ "message": "ready" }))
                } else {
                    message(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "no configuration available (empty configuration present)",
                    )
                }
            }
            (_, "/status" | "/metrics" | "/status/ready") => {
                message(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed")
            }
            _ => message(StatusCode::NOT_FOUND, "Not found"),
        };
        resp.headers_mut().insert(
            header::SERVER,
            HeaderValue::from_str(&format!("turnpike/{VERSION}")).unwrap(),
        );
        resp
    }

    /// With `admin_auth_token` set, every call carries it as a bearer token (or in
    /// `Kong-Admin-Token`); compared in constant time.
    fn authorized(&self, req: &Request<Incoming>) -> bool {
        let Some(token) = &self.conf.admin_auth_token else {
            return true;
        };
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .or_else(|| {
                req.headers()
                    .get("kong-admin-token")
                    .and_then(|v| v.to_str().ok())
            })
            .unwrap_or("");
        constant_time_eq(given.as_bytes(), token.as_bytes())
    }

    async fn route(&self, req: Request<Incoming>) -> Resp {
        if !self.authorized(&req) {
            return message(StatusCode::UNAUTHORIZED, "Unauthorized");
        }
        let path = req.uri().path().trim_end_matches('/').to_string();
        let query = req.uri().query().unwrap_or("").to_string();
        let method = req.method().clone();
        match (method.clone(), path.as_str()) {
            (Method::GET, "") => return self.root(),
            (Method::GET, "/status") => return self.status().await,
            (Method::GET, "/metrics") => return self.metrics().await,
            (Method::GET, "/config") => return self.get_config(),
            (Method::POST, "/config") => return self.post_config(req, &query).await,
            (Method::GET, "/plugins/enabled") => {
                let names: Vec<String> =
                    self.plugins.available().into_iter().map(|p| p.0).collect();
                return json_response(StatusCode::OK, &json!({ "enabled_plugins": names }));
            }
            (Method::GET, "/clustering/status" | "/clustering/data-planes") => {
                return clustering::endpoint(&self.cluster, &path, &query)
            }
            (Method::GET, "/endpoints") => return self.endpoints(),
            (Method::GET, "/timers") => return self.timers(),
            (Method::GET, "/tags") => return self.tags(&method, None, &path, &query).await,
            // Kong's node cache (see `cache`): this node caches credentials.
            (Method::DELETE, "/cache") => {
                self.plugins.invalidate_all();
                return no_content();
            }
            (
                _,
                ""
                | "/status"
                | "/metrics"
                | "/config"
                | "/plugins/enabled"
                | "/endpoints"
                | "/timers"
                | "/tags"
                | "/cache"
                | "/clustering/status"
                | "/clustering/data-planes",
            ) => return message(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed"),
            _ => {}
        }
        if let Some(r) = self.log_level(&method, &path, &query) {
            return r;
        }
        if let Some(tag) = path.strip_prefix("/tags/") {
            return self.tags(&method, Some(tag), &path, &query).await;
        }
        if path.starts_with("/proxy-cache") {
            let snapshot = self.gateway.snapshot.load();
            if let Some((status, body)) =
                self.plugins
                    .admin_api(method.as_str(), &path, &snapshot.config.plugins)
            {
                let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
                return match body {
                    Some(b) => json_response(status, &b),
                    None => no_content(),
                };
            }
        }
        if let Some(key) = path.strip_prefix("/cache/") {
            let key = turnpike_store::crud::percent_decode(key);
            return self.cache_entry(&method, &key).await;
        }
        let content_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        let request_headers: Vec<(String, Vec<u8>)> = req
            .headers()
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), v.as_bytes().to_vec()))
            .collect();
        let body = match Limited::new(req.into_body(), MAX_ENTITY_BODY)
            .collect()
            .await
        {
            Ok(b) => b.to_bytes(),
            Err(_) => return message(StatusCode::PAYLOAD_TOO_LARGE, "Payload too large"),
        };
        if let Some(rest) = path.strip_prefix("/schemas/") {
            return self.schemas(&method, rest, &body, content_type.as_deref());
        }
        {
            let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
            let reads_balancers = matches!(
                segments.as_slice(),
                ["upstreams", _, "health"]
                    | ["upstreams", _, "targets", "all"]
                    | ["upstreams", _, "targets", .., "healthy" | "unhealthy"]
            );
            if reads_balancers {
                // Health is read from the running balancers: let them take in the writes
                // already answered (a target created a moment ago is listed, as in Kong).
                if let Some(sync) = &self.sync {
                    sync.caught_up(std::time::Duration::from_secs(2)).await;
                }
            }
            if let Some(r) = self.health(&method, &segments) {
                return r;
            }
        }
        if let Some(r) = self.plugin_route(
            &method,
            &path,
            &query,
            request_headers,
            &body,
            content_type.as_deref(),
        ) {
            return r;
        }
        match self
            .entities(&method, &path, &query, &body, content_type.as_deref())
            .await
        {
            Some(r) => r,
            None => message(StatusCode::NOT_FOUND, "Not found"),
        }
    }

    /// An operator's plugin's own endpoint (its `api.lua`), when one has the path: Kong's
    /// `self.params` are the query's arguments and the body's fields (JSON, form or
    /// multipart, as for entities).
    fn plugin_route(
        &self,
        method: &Method,
        path: &str,
        query: &str,
        headers: Vec<(String, Vec<u8>)>,
        body: &[u8],
        content_type: Option<&str>,
    ) -> Option<Resp> {
        let mut params = serde_json::Map::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            params.insert(
                turnpike_store::crud::percent_decode(k),
                Value::String(turnpike_store::crud::percent_decode(v)),
            );
        }
        if !body.is_empty() {
            match forms::parse_body(content_type, body) {
                Ok(fields) => params.extend(fields),
                Err(r) => return Some(r),
            }
        }
        let snapshot = self.gateway.snapshot.load();
        let answer = self.plugins.custom_api(
            turnpike_config::declarative::ApiCall {
                method: method.as_str(),
                path,
                query,
                headers,
                body,
                params,
            },
            &snapshot.config,
        )?;
        let mut r = Response::builder()
            .status(StatusCode::from_u16(answer.status).unwrap_or(StatusCode::OK));
        for (k, v) in answer.headers {
            r = r.header(k, v);
        }
        Some(r.body(full(answer.body)).unwrap_or_else(|_| {
            message(
                StatusCode::INTERNAL_SERVER_ERROR,
                "An unexpected error occurred",
            )
        }))
    }

    /// `GET /endpoints`: every path this Admin API serves, in Kong's notation.
    fn endpoints(&self) -> Resp {
        let mut paths: Vec<String> = [
            "/",
            "/status",
            "/metrics",
            "/config",
            "/plugins/enabled",
            "/endpoints",
            "/timers",
            "/tags",
            "/tags/{tags}",
            "/cache",
            "/cache/{key}",
            "/schemas/{db_entity_name}",
            "/schemas/{db_entity_name}/validate",
            "/schemas/plugins/{name}",
            "/schemas/plugins/validate",
            "/upstreams/{upstreams}/health",
            "/upstreams/{upstreams}/targets/all",
            "/upstreams/{upstreams}/targets/{targets}/healthy",
            "/upstreams/{upstreams}/targets/{targets}/unhealthy",
            "/upstreams/{upstreams}/targets/{targets}/{address}/healthy",
            "/upstreams/{upstreams}/targets/{targets}/{address}/unhealthy",
            "/debug/node/log-level",
            "/debug/node/log-level/{log_level}",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        paths.extend(self.plugins.admin_endpoints().iter().map(|s| s.to_string()));
        paths.extend(self.plugins.custom_endpoints());
        // Kong names each placeholder after its entity's table.
        let tables = self.tables();
        for spec in tables.iter() {
            let (p, t) = (spec.path, spec.table);
            paths.push(format!("/{p}"));
            paths.push(format!("/{p}/{{{t}}}"));
            for child in tables.iter() {
                if child.foreign_to(spec.table).is_some() {
                    paths.push(format!("/{p}/{{{t}}}/{}", child.nested_path));
                    paths.push(format!(
                        "/{p}/{{{t}}}/{}/{{{}}}",
                        child.nested_path, child.table
                    ));
                }
            }
            for fk in spec.foreign {
                paths.push(format!("/{p}/{{{t}}}/{}", fk.field));
            }
        }
        paths.sort();
        paths.dedup();
        json_response(StatusCode::OK, &json!({ "data": paths, "next": null }))
    }

    /// `GET /timers`, in Kong's shape: this node runs its background work as tasks, not timers.
    fn timers(&self) -> Resp {
        json_response(
            StatusCode::OK,
            &json!({
                "worker": { "id": 0, "count": self.conf.worker_processes },
                "stats": {
                    "sys": { "running": 0, "runs": 0, "pending": 0, "waiting": 0, "total": 0 },
                    "timers": {},
                    "flamegraph": { "running": "", "elapsed_time": "", "pending": "" },
                },
            }),
        )
    }

    async fn tags(&self, method: &Method, tag: Option<&str>, path: &str, query: &str) -> Resp {
        if *method != Method::GET {
            return message(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed");
        }
        let Some(store) = &self.store else {
            return message(StatusCode::NOT_FOUND, "Not found");
        };
        let tag = tag.map(turnpike_store::crud::percent_decode);
        let result = async {
            let q = turnpike_store::ListQuery::parse(query)?;
            let page = store.list_tag(tag.as_deref(), &q).await?;
            Ok::<_, turnpike_store::StoreError>(page)
        }
        .await;
        match result {
            Ok(page) => {
                let next = page
                    .offset
                    .as_ref()
                    .map(|o| Value::String(format!("{path}?offset={o}")))
                    .unwrap_or(Value::Null);
                let mut body = json!({ "data": page.data, "next": next });
                if let Some(o) = page.offset {
                    body["offset"] = Value::String(o);
                }
                json_response(StatusCode::OK, &body)
            }
            Err(e) => {
                let (status, body) = e.to_kong();
                json_response(StatusCode::from_u16(status).unwrap(), &body)
            }
        }
    }

    /// `GET /`'s plugins: every plugin this build carries, and those the running config uses.
    fn plugins_info(&self) -> Value {
        let available: serde_json::Map<String, Value> = self
            .plugins
            .available()
            .into_iter()
            .map(|(name, version, priority)| {
                (name, json!({"version": version, "priority": priority}))
            })
            .collect();
        let mut enabled: Vec<String> = self
            .gateway
            .snapshot
            .load()
            .config
            .plugins
            .iter()
            .map(|p| p.name.clone())
            .collect();
        enabled.sort();
        enabled.dedup();
        json!({ "available_on_server": available, "enabled_in_cluster": enabled })
    }

    fn root(&self) -> Resp {
        json_response(
            StatusCode::OK,
            &json!({
                "tagline": "Welcome to turnpike",
                // Clients (decK, go-kong, Kong Manager) gate features on Kong's version: the
                // Kong release whose Admin API and plugins this implements. Ours beside it.
                "version": KONG_VERSION,
                "turnpike_version": VERSION,
                "edition": "community",
                "hostname": self.hostname,
                "node_id": self.node_id,
                "build_profile": BUILD_PROFILE,
                "plugins": self.plugins_info(),
                "configuration": self.conf.to_json(),
                "pids": { "master": std::process::id() },
                "timers": { "running": 0, "pending": 0 },
            }),
        )
    }

    async fn status(&self) -> Resp {
        let t = self.gateway.stats.totals();
        let active = t.connections_active.max(0);
        let database = match &self.store {
            Some(store) => json!({ "reachable": store.reachable().await }),
            None => Value::Null,
        };
        let mut body = json!({
                "server": {
                    "connections_accepted": t.connections_accepted,
                    "connections_handled": t.connections_accepted,
                    "connections_active": active,
                    // hyper reads request heads internally: a connection reading one counts
                    // as waiting.
                    "connections_reading": 0,
                    "connections_writing": t.connections_writing.clamp(0, active),
                    "connections_waiting": (active - t.connections_writing.max(0)).max(0),
                    "total_requests": t.requests,
                },
                "upstream": {
                    "connections_opened": t.upstream_connections_opened,
                    "requests": t.upstream_requests,
                    "reuse_ratio": reuse_ratio(t.upstream_connections_opened, t.upstream_requests),
                    "pool": {
                        "idle_connections": t.pool_idle,
                        "size_per_peer_per_worker": self.conf.upstream_keepalive_pool_size,
                        "max_requests": self.conf.upstream_keepalive_max_requests,
                        "idle_timeout": self.conf.upstream_keepalive_idle_timeout.as_secs(),
                    },
                    "peers": peer_stats(&self.gateway),
                },
                "configuration_hash": self.gateway.config_hash(),
                // Entities of the applied config the data plane could not build (left out,
                // or failing closed), one line each; empty when all of it applies.
                "configuration_problems": &self.gateway.snapshot.load().problems,
                "config_reloads": self.gateway.reloads.load(std::sync::atomic::Ordering::Relaxed),
                // Reloads patched into the running config (what they left alone shared).
                "config_reloads_patched": self.gateway.reloads_patched.load(std::sync::atomic::Ordering::Relaxed),
        });
        match &self.cluster {
            // A data plane: its control plane connection (Turnpike's own field).
            turnpike_cluster::Node::DataPlane(dp) => body["control_plane"] = dp.status_json(),
            turnpike_cluster::Node::ControlPlane(cp) => body["clustering"] = cp.status_json(),
            turnpike_cluster::Node::Traditional => {}
        }
        if !database.is_null() {
            body["database"] = database;
            body["config_version"] = json!(self.sync.as_ref().map(|s| s.applied_version()));
        }
        json_response(StatusCode::OK, &body)
    }

    fn get_config(&self) -> Resp {
        if self.store.is_some() {
            return message(
                StatusCode::BAD_REQUEST,
                "This endpoint is only available when Turnpike is configured to not use a database (use `turnpike config db_export`)",
            );
        }
        // Numbers as Kong writes them (`timeout: 1`, not `1.0`).
        let mut config = self.gateway.snapshot.load().config.to_json();
        turnpike_config::number::normalize(&mut config);
        let yaml = serde_yaml::to_string(&config).unwrap_or_default();
        json_response(StatusCode::OK, &json!({ "config": yaml }))
    }

    async fn post_config(&self, req: Request<Incoming>, query: &str) -> Resp {
        // A data plane's config is its control plane's: a local one would be replaced at the
        // next push, and would differ from what the control plane records meanwhile.
        if matches!(self.cluster, turnpike_cluster::Node::DataPlane(_)) {
            return message(
                StatusCode::BAD_REQUEST,
                "this endpoint is not available when Kong is configured to run as Data Plane: its configuration comes from the Control Plane",
            );
        }
        if self.store.is_some() {
            return message(
                StatusCode::BAD_REQUEST,
                "This endpoint is only available when Turnpike is configured to not use a database (use `turnpike config db_import`)",
            );
        }
        let flag = |name: &str| {
            query.split('&').any(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, "1"));
                k == name && matches!(v, "1" | "true" | "")
            })
        };
        let (check_hash, flatten) = (flag("check_hash"), flag("flatten_errors"));
        let content_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => return message(StatusCode::PAYLOAD_TOO_LARGE, "Payload too large"),
        };
        let Ok(text) = std::str::from_utf8(&body) else {
            return message(
                StatusCode::BAD_REQUEST,
                "Cannot parse request body: invalid UTF-8",
            );
        };
        // The `config` field of a form (curl --data-binary labels raw YAML as one) or of a
        // multipart body (Kong's documented `curl -F config=@kong.yml`), when there is one.
        let field = if content_type.starts_with("application/x-www-form-urlencoded") {
            form_field(text, "config")
        } else if content_type.starts_with("multipart/form-data") {
            forms::multipart_pairs(&content_type, text)
                .and_then(|pairs| pairs.into_iter().find(|(k, _)| k == "config"))
                .map(|(_, v)| v)
        } else {
            None
        };
        let text = field.unwrap_or_else(|| text.to_string());
        drop(body);
        // One load at a time (Kong: 429 while the previous one loads), each on a thread of its
        // own at a lower CPU priority: parsing and compiling a large config neither holds up
        // the Admin API's other requests nor takes CPU the proxy workers want.
        if self
            .config_loading
            .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            return message(
                StatusCode::TOO_MANY_REQUESTS,
                "Currently loading previous configuration",
            );
        }
        let loading = self.config_loading.clone();
        let (plugins, gateway) = (self.plugins.clone(), self.gateway.clone());
        let release_memory = self.release_memory;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("config-load".into())
            .spawn(move || {
                // Started by the control plane's thread, whose priority it keeps.
                let r = load_config(text, plugins.as_ref(), &gateway, check_hash, flatten);
                // What the parse and the old config's retirement freed on this thread goes
                // back to the system now, not when the thread's heap is next reused.
                release_memory();
                loading.store(false, std::sync::atomic::Ordering::Release);
                let _ = tx.send(r);
            });
        if spawned.is_err() {
            self.config_loading
                .store(false, std::sync::atomic::Ordering::Release);
            return message(
                StatusCode::INTERNAL_SERVER_ERROR,
                "An unexpected error occurred",
            );
        }
        match rx.await {
            Ok(r) => r,
            Err(_) => message(
                StatusCode::INTERNAL_SERVER_ERROR,
                "An unexpected error occurred",
            ),
        }
    }
}

/// Parses, validates and applies a `POST /config` body; Kong's answer. The text is dropped
/// once read: a 50 MiB body held while the snapshot compiled was 53 MB of the load's peak.
fn load_config(
    text: String,
    plugins: &dyn PluginRegistry,
    gateway: &Gateway,
    check_hash: bool,
    flatten: bool,
) -> Resp {
    // Read against the running config: what it has unchanged is shared as it is read.
    let running = gateway.snapshot.load_full();
    let small = text.len() <= MAX_CONFIG_ECHO;
    let text = declarative::into_json_text(text);
    let mut loaded = declarative::load_str_against(&text, plugins, Some(&running.config));
    // Kong also accepts `{"config": "<yaml or json text>"}`: read when the body as a config
    // is not one.
    if loaded.is_err() {
        if let Ok(Value::Object(m)) = declarative::parse_text(&text) {
            if let (1, Some(Value::String(inner))) = (m.len(), m.get("config")) {
                loaded = declarative::load_str_against(inner, plugins, Some(&running.config));
            }
        }
    }
    drop(running);
    drop(text);
    let cfg = match loaded {
        Ok(c) => c,
        Err(e) => return declarative_error(&e, flatten),
    };
    if check_hash && cfg.hash == gateway.config_hash() {
        let mut r = Response::new(full(Bytes::new()));
        *r.status_mut() = StatusCode::NOT_MODIFIED;
        return r;
    }
    match gateway.apply(cfg) {
        // The config as applied: entities a reload left alone keep their timestamps.
        Ok(()) => config_echo(gateway.snapshot.load_full(), small),
        Err(e) => json_response(
            StatusCode::BAD_REQUEST,
            &json!({"code": 14, "name": "invalid declarative configuration", "message": format!("declarative config is invalid: {e}"), "fields": {"@entity": [e]}}),
        ),
    }
}

/// `POST /config`'s answer (201): the entities, written straight from the config, or for a
/// large config their numbers.
fn config_echo(snapshot: Arc<turnpike_proxy::snapshot::Snapshot>, whole: bool) -> Resp {
    if whole {
        let mut r = Response::new(echo_body(snapshot));
        *r.status_mut() = StatusCode::CREATED;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        );
        return r;
    }
    let cfg = &snapshot.config;
    json_response(
        StatusCode::CREATED,
        &json!({
            "configuration_hash": cfg.hash,
            "services": cfg.services.len(),
            "routes": cfg.routes.len(),
            "consumers": cfg.consumers.len(),
            "plugins": cfg.plugins.len(),
            "upstreams": cfg.upstreams.len(),
            "targets": cfg.targets.len(),
            "message": format!("configuration applied; entities are echoed for configurations up to {MAX_CONFIG_ECHO} bytes"),
        }),
    )
}

/// The config's echo, written as JSON on its own thread and sent in chunks as it is written:
/// it is never whole in memory (10k services' echo, built whole, was 17 MB of the reload's
/// 38 MB heap peak). The writing stops when the client goes. Its own thread: the config is
/// loaded on one with no runtime; when no thread can be had, it is written whole here.
fn echo_body(snapshot: Arc<turnpike_proxy::snapshot::Snapshot>) -> Body {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mine = snapshot.clone();
    let spawned = std::thread::Builder::new()
        .name("config-echo".into())
        .spawn(move || {
            // Spawned from the control plane's thread: at its priority.
            let mut w = ChunkWriter {
                tx,
                buf: Vec::with_capacity(ChunkWriter::CHUNK),
            };
            if turnpike_config::number::to_writer(&mut w, &mine.config.json()).is_ok() {
                let _ = std::io::Write::flush(&mut w);
            }
        });
    match spawned {
        Ok(_) => ChannelBody(rx).boxed(),
        Err(_) => {
            full(turnpike_config::number::to_vec(&snapshot.config.json()).unwrap_or_default())
        }
    }
}

/// Sends what is written in chunks of [`ChunkWriter::CHUNK`] bytes.
struct ChunkWriter {
    tx: tokio::sync::mpsc::Sender<Bytes>,
    buf: Vec<u8>,
}

impl ChunkWriter {
    const CHUNK: usize = 64 * 1024;
}

impl std::io::Write for ChunkWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        if self.buf.len() >= Self::CHUNK {
            self.flush()?;
        }
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(Self::CHUNK));
        self.tx
            .blocking_send(Bytes::from(chunk))
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))
    }
}

/// A body of the chunks a channel receives, ending when its sender is dropped.
struct ChannelBody(tokio::sync::mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|c| c.map(|b| Ok(hyper::body::Frame::data(b))))
    }
}

fn declarative_error(e: &declarative::DeclarativeError, flatten: bool) -> Resp {
    json_response(StatusCode::BAD_REQUEST, &e.to_kong_json(flatten))
}

/// Reads one field of an `application/x-www-form-urlencoded` body.
fn form_field(body: &str, name: &str) -> Option<String> {
    body.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (percent_decode(k) == name).then(|| percent_decode(v))
    })
}

/// The share of upstream requests that went on a reused connection (Pingora's figure):
/// 1 - connections opened / requests; `null` before any request.
fn reuse_ratio(opened: u64, requests: u64) -> Value {
    if requests == 0 {
        return Value::Null;
    }
    json!(1.0 - (opened.min(requests) as f64 / requests as f64))
}

/// Connections opened and requests sent per upstream peer (host:port; a balanced service's
/// targets are peers), as the workers last published them (at most a second old).
fn peer_stats(gateway: &turnpike_proxy::Gateway) -> Value {
    let tallies = gateway.stats.peer_totals();
    let peers: Vec<Value> = tallies
        .iter()
        .enumerate()
        .filter(|(_, t)| t.requests > 0 || t.connections_opened > 0)
        .filter_map(|(id, t)| {
            let (host, port) = gateway.upstreams.peers.address(id as u64)?;
            Some(json!({
                "peer": format!("{host}:{port}"),
                "connections_opened": t.connections_opened,
                "requests": t.requests,
                "reuse_ratio": reuse_ratio(t.connections_opened, t.requests),
            }))
        })
        .collect();
    Value::Array(peers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_bodies() {
        assert_eq!(
            form_field("a=1&config=_format_version%3A+%223.0%22", "config").unwrap(),
            "_format_version: \"3.0\""
        );
        assert_eq!(form_field("a=1", "config"), None);
        assert_eq!(percent_decode("%zz%41"), "%zzA");
    }
}
