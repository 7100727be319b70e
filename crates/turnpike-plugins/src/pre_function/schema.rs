//! The config of pre-function and post-function (Kong `kong/plugins/pre-function/_schema.lua`,
//! shared by both): arrays of Lua code, one per phase.

use serde_json::Value;

use crate::lua::{self, Phase};
use crate::schema::{Default, Field, Type};

const fn phase(name: &'static str) -> Field {
    Field::new(name, Type::StringArray)
        .default(Default::EmptyArray)
        .required()
}

pub const FIELDS: &[Field] = &[
    phase("certificate"),
    phase("rewrite"),
    phase("access"),
    phase("header_filter"),
    phase("body_filter"),
    phase("log"),
];

/// Kong's `at_least_one_of` over the phases, and every function checked as Lua the node would
/// load (it compiles; `untrusted_lua` is not off).
pub fn entity_checks(config: &Value) -> Vec<(String, String)> {
    let mut errs = Vec::new();
    let phases: Vec<&str> = Phase::ALL.iter().map(|p| p.name()).collect();
    let nonempty = |p: &&str| config[*p].as_array().is_some_and(|a| !a.is_empty());
    if !phases.iter().any(nonempty) {
        let names: Vec<String> = phases.iter().map(|p| format!("'config.{p}'")).collect();
        errs.push((
            // Kong checks this on the plugin entity, not inside `config`.
            "/@entity".into(),
            format!(
                "at least one of these fields must be non-empty: {}",
                names.join(", ")
            ),
        ));
    }
    errs
}

/// Each phase's code compiles, and `untrusted_lua` lets it load.
pub fn lua_checks(
    plugin: &str,
    config: &Value,
    settings: &std::sync::Arc<lua::Settings>,
) -> Vec<(String, String)> {
    let mut errs = Vec::new();
    for p in Phase::ALL.iter().map(|p| p.name()) {
        for code in config[p].as_array().into_iter().flatten() {
            if let Some(code) = code.as_str() {
                if let Err(e) = lua::check(plugin, code, settings) {
                    errs.push((p.to_string(), e));
                    break;
                }
            }
        }
    }
    errs
}

/// The functions of each phase (indexed by `Phase`; the response phase has none).
pub fn phases(config: &Value) -> [Vec<String>; crate::lua::PHASES] {
    let mut out: [Vec<String>; crate::lua::PHASES] = std::default::Default::default();
    for p in Phase::ALL {
        out[p as usize] = config[p.name()]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
    }
    out
}
