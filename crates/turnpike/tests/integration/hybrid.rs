//! Hybrid mode: a control plane on PostgreSQL feeding DB-less data planes over Kong's
//! clustering protocol (`/v1/outlet`, mutual TLS), real processes on both sides.

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use crate::common::pg::Postgres;
use crate::common::*;

fn bootstrap(pg: &Postgres) {
    let env: Vec<(&str, String)> = pg.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (ok, out) = run(&["migrations", "bootstrap"], &env);
    assert!(ok, "{out}");
}

/// The shared cluster certificate (`kong hybrid gen_cert` makes one like it), written to
/// `dir`: its paths.
fn shared_cert(dir: &Path) -> (String, String) {
    let (cert, key) = cert_for("kong_clustering");
    let c = write(dir, "cluster.crt", &cert);
    let k = write(dir, "cluster.key", &key);
    (
        c.to_str().unwrap().to_string(),
        k.to_str().unwrap().to_string(),
    )
}

/// `store` made a control plane, its cluster listener on `port`, with more settings.
fn as_control_plane(
    store: GatewayBuilder,
    port: u16,
    cert: &(String, String),
    extra: &[(&str, &str)],
) -> Gateway {
    let mut b = store
        .env("TURNPIKE_ROLE", "control_plane")
        .env("TURNPIKE_CLUSTER_LISTEN", &format!("127.0.0.1:{port}"))
        .env("TURNPIKE_CLUSTER_CERT", &cert.0)
        .env("TURNPIKE_CLUSTER_CERT_KEY", &cert.1);
    for (k, v) in extra {
        b = b.env(k, v);
    }
    b.start()
}

/// A control plane on `pg`, its cluster listener on `port`.
fn control_plane(pg: &Postgres, port: u16, cert: &(String, String)) -> Gateway {
    let mut b = Gateway::with_config("_format_version: \"3.0\"\n");
    for (k, v) in pg.env() {
        b = b.env(k, &v);
    }
    as_control_plane(b, port, cert, &[])
}

/// A DB-less data plane of the control plane on `port`; `prefix` (when given) is kept across
/// restarts.
fn data_plane(port: u16, cert: &(String, String), extra: &[(&str, &str)]) -> Gateway {
    let mut b = Gateway::with_config("")
        .env("TURNPIKE_DECLARATIVE_CONFIG", "")
        .env("TURNPIKE_ROLE", "data_plane")
        .env(
            "TURNPIKE_CLUSTER_CONTROL_PLANE",
            &format!("127.0.0.1:{port}"),
        )
        .env("TURNPIKE_CLUSTER_CERT", &cert.0)
        .env("TURNPIKE_CLUSTER_CERT_KEY", &cert.1);
    for (k, v) in extra {
        b = b.env(k, v);
    }
    b.start()
}

/// Waits (up to `secs`) until `path` with `headers` answers `status` on `proxy`.
async fn serves(
    proxy: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    status: u16,
    secs: u64,
) -> bool {
    eventually(Duration::from_secs(secs), async || {
        call(proxy, "GET", path, headers).await.status == status
    })
    .await
}

/// Waits (20 s at most) until the control plane has exported every write made so far and each
/// data plane runs that export: changes made entity by entity (decK) reach data planes in as
/// many pushes as the control plane's exports caught, each a state between two writes.
async fn in_sync(cp: &Gateway, dps: &[&Gateway]) {
    // Twice, half a second apart: the control plane's own sync applies the last write a moment
    // after the Admin API answered it.
    in_sync_once(cp, dps).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    in_sync_once(cp, dps).await;
}

