//! External plugins (Kong's plugin servers, `kong/runloop/plugin_servers/`): a plugin written
//! with Kong's Python or JavaScript PDK runs in its own process, which the gateway starts
//! (`pluginserver_<name>_start_cmd`), asks for its plugins at start
//! (`pluginserver_<name>_query_cmd`, a JSON dump of each plugin's name, priority, version,
//! schema and phases) and talks to over a Unix socket (`pluginserver_<name>_socket`).
//!
//! Per plugin config, one instance on the server (`plugin.StartInstance` with the config as
//! JSON), started on first use and started again when the server has forgotten it. Per phase,
//! `plugin.HandleEvent`; the server answers with a PDK call to make (`kong.request.get_header`
//! and its arguments), which the gateway makes through the same PDK a Lua plugin uses
//! (`crate::lua::call_pdk`) and sends back (`plugin.Step`, `plugin.StepError` when it failed),
//! until the server says `ret`. The access phase waits for the server without holding the
//! worker; the log phase runs after the response, from what the request left
//! (Kong's saved request data: `kong.log.serialize`, the request and response headers, the
//! status), without delaying it.
//!
//! Both of Kong's protocols are spoken here: MessagePack (`rpc`, the Python and JavaScript
//! PDKs) and ProtoBuf (`pb`, the Go PDK). What is not here yet: the `certificate` and
//! `preread` phases (a plugin that declares one is refused at start, naming it). The `response` phase runs over the upstream's response
//! read whole (Kong's buffered proxying), waiting for the server without holding the worker.

mod pb;
mod process;
mod rpc;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use turnpike_config::conf::PluginServerConf;

use crate::custom::{Described, OwnPlugin};
use crate::lua::{self, PdkAnswer, Phase};
use crate::{Access, AccessRequest, Handler, Phases, Resume};

pub use process::Supervised;

/// The node's plugin servers and their plugins.
#[derive(Default)]
pub struct Servers {
    pub plugins: Vec<&'static ExternalPlugin>,
    servers: Vec<(Arc<Server>, PluginServerConf)>,
}

