//! Many nodes on one real PostgreSQL (started by the harness): propagation through
//! LISTEN/NOTIFY, and behaviour while the database is down.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::pg::{Postgres, SyncTap};
use crate::common::*;
use serde_json::json;

fn node(pg: &Postgres, extra: &[(&str, &str)]) -> Gateway {
    let mut b = Gateway::with_config("_format_version: \"3.0\"\n");
    for (k, v) in pg.env() {
        b = b.env(k, &v);
    }
    for (k, v) in extra {
        b = b.env(k, v);
    }
    b.start()
}

/// A node with a route `/k` to `up` behind key-auth, and consumer `ann` holding `key` (five
/// writes: the config version they reach is 5), once it has applied them.
async fn key_auth_node(pg: &Postgres, up: &Upstream, key: &str, extra: &[(&str, &str)]) -> Gateway {
    let a = node(pg, extra);
    a.add_service_route(&up.url(), "/k").await;
    for (path, body) in [
        ("/services/s/plugins", json!({"name": "key-auth"})),
        ("/consumers", json!({"username": "ann"})),
        ("/consumers/ann/key-auth", json!({"key": key})),
    ] {
        let r = a.admin("POST", path, Some(body)).await;
        assert_eq!(r.status, 201, "{path}: {:?}", r.body);
    }
    // All five applied (the plugin too: before it, any key is proxied).
    assert!(
        eventually(Duration::from_secs(10), async || a.status().await
            ["config_version"]
            .as_i64()
            .is_some_and(|v| v >= 5))
        .await,
        "{}",
        a.log_text()
    );
    a
}

/// `GET /k` with an `apikey` header.
async fn with_key(proxy: std::net::SocketAddr, key: &str) -> Reply {
    send(
        proxy,
        req("GET", "/k")
            .header("apikey", key)
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await
}

/// The last statement of each of the nodes' connections, `application_name|query` a line
/// (`pg_stat_activity`), in name order.
async fn last_statements(pg: &Arc<Postgres>) -> String {
    let q = pg.clone();
    tokio::task::spawn_blocking(move || {
        q.query(
            "SELECT application_name, query FROM pg_stat_activity \
             WHERE datname = 'postgres' AND application_name LIKE 'turnpike%' ORDER BY 1",
        )
    })
    .await
    .unwrap()
}

/// The lines of [`last_statements`] from connections named `name`.
fn of_connection<'a>(rows: &'a str, name: &str) -> Vec<&'a str> {
    rows.lines()
        .filter(|l| l.split('|').next() == Some(name))
        .collect()
}

