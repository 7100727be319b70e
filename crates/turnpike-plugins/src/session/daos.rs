//! session's entity (Kong's `kong/plugins/session/daos.lua`): `sessions`, the sessions kept
//! by `storage = kong` (the cookie then holds only the header), reached at `/sessions` and
//! `/sessions/{session_id}`. Rows carry a `ttl` (the rolling timeout) and go when it runs
//! out. Kong leaves them out of exports (`db_export = false`): they are state, not config.

use turnpike_config::entity::{EntitySpec, FieldKind, PluginEntity};

pub const TABLE: &str = "sessions";

pub static SESSIONS: PluginEntity = PluginEntity {
    spec: EntitySpec {
        table: TABLE,
        path: "sessions",
        nested_path: "sessions",
        endpoint_key: Some("session_id"),
        unique: &["session_id"],
        cache_key: &[],
        foreign: &[],
    },
    fields: &[
        ("session_id", FieldKind::Required),
        ("expires", FieldKind::Integer),
        ("data", FieldKind::Optional),
        ("ttl", FieldKind::Int),
    ],
    sample: r#"{"session_id": "c2Vzc2lvbg"}"#,
    check: None,
};