impl Servers {
    /// Starts the servers that have a start command and waits (up to 5 s each) for their
    /// sockets, so the first requests find them.
    pub fn run(&self) {
        for (server, conf) in &self.servers {
            let Some(s) = process::supervise(conf) else {
                continue;
            };
            let _ = server.supervised.set(s);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while std::os::unix::net::UnixStream::connect(&server.socket).is_err() {
                if std::time::Instant::now() > deadline {
                    tracing::warn!(
                        "[pluginserver] {}: nothing listens on {} yet",
                        server.name,
                        server.socket.display()
                    );
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }

    /// Ends the servers the node started.
    pub fn stop(&self) {
        for (server, _) in &self.servers {
            if let Some(s) = server.supervised.get() {
                s.stop();
            }
        }
    }
}

/// Asks each server for its plugins (its query command; Kong does so at start). An error
/// names the server; the node does not start without its plugins.
pub fn load(servers: &[PluginServerConf]) -> Result<Servers, String> {
    let mut out = Servers::default();
    for conf in servers {
        let (protocol, infos) = query(conf)?;
        let server = Arc::new(Server {
            name: conf.name.clone(),
            protocol,
            socket: conf.socket.clone(),
            supervised: std::sync::OnceLock::new(),
        });
        for info in infos {
            out.plugins.push(ExternalPlugin::new(&info, &server)?);
        }
        out.servers.push((server, conf.clone()));
    }
    Ok(out)
}

/// One plugin of a server's dump.
struct Info {
    name: String,
    priority: i64,
    version: String,
    schema: Value,
    phases: Vec<String>,
}

/// Runs the query command: Kong reads a JSON list of plugins, or `{"Protocol": ...,
/// "Plugins": [...]}`.
fn query(conf: &PluginServerConf) -> Result<(Protocol, Vec<Info>), String> {
    let out = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(&conf.query_command)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("error loading plugins info from [{}]: {e}", conf.name))?;
    let dump: Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        format!("failed loading external plugins: failed decoding plugin info: {e}")
    })?;
    let protocol = match dump
        .get("Protocol")
        .and_then(Value::as_str)
        .unwrap_or("MsgPack:1")
    {
        "MsgPack:1" => Protocol::MsgPack,
        "ProtoBuf:1" => Protocol::ProtoBuf,
        other => return Err(format!("unknown protocol implementation: {other}")),
    };
    let list = dump.get("Plugins").unwrap_or(&dump);
    let Some(list) = list.as_array().filter(|l| !l.is_empty()) else {
        return Err(format!(
            "not a plugin info table: \n{}\n{}",
            conf.query_command,
            String::from_utf8_lossy(&out.stdout)
        ));
    };
    let infos =
        list.iter()
            .map(|p| {
                let name = p.get("Name").and_then(Value::as_str).ok_or_else(|| {
                    format!("pluginserver {}: a plugin without a Name", conf.name)
                })?;
                Ok(Info {
                    name: name.to_string(),
                    priority: p.get("Priority").and_then(Value::as_i64).unwrap_or(0),
                    version: p
                        .get("Version")
                        .and_then(Value::as_str)
                        .unwrap_or("0.1.0")
                        .to_string(),
                    schema: p.get("Schema").cloned().unwrap_or(Value::Null),
                    phases: p
                        .get("Phases")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .filter_map(|s| s.as_str().map(String::from))
                        .collect(),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
    Ok((protocol, infos))
}

/// How a server is spoken to.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Protocol {
    /// `MsgPack:1`: the Python and JavaScript PDKs.
    MsgPack,
    /// `ProtoBuf:1`: the Go PDK.
    ProtoBuf,
}

/// A plugin server as its plugins reach it.
struct Server {
    name: String,
    protocol: Protocol,
    socket: PathBuf,
    /// Set when the node runs the server (`Servers::run`).
    supervised: std::sync::OnceLock<Arc<Supervised>>,
}

impl Server {
    /// How many times the node has started the server (0 when it runs it not).
    fn generation(&self) -> u64 {
        self.supervised
            .get()
            .map_or(0, |s| s.generation.load(Ordering::SeqCst))
    }
}

/// An external plugin, as the registry knows it.
pub struct ExternalPlugin {
    described: Described,
    /// Its name (the description's), for log lines and the protocol's messages.
    name: &'static str,
    phases: Phases,
    server: Arc<Server>,
}

impl ExternalPlugin {
    fn new(info: &Info, server: &Arc<Server>) -> Result<&'static ExternalPlugin, String> {
        let whose = format!("plugin '{}' (pluginserver {})", info.name, server.name);
        let at = |e: String| format!("{whose}: {e}");
        let described = Described::new(
            &info.name,
            info.priority,
            &info.version,
            &info.schema,
            &whose,
        )?;
        let mut phases = Phases::NONE;
        for p in &info.phases {
            phases = phases
                | match p.as_str() {
                    "access" => Phases::ACCESS,
                    "rewrite" => Phases::REWRITE,
                    "log" => Phases::LOG,
                    // Kong's buffered proxying: the upstream's response read whole first.
                    "response" => Phases::RESPONSE | Phases::BUFFERED,
                    other => {
                        return Err(at(format!(
                            "the '{other}' phase of external plugins is not supported yet"
                        )))
                    }
                };
        }
        Ok(Box::leak(Box::new(ExternalPlugin {
            name: described.name,
            described,
            phases,
            server: server.clone(),
        })))
    }
}

impl OwnPlugin for ExternalPlugin {
    fn described(&self) -> &Described {
        &self.described
    }
    fn handler(
        &self,
        config: &Value,
        ctx: &crate::BuildContext,
    ) -> Result<Arc<dyn Handler>, String> {
        let plugin: &'static ExternalPlugin = registry_ref(self);
        let dao = ctx.shared::<Arc<lua::db::Dao>>(|ctx| {
            Arc::new(
                lua::db::Dao::new(ctx.config, &[], ctx.runtime.credentials.clone())
                    .with_consumers(ctx.consumer_index()),
            )
        });
        let inner = Arc::new(Instance {
            plugin,
            config: config.to_string(),
            id: Mutex::new(None),
            settings: ctx.runtime.lua.settings().clone(),
            dao: (*dao).clone(),
        });
        Ok(Arc::new(ExternalHandler { inner }))
    }
}

/// The registry holds plugins as `'static` (they are leaked at start, as Kong keeps its
/// loaded modules).
fn registry_ref(p: &ExternalPlugin) -> &'static ExternalPlugin {
    // SAFETY: every `ExternalPlugin` is made by `ExternalPlugin::new`, which leaks it: the
    // reference is valid for the rest of the process.
    unsafe { &*(p as *const ExternalPlugin) }
}

/// One config of the plugin: its instance on the server.
struct Instance {
    plugin: &'static ExternalPlugin,
    /// The config as JSON, as `plugin.StartInstance` takes it.
    config: String,
    /// The server's id for the instance, and the server's generation it was started in.
    id: Mutex<Option<(i64, u64)>>,
    settings: Arc<lua::Settings>,
    /// The snapshot's view its PDK calls read: consumers (`kong.client.load_consumer`,
    /// `kong.db.consumers`) and vaults (`kong.vault.get`), one per snapshot for every
    /// external plugin.
    dao: Arc<lua::db::Dao>,
}

/// A config that is gone closes its instance on the server (Kong closes the previous instance
/// of a plugin when its config changes), when a runtime is there to send it.
impl Drop for Instance {
    fn drop(&mut self) {
        let Some((id, generation)) = *self.id.lock().unwrap_or_else(|e| e.into_inner()) else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let server = self.plugin.server.clone();
        if server.generation() != generation {
            return;
        }
        rt.spawn(async move {
            let _ = match server.protocol {
                Protocol::MsgPack => rpc::call(&server.socket, "plugin.CloseInstance", id.into())
                    .await
                    .map(|_| ()),
                Protocol::ProtoBuf => pb::close_instance(&server.socket, id).await,
            };
        });
    }
}

/// What the server asked for next.
enum Step {
    /// The phase is over.
    Ret,
    Call {
        event: Event,
        method: String,
        args: rmpv::Value,
    },
}

/// Where a PDK call's answer goes.
enum Event {
    /// MessagePack: a `plugin.Step` with the event's id.
    Id(rmpv::Value),
    /// ProtoBuf: a frame on the event's connection.
    Conn(pb::Conn),
}

fn pb_step(next: pb::Next) -> Result<Step, String> {
    match next {
        pb::Next::Ret => Ok(Step::Ret),
        pb::Next::Call(conn, method, data) => Ok(Step::Call {
            args: pb::arguments(&method, &data)?,
            event: Event::Conn(conn),
            method,
        }),
    }
}

impl Instance {
    fn log_error(&self, e: &str) {
        tracing::error!("[{}] {e}", self.plugin.name);
    }

