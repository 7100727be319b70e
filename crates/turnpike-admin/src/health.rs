//! Kong's target health endpoints: `GET /upstreams/{u}/health`, `GET /upstreams/{u}/targets/all`
//! and `POST /upstreams/{u}/targets/{t}/healthy|unhealthy`. They read the running config (so
//! they work the same with or without a database: Kong's DB-less mode answers 500 to the POSTs)
//! and the data plane's health state.

use http::{Method, StatusCode};
use serde_json::{json, Value};

use crate::{json_response, message, Admin, Resp};

impl Admin {
    /// Serves a health path; `None` when `segments` is not one.
    pub(crate) fn health(&self, method: &Method, segments: &[&str]) -> Option<Resp> {
        let (up, rest) = match segments {
            ["upstreams", up, rest @ ..] => (*up, rest),
            _ => return None,
        };
        let action = match rest {
            ["health"] => None,
            ["targets", "all"] => Some(("all", None)),
            ["targets", t, a @ ("healthy" | "unhealthy")] => Some((*a, Some(*t))),
            _ => return None,
        };
        let snap = self.gateway.snapshot.load();
        let cfg = &snap.config;
        let Some(upstream) = cfg.upstreams.iter().find(|u| u.id == up || u.name == up) else {
            return Some(message(StatusCode::NOT_FOUND, "Not found"));
        };
        let checks = turnpike_proxy::upstream::health::Checks::from_config(&upstream.healthchecks);
        let targets: Vec<_> = cfg
            .targets
            .iter()
            .filter(|t| *t.upstream.id == *upstream.id)
            .collect();
        let entry = |t: &turnpike_config::declarative::Target, with_health: bool| -> Value {
            let mut v = serde_json::to_value(t).unwrap_or(Value::Null);
            if with_health {
                let state = if !checks.enabled() {
                    "HEALTHCHECKS_OFF"
                } else if self
                    .gateway
                    .upstreams
                    .health
                    .lookup(&upstream.id, &t.target)
                    .is_none_or(|h| h.healthy())
                {
                    "HEALTHY"
                } else {
                    "UNHEALTHY"
                };
                let (ip, port) = t.target.rsplit_once(':').unwrap_or((&t.target, "8000"));
                v["health"] = json!(state);
                v["data"] = json!({"addresses": [{
                    "ip": ip.trim_matches(|c| c == '[' || c == ']'),
                    "port": port.parse::<u16>().unwrap_or(8000),
                    "health": state,
                    "weight": t.weight,
                }]});
            }
            v
        };
        Some(match (method, action) {
            (&Method::GET, None) => json_response(
                StatusCode::OK,
                &json!({
                    "data": targets.iter().map(|t| entry(t, true)).collect::<Vec<_>>(),
                    "next": null,
                    "node_id": self.node_id,
                }),
            ),
            (&Method::GET, Some(("all", _))) => json_response(
                StatusCode::OK,
                &json!({
                    "data": targets.iter().map(|t| entry(t, false)).collect::<Vec<_>>(),
                    "next": null,
                }),
            ),
            (&Method::POST | &Method::PUT, Some((state, Some(key)))) => {
                let normalized = turnpike_config::declarative::normalize_target(key)
                    .unwrap_or_else(|_| key.to_string());
                let Some(t) = targets
                    .iter()
                    .find(|t| t.id == key || t.target == normalized)
                else {
                    return Some(message(StatusCode::NOT_FOUND, "Not found"));
                };
                self.gateway
                    .upstreams
                    .health
                    .target(&upstream.id, &t.target)
                    .set(state == "healthy");
                tracing::info!(
                    "health: target {} of upstream {} set {state} through the Admin API",
                    t.target,
                    upstream.name
                );
                let mut r = Resp::new(Default::default());
                *r.status_mut() = StatusCode::NO_CONTENT;
                r
            }
            _ => message(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed"),
        })
    }
}
