//! What a plugin consults while it is built: the snapshot's consumers and credentials,
//! indexed once per snapshot and only if some plugin asks.

use std::sync::Arc;

use http::HeaderValue;

use crate::*;

pub struct BuildContext<'a> {
    pub config: &'a turnpike_config::Config,
    consumers: std::sync::OnceLock<Arc<ConsumerIndex>>,
    key_auth: std::sync::OnceLock<Arc<KeyIndex>>,
    basic_auth: std::sync::OnceLock<Arc<basic_auth::CredentialIndex>>,
    acl_groups: std::sync::OnceLock<Arc<acl::GroupIndex>>,
}

/// Consumers by id and by username.
pub type ConsumerIndex = std::collections::HashMap<String, Arc<Identity>>;
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
        if stored.starts_with(key_auth::DIGEST_PREFIX) {
            self.digests.insert(key_auth::digest_of(stored), who);
        } else {
            self.plain.insert(stored.into(), who);
        }
    }

    pub fn get(&self, key: &str) -> Option<&Arc<Identity>> {
        self.plain.get(key).or_else(|| {
            if self.digests.is_empty() {
                None
            } else {
                self.digests.get(&key_auth::digest(key.as_bytes()))
            }
        })
    }
}

impl<'a> BuildContext<'a> {
    pub fn new(config: &'a turnpike_config::Config) -> Self {
        BuildContext {
            config,
            consumers: std::sync::OnceLock::new(),
            key_auth: std::sync::OnceLock::new(),
            basic_auth: std::sync::OnceLock::new(),
            acl_groups: std::sync::OnceLock::new(),
        }
    }

    /// A consumer by id or username, as the anonymous consumer of an auth plugin.
    pub fn consumer(&self, key: &str) -> Option<Arc<Identity>> {
        self.consumers
            .get_or_init(|| {
                let mut m = ConsumerIndex::new();
                for c in &self.config.consumers {
                    let who = Arc::new(Identity::new(
                        c.id.clone(),
                        c.username.clone(),
                        c.custom_id.clone(),
                        None,
                    ));
                    if let Some(u) = &c.username {
                        m.insert(u.clone(), who.clone());
                    }
                    m.insert(c.id.clone(), who);
                }
                Arc::new(m)
            })
            .get(key)
            .cloned()
    }

    /// Each consumer's ACL groups (from its `acls` credentials), in the order written.
    pub fn acl_groups(&self) -> Arc<acl::GroupIndex> {
        self.acl_groups
            .get_or_init(|| {
                let mut m = acl::GroupIndex::new();
                for cred in self
                    .config
                    .credentials
                    .iter()
                    .filter(|c| c.kind == turnpike_config::declarative::CredentialKind::Acl)
                {
                    if let Some(g) = cred.fields.get("group").and_then(|g| g.as_str()) {
                        m.entry(cred.consumer.id.clone())
                            .or_default()
                            .0
                            .push(g.to_string());
                    }
                }
                for (groups, header) in m.values_mut() {
                    *header = HeaderValue::from_str(&groups.join(", ")).ok();
                }
                Arc::new(m)
            })
            .clone()
    }

    /// Every basic-auth credential by username, with the consumer it authenticates.
    pub fn basic_auth(&self) -> Arc<basic_auth::CredentialIndex> {
        self.basic_auth
            .get_or_init(|| {
                let mut m = basic_auth::CredentialIndex::default();
                for cred in
                    self.config.credentials.iter().filter(|c| {
                        c.kind == turnpike_config::declarative::CredentialKind::BasicAuth
                    })
                {
                    let (Some(username), Some(stored), Some(who)) = (
                        cred.fields.get("username").and_then(|v| v.as_str()),
                        cred.fields.get("password").and_then(|v| v.as_str()),
                        self.consumer(&cred.consumer.id),
                    ) else {
                        continue;
                    };
                    m.insert(
                        username.into(),
                        Arc::new(basic_auth::Credential {
                            who: Arc::new(Identity::new(
                                who.consumer_id.clone(),
                                who.username.clone(),
                                who.custom_id.clone(),
                                Some(cred.id.clone()),
                            )),
                            secret: basic_auth::password::Secret::from_stored(
                                stored,
                                &cred.consumer.id,
                            ),
                            stored: stored.into(),
                        }),
                    );
                }
                Arc::new(m)
            })
            .clone()
    }

    /// Every key-auth key with the consumer it authenticates.
    pub fn key_auth(&self) -> Arc<KeyIndex> {
        self.key_auth
            .get_or_init(|| {
                let consumers: std::collections::HashMap<
                    &str,
                    &turnpike_config::declarative::Consumer,
                > = self
                    .config
                    .consumers
                    .iter()
                    .map(|c| (c.id.as_str(), c))
                    .collect();
                let mut m = KeyIndex::default();
                for cred in self
                    .config
                    .credentials
                    .iter()
                    .filter(|c| c.kind == turnpike_config::declarative::CredentialKind::KeyAuth)
                {
                    let (Some(key), Some(c)) = (
                        cred.fields.get("key").and_then(|k| k.as_str()),
                        consumers.get(cred.consumer.id.as_str()),
                    ) else {
                        continue;
                    };
                    m.insert(
                        key,
                        Arc::new(Identity::new(
                            c.id.clone(),
                            c.username.clone(),
                            c.custom_id.clone(),
                            Some(cred.id.clone()),
                        )),
                    );
                }
                Arc::new(m)
            })
            .clone()
    }
}