    /// The instance's id, starting it on the server when it has none (or the server was
    /// started again since).
    async fn instance_id(&self) -> Result<i64, String> {
        let generation = self.plugin.server.generation();
        if let Some((id, g)) = *self.id.lock().unwrap_or_else(|e| e.into_inner()) {
            if g == generation {
                return Ok(id);
            }
        }
        let socket = &self.plugin.server.socket;
        let id = match self.plugin.server.protocol {
            Protocol::MsgPack => {
                let status = rpc::call(
                    socket,
                    "plugin.StartInstance",
                    rpc::map(vec![
                        ("Name", self.plugin.name.into()),
                        ("Config", self.config.as_str().into()),
                    ]),
                )
                .await
                .map_err(|e| format!("starting instance: {e}"))?;
                rpc::field(&status, "Id")
                    .and_then(rmpv::Value::as_i64)
                    .ok_or("starting instance: no Id in the answer")?
            }
            Protocol::ProtoBuf => pb::start_instance(socket, self.plugin.name, &self.config)
                .await
                .map_err(|e| format!("starting instance: {e}"))?,
        };
        *self.id.lock().unwrap_or_else(|e| e.into_inner()) = Some((id, generation));
        Ok(id)
    }

    /// `plugin.HandleEvent` for the phase; an instance the server no longer has is started
    /// again, once.
    async fn event(&self, phase: &'static str) -> Result<Step, String> {
        let mut retried = false;
        loop {
            let id = self.instance_id().await?;
            let socket = &self.plugin.server.socket;
            let answer = match self.plugin.server.protocol {
                Protocol::MsgPack => rpc::call(
                    socket,
                    "plugin.HandleEvent",
                    rpc::map(vec![("InstanceId", id.into()), ("EventName", phase.into())]),
                )
                .await
                .and_then(parse_step),
                Protocol::ProtoBuf => pb::handle_event(socket, id, phase).await.and_then(pb_step),
            };
            // The Go PDK's server closes the connection when it has no such instance.
            let lost = |e: &str| {
                let e = e.to_lowercase();
                e.contains("no plugin instance") || e.contains("closed")
            };
            match answer {
                Err(e) if !retried && lost(&e) => {
                    tracing::warn!("[{}] {e}", self.plugin.name);
                    *self.id.lock().unwrap_or_else(|e| e.into_inner()) = None;
                    retried = true;
                }
                other => return other,
            }
        }
    }

