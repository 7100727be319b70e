//! Kong's `/debug/node/log-level`: the node's log level read and changed at run time, no
//! restart. `PUT /debug/node/log-level/{level}[?timeout=N]` sets it for N seconds (Kong's
//! default 60; 0 keeps it), after which the configured `log_level` is back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use http::{Method, StatusCode};
use serde_json::json;

use crate::{json_response, message, Admin, Resp};

/// Kong's levels, most verbose first.
pub const LEVELS: &[&str] = &[
    "debug", "info", "notice", "warn", "error", "crit", "alert", "emerg",
];

/// The running log filter, as the binary set it up.
pub trait LogLevels: Send + Sync {
    /// Applies a Kong level (one of `LEVELS`).
    fn apply(&self, level: &str) -> Result<(), String>;
}

/// The level in force and a change counter (a timed change only reverts its own).
pub struct LevelState {
    pub control: Arc<dyn LogLevels>,
    pub configured: String,
    current: Mutex<String>,
    changes: AtomicU64,
}

impl LevelState {
    pub fn new(control: Arc<dyn LogLevels>, configured: &str) -> LevelState {
        LevelState {
            control,
            configured: configured.to_string(),
            current: Mutex::new(configured.to_string()),
            changes: AtomicU64::new(0),
        }
    }

    fn set(&self, level: &str) -> Result<u64, String> {
        self.control.apply(level)?;
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = level.to_string();
        Ok(self.changes.fetch_add(1, Ordering::Relaxed) + 1)
    }

    fn current(&self) -> String {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Admin {
    /// Serves `/debug/node/log-level[/{level}]`; `None` for other paths.
    pub(crate) fn log_level(&self, method: &Method, path: &str, query: &str) -> Option<Resp> {
        let rest = path.strip_prefix("/debug/node/log-level")?;
        let Some(state) = &self.log_levels else {
            return Some(message(
                StatusCode::NOT_IMPLEMENTED,
                "log level changes are not available on this node",
            ));
        };
        Some(match (method, rest.trim_start_matches('/')) {
            (&Method::GET, "") => json_response(
                StatusCode::OK,
                &json!({ "message": format!("log level: {}", state.current()) }),
            ),
            (&Method::PUT, level) if !level.is_empty() => {
                if !LEVELS.contains(&level) {
                    return Some(message(
                        StatusCode::BAD_REQUEST,
                        &format!("unknown log level: {level}"),
                    ));
                }
                let timeout = match query
                    .split('&')
                    .find_map(|p| p.strip_prefix("timeout="))
                    .map(|t| t.parse::<u64>())
                {
                    None => 60,
                    Some(Ok(t)) => t,
                    Some(Err(_)) => {
                        return Some(message(
                            StatusCode::BAD_REQUEST,
                            "timeout must be a number of seconds",
                        ))
                    }
                };
                let generation = match state.set(level) {
                    Ok(g) => g,
                    Err(e) => return Some(message(StatusCode::INTERNAL_SERVER_ERROR, &e)),
                };
                tracing::warn!("log level changed to {level} through the Admin API");
                if timeout > 0 {
                    let state = state.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(std::time::Duration::from_secs(timeout)).await;
                        // Only if nothing changed it since.
                        if state.changes.load(Ordering::Relaxed) == generation {
                            let configured = state.configured.clone();
                            if state.set(&configured).is_ok() {
                                tracing::warn!("log level back to {configured} (timeout)");
                            }
                        }
                    });
                }
                json_response(
                    StatusCode::OK,
                    &json!({ "message": format!("log level changed to {level}") }),
                )
            }
            _ => message(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed"),
        })
    }
}
