//! pre-function (Kong's serverless plugin, PRIORITY 1000000): the operator's Lua code, run
//! first in each phase. post-function shares this handler and runs last (see
//! `post_function`). The runtime and the PDK the code calls are in `crate::lua`.

pub mod schema;

use std::sync::Arc;

use bytes::Bytes;
use http::StatusCode;
use serde_json::Value;

use crate::lua::{self, Code, Outcome, Phase};
use crate::{
    Access, AccessRequest, BodyFilter, CertificateRequest, Exit, Handler, PluginSpec, ResponseHead,
};

/// pre-function and post-function: one plugin under two names and priorities, as Kong builds
/// both from `pre-function/_handler.lua` and `_schema.lua`.
pub struct ServerlessSpec {
    name: &'static str,
    priority: i32,
}

pub static PRE_FUNCTION: ServerlessSpec = ServerlessSpec::new("pre-function", 1_000_000);

impl ServerlessSpec {
    pub const fn new(name: &'static str, priority: i32) -> ServerlessSpec {
        ServerlessSpec { name, priority }
    }
}

impl PluginSpec for ServerlessSpec {
    fn name(&self) -> &'static str {
        self.name
    }
    fn priority(&self) -> i32 {
        self.priority
    }
    fn fields(&self) -> &'static [crate::schema::Field] {
        schema::FIELDS
    }
    fn entity_checks(&self, config: &Value) -> Vec<(String, String)> {
        schema::entity_checks(config)
    }
    fn lua_checks(&self, config: &Value, lua: &Arc<crate::lua::Settings>) -> Vec<(String, String)> {
        schema::lua_checks(self.name, config, lua)
    }
    fn allows_consumer(&self) -> bool {
        false
    }
    fn build(&self, config: &Value, ctx: &crate::BuildContext) -> Result<Arc<dyn Handler>, String> {
        let mut s = Serverless::new(self.name, config, ctx.runtime.lua.settings().clone());
        if let Some(code) = Arc::get_mut(&mut s.code) {
            code.keep_logs = crate::request_logs::wanted(ctx);
        }
        Ok(Arc::new(s))
    }
}

/// A pre-function or post-function config.
pub struct Serverless {
    code: Arc<Code>,
    /// Some function reads or replaces the request body: the proxy reads it first.
    wants_body: bool,
}

impl Serverless {
    pub fn new(plugin: &'static str, config: &Value, lua: Arc<crate::lua::Settings>) -> Serverless {
        let phases = schema::phases(config);
        // The body is read ahead only for code that asks for it (a name search: reading it
        // for every request would cost every request a buffer).
        let wants_body = phases.iter().flatten().any(|src| lua::reads_body(src));
        Serverless {
            code: Arc::new(Code::new(plugin, phases, lua)),
            wants_body,
        }
    }

    /// A Lua error in a request phase: logged, and the client gets Kong's 500.
    /// A handler over code made elsewhere (a custom plugin's, `crate::custom`).
    pub fn from_code(code: Code, wants_body: bool) -> Serverless {
        Serverless {
            code: Arc::new(code),
            wants_body,
        }
    }

    fn failed(&self, phase: Phase, e: &str) -> Exit {
        failed(&self.code, phase, e)
    }
}

/// A Lua error in a request phase: logged, and the client gets Kong's 500.
fn failed(code: &Code, phase: Phase, e: &str) -> Exit {
    tracing::error!("[{}] {}: {e}", code.plugin, phase.name());
    Exit::message(
        StatusCode::INTERNAL_SERVER_ERROR,
        "An unexpected error occurred",
    )
}

/// A rewrite or access phase's outcome as the proxy takes it: a wait (an operator's plugin
/// calling out with `resty.http`, sleeping) is performed without holding the worker, then the
/// code goes on from where it waited, as often as it waits.
fn request_outcome(code: &Arc<Code>, phase: Phase, outcome: Outcome) -> Access {
    match outcome {
        Outcome::Continue => Access::Continue,
        Outcome::Exit(e) => Access::Exit(e),
        Outcome::Failed(e) => Access::Exit(failed(code, phase, &e)),
        Outcome::Yield(suspended, op) => {
            let code = code.clone();
            Access::Wait(Box::pin(async move {
                let done = op.perform().await;
                Box::new(move |req: &mut AccessRequest<'_>| {
                    let outcome = lua::resume_request(&code, phase, req, suspended, done);
                    request_outcome(&code, phase, outcome)
                }) as crate::Resume
            }))
        }
    }
}