    /// Sends a PDK call's answer (or its failure) and reads what the server asks next. Over
    /// ProtoBuf a failed call ends the event, as in Kong.
    async fn step(
        &self,
        method: &str,
        event: Event,
        answer: Result<rmpv::Value, String>,
    ) -> Result<Step, String> {
        match event {
            Event::Id(id) => {
                let (step, data) = match answer {
                    Ok(v) => (step_method(method), v),
                    Err(e) => ("plugin.StepError", rmpv::Value::from(e)),
                };
                rpc::call(
                    &self.plugin.server.socket,
                    step,
                    rpc::map(vec![("EventId", id), ("Data", data)]),
                )
                .await
                .and_then(parse_step)
            }
            Event::Conn(conn) => {
                let v = answer?;
                pb::reply(conn, pb::answer(method, &v))
                    .await
                    .and_then(pb_step)
            }
        }
    }

    /// Kong's answer to a failed event: the MessagePack bridge logs it and the request goes
    /// on; the ProtoBuf one ends the request with a 500.
    fn failed(&self, e: &str) -> Access {
        match self.plugin.server.protocol {
            Protocol::MsgPack => {
                self.log_error(e);
                Access::Continue
            }
            Protocol::ProtoBuf => {
                self.log_error(&format!("pluginserver error: {e}"));
                Access::Exit(crate::Exit::message(
                    http::StatusCode::INTERNAL_SERVER_ERROR,
                    "An unexpected error occurred",
                ))
            }
        }
    }

    /// Who makes this instance's PDK calls: its plugin, its id in the worker's Lua state,
    /// and the snapshot's view they read.
    fn caller(&self) -> lua::Caller<'_> {
        (
            self.plugin.name,
            self as *const Self as usize as u64,
            Some(&self.dao),
        )
    }

    /// A PDK call's answer as the server gets it (`Ok`: the value or the error to send back),
    /// or the exit that ends the request.
    fn answered(&self, answer: PdkAnswer) -> Result<Result<rmpv::Value, String>, crate::Exit> {
        match answer {
            PdkAnswer::Exit(e) => Err(e),
            PdkAnswer::Value(v) => Ok(Ok(v)),
            PdkAnswer::Error(e) => {
                if e.contains("not implemented by Turnpike") {
                    self.log_error(&e);
                }
                Ok(Err(e))
            }
        }
    }