async fn in_sync_once(cp: &Gateway, dps: &[&Gateway]) {
    let ok = eventually(Duration::from_secs(20), async || {
        let s = cp.status().await;
        let c = &s["clustering"];
        if s["config_version"] != c["exported_version"] || !c["config_hash"].is_string() {
            return false;
        }
        for dp in dps {
            if dp.status().await["configuration_hash"] != c["config_hash"] {
                return false;
            }
        }
        true
    })
    .await;
    assert!(ok, "not in sync: {}", cp.status().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_on_postgres_feeds_its_data_planes_and_they_outlive_it() {
    let up = Upstream::start("hybrid");
    let pg = Postgres::start();
    bootstrap(&pg);
    let dir = tempfile::tempdir().unwrap();
    let cert = shared_cert(dir.path());
    let cport = free_port();
    let cp = control_plane(&pg, cport, &cert);
    // One data plane reads its certificate from files, the other as base64-encoded PEM (as
    // Kong takes them), with labels; the second keeps its prefix across restarts.
    let b64 = |path: &str| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(path).unwrap())
    };
    let cert_b64 = (b64(&cert.0), b64(&cert.1));
    let dp1 = data_plane(cport, &cert, &[]);
    let prefix2 = dir.path().join("dp2-prefix");
    let prefix2 = prefix2.to_str().unwrap();
    let dp2_env = [
        ("TURNPIKE_PREFIX", prefix2),
        (
            "TURNPIKE_CLUSTER_DP_LABELS",
            "deployment:mycloud,region:us-east-1",
        ),
    ];
    let dp2 = data_plane(cport, &cert_b64, &dp2_env);

    // Configured on the control plane only.
    cp.add_service_route(&up.url(), "/hybrid").await;
    let r = cp
        .admin(
            "POST",
            "/services/s/plugins",
            Some(json!({"name": "key-auth"})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let r = cp
        .admin("POST", "/consumers", Some(json!({"username": "ann"})))
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let r = cp
        .admin(
            "POST",
            "/consumers/ann/key-auth",
            Some(json!({"key": "ann-key"})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    for dp in [&dp1, &dp2] {
        assert!(
            serves(dp.proxy, "/hybrid", &[("apikey", "ann-key")], 200, 20).await,
            "data plane never served the control plane's route:\n{}\n--- control plane:\n{}",
            dp.log_text(),
            cp.log_text()
        );
        assert_eq!(call(dp.proxy, "GET", "/hybrid", &[]).await.status, 401);
        let r = call(dp.proxy, "GET", "/hybrid", &[("apikey", "ann-key")]).await;
        assert_eq!(r.json()["upstream"], "hybrid");
    }

    // The control plane's records: both data planes, in sync with the hash they applied.
    let cp_hash = {
        let dp_hash = dp1.status().await["configuration_hash"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            eventually(Duration::from_secs(10), async || {
                let r = cp.admin("GET", "/clustering/data-planes", None).await;
                let data = r.json()["data"].as_array().cloned().unwrap_or_default();
                data.len() == 2 && data.iter().all(|d| d["config_hash"] == dp_hash.as_str())
            })
            .await,
            "{:?}",
            cp.admin("GET", "/clustering/data-planes", None)
                .await
                .json()
        );
        dp_hash
    };
    assert_eq!(cp_hash.len(), 32);
    let r = cp.admin("GET", "/clustering/data-planes", None).await;
    let data = r.json()["data"].as_array().unwrap().clone();
    for d in &data {
        assert_eq!(d["sync_status"], "normal", "{d}");
        assert_eq!(d["version"], "3.9.1", "{d}");
        assert_eq!(d["ip"], "127.0.0.1", "{d}");
        assert!(d["last_seen"].as_i64().unwrap() > 1_700_000_000, "{d}");
        assert!(
            d["cert_details"]["expiry_timestamp"].as_i64().is_some(),
            "{d}"
        );
        assert_eq!(d["id"].as_str().unwrap().len(), 36, "{d}");
    }
    assert!(
        data.iter()
            .any(|d| d["labels"] == json!({"deployment": "mycloud", "region": "us-east-1"})),
        "{data:?}"
    );
    let r = cp.admin("GET", "/clustering/status", None).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("deprecation"), Some("true"));
    assert_eq!(r.json().as_object().unwrap().len(), 2);
    // A data plane's own status names its control plane and the hash it applied.
    let s = dp2.status().await;
    assert_eq!(s["control_plane"]["connected"], true, "{s}");
    assert_eq!(
        s["control_plane"]["config_hash"], s["configuration_hash"],
        "{s}"
    );
    assert_eq!(s["configuration_hash"], cp_hash.as_str());

    // A data plane's Admin API is read-only; the clustering endpoints are a control plane's.
    let r = dp1
        .admin("POST", "/config", Some(json!({"_format_version": "3.0"})))
        .await;
    assert_eq!(r.status, 400, "{:?}", r.body);
    let r = dp1
        .admin("POST", "/services", Some(json!({"url": up.url()})))
        .await;
    assert_eq!(r.status, 405, "{:?}", r.body);
    let r = dp1.admin("GET", "/clustering/data-planes", None).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["message"],
        "this endpoint is only available when Kong is configured to run as Control Plane for the cluster"
    );

    // A change on the control plane reaches every data plane.
    let r = cp
        .admin("PATCH", "/routes/r", Some(json!({"paths": ["/moved"]})))
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    for dp in [&dp1, &dp2] {
        assert!(
            serves(dp.proxy, "/moved", &[("apikey", "ann-key")], 200, 10).await,
            "{}",
            dp.log_text()
        );
        let routes = dp.admin("GET", "/routes", None).await.json();
        assert_eq!(
            call(dp.proxy, "GET", "/hybrid", &[("apikey", "ann-key")])
                .await
                .status,
            404,
            "{routes}\n{}",
            dp.log_text()
        );
    }

    // The control plane goes away: the data planes keep serving; one restarted meanwhile
    // serves the config it kept, at once.
    let cp_log = cp.log_text();
    drop(cp);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        call(dp1.proxy, "GET", "/moved", &[("apikey", "ann-key")])
            .await
            .status,
        200
    );
    drop(dp2);
    let dp2 = data_plane(cport, &cert_b64, &dp2_env);
    let r = call(dp2.proxy, "GET", "/moved", &[("apikey", "ann-key")]).await;
    assert_eq!(
        r.status,
        200,
        "a restarted data plane lost its config:\n{}",
        dp2.log_text()
    );
    assert!(dp2
        .log_text()
        .contains("serving the config kept from the control plane"));
    assert_eq!(
        dp2.status().await["configuration_hash"],
        dp1.status().await["configuration_hash"]
    );

    // The control plane comes back (same database, same address): the data planes reconnect
    // (Kong's 5 to 10 s) and take the changes made since.
    let cp = control_plane(&pg, cport, &cert);
    let r = cp
        .admin("PATCH", "/routes/r", Some(json!({"paths": ["/back"]})))
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    for dp in [&dp1, &dp2] {
        assert!(
            serves(dp.proxy, "/back", &[("apikey", "ann-key")], 200, 30).await,
            "{}\n--- control plane before:\n{cp_log}\n--- after:\n{}",
            dp.log_text(),
            cp.log_text()
        );
    }
}

mod outlet {
    //! `/v1/outlet` spoken by hand, as a Kong data plane speaks it, to see the control
    //! plane's answers to good and bad peers.

    use super::*;
    use futures_util::StreamExt;
    use std::io::Read;
    use std::sync::Arc;
    use tokio_tungstenite::tungstenite::{self, Message};

    type Ws =
        tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;
    pub type ServerWs =
        tokio_tungstenite::WebSocketStream<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>;

    /// Connects with the certificate (`cert`, `key` PEMs) to `/v1/outlet?{query}`.
    pub async fn connect(
        port: u16,
        cert: &str,
        key: &str,
        query: &str,
    ) -> Result<Ws, tungstenite::Error> {
        let mut cfg = (*turnpike_proxy::tls::unverified_client_config()).clone();
        let ck = turnpike_config::declarative::pem::certified_key(cert, key).unwrap();
        cfg.client_auth_cert_resolver = Arc::new(rustls::sign::SingleCertAndKey::from(ck));
        cfg.alpn_protocols.clear();
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let name = rustls::pki_types::ServerName::try_from("kong_clustering").unwrap();
        let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect(name, tcp)
            .await
            .map_err(tungstenite::Error::Io)?;
        let uri = format!("wss://127.0.0.1:{port}/v1/outlet?{query}");
        tokio_tungstenite::client_async(uri, tls)
            .await
            .map(|(ws, _)| ws)
    }

    pub fn basic_info(plugins: &[(&str, &str)]) -> Message {
        let list: Vec<serde_json::Value> = plugins
            .iter()
            .map(|(n, v)| json!({"name": n, "version": v}))
            .collect();
        Message::Binary(
            json!({"type": "basic_info", "plugins": list, "process_conf": {}})
                .to_string()
                .into_bytes()
                .into(),
        )
    }

    /// The next frame within `secs` (`None`: none came, or the connection ended).
    pub async fn next(ws: &mut Ws, secs: u64) -> Option<Message> {
        match tokio::time::timeout(Duration::from_secs(secs), ws.next()).await {
            Ok(Some(Ok(m))) => Some(m),
            _ => None,
        }
    }

    pub fn inflate(data: &[u8]) -> serde_json::Value {
        let mut text = Vec::new();
        flate2::read::GzDecoder::new(data)
            .read_to_end(&mut text)
            .unwrap();
        serde_json::from_slice(&text).unwrap()
    }

    pub async fn record(cp: &Gateway, id: &str) -> serde_json::Value {
        let r = cp.admin("GET", "/clustering/data-planes", None).await;
        r.json()["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["id"] == id)
            .cloned()
            .unwrap_or_default()
    }

    pub const DP1: &str = "00000000-0000-4000-8000-0000000000d1";
    pub const DP2: &str = "00000000-0000-4000-8000-0000000000d2";
    pub const DP3: &str = "00000000-0000-4000-8000-0000000000d3";
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outlet_answers_good_and_bad_data_planes_as_kongs_does() {
    use futures_util::SinkExt;
    use outlet::*;
    use tokio_tungstenite::tungstenite::{self, Message};

    let up = Upstream::start("outlet");
    let pg = Postgres::start();
    bootstrap(&pg);
    let dir = tempfile::tempdir().unwrap();
    let cert = shared_cert(dir.path());
    let (cert_pem, key_pem) = (
        std::fs::read_to_string(&cert.0).unwrap(),
        std::fs::read_to_string(&cert.1).unwrap(),
    );
    let cport = free_port();
    let cp = control_plane(&pg, cport, &cert);
    cp.add_service_route(&up.url(), "/o").await;
    let r = cp
        .admin(
            "POST",
            "/routes/r/plugins",
            Some(json!({"name": "key-auth"})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);

    // No node_version (or no node_id): 400 before the upgrade.
    for q in [
        "node_id=x&node_hostname=h",
        "node_hostname=h&node_version=3.9.1",
    ] {
        match connect(cport, &cert_pem, &key_pem, q).await {
            Err(tungstenite::Error::Http(resp)) => assert_eq!(resp.status(), 400),
            other => panic!("{q}: {:?}", other.map(|_| ())),
        }
    }
    // Another certificate than the cluster's: closed without an answer (Kong's 444).
    let (other_cert, other_key) = cert_for("kong_clustering");
    let q = format!("node_id={DP1}&node_hostname=dp1&node_version=3.9.1");
    match connect(cport, &other_cert, &other_key, &q).await {
        Err(tungstenite::Error::Http(resp)) => panic!("answered {}", resp.status()),
        Err(_) => {}
        Ok(mut ws) => assert!(
            next(&mut ws, 5).await.is_none(),
            "a foreign certificate was served"
        ),
    }
    assert!(cp
        .log_text()
        .contains("does not match the shared data plane certificate"));

    // A good data plane gets the config at once, in Kong's export shape, gzip-compressed.
    let mut ws = connect(cport, &cert_pem, &key_pem, &q).await.unwrap();
    ws.send(basic_info(&[("key-auth", "3.9.1"), ("acl", "3.9.0")]))
        .await
        .unwrap();
    // The config as exported when it connected, then (if the last writes were not exported
    // yet) the next ones: until it holds the plugin.
    let mut msg = json!(null);
    for _ in 0..5 {
        let Some(Message::Binary(data)) = next(&mut ws, 10).await else {
            panic!("no config:\n{}", cp.log_text())
        };
        msg = inflate(&data);
        if msg["config_table"]["plugins"].is_array() {
            break;
        }
    }
    assert_eq!(msg["type"], "reconfigure");
    assert!(msg["timestamp"].as_f64().unwrap() > 1.7e9);
    let hash = msg["config_hash"].as_str().unwrap().to_string();
    assert_eq!(hash.len(), 32);
    assert_eq!(msg["hashes"]["config"], hash.as_str());
    for group in ["routes", "services", "plugins", "upstreams", "targets"] {
        assert_eq!(msg["hashes"][group].as_str().unwrap().len(), 32, "{group}");
    }
    assert_eq!(
        msg["hashes"]["upstreams"],
        "00000000000000000000000000000000"
    );
    let table = &msg["config_table"];
    assert_eq!(table["_format_version"], "3.0");
    assert_eq!(table["_transform"], false);
    let service_id = table["services"][0]["id"].as_str().unwrap();
    assert_eq!(table["routes"][0]["service"], service_id, "{table}");
    assert_eq!(table["plugins"][0]["name"], "key-auth");
    assert!(table["plugins"][0]["route"].is_string(), "{table}");
    // Pings carry the applied hash; each is answered and recorded.
    ws.send(Message::Ping(hash.clone().into_bytes().into()))
        .await
        .unwrap();
    assert!(matches!(next(&mut ws, 5).await, Some(Message::Pong(_))));
    assert!(
        eventually(Duration::from_secs(5), async || record(&cp, DP1).await
            ["config_hash"]
            == hash.as_str())
        .await
    );
    let rec = record(&cp, DP1).await;
    assert_eq!(
        (rec["sync_status"].as_str(), rec["hostname"].as_str()),
        (Some("normal"), Some("dp1"))
    );

    // A data plane without a plugin the config uses stays connected but gets no config.
    let q2 = format!("node_id={DP2}&node_hostname=dp2&node_version=3.9.0");
    let mut ws2 = connect(cport, &cert_pem, &key_pem, &q2).await.unwrap();
    ws2.send(basic_info(&[("acl", "3.9.0")])).await.unwrap();
    ws2.send(Message::Ping(
        b"00000000000000000000000000000000".to_vec().into(),
    ))
    .await
    .unwrap();
    assert!(
        matches!(next(&mut ws2, 5).await, Some(Message::Pong(_))),
        "no pong"
    );
    assert!(
        eventually(Duration::from_secs(5), async || record(&cp, DP2).await
            ["sync_status"]
            == "plugin_set_incompatible")
        .await,
        "{}",
        record(&cp, DP2).await
    );
    assert!(cp
        .log_text()
        .contains("configured key-auth plugin 3.9.1 is missing from data plane"));
    // A change reaches the good one, never the other.
    let r = cp
        .admin("PATCH", "/routes/r", Some(json!({"paths": ["/o2"]})))
        .await;
    assert_eq!(r.status, 200);
    let Some(Message::Binary(data)) = next(&mut ws, 10).await else {
        panic!("no update")
    };
    assert_eq!(
        inflate(&data)["config_table"]["routes"][0]["paths"],
        json!(["/o2"])
    );
    assert!(next(&mut ws2, 2).await.is_none());

    // A newer minor version is refused: a close frame, and the record says why.
    let q3 = format!("node_id={DP3}&node_hostname=dp3&node_version=3.10.0");
    let mut ws3 = connect(cport, &cert_pem, &key_pem, &q3).await.unwrap();
    ws3.send(basic_info(&[("key-auth", "3.10.0")]))
        .await
        .unwrap();
    assert!(matches!(
        next(&mut ws3, 5).await,
        Some(Message::Close(_)) | None
    ));
    assert_eq!(
        record(&cp, DP3).await["sync_status"],
        "kong_version_incompatible"
    );

    // Whatever is not a ping with a 32-character hash ends the connection: a text frame, a
    // ping with another payload, a frame past cluster_max_payload; the control plane goes on.
    for bad in [
        Message::Text("hello".into()),
        Message::Ping(b"short".to_vec().into()),
        Message::Binary(vec![0u8; 5 << 20].into()),
    ] {
        let mut w = connect(cport, &cert_pem, &key_pem, &q).await.unwrap();
        w.send(basic_info(&[("key-auth", "3.9.1")])).await.unwrap();
        assert!(matches!(next(&mut w, 10).await, Some(Message::Binary(_))));
        let _ = w.send(bad).await;
        let ended = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match next(&mut w, 5).await {
                    None | Some(Message::Close(_)) => return,
                    Some(_) => {}
                }
            }
        })
        .await;
        assert!(ended.is_ok(), "the connection outlived a bad frame");
    }
    // basic_info that is not one: closed.
    let mut w = connect(cport, &cert_pem, &key_pem, &q).await.unwrap();
    w.send(Message::Binary(b"{\"type\":\"hello\"}".to_vec().into()))
        .await
        .unwrap();
    assert!(matches!(
        next(&mut w, 5).await,
        Some(Message::Close(_)) | None
    ));
    assert!(cp
        .log_text()
        .contains("invalid basic info data type: hello"));
    // Still serving.
    ws.send(Message::Ping(hash.into_bytes().into()))
        .await
        .unwrap();
    assert!(matches!(next(&mut ws, 5).await, Some(Message::Pong(_))));
    assert_eq!(cp.admin("GET", "/status", None).await.status, 200);
}

/// A CA and two leaves it signs (`cp.cluster.test` and `dp.cluster.test`), for `pki` mode: the
/// CA's PEM and each leaf's (cert, key) PEMs.
fn pki() -> (String, (String, String), (String, String)) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "cluster CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf = |name: &str| {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        let c = p.signed_by(&key, &ca, &ca_key).unwrap();
        (c.pem(), key.serialize_pem())
    };
    (ca.pem(), leaf("cp.cluster.test"), leaf("dp.cluster.test"))
}

