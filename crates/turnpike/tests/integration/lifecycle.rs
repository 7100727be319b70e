//! Configuration reloads (POST /config, SIGHUP) under load, bad configuration, bad requests and
//! graceful shutdown.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use bytes::Bytes;
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn cfg(up: &Upstream, path: &str) -> String {
    format!("_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{name: r, paths: [{path}]}}]}}]\n", up.url())
}

async fn post_config(gw: &Gateway, body: &str, query: &str) -> Reply {
    send(
        gw.admin,
        req("POST", &format!("/config{query}"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn post_config_swaps_atomically_and_rejects_bad_configs() {
    let up = Upstream::start("one");
    let gw = Gateway::with_config(&cfg(&up, "/a")).start();
    assert_eq!(get(gw.proxy, "localhost", "/a").await.status, 200);
    assert_eq!(get(gw.proxy, "localhost", "/b").await.status, 404);

    let r = post_config(
        &gw,
        &serde_json::json!({"config": cfg(&up, "/b")}).to_string(),
        "",
    )
    .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(r.json()["routes"][0]["paths"][0], "/b");
    assert_eq!(get(gw.proxy, "localhost", "/b").await.status, 200);
    assert_eq!(get(gw.proxy, "localhost", "/a").await.status, 404);

    // Same config again with check_hash: 304, nothing reloaded.
    let reloads = gw.status().await["config_reloads"].as_u64().unwrap();
    let r = post_config(
        &gw,
        &serde_json::json!({"config": cfg(&up, "/b")}).to_string(),
        "?check_hash=1",
    )
    .await;
    assert_eq!(r.status, 304);
    assert_eq!(
        gw.status().await["config_reloads"].as_u64().unwrap(),
        reloads
    );

    // A bad config: 400 in Kong's shape, flattened on request, and the old config stays.
    let bad = "_format_version: '3.0'\nservices: [{name: s, port: 70000, routes: [{name: r, paths: [nope]}]}]\n";
    let r = post_config(
        &gw,
        &serde_json::json!({"config": bad}).to_string(),
        "?flatten_errors=1",
    )
    .await;
    assert_eq!(r.status, 400);
    let j = r.json();
    assert_eq!(j["code"], 14);
    assert_eq!(j["name"], "invalid declarative configuration");
    assert_eq!(
        j["fields"]["services"][0]["port"],
        "value should be between 0 and 65535"
    );
    let flat = j["flattened_errors"].as_array().unwrap();
    assert!(
        flat.iter()
            .any(|e| e["entity_type"] == "route" && e["errors"][0]["field"] == "paths.1"),
        "{j}"
    );
    assert_eq!(get(gw.proxy, "localhost", "/b").await.status, 200);
    // Not JSON or YAML at all; a YAML body posted directly; a form body.
    let r = post_config(&gw, "{not json", "").await;
    assert_eq!(r.status, 400);
    assert!(r.json()["message"]
        .as_str()
        .unwrap()
        .contains("failed parsing declarative configuration"));
    let r = post_config(&gw, &cfg(&up, "/c"), "").await;
    assert_eq!(r.status, 201);
    assert_eq!(get(gw.proxy, "localhost", "/c").await.status, 200);
    // What `curl --data-binary @kong.yml` sends: raw YAML labelled as a form.
    let r = send(
        gw.admin,
        req("POST", "/config")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(Full::new(Bytes::from(cfg(&up, "/d"))))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(get(gw.proxy, "localhost", "/d").await.status, 200);
    let r = post_config(&gw, &cfg(&up, "/c"), "").await;
    assert_eq!(r.status, 201);
    // GET /config exports what is loaded.
    let r = send(
        gw.admin,
        req("GET", "/config").body(Full::new(Bytes::new())).unwrap(),
    )
    .await;
    assert!(r.json()["config"].as_str().unwrap().contains("/c"));
    // The Admin API's own errors.
    let r = send(
        gw.admin,
        req("GET", "/nope").body(Full::new(Bytes::new())).unwrap(),
    )
    .await;
    assert_eq!(
        (r.status, r.json()["message"].as_str().unwrap()),
        (404, "Not found")
    );
    let root = send(
        gw.admin,
        req("GET", "/").body(Full::new(Bytes::new())).unwrap(),
    )
    .await
    .json();
    // Kong's version (clients gate features on it), ours beside it; Kong's parsed listeners.
    assert_eq!(root["version"], "3.9.1");
    assert_eq!(root["turnpike_version"], env!("CARGO_PKG_VERSION"));
    let admin_port = gw.admin.port();
    let listeners = &root["configuration"]["admin_listeners"];
    assert_eq!(listeners[0]["port"], admin_port, "{listeners}");
    assert_eq!(listeners[0]["ssl"], false, "{listeners}");
    assert_eq!(listeners[0]["ip"], "127.0.0.1", "{listeners}");
    assert_eq!(
        root["configuration"]["proxy_listeners"][0]["port"],
        gw.proxy.port()
    );
    assert!(root["build_profile"].is_string());
    assert!(root["configuration"]["ssl_cert_key"]
        .as_array()
        .unwrap()
        .is_empty());
}

/// A reload that leaves most of the config alone is patched into the running one (the
/// router and the plugins' indexes shared): what it changes applies, what it keeps still
/// works, and the same config posted again changes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn reloads_patch_what_they_change_and_keep_the_rest() {
    let up = Upstream::start("one");
    let doc = |b_path: &str, extra: bool, consumers: &[&str]| {
        let mut routes = vec![
            serde_json::json!({"name": "a", "paths": ["/a"]}),
            serde_json::json!({"name": "b", "paths": [b_path]}),
            serde_json::json!({"name": "locked", "paths": ["/locked"],
                               "plugins": [{"name": "key-auth"}]}),
        ];
        if extra {
            routes.push(serde_json::json!({"name": "c", "paths": ["/c"]}));
        }
        let consumers: Vec<_> = consumers
            .iter()
            .map(|c| {
                serde_json::json!({"username": c,
                                        "keyauth_credentials": [{"key": format!("key-{c}")}]})
            })
            .collect();
        serde_json::json!({"_format_version": "3.0",
            "services": [{"name": "s", "url": up.url(), "routes": routes}],
            "consumers": consumers})
        .to_string()
    };
    let keyed = |key: &'static str| {
        req("GET", "/locked")
            .header("apikey", key)
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let gw = Gateway::with_config("_format_version: '3.0'\n").start();
    let r = post_config(&gw, &doc("/b", true, &["ann"]), "").await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let created = r.json()["routes"][0]["created_at"].clone();
    assert_eq!(get(gw.proxy, "localhost", "/c").await.status, 200);
    assert_eq!(send(gw.proxy, keyed("key-ann")).await.status, 200);

    // The same config again (a patch that changes nothing), then routes only: one changed,
    // one removed. Unchanged routes keep their created_at (a second later).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let patched = |s: serde_json::Value| s["config_reloads_patched"].as_u64().unwrap();
    let before = patched(gw.status().await);
    for body in [doc("/b", true, &["ann"]), doc("/b2", false, &["ann"])] {
        let r = post_config(&gw, &body, "").await;
        assert_eq!(r.status, 201, "{:?}", r.body);
        assert_eq!(r.json()["routes"][0]["created_at"], created);
    }
    assert_eq!(patched(gw.status().await), before + 2);
    assert_eq!(get(gw.proxy, "localhost", "/a").await.status, 200);
    assert_eq!(get(gw.proxy, "localhost", "/b2").await.status, 200);
    assert_eq!(get(gw.proxy, "localhost", "/b").await.status, 404);
    assert_eq!(get(gw.proxy, "localhost", "/c").await.status, 404);
    assert_eq!(send(gw.proxy, keyed("key-ann")).await.status, 200);
    assert_eq!(send(gw.proxy, keyed("key-bob")).await.status, 401);

    // A consumer added: its key works at once, the routes are the patched ones.
    let r = post_config(&gw, &doc("/b2", true, &["ann", "bob"]), "").await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(send(gw.proxy, keyed("key-bob")).await.status, 200);
    assert_eq!(get(gw.proxy, "localhost", "/c").await.status, 200);
    assert_eq!(get(gw.proxy, "localhost", "/b2").await.status, 200);
    // And removed.
    let r = post_config(&gw, &doc("/b2", true, &["bob"]), "").await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(send(gw.proxy, keyed("key-ann")).await.status, 401);
    assert_eq!(send(gw.proxy, keyed("key-bob")).await.status, 200);
    assert_eq!(patched(gw.status().await), before + 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn reload_under_load_fails_no_request() {
    let up = Upstream::start("one");
    let gw = Arc::new(Gateway::with_config(&cfg(&up, "/")).start());
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..8 {
        let (gw, stop, ok, failed) = (gw.clone(), stop.clone(), ok.clone(), failed.clone());
        clients.push(tokio::spawn(async move {
            // Keep-alive connections, as real clients use; bounded by count and time.
            let (mut sender, _conn) = h1_client(gw.proxy).await;
            for _ in 0..20_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                if sender.ready().await.is_err() {
                    failed.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                match sender
                    .send_request(req("GET", "/x").body(Full::new(Bytes::new())).unwrap())
                    .await
                {
                    Ok(r) if r.status() == 200 => {
                        collect(r).await;
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    // Swap between two configurations that both route the traffic, 30 times via the Admin API
    // and 10 times via SIGHUP.
    for i in 0..30 {
        let path = if i % 2 == 0 { "/x" } else { "/" };
        let r = post_config(
            &gw,
            &serde_json::json!({"config": cfg(&up, path)}).to_string(),
            "",
        )
        .await;
        assert_eq!(r.status, 201);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for i in 0..10 {
        std::fs::write(
            &gw.config_file,
            cfg(&up, if i % 2 == 0 { "/x" } else { "/" }),
        )
        .unwrap();
        gw.signal("HUP");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "requests failed during reloads"
    );
    assert!(
        ok.load(Ordering::Relaxed) > 100,
        "too little traffic to mean anything"
    );
    assert!(gw.status().await["config_reloads"].as_u64().unwrap() >= 31);
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_reloads_the_file_and_keeps_a_good_config_over_a_bad_one() {
    let up = Upstream::start("one");
    let gw = Gateway::with_config(&cfg(&up, "/a")).start();
    std::fs::write(&gw.config_file, cfg(&up, "/b")).unwrap();
    gw.signal("HUP");
    let mut served = false;
    for _ in 0..100 {
        if get(gw.proxy, "localhost", "/b").await.status == 200 {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served, "SIGHUP did not load the new file");
    // Patched into the running config (the service kept, the route changed).
    assert!(
        gw.status().await["config_reloads_patched"]
            .as_u64()
            .unwrap()
            >= 1
    );
    std::fs::write(
        &gw.config_file,
        "_format_version: '3.0'\nroutes: [{paths: [bad]}]\n",
    )
    .unwrap();
    gw.signal("HUP");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(get(gw.proxy, "localhost", "/b").await.status, 200);
    assert!(
        gw.log_text().contains("keeping the current configuration"),
        "{}",
        gw.log_text()
    );
    // A file that validates but cannot be built whole (a secret no vault resolves) is
    // refused too, though a POST /config would apply the rest of it.
    let reloads = gw.status().await["config_reloads"].as_u64().unwrap();
    std::fs::write(
        &gw.config_file,
        format!("_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{name: r, paths: [/b], plugins: [{{name: http-log, config: {{http_endpoint: '{{vault://env/turnpike-test-unset}}'}}}}]}}]}}]\n", up.url()),
    )
    .unwrap();
    gw.signal("HUP");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        gw.status().await["config_reloads"].as_u64().unwrap(),
        reloads
    );
    assert_eq!(get(gw.proxy, "localhost", "/b").await.status, 200);
}

#[test]
fn bad_declarative_file_prevents_start_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "kong.yml",
        "_format_version: '3.0'\nservices:\n- name: s\n  routes: [{name: r, paths: ['~/(']}]\n",
    );
    let prefix = dir.path().join("prefix");
    let (ok, out) = run(
        &["start"],
        &[
            ("TURNPIKE_DECLARATIVE_CONFIG", f.to_str().unwrap()),
            ("TURNPIKE_PREFIX", prefix.to_str().unwrap()),
            ("TURNPIKE_PROXY_LISTEN", "127.0.0.1:0"),
            ("TURNPIKE_ADMIN_LISTEN", "127.0.0.1:0"),
        ],
    );
    assert!(!ok);
    assert!(
        out.contains("in services.1 (service 's'): host: required field missing"),
        "{out}"
    );
    assert!(
        out.contains("in services.1.routes.1 (route 'r'): paths.1: invalid regex"),
        "{out}"
    );

    // `config parse` validates without starting.
    let (ok, out) = run(&["config", "parse", f.to_str().unwrap()], &[]);
    assert!(!ok && out.contains("host: required field missing"), "{out}");
    let good = write(
        dir.path(),
        "good.yml",
        "_format_version: '3.0'\nservices: [{name: s, host: h, routes: [{paths: [/]}]}]\n",
    );
    let (ok, out) = run(&["config", "parse", good.to_str().unwrap()], &[]);
    assert!(
        ok && out.contains("parse successful: 1 services, 1 routes"),
        "{out}"
    );

    // Bad node configuration: an unknown property in the file, or an invalid value, stops
    // the start. A variable that names no property does not (Kong ignores them; a script's
    // own TURNPIKE_SETUP_BENCH is one): one warning names it, and the start goes on (here to
    // the bad declarative file).
    let typo = write(dir.path(), "typo.conf", "no_such_property = 1\n");
    let (ok, out) = run(&["start", "-c", typo.to_str().unwrap()], &[]);
    assert!(
        !ok && out.contains("unknown property 'no_such_property'"),
        "{out}"
    );
    let (ok, out) = run(
        &["start"],
        &[
            ("TURNPIKE_NO_SUCH_PROPERTY", "1"),
            ("TURNPIKE_SETUP_BENCH", "1"),
            ("TURNPIKE_DECLARATIVE_CONFIG", f.to_str().unwrap()),
            ("TURNPIKE_PREFIX", prefix.to_str().unwrap()),
            ("TURNPIKE_PROXY_LISTEN", "127.0.0.1:0"),
            ("TURNPIKE_ADMIN_LISTEN", "127.0.0.1:0"),
        ],
    );
    assert!(!ok, "{out}");
    assert!(
        out.contains("name no property, ignored: TURNPIKE_NO_SUCH_PROPERTY, TURNPIKE_SETUP_BENCH")
            || out.contains(
                "name no property, ignored: TURNPIKE_SETUP_BENCH, TURNPIKE_NO_SUCH_PROPERTY"
            ),
        "{out}"
    );
    assert!(out.contains("invalid regex"), "{out}");
    let (ok, out) = run(&["start"], &[("KONG_UPSTREAM_KEEPALIVE_POOL_SIZE", "lots")]);
    assert!(!ok && out.contains("upstream_keepalive_pool_size"), "{out}");
    let conf = write(
        dir.path(),
        "turnpike.conf",
        "proxy_listen = 127.0.0.1:0 sparkles\n",
    );
    let (ok, out) = run(&["start", "-c", conf.to_str().unwrap()], &[]);
    assert!(
        !ok && out.contains("unknown listen flag 'sparkles'"),
        "{out}"
    );
    let (ok, out) = run(&["version"], &[]);
    assert!(
        ok && out.contains("Turnpike")
            && (out.contains("debug build") || out.contains("release build")),
        "{out}"
    );
}

async fn raw(addr: std::net::SocketAddr, bytes: &[u8]) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(bytes).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_requests_get_4xx_and_never_a_crash() {
    let up = Upstream::start("one");
    let gw = Gateway::with_config(&cfg(&up, "/")).start();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"GARBAGE\r\n\r\n".to_vec(), "400"),
        (
            b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n".to_vec(),
            "400",
        ),
        (b"GET / HTTP/1.1\r\nBad Header\r\n\r\n".to_vec(), "400"),
        (
            b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n".to_vec(),
            "400",
        ),
        (
            [
                b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec(),
                vec![b'a'; 64 * 1024],
                b"\r\n\r\n".to_vec(),
            ]
            .concat(),
            "431",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: \xff\xfe\r\nConnection: close\r\n\r\n".to_vec(),
            "",
        ),
        // What the head parser (h1_parse) refuses: obs-fold, a space before the colon, NUL
        // and a bare CR in a value, two spaces in the request line, too many header lines.
        (
            b"GET / HTTP/1.1\r\nHost: x\r\nX-A: b\r\n folded\r\n\r\n".to_vec(),
            "400",
        ),
        (b"GET / HTTP/1.1\r\nHost : x\r\n\r\n".to_vec(), "400"),
        (
            b"GET / HTTP/1.1\r\nHost: x\r\nX-A: b\x00c\r\n\r\n".to_vec(),
            "400",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: x\r\nX-A: b\rc\r\n\r\n".to_vec(),
            "400",
        ),
        (b"GET  / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), "400"),
        (
            [
                b"GET / HTTP/1.1\r\nHost: x\r\n".to_vec(),
                (0..101)
                    .flat_map(|i| format!("h{i}: v\r\n").into_bytes())
                    .collect(),
                b"\r\n".to_vec(),
            ]
            .concat(),
            "431",
        ),
        // Bare LF line ends are accepted (RFC 9112 §2.2), as nginx and Kong accept them.
        (
            b"GET / HTTP/1.1\nHost: x\nConnection: close\n\n".to_vec(),
            "200",
        ),
        (
            b"GET /%zz%00/../.. HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(),
            "",
        ),
    ];
    for (bytes, want) in cases {
        let out = raw(gw.proxy, &bytes).await;
        // An empty `want`: any well-formed answer (the request is odd but valid).
        assert!(
            out.starts_with(&format!("HTTP/1.1 {want}")),
            "{:?} -> {out:?}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(60)])
        );
    }
    // The gateway is still alive and serving.
    assert_eq!(get(gw.proxy, "localhost", "/").await.status, 200);
    assert!(!gw.log_text().contains("panicked"), "{}", gw.log_text());
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_drains_in_flight_requests() {
    let up = Upstream::start("one");
    let mut gw = Gateway::with_config(&format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/], strip_path: false}}]}}]\n",
        up.url()
    ))
    .start();
    let proxy = gw.proxy;
    let slow = tokio::spawn(async move { get(proxy, "localhost", "/delay/700").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    gw.signal("TERM");
    let r = slow.await.unwrap();
    assert_eq!(r.status, 200, "the in-flight request finished");
    let status = tokio::task::spawn_blocking(move || {
        let s = gw.child.wait().unwrap();
        (s, gw)
    })
    .await
    .unwrap();
    assert!(status.0.success());
    // No longer accepting.
    assert!(std::net::TcpStream::connect(proxy).is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn keepalive_timeout_closes_idle_and_slow_clients_but_not_busy_ones() {
    let up = Upstream::start("one");
    let gw = Gateway::with_config(&format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/], strip_path: false}}]}}]\n",
        up.url()
    ))
    .env("TURNPIKE_NGINX_HTTP_KEEPALIVE_TIMEOUT", "300ms")
    .start();
    // A client that never finishes its request head is dropped.
    let mut slow = tokio::net::TcpStream::connect(gw.proxy).await.unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), slow.read(&mut buf))
        .await
        .expect("closed in time");
    assert_eq!(n.unwrap_or(0), 0, "closed without a response");
    // An idle keep-alive connection is closed after the timeout.
    let (mut sender, conn) = h1_client(gw.proxy).await;
    let r = sender
        .send_request(req("GET", "/").body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    collect(r).await;
    tokio::time::timeout(Duration::from_secs(5), conn)
        .await
        .expect("idle connection closed")
        .unwrap()
        .unwrap();
    // A request slower than the keepalive timeout is not cut: it is in flight.
    let (mut sender, _conn) = h1_client(gw.proxy).await;
    let r = sender
        .send_request(
            req("GET", "/delay/900")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// The harness notices when another process listens on a gateway's proxy port (two
/// `reuseport` listeners on a port both picked free), and starts that gateway again elsewhere.
#[test]
fn a_shared_proxy_port_is_noticed() {
    let gw = Gateway::with_config("_format_version: \"3.0\"\n").start();
    assert!(!gw.proxy_port_shared());
    let other = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    other.set_reuse_port(true).unwrap();
    other.bind(&gw.proxy.into()).unwrap();
    other.listen(1).unwrap();
    assert!(gw.proxy_port_shared());
}

/// (thread name, nice) of every thread of process `pid`, by thread id.
fn threads_of(pid: u32) -> Vec<(u32, String, i64)> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter_map(|t| {
            let tid: u32 = t.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
            let name = std::fs::read_to_string(t.path().join("comm")).ok()?;
            // Fields after the name: state is field 3, nice field 19.
            let rest = &stat[stat.rfind(')')? + 2..];
            let nice = rest.split(' ').nth(16)?.parse().ok()?;
            Some((tid, name.trim().to_string(), nice))
        })
        .collect()
}

/// When the cores are busy, traffic wins: the control plane (Admin API, config sync, config
/// builder, its SQLite connections' threads) runs at nice 19; the proxy workers and what
/// watches or serves the traffic for them (active health checks, the status API, DNS, the log
/// plugins' senders) at the normal priority, whichever thread installs the first probes or
/// builds the first log plugin (here the config builder, at nice 19).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_and_its_watchers_outrank_the_control_plane() {
    let status_port = free_port();
    let gw = Gateway::sqlite()
        .env(
            "TURNPIKE_STATUS_LISTEN",
            &format!("127.0.0.1:{status_port}"),
        )
        .start();
    let pid = gw.pid();
    // Health probes written as Kong's docs write them, a form, on a database node: the config
    // builder compiles them and the checker (already running) starts probing.
    let dead = format!("127.0.0.1:{}", free_port());
    let form = "name=hc&healthchecks.active.healthy.interval=0.2&healthchecks.active.unhealthy.interval=0.2\
                &healthchecks.active.unhealthy.tcp_failures=1&healthchecks.active.timeout=0.5";
    let r = admin_raw(
        gw.admin,
        "POST",
        "/upstreams",
        "application/x-www-form-urlencoded",
        form.into(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        r.json()["healthchecks"]["active"]["healthy"]["interval"],
        0.2
    );
    let r = admin_raw(
        gw.admin,
        "POST",
        "/upstreams/hc/targets",
        "application/x-www-form-urlencoded",
        format!("target={dead}").into_bytes(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        eventually(Duration::from_secs(10), async || gw
            .health_of("hc", &dead)
            .await
            == "UNHEALTHY")
        .await,
        "{}",
        gw.log_text()
    );
    // Log plugins' senders and writers are started when the config builder (nice 19) builds
    // them; they serve the traffic and keep its priority.
    let log = std::env::temp_dir().join(format!("tp-file-log-{status_port}.log"));
    for form in [
        "name=http-log&config.http_endpoint=http://127.0.0.1:9/log".to_string(),
        "name=udp-log&config.host=127.0.0.1&config.port=9".to_string(),
        format!("name=file-log&config.path={}", log.display()),
    ] {
        let r = admin_raw(
            gw.admin,
            "POST",
            "/plugins",
            "application/x-www-form-urlencoded",
            form.into_bytes(),
        )
        .await;
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    }
    assert!(
        eventually(Duration::from_secs(10), async || [
            "http-log", "udp-log", "file-log"
        ]
        .iter()
        .all(|n| threads_of(pid).iter().any(|t| t.1 == *n)))
        .await,
        "{:?}",
        threads_of(pid)
    );
    let threads = threads_of(pid);
    let nice = |name: &str| -> Vec<i64> {
        threads
            .iter()
            .filter(|t| t.1.starts_with(name))
            .map(|t| t.2)
            .collect()
    };
    let main = threads.iter().find(|t| t.0 == pid).unwrap();
    assert_eq!(main.2, 19, "the control plane: {threads:?}");
    assert_eq!(nice("config-builder"), [19], "{threads:?}");
    assert_eq!(nice("turnpike-worke"), [0, 0], "{threads:?}");
    assert_eq!(nice("healthchecker"), [0], "{threads:?}");
    assert_eq!(nice("status"), [0], "{threads:?}");
    assert_eq!(nice("dns"), [0], "{threads:?}");
    for sender in ["http-log", "udp-log", "file-log", "spawner"] {
        assert_eq!(nice(sender), [0], "{sender}: {threads:?}");
    }
    // SQLite runs each connection on a thread that keeps its opener's priority; no worker has
    // looked up a credential yet, so all of them are the control plane's.
    let sqlite = nice("sqlx-sqlite-wor");
    assert!(!sqlite.is_empty(), "{threads:?}");
    assert!(sqlite.iter().all(|n| *n == 19), "{threads:?}");
    // And the node answers on every side.
    assert_eq!(gw.admin("GET", "/status", None).await.status, 200);
    let status: std::net::SocketAddr = format!("127.0.0.1:{status_port}").parse().unwrap();
    let r = call(status, "GET", "/status", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.json()["database"]["reachable"],
        true,
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(call(status, "GET", "/status/ready", &[]).await.status, 200);
}