    /// Carries on with the request after the server's answer, until the phase ends.
    fn resume(
        self: Arc<Self>,
        phase: Phase,
        req: &mut AccessRequest<'_>,
        step: Result<Step, String>,
    ) -> Access {
        match step {
            Err(e) => self.failed(&e),
            Ok(Step::Ret) => Access::Continue,
            Ok(Step::Call {
                event,
                method,
                args,
            }) => {
                let answer =
                    lua::call_pdk(&self.settings, self.caller(), phase, req, &method, &args);
                // An exit ends the event with the request (the connection is dropped, as
                // Kong's ngx.exit leaves it).
                let answer = match self.answered(answer) {
                    Ok(a) => a,
                    Err(e) => return Access::Exit(e),
                };
                Access::Wait(Box::pin(async move {
                    let next = self.step(&method, event, answer).await;
                    Box::new(move |req: &mut AccessRequest<'_>| self.resume(phase, req, next))
                        as Resume
                }))
            }
        }
    }

    /// Carries on with the buffered response after the server's answer, until the phase ends:
    /// as `resume`, with the PDK over the response.
    fn resume_response(
        self: Arc<Self>,
        resp: &mut crate::ResponseHead<'_>,
        step: Result<Step, String>,
    ) -> crate::Responded {
        use crate::Responded;
        match step {
            Err(e) => match self.failed(&e) {
                Access::Exit(x) => Responded::Done(Some(x)),
                _ => Responded::Done(None),
            },
            Ok(Step::Ret) => Responded::Done(None),
            Ok(Step::Call {
                event,
                method,
                args,
            }) => {
                let answer =
                    lua::call_pdk_response(&self.settings, self.caller(), resp, &method, &args);
                let answer = match self.answered(answer) {
                    Ok(a) => a,
                    Err(e) => return Responded::Done(Some(e)),
                };
                Responded::Wait(Box::pin(async move {
                    let next = self.step(&method, event, answer).await;
                    Box::new(move |resp: &mut crate::ResponseHead<'_>| {
                        self.resume_response(resp, next)
                    }) as crate::RespResume
                }))
            }
        }
    }

    /// The log phase, from what the request left.
    async fn log(self: Arc<Self>, saved: Saved) {
        let mut step = self.event("log").await;
        loop {
            match step {
                Err(e) => return self.log_error(&e),
                Ok(Step::Ret) => return,
                Ok(Step::Call {
                    event,
                    method,
                    args,
                }) => {
                    let answer = saved.answer(self.plugin.name, &method, &args);
                    step = self.step(&method, event, answer).await;
                }
            }
        }
    }
}

/// Kong's typed step methods (`get_step_method` of `mp_rpc.lua`).
fn step_method(pdk_method: &str) -> &'static str {
    match pdk_method {
        "kong.client.get_credential" | "kong.client.authenticate" => "plugin.StepCredential",
        "kong.client.load_consumer" | "kong.client.get_consumer" => "plugin.StepConsumer",
        "kong.node.get_memory_stats" => "plugin.StepMemoryStats",
        "kong.router.get_route" => "plugin.StepRoute",
        "kong.router.get_service" => "plugin.StepService",
        "kong.request.get_query"
        | "kong.request.get_headers"
        | "kong.response.get_headers"
        | "kong.service.response.get_headers" => "plugin.StepMultiMap",
        _ => "plugin.Step",
    }
}

/// `{"Data": "ret" | {"Method": ..., "Args": [...]}, "EventId": ...}`.
fn parse_step(v: rmpv::Value) -> Result<Step, String> {
    let data = rpc::field(&v, "Data").ok_or("no Data in the plugin server's answer")?;
    if data.as_str() == Some("ret") {
        return Ok(Step::Ret);
    }
    let method = rpc::field(data, "Method")
        .and_then(rmpv::Value::as_str)
        .ok_or("neither ret nor a PDK call in the plugin server's answer")?;
    Ok(Step::Call {
        event: Event::Id(
            rpc::field(&v, "EventId")
                .cloned()
                .unwrap_or(rmpv::Value::Nil),
        ),
        method: method.to_string(),
        args: rpc::field(data, "Args")
            .cloned()
            .unwrap_or(rmpv::Value::Nil),
    })
}

/// What the log phase of an external plugin reads (Kong's saved request data).
struct Saved {
    serialized: String,
    request_headers: http::HeaderMap,
    response_headers: http::HeaderMap,
    status: u16,
    started_at: f64,
}