/// A control plane written here from Kong 3.9's sources (`kong/clustering/control_plane.lua`),
/// `pki` mode: takes one data plane, checks its request and `basic_info`, and hands the test
/// its WebSocket.
#[allow(clippy::result_large_err)] // the handshake callback's error type is tungstenite's
async fn kong_like_control_plane(
    ca: &str,
    cp_leaf: &(String, String),
) -> (
    u16,
    tokio::sync::oneshot::Receiver<(String, serde_json::Value, outlet::ServerWs)>,
) {
    use futures_util::StreamExt;
    use std::sync::Arc;
    let mut roots = rustls::RootCertStore::empty();
    for c in pem_certs(ca) {
        roots.add(c).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            pem_certs(&cp_leaf.0),
            turnpike_config::declarative::pem::private_key(&cp_leaf.1).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let tls = acceptor.accept(tcp).await.unwrap();
        let mut uri = String::new();
        let cb =
            |req: &tokio_tungstenite::tungstenite::handshake::server::Request,
             resp: tokio_tungstenite::tungstenite::handshake::server::Response| {
                uri = req.uri().to_string();
                Ok(resp)
            };
        let mut ws = tokio_tungstenite::accept_hdr_async(tls, cb).await.unwrap();
        let Some(Ok(tokio_tungstenite::tungstenite::Message::Binary(info))) = ws.next().await
        else {
            panic!("no basic_info")
        };
        let info: serde_json::Value = serde_json::from_slice(&info).unwrap();
        let _ = tx.send((uri, info, ws));
    });
    (port, rx)
}

