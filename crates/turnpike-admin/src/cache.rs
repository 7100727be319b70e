//! Kong's node cache endpoints: `GET /cache/{key}` (what this node holds under one of Kong's
//! cache keys), `DELETE /cache/{key}` (drop that entry) and `DELETE /cache` (drop them all).
//!
//! This node caches credentials a database node looks up by what a request presents (see
//! `turnpike_plugins::credentials`); the rest of the config is the snapshot, which no cache
//! key names. Kong's keys for those credentials are `<table>:<lookup>:::::<workspace>`, as its
//! `DAO:cache_key(lookup)` makes them (`keyauth_credentials:<key>:::::<ws_id>`,
//! `basicauth_credentials:<username>:...`, `hmacauth_credentials:<username>:...`,
//! `jwt_secrets:<key>:...`, `oauth2_tokens:<access_token>:...`).

use http::{Method, StatusCode};
use serde_json::{json, Value};

use crate::entities::store_error;
use crate::{json_response, message, no_content, Admin, Resp};

/// A cache key of Kong's, as the table and the value it was looked up by. The value may hold
/// colons itself: the five fields after it are counted from the right. Kong's keys of other
/// forms name nothing here.
fn parse(key: &str) -> Option<(&str, &str)> {
    let (table, rest) = key.split_once(':')?;
    let mut tail = rest.rsplitn(6, ':');
    let _workspace = tail.next()?;
    let unused: Vec<&str> = (0..4).map(|_| tail.next()).collect::<Option<_>>()?;
    let lookup = tail.next()?;
    (unused.iter().all(|u| u.is_empty()) && !lookup.is_empty()).then_some((table, lookup))
}

impl Admin {
    pub(crate) async fn cache_entry(&self, method: &Method, key: &str) -> Resp {
        let parsed = parse(key);
        match *method {
            Method::GET => {
                let Some((table, lookup)) = parsed else {
                    return message(StatusCode::NOT_FOUND, "Not found");
                };
                match self.plugins.cache_probe(table, lookup) {
                    None => message(StatusCode::NOT_FOUND, "Not found"),
                    // A remembered miss: Kong answers its nil value as `{message = nil}`.
                    Some(None) => json_response(StatusCode::OK, &json!({})),
                    Some(Some(id)) => self.cached_row(table, &id).await,
                }
            }
            Method::DELETE => {
                match parsed {
                    Some((table, lookup)) if self.plugins.cache_forget(table, lookup) => {}
                    // Nothing of that name is cached (Kong's `invalidate_local` of an absent
                    // key does nothing either).
                    _ => tracing::debug!("admin: DELETE /cache/{key}: no such entry"),
                }
                no_content()
            }
            _ => message(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed"),
        }
    }

    /// The credential a cache entry holds, as Kong's cache keeps it: its row.
    async fn cached_row(&self, table: &str, id: &str) -> Resp {
        let (Some(store), Some(spec)) = (self.store.as_ref(), self.tables().by_table(table)) else {
            return message(StatusCode::NOT_FOUND, "Not found");
        };
        match store.get(spec, id).await {
            Ok(Some(row)) => json_response(StatusCode::OK, &Value::Object(row)),
            // Deleted since: the change log drops the entry as it arrives.
            Ok(None) => message(StatusCode::NOT_FOUND, "Not found"),
            Err(e) => store_error(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn kong_cache_keys_name_a_table_and_a_lookup() {
        let ws = "dde1a96f-1d2f-41dc-bcc3-2c393ec42c65";
        assert_eq!(
            parse(&format!("keyauth_credentials:my-key:::::{ws}")),
            Some(("keyauth_credentials", "my-key"))
        );
        assert_eq!(
            parse("basicauth_credentials:alice:::::"),
            Some(("basicauth_credentials", "alice"))
        );
        // A value with colons of its own.
        assert_eq!(
            parse(&format!("keyauth_credentials:a:b::c:::::{ws}")),
            Some(("keyauth_credentials", "a:b::c"))
        );
        assert_eq!(parse("keyauth_credentials:my-key"), None);
        assert_eq!(parse("keyauth_credentials::::::"), None);
        assert_eq!(parse("routes:x:y::::"), None);
        assert_eq!(parse("plain"), None);
    }
}
