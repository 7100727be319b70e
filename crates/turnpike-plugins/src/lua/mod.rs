//! The Lua runtime behind Kong's serverless plugins (pre-function, post-function): Lua code an
//! operator puts in a plugin config, run in Kong's phases with a subset of Kong's PDK
//! (`kong.request`, `kong.response`, `kong.service.request`, `kong.client`, `kong.log`,
//! `kong.ctx`, ...) and of OpenResty's `ngx` (see `pdk.rs`).
//!
//! LuaJIT, as Kong's. Each worker thread has its own state (workers never share a request,
//! and a state is single-threaded), made on first use; a config's functions are compiled in
//! it once, on the first request that needs them after a config change, and kept while the
//! config's handler lives. Per call, the PDK reaches the request through a thread-local
//! pointer set for the call's length: no per-request allocation unless the code asks for a
//! table (`kong.ctx.shared`, `kong.request.get_headers()`).
//!
//! The `untrusted_lua` property decides what the code may reach, as in Kong: `sandbox` (the
//! default: a whitelist of Lua's standard library, `kong`, `ngx`, and `require` of only the
//! modules `untrusted_lua_sandbox_requires` names), `on` (all of Lua, io and os included) or
//! `off` (configs with Lua code are refused).
//!
//! What the code cannot do: yield (no cosockets, `ngx.sleep`, `ngx.location.capture`), reach
//! Kong's database (`kong.db`, `kong.cache`), or be stopped once it runs: a function that loops
//! forever holds its worker, as it would hold an nginx worker in Kong.

pub mod api;
mod budget;
mod cache;
mod cosocket;
pub mod db;
mod external;
mod pdk;
mod sandbox;
pub mod shared;
mod yields;

pub use external::{call_pdk, call_pdk_response, Caller, PdkAnswer};
pub use yields::{Done, Op};

use std::cell::RefCell;
use std::sync::{Arc, OnceLock, Weak};

use bytes::Bytes;
use mlua::{Function, Lua, Table, Value};
use rustc_hash::FxHashMap;

use crate::{AccessRequest, CertificateRequest, Exit, PluginCtx, ResponseHead};

/// Whether Lua source reads or replaces the request body (the proxy then reads the body
/// before the access phase): a search for the PDK's body functions, so that code that never
/// asks does not cost every request a buffer.
pub fn reads_body(source: &str) -> bool {
    [
        "get_raw_body",
        "get_body",
        "set_raw_body",
        "set_body",
        "read_body",
        "get_post_args",
    ]
    .iter()
    .any(|f| source.contains(f))
}

/// Kong's `untrusted_lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    Off,
    #[default]
    Sandbox,
    On,
}

/// The `untrusted_lua*` properties.
#[derive(Debug, Clone)]
pub struct Settings {
    pub mode: Mode,
    /// `untrusted_lua_sandbox_requires`: modules `require` may load in the sandbox.
    pub requires: Vec<String>,
    /// `untrusted_lua_sandbox_environment`: globals (`os.getenv`, ...) added to the sandbox.
    pub environment: Vec<String>,
    /// `lua_package_path`: where custom plugins (`kong.plugins.<name>.handler`) and the
    /// modules they require are found, before Lua's own path.
    pub package_path: String,
    /// The node's `ngx.shared` dictionaries, shared by its worker threads.
    pub shared: Arc<shared::SharedDicts>,
    /// `kong.cache`'s defaults, in seconds (0: no expiry): `db_cache_ttl`, `db_cache_neg_ttl`.
    pub cache_ttl: f64,
    pub cache_neg_ttl: f64,
    /// The node's id (`kong.node.get_id()`).
    pub node_id: String,
    /// How many worker threads the node runs (`ngx.worker.count()`).
    pub workers: usize,
    /// The node's `trusted_ips` (`kong.ip.is_trusted`).
    pub trusted_ips: Vec<(std::net::IpAddr, u8)>,
    /// `kong.cache`'s generation, node-wide: an invalidation moves it on, and each worker's
    /// state empties its cache when it sees it moved (`cache`).
    pub cache_generation: Arc<std::sync::atomic::AtomicU64>,
    /// Stops calls that run past their time budget (`budget`), one for the node.
    pub watchdog: Arc<budget::Watchdog>,
    /// `lua_time_budget`: how long one call may run (`None`: no bound, the JIT compiler on).
    pub budget: Option<std::time::Duration>,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            mode: Mode::default(),
            requires: Vec::new(),
            environment: Vec::new(),
            package_path: String::new(),
            shared: Arc::default(),
            cache_ttl: 0.0,
            cache_neg_ttl: 0.0,
            node_id: String::new(),
            workers: 1,
            trusted_ips: Vec::new(),
            cache_generation: Arc::default(),
            watchdog: Arc::default(),
            budget: Some(budget::DEFAULT),
        }
    }
}

