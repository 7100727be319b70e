//! Config sync: turns the store's contents into the data plane's config whenever the config
//! version moves. A node learns of a change from its own writes (at once), from PostgreSQL's
//! LISTEN/NOTIFY (other nodes' writes, within milliseconds), and from a periodic version poll
//! (the fallback after a lost notification connection, Kong's `db_update_frequency`).
//!
//! Building the config (validation and the router compile) runs on a blocking thread so that
//! neither the Admin API nor the proxy waits for it; the proxy keeps serving the previous
//! snapshot until the new one is swapped in. Every applied config is also written to the prefix
//! so a node that restarts while the database is down still serves its last good config.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{watch, Notify};
use turnpike_config::declarative;
use turnpike_config::Config;

use crate::{Backend, Store, StoreError, NOTIFY_CHANNEL};

/// Installs a validated config into the data plane (the gateway's atomic swap).
pub type ApplyFn = dyn Fn(Config) -> Result<(), String> + Send + Sync;

pub struct ConfigSync {
    pub store: Arc<Store>,
    apply: Arc<ApplyFn>,
    last_good: PathBuf,
    applied: watch::Sender<i64>,
    wake: Notify,
    poll_interval: Duration,
}

/// File name of the last applied config under the prefix.
pub const LAST_GOOD_FILE: &str = "last-good-config.json";

impl ConfigSync {
    pub fn new(
        store: Arc<Store>,
        apply: Arc<ApplyFn>,
        prefix: &std::path::Path,
        poll_interval: Duration,
    ) -> Arc<ConfigSync> {
        Arc::new(ConfigSync {
            store,
            apply,
            last_good: prefix.join(LAST_GOOD_FILE),
            applied: watch::channel(-1).0,
            wake: Notify::new(),
            poll_interval,
        })
    }

    /// The config version the data plane runs (-1 before the first sync).
    pub fn applied_version(&self) -> i64 {
        *self.applied.borrow()
    }

    /// Asks the sync loop to look at the store now.
    pub fn trigger(&self) {
        self.wake.notify_one();
    }

    /// After a local write: wakes the sync loop and waits (bounded) until the data plane runs
    /// a config at least as new as the store's current one, so that a client that wrote a
    /// route can use it on this node as soon as the Admin API answers.
    pub async fn wait_current(&self, timeout: Duration) {
        let Ok(target) = self.store.config_version().await else {
            return;
        };
        self.trigger();
        let mut rx = self.applied.subscribe();
        let _ = tokio::time::timeout(timeout, rx.wait_for(|v| *v >= target)).await;
    }

    /// Loads the store into the data plane once. Returns the version applied.
    pub async fn sync_once(&self) -> Result<i64, StoreError> {
        let (version, export) = self.store.export().await?;
        if version == self.applied_version() {
            return Ok(version);
        }
        let plugins = self.store.plugins.clone();
        let apply = self.apply.clone();
        // Validation and the router compile are the expensive part: off the async thread.
        let (result, export) = tokio::task::spawn_blocking(move || {
            let result = declarative::load(&export, plugins.as_ref())
                .map_err(|e| format!("stored config does not load: {}", e.summary()))
                .and_then(|cfg| {
                    apply(cfg).map_err(|e| format!("stored config does not compile: {e}"))
                });
            (result, export)
        })
        .await
        .map_err(|e| StoreError::Database(e.to_string()))?;
        result.map_err(StoreError::Database)?;
        self.save_last_good(&export);
        self.applied.send_replace(version);
        Ok(version)
    }

    fn save_last_good(&self, export: &Value) {
        let tmp = self.last_good.with_extension("json.tmp");
        let ok = serde_json::to_vec(export)
            .ok()
            .and_then(|b| std::fs::write(&tmp, b).ok())
            .and_then(|_| std::fs::rename(&tmp, &self.last_good).ok());
        if ok.is_none() {
            tracing::warn!(
                "cannot save the last good config to {}",
                self.last_good.display()
            );
        }
    }

    /// The config saved by the last successful sync, if any (for a start while the database
    /// is unreachable).
    pub fn load_last_good(&self) -> Option<Config> {
        let text = std::fs::read_to_string(&self.last_good).ok()?;
        let v: Value = serde_json::from_str(&text).ok()?;
        declarative::load(&v, self.store.plugins.as_ref()).ok()
    }

    /// Runs forever: syncs when triggered or every poll interval.
    pub async fn run(self: Arc<Self>) {
        let mut failing = false;
        loop {
            let _ = tokio::time::timeout(self.poll_interval, self.wake.notified()).await;
            let current = match self.store.config_version().await {
                Ok(v) => v,
                Err(e) => {
                    if !failing {
                        tracing::error!(
                            "config sync: database unreachable, serving the last good config: {e}"
                        );
                        failing = true;
                    }
                    continue;
                }
            };
            if failing {
                tracing::info!("config sync: database reachable again");
                failing = false;
            }
            if current == self.applied_version() {
                continue;
            }
            match self.sync_once().await {
                Ok(v) => tracing::debug!("config sync: applied version {v}"),
                Err(e) => tracing::error!("config sync: keeping the current config: {e}"),
            }
        }
    }

    /// PostgreSQL only: wakes the sync loop on every NOTIFY from another node's write, and
    /// after a reconnect (notifications sent meanwhile are lost, so look at the store).
    pub async fn listen(self: Arc<Self>) {
        if self.store.backend != Backend::Postgres {
            return;
        }
        let url = self.store.options().url.clone();
        loop {
            let mut listener = match sqlx::postgres::PgListener::connect(&url).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::debug!("config sync: LISTEN connection failed: {e}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            if let Err(e) = listener.listen(NOTIFY_CHANNEL).await {
                tracing::debug!("config sync: LISTEN failed: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            self.trigger();
            loop {
                match listener.try_recv().await {
                    Ok(Some(_)) => self.trigger(),
                    // The connection dropped; try_recv reconnects on the next call.
                    Ok(None) => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        self.trigger();
                    }
                    Err(e) => {
                        tracing::debug!("config sync: notification connection lost: {e}");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        break;
                    }
                }
            }
        }
    }
}