fn bootstrap(pg: &Postgres) {
    let env: Vec<(&str, String)> = pg.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (ok, out) = run(&["migrations", "status"], &env);
    assert!(ok && out.contains("needs bootstrapping"), "{out}");
    let (ok, out) = run(&["migrations", "bootstrap"], &env);
    assert!(ok, "{out}");
    let (ok, out) = run(&["migrations", "bootstrap"], &env);
    assert!(ok && out.contains("already"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_refuses_an_unbootstrapped_database() {
    let pg = Postgres::start();
    let env: Vec<(&str, String)> = pg.env();
    let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let prefix = pg.dir().join("prefix-x");
    env.push(("TURNPIKE_PREFIX", prefix.to_str().unwrap()));
    let (ok, out) = run(&["start"], &env);
    assert!(!ok);
    assert!(out.contains("migrations bootstrap"), "{out}");
}

/// A route added on node A is served by nodes B and C. The poll interval is set far beyond
/// the test's patience, so only LISTEN/NOTIFY can bring the change in time.
/// Waits (10 s at most) until every node answers each path with its status.
async fn every_node_serves(nodes: &[&Gateway], want: &[(&str, u16)]) {
    for n in nodes {
        let proxy = n.proxy;
        assert!(
            eventually(Duration::from_secs(10), async || {
                for (path, status) in want {
                    if get(proxy, "x", path).await.status != *status {
                        return false;
                    }
                }
                true
            })
            .await,
            "node did not reach {want:?}:\n{}",
            n.log_text()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_share_one_postgres() {
    let up = Upstream::start("shared");
    let pg = Postgres::start();
    bootstrap(&pg);
    let slow_poll = [("TURNPIKE_DB_UPDATE_FREQUENCY", "600")];
    let a = node(&pg, &slow_poll);
    let b = node(&pg, &slow_poll);
    let c = node(&pg, &slow_poll);

    let r = a
        .admin(
            "POST",
            "/services",
            Some(json!({"name": "svc", "url": up.url()})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let r = a
        .admin(
            "POST",
            "/services/svc/routes",
            Some(json!({"name": "r", "paths": ["/shared"]})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(until_status(a.proxy, "/shared", 200).await.status, 200);
    every_node_serves(&[&b, &c], &[("/shared", 200)]).await;
    // Every node's Admin API reads the shared store.
    assert_eq!(
        c.admin("GET", "/routes/r", None).await.json()["paths"],
        json!(["/shared"])
    );
    // An update on B moves the route on every node (each patches its router), a second
    // route and a plugin on it arrive together, and a delete on C removes the route
    // everywhere.
    let r = b
        .admin("PATCH", "/routes/r", Some(json!({"paths": ["/moved"]})))
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let r = b
        .admin(
            "POST",
            "/services/svc/routes",
            Some(json!({"name": "r2", "paths": ["/closed"]})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let r = b
        .admin(
            "POST",
            "/routes/r2/plugins",
            Some(json!({"name": "request-termination", "config": {"status_code": 418}})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    every_node_serves(
        &[&a, &c],
        &[("/moved", 200), ("/shared", 404), ("/closed", 418)],
    )
    .await;
    assert_eq!(c.admin("DELETE", "/routes/r", None).await.status, 204);
    every_node_serves(&[&a, &b], &[("/moved", 404), ("/closed", 418)]).await;
    // Two nodes racing to create the same name: exactly one wins, the other gets Kong's 409.
    let (ra, rb) = tokio::join!(
        a.admin("POST", "/consumers", Some(json!({"username": "race"}))),
        b.admin("POST", "/consumers", Some(json!({"username": "race"})))
    );
    let mut statuses = [ra.status, rb.status];
    statuses.sort();
    assert_eq!(statuses, [201, 409]);
}

/// PostgreSQL goes away under load: proxied traffic does not notice, writes fail cleanly with
/// Kong's database error, a node restarted meanwhile serves its last good config, and once
/// PostgreSQL is back writes work and every node converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outage_under_load() {
    let up = Upstream::start("outage");
    let mut pg = Postgres::start();
    bootstrap(&pg);
    let fast_poll = [("TURNPIKE_DB_UPDATE_FREQUENCY", "0.5")];
    let a = node(&pg, &fast_poll);
    let b = node(&pg, &fast_poll);
    // C restarts during the outage: its prefix (and last good config) must outlive it.
    let c_prefix = tempfile::tempdir().unwrap();
    let c_prefix_s = c_prefix.path().join("p").to_str().unwrap().to_string();
    let mut c_env = fast_poll.to_vec();
    c_env.push(("TURNPIKE_PREFIX", &c_prefix_s));
    let c = node(&pg, &c_env);
    a.add_service_route(&up.url(), "/live").await;
    for n in [&a, &b, &c] {
        let proxy = n.proxy;
        assert!(
            eventually(Duration::from_secs(10), async || get(proxy, "x", "/live")
                .await
                .status
                == 200)
            .await
        );
    }

    // Load on both nodes while the database stops and starts.
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let mut load = Vec::new();
    for addr in [a.proxy, b.proxy] {
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        load.push(tokio::spawn(async move {
            let (mut sender, _conn) = h1_client(addr).await;
            while !stop.load(Ordering::Relaxed) {
                // The gateway closes a client connection after keepalive_requests (10000):
                // that is not a failure, open another.
                if sender.ready().await.is_err() {
                    sender = h1_client(addr).await.0;
                }
                let r = sender
                    .send_request(
                        req("GET", "/live")
                            .body(http_body_util::Full::new(bytes::Bytes::new()))
                            .unwrap(),
                    )
                    .await;
                match r {
                    Ok(resp) if resp.status() == 200 => {
                        let _ = collect(resp).await;
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    other => {
                        eprintln!("proxied request failed: {:?}", other.map(|r| r.status()));
                        failed.fetch_add(1, Ordering::Relaxed);
                        let (s, _c) = h1_client(addr).await;
                        sender = s;
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut pg = tokio::task::spawn_blocking(move || {
        pg.stop();
        pg
    })
    .await
    .unwrap();

    // Writes fail with Kong's database error; nothing is applied.
    let r = a
        .admin(
            "POST",
            "/services",
            Some(json!({"name": "during", "host": "h"})),
        )
        .await;
    assert_eq!(r.status, 500, "{:?}", r.body);
    assert_eq!(r.json()["name"], "database error");
    assert_eq!(a.status().await["database"]["reachable"], false);

    // A node that restarts during the outage serves its last good config.
    drop(c);
    let c = node(&pg, &c_env);
    assert_eq!(
        get(c.proxy, "x", "/live").await.status,
        200,
        "{}",
        c.log_text()
    );
    assert!(
        c.log_text().contains("last good config"),
        "{}",
        c.log_text()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    let pg = tokio::task::spawn_blocking(move || {
        pg.resume();
        pg
    })
    .await
    .unwrap();
    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }
    let (served, lost) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    assert!(served > 100, "only {served} requests");
    assert_eq!(lost, 0, "{lost} proxied requests failed during the outage");

    // Writes work again (the pool reconnects by itself) and both nodes converge.
    let a_admin = a.admin;
    assert!(
        eventually(Duration::from_secs(15), async || {
            admin_call(
                a_admin,
                "POST",
                "/services/s/routes",
                Some(json!({"name": "after", "paths": ["/after"]})),
            )
            .await
            .status
                == 201
        })
        .await,
        "{}",
        a.log_text()
    );
    for n in [&a, &b, &c] {
        let proxy = n.proxy;
        assert!(
            eventually(Duration::from_secs(15), async || get(proxy, "x", "/after")
                .await
                .status
                == 200)
            .await,
            "{}",
            n.log_text()
        );
    }
    drop(pg);
}

/// A credential look-up on a cache miss is one round trip to PostgreSQL: the connection is
/// neither checked when handed out nor when put back (sqlx's pool did both, a `Sync` round
/// trip each: three for one query).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_look_up_is_one_round_trip() {
    let up = Upstream::start("one-trip");
    let pg = Postgres::start();
    bootstrap(&pg);
    let tap = SyncTap::start(&pg).await;
    let port = tap.port.to_string();
    let a = key_auth_node(
        &pg,
        &up,
        "known",
        &[
            ("TURNPIKE_PG_PORT", &port),
            ("TURNPIKE_NGINX_WORKER_PROCESSES", "1"),
        ],
    )
    .await;
    let proxy = a.proxy;
    assert!(
        eventually(Duration::from_secs(10), async || with_key(proxy, "known")
            .await
            .status
            == 200)
        .await
    );
    // The look-up's statement is prepared by now.
    assert_eq!(with_key(proxy, "warm-up").await.status, 401);
    let before = tap.syncs("turnpike-worker");
    for i in 0..40 {
        assert_eq!(with_key(proxy, &format!("unknown-{i}")).await.status, 401);
    }
    let syncs = tap.syncs("turnpike-worker") - before;
    assert!(
        (40..=42).contains(&syncs),
        "40 look-ups took {syncs} round trips"
    );
}

/// Connections that PostgreSQL dropped (a restart) while they were in constant use are
/// closed after their first failure, not reused: credential look-ups and one-statement
/// writes work again once the server is back, and keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_lost_in_a_restart_are_replaced() {
    let up = Upstream::start("restart");
    let mut pg = Postgres::start();
    bootstrap(&pg);
    let a = key_auth_node(&pg, &up, "known", &[]).await;
    let (proxy, admin) = (a.proxy, a.admin);
    assert!(
        eventually(Duration::from_secs(10), async || with_key(proxy, "known")
            .await
            .status
            == 200)
        .await
    );
    // Look-ups of new keys and consumer writes, never a second apart, across the restart.
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicUsize::new(0));
    let mut load = Vec::new();
    for writer in [false, true] {
        let (stop, next) = (stop.clone(), next.clone());
        load.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if writer {
                    let body = json!({"username": format!("during-{i}")});
                    let _ = admin_call(admin, "POST", "/consumers", Some(body)).await;
                } else {
                    let _ = with_key(proxy, &format!("during-{i}")).await;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pg = tokio::task::spawn_blocking(move || {
        pg.stop();
        std::thread::sleep(Duration::from_millis(300));
        pg.resume();
        pg
    })
    .await
    .unwrap();
    // Back: once a look-up and a write succeed, the next ones all do.
    assert!(
        eventually(Duration::from_secs(15), async || with_key(proxy, "after-0")
            .await
            .status
            == 401)
        .await,
        "{}",
        a.log_text()
    );
    assert!(
        eventually(Duration::from_secs(15), async || admin_call(
            admin,
            "POST",
            "/consumers",
            Some(json!({"username": "after-0"}))
        )
        .await
        .status
            == 201)
        .await,
        "{}",
        a.log_text()
    );
    for i in 1..30 {
        assert_eq!(
            with_key(proxy, &format!("after-{i}")).await.status,
            401,
            "look-up {i}"
        );
        let r = admin_call(
            admin,
            "POST",
            "/consumers",
            Some(json!({"username": format!("after-{i}")})),
        )
        .await;
        assert_eq!(r.status, 201, "write {i}: {:?}", r.body);
    }
    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }
    drop(pg);
}

/// Credentials come from the store once, then from the node's cache: with the database down,
/// known keys (and known misses) are still answered; only a key never seen needs the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_credentials_survive_an_outage() {
    let up = Upstream::start("cached-creds");
    let pg = Postgres::start();
    bootstrap(&pg);
    let a = key_auth_node(
        &pg,
        &up,
        "known",
        &[("TURNPIKE_DB_UPDATE_FREQUENCY", "0.2")],
    )
    .await;
    let proxy = a.proxy;
    let with_key = |key: &'static str| with_key(proxy, key);
    assert!(
        eventually(Duration::from_secs(10), async || with_key("known")
            .await
            .status
            == 200)
        .await
    );
    // The store may answer before this node's sync has read the change log, and the sync
    // then drops the entry of the changed credential: once it has applied all five writes,
    // warm the cache.
    assert!(
        eventually(Duration::from_secs(10), async || a.status().await
            ["config_version"]
            == 5)
        .await
    );
    assert_eq!(with_key("known").await.status, 200);
    assert_eq!(with_key("wrong").await.status, 401);

    let pg = tokio::task::spawn_blocking(move || {
        let mut pg = pg;
        pg.stop();
        pg
    })
    .await
    .unwrap();
    for _ in 0..50 {
        let r = with_key("known").await;
        assert_eq!(r.status, 200);
        assert_eq!(r.json()["headers"]["x-consumer-username"], "ann");
        assert_eq!(with_key("wrong").await.status, 401);
    }
    let r = with_key("never-seen").await;
    assert_eq!(
        (r.status, r.json()),
        (500, json!({"message": "An unexpected error occurred"}))
    );

    let _pg = tokio::task::spawn_blocking(move || {
        let mut pg = pg;
        pg.resume();
        pg
    })
    .await
    .unwrap();
    assert!(
        eventually(Duration::from_secs(15), async || with_key("never-seen")
            .await
            .status
            == 401)
        .await,
        "{}",
        a.log_text()
    );
    assert_eq!(with_key("known").await.status, 200);
}

/// `pg_keepalive_timeout`: a worker's connections idle that long are closed (a node at rest
/// holds none), and the next look-up opens one again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_close_after_pg_keepalive_timeout() {
    let up = Upstream::start("keepalive");
    let pg = Arc::new(Postgres::start());
    bootstrap(&pg);
    let a = key_auth_node(
        &pg,
        &up,
        "k1",
        &[
            ("TURNPIKE_NGINX_WORKER_PROCESSES", "1"),
            ("TURNPIKE_PG_KEEPALIVE_TIMEOUT", "1000"),
        ],
    )
    .await;
    let proxy = a.proxy;
    // All five writes applied (the plugin too: before it, any key is proxied).
    assert!(
        eventually(Duration::from_secs(10), async || a.status().await
            ["config_version"]
            == 5)
        .await
    );
    assert_eq!(with_key(proxy, "k1").await.status, 200);
    let workers = |pg: Arc<Postgres>| async move {
        tokio::task::spawn_blocking(move || {
            pg.query(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'turnpike-worker%'",
            )
            .trim()
            .parse::<u32>()
            .unwrap()
        })
        .await
        .unwrap()
    };
    assert_eq!(with_key(proxy, "never-1").await.status, 401);
    assert!(workers(pg.clone()).await >= 1);
    assert!(
        eventually(Duration::from_secs(10), async || workers(pg.clone()).await
            == 0)
        .await,
        "the worker's connections stayed open"
    );
    assert_eq!(with_key(proxy, "never-2").await.status, 401);
    let root = a.admin("GET", "/", None).await.json();
    assert_eq!(root["configuration"]["pg_keepalive_timeout"], 1000);
}

/// A proxy worker looks credentials up on connections of its own (Kong's `pg_pool_size` is
/// per worker), named after it in `pg_stat_activity`: its look-ups do not queue behind the
/// control plane's work on the Admin API's connections and thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_look_credentials_up_on_their_own_connections() {
    let up = Upstream::start("own-connections");
    let pg = Postgres::start();
    bootstrap(&pg);
    let a = key_auth_node(&pg, &up, "k1", &[("TURNPIKE_NGINX_WORKER_PROCESSES", "1")]).await;
    let proxy = a.proxy;
    let with_key = |key: &'static str| with_key(proxy, key);
    // All five writes applied (the plugin too: before it, any key is proxied).
    assert!(
        eventually(Duration::from_secs(10), async || a.status().await
            ["config_version"]
            == 5)
        .await
    );
    assert_eq!(with_key("k1").await.status, 200);
    // Keys never seen: each one a look-up, just before the connections are listed.
    for key in ["never-1", "never-2"] {
        let r = with_key(key).await;
        assert_eq!(r.status, 401, "{:?}", r.body);
    }
    let pg = Arc::new(pg);
    let rows = last_statements(&pg).await;
    // The key's look-up ran on the worker's connection; the Admin API's writes on the control
    // plane's.
    let by = |name: &str| of_connection(&rows, name);
    assert!(
        by("turnpike-worker-0")
            .iter()
            .any(|l| l.contains("keyauth_credentials")),
        "{rows}"
    );
    assert!(
        !by("turnpike")
            .iter()
            .any(|l| l.contains("keyauth_credentials") && l.contains("JOIN consumers")),
        "{rows}"
    );
    assert!(!by("turnpike").is_empty(), "{rows}");
    // Every connection opened without a warning (the driver ignored a `connect_timeout` in the
    // URL, once per connection).
    let log = a.log_text();
    assert!(!log.contains("unrecognized connect parameter"), "{log}");
}

/// The proxy's own oauth2 writes (a token issued by `/oauth2/token`) run on the worker's
/// connections too, not on the control plane's (whose thread yields to traffic, nice 19): a
/// client asking for a token is traffic. They still tell other nodes: a second node on the
/// same database accepts the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_write_the_tokens_they_issue_on_their_own_connections() {
    let up = Upstream::start("own-writes");
    let pg = Postgres::start();
    bootstrap(&pg);
    let env = [
        ("TURNPIKE_NGINX_WORKER_PROCESSES", "1"),
        ("TURNPIKE_TRUSTED_IPS", "127.0.0.1"),
    ];
    let a = node(&pg, &env);
    let b = node(&pg, &env);
    a.add_service_route(&up.url(), "/api").await;
    for (path, body) in [
        (
            "/services/s/plugins",
            json!({"name": "oauth2", "config": {"enable_client_credentials": true,
                "accept_http_if_already_terminated": true, "global_credentials": true}}),
        ),
        ("/consumers", json!({"username": "owner"})),
        (
            "/consumers/owner/oauth2",
            json!({"name": "app", "client_id": "cid", "client_secret": "cs",
                   "redirect_uris": ["https://app.test/cb"]}),
        ),
    ] {
        let r = a.admin("POST", path, Some(body)).await;
        assert_eq!(r.status, 201, "{path}: {:?}", r.body);
    }
    let issue = async || {
        send(
            a.proxy,
            req("POST", "/api/oauth2/token")
                .header("content-type", "application/x-www-form-urlencoded")
                .header("x-forwarded-proto", "https")
                .body(http_body_util::Full::new(bytes::Bytes::from(
                    "grant_type=client_credentials&client_id=cid&client_secret=cs",
                )))
                .unwrap(),
        )
        .await
    };
    let mut issued = None;
    assert!(
        eventually(Duration::from_secs(10), async || {
            // Until the plugin reaches the proxy, the route passes the request to the
            // upstream, which answers 200 too: only a token counts.
            let r = issue().await;
            let ok = r.status == 200 && r.json()["access_token"].is_string();
            issued = ok.then(|| r.json());
            ok
        })
        .await,
        "{}",
        a.log_text()
    );
    // Listed before the token is used (a look-up would be its connection's last statement).
    let pg = Arc::new(pg);
    let rows = last_statements(&pg).await;
    let by = |name: &str| of_connection(&rows, name);
    let inserts_token = |l: &&str| l.contains("INSERT INTO oauth2_tokens");
    assert!(by("turnpike-worker-0").iter().any(inserts_token), "{rows}");
    assert!(!by("turnpike").iter().any(inserts_token), "{rows}");
    // The token works on the node that issued it and on the other.
    let token = issued.unwrap()["access_token"]
        .as_str()
        .unwrap()
        .to_string();
    for n in [&a, &b] {
        let bearer = format!("Bearer {token}");
        let ok = eventually(Duration::from_secs(10), async || {
            call(n.proxy, "GET", "/api/x", &[("authorization", &bearer)])
                .await
                .status
                == 200
        })
        .await;
        assert!(ok, "{}", n.log_text());
    }
}

/// A node whose pools (two per worker and the control plane's, `pg_pool_size` each) could
/// exceed the server's `max_connections` says so at start; one within it does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_budget_past_max_connections_is_reported_at_start() {
    let pg = Postgres::start();
    bootstrap(&pg);
    let max: i64 = {
        let q = pg.query("SHOW max_connections");
        q.trim().parse().unwrap()
    };
    let within = node(
        &pg,
        &[
            ("TURNPIKE_NGINX_WORKER_PROCESSES", "1"),
            ("TURNPIKE_PG_POOL_SIZE", "10"),
        ],
    );
    let past = node(
        &pg,
        &[
            ("TURNPIKE_NGINX_WORKER_PROCESSES", "2"),
            ("TURNPIKE_PG_POOL_SIZE", &(max / 2).to_string()),
        ],
    );
    for n in [&within, &past] {
        assert!(
            eventually(Duration::from_secs(10), async || n.status().await
                ["config_version"]
                == 0)
            .await
        );
    }
    assert!(
        !within.log_text().contains("max_connections"),
        "{}",
        within.log_text()
    );
    let log = past.log_text();
    assert!(
        log.contains(&format!(
            "PostgreSQL takes {max} connections (max_connections) and this node alone may open {}",
            6 * (max / 2)
        )),
        "{log}"
    );
}

/// rate-limiting's cluster policy on PostgreSQL: two nodes count in one table, exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_policy_is_shared_by_nodes() {
    let up = Upstream::start("pg-cluster-rl");
    let pg = Postgres::start();
    bootstrap(&pg);
    let a = node(&pg, &[]);
    let b = node(&pg, &[]);
    a.add_service_route(&up.url(), "/rl").await;
    let r = a
        .admin(
            "POST",
            "/services/s/plugins",
            Some(json!({"name": "rate-limiting", "config": {"year": 30, "policy": "cluster", "limit_by": "ip"}})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    for n in [&a, &b] {
        let proxy = n.proxy;
        assert!(
            eventually(Duration::from_secs(10), async || get(proxy, "x", "/rl")
                .await
                .header("x-ratelimit-limit-year")
                .is_some())
            .await
        );
    }
    // Two requests counted so far; 60 more spread over both nodes: exactly 28 pass.
    let counts = concurrent_statuses(&[a.proxy, b.proxy], "/rl", 60).await;
    assert_eq!(counts, [(200, 28), (429, 32)].into(), "{}", a.log_text());
    // The workers counted on connections of their own (in this test nothing else opens one:
    // no credentials are looked up), not on the control plane's.
    let rows = tokio::task::spawn_blocking(move || {
        pg.query(
            "SELECT application_name, query FROM pg_stat_activity \
             WHERE application_name LIKE 'turnpike-worker-%'",
        )
    })
    .await
    .unwrap();
    assert!(
        rows.lines()
            .any(|l| l.contains("COMMIT") || l.contains("ratelimiting_metrics")),
        "{rows}"
    );
}

/// response-ratelimiting's cluster policy on PostgreSQL: what a response spent on one node is
/// seen by the other (Kong's `response_ratelimiting_metrics`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_ratelimiting_cluster_policy_is_shared_by_nodes() {
    let up = Upstream::start("pg-cluster-rrl");
    let pg = Postgres::start();
    bootstrap(&pg);
    let a = node(&pg, &[]);
    let b = node(&pg, &[]);
    a.add_service_route(&up.url(), "/rr").await;
    let r = a
        .admin(
            "POST",
            "/services/s/plugins",
            Some(json!({"name": "response-ratelimiting", "config": {"policy": "cluster", "limit_by": "ip", "limits": {"videos": {"minute": 3, "hour": 5}}}})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    for n in [&a, &b] {
        let proxy = n.proxy;
        assert!(
            eventually(Duration::from_secs(10), async || get(proxy, "x", "/rr/x")
                .await
                .header("x-ratelimit-limit-videos-minute")
                .is_some())
            .await
        );
    }
    let r = get(a.proxy, "x", "/rr/limit/videos=2").await;
    assert_eq!(r.header("x-ratelimit-remaining-videos-minute"), Some("1"));
    let bp = b.proxy;
    assert!(
        eventually(Duration::from_secs(5), async || get(bp, "x", "/rr/plain")
            .await
            .header("x-ratelimit-remaining-videos-hour")
            == Some("3"))
        .await,
        "{}",
        b.log_text()
    );
    let rows = tokio::task::spawn_blocking(move || {
        pg.query("SELECT period, value FROM response_ratelimiting_metrics ORDER BY period")
    })
    .await
    .unwrap();
    assert!(
        rows.contains("videos_hour") && rows.contains("videos_minute"),
        "{rows}"
    );
}

/// The change log is read (every sync) and pruned (every 64th version) through its index, at
/// its full size (10,000 versions) and with statistics taken when it held older versions: a
/// bound on one side only gave PostgreSQL's planner plans that read the whole log, each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_change_log_is_read_and_pruned_through_its_index() {
    let up = Upstream::start("change-log");
    let pg = Postgres::start();
    bootstrap(&pg);
    // A full log whose statistics are from 10,000 versions ago (autovacuum would refresh them
    // at some point; until then the planner goes by these).
    pg.query("ALTER TABLE changes SET (autovacuum_enabled = false)");
    pg.query("INSERT INTO changes SELECT v, 'seed', 'x' FROM generate_series(1, 10000) v");
    pg.query("ANALYZE changes");
    pg.query("DELETE FROM changes");
    pg.query("INSERT INTO changes SELECT v, 'seed', 'x' FROM generate_series(10001, 20000) v");
    pg.query("UPDATE turnpike_meta SET value = 20000 WHERE name = 'config_version'");
    // Every plan the node's statements run with goes to the server's log.
    pg.query("ALTER ROLE kong SET session_preload_libraries = 'auto_explain'");
    pg.query("ALTER ROLE kong SET auto_explain.log_min_duration = 0");
    let a = key_auth_node(&pg, &up, "k1", &[]).await;
    // Written one by one, each synced: past three multiples of 64, each a prune.
    for i in 0..200 {
        let r = a
            .admin(
                "POST",
                "/consumers/ann/key-auth",
                Some(json!({ "key": format!("c-{i}") })),
            )
            .await;
        assert_eq!(r.status, 201, "{:?}", r.body);
    }
    assert!(
        eventually(Duration::from_secs(10), async || a.status().await
            ["config_version"]
            == 20205)
        .await
    );
    assert_eq!(with_key(a.proxy, "c-199").await.status, 200);
    // Pruned to the last 10,000 versions (and at most 64 more).
    let oldest: i64 = pg
        .query("SELECT min(version) FROM changes")
        .trim()
        .parse()
        .unwrap();
    assert!(
        (20205 - 10000 - 64..=20205 - 10000).contains(&oldest),
        "{oldest}"
    );
    let log = std::fs::read_to_string(pg.dir().join("postgres.log")).unwrap();
    assert!(
        log.contains("Delete on changes"),
        "no prune's plan logged: {log}"
    );
    assert!(
        log.contains("FROM changes WHERE version >"),
        "no change-log read logged: {log}"
    );
    assert!(!log.contains("Seq Scan on changes"), "{log}");
}

/// A new entity is written by one statement (version bump, row, change log, notification),
/// and that keeps every answer Kong gives: taken keys, missing references, a taken id, and
/// concurrent writers racing for one key (the table's constraint catches the race; the long
/// way then finds Kong's error). Tagged entities go the long way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_statement_writes_keep_kongs_answers() {
    let up = Upstream::start("one-statement");
    let pg = Postgres::start();
    bootstrap(&pg);
    // Every statement the node sends is logged, with the connection's name.
    pg.query("ALTER ROLE kong SET log_statement = 'all'");
    pg.query("ALTER SYSTEM SET log_line_prefix = '%a: '");
    pg.query("SELECT pg_reload_conf()");
    let a = key_auth_node(&pg, &up, "k1", &[]).await;
    let ann = a.admin("GET", "/consumers/ann", None).await.json()["id"]
        .as_str()
        .unwrap()
        .to_string();

    // The key's row went in with its version bump and change-log entry, in one statement.
    let log = std::fs::read_to_string(pg.dir().join("postgres.log")).unwrap();
    let inserts: Vec<&str> = log
        .lines()
        .filter(|l| l.starts_with("turnpike: ") && l.contains("INSERT INTO keyauth_credentials"))
        .collect();
    assert_eq!(inserts.len(), 1, "{log}");
    assert!(
        inserts[0].contains("UPDATE turnpike_meta") && inserts[0].contains("INSERT INTO changes"),
        "{}",
        inserts[0]
    );

    let post = |path: &'static str, body: serde_json::Value| a.admin("POST", path, Some(body));
    // A taken key, a taken username.
    let r = post("/consumers/ann/key-auth", json!({"key": "k1"})).await;
    assert_eq!(r.status, 409, "{:?}", r.body);
    let taken_key = r.json();
    assert_eq!(taken_key["name"], "unique constraint violation");
    assert_eq!(
        taken_key["message"],
        "UNIQUE violation detected on '{key=\"k1\"}'"
    );
    let r = post("/consumers", json!({"username": "ann"})).await;
    assert_eq!(r.status, 409, "{:?}", r.body);
    assert_eq!(
        r.json()["message"],
        "UNIQUE violation detected on '{username=\"ann\"}'"
    );
    // A reference to nothing.
    let nobody = "0f0e0d0c-0000-4000-8000-000000000001";
    let r = post(
        "/key-auths",
        json!({"key": "k2", "consumer": {"id": nobody}}),
    )
    .await;
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(
        r.json()["message"],
        format!("the foreign key '{{id=\"{nobody}\"}}' does not reference an existing 'consumers' entity.")
    );
    // A taken id.
    let r = post("/consumers", json!({"id": ann, "username": "bob"})).await;
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(
        r.json()["message"],
        format!("primary key violation on key '{{id=\"{ann}\"}}'")
    );
    // Nothing of the refused writes was kept.
    assert_eq!(
        pg.query("SELECT COUNT(*) FROM keyauth_credentials").trim(),
        "1"
    );
    assert_eq!(pg.query("SELECT COUNT(*) FROM consumers").trim(), "1");

    // Sixteen writers race for one key: one wins, every other gets Kong's answer.
    let mut racers = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let admin = a.admin;
        racers.spawn(async move {
            admin_call(
                admin,
                "POST",
                "/consumers/ann/key-auth",
                Some(json!({"key": "race"})),
            )
            .await
        });
    }
    let mut created = 0;
    while let Some(r) = racers.join_next().await {
        let r = r.unwrap();
        match r.status {
            201 => created += 1,
            409 => assert_eq!(
                r.json()["message"],
                "UNIQUE violation detected on '{key=\"race\"}'"
            ),
            s => panic!("{s}: {:?}", r.body),
        }
    }
    assert_eq!(created, 1);

    // A writer that checked before a racing transaction committed: its statement waits for
    // the version row, then the UNIQUE column refuses its row, and the answer is still Kong's.
    let mut racer = pg.session();
    let held = "0f0e0d0c-0000-4000-8000-000000000002";
    {
        use std::io::Write;
        let stdin = racer.stdin.as_mut().unwrap();
        writeln!(
            stdin,
            "BEGIN; UPDATE turnpike_meta SET value = value + 1 WHERE name = 'config_version'; \
             INSERT INTO consumers (id, username, created_at, entity) VALUES ('{held}', 'racer', 0, \
             '{{\"id\":\"{held}\",\"username\":\"racer\",\"created_at\":0}}');"
        )
        .unwrap();
        stdin.flush().unwrap();
    }
    let pg = Arc::new(pg);
    let seen = |sql: &'static str| {
        let p = pg.clone();
        async move {
            eventually(Duration::from_secs(10), async || {
                let p = p.clone();
                tokio::task::spawn_blocking(move || p.query(sql).trim() == "1")
                    .await
                    .unwrap()
            })
            .await
        }
    };
    // The racing transaction holds the version row and its row, not yet committed...
    assert!(
        seen(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = 'psql' \
              AND state = 'idle in transaction'"
        )
        .await
    );
    let admin = a.admin;
    let late = tokio::spawn(async move {
        admin_call(
            admin,
            "POST",
            "/consumers",
            Some(json!({"username": "racer"})),
        )
        .await
    });
    // ...when the write's statement, its check passed, waits for the version row.
    assert!(
        seen(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
              AND query LIKE 'WITH ok AS%INSERT INTO consumers%'"
        )
        .await,
        "{}",
        pg.query("SELECT application_name, state, wait_event_type, query FROM pg_stat_activity")
    );
    {
        use std::io::Write;
        let mut stdin = racer.stdin.take().unwrap();
        writeln!(stdin, "COMMIT;").unwrap();
    }
    assert!(racer.wait().unwrap().success());
    let r = late.await.unwrap();
    assert_eq!(r.status, 409, "{:?}", r.body);
    assert_eq!(
        r.json()["message"],
        "UNIQUE violation detected on '{username=\"racer\"}'"
    );

    // A tagged entity goes the long way, tags and all.
    let r = post("/consumers", json!({"username": "tagged", "tags": ["t1"]})).await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let listed = a.admin("GET", "/consumers?tags=t1", None).await.json();
    assert_eq!(listed["data"][0]["username"], "tagged");

    // The won key authenticates, on this node's data plane.
    assert!(
        eventually(Duration::from_secs(10), async || with_key(a.proxy, "race")
            .await
            .status
            == 200)
        .await
    );
}

/// A burst of writes (a notification each) is applied in batches: the node syncs at most once
/// per 10 ms, not once per write (once per 50 ms while only cached credentials change), and
/// still ends at the last version. A write after a quiet spell carries its NOTIFY in its own
/// statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_writes_is_synced_in_batches() {
    let up = Upstream::start("burst");
    let pg = Postgres::start();
    bootstrap(&pg);
    pg.query("ALTER ROLE kong SET log_statement = 'all'");
    pg.query("ALTER SYSTEM SET log_line_prefix = '%a %m: '");
    pg.query("SELECT pg_reload_conf()");
    let a = key_auth_node(&pg, &up, "k1", &[]).await;
    // Another node that learns of changes only by NOTIFY (its poll is a minute away), as
    // another role, whose statements stay out of the log.
    pg.query("CREATE ROLE other SUPERUSER LOGIN");
    let b = node(
        &pg,
        &[
            ("TURNPIKE_DB_UPDATE_FREQUENCY", "60"),
            ("TURNPIKE_PG_USER", "other"),
        ],
    );
    let admin = a.admin;
    let writes = 400;
    let next = Arc::new(AtomicUsize::new(0));
    let mut writers = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let next = next.clone();
        writers.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= writes {
                    return;
                }
                // Every tenth asks for a key that is taken: its batch is refused, and each of
                // its rows is written alone.
                let (key, status) = if i % 10 == 9 {
                    ("k1".to_string(), 409)
                } else {
                    (format!("burst-{i}"), 201)
                };
                let r = admin_call(
                    admin,
                    "POST",
                    "/consumers/ann/key-auth",
                    Some(json!({ "key": key })),
                )
                .await;
                assert_eq!(r.status, status, "{key}: {:?}", r.body);
            }
        });
    }
    while let Some(r) = writers.join_next().await {
        r.unwrap();
    }
    let written = writes - writes / 10;
    assert!(
        eventually(Duration::from_secs(10), async || a.status().await
            ["config_version"]
            == 5 + written as u64)
        .await
    );
    let last = format!("burst-{}", writes - 2);
    assert_eq!(with_key(a.proxy, &last).await.status, 200);
    // A version each, in the change log, whether written in a batch or alone.
    assert_eq!(
        pg.query(
            "SELECT count(DISTINCT version) FROM changes WHERE entity_name = 'keyauth_credentials'"
        )
        .trim(),
        (written + 1).to_string()
    );
    // Whether node b (which learns only by NOTIFY) comes to run `version`.
    let b_reaches = async |version: u64| {
        eventually(Duration::from_secs(5), async || {
            b.status().await["config_version"] == version
        })
        .await
    };
    // The last write was announced (the writes share NOTIFYs; one always follows the last).
    assert!(b_reaches(5 + written as u64).await, "{}", b.log_text());

    let log = std::fs::read_to_string(pg.dir().join("postgres.log")).unwrap();
    // The NOTIFYs: at most one per 5 ms, not one per write.
    let notified = times(&log, "pg_notify");
    let span_ms = (notified[notified.len() - 1] - notified[0]) * 1000.0;
    assert!(
        (notified.len() as f64) <= span_ms / 4.5 + 2.0 && notified.len() < writes / 2,
        "{} NOTIFYs in {span_ms} ms for {writes} writes",
        notified.len()
    );
    // Writes that came together shared statements.
    let inserts = times(&log, "INSERT INTO keyauth_credentials").len();
    let most = log
        .lines()
        .filter(|l| l.starts_with("turnpike ") && l.contains("INSERT INTO keyauth_credentials"))
        .filter_map(|l| {
            let rows = l.split("SET value = value + ").nth(1)?;
            rows.split(' ').next()?.parse::<usize>().ok()
        })
        .max()
        .unwrap_or(0);
    assert!(
        inserts < writes && most >= 2,
        "{inserts} statements for {writes} writes, at most {most} rows in one"
    );
    // The syncs' change-log reads from the burst's first write on (the first key-auth insert
    // is the set-up's), with when each was sent.
    let burst = times(&log, "INSERT INTO keyauth_credentials")[1];
    let since_burst = |what: &str| -> Vec<f64> {
        times(&log, what)
            .into_iter()
            .filter(|t| *t >= burst)
            .collect()
    };
    let at = since_burst("SELECT version, entity_name, entity_id FROM changes");
    assert!(at.len() >= 2, "{log}");
    let span_ms = (at[at.len() - 1] - at[0]) * 1000.0;
    // Only key-auth credentials changed (cached, not config): at most one sync per 50 ms (+1
    // for the first; the log's times are to the millisecond). A bound the code's own wait
    // guarantees: a slow machine only spreads the syncs further.
    assert!(
        (at.len() as f64) <= span_ms / 49.0 + 2.0,
        "{} syncs in {span_ms} ms for {writes} writes",
        at.len()
    );
    assert!(at.len() < writes, "{} syncs for {writes} writes", at.len());
    // Each sync is that one statement: the version, the log and the changed rows in one
    // snapshot, not a transaction of five (node a's writes are not read-only).
    assert!(since_burst("READ ONLY").is_empty(), "{log}");
    assert!(
        since_burst("FROM keyauth_credentials WHERE id IN").is_empty(),
        "{log}"
    );

    // After a quiet spell a write's NOTIFY goes in the write's statement, not in one of its own;
    // the other node learns of it all the same.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = admin_call(
        admin,
        "POST",
        "/consumers/ann/key-auth",
        Some(json!({ "key": "after-quiet" })),
    )
    .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert!(b_reaches(6 + written as u64).await, "{}", b.log_text());
    let log = std::fs::read_to_string(pg.dir().join("postgres.log")).unwrap();
    let last = log
        .lines()
        .rfind(|l| l.starts_with("turnpike ") && l.contains("INSERT INTO keyauth_credentials"))
        .unwrap();
    assert!(last.contains("pg_notify"), "{last}");
    let (inserted, notified) = (
        times(&log, "INSERT INTO keyauth_credentials"),
        times(&log, "SELECT pg_notify"),
    );
    assert!(
        notified.last() < inserted.last(),
        "a NOTIFY of its own after the write: {notified:?}"
    );
}

/// When node `a` (application_name `turnpike`) sent the statements of PostgreSQL's log
/// that contain `what`, in seconds of the day.
fn times(log: &str, what: &str) -> Vec<f64> {
    log.lines()
        .filter(|l| l.starts_with("turnpike ") && l.contains(what))
        .filter_map(|l| {
            // "turnpike 2026-11-28 10:01:02.345 UTC: LOG: ..."
            let time = l.split(' ').nth(2)?;
            let mut hms = time.split(':');
            let h: f64 = hms.next()?.parse().ok()?;
            let m: f64 = hms.next()?.parse().ok()?;
            let s: f64 = hms.next()?.parse().ok()?;
            Some(h * 3600.0 + m * 60.0 + s)
        })
        .collect()
}

/// `config db_import` in bulk on PostgreSQL (its statements carry thousands of values): the
/// rows and the references between them, no change-log entries (a gap), which a node already
/// running reads whole and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn db_import_in_bulk_on_postgres() {
    let up = Upstream::start("pg-bulk");
    let pg = Postgres::start();
    bootstrap(&pg);
    let dir = tempfile::tempdir().unwrap();
    let mut yaml = format!(
        "_format_version: '3.0'\nservices:\n- name: main\n  url: {}\n  routes:\n  - name: main\n    paths: [/bulk]\n    plugins:\n    - name: key-auth\n",
        up.url()
    );
    for i in 0..2000 {
        yaml.push_str(&format!(
            "- name: s{i}\n  host: h{i}.example\n  tags: [generated]\n"
        ));
    }
    yaml.push_str("consumers:\n");
    for i in 0..6000 {
        yaml.push_str(&format!(
            "- username: u{i}\n  keyauth_credentials:\n  - key: key-{i}\n"
        ));
    }
    let file = write(dir.path(), "kong.yml", &yaml);
    let env: Vec<(&str, String)> = pg.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let gw = node(&pg, &[]);
    assert_eq!(get(gw.proxy, "x", "/bulk").await.status, 404);
    let (ok, text) = run(&["config", "db_import", file.to_str().unwrap()], &env);
    assert!(ok, "{text}");
    assert!(text.contains("import successful: 14003 entities"), "{text}");
    let counts = pg.query(
        "SELECT (SELECT count(*) FROM services), (SELECT count(*) FROM keyauth_credentials), \
         (SELECT count(*) FROM tags), (SELECT count(DISTINCT entity_id) FROM changes)",
    );
    assert_eq!(counts.trim(), "2001|6000|2000|0");
    // Analysed by the import: without statistics the config sync's change-log read was
    // planned as a table scan with JIT (seconds a write at 100k routes).
    let analysed = pg.query(
        "SELECT count(*) FROM pg_stat_user_tables \
         WHERE relname IN ('changes', 'services', 'keyauth_credentials') AND last_analyze IS NOT NULL",
    );
    assert_eq!(analysed.trim(), "3");
    assert_eq!(until_status(gw.proxy, "/bulk", 401).await.status, 401);
    assert_eq!(
        call(gw.proxy, "GET", "/bulk", &[("apikey", "key-5999")])
            .await
            .status,
        200
    );
    assert_eq!(get(gw.proxy, "x", "/bulk").await.status, 401);
}