impl Settings {
    /// From the properties' values (`untrusted_lua` is `on`, `off` or `sandbox`; the lists are
    /// comma-separated).
    pub fn parse(mode: &str, requires: &str, environment: &str) -> Result<Settings, String> {
        let mode = match mode.trim() {
            "on" => Mode::On,
            "off" => Mode::Off,
            "sandbox" => Mode::Sandbox,
            other => {
                return Err(format!(
                    "untrusted_lua: '{other}' is not one of on, off, sandbox"
                ))
            }
        };
        let list = |s: &str| -> Vec<String> {
            s.split(',')
                .map(|p| p.trim().to_string())
                .filter(|p| !p.is_empty())
                .collect()
        };
        Ok(Settings {
            mode,
            requires: list(requires),
            environment: list(environment),
            ..Settings::default()
        })
    }
}

/// Lua's part of the node's [`crate::Runtime`]: the `untrusted_lua*` properties.
#[derive(Default)]
pub struct State {
    settings: OnceLock<Arc<Settings>>,
}

impl State {
    /// Sets the node's `untrusted_lua*` properties, once, before any config is checked.
    pub fn configure(&self, settings: Settings) {
        let _ = self.settings.set(Arc::new(settings));
    }

    pub fn settings(&self) -> &Arc<Settings> {
        self.settings.get_or_init(Default::default)
    }
}

/// Kong's message when `untrusted_lua = off`.
pub const DISABLED: &str =
    "loading of untrusted Lua code disabled because 'untrusted_lua' config option is set to 'off'";

/// The phases a serverless config has functions for, in Kong's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Certificate,
    Rewrite,
    Access,
    HeaderFilter,
    BodyFilter,
    Log,
    /// Kong's response phase (a plugin's handler only; serverless configs have none).
    Response,
}

/// How many phases there are (`Phase as usize` indexes a config's per-phase lists).
pub const PHASES: usize = 7;

impl Phase {
    /// The phases a handler's methods may name, in the order Kong runs them.
    pub const HANDLER: [Phase; PHASES] = [
        Phase::Certificate,
        Phase::Rewrite,
        Phase::Access,
        Phase::Response,
        Phase::HeaderFilter,
        Phase::BodyFilter,
        Phase::Log,
    ];

    /// The serverless plugins' phases (pre-function's schema fields), in Kong's order.
    pub const ALL: [Phase; 6] = [
        Phase::Certificate,
        Phase::Rewrite,
        Phase::Access,
        Phase::HeaderFilter,
        Phase::BodyFilter,
        Phase::Log,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Certificate => "certificate",
            Phase::Rewrite => "rewrite",
            Phase::Access => "access",
            Phase::HeaderFilter => "header_filter",
            Phase::BodyFilter => "body_filter",
            Phase::Log => "log",
            Phase::Response => "response",
        }
    }
}

