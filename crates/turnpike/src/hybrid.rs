//! Hybrid mode in the node: the control plane's config source (the store, on a pool of its
//! own, moved by the config sync), the data plane's applier (the declarative loader and the
//! gateway's compile, as a file's reload), and the threads each side runs on.

use std::future::Future;
use std::pin::Pin;

use super::*;
use turnpike_cluster::{cp, dp};
use turnpike_config::PluginRegistry;

/// The control plane's config: exported from the store whenever the sync moves.
struct StoreSource {
    store: turnpike_store::Store,
    sync: Arc<turnpike_store::sync::ConfigSync>,
}

impl cp::ConfigSource for StoreSource {
    fn export(
        &self,
    ) -> Pin<Box<dyn Future<Output = Result<serde_json::Value, String>> + Send + '_>> {
        Box::pin(async move {
            self.store
                .export()
                .await
                .map(|(_, v)| v)
                .map_err(|e| e.to_string())
        })
    }

    fn version(&self) -> i64 {
        self.sync.applied_version()
    }

    fn watch(&self) -> Option<tokio::sync::watch::Receiver<i64>> {
        Some(self.sync.watch_applied())
    }
}

/// The plugins this node runs, with their versions, as the cluster protocol lists them.
pub(super) fn plugin_versions(plugins: &turnpike_plugins::Registry) -> Vec<(String, String)> {
    plugins
        .available()
        .into_iter()
        .map(|(name, version, _)| (name, version))
        .collect()
}

/// Starts the control plane on a thread of its own (with its own runtime and store pool),
/// serving `listeners` until `shutdown`.
pub(super) fn start_control_plane(
    cp: Arc<cp::ControlPlane>,
    store: Arc<turnpike_store::Store>,
    sync: Arc<turnpike_store::sync::ConfigSync>,
    listeners: Vec<server::BoundListener>,
    shutdown: &watch::Receiver<bool>,
) -> Result<std::thread::JoinHandle<()>, String> {
    let sockets: Vec<std::net::TcpListener> =
        listeners.into_iter().flat_map(|l| l.sockets).collect();
    let (node, shutdown) = (cp, shutdown.clone());
    let thread = std::thread::Builder::new()
        .name("cluster".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => return tracing::error!("cluster: cannot start: {e}"),
            };
            rt.block_on(async move {
                // The store's connections live on the runtime that opens them: this thread
                // reads the store on a pool of its own.
                let store = match store.with_own_pool("turnpike-cluster") {
                    Ok(s) => s,
                    Err(e) => return tracing::error!("cluster: no store pool of its own: {e}"),
                };
                let source = Arc::new(StoreSource { store, sync });
                if let Err(e) = node.run(source, sockets, shutdown).await {
                    tracing::error!("cluster: {e}");
                }
            });
        })
        .map_err(|e| format!("cannot start the cluster thread: {e}"))?;
    Ok(thread)
}

/// A data plane's configs go where a declarative file's go: read against the running config,
/// compiled, and swapped in whole or not at all.
struct GatewayApplier {
    gateway: Arc<Gateway>,
    plugins: Arc<turnpike_plugins::Registry>,
}

impl dp::Applier for GatewayApplier {
    fn apply(&self, config_text: &str, hash: &str) -> Result<(), String> {
        let running = self.gateway.snapshot.load_full();
        let read = declarative::load_str_against(
            config_text,
            self.plugins.as_ref(),
            Some(&running.config),
        );
        drop(running);
        let mut cfg = read.map_err(|e| e.lines().join("; "))?;
        cfg.hash = hash.to_string();
        self.gateway.apply_whole(cfg)
    }

    fn apply_delta(&self, changes: Vec<dp::Change>, hash: &str) -> Result<(), String> {
        let running = self.gateway.snapshot.load_full();
        let mut cfg = running.config.clone();
        drop(running);
        let mut what = turnpike_config::declarative::Changes {
            from: std::mem::take(&mut cfg.hash),
            ..Default::default()
        };
        for (table, id, entity) in &changes {
            if table == "routes" {
                what.routes.push(id.clone());
            } else {
                what.others = true;
            }
            cfg.apply_change(table, id, entity.as_ref(), self.plugins.as_ref())?;
        }
        cfg.hash = hash.to_string();
        self.gateway.apply_changes_whole(cfg, &what)
    }
}