/// The message a Kong control plane sends: `config_table` with its hash, gzip-compressed.
fn reconfigure(table: &serde_json::Value, hash: &str) -> tokio_tungstenite::tungstenite::Message {
    use std::io::Write;
    let msg = json!({"type": "reconfigure", "timestamp": 1733600600.123, "config_table": table, "config_hash": hash,
        "hashes": {"config": hash, "routes": hash, "services": hash, "plugins": hash, "upstreams": hash, "targets": hash}});
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(msg.to_string().as_bytes()).unwrap();
    tokio_tungstenite::tungstenite::Message::Binary(enc.finish().unwrap().into())
}

/// The next ping's payload within 10 s ("" when none came).
async fn next_ping(ws: &mut outlet::ServerWs) -> String {
    use futures_util::StreamExt;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Ok(Some(Ok(tokio_tungstenite::tungstenite::Message::Ping(p)))) => {
                return String::from_utf8_lossy(&p).into_owned()
            }
            Ok(Some(Ok(_))) => continue,
            _ => return String::new(),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_plane_takes_a_kong_control_planes_config_in_pki_mode() {
    use futures_util::SinkExt;
    let up = Upstream::start("from-kong");
    let (ca, cp_leaf, dp_leaf) = pki();
    let dir = tempfile::tempdir().unwrap();
    let ca_path = write(dir.path(), "ca.crt", &ca);
    let dp_cert = write(dir.path(), "dp.crt", &dp_leaf.0);
    let dp_key = write(dir.path(), "dp.key", &dp_leaf.1);
    let (port, conn) = kong_like_control_plane(&ca, &cp_leaf).await;
    let dp = data_plane(
        port,
        &(
            dp_cert.to_str().unwrap().into(),
            dp_key.to_str().unwrap().into(),
        ),
        &[
            ("TURNPIKE_CLUSTER_MTLS", "pki"),
            ("TURNPIKE_CLUSTER_CA_CERT", ca_path.to_str().unwrap()),
            ("TURNPIKE_CLUSTER_SERVER_NAME", "cp.cluster.test"),
            ("TURNPIKE_CLUSTER_MAX_PAYLOAD", "4194304"),
        ],
    );
    let (uri, info, mut ws) = tokio::time::timeout(Duration::from_secs(10), conn)
        .await
        .unwrap_or_else(|_| panic!("the data plane never connected:\n{}", dp.log_text()))
        .unwrap();
    // Kong's request: node_id, node_hostname and node_version (Kong's version it speaks).
    assert!(uri.starts_with("/v1/outlet?node_id="), "{uri}");
    assert!(
        uri.contains("&node_hostname=") && uri.ends_with("&node_version=3.9.1"),
        "{uri}"
    );
    assert_eq!(info["type"], "basic_info");
    let plugins = info["plugins"].as_array().unwrap();
    assert!(
        plugins
            .iter()
            .any(|p| p == &json!({"name": "key-auth", "version": "3.9.1"})),
        "{info}"
    );
    let names: Vec<String> = plugins
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_lowercase())
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    assert_eq!(info["process_conf"]["role"], "data_plane");
    assert!(info.get("labels").is_none());

    // The config as a Kong control plane exports it.
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/integration/hybrid/kong-3.9-config-table.json"),
    )
    .unwrap();
    let addr = up.url().trim_start_matches("http://").to_string();
    let (host, uport) = addr.split_once(':').unwrap();
    let table: serde_json::Value = serde_json::from_str(
        &text
            .replace("UPSTREAM_HOST", host)
            .replace("UPSTREAM_PORT", uport),
    )
    .unwrap();
    let hash = "0123456789abcdef0123456789abcdef";
    ws.send(reconfigure(&table, hash)).await.unwrap();
    // The first ping (on connect) carries Kong's empty hash; once applied, one carries the
    // config's at once.
    let mut pinged = next_ping(&mut ws).await;
    if pinged == "00000000000000000000000000000000" {
        pinged = next_ping(&mut ws).await;
    }
    assert_eq!(pinged, hash, "{}", dp.log_text());
    let r = call(
        dp.proxy,
        "GET",
        "/from-kong",
        &[("apikey", "kong-made-key")],
    )
    .await;
    assert_eq!(r.status, 200, "{}", dp.log_text());
    assert_eq!(r.json()["upstream"], "from-kong");
    assert_eq!(call(dp.proxy, "GET", "/from-kong", &[]).await.status, 401);
    assert_eq!(dp.status().await["configuration_hash"], hash);

    // A config it cannot take (a plugin it does not have), a gzip bomb, a message that is no
    // config: refused, logged, the last good config kept and still the one pinged.
    let mut bad = table.clone();
    bad["plugins"][0]["name"] = json!("no-such-plugin");
    ws.send(reconfigure(&bad, "ffffffffffffffffffffffffffffffff"))
        .await
        .unwrap();
    let bomb = {
        use std::io::Write;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        let zeros = vec![b' '; 1 << 20];
        for _ in 0..100 {
            enc.write_all(&zeros).unwrap();
        }
        enc.finish().unwrap()
    };
    assert!(bomb.len() < 1 << 20);
    ws.send(tokio_tungstenite::tungstenite::Message::Binary(bomb.into()))
        .await
        .unwrap();
    ws.send(tokio_tungstenite::tungstenite::Message::Binary(
        b"not gzip".to_vec().into(),
    ))
    .await
    .unwrap();
    assert!(
        eventually(Duration::from_secs(10), async || {
            let log = dp.log_text();
            log.contains("no-such-plugin")
                && log.contains("inflates past")
                && log.contains("cannot inflate")
        })
        .await,
        "{}",
        dp.log_text()
    );
    assert_eq!(
        call(
            dp.proxy,
            "GET",
            "/from-kong",
            &[("apikey", "kong-made-key")]
        )
        .await
        .status,
        200
    );
    assert_eq!(dp.status().await["configuration_hash"], hash);
    let status = dp.status().await;
    assert!(
        status["control_plane"]["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("unable to update running config"),
        "{status}"
    );
}

