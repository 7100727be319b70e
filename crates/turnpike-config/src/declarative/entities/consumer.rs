//! A consumer.

use serde_json::{Map, Value};

use super::super::fields::Fields;
use super::*;

pub fn consumer(map: &Map<String, Value>, id: &str, now: i64) -> (Consumer, Vec<(String, String)>) {
    let mut f = Fields::new(map);
    let id = read_id(&mut f, id);
    let (created_at, updated_at) = timestamps(&mut f, now);
    let username = f.str("username").map(String::into_boxed_str);
    let custom_id = f.str("custom_id").map(String::into_boxed_str);
    let tags = f.tags().map(Shared::from);
    if username.is_none()
        && custom_id.is_none()
        && !f
            .errors
            .iter()
            .any(|(k, _)| k == "username" || k == "custom_id")
    {
        f.err(
            "@entity",
            "at least one of these fields must be non-empty: 'custom_id', 'username'",
        );
    }
    let errors = f.finish();
    (
        Consumer {
            id: id.into(),
            created_at,
            updated_at,
            username,
            custom_id,
            tags,
        },
        errors,
    )
}
