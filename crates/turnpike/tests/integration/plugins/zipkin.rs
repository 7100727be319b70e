//! zipkin on the real binary, with a real collector that reads Zipkin's v2 JSON: the request
//! and proxy spans of each sampled request, their tags and annotations, the b3 context the
//! upstream gets (the proxy span's), a caller's context kept, 64-bit trace ids, duration tags,
//! propagation alone for unsampled requests, and bad configs refused.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use http_body_util::BodyExt;
use serde_json::{json, Value};

/// A Zipkin collector: keeps each POSTed batch's spans.
struct Collector {
    port: u16,
    spans: Arc<Mutex<Vec<Value>>>,
    rt: Option<tokio::runtime::Runtime>,
}

impl Drop for Collector {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Collector {
    fn start() -> Collector {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let spans: Arc<Mutex<Vec<Value>>> = Arc::default();
        let seen = spans.clone();
        rt.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let seen = seen.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(
                        move |req: http::Request<hyper::body::Incoming>| {
                            let seen = seen.clone();
                            async move {
                                assert_eq!(req.uri().path(), "/api/v2/spans");
                                assert_eq!(req.headers()["content-type"], "application/json");
                                let body = req.into_body().collect().await?.to_bytes();
                                let batch: Vec<Value> = serde_json::from_slice(&body).unwrap();
                                seen.lock().unwrap().extend(batch);
                                Ok::<_, hyper::Error>(http::Response::new(
                                    http_body_util::Full::new(bytes::Bytes::new()),
                                ))
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Collector {
            port,
            spans,
            rt: Some(rt),
        }
    }

    /// The request and proxy spans of a trace, once both arrived (a batch may hold a try's
    /// span without them).
    async fn trace(&self, trace_id: &str) -> (Value, Value) {
        let find = |spans: &[Value], kind: &str| {
            spans
                .iter()
                .find(|s| {
                    s["kind"] == kind
                        && (kind == "SERVER" || s["name"].as_str().unwrap().ends_with("(proxy)"))
                })
                .cloned()
        };
        assert!(
            eventually(Duration::from_secs(10), async || {
                let spans = self.all(trace_id, 1).await;
                find(&spans, "SERVER").is_some() && find(&spans, "CLIENT").is_some()
            })
            .await,
            "request and proxy spans of {trace_id}: {:?}",
            self.spans.lock().unwrap()
        );
        let spans = self.all(trace_id, 2).await;
        (
            find(&spans, "SERVER").unwrap(),
            find(&spans, "CLIENT").unwrap(),
        )
    }

    /// The balancer-try spans of a trace, by try.
    async fn tries(&self, trace_id: &str, n: usize) -> Vec<Value> {
        let mut tries: Vec<Value> = self
            .all(trace_id, n + 2)
            .await
            .into_iter()
            .filter(|s| s["name"].as_str().unwrap().contains("(balancer try"))
            .collect();
        tries.sort_by_key(|s| s["tags"]["kong.balancer.try"].as_str().unwrap().to_string());
        tries
    }

    /// The spans of a trace, once `n` arrived.
    async fn all(&self, trace_id: &str, n: usize) -> Vec<Value> {
        let of = || -> Vec<Value> {
            self.spans
                .lock()
                .unwrap()
                .iter()
                .filter(|s| s["traceId"] == trace_id)
                .cloned()
                .collect()
        };
        assert!(
            eventually(Duration::from_secs(10), async || of().len() >= n).await,
            "spans of {trace_id}: {:?}",
            self.spans.lock().unwrap()
        );
        of()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_a_zipkin_collector_and_b3_reaches_the_upstream() {
    let collector = Collector::start();
    let up = Upstream::start("zipped");
    let (_dead, dead_port) = dead_port();
    let endpoint = format!("http://127.0.0.1:{}/api/v2/spans", collector.port);
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
consumers:
- username: alice
  keyauth_credentials: [{{key: alice-key}}]
services:
- name: billing
  url: {url}
  routes:
  - name: traced
    paths: [/z]
    plugins:
    - name: key-auth
    - name: zipkin
      config:
        http_endpoint: {endpoint}
        sample_ratio: 1
        static_tags: [{{name: team, value: payments}}]
        http_span_name: method_path
        http_response_header_for_traceid: x-trace-id
        queue: {{max_coalescing_delay: 0.1}}
  - name: short-ids
    paths: [/short]
    plugins:
    - name: zipkin
      config:
        http_endpoint: {endpoint}
        sample_ratio: 1
        traceid_byte_count: 8
        phase_duration_flavor: tags
        local_service_name: edge
        queue: {{max_coalescing_delay: 0.1}}
  - name: unsampled
    paths: [/never]
    plugins:
    - name: zipkin
      config: {{http_endpoint: "{endpoint}", sample_ratio: 0}}
- name: dead
  url: http://127.0.0.1:{dead_port}
  retries: 1
  routes:
  - name: retried
    paths: [/dead]
    plugins:
    - name: zipkin
      config: {{http_endpoint: "{endpoint}", sample_ratio: 1, http_response_header_for_traceid: x-trace-id}}
"#,
        url = up.url(),
    ))
    .start();

    // A new trace: the upstream gets b3 (the default) with the proxy span's id and the
    // request span as its parent.
    let r = call(
        gw.proxy,
        "GET",
        "/z/pay?x=1",
        &[
            ("apikey", "alice-key"),
            ("zipkin-tags", "order=42; region=eu"),
        ],
    )
    .await;
    assert_eq!(r.status, 200);
    let trace = r.header("x-trace-id").unwrap().to_string();
    assert_eq!(trace.len(), 32);
    let h = r.json()["headers"].clone();
    assert_eq!(h["x-b3-traceid"], trace);
    assert_eq!(h["x-b3-sampled"], "1");
    let (request, proxy) = collector.trace(&trace).await;
    assert_eq!(h["x-b3-spanid"], proxy["id"]);
    assert_eq!(h["x-b3-parentspanid"], request["id"]);
    assert_eq!(proxy["parentId"], request["id"]);
    assert!(request.get("parentId").is_none());
    assert_eq!(request["name"], "GET /z/pay");
    assert_eq!(proxy["name"], "GET /z/pay (proxy)");
    assert_eq!(request["localEndpoint"]["serviceName"], "kong");
    assert_eq!(request["remoteEndpoint"]["ipv4"], "127.0.0.1");
    assert_eq!(proxy["remoteEndpoint"]["serviceName"], "billing");
    let tags = &request["tags"];
    for (k, v) in [
        ("lc", "kong"),
        ("http.method", "GET"),
        ("http.path", "/z/pay"),
        ("http.protocol", "HTTP/1.1"),
        ("http.status_code", "200"),
        ("team", "payments"),
        ("order", "42"),
        ("region", "eu"),
    ] {
        assert_eq!(tags[k], v, "{k}: {tags}");
    }
    assert!(tags["kong.consumer"].is_string(), "{tags}");
    assert!(tags["kong.credential"].is_string(), "{tags}");
    assert!(tags["kong.node.id"].is_string(), "{tags}");
    assert_eq!(proxy["tags"]["kong.service_name"], "billing");
    assert_eq!(proxy["tags"]["kong.route_name"], "traced");
    let annotations: Vec<&str> = proxy["annotations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["value"].as_str().unwrap())
        .collect();
    assert_eq!(annotations, ["kas", "kaf", "khs", "khf", "kbs", "kbf"]);
    let at: Vec<u64> = proxy["annotations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["timestamp"].as_u64().unwrap())
        .collect();
    assert!(at.windows(2).all(|w| w[0] <= w[1]), "in order: {at:?}");
    assert!(request["timestamp"].as_u64().unwrap() <= proxy["timestamp"].as_u64().unwrap());
    assert!(request["duration"].as_u64().unwrap() >= proxy["duration"].as_u64().unwrap());
    // The balancer's try: a CLIENT span under the request span, with the peer; the proxy span's
    // remote endpoint is that peer.
    let up_port = up
        .url()
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .parse::<u64>()
        .unwrap();
    let tries = collector.tries(&trace, 1).await;
    assert_eq!(tries.len(), 1, "{tries:?}");
    let b = &tries[0];
    assert_eq!(b["name"], "GET /z/pay (balancer try 1)");
    assert_eq!(b["kind"], "CLIENT");
    assert_eq!(b["parentId"], request["id"]);
    assert_eq!(b["remoteEndpoint"]["ipv4"], "127.0.0.1");
    assert_eq!(b["remoteEndpoint"]["port"], up_port);
    assert_eq!(b["remoteEndpoint"]["serviceName"], "billing");
    assert!(b["tags"].get("error").is_none(), "{b}");
    assert_eq!(b["tags"]["kong.route_name"], "traced");
    assert_eq!(proxy["remoteEndpoint"]["port"], up_port);

    // Retries against a refusing peer: the earlier try is an error with Kong's state and status.
    let r = call(gw.proxy, "GET", "/dead", &[]).await;
    assert_eq!(r.status, 502);
    let dead_trace = r.header("x-trace-id").unwrap().to_string();
    let tries = collector.tries(&dead_trace, 2).await;
    assert_eq!(tries.len(), 2, "{tries:?}");
    assert_eq!(tries[0]["tags"]["error"], "true");
    assert_eq!(tries[0]["tags"]["kong.balancer.state"], "failed");
    assert_eq!(tries[0]["tags"]["http.status_code"], "502");
    assert_eq!(tries[0]["remoteEndpoint"]["port"], dead_port as u64);
    assert!(
        tries[1]["tags"].get("error").is_none(),
        "the last try: {}",
        tries[1]
    );

    // A caller's W3C context is kept and written back as it came (preserve).
    let caller = "4bf92f3577b34da6a3ce929d0e0e4736";
    let r = call(
        gw.proxy,
        "GET",
        "/z/w3c",
        &[
            ("apikey", "alice-key"),
            ("traceparent", &format!("00-{caller}-00f067aa0ba902b7-01")),
        ],
    )
    .await;
    let tp = r.json()["headers"]["traceparent"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(tp.starts_with(&format!("00-{caller}-")), "{tp}");
    let (request, _) = collector.trace(caller).await;
    assert_eq!(request["parentId"], "00f067aa0ba902b7");

    // 64-bit trace ids, the phases as duration tags, another local service name.
    let r = call(gw.proxy, "GET", "/short/x", &[]).await;
    let id = r.json()["headers"]["x-b3-traceid"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(id.len(), 16);
    let (request, proxy) = collector.trace(&id).await;
    assert_eq!(request["localEndpoint"]["serviceName"], "edge");
    assert!(proxy["annotations"].as_array().unwrap().is_empty());
    assert!(
        proxy["tags"]["kong.access.duration_ms"].is_string(),
        "{proxy}"
    );

    // sample_ratio 0: the context goes on, marked not sampled; no span is sent.
    let before = collector.spans.lock().unwrap().len();
    let r = call(gw.proxy, "GET", "/never/x", &[]).await;
    assert_eq!(r.json()["headers"]["x-b3-sampled"], "0");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(collector.spans.lock().unwrap().len(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zipkin_configs_are_checked() {
    let gw = Gateway::sqlite().start();
    let post = |config| post_plugin(gw.admin, "zipkin", config);
    let r = post(json!({"traceid_byte_count": 12})).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["fields"]["config"]["traceid_byte_count"],
        "expected one of: 8, 16"
    );
    let r = post(json!({"static_tags": [{"name": "lc", "value": "x"}]})).await;
    assert_eq!(r.status, 400, "{:?}", r.json());
    let r =
        post(json!({"static_tags": [{"name": "a", "value": "1"}, {"name": "a", "value": "2"}]}))
            .await;
    assert_eq!(r.status, 400);
    let r = post(json!({"http_endpoint": "ftp://x"})).await;
    assert_eq!(r.status, 400);
    let r = post(json!({})).await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    let c = &r.json()["config"];
    assert_eq!(c["sample_ratio"], 0.001);
    assert_eq!(c["default_header_type"], "b3");
    assert_eq!(c["propagation"]["default_format"], "b3");
    assert_eq!(c["connect_timeout"], 2000);
    assert_eq!(c["queue"]["max_batch_size"], 1);
}
