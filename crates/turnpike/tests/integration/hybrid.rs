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

/// A control plane on `pg`, its cluster listener on `port`.
fn control_plane(pg: &Postgres, port: u16, cert: &(String, String)) -> Gateway {
    let mut b = Gateway::with_config("_format_version: \"3.0\"\n");
    for (k, v) in pg.env() {
        b = b.env(k, &v);
    }
    b.env("TURNPIKE_ROLE", "control_plane")
        .env("TURNPIKE_CLUSTER_LISTEN", &format!("127.0.0.1:{port}"))
        .env("TURNPIKE_CLUSTER_CERT", &cert.0)
        .env("TURNPIKE_CLUSTER_CERT_KEY", &cert.1)
        .start()
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
        assert_eq!(
            call(dp.proxy, "GET", "/hybrid", &[("apikey", "ann-key")])
                .await
                .status,
            404
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