impl Saved {
    fn answer(
        &self,
        plugin: &str,
        method: &str,
        args: &rmpv::Value,
    ) -> Result<rmpv::Value, String> {
        let arg = |i: usize| -> Option<&str> { args.as_array()?.get(i)?.as_str() };
        let header = |map: &http::HeaderMap| {
            let v = arg(0).and_then(|n| map.get(n));
            v.map_or(rmpv::Value::Nil, |v| {
                String::from_utf8_lossy(v.as_bytes()).as_ref().into()
            })
        };
        Ok(match method {
            "kong.log.serialize" => self.serialized.as_str().into(),
            "kong.request.get_headers" => multimap(&self.request_headers),
            "kong.request.get_header" => header(&self.request_headers),
            "kong.response.get_headers" => multimap(&self.response_headers),
            "kong.response.get_header" => header(&self.response_headers),
            "kong.response.get_status" => self.status.into(),
            "kong.nginx.req_start_time" => rmpv::Value::F64(self.started_at),
            m if m.starts_with("kong.log.") => {
                let text: Vec<String> = args
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|a| match a.as_str() {
                        Some(s) => s.to_string(),
                        None => a.to_string(),
                    })
                    .collect();
                let text = text.concat();
                match &m["kong.log.".len()..] {
                    "err" | "crit" | "alert" | "emerg" => tracing::error!("[{plugin}] {text}"),
                    "warn" => tracing::warn!("[{plugin}] {text}"),
                    "debug" => tracing::debug!("[{plugin}] {text}"),
                    _ => tracing::info!("[{plugin}] {text}"),
                }
                rmpv::Value::Nil
            }
            other => {
                return Err(format!(
                    "PDK function '{other}' is not available in the log phase of an external plugin"
                ))
            }
        })
    }
}

/// Headers as the PDK's multimap: each name with the list of its values.
fn multimap(map: &http::HeaderMap) -> rmpv::Value {
    rmpv::Value::Map(
        map.keys()
            .map(|k| {
                let values = map
                    .get_all(k)
                    .iter()
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).as_ref().into())
                    .collect();
                (k.as_str().into(), rmpv::Value::Array(values))
            })
            .collect(),
    )
}

/// A config of an external plugin, as the phases run it.
struct ExternalHandler {
    inner: Arc<Instance>,
}

impl ExternalHandler {
    fn begin(&self, phase: Phase, event: &'static str) -> Access {
        let inner = self.inner.clone();
        Access::Wait(Box::pin(async move {
            let step = inner.event(event).await;
            Box::new(move |req: &mut AccessRequest<'_>| inner.resume(phase, req, step)) as Resume
        }))
    }
}

impl Handler for ExternalHandler {
    fn phases(&self) -> Phases {
        self.inner.plugin.phases
    }

    fn rewrite_waiting(&self, _req: &mut AccessRequest<'_>) -> Access {
        self.begin(Phase::Rewrite, "rewrite")
    }

    fn access(&self, _req: &mut AccessRequest<'_>) -> Access {
        if !self.inner.plugin.phases.has(Phases::ACCESS) {
            return Access::Continue;
        }
        self.begin(Phase::Access, "access")
    }

    fn response_waiting(&self, _resp: &mut crate::ResponseHead<'_>) -> crate::Responded {
        if !self.inner.plugin.phases.has(Phases::BUFFERED) {
            return crate::Responded::Done(None);
        }
        let inner = self.inner.clone();
        crate::Responded::Wait(Box::pin(async move {
            let step = inner.event("response").await;
            Box::new(move |resp: &mut crate::ResponseHead<'_>| inner.resume_response(resp, step))
                as crate::RespResume
        }))
    }

    fn log_headers(&self) -> bool {
        self.inner.plugin.phases.has(Phases::LOG)
    }

    fn log(&self, entry: &crate::log::LogEntry<'_>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let details = entry.details;
        let saved = Saved {
            serialized: entry.to_json_text(),
            request_headers: details
                .map(|d| d.request_headers.clone())
                .unwrap_or_default(),
            response_headers: details
                .map(|d| d.response_headers.clone())
                .unwrap_or_default(),
            status: entry.status,
            started_at: details
                .and_then(|d| d.started_at.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0.0, |d| d.as_secs_f64()),
        };
        rt.spawn(self.inner.clone().log(saved));
    }
}
