//! Kong's `custom_fields_by_lua` and the log entries the log plugins send with them.

use std::sync::Arc;

use mlua::Value;

use super::{check, with_runtime, Code, Phase, Settings, Slot, Target};
use crate::log::set_path;
use crate::PluginCtx;

/// Kong's `custom_fields_by_lua` (file-log, http-log): per field of the serialized log entry,
/// Lua whose return value the field takes (`nil` removes it); a dotted name reaches into
/// nested objects (`request.headers.x`).
pub struct LogFields {
    code: Code,
    names: Vec<String>,
}

impl LogFields {
    /// `None` when the map is empty.
    pub fn new(
        plugin: &'static str,
        fields: Option<&serde_json::Map<String, serde_json::Value>>,
        settings: &Arc<Settings>,
    ) -> Option<LogFields> {
        let map = fields.filter(|m| !m.is_empty())?;
        let names: Vec<String> = map.keys().cloned().collect();
        let exprs: Vec<String> = map
            .values()
            .map(|v| v.as_str().unwrap_or_default().to_string())
            .collect();
        let mut phases: [Vec<String>; super::PHASES] = Default::default();
        phases[Phase::Log as usize] = exprs;
        Some(LogFields {
            code: Code::new(plugin, phases, settings.clone()),
            names,
        })
    }

    /// Sets the fields in `json` (the entry `to_json` made of `entry`).
    pub fn apply(&self, entry: &crate::log::LogEntry<'_>, json: &mut serde_json::Value) {
        let ctx = entry.ctx.map_or(std::ptr::null_mut(), |c| {
            c as *const PluginCtx as *mut PluginCtx
        });
        self.run(Target::Log(std::ptr::from_ref(entry).cast()), ctx, json);
    }

    /// The same for a stream session's entry (Kong runs `custom_fields_by_lua` in the stream
    /// subsystem's log phase too).
    pub fn apply_stream(
        &self,
        entry: &crate::log::StreamLogEntry<'_>,
        json: &mut serde_json::Value,
    ) {
        let target = Target::StreamLog(std::ptr::from_ref(entry).cast());
        self.run(target, std::ptr::null_mut(), json);
    }

    fn run(&self, target: Target, ctx: *mut PluginCtx, json: &mut serde_json::Value) {
        let code = &self.code;
        let _guard = super::enter(
            target,
            Phase::Log,
            code.plugin,
            code.id,
            ctx,
            code.keep_logs,
        );
        let values: Vec<Result<Option<serde_json::Value>, String>> =
            with_runtime(&self.code.settings, |rt| {
                if self.code.compiled(rt).is_none() {
                    if let Err(e) = rt.compile(&self.code) {
                        return vec![Err(e.to_string())];
                    }
                }
                let lua = &rt.lua;
                rt.compiled[&self.code.id].phases[Phase::Log as usize]
                    .iter()
                    .map(|slot| {
                        let (Slot::First(f) | Slot::Ready(f)) = slot;
                        match f.call::<Value>(()) {
                            Ok(Value::Nil) => Ok(None),
                            Ok(v) => {
                                use mlua::LuaSerdeExt;
                                lua.from_value::<serde_json::Value>(v)
                                    .map(Some)
                                    .map_err(|e| e.to_string())
                            }
                            Err(e) => Err(e.to_string()),
                        }
                    })
                    .collect()
            })
            .unwrap_or_else(|e| vec![Err(e)]);
        for (name, value) in self.names.iter().zip(values) {
            match value {
                Ok(v) => set_path(json, name, v),
                Err(e) => {
                    tracing::error!("[{}] custom_fields_by_lua '{name}': {e}", self.code.plugin)
                }
            }
        }
    }
}

/// Checks a `custom_fields_by_lua` map: each value is Lua the node would load.
pub fn check_log_fields(
    plugin: &str,
    config: &serde_json::Value,
    settings: &Arc<Settings>,
) -> Vec<(String, String)> {
    let mut errs = Vec::new();
    if let Some(map) = config["custom_fields_by_lua"].as_object() {
        for (k, v) in map {
            let res = match v.as_str() {
                Some(code) => check(plugin, code, settings),
                None => Err("expected a string".into()),
            };
            if let Err(e) = res {
                errs.push((format!("custom_fields_by_lua.{k}"), e));
            }
        }
    }
    errs
}

/// A log entry as the log plugins send it: Kong's serialized JSON, with the plugin's
/// `custom_fields_by_lua` applied when it has them (which need the `Value`); without, written
/// straight to text.
pub fn log_text(entry: &crate::log::LogEntry<'_>, fields: Option<&LogFields>) -> String {
    match fields {
        Some(f) => {
            let mut json = entry.to_json();
            f.apply(entry, &mut json);
            json.to_string()
        }
        None => entry.to_json_text(),
    }
}

/// A stream session's log entry as the log plugins send it, with `custom_fields_by_lua`.
pub fn stream_log_text(
    entry: &crate::log::StreamLogEntry<'_>,
    fields: Option<&LogFields>,
) -> String {
    match fields {
        Some(f) => {
            let mut json = entry.to_json();
            f.apply_stream(entry, &mut json);
            json.to_string()
        }
        None => entry.to_json_text(),
    }
}
