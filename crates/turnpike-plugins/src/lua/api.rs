//! An operator's plugin's own Admin API endpoints (Kong's `api.lua`): a table of routes
//! (`["/my-path/:param"] = { before = ..., GET = function(self, db, helpers) ... end }`, or
//! with the methods under `methods`, as Kong 3's routes are written), served by the Admin API
//! beside Kong's own. A handler gets Kong's `self` (`self.params`: the route's parameters, the
//! query's arguments and the body's fields), `kong.db` and the PDK: it answers with
//! `kong.response.exit`, or with `kong.response.set_status`/`set_header` and `ngx.print`.
//!
//! What Kong's helpers give (`kong.api.endpoints`, `helpers.yield_error`) is not here: a
//! module calling one gets an error naming it.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use mlua::LuaSerdeExt;

use super::{db, enter, with_runtime, Phase, Settings, Target, CURRENT};
use crate::{AccessRequest, Exit, PluginCtx, UpstreamRequest};

/// One route of a plugin's `api.lua`: its pattern as written (the module's key) and its
/// segments, literal or `:param`.
#[derive(Debug, Clone)]
pub struct Route {
    pub pattern: String,
    segments: Vec<Segment>,
}

#[derive(Debug, Clone)]
enum Segment {
    Literal(String),
    Param(String),
}

impl Route {
    pub fn new(pattern: &str) -> Route {
        let segments = pattern
            .trim_matches('/')
            .split('/')
            .map(|s| match s.strip_prefix(':') {
                Some(p) => Segment::Param(p.to_string()),
                None => Segment::Literal(s.to_string()),
            })
            .collect();
        Route {
            pattern: pattern.to_string(),
            segments,
        }
    }

    /// The route's parameters when `path` is one of its paths.
    pub fn matches(&self, path: &str) -> Option<Vec<(String, String)>> {
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        if parts.len() != self.segments.len() {
            return None;
        }
        let mut params = Vec::new();
        for (seg, part) in self.segments.iter().zip(parts) {
            match seg {
                Segment::Literal(l) if l == part => {}
                Segment::Literal(_) => return None,
                Segment::Param(name) if !part.is_empty() => {
                    params.push((
                        name.clone(),
                        String::from_utf8_lossy(&super::pdk::percent_decode(part)).into_owned(),
                    ));
                }
                Segment::Param(_) => return None,
            }
        }
        Some(params)
    }

    /// The route in Kong's `/endpoints` notation (`{param}`).
    pub fn listed(&self) -> String {
        let parts: Vec<String> = self
            .segments
            .iter()
            .map(|s| match s {
                Segment::Literal(l) => l.clone(),
                Segment::Param(p) => format!("{{{p}}}"),
            })
            .collect();
        format!("/{}", parts.join("/"))
    }
}

/// An Admin API request for a plugin's route.
pub struct Call<'a> {
    pub plugin: &'static str,
    pub route: &'a Route,
    pub method: &'a str,
    pub path: &'a str,
    pub query: &'a str,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// Kong's `self.params` without the route's parameters (the query's arguments and the
    /// body's fields, decoded as the Admin API decodes them).
    pub params: serde_json::Map<String, serde_json::Value>,
    /// The plugin's entities in the running configuration (`kong.db`).
    pub dao: Option<Arc<db::Dao>>,
}

/// The answer: status, headers, body.
pub struct Answer {
    pub status: StatusCode,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Bytes,
}

/// Runs the route's `before` and the method's handler, as Kong's Admin API does.
pub fn call(settings: &Arc<Settings>, mut c: Call<'_>) -> Answer {
    for (k, v) in c.route.matches(c.path).unwrap_or_default() {
        c.params.insert(k, serde_json::Value::String(v));
    }
    let mut response_headers = Vec::new();
    let mut ctx = PluginCtx::default();
    let mut upstream = UpstreamRequest::default();
    let mut headers = c.headers;
    let path = c.path.to_string();
    let mut req = AccessRequest::new(
        c.method,
        &path,
        (!c.query.is_empty()).then_some(c.query),
        &mut headers,
        &mut response_headers,
        false,
        std::net::IpAddr::from([127, 0, 0, 1]),
        &mut ctx,
        &mut upstream,
    );
    req.body = Some(c.body.clone());
    let ctx_ptr: *mut PluginCtx = &mut *req.ctx;
    let target = Target::Request(std::ptr::from_mut(&mut req).cast());
    // The call runs as the access phase does (kong.request reads the Admin API's request,
    // kong.response.exit answers it).
    let guard = enter(target, Phase::Access, c.plugin, 0, ctx_ptr, false);
    let _dao = db::enter(c.dao.as_ref());
    let outcome = with_runtime(settings, |rt| -> mlua::Result<()> {
        let params = rt.lua.to_value(&serde_json::Value::Object(c.params))?;
        let run: mlua::Function = rt.lua.load(RUN).set_name("=admin_api").into_function()?;
        run.call((c.plugin, c.route.pattern.as_str(), c.method, params))
    });
    let (exit, said, status) = CURRENT.with(|cur| {
        let mut cur = cur.borrow_mut();
        (
            cur.exit.take(),
            std::mem::take(&mut cur.said),
            cur.status.take(),
        )
    });
    drop(guard);
    drop(req);
    if let Some(e) = exit {
        return answer(e, response_headers);
    }
    let failed = match outcome {
        Err(e) => Some(e),
        Ok(Err(e)) if !super::pdk::is_stop(&e) => Some(e.to_string()),
        Ok(_) => None,
    };
    if let Some(e) = failed {
        tracing::error!("[{}] admin api {}: {e}", c.plugin, c.route.pattern);
        return answer(
            Exit::message(
                StatusCode::INTERNAL_SERVER_ERROR,
                "An unexpected error occurred",
            ),
            response_headers,
        );
    }
    Answer {
        status: status.unwrap_or(StatusCode::OK),
        headers: response_headers,
        body: Bytes::from(said),
    }
}

fn answer(e: Exit, mut set: Vec<(HeaderName, HeaderValue)>) -> Answer {
    for (k, v) in e.headers {
        set.retain(|(o, _)| *o != k);
        set.push((k, v));
    }
    Answer {
        status: e.status,
        headers: set,
        body: e.body,
    }
}

/// Kong's dispatch of a plugin route: `before`, then the method's handler (405 without one).
const RUN: &str = r#"
local name, pattern, method, params = ...
local api = require("kong.plugins." .. name .. ".api")
local route = api[pattern]
local methods = route.methods or route
local handler = methods[method]
if type(handler) ~= "function" then
  return kong.response.exit(405, { message = "Method not allowed" })
end
local self = { params = params, route_name = pattern, req = { method = method } }
local helpers = {}
if type(methods.before) == "function" then
  methods.before(self, kong.db, helpers)
end
return handler(self, kong.db, helpers, function()
  return kong.response.exit(404, { message = "Not found" })
end)
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_match_as_lapis_patterns() {
        let r = Route::new("/clients/:clients/usage");
        assert_eq!(
            r.matches("/clients/a%20b/usage"),
            Some(vec![("clients".into(), "a b".into())])
        );
        assert_eq!(r.matches("/clients/a/other"), None);
        assert_eq!(r.matches("/clients//usage"), None);
        assert_eq!(r.listed(), "/clients/{clients}/usage");
        assert_eq!(Route::new("/plain").matches("/plain/"), Some(vec![]));
    }
}