/// proxy.py (from PyPI), a real HTTP CONNECT proxy, on `port` with Basic credentials; in a
/// process group of its own (its workers are processes too), for [`kill_group`].
fn connect_proxy(port: u16, log: &Path) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let pythonpath = python_with("proxy", "proxy.py==2.4.10", "pypi-proxy");
    let child = std::process::Command::new("python3")
        .args([
            "-m",
            "proxy",
            "--hostname",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ])
        .args([
            "--basic-auth",
            "dp:s3cret",
            "--threaded",
            "--timeout",
            "120",
        ])
        .env("PYTHONPATH", pythonpath)
        .process_group(0)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("start proxy.py");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "proxy.py did not start: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

/// Kills the process and every process of its group.
fn kill_group(child: &mut std::process::Child) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .status();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_plane_reaches_its_control_plane_through_a_connect_proxy() {
    let up = Upstream::start("via-proxy");
    let dir = tempfile::tempdir().unwrap();
    let cert = shared_cert(dir.path());
    let cport = free_port();
    // A control plane on SQLite this time.
    let cp = as_control_plane(Gateway::sqlite(), cport, &cert, &[]);
    cp.add_service_route(&up.url(), "/px").await;
    let pport = free_port();
    let plog = dir.path().join("proxy.log");
    let mut proxy = connect_proxy(pport, &plog);
    let with_proxy = |url: String| {
        [
            ("TURNPIKE_CLUSTER_USE_PROXY", "on".to_string()),
            ("TURNPIKE_PROXY_SERVER", url),
        ]
    };
    let env = with_proxy(format!("http://dp:s3cret@127.0.0.1:{pport}"));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let dp = data_plane(cport, &cert, &env);
    assert!(
        serves(dp.proxy, "/px", &[], 200, 20).await,
        "{}\n--- proxy:\n{}",
        dp.log_text(),
        std::fs::read_to_string(&plog).unwrap_or_default()
    );
    // The network path is cut (the proxy killed): the data plane keeps serving; once the
    // proxy is back it reconnects and takes what changed meanwhile.
    kill_group(&mut proxy);
    let r = cp
        .admin("PATCH", "/routes/r", Some(json!({"paths": ["/moved"]})))
        .await;
    assert_eq!(r.status, 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(call(dp.proxy, "GET", "/px", &[]).await.status, 200);
    let mut proxy = connect_proxy(pport, &plog);
    assert!(
        serves(dp.proxy, "/moved", &[], 200, 30).await,
        "{}",
        dp.log_text()
    );
    // It reconnected once, after the cut.
    assert_eq!(
        dp.log_text().matches("connected to control plane").count(),
        2,
        "{}",
        dp.log_text()
    );
    // Wrong proxy credentials: the tunnel is refused, and said so.
    let env = with_proxy(format!("http://dp:wrong@127.0.0.1:{pport}"));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let refused = data_plane(cport, &cert, &env);
    assert!(
        eventually(Duration::from_secs(10), async || refused
            .log_text()
            .contains("refused the tunnel"))
        .await,
        "{}",
        refused.log_text()
    );
    assert_eq!(call(refused.proxy, "GET", "/moved", &[]).await.status, 404);
    drop(refused);

    kill_group(&mut proxy);
}

/// decK, driven against the control plane as a Kong user drives Kong's, changes what every
/// data plane serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deck_against_the_control_plane_drives_the_data_planes() {
    use crate::deck::{ok, summary, KONG_YML};
    let up = Upstream::start("deck-hybrid");
    let pg = Postgres::start();
    bootstrap(&pg);
    let dir = tempfile::tempdir().unwrap();
    let cert = shared_cert(dir.path());
    let cport = free_port();
    let cp = control_plane(&pg, cport, &cert);
    let dps = [data_plane(cport, &cert, &[]), data_plane(cport, &cert, &[])];
    let file = KONG_YML.replace("http://127.0.0.1:9/orders", &format!("{}/orders", up.url()));
    std::fs::write(dir.path().join("kong.yml"), &file).unwrap();
    let out = ok(&cp, dir.path(), &["gateway", "sync", "kong.yml"]);
    assert_eq!(summary(&out), (24, 0, 0), "{out}");
    // decK writes entity by entity: what reaches a data plane meanwhile is part of the file.
    in_sync(&cp, &[&dps[0], &dps[1]]).await;
    for dp in &dps {
        let r = call(
            dp.proxy,
            "GET",
            "/orders",
            &[("apikey", "alice-secret-key")],
        )
        .await;
        assert_eq!(r.status, 200, "{}", dp.log_text());
        assert_eq!(r.json()["headers"]["x-consumer-username"], "alice");
        assert_eq!(call(dp.proxy, "GET", "/orders", &[]).await.status, 401);
        let plugins = dp.admin("GET", "/plugins", None).await.json();
        assert_eq!(plugins["data"].as_array().unwrap().len(), 11, "{plugins}");
    }
    let changed = file.replace("bob-key", "bob-key-2");
    std::fs::write(dir.path().join("kong2.yml"), &changed).unwrap();
    let out = ok(&cp, dir.path(), &["gateway", "sync", "kong2.yml"]);
    assert_eq!(summary(&out).2, 1, "{out}");
    in_sync(&cp, &[&dps[0], &dps[1]]).await;
    for dp in &dps {
        let ok = call(dp.proxy, "GET", "/orders", &[("apikey", "bob-key-2")]).await;
        assert_eq!(ok.status, 200, "{}", dp.log_text());
        let gone = call(dp.proxy, "GET", "/orders", &[("apikey", "bob-key")]).await;
        assert_eq!(gone.status, 401, "{}", dp.log_text());
    }
    // The control plane's records agree with what each data plane runs.
    let hash = cp.status().await["clustering"]["config_hash"].clone();
    assert!(
        eventually(Duration::from_secs(10), async || {
            let r = cp
                .admin("GET", "/clustering/data-planes", None)
                .await
                .json();
            r["data"]
                .as_array()
                .is_some_and(|d| d.len() == 2 && d.iter().all(|x| x["config_hash"] == hash))
        })
        .await
    );
}