/// A config's Lua functions, by phase, as written. Compiled per worker thread on first use.
pub struct Code {
    /// Identifies this config's compiled functions in each thread's state.
    id: u64,
    /// The plugin's name, for log lines (`[pre-function] ...`).
    pub plugin: &'static str,
    pub phases: [Vec<String>; PHASES],
    /// Dropped with the handler: a thread's state then frees the compiled functions the next
    /// time it compiles something. Its address is the config's `id` while it lives.
    alive: Arc<()>,
    /// The node's `untrusted_lua*` properties, which the thread's state is made with.
    settings: Arc<Settings>,
    /// Its log lines are kept in the request for OTLP logs (`crate::request_logs::wanted`).
    pub keep_logs: bool,
    /// The operator's own plugin (`crate::custom`), installed as Kong's are: its chunks see
    /// all of Lua and `require` from `lua_package_path`, not the sandbox.
    pub trusted: bool,
    /// Its entities in the configuration it was built for (`kong.db`).
    pub dao: Option<Arc<db::Dao>>,
    /// The plugin entity's id (`kong.plugin.get_id`).
    pub config_id: Option<Arc<str>>,
}

impl Code {
    pub fn new(
        plugin: &'static str,
        phases: [Vec<String>; PHASES],
        settings: Arc<Settings>,
    ) -> Code {
        // `alive`'s allocation (its counts) is this config's own while it lives: its address
        // is the id, with no counter shared by the process.
        let alive = Arc::new(());
        Code {
            id: Arc::as_ptr(&alive) as usize as u64,
            plugin,
            phases,
            alive,
            settings,
            keep_logs: false,
            trusted: false,
            dao: None,
            config_id: None,
        }
    }

    /// This thread's compiled functions of this config, if compiled (and not those of a
    /// config that lived at the same address before).
    fn compiled<'r>(&self, rt: &'r mut Runtime) -> Option<&'r mut Compiled> {
        rt.compiled.get_mut(&self.id).filter(|c| {
            std::ptr::eq(c.alive.as_ptr(), Arc::as_ptr(&self.alive)) && c.alive.strong_count() > 0
        })
    }

    pub fn has(&self, phase: Phase) -> bool {
        !self.phases[phase as usize].is_empty()
    }
}

/// Checks that `code` is Lua the node would load: it compiles, and `untrusted_lua` is not off.
/// Kong's message for a syntax error names the plugin.
pub fn check(plugin: &str, code: &str, settings: &Arc<Settings>) -> Result<(), String> {
    if settings.mode == Mode::Off {
        return Err(DISABLED.into());
    }
    with_runtime(settings, |rt| {
        rt.lua
            .load(code)
            .set_name(code)
            .set_mode(mlua::chunk::ChunkMode::Text)
            .into_function()
            .map(|_| ())
            .map_err(|e| {
                let msg = match &e {
                    mlua::Error::SyntaxError { message, .. } => message.clone(),
                    other => other.to_string(),
                };
                format!("error parsing {plugin}: {}", first_line(&msg))
            })
    })?
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}

/// A function of a config, as Kong runs them: the chunk runs on the first request; if it
/// returns a function, that function is the handler from then on (and runs for that request
/// too), which lets the chunk keep state in upvalues.
enum Slot {
    First(Function),
    Ready(Function),
}

struct Compiled {
    alive: Weak<()>,
    phases: [Vec<Slot>; PHASES],
}

/// One worker thread's Lua state.
struct Runtime {
    lua: Lua,
    /// What each chunk's globals fall back to: the sandbox, or `_G` when `untrusted_lua = on`.
    env: Table,
    compiled: FxHashMap<u64, Compiled>,
    /// The PDK by dotted name, for external plugin servers (`external`), made on first use.
    exposed: Option<Function>,
    /// Finished coroutines, reused for the next waiting call (`yields`).
    threads: Vec<mlua::Thread>,
    /// Empties this state's `kong.cache`, and the node generation it last saw.
    cache_flush: Function,
    cache_seen: u64,
    /// This state's place in the node's watchdog (`budget`), when calls have a budget.
    slot: Option<Arc<budget::Slot>>,
    watchdog: Arc<budget::Watchdog>,
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(slot) = &self.slot {
            self.watchdog.forget(slot);
        }
    }
}

