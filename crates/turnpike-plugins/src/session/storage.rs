//! `storage = kong`: a session's payload kept in the `sessions` entity, under its id, as
//! Kong's `kong/plugins/session/storage/kong.lua` keeps it (`data` is lua-resty-session's
//! `["<payload>"]`, `expires` and the row's `ttl` the rolling timeout). Read through the node's
//! credential cache (by `session_id`, misses remembered, dropped when the row changes), so a
//! request with a session costs a database look-up once, not every time; written through the
//! store as Kong writes them: a new row per renewal, the old one kept `stale_ttl` seconds for
//! requests already under way.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::daos::TABLE;
use crate::credentials::{Outcome, Write};

pub struct State {
    rows: crate::credentials::Cache<Box<str>, Arc<str>>,
    store: Arc<crate::credentials::Store>,
}

/// Bytes of a cached session: its id twice, its ~150-byte payload, the entry.
const WEIGHT: u32 = 512;

impl State {
    pub fn new(store: Arc<crate::credentials::Store>) -> State {
        State {
            rows: crate::credentials::Cache::weighing(store.clone(), TABLE, "session_id", WEIGHT)
                .indexed_by_row(),
            store,
        }
    }

    /// Whether sessions can be kept (a database node).
    pub fn available(&self) -> bool {
        self.store.installed()
    }

    /// The cached payload of session `key`: `Some(None)` for one known to be missing, `None`
    /// when the store must be asked ([`State::load`]).
    pub fn cached(&self, key: &str) -> Option<Option<String>> {
        self.rows.get(key).map(|e| e.value.map(|p| p.to_string()))
    }

    /// The payload of session `key`, from the store (and cached).
    pub async fn load(&self, key: String) -> Option<String> {
        let (outcome, _) = self
            .rows
            .load(key.clone().into_boxed_str(), key.clone(), key, payload_of)
            .await;
        match outcome {
            Outcome::Found(p) => Some(p.to_string()),
            Outcome::Missing => None,
            Outcome::Failed(e) => {
                tracing::warn!("session: unable to load session ({e})");
                None
            }
        }
    }

    /// Drops what is cached of a row that changed.
    pub fn invalidate(&self, id: &str, session_id: Option<&str>) {
        self.rows.invalidate_row(id, session_id);
    }

    pub fn invalidate_all(&self) {
        self.rows.invalidate_all();
    }

    /// Stores a new session and, if it renews one, keeps the old row for `stale_ttl` seconds
    /// (or deletes it, for a remember cookie), as Kong's storage does.
    pub async fn save(
        &self,
        key: String,
        payload: &str,
        ttl: i64,
        now: i64,
        old: Option<(String, i64, bool)>,
    ) -> Result<(), String> {
        let mut row = Map::new();
        row.insert("session_id".into(), Value::from(key));
        row.insert(
            "data".into(),
            Value::from(serde_json::json!([payload]).to_string()),
        );
        row.insert("expires".into(), Value::from(now + ttl));
        row.insert("ttl".into(), Value::from(ttl));
        self.store
            .write(Write::Insert {
                table: TABLE,
                entity: row,
            })
            .await?;
        if let Some((old_key, stale_ttl, remember)) = old {
            self.retire(&old_key, stale_ttl, now, remember).await?;
        }
        Ok(())
    }

    /// Ends session `key`: its row goes (`remember`), or stays `stale_ttl` seconds more.
    pub async fn retire(
        &self,
        key: &str,
        stale_ttl: i64,
        now: i64,
        delete: bool,
    ) -> Result<(), String> {
        // This node stops serving it at once; others when the change reaches them.
        if delete {
            self.rows.forget(key);
        }
        let Some(found) = self
            .store
            .find(TABLE, "session_id", key.to_string())
            .await?
        else {
            return Ok(());
        };
        let write = if delete {
            Write::Delete {
                table: TABLE,
                id: found.id,
            }
        } else {
            let mut patch = Map::new();
            patch.insert("expires".into(), Value::from(now + stale_ttl));
            patch.insert("ttl".into(), Value::from(stale_ttl.max(1)));
            Write::Update {
                table: TABLE,
                id: found.id,
                patch,
            }
        };
        self.store.write(write).await.map(|_| ())
    }
}

/// The payload a row keeps (`data` is `["<payload>", <info>]`).
fn payload_of(found: &crate::credentials::Found) -> Option<Arc<str>> {
    let data = found.fields.get("data")?.as_str()?;
    let v: Value = serde_json::from_str(data).ok()?;
    v.get(0)?.as_str().map(Arc::from)
}