/// The database stops under the control plane: its data planes keep serving, and one that
/// connects meanwhile still gets the config the control plane last exported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_planes_are_served_while_the_control_planes_database_is_down() {
    let up = Upstream::start("pg-down");
    let mut pg = Postgres::start();
    bootstrap(&pg);
    let dir = tempfile::tempdir().unwrap();
    let cert = shared_cert(dir.path());
    let cport = free_port();
    let cp = control_plane(&pg, cport, &cert);
    cp.add_service_route(&up.url(), "/db-down").await;
    let dp1 = data_plane(cport, &cert, &[]);
    assert!(
        serves(dp1.proxy, "/db-down", &[], 200, 20).await,
        "{}",
        dp1.log_text()
    );
    pg.stop();
    let dp2 = data_plane(cport, &cert, &[]);
    assert!(
        serves(dp2.proxy, "/db-down", &[], 200, 20).await,
        "{}\n--- cp:\n{}",
        dp2.log_text(),
        cp.log_text()
    );
    assert_eq!(call(dp1.proxy, "GET", "/db-down", &[]).await.status, 200);
    // Writes fail on the control plane meanwhile; nothing reaches the data planes.
    let r = cp
        .admin(
            "POST",
            "/services",
            Some(json!({"name": "x", "url": up.url()})),
        )
        .await;
    assert!(r.status >= 500, "{}", r.status);
    // Back: the next write reaches them.
    pg.resume();
    assert!(
        eventually(Duration::from_secs(20), async || {
            cp.admin("PATCH", "/routes/r", Some(json!({"paths": ["/db-back"]})))
                .await
                .status
                == 200
        })
        .await
    );
    for dp in [&dp1, &dp2] {
        assert!(
            serves(dp.proxy, "/db-back", &[], 200, 20).await,
            "{}",
            dp.log_text()
        );
    }
}