thread_local! {
    /// This worker thread's Lua state, and the settings it was made with.
    static RUNTIME: RefCell<Option<(Weak<Settings>, Runtime)>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's Lua state for `settings`, made on first use (or again if the
/// thread ran another node's, which only tests do). A state that cannot be made (out of
/// memory) is an error for the caller to report, and is tried again next time.
fn with_runtime<R>(
    settings: &Arc<Settings>,
    f: impl FnOnce(&mut Runtime) -> R,
) -> Result<R, String> {
    RUNTIME.with(|cell| {
        let mut slot = cell.borrow_mut();
        let current = slot.as_ref().is_some_and(|(s, _)| {
            std::ptr::eq(s.as_ptr(), Arc::as_ptr(settings)) && s.strong_count() > 0
        });
        if !current {
            let rt = Runtime::new(settings).map_err(|e| format!("cannot start Lua: {e}"))?;
            *slot = Some((Arc::downgrade(settings), rt));
        }
        match slot.as_mut() {
            Some((_, rt)) => {
                // Another worker invalidated kong.cache since this state last ran: empty its
                // part first (one atomic load when nothing moved).
                let generation = settings
                    .cache_generation
                    .load(std::sync::atomic::Ordering::Relaxed);
                if generation != rt.cache_seen {
                    rt.cache_seen = generation;
                    if let Err(e) = rt.cache_flush.call::<()>(()) {
                        tracing::error!("kong.cache: {e}");
                    }
                }
                let _running = rt.slot.as_ref().map(budget::begin);
                Ok(f(rt))
            }
            None => Err("no Lua state".into()),
        }
    })
}

impl Runtime {
    fn new(settings: &Settings) -> mlua::Result<Runtime> {
        let lua = Lua::new();
        // The interpreter only: compiled loops would not see the budget's hook (`budget`).
        if settings.budget.is_some() {
            // The interpreter only: compiled loops would not see the budget's hook.
            lua.load("if jit then jit.off() end").exec()?;
            budget::guard_catchers(&lua)?;
        }
        let (kong, ngx) = pdk::install(&lua)?;
        ngx.set("shared", shared::table(&lua, &settings.shared)?)?;
        yields::install_on(&lua, &ngx)?;
        cosocket::install(&lua, &ngx, yields::OP_KEY)?;
        pdk::install_misc(&lua, &ngx, settings.workers)?;
        // kong.cache reads ngx (now, shared) as a global when it runs.
        lua.globals().set("ngx", ngx.clone())?;
        let generation = settings.cache_generation.clone();
        let next_generation = lua.create_function(move |_, ()| {
            generation.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        })?;
        let (cache, cache_flush): (Table, Function) = lua
            .load(cache::CACHE)
            .set_name("=kong.cache")
            .call((settings.cache_ttl, settings.cache_neg_ttl, next_generation))?;
        kong.set("cache", cache)?;
        db::install(&lua, &kong, yields::OP_KEY)?;
        // Kong's Admin API helpers, which api.lua modules require: each gives a handler that
        // fails naming it when called.
        lua.load(
            r#"package.preload["kong.api.endpoints"] = function()
              return setmetatable({}, { __index = function(_, k)
                return function() return function()
                  error("kong.api.endpoints." .. k .. " is not implemented by Turnpike", 2)
                end end
              end })
            end"#,
        )
        .exec()?;
        let cache_seen = settings
            .cache_generation
            .load(std::sync::atomic::Ordering::Relaxed);
        pdk::install_node(&lua, &kong, &settings.node_id)?;
        pdk::install_ip(&lua, &kong, settings.trusted_ips.clone())?;
        let env = sandbox::environment(&lua, settings, &kong, &ngx)?;
        // Trusted code (custom plugins) runs in `_G`: the PDK there too, and `require` looking
        // in `lua_package_path` first. Sandboxed chunks never reach `_G`.
        let globals = lua.globals();
        globals.set("kong", kong)?;
        globals.set("ngx", ngx)?;
        if !settings.package_path.is_empty() {
            let package: Table = globals.get("package")?;
            let path: String = package.get("path")?;
            package.set("path", format!("{};{path}", settings.package_path))?;
        }
        // Last: nothing can fail once the watchdog knows the state.
        let slot = settings.budget.map(|b| settings.watchdog.register(&lua, b));
        Ok(Runtime {
            lua,
            env,
            compiled: FxHashMap::default(),
            exposed: None,
            threads: Vec::new(),
            cache_flush,
            cache_seen,
            slot,
            watchdog: settings.watchdog.clone(),
        })
    }

    /// Compiles a config's functions into this state: each chunk gets its own globals table
    /// (as in Kong), which falls back to the environment.
    fn compile(&mut self, code: &Code) -> mlua::Result<()> {
        // Functions of configs that are gone are freed here, when a new config arrives.
        self.compiled.retain(|_, c| c.alive.strong_count() > 0);
        let mut phases: [Vec<Slot>; PHASES] = Default::default();
        let meta = self.lua.create_table()?;
        if code.trusted {
            meta.set("__index", self.lua.globals())?;
        } else {
            meta.set("__index", self.env.clone())?;
        }
        for (i, funcs) in code.phases.iter().enumerate() {
            for src in funcs {
                let globals = self.lua.create_table()?;
                globals.set_metatable(Some(meta.clone()))?;
                let f = self
                    .lua
                    .load(src.as_str())
                    .set_name(src.as_str())
                    .set_mode(mlua::chunk::ChunkMode::Text)
                    .set_environment(globals)
                    .into_function()?;
                phases[i].push(Slot::First(f));
            }
        }
        self.compiled.insert(
            code.id,
            Compiled {
                alive: Arc::downgrade(&code.alive),
                phases,
            },
        );
        Ok(())
    }
}

/// What the PDK reaches during a call: the request or response the phase has.
pub(crate) enum Target {
    None,
    Certificate {
        server_name: Option<String>,
    },
    /// The rewrite and access phases.
    Request(*mut AccessRequest<'static>),
    Response(*mut ResponseHead<'static>),
    Body(*mut BodyChunk),
    Log(*const crate::log::LogEntry<'static>),
    /// A stream session's log phase (no request: `kong.request` and the like are not there).
    StreamLog(*const crate::log::StreamLogEntry<'static>),
}

/// The body_filter phase's view of one piece of the body (`ngx.arg`).
pub(crate) struct BodyChunk {
    /// `ngx.arg[1]`: what the client gets for this piece (`None`: nothing).
    pub piece: Option<Bytes>,
    /// `ngx.arg[2]`: the body has ended.
    pub eof: bool,
    /// What `kong.response.get_raw_body()` has gathered so far.
    pub gathered: Vec<u8>,
}

/// The call in progress on this thread.
pub(crate) struct Current {
    pub target: Target,
    pub phase: Phase,
    pub plugin: &'static str,
    pub plugin_id: u64,
    pub ctx: *mut PluginCtx,
    /// The running code's `keep_logs`.
    pub keep_logs: bool,
    /// A response the code asked for (`kong.response.exit`, `ngx.exit`).
    pub exit: Option<Exit>,
    /// What `ngx.say`/`ngx.print` wrote: the response body, if the code then exits.
    pub said: Vec<u8>,
    /// The status `kong.response.set_status` gave before there is a response (an Admin API
    /// handler's, `api`).
    pub status: Option<http::StatusCode>,
    /// The running plugin entity's id (`kong.plugin.get_id`).
    pub config_id: Option<Arc<str>>,
}

thread_local! {
    pub(crate) static CURRENT: RefCell<Current> = const { RefCell::new(Current {
        target: Target::None,
        phase: Phase::Access,
        plugin: "",
        plugin_id: 0,
        ctx: std::ptr::null_mut(),
        keep_logs: false,
        exit: None,
        said: Vec::new(),
        status: None,
        config_id: None,
    }) };
}

/// The per-request tables the code keeps between phases (`kong.ctx.shared`,
/// `kong.ctx.plugin`, `ngx.ctx`), stored in the request's `PluginCtx`.
pub(crate) struct LuaCtx {
    pub shared: Table,
    pub ngx: Table,
    pub plugin: FxHashMap<u64, Table>,
}

impl LuaCtx {
    /// `kong.ctx.shared.authenticated_groups`, when it is a table.
    pub(crate) fn shared_authenticated_groups(&self) -> Option<Vec<String>> {
        groups_in(&self.shared, false)
    }

    /// `ngx.ctx.authenticated_groups`, when it is a table (warned about when it is
    /// something else, as Kong's acl does).
    pub(crate) fn ngx_authenticated_groups(&self) -> Option<Vec<String>> {
        groups_in(&self.ngx, true)
    }
}

/// `t.authenticated_groups` as a list of names. Raw reads: no metamethod runs outside a phase.
fn groups_in(t: &Table, warn: bool) -> Option<Vec<String>> {
    match t.raw_get::<Value>("authenticated_groups").ok()? {
        Value::Table(g) => Some(
            (1..=g.raw_len())
                .filter_map(|i| match g.raw_get::<Value>(i).ok()? {
                    Value::String(s) => Some(s.to_str().ok()?.to_string()),
                    Value::Integer(n) => Some(n.to_string()),
                    Value::Number(n) => Some(n.to_string()),
                    _ => None,
                })
                .collect(),
        ),
        Value::Nil => None,
        _ => {
            if warn {
                tracing::warn!("invalid authenticated_groups, a table was expected");
            }
            None
        }
    }
}

/// How a phase's functions ended.
pub enum Outcome {
    Continue,
    /// The code answered the request.
    Exit(Exit),
    /// A Lua error: the message, as Kong logs it.
    Failed(String),
    /// The code waits for an operation (`yields`): perform it, then `resume_request`.
    Yield(Suspended, Op),
}

/// A phase's functions, stopped while one of them waits.
pub struct Suspended {
    thread: mlua::Thread,
    /// The function that waits; the ones after it run once it ends.
    slot: usize,
}

/// Clears `CURRENT` when the call ends, however it ends.
pub(crate) struct CallGuard;

impl Drop for CallGuard {
    fn drop(&mut self) {
        CURRENT.with(|c| {
            let mut c = c.borrow_mut();
            c.target = Target::None;
            c.ctx = std::ptr::null_mut();
            c.exit = None;
            c.said.clear();
            c.status = None;
            c.config_id = None;
        });
    }
}

/// Points the PDK at `target` for a call of `plugin`'s Lua (the config `plugin_id`) in
/// `phase`; the guard clears it when the call ends, however it ends.
pub(crate) fn enter(
    target: Target,
    phase: Phase,
    plugin: &'static str,
    plugin_id: u64,
    ctx: *mut PluginCtx,
    keep_logs: bool,
) -> CallGuard {
    CURRENT.with(|c| {
        let mut c = c.borrow_mut();
        c.target = target;
        c.phase = phase;
        c.plugin = plugin;
        c.plugin_id = plugin_id;
        c.ctx = ctx;
        c.keep_logs = keep_logs;
    });
    CallGuard
}

/// Runs `code`'s functions for `phase`, in order, with the PDK pointed at `target`.
pub(crate) fn run(code: &Code, phase: Phase, target: Target, ctx: *mut PluginCtx) -> Outcome {
    let _guard = enter(target, phase, code.plugin, code.id, ctx, code.keep_logs);
    let _dao = db::enter(code.dao.as_ref());
    if let Some(id) = &code.config_id {
        CURRENT.with(|c| c.borrow_mut().config_id = Some(id.clone()));
    }
    with_runtime(&code.settings, |rt| {
        if code.compiled(rt).is_none() {
            if let Err(e) = rt.compile(code) {
                return Outcome::Failed(e.to_string());
            }
        }
        // An operator's plugin may wait in the phases that can (`yields`).
        let waits = code.trusted && matches!(phase, Phase::Rewrite | Phase::Access);
        run_slots(rt, code, phase, 0, None, waits)
    })
    .unwrap_or_else(Outcome::Failed)
}

/// Carries on with a phase stopped at a wait, the operation `done`.
pub fn resume_request(
    code: &Code,
    phase: Phase,
    req: &mut AccessRequest<'_>,
    suspended: Suspended,
    done: Done,
) -> Outcome {
    let ctx: *mut PluginCtx = &mut *req.ctx;
    let target = Target::Request(std::ptr::from_mut(req).cast());
    let _guard = enter(target, phase, code.plugin, code.id, ctx, code.keep_logs);
    let _dao = db::enter(code.dao.as_ref());
    if let Some(id) = &code.config_id {
        CURRENT.with(|c| c.borrow_mut().config_id = Some(id.clone()));
    }
    with_runtime(&code.settings, |rt| {
        if code.compiled(rt).is_none() {
            return Outcome::Failed("the plugin's code changed while it waited".into());
        }
        let value = match yields::result_value(&rt.lua, done) {
            Ok(v) => v,
            Err(e) => return Outcome::Failed(e.to_string()),
        };
        let Suspended { thread, slot } = suspended;
        run_slots(rt, code, phase, slot, Some((thread, value)), true)
    })
    .unwrap_or_else(Outcome::Failed)
}

/// Runs the phase's functions from `start` (the first resuming `resumed`), in order.
fn run_slots(
    rt: &mut Runtime,
    code: &Code,
    phase: Phase,
    start: usize,
    mut resumed: Option<(mlua::Thread, Value)>,
    waits: bool,
) -> Outcome {
    let count = code
        .compiled(rt)
        .map_or(0, |c| c.phases[phase as usize].len());
    for i in start..count {
        let outcome = if let Some((thread, value)) = resumed.take() {
            match yields::drive(&mut rt.threads, thread, value) {
                yields::Driven::Done(r) => ended(r, phase),
                yields::Driven::Yielded(thread, op) => {
                    return Outcome::Yield(Suspended { thread, slot: i }, op)
                }
            }
        } else {
            let Some(compiled) = code.compiled(rt) else {
                return Outcome::Failed("compiled functions missing".into());
            };
            let slot = &mut compiled.phases[phase as usize][i];
            // Kong's first run: a returned function is the handler from now on, and runs now.
            let handler = match slot {
                Slot::Ready(f) if !waits => {
                    // Called in place: nothing the code can reach (the PDK) touches the
                    // runtime, and not cloning saves a registry round trip per call.
                    let r = f.call::<()>(());
                    let outcome = ended(r, phase);
                    if !matches!(outcome, Outcome::Continue) {
                        return outcome;
                    }
                    continue;
                }
                Slot::Ready(f) => Ok(f.clone()),
                Slot::First(f) => {
                    let result = f.call::<Value>(());
                    let exited = CURRENT.with(|c| c.borrow().exit.is_some());
                    match result {
                        Ok(Value::Function(h)) if !exited => {
                            *slot = Slot::Ready(h.clone());
                            Ok(h)
                        }
                        other => {
                            let f = f.clone();
                            *slot = Slot::Ready(f);
                            Err(ended(other.map(|_| ()), phase))
                        }
                    }
                }
            };
            match handler {
                Err(outcome) => outcome,
                Ok(h) if !waits => ended(h.call::<()>(()), phase),
                Ok(h) => {
                    let thread = match yields::thread_for(&rt.lua, &mut rt.threads, h) {
                        Ok(t) => t,
                        Err(e) => return Outcome::Failed(e.to_string()),
                    };
                    match yields::drive(&mut rt.threads, thread, Value::Nil) {
                        yields::Driven::Done(r) => ended(r, phase),
                        yields::Driven::Yielded(thread, op) => {
                            return Outcome::Yield(Suspended { thread, slot: i }, op)
                        }
                    }
                }
            }
        };
        if !matches!(outcome, Outcome::Continue) {
            return outcome;
        }
    }
    Outcome::Continue
}

/// What one function's call means for the request.
fn ended(result: mlua::Result<()>, phase: Phase) -> Outcome {
    let (exit, said) = CURRENT.with(|c| {
        let mut c = c.borrow_mut();
        (c.exit.take(), std::mem::take(&mut c.said))
    });
    if let Some(e) = exit {
        return Outcome::Exit(e);
    }
    if let Err(e) = result {
        if pdk::is_stop(&e) {
            return Outcome::Continue;
        }
        return Outcome::Failed(e.to_string());
    }
    // Output written with ngx.say and no exit: nginx would have sent it as a 200.
    if !said.is_empty() && matches!(phase, Phase::Rewrite | Phase::Access) {
        return Outcome::Exit(pdk::said_exit(http::StatusCode::OK, said));
    }
    Outcome::Continue
}

/// The certificate phase: an error or an exit aborts the handshake.
pub fn run_certificate(code: &Code, hello: &CertificateRequest<'_>) -> Result<(), String> {
    let target = Target::Certificate {
        server_name: hello.server_name.map(str::to_string),
    };
    match run(code, Phase::Certificate, target, std::ptr::null_mut()) {
        Outcome::Continue => Ok(()),
        Outcome::Yield(..) => Err("cannot wait in the certificate phase".into()),
        Outcome::Exit(e) => Err(format!("exited with {}", e.status.as_u16())),
        Outcome::Failed(e) => Err(e),
    }
}

/// The rewrite or access phase.
pub fn run_request(code: &Code, phase: Phase, req: &mut AccessRequest<'_>) -> Outcome {
    let ctx: *mut PluginCtx = &mut *req.ctx;
    let target = Target::Request(std::ptr::from_mut(req).cast());
    run(code, phase, target, ctx)
}

/// The header_filter phase, or the response phase (`Phase::Response`, over a buffered
/// response).
pub fn run_response(code: &Code, phase: Phase, head: &mut ResponseHead<'_>) -> Outcome {
    let ctx: *mut PluginCtx = &mut *head.ctx;
    let target = Target::Response(std::ptr::from_mut(head).cast());
    run(code, phase, target, ctx)
}

/// The log phase.
pub fn run_log(code: &Code, entry: &crate::log::LogEntry<'_>) -> Outcome {
    let ctx = entry.ctx.map_or(std::ptr::null_mut(), |c| {
        c as *const PluginCtx as *mut PluginCtx
    });
    let target = Target::Log(std::ptr::from_ref(entry).cast());
    run(code, Phase::Log, target, ctx)
}

/// The body_filter phase of one response: its `kong.ctx` tables are taken from the request's
/// context when the header_filter phase builds it, since the body outlives that borrow.
pub struct LuaBodyFilter {
    code: Arc<Code>,
    ctx: PluginCtx,
    gathered: Vec<u8>,
}

impl LuaBodyFilter {
    pub fn new(code: Arc<Code>, ctx: &PluginCtx) -> LuaBodyFilter {
        let mut own = PluginCtx::default();
        if let Some(c) = ctx.get::<LuaCtx>() {
            own.insert(LuaCtx {
                shared: c.shared.clone(),
                ngx: c.ngx.clone(),
                plugin: c.plugin.clone(),
            });
        }
        LuaBodyFilter {
            code,
            ctx: own,
            gathered: Vec::new(),
        }
    }
}

impl crate::BodyFilter for LuaBodyFilter {
    fn filter(&mut self, piece: Bytes, eof: bool) -> Bytes {
        let mut chunk = BodyChunk {
            piece: Some(piece.clone()),
            eof,
            gathered: std::mem::take(&mut self.gathered),
        };
        let outcome = run(
            &self.code,
            Phase::BodyFilter,
            Target::Body(&mut chunk),
            &mut self.ctx,
        );
        self.gathered = chunk.gathered;
        match outcome {
            Outcome::Continue | Outcome::Exit(_) | Outcome::Yield(..) => {
                chunk.piece.unwrap_or_default()
            }
            Outcome::Failed(e) => {
                tracing::error!("[{}] body_filter: {e}", self.code.plugin);
                piece
            }
        }
    }
}

#[cfg(test)]
mod tests;

mod inspect;
mod log_fields;

pub use inspect::{inspect_plugin, ModuleInfo};
pub use log_fields::{check_log_fields, log_text, stream_log_text, LogFields};
