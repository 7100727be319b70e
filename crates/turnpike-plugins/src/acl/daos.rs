//! acl's entity (Kong's `kong/plugins/acl/daos.lua`): `acls`, a consumer's groups, at `/acls`
//! and `/consumers/{c}/acls`; one group per consumer once (its cache key).

use http::HeaderValue;
use turnpike_config::entity::{EntitySpec, FieldKind, PluginEntity, CONSUMER};

pub const TABLE: &str = "acls";

pub static ACLS: PluginEntity = PluginEntity {
    spec: EntitySpec {
        table: TABLE,
        path: "acls",
        nested_path: "acls",
        endpoint_key: None,
        unique: &[],
        cache_key: &["consumer", "group"],
        foreign: CONSUMER,
    },
    fields: &[("group", FieldKind::Required)],
    sample: r#"{"group": "g"}"#,
    check: None,
};

/// Each consumer's groups (from its `acls` credentials), in the order written: built once
/// per snapshot (`BuildContext::shared`).
pub fn groups(ctx: &crate::BuildContext<'_>) -> super::GroupIndex {
    let mut m = super::GroupIndex::new();
    for cred in ctx.config.credentials.iter().filter(|c| c.table == TABLE) {
        if let Some(g) = cred.fields.get("group").and_then(|g| g.as_str()) {
            m.entry(cred.consumer.id.to_string())
                .or_default()
                .0
                .push(g.to_string());
        }
    }
    for (groups, header) in m.values_mut() {
        *header = HeaderValue::from_str(&groups.join(", ")).ok();
    }
    m
}