/// `cluster_mtls = pki`: the control plane verifies data planes against `cluster_ca_cert` (a
/// certificate of another CA, or an expired one, is refused in the handshake), and the data
/// plane verifies the control plane for `cluster_server_name`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pki_mode_verifies_both_sides_against_the_cluster_ca() {
    let up = Upstream::start("pki");
    let (ca, cp_leaf, dp_leaf) = pki();
    let dir = tempfile::tempdir().unwrap();
    let ca_path = write(dir.path(), "ca.crt", &ca);
    let pair = |name: &str, (c, k): &(String, String)| {
        (
            write(dir.path(), &format!("{name}.crt"), c)
                .to_str()
                .unwrap()
                .to_string(),
            write(dir.path(), &format!("{name}.key"), k)
                .to_str()
                .unwrap()
                .to_string(),
        )
    };
    let (cp_files, dp_files) = (pair("cp", &cp_leaf), pair("dp", &dp_leaf));
    let cport = free_port();
    let pki_env = [
        ("TURNPIKE_CLUSTER_MTLS", "pki"),
        ("TURNPIKE_CLUSTER_CA_CERT", ca_path.to_str().unwrap()),
    ];
    let cp = as_control_plane(Gateway::sqlite(), cport, &cp_files, &pki_env);
    cp.add_service_route(&up.url(), "/pki").await;
    let mut env = pki_env.to_vec();
    env.push(("TURNPIKE_CLUSTER_SERVER_NAME", "cp.cluster.test"));
    let dp = data_plane(cport, &dp_files, &env);
    assert!(
        serves(dp.proxy, "/pki", &[], 200, 20).await,
        "{}\n--- cp:\n{}",
        dp.log_text(),
        cp.log_text()
    );

    // Refused in the handshake: a certificate of another CA, and an expired one of this CA.
    let q = format!("node_id={}&node_hostname=x&node_version=3.9.1", outlet::DP1);
    let (other_ca, _, other_leaf) = pki();
    drop(other_ca);
    assert!(outlet::connect(cport, &other_leaf.0, &other_leaf.1, &q)
        .await
        .is_err());
    let expired = {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "expiring CA");
        let ca2 = ca_params.self_signed(&ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec!["dp.cluster.test".to_string()]).unwrap();
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(2021, 1, 1);
        let c = p.signed_by(&key, &ca2, &ca_key).unwrap();
        (ca2.pem(), c.pem(), key.serialize_pem())
    };
    // A control plane trusting the expiring CA too refuses the expired certificate still.
    drop(cp);
    let both = format!("{ca}{}", expired.0);
    let both_path = write(dir.path(), "both-ca.crt", &both);
    let cp = as_control_plane(
        Gateway::sqlite(),
        cport,
        &cp_files,
        &[
            ("TURNPIKE_CLUSTER_MTLS", "pki"),
            ("TURNPIKE_CLUSTER_CA_CERT", both_path.to_str().unwrap()),
        ],
    );
    assert!(outlet::connect(cport, &expired.1, &expired.2, &q)
        .await
        .is_err());
    assert!(outlet::connect(cport, &dp_leaf.0, &dp_leaf.1, &q)
        .await
        .is_ok());
    assert_eq!(cp.admin("GET", "/status", None).await.status, 200);
    // A data plane asking for another name than the control plane's certificate holds
    // refuses it.
    let mut env = pki_env.to_vec();
    env.push(("TURNPIKE_CLUSTER_SERVER_NAME", "someone-else.test"));
    let wrong = data_plane(cport, &dp_files, &env);
    assert!(
        eventually(Duration::from_secs(10), async || wrong
            .log_text()
            .contains("TLS handshake failed"))
        .await,
        "{}",
        wrong.log_text()
    );
}

/// Beyond Kong: a Turnpike data plane gets only what changed (`turnpike_delta`), applies it
/// without rebuilding the rest, ends at the control plane's hash, and starts again from the
/// whole config and the deltas it kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turnpike_data_planes_take_deltas_and_keep_them() {
    let up = Upstream::start("delta");
    let dir = tempfile::tempdir().unwrap();
    let cert = shared_cert(dir.path());
    let cport = free_port();
    let cp = as_control_plane(Gateway::sqlite(), cport, &cert, &[]);
    cp.add_service_route(&up.url(), "/first").await;
    let prefix = dir.path().join("dp-prefix");
    let env = [("TURNPIKE_PREFIX", prefix.to_str().unwrap())];
    let dp = data_plane(cport, &cert, &env);
    assert!(
        serves(dp.proxy, "/first", &[], 200, 20).await,
        "{}",
        dp.log_text()
    );

    // Each kind of change, one after the other: a route added, a consumer and its key, a
    // plugin on a route, the service changed, a route deleted.
    let steps: Vec<(&str, &str, serde_json::Value)> = vec![
        (
            "POST",
            "/services/s/routes",
            json!({"name": "second", "paths": ["/second"]}),
        ),
        ("POST", "/consumers", json!({"username": "bo"})),
        ("POST", "/consumers/bo/key-auth", json!({"key": "bo-key"})),
        (
            "POST",
            "/routes/second/plugins",
            json!({"name": "key-auth"}),
        ),
        ("PATCH", "/services/s", json!({"path": "/base"})),
        ("DELETE", "/routes/r", json!(null)),
    ];
    for (method, path, body) in steps {
        let r = cp
            .admin(method, path, (!body.is_null()).then_some(body))
            .await;
        assert!(r.status < 300, "{method} {path}: {} {:?}", r.status, r.body);
        // Apart enough for each to be pushed alone.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    in_sync(&cp, &[&dp]).await;
    // The last change reached it.
    assert!(
        serves(dp.proxy, "/first", &[], 404, 10).await,
        "{}",
        dp.log_text()
    );
    assert_eq!(
        call(dp.proxy, "GET", "/second", &[("apikey", "bo-key")])
            .await
            .status,
        200
    );
    assert_eq!(
        call(dp.proxy, "GET", "/second", &[]).await.status,
        401,
        "{}",
        dp.log_text()
    );
    let r = call(dp.proxy, "GET", "/second/x", &[("apikey", "bo-key")]).await;
    assert_eq!(r.json()["uri"], "/base/x");
    assert_eq!(
        r.json()["headers"]["x-consumer-username"],
        "bo",
        "{}\n{}\n{}",
        r.json(),
        dp.admin("GET", "/consumers", None).await.json(),
        dp.admin("GET", "/key-auths", None).await.json()
    );
    let log = dp.log_text();
    assert!(log.matches(": delta of ").count() >= 4, "{log}");
    assert_eq!(log.matches(": whole config").count(), 1, "{log}");
    // The data plane ends at the very hash the control plane computed for the whole config.
    let hash = dp.status().await["configuration_hash"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        eventually(Duration::from_secs(10), async || {
            let r = cp
                .admin("GET", "/clustering/data-planes", None)
                .await
                .json();
            r["data"][0]["config_hash"] == hash.as_str()
        })
        .await
    );
    // Started again while the control plane is away: the kept config and deltas, replayed.
    drop(cp);
    drop(dp);
    let dp = data_plane(cport, &cert, &env);
    assert_eq!(
        call(dp.proxy, "GET", "/second/x", &[("apikey", "bo-key")])
            .await
            .status,
        200,
        "{}",
        dp.log_text()
    );
    assert_eq!(call(dp.proxy, "GET", "/first", &[]).await.status, 404);
    assert_eq!(dp.status().await["configuration_hash"], hash.as_str());
}

