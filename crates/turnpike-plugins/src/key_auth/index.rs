//! The snapshot's key-auth keys, indexed once per snapshot (`BuildContext::shared`).

use std::sync::Arc;

use super::{digest, digest_of, DIGEST_PREFIX};
use crate::Identity;

/// key-auth credentials of a snapshot: keys written in clear (a declarative file, which holds
/// them in clear anyway) by key, and keys written as digests (an export) by digest, so that a
/// request hashes its key only when some keys are digests. FxHash: only the config inserts
/// entries; a client's keys are only looked up and cannot build colliding chains.
#[derive(Default)]
pub struct KeyIndex {
    plain: rustc_hash::FxHashMap<Box<str>, Arc<Identity>>,
    digests: rustc_hash::FxHashMap<[u8; 32], Arc<Identity>>,
}

impl KeyIndex {
    pub fn insert(&mut self, stored: &str, who: Arc<Identity>) {
        if stored.starts_with(DIGEST_PREFIX) {
            self.digests.insert(digest_of(stored), who);
        } else {
            self.plain.insert(stored.into(), who);
        }
    }

    pub fn get(&self, key: &str) -> Option<&Arc<Identity>> {
        self.plain.get(key).or_else(|| {
            if self.digests.is_empty() {
                None
            } else {
                self.digests.get(&digest(key.as_bytes()))
            }
        })
    }
}

impl KeyIndex {
    /// Every key-auth key with the consumer it authenticates.
    pub fn build(ctx: &crate::BuildContext<'_>) -> KeyIndex {
        let consumers: std::collections::HashMap<&str, &turnpike_config::declarative::Consumer> =
            ctx.config
                .consumers
                .iter()
                .map(|c| (&*c.id, &**c))
                .collect();
        let mut m = KeyIndex::default();
        for cred in ctx
            .config
            .credentials
            .iter()
            .filter(|c| c.table == super::daos::TABLE)
        {
            let (Some(key), Some(c)) = (
                cred.fields.get("key").and_then(|k| k.as_str()),
                consumers.get(cred.consumer.id.as_ref()),
            ) else {
                continue;
            };
            m.insert(
                key,
                Arc::new(Identity::new(
                    &c.id,
                    c.username.as_deref(),
                    c.custom_id.as_deref(),
                    Some(&cred.id),
                )),
            );
        }
        m
    }
}