/// The body an exit in the header_filter phase gave, in place of the response's own.
struct Replaced(Option<Bytes>);

impl BodyFilter for Replaced {
    fn filter(&mut self, _piece: Bytes, eof: bool) -> Bytes {
        if eof {
            self.0.take().unwrap_or_default()
        } else {
            Bytes::new()
        }
    }
}

impl Handler for Serverless {
    /// The phases the config has code for.
    fn phases(&self) -> crate::Phases {
        use crate::Phases;
        let has = |p, set| if self.code.has(p) { set } else { Phases::NONE };
        has(Phase::Certificate, Phases::CERTIFICATE)
            | has(Phase::Rewrite, Phases::REWRITE)
            | has(Phase::Access, Phases::ACCESS)
            | has(Phase::HeaderFilter, Phases::RESPONSE)
            | has(Phase::BodyFilter, Phases::RESPONSE)
            // A response phase is one more response-filtering plugin, which buffers.
            | has(Phase::Response, Phases::RESPONSE | Phases::BUFFERED)
            | has(Phase::Log, Phases::LOG)
    }
    fn certificate(&self, hello: &CertificateRequest<'_>) -> Result<(), String> {
        lua::run_certificate(&self.code, hello)
    }
    fn rewrite(&self, req: &mut AccessRequest<'_>) -> Option<Exit> {
        match lua::run_request(&self.code, Phase::Rewrite, req) {
            Outcome::Continue => None,
            Outcome::Exit(e) => Some(e),
            Outcome::Failed(e) => Some(self.failed(Phase::Rewrite, &e)),
            Outcome::Yield(..) => Some(self.failed(Phase::Rewrite, "cannot wait here")),
        }
    }
    fn rewrite_waiting(&self, req: &mut AccessRequest<'_>) -> Access {
        let outcome = lua::run_request(&self.code, Phase::Rewrite, req);
        request_outcome(&self.code, Phase::Rewrite, outcome)
    }
    fn access(&self, req: &mut AccessRequest<'_>) -> Access {
        if !self.code.has(Phase::Access) {
            return Access::Continue;
        }
        let outcome = lua::run_request(&self.code, Phase::Access, req);
        request_outcome(&self.code, Phase::Access, outcome)
    }
    fn header_filter(&self, resp: &mut ResponseHead<'_>) -> Option<Box<dyn BodyFilter>> {
        if self.code.has(Phase::HeaderFilter) {
            match lua::run_response(&self.code, Phase::HeaderFilter, resp) {
                Outcome::Continue | Outcome::Yield(..) => {}
                // Kong's exit in header_filter: its status and headers, and its body in place
                // of the one that was coming (`ctx.response_body`, sent by body_filter).
                Outcome::Exit(e) => {
                    resp.status = e.status;
                    // Its length, unless the exit's headers name one (Kong's `send`).
                    resp.headers
                        .insert(http::header::CONTENT_LENGTH, e.body.len().into());
                    for (k, v) in e.headers {
                        resp.headers.insert(k, v);
                    }
                    return Some(Box::new(Replaced(Some(e.body))));
                }
                // The head is the upstream's already: it goes out as the code left it.
                Outcome::Failed(e) => {
                    tracing::error!("[{}] header_filter: {e}", self.code.plugin)
                }
            }
        }
        self.code.has(Phase::BodyFilter).then(|| {
            Box::new(lua::LuaBodyFilter::new(self.code.clone(), resp.ctx)) as Box<dyn BodyFilter>
        })
    }
    fn response(&self, resp: &mut ResponseHead<'_>) -> Option<Exit> {
        if !self.code.has(Phase::Response) {
            return None;
        }
        match lua::run_response(&self.code, Phase::Response, resp) {
            Outcome::Continue => None,
            Outcome::Exit(e) => Some(e),
            Outcome::Failed(e) => Some(self.failed(Phase::Response, &e)),
            Outcome::Yield(..) => Some(self.failed(Phase::Response, "cannot wait here")),
        }
    }
    fn wants_body(&self) -> bool {
        self.wants_body
    }
    fn log(&self, entry: &crate::log::LogEntry<'_>) {
        if let Outcome::Failed(e) = lua::run_log(&self.code, entry) {
            tracing::error!("[{}] log: {e}", self.code.plugin);
        }
    }
    fn log_headers(&self) -> bool {
        // kong.log.serialize() and the client's address need the request's details.
        self.code.has(Phase::Log)
    }
}
