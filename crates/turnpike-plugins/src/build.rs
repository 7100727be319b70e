//! What a plugin consults while it is built: the snapshot's consumers and credentials,
//! indexed once per snapshot and only if some plugin asks.

use std::sync::Arc;

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Mutex;

use crate::*;

pub struct BuildContext<'a> {
    pub config: &'a turnpike_config::Config,
    /// The node's plugin state (caches, counters, queues), which the built plugins keep.
    pub runtime: &'a Arc<Runtime>,
    consumers: std::sync::OnceLock<Arc<ConsumerIndex>>,
    /// What a plugin derives from the config once for all its instances (its credentials
    /// indexed), by type: built when an instance first asks (`shared`).
    shared: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
    /// The id of the plugin entity being built (`kong.plugin.get_id`).
    building: Mutex<Option<Arc<str>>>,
}

/// Consumers by id and by username.
pub type ConsumerIndex = std::collections::HashMap<String, Arc<Identity>>;

impl<'a> BuildContext<'a> {
    pub fn new(config: &'a turnpike_config::Config, runtime: &'a Arc<Runtime>) -> Self {
        BuildContext {
            config,
            runtime,
            consumers: std::sync::OnceLock::new(),
            shared: Mutex::new(HashMap::new()),
            building: Mutex::new(None),
        }
    }

    /// Says which plugin entity the next `build` is for.
    pub fn building(&self, plugin_id: &str) {
        *self.building.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::from(plugin_id));
    }

    /// The id of the plugin entity being built, if the caller said.
    pub fn plugin_id(&self) -> Option<Arc<str>> {
        self.building
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A consumer by id or username, as the anonymous consumer of an auth plugin.
    pub fn consumer(&self, key: &str) -> Option<Arc<Identity>> {
        self.consumer_index().get(key).cloned()
    }

    /// The snapshot's consumers by id and by username, made on first use.
    pub fn consumer_index(&self) -> Arc<ConsumerIndex> {
        self.consumers
            .get_or_init(|| {
                let mut m = ConsumerIndex::new();
                for c in &self.config.consumers {
                    let who = Arc::new(Identity::new(
                        &c.id,
                        c.username.as_deref(),
                        c.custom_id.as_deref(),
                        None,
                    ));
                    if let Some(u) = &c.username {
                        m.insert(u.to_string(), who.clone());
                    }
                    m.insert(c.id.to_string(), who);
                }
                Arc::new(m)
            })
            .clone()
    }

    /// What a plugin derives from the config for all its instances (its credentials indexed),
    /// made by `make` the first time one asks, then shared by every instance of the snapshot.
    pub fn shared<T: Any + Send + Sync>(&self, make: impl FnOnce(&Self) -> T) -> Arc<T> {
        let key = TypeId::of::<T>();
        let found = self
            .shared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        // Made outside the lock: `make` may ask for something else shared.
        let value = match found {
            Some(v) => v,
            None => {
                let made: Arc<dyn Any + Send + Sync> = Arc::new(make(self));
                self.shared
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(key)
                    .or_insert(made)
                    .clone()
            }
        };
        value.downcast::<T>().expect("kept under its own type")
    }
}