/// Kong's prometheus families of hybrid mode: on a control plane, one series per data plane
/// (last seen, config hash, version compatible); on a data plane, its certificate's expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_reports_the_data_planes_as_kong_does() {
    let dir = tempfile::tempdir().unwrap();
    let cert = shared_cert(dir.path());
    let cport = free_port();
    let cp = as_control_plane(Gateway::sqlite(), cport, &cert, &[]);
    let r = post_plugin(cp.admin, "prometheus", json!({})).await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let dp = data_plane(cport, &cert, &[]);
    in_sync(&cp, &[&dp]).await;
    let id = cp
        .admin("GET", "/clustering/data-planes", None)
        .await
        .json()["data"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        eventually(Duration::from_secs(10), async || {
            let m =
                String::from_utf8_lossy(&cp.admin("GET", "/metrics", None).await.body).into_owned();
            m.contains(&format!(
                "kong_data_plane_last_seen{{node_id=\"{id}\",hostname=\""
            )) && m.contains(&format!(
                "kong_data_plane_version_compatible{{node_id=\"{id}\","
            )) && m.contains("kong_version=\"3.9.1\"} 1")
                && m.contains(&format!("kong_data_plane_config_hash{{node_id=\"{id}\","))
        })
        .await,
        "{}",
        String::from_utf8_lossy(&cp.admin("GET", "/metrics", None).await.body)
    );
    let m = String::from_utf8_lossy(&dp.admin("GET", "/metrics", None).await.body).into_owned();
    let expiry = m
        .lines()
        .find_map(|l| l.strip_prefix("kong_data_plane_cluster_cert_expiry_timestamp "))
        .unwrap_or_else(|| panic!("{m}"));
    assert!(expiry.parse::<i64>().unwrap() > 1_700_000_000, "{expiry}");
}

/// A SQLite control plane and a data plane on the shared certificate `cert`: a route made on the
/// control plane is served by the data plane.
async fn cluster_serves(cert: &(String, String), up: &Upstream, path: &str) {
    let cport = free_port();
    let cp = as_control_plane(Gateway::sqlite(), cport, cert, &[]);
    cp.add_service_route(&up.url(), path).await;
    let dp = data_plane(cport, cert, &[]);
    assert!(
        serves(dp.proxy, path, &[], 200, 20).await,
        "{}\n--- control plane:\n{}",
        dp.log_text(),
        cp.log_text()
    );
}

/// `turnpike hybrid gen_cert`, as Kong's hybrid-mode guide starts with `kong hybrid gen_cert`:
/// the pair a cluster then runs on, modes as Kong sets them, never written over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gen_cert_makes_the_pair_a_cluster_runs_on() {
    use std::os::unix::fs::PermissionsExt;
    let up = Upstream::start("gen-cert");
    let dir = tempfile::tempdir().unwrap();
    let (c, k) = (
        dir.path().join("cluster.crt"),
        dir.path().join("cluster.key"),
    );
    let (c, k) = (c.to_str().unwrap(), k.to_str().unwrap());
    let (ok, out) = run(&["hybrid", "gen_cert", c, k, "-d", "30"], &[]);
    assert!(
        ok && out.contains("Successfully generated certificate/key pairs"),
        "{out}"
    );
    let mode = |p: &str| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode(c), mode(k)), (0o644, 0o600));
    let (ok, out) = run(&["hybrid", "gen_cert", c, k], &[]);
    assert!(
        !ok && out.contains("already exists.\nWill not overwrite it."),
        "{out}"
    );
    let (ok, out) = run(&["hybrid", "gen_cert", c], &[]);
    assert!(
        !ok && out.contains("both cert and key path needs to be provided"),
        "{out}"
    );
    let cert = (c.to_string(), k.to_string());
    cluster_serves(&cert, &up, "/gen").await;
}

/// A version 1 cluster certificate (older tools make them; `openssl x509 -req` without
/// extensions does): read as X.509, served, and its handshake signatures checked, in shared
/// mode on both sides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_cluster_certificate_works_in_shared_mode() {
    let up = Upstream::start("v1-cert");
    let dir = tempfile::tempdir().unwrap();
    let sh = |cmd: &str| {
        let ok = std::process::Command::new("sh")
            .args(["-c", cmd])
            .current_dir(dir.path())
            .status()
            .expect("openssl (Debian's openssl package)")
            .success();
        assert!(ok, "{cmd}");
    };
    sh("openssl ecparam -name secp384r1 -genkey -noout -out cluster.key");
    sh("openssl req -new -key cluster.key -subj /CN=kong_clustering -out c.csr");
    sh("openssl x509 -req -in c.csr -signkey cluster.key -days 30 -out cluster.crt 2>/dev/null");
    let pem = std::fs::read_to_string(dir.path().join("cluster.crt")).unwrap();
    let der = pem_certs(&pem).remove(0);
    let (_, parsed) = x509_parser::parse_x509_certificate(der.as_ref()).unwrap();
    assert_eq!(parsed.version(), x509_parser::x509::X509Version::V1);
    let cert = (
        dir.path().join("cluster.crt").to_str().unwrap().to_string(),
        dir.path().join("cluster.key").to_str().unwrap().to_string(),
    );
    cluster_serves(&cert, &up, "/v1").await;
}
