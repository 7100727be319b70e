//! What operators see, on the real binary: the prometheus plugin's metrics after a known mix
//! of requests (Kong's names, labels and buckets), node-wide metrics, the Status API on
//! `status_listen`, and file-log's JSON lines (Kong's serializer, credentials redacted).

use std::time::Duration;

use crate::common::*;

/// The value of the series whose line starts with `series` (name and labels, exactly).
fn value(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l[series.len()..].trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_logs_describe_a_known_request_mix() {
    let up = Upstream::start("observed");
    let status_port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("requests.log");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: open
  url: {url}
  routes: [{{name: open-route, paths: [/open]}}]
- name: guarded
  url: {url}
  routes:
  - name: guarded-route
    paths: [/guarded]
    plugins: [{{name: key-auth}}]
upstreams:
- name: pool
  healthchecks: {{passive: {{unhealthy: {{tcp_failures: 1}}}}}}
  targets: [{{target: "{addr}"}}]
consumers:
- username: alice
  keyauth_credentials: [{{key: alice-key}}]
plugins:
- name: prometheus
  config:
    per_consumer: true
    status_code_metrics: true
    latency_metrics: true
    bandwidth_metrics: true
    upstream_health_metrics: true
- name: file-log
  config: {{path: "{log}"}}
"#,
        url = up.url(),
        addr = up.addr,
        log = log_path.display()
    ))
    .env(
        "TURNPIKE_STATUS_LISTEN",
        &format!("127.0.0.1:{status_port}"),
    )
    .start();

    for _ in 0..3 {
        assert_eq!(call(gw.proxy, "GET", "/open", &[]).await.status, 200);
    }
    for _ in 0..2 {
        assert_eq!(
            call(gw.proxy, "GET", "/open/status/503", &[]).await.status,
            503
        );
    }
    for _ in 0..2 {
        let r = call(gw.proxy, "GET", "/guarded", &[("apikey", "alice-key")]).await;
        assert_eq!(r.status, 200);
    }
    let r = call(
        gw.proxy,
        "GET",
        "/guarded",
        &[("apikey", "wrong"), ("authorization", "Basic c2VjcmV0")],
    )
    .await;
    assert_eq!(r.status, 401);
    // No route: no service, nothing recorded per service (as Kong).
    assert_eq!(call(gw.proxy, "GET", "/nowhere", &[]).await.status, 404);

    let status = std::net::SocketAddr::from(([127, 0, 0, 1], status_port));
    let mut metrics = String::new();
    let complete = eventually(Duration::from_secs(5), async || {
        let r = call(status, "GET", "/metrics", &[]).await;
        metrics = String::from_utf8_lossy(&r.body).into_owned();
        // Per-peer counters are published by the workers once a second.
        value(&metrics, r#"kong_http_requests_total{service="guarded",route="guarded-route",code="401",source="kong",workspace="default",consumer=""}"#) == Some(1.0)
            && metrics.contains("turnpike_upstream_requests_total{")
    })
    .await;
    assert!(complete, "{metrics}");
    let expect = [
        (
            r#"kong_http_requests_total{service="open",route="open-route",code="200",source="service",workspace="default",consumer=""}"#,
            3.0,
        ),
        (
            r#"kong_http_requests_total{service="open",route="open-route",code="503",source="service",workspace="default",consumer=""}"#,
            2.0,
        ),
        (
            r#"kong_http_requests_total{service="guarded",route="guarded-route",code="200",source="service",workspace="default",consumer="alice"}"#,
            2.0,
        ),
        (
            r#"kong_request_latency_ms_count{service="open",route="open-route",workspace="default"}"#,
            5.0,
        ),
        (
            r#"kong_request_latency_ms_bucket{service="open",route="open-route",workspace="default",le="+Inf"}"#,
            5.0,
        ),
        (
            r#"kong_upstream_latency_ms_count{service="open",route="open-route",workspace="default"}"#,
            5.0,
        ),
        (
            r#"kong_kong_latency_ms_count{service="guarded",route="guarded-route",workspace="default"}"#,
            3.0,
        ),
        // The 401 never reached the upstream.
        (
            r#"kong_upstream_latency_ms_count{service="guarded",route="guarded-route",workspace="default"}"#,
            2.0,
        ),
        (
            r#"kong_upstream_target_health{upstream="pool",target=""#,
            f64::NAN,
        ),
        ("kong_nginx_requests_total{", f64::NAN),
        ("kong_node_info{", f64::NAN),
        ("turnpike_config_reloads_total", 1.0),
        (
            &format!(r#"turnpike_upstream_requests_total{{peer="{}"}}"#, up.addr),
            f64::NAN,
        ),
    ];
    for (series, want) in expect {
        if want.is_nan() {
            assert!(metrics.contains(series), "no {series} in\n{metrics}");
        } else {
            assert_eq!(
                value(&metrics, series),
                Some(want),
                "{series} in\n{metrics}"
            );
        }
    }
    // Buckets are cumulative: everything on loopback is under Kong's first upstream bucket
    // (25 ms) or at least under the last.
    assert_eq!(
        value(
            &metrics,
            r#"kong_request_latency_ms_bucket{service="open",route="open-route",workspace="default",le="60000.0"}"#
        ),
        Some(5.0)
    );
    let egress = value(
        &metrics,
        r#"kong_bandwidth_bytes{service="open",route="open-route",direction="egress",workspace="default",consumer=""}"#,
    )
    .unwrap();
    assert!(egress > 5.0 * 100.0, "egress {egress}");
    assert!(value(&metrics, r#"kong_bandwidth_bytes{service="guarded",route="guarded-route",direction="ingress",workspace="default",consumer="alice"}"#).unwrap() > 0.0);
    // The same on the Admin API.
    let admin = call(gw.admin, "GET", "/metrics", &[]).await;
    assert_eq!(admin.status, 200);
    assert!(admin
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/plain; version=0.0.4")));

    // The Status API is read-only and small.
    assert_eq!(call(status, "GET", "/status/ready", &[]).await.status, 200);
    assert_eq!(call(status, "GET", "/status", &[]).await.status, 200);
    assert_eq!(call(status, "GET", "/services", &[]).await.status, 404);
    assert_eq!(call(status, "POST", "/metrics", &[]).await.status, 405);

    // Two requests over TLS (HTTP/1.1 and HTTP/2): logged with Kong's `request.tls`.
    for h2 in [false, true] {
        let (reply, _, _) = get_tls(gw.proxy_tls, "localhost", "/open", h2).await;
        assert_eq!(reply.status, 200);
    }

    // file-log: one JSON line per routed request, Kong's fields, credentials redacted.
    let mut lines: Vec<serde_json::Value> = Vec::new();
    assert!(
        eventually(Duration::from_secs(5), async || {
            lines = std::fs::read_to_string(&log_path)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
            lines.len() == 10
        })
        .await,
        "{} lines: {lines:?}",
        lines.len()
    );
    let alice = lines
        .iter()
        .find(|l| l["consumer"]["username"] == "alice")
        .expect("a line for alice");
    assert_eq!(alice["request"]["method"], "GET");
    assert_eq!(alice["request"]["uri"], "/guarded");
    assert_eq!(alice["response"]["status"], 200);
    assert_eq!(alice["route"]["name"], "guarded-route");
    assert_eq!(alice["service"]["name"], "guarded");
    assert_eq!(alice["upstream_uri"], "/");
    // Plain HTTP: no `request.tls` (Kong's nil); over TLS, the version, OpenSSL's cipher name
    // and `$ssl_client_verify`.
    assert!(alice["request"].get("tls").is_none(), "{alice}");
    let over_tls: Vec<_> = lines
        .iter()
        .filter(|l| {
            l["request"]["url"]
                .as_str()
                .unwrap()
                .starts_with("https://")
        })
        .collect();
    assert_eq!(over_tls.len(), 2, "{lines:?}");
    for l in over_tls {
        let tls = &l["request"]["tls"];
        assert_eq!(tls["version"], "TLSv1.3", "{l}");
        assert!(
            [
                "TLS_AES_256_GCM_SHA384",
                "TLS_AES_128_GCM_SHA256",
                "TLS_CHACHA20_POLY1305_SHA256"
            ]
            .contains(&tls["cipher"].as_str().unwrap()),
            "{l}"
        );
        assert_eq!(tls["client_verify"], "NONE", "{l}");
    }
    // The request headers as the plugins left them (Kong logs what set_header did): the
    // consumer's identity as the upstream got it.
    assert_eq!(alice["request"]["headers"]["x-consumer-username"], "alice");
    assert!(alice["latencies"]["request"].is_u64());
    assert!(alice["response"]["size"].as_u64().unwrap() > 0);
    // Kong's `tries`: the balancer's one try, its peer and when its choice began.
    let up_port: u64 = up
        .url()
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let t = &alice["tries"][0];
    assert_eq!(alice["tries"].as_array().map(Vec::len), Some(1), "{alice}");
    assert_eq!(t["ip"], "127.0.0.1");
    assert_eq!(t["port"], up_port);
    assert!(
        t["balancer_start"].as_u64().unwrap() > 1_700_000_000_000,
        "{t}"
    );
    assert_eq!(
        t["balancer_start_ns"].as_u64().unwrap() / 1_000_000,
        t["balancer_start"].as_u64().unwrap()
    );
    assert!(t["balancer_latency"].is_u64() && t["balancer_latency_ns"].is_u64());
    assert!(t.get("state").is_none(), "{t}");
    let refused = lines
        .iter()
        .find(|l| l["response"]["status"] == 401)
        .expect("a line for the 401");
    assert_eq!(refused["request"]["headers"]["authorization"], "REDACTED");
    assert_eq!(refused["source"], "exit");
    assert_eq!(refused["latencies"]["proxy"], -1);
    assert!(
        refused.get("tries").is_none(),
        "no try before an exit: {refused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_level_changes_at_run_time_and_reverts() {
    let (_dead_socket, dead) = dead_port();
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: dead
  url: http://127.0.0.1:{dead}
  retries: 0
  routes: [{{paths: [/dead]}}]
"#
    ))
    .start();
    let level = async || {
        gw.admin("GET", "/debug/node/log-level", None).await.json()["message"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    // The harness runs gateways at `info`.
    let configured = level().await;
    assert_eq!(configured, "log level: info");
    // At info, a refused upstream connection is not logged (it is a debug message).
    assert_eq!(call(gw.proxy, "GET", "/dead", &[]).await.status, 502);
    let needle = format!("connect to 127.0.0.1:{dead} failed");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!gw.log_text().contains(&needle));

    let r = gw
        .admin("PUT", "/debug/node/log-level/debug?timeout=2", None)
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["message"], "log level changed to debug");
    assert_eq!(level().await, "log level: debug");
    assert_eq!(call(gw.proxy, "GET", "/dead", &[]).await.status, 502);
    assert!(
        eventually(Duration::from_secs(3), async || gw
            .log_text()
            .contains(&needle))
        .await,
        "{}",
        gw.log_text()
    );
    // After the timeout the configured level is back.
    assert!(eventually(Duration::from_secs(5), async || level().await == configured).await);

    let r = gw.admin("PUT", "/debug/node/log-level/loud", None).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["message"], "unknown log level: loud");
    let r = gw.admin("POST", "/debug/node/log-level/debug", None).await;
    assert_eq!(r.status, 405);
}

/// A log receiver: an HTTP server on `port` that keeps every JSON entry it is sent (a body is
/// one entry or an array of them). Stops when dropped.
struct Receiver {
    rt: Option<tokio::runtime::Runtime>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

fn receiver(port: u16, got: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>) -> Receiver {
    use http_body_util::BodyExt;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    listener.set_nonblocking(true).unwrap();
    rt.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let got = got.clone();
            tokio::spawn(async move {
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let got = got.clone();
                        async move {
                            let body = req.into_body().collect().await?.to_bytes();
                            let v: serde_json::Value =
                                serde_json::from_slice(&body).unwrap_or_default();
                            let mut got = got.lock().unwrap();
                            match v {
                                serde_json::Value::Array(a) => got.extend(a),
                                v => got.push(v),
                            }
                            Ok::<_, hyper::Error>(http::Response::new(http_body_util::Full::new(
                                bytes::Bytes::from_static(b"ok"),
                            )))
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Receiver { rt: Some(rt) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_log_never_blocks_and_counts_what_it_drops() {
    let up = Upstream::start("logged");
    let port = free_port();
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut rx = Some(receiver(port, got.clone()));
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: s
  url: {url}
  routes: [{{name: r, paths: [/]}}]
plugins:
- name: http-log
  config:
    http_endpoint: http://127.0.0.1:{port}/logs
    headers: {{x-log-source: turnpike}}
    queue:
      max_batch_size: 5
      max_coalescing_delay: 0.05
      max_entries: 10
      initial_retry_delay: 0.05
      max_retry_delay: 0.2
      max_retry_time: 120
"#,
        url = up.url()
    ))
    .start();
    let received = || got.lock().unwrap().len();
    for _ in 0..5 {
        assert_eq!(call(gw.proxy, "GET", "/a", &[]).await.status, 200);
    }
    assert!(eventually(Duration::from_secs(10), async || received() == 5).await);
    assert_eq!(got.lock().unwrap()[0]["request"]["uri"], "/a");

    // The receiver goes away: requests go on unhindered (a request that waited on the log
    // would hang here), the queue fills, and what does not fit is dropped and counted.
    drop(rx.take());
    for _ in 0..40 {
        let r = tokio::time::timeout(Duration::from_secs(5), call(gw.proxy, "GET", "/b", &[]))
            .await
            .expect("a request waited on http-log");
        assert_eq!(r.status, 200);
    }
    let metric = async |name: &str| -> u64 {
        let m = call(gw.admin, "GET", "/metrics", &[]).await;
        let text = String::from_utf8_lossy(&m.body).into_owned();
        let series = format!("{name}{{plugin=\"http-log\"}}");
        value(&text, &series).unwrap_or(-1.0) as u64
    };
    let dropped = metric("turnpike_log_entries_dropped_total").await;
    assert!(dropped >= 25, "dropped {dropped}");

    // Back: the queued entries are delivered by the retries; nothing is lost silently.
    rx = Some(receiver(port, got.clone()));
    let mut seen = (0, 0);
    assert!(
        eventually(Duration::from_secs(20), async || {
            seen = (
                received(),
                metric("turnpike_log_entries_dropped_total").await as usize,
            );
            seen.0 + seen.1 == 45
        })
        .await,
        "received {} + dropped {} != 45",
        seen.0,
        seen.1
    );
    assert!(
        seen.0 > 5,
        "nothing queued was delivered after the receiver came back"
    );
    assert_eq!(
        metric("turnpike_log_entries_sent_total").await as usize,
        seen.0
    );
    drop(rx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_counts_connections_being_served_and_the_pool() {
    let slow = Upstream::start_with_delay("slow", Duration::from_millis(800));
    let gw = Gateway::with_config(&format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/]}}]}}]\n",
        slow.url()
    ))
    .start();
    let proxy = gw.proxy;
    let in_flight = tokio::spawn(async move { call(proxy, "GET", "/", &[]).await.status });
    let mut server = serde_json::Value::Null;
    assert!(
        eventually(Duration::from_secs(5), async || {
            server = gw.status().await["server"].clone();
            server["connections_writing"] == 1
        })
        .await,
        "{server}"
    );
    assert!(server["connections_active"].as_i64().unwrap() >= 1);
    assert_eq!(in_flight.await.unwrap(), 200);
    let mut st = serde_json::Value::Null;
    assert!(
        eventually(Duration::from_secs(5), async || {
            st = gw.status().await;
            st["server"]["connections_writing"] == 0
                && st["upstream"]["pool"]["idle_connections"] == 1
        })
        .await,
        "{st}"
    );
    assert_eq!(st["upstream"]["pool"]["size_per_peer_per_worker"], 512);
    assert!(st["configuration_hash"]
        .as_str()
        .is_some_and(|h| h.len() == 32));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_log_is_off_by_default_and_writes_combined_or_json() {
    let up = Upstream::start("access");
    let yaml = format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/in]}}]}}]\n",
        up.url()
    );
    let dir = tempfile::tempdir().unwrap();
    for format in ["combined", "json"] {
        let path = dir.path().join(format!("access-{format}.log"));
        let gw = Gateway::with_config(&yaml)
            .env(
                "TURNPIKE_PROXY_ACCESS_LOG",
                &format!("{} {format}", path.display()),
            )
            .start();
        assert_eq!(
            call(gw.proxy, "GET", "/in/x?q=1", &[("user-agent", "probe/1.0")])
                .await
                .status,
            200
        );
        assert_eq!(call(gw.proxy, "GET", "/missing", &[]).await.status, 404);
        // Buffered per worker, written at least once a second.
        let mut text = String::new();
        assert!(
            eventually(Duration::from_secs(5), async || {
                text = std::fs::read_to_string(&path).unwrap_or_default();
                text.lines().count() == 2
            })
            .await,
            "{text}"
        );
        let first = text.lines().find(|l| l.contains("/in/x")).unwrap();
        if format == "json" {
            let v: serde_json::Value = serde_json::from_str(first).unwrap();
            assert_eq!(v["request"], "GET /in/x?q=1 HTTP/1.1");
            assert_eq!(v["status"], 200);
            assert_eq!(v["user_agent"], "probe/1.0");
            assert!(v["body_bytes_sent"].as_u64().unwrap() > 0);
        } else {
            assert!(first.starts_with("127.0.0.1 - - ["), "{first}");
            assert!(first.contains("\"GET /in/x?q=1 HTTP/1.1\" 200 "), "{first}");
            assert!(first.ends_with(" \"-\" \"probe/1.0\""), "{first}");
            assert!(text.contains("\"GET /missing HTTP/1.1\" 404 "), "{text}");
        }
    }
    // Off by default: nothing under the prefix's logs.
    let gw = Gateway::with_config(&yaml).start();
    assert_eq!(call(gw.proxy, "GET", "/in", &[]).await.status, 200);
    assert!(!gw.log_text().contains("access log:"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_listen_serves_a_cpu_flame_graph_of_the_gateway() {
    let up = Upstream::start("profiled");
    let debug_port = free_port();
    let gw = Gateway::with_config(&format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/]}}]}}]\n",
        up.url()
    ))
    .env("TURNPIKE_DEBUG_LISTEN", &format!("127.0.0.1:{debug_port}"))
    .start();
    let debug = std::net::SocketAddr::from(([127, 0, 0, 1], debug_port));
    // Not on the Admin API.
    assert_eq!(
        call(gw.admin, "GET", "/debug/profile", &[]).await.status,
        404
    );
    assert_eq!(
        call(debug, "GET", "/debug/profile?seconds=0", &[])
            .await
            .status,
        400
    );
    // Traffic while the profile is taken, so that the request path shows.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let proxy = gw.proxy;
    let load = {
        let stop = stop.clone();
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                call(proxy, "GET", "/", &[]).await;
            }
        })
    };
    let r = call(debug, "GET", "/debug/profile?seconds=2", &[]).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    load.await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("image/svg+xml"));
    let svg = String::from_utf8_lossy(&r.body);
    assert!(svg.contains("<svg"), "{}", &svg[..svg.len().min(300)]);
    assert!(
        svg.contains("turnpike_proxy"),
        "no frame of ours in the graph"
    );
}