/// The data plane: made now, so that the config kept from its last run is applied before
/// traffic; connected by [`run_data_plane`].
pub(super) fn data_plane(
    conf: &Conf,
    plugins: &Arc<turnpike_plugins::Registry>,
    gateway: &Arc<Gateway>,
    node_id: String,
    hostname: String,
) -> Result<Arc<dp::DataPlane>, String> {
    turnpike_cluster::tls::client_config(&conf.cluster)?;
    let node = dp::NodeInfo {
        node_id,
        hostname,
        version: turnpike_plugins::KONG_VERSION.to_string(),
        plugins: plugin_versions(plugins),
        process_conf: conf.to_json(),
    };
    let applier = Arc::new(GatewayApplier {
        gateway: gateway.clone(),
        plugins: plugins.clone(),
    });
    let dp = dp::DataPlane::new(conf.cluster.clone(), node, applier, &conf.prefix);
    match dp.load_cache() {
        Ok(true) => tracing::info!(
            "[clustering] serving the config kept from the control plane ({})",
            dp.applied_hash()
        ),
        Ok(false) => tracing::info!(
            "[clustering] no config kept yet: waiting for the control plane at {}",
            conf.cluster.control_plane
        ),
        Err(e) => tracing::error!("[clustering] the config kept is not usable: {e}"),
    }
    Ok(dp)
}

/// Connects the data plane to its control plane on a thread of its own, until `shutdown`.
pub(super) fn run_data_plane(
    dp: Arc<dp::DataPlane>,
    shutdown: &watch::Receiver<bool>,
) -> Result<std::thread::JoinHandle<()>, String> {
    let shutdown = shutdown.clone();
    std::thread::Builder::new()
        .name("cluster".into())
        .spawn(move || {
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt.block_on(dp.run(shutdown)),
                Err(e) => tracing::error!("cluster: cannot start: {e}"),
            }
        })
        .map_err(|e| format!("cannot start the cluster thread: {e}"))
}

/// `turnpike hybrid gen_cert [<cert> <key>] [-d days]` (Kong's `kong hybrid gen_cert`): a
/// self-signed EC P-384 certificate for `kong_clustering`, valid `days` (1095 by default),
/// written to `./cluster.crt` and `./cluster.key` unless named; never over an existing file.
pub(super) fn gen_cert(
    cert: Option<&Path>,
    key: Option<&Path>,
    days: Option<u64>,
) -> Result<String, String> {
    let (cert, key) = match (cert, key) {
        (Some(c), Some(k)) => (c.to_path_buf(), k.to_path_buf()),
        (None, None) => (PathBuf::from("cluster.crt"), PathBuf::from("cluster.key")),
        _ => return Err("both cert and key path needs to be provided".into()),
    };
    let absolute = |p: PathBuf| {
        if p.is_absolute() {
            p
        } else {
            std::env::current_dir().unwrap_or_default().join(p)
        }
    };
    let (cert, key) = (absolute(cert), absolute(key));
    for p in [&cert, &key] {
        if p.exists() {
            return Err(format!(
                "{} already exists.\nWill not overwrite it.",
                p.display()
            ));
        }
    }
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384)
        .map_err(|e| format!("cannot make a key: {e}"))?;
    let mut params = rcgen::CertificateParams::new(vec!["kong_clustering".to_string()])
        .map_err(|e| e.to_string())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kong_clustering");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let day = |secs: u64| {
        let (y, m, d) = turnpike_plugins::clock::civil_from_days((secs / 86_400) as i64);
        rcgen::date_time_ymd(y as i32, m as u8, d as u8)
    };
    params.not_before = day(now);
    params.not_after = day(now + days.unwrap_or(1095) * 86_400);
    let made = params
        .self_signed(&pair)
        .map_err(|e| format!("cannot sign the certificate: {e}"))?;
    write_new(&cert, made.pem().as_bytes(), 0o644)?;
    write_new(&key, pair.serialize_pem().as_bytes(), 0o600)?;
    Ok(format!(
        "Successfully generated certificate/key pairs, they have been written to: '{}' and '{}'.",
        cert.display(),
        key.display()
    ))
}

/// Creates `path` with `mode` (never over an existing file) and writes `bytes`.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .and_then(|mut f| f.write_all(bytes))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}
