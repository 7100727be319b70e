//! opentelemetry on the real binary, with a real OTLP/HTTP receiver that decodes what it gets
//! with the official protobuf definitions (`opentelemetry-proto`): the request's span under the
//! caller's trace, its attributes and the resource's, the context the upstream gets in each
//! format, the trace id told to the client, propagation alone when tracing is off, the
//! request's log records sent to `logs_endpoint`, and bad configs refused.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use http_body_util::BodyExt;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::json;

/// An OTLP/HTTP collector: decodes each POST to `/v1/logs` as an `ExportLogsServiceRequest`,
/// any other as an `ExportTraceServiceRequest`.
struct Collector {
    port: u16,
    requests: Arc<Mutex<Vec<(String, ExportTraceServiceRequest)>>>,
    logs: Arc<Mutex<Vec<(String, ExportLogsServiceRequest)>>>,
    rt: Option<tokio::runtime::Runtime>,
}

impl Drop for Collector {
    fn drop(&mut self) {
        // Dropped inside the test's runtime: don't block there.
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
        let requests: Arc<Mutex<Vec<(String, ExportTraceServiceRequest)>>> = Arc::default();
        let logs: Arc<Mutex<Vec<(String, ExportLogsServiceRequest)>>> = Arc::default();
        let seen = requests.clone();
        let seen_logs = logs.clone();
        rt.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let seen = seen.clone();
                let seen_logs = seen_logs.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(
                        move |req: http::Request<hyper::body::Incoming>| {
                            let seen = seen.clone();
                            let seen_logs = seen_logs.clone();
                            async move {
                                let logs = req.uri().path() == "/v1/logs";
                                let ct = req
                                    .headers()
                                    .get("content-type")
                                    .map(|v| v.to_str().unwrap().to_string())
                                    .unwrap_or_default();
                                let auth = req
                                    .headers()
                                    .get("x-api-key")
                                    .map(|v| v.to_str().unwrap().to_string())
                                    .unwrap_or_default();
                                let body = req.into_body().collect().await?.to_bytes();
                                if logs {
                                    let decoded = ExportLogsServiceRequest::decode(body).unwrap();
                                    seen_logs.lock().unwrap().push((ct, decoded));
                                } else {
                                    let decoded = ExportTraceServiceRequest::decode(body).unwrap();
                                    seen.lock().unwrap().push((format!("{ct}|{auth}"), decoded));
                                }
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
            requests,
            logs,
            rt: Some(rt),
        }
    }

    fn spans(&self) -> Vec<Span> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .flat_map(|(_, r)| r.resource_spans.iter())
            .flat_map(|rs| rs.scope_spans.iter())
            .flat_map(|ss| ss.spans.iter().cloned())
            .collect()
    }

    async fn span_of(&self, trace_id: &str) -> Span {
        assert!(
            eventually(Duration::from_secs(10), async || self
                .spans()
                .iter()
                .any(|s| hex::encode(&s.trace_id) == trace_id))
            .await,
            "no span of trace {trace_id}: {:?}",
            self.spans()
        );
        self.spans()
            .into_iter()
            .find(|s| hex::encode(&s.trace_id) == trace_id)
            .unwrap()
    }

    /// The spans of a trace named `name`, once `n` of them arrived.
    async fn named(&self, trace_id: &str, name: &str, n: usize) -> Vec<Span> {
        let of = || {
            self.spans()
                .into_iter()
                .filter(|s| hex::encode(&s.trace_id) == trace_id && s.name == name)
                .collect::<Vec<_>>()
        };
        assert!(
            eventually(Duration::from_secs(10), async || of().len() >= n).await,
            "{n} span(s) {name} of trace {trace_id}: {:?}",
            self.spans()
        );
        of()
    }
}

fn attr(s: &Span, key: &str) -> Option<Any> {
    value_of(&s.attributes, key)
}

fn value_of(attributes: &[KeyValue], key: &str) -> Option<Any> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.clone()?.value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_otlp_collector_and_context_reaches_the_upstream() {
    let collector = Collector::start();
    let (_dead, dead_port) = dead_port();
    let up = Upstream::start("traced");
    let config = format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  routes:
  - name: traced
    paths: [/t]
    plugins:
    - name: opentelemetry
      config:
        traces_endpoint: http://127.0.0.1:{port}/v1/traces
        headers: {{x-api-key: secret}}
        resource_attributes: {{service.name: edge, deployment.environment: test}}
        queue: {{max_coalescing_delay: 0.1}}
        http_response_header_for_traceid: x-trace-id
  - name: converted
    paths: [/conv]
    plugins:
    - name: opentelemetry
      config:
        traces_endpoint: http://127.0.0.1:{port}/v1/traces
        queue: {{max_coalescing_delay: 0.1}}
        propagation: {{extract: [w3c], inject: [b3, datadog], clear: [traceparent]}}
"#,
        url = up.url(),
        port = collector.port
    ) + &format!(
        r#"- name: dead
  url: http://127.0.0.1:{dead_port}
  retries: 2
  routes:
  - name: retried
    paths: [/dead]
    plugins:
    - name: opentelemetry
      config:
        traces_endpoint: http://127.0.0.1:{port}/v1/traces
        queue: {{max_coalescing_delay: 0.1}}
        http_response_header_for_traceid: x-trace-id
"#,
        port = collector.port
    );
    let gw = Gateway::with_config(&config)
        .env("TURNPIKE_TRACING_INSTRUMENTATIONS", "all")
        .env("TURNPIKE_TRACING_SAMPLING_RATE", "1")
        .start();

    // A caller's W3C context: the upstream gets the same trace, Kong's span as parent, sampled.
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let r = call(
        gw.proxy,
        "GET",
        "/t/x?q=1",
        &[("traceparent", &format!("00-{trace}-{caller_span}-01"))],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-trace-id"), Some(trace));
    let sent = r.json()["headers"]["traceparent"]
        .as_str()
        .unwrap()
        .to_string();
    let parts: Vec<&str> = sent.split('-').collect();
    assert_eq!(
        (parts[0], parts[1], parts[3]),
        ("00", trace, "01"),
        "{sent}"
    );
    assert_ne!(
        parts[2], caller_span,
        "the upstream's parent is Kong's span"
    );

    // The span, decoded by the official definitions.
    let span = collector.span_of(trace).await;
    assert_eq!(span.name, "kong");
    assert_eq!(span.kind, 2, "SERVER");
    assert_eq!(hex::encode(&span.parent_span_id), caller_span);
    // `all` instrumentations: the router, each plugin's phases, the balancer try; children of
    // the request's span. The upstream's parent is the balancer span (made ahead, as Kong's
    // precreate_balancer_span), which ends with the response.
    let balancer = &collector.named(trace, "kong.balancer", 1).await[0];
    assert_eq!(balancer.kind, 3, "CLIENT");
    assert_eq!(hex::encode(&balancer.span_id), parts[2]);
    assert_eq!(balancer.parent_span_id, span.span_id);
    assert_eq!(attr(balancer, "try_count"), Some(Any::IntValue(1)));
    assert_eq!(
        attr(balancer, "net.peer.ip"),
        Some(Any::StringValue("127.0.0.1".into()))
    );
    assert!(balancer.status.as_ref().is_none_or(|s| s.code == 0));
    assert!(balancer.start_time_unix_nano >= span.start_time_unix_nano);
    assert!(balancer.end_time_unix_nano <= span.end_time_unix_nano);
    for name in [
        "kong.router",
        "kong.access.plugin.opentelemetry",
        "kong.header_filter.plugin.opentelemetry",
    ] {
        let s = &collector.named(trace, name, 1).await[0];
        assert_eq!(s.parent_span_id, span.span_id, "{name}");
        assert_eq!(s.kind, 1, "{name}: INTERNAL");
        assert!(
            s.start_time_unix_nano >= span.start_time_unix_nano,
            "{name}"
        );
        assert!(s.end_time_unix_nano >= s.start_time_unix_nano, "{name}");
    }
    let router = &collector.named(trace, "kong.router", 1).await[0];
    let access = &collector
        .named(trace, "kong.access.plugin.opentelemetry", 1)
        .await[0];
    assert!(
        router.end_time_unix_nano <= access.start_time_unix_nano,
        "router, then access"
    );
    assert!(
        access.end_time_unix_nano <= balancer.start_time_unix_nano,
        "access, then balancer"
    );

    // A service that refuses connections, retries 2: three tries, each a failed balancer
    // span with Kong's 502 and an error status.
    let r = call(gw.proxy, "GET", "/dead", &[]).await;
    assert_eq!(r.status, 502);
    let dead_trace = r.header("x-trace-id").unwrap().to_string();
    let mut tries = collector.named(&dead_trace, "kong.balancer", 3).await;
    tries.sort_by_key(|s| s.start_time_unix_nano);
    for (i, t) in tries.iter().enumerate() {
        assert_eq!(attr(t, "try_count"), Some(Any::IntValue(i as i64 + 1)));
        assert_eq!(attr(t, "http.status_code"), Some(Any::IntValue(502)));
        assert_eq!(
            attr(t, "net.peer.port"),
            Some(Any::IntValue(dead_port as i64))
        );
        assert_eq!(t.status.clone().unwrap().code, 2, "error");
    }
    assert!(span.end_time_unix_nano >= span.start_time_unix_nano);
    assert!(span.start_time_unix_nano > 1_700_000_000_000_000_000);
    assert_eq!(
        attr(&span, "http.method"),
        Some(Any::StringValue("GET".into()))
    );
    assert_eq!(attr(&span, "http.status_code"), Some(Any::IntValue(200)));
    assert_eq!(
        attr(&span, "http.scheme"),
        Some(Any::StringValue("http".into()))
    );
    match attr(&span, "http.url") {
        Some(Any::StringValue(u)) => assert!(u.ends_with("/t/x?q=1"), "{u}"),
        other => panic!("{other:?}"),
    }
    {
        let reqs = collector.requests.lock().unwrap();
        let (meta, req) = &reqs[0];
        assert_eq!(meta, "application/x-protobuf|secret");
        let resource = req.resource_spans[0].resource.clone().unwrap();
        let res = |k: &str| value_of(&resource.attributes, k);
        assert_eq!(res("service.name"), Some(Any::StringValue("edge".into())));
        assert_eq!(
            res("service.version"),
            Some(Any::StringValue("3.9.1".into()))
        );
        assert_eq!(
            res("deployment.environment"),
            Some(Any::StringValue("test".into()))
        );
        assert!(res("service.instance.id").is_some());
        assert_eq!(
            req.resource_spans[0].scope_spans[0]
                .scope
                .clone()
                .unwrap()
                .name,
            "kong-internal"
        );
    }

    // No context: a new trace, written in the default format (w3c); a 5xx is an error span.
    let r = call(gw.proxy, "GET", "/t/status/503", &[]).await;
    assert_eq!(r.status, 503);
    let new_trace = r.header("x-trace-id").unwrap().to_string();
    assert_eq!(new_trace.len(), 32);
    let span = collector.span_of(&new_trace).await;
    assert!(span.parent_span_id.is_empty());
    assert_eq!(span.status.clone().unwrap().code, 2, "error");
    assert_eq!(attr(&span, "http.status_code"), Some(Any::IntValue(503)));

    // preserve: the format that came in goes on (b3 single header here, 64-bit trace id).
    let r = call(
        gw.proxy,
        "GET",
        "/t/b3",
        &[("b3", "463ac35c9f6413ad-a2fb4a1d1a96d312-1")],
    )
    .await;
    let b3 = r.json()["headers"]["b3"].as_str().unwrap().to_string();
    assert!(b3.starts_with("463ac35c9f6413ad-"), "{b3}");
    assert!(r.json()["headers"].get("traceparent").is_none());
    let span = collector.span_of("0000000000000000463ac35c9f6413ad").await;
    assert_eq!(span.name, "kong");
    assert_eq!(hex::encode(&span.parent_span_id), "a2fb4a1d1a96d312");
    // The injected span is the balancer's; its parent, Kong's request span.
    let parent = hex::encode(&span.span_id);
    assert!(b3.ends_with(&format!("-1-{parent}")), "{b3}");

    // propagation: extracted from w3c, injected as b3 and datadog, traceparent cleared.
    let r = call(
        gw.proxy,
        "GET",
        "/conv/x",
        &[("traceparent", &format!("00-{trace}-{caller_span}-01"))],
    )
    .await;
    let h = &r.json()["headers"];
    assert_eq!(h["x-b3-traceid"], trace);
    assert_eq!(h["x-b3-sampled"], "1");
    // The upstream's span is the balancer's, whose parent is Kong's request span (of this
    // second request of the trace).
    let kong_spans = collector.named(trace, "kong", 2).await;
    let balancers = collector.named(trace, "kong.balancer", 2).await;
    let b = balancers
        .iter()
        .find(|b| Some(hex::encode(&b.span_id).as_str()) == h["x-b3-spanid"].as_str())
        .expect("the injected span is a balancer span");
    assert!(kong_spans.iter().any(|k| k.span_id == b.parent_span_id));
    assert_eq!(h["x-b3-parentspanid"], hex::encode(&b.parent_span_id));
    assert_eq!(
        h["x-datadog-trace-id"],
        u64::from_str_radix(&trace[16..], 16).unwrap().to_string()
    );
    assert!(h.get("traceparent").is_none(), "{h}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tracing_off_context_is_propagated_and_nothing_is_sent() {
    let collector = Collector::start();
    let up = Upstream::start("untraced");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  routes:
  - name: r
    paths: [/t]
plugins:
- name: opentelemetry
  config:
    endpoint: http://127.0.0.1:{port}/v1/traces
    queue: {{max_coalescing_delay: 0.1}}
"#,
        url = up.url(),
        port = collector.port
    ))
    .start();
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let r = call(
        gw.proxy,
        "GET",
        "/t/x",
        &[("traceparent", &format!("00-{trace}-00f067aa0ba902b7-01"))],
    )
    .await;
    let sent = r.json()["headers"]["traceparent"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(sent.starts_with(&format!("00-{trace}-")), "{sent}");
    assert!(
        sent.ends_with("-00"),
        "not sampled when tracing is off: {sent}"
    );
    // The deprecated `endpoint` reads as `traces_endpoint`.
    let cfg = gw.admin("GET", "/plugins", None).await.json();
    assert_eq!(
        cfg["data"][0]["config"]["traces_endpoint"],
        format!("http://127.0.0.1:{}/v1/traces", collector.port)
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(collector.spans().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opentelemetry_configs_are_checked() {
    let gw = Gateway::sqlite().start();
    let post = |config| post_plugin(gw.admin, "opentelemetry", config);
    let r = post(json!({})).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["fields"]["config"]["@entity"],
        json!([
            "at least one of these fields must be non-empty: 'traces_endpoint', 'logs_endpoint'"
        ]),
        "{:?}",
        r.json()
    );
    let r = post(json!({"traces_endpoint": "ftp://x"})).await;
    assert_eq!(r.status, 400);
    let r = post(json!({"traces_endpoint": "http://c:4318/v1/traces", "sampling_rate": 2})).await;
    assert_eq!(r.status, 400);
    let r = post(
        json!({"traces_endpoint": "http://c:4318/v1/traces", "propagation": {"extract": ["nope"]}}),
    )
    .await;
    assert_eq!(r.status, 400);
    let r = post(json!({"logs_endpoint": "ftp://c:4318/v1/logs"})).await;
    assert_eq!(r.status, 400, "{:?}", r.json());
    let r = post(
        json!({"traces_endpoint": "http://c:4318/v1/traces", "logs_endpoint": "http://c:4318/v1/logs"}),
    )
    .await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    let c = &r.json()["config"];
    assert_eq!(c["logs_endpoint"], "http://c:4318/v1/logs");
    assert_eq!(c["queue"]["max_batch_size"], 200);
    assert_eq!(c["header_type"], "preserve");
    assert_eq!(c["propagation"]["default_format"], "w3c");
    assert_eq!(c["connect_timeout"], 1000);
}

/// `dns_query`: each try to a target named by a host name gets Kong's `kong.dns` CLIENT span,
/// a child of the request's span, with the name, port and address found; a target given as an
/// address gets none. Each request looks the name up, a pooled connection or not, as Kong's
/// wrapped `toip` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_query_spans_name_the_lookup() {
    let collector = Collector::start();
    let up = Upstream::start("named");
    let by_name = up.url().replace("127.0.0.1", "localhost");
    let port: i64 = up.url().rsplit(':').next().unwrap().parse().unwrap();
    let plugin = format!(
        r#"    plugins:
    - name: opentelemetry
      config:
        traces_endpoint: http://127.0.0.1:{}/v1/traces
        queue: {{max_coalescing_delay: 0.1}}
        http_response_header_for_traceid: x-trace-id
"#,
        collector.port
    );
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: named
  url: {by_name}
  routes:
  - name: named
    paths: [/named]
{plugin}- name: addressed
  url: {url}
  routes:
  - name: addressed
    paths: [/addressed]
{plugin}"#,
        url = up.url(),
    ))
    .env("TURNPIKE_TRACING_INSTRUMENTATIONS", "dns_query")
    .env("TURNPIKE_TRACING_SAMPLING_RATE", "1")
    .start();
    for _ in 0..2 {
        let r = call(gw.proxy, "GET", "/named", &[]).await;
        assert_eq!(r.status, 200);
        let trace = r.header("x-trace-id").unwrap().to_string();
        let root = &collector.named(&trace, "kong", 1).await[0];
        let dns = &collector.named(&trace, "kong.dns", 1).await[0];
        assert_eq!(dns.kind, 3, "CLIENT");
        assert_eq!(dns.parent_span_id, root.span_id);
        assert_eq!(
            attr(dns, "dns.record.domain"),
            Some(Any::StringValue("localhost".into()))
        );
        assert_eq!(attr(dns, "dns.record.port"), Some(Any::IntValue(port)));
        assert_eq!(
            attr(dns, "dns.record.ip"),
            Some(Any::StringValue("127.0.0.1".into()))
        );
        assert!(dns.status.as_ref().is_none_or(|s| s.code == 0));
        assert!(dns.start_time_unix_nano >= root.start_time_unix_nano);
        assert!(dns.end_time_unix_nano <= root.end_time_unix_nano);
        // Only the instrumentation asked for: no balancer span.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let names: Vec<String> = collector
            .spans()
            .into_iter()
            .filter(|s| hex::encode(&s.trace_id) == trace)
            .map(|s| s.name)
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }
    let r = call(gw.proxy, "GET", "/addressed", &[]).await;
    assert_eq!(r.status, 200);
    let trace = r.header("x-trace-id").unwrap().to_string();
    collector.named(&trace, "kong", 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!collector
        .spans()
        .iter()
        .any(|s| hex::encode(&s.trace_id) == trace && s.name == "kong.dns"));
}

/// `db_query` on a database node: a key not cached yet is looked up in the store, and that
/// look-up is Kong's `kong.database.query` CLIENT span (`db.system`, `db.statement`), a child
/// of the request's span; the next request with the same key is answered from the node's
/// cache and makes none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn db_query_spans_name_store_lookups() {
    let collector = Collector::start();
    let up = Upstream::start("keyed");
    let gw = Gateway::sqlite()
        .env("TURNPIKE_TRACING_INSTRUMENTATIONS", "db_query")
        .env("TURNPIKE_TRACING_SAMPLING_RATE", "1")
        .start();
    gw.add_service_route(&up.url(), "/k").await;
    for plugin in [
        json!({"name": "key-auth"}),
        json!({"name": "opentelemetry", "config": {
            "traces_endpoint": format!("http://127.0.0.1:{}/v1/traces", collector.port),
            "queue": {"max_coalescing_delay": 0.1},
            "http_response_header_for_traceid": "x-trace-id"}}),
    ] {
        let r = gw.admin("POST", "/services/s/plugins", Some(plugin)).await;
        assert_eq!(r.status, 201, "{}", r.json());
    }
    let r = gw
        .admin("POST", "/consumers", Some(json!({"username": "bob"})))
        .await;
    assert_eq!(r.status, 201);
    let r = gw
        .admin(
            "POST",
            "/consumers/bob/key-auth",
            Some(json!({"key": "bob-key"})),
        )
        .await;
    assert_eq!(r.status, 201);
    // Every write applied, the tracing plugin's too (key-auth may apply first): a second key
    // of bob's answers with a trace id. The key under test stays uncached.
    let r = gw
        .admin(
            "POST",
            "/consumers/bob/key-auth",
            Some(json!({"key": "probe-key"})),
        )
        .await;
    assert_eq!(r.status, 201);
    assert!(
        eventually(Duration::from_secs(10), async || {
            let r = call(gw.proxy, "GET", "/k", &[("apikey", "probe-key")]).await;
            r.status == 200 && r.header("x-trace-id").is_some()
        })
        .await
    );
    let trace_of = async |key: &str| {
        let r = call(gw.proxy, "GET", "/k", &[("apikey", key)]).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        r.header("x-trace-id").unwrap().to_string()
    };
    let first = trace_of("bob-key").await;
    let root = &collector.named(&first, "kong", 1).await[0];
    let q = &collector.named(&first, "kong.database.query", 1).await[0];
    assert_eq!(q.kind, 3, "CLIENT");
    assert_eq!(q.parent_span_id, root.span_id);
    assert_eq!(
        attr(q, "db.system"),
        Some(Any::StringValue("sqlite".into()))
    );
    assert_eq!(
        attr(q, "db.statement"),
        Some(Any::StringValue(
            "SELECT * FROM keyauth_credentials WHERE key = $1".into()
        ))
    );
    assert!(q.start_time_unix_nano >= root.start_time_unix_nano);
    assert!(q.end_time_unix_nano <= root.end_time_unix_nano);
    // Once the key is cached (each worker caches it on its own first miss, and a config sync
    // still settling may drop a fresh entry), a request makes no look-up and no span.
    let mut cached = false;
    for _ in 0..10 {
        let next = trace_of("bob-key").await;
        collector.named(&next, "kong", 1).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        if !collector
            .spans()
            .iter()
            .any(|s| hex::encode(&s.trace_id) == next && s.name == "kong.database.query")
        {
            cached = true;
            break;
        }
    }
    assert!(cached, "every request looked the key up");
}

/// `logs_endpoint`: what plugin code logs during a request at or above the node's log level
/// reaches the collector as OTLP log records (decoded by the official definitions) with Kong's
/// severity, the line's place in the code and the request's trace; lines below the level, and
/// requests of routes without the plugin, send nothing.
#[tokio::test]
async fn request_logs_reach_the_logs_endpoint() {
    let collector = Collector::start();
    let up = Upstream::start("logged");
    let config = format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  routes:
  - name: logged
    paths: [/l]
    plugins:
    - name: pre-function
      config:
        access:
        - |
          kong.log.err("boom ", 42, " ", true)
          kong.log.debug("too fine to send")
          kong.log.warn("careful")
    - name: opentelemetry
      config:
        logs_endpoint: http://127.0.0.1:{port}/v1/logs
        queue: {{max_coalescing_delay: 0.1}}
  - name: quiet
    paths: [/q]
    plugins:
    - name: pre-function
      config:
        access:
        - kong.log.err("not sent")
"#,
        url = up.url(),
        port = collector.port
    );
    let gw = Gateway::with_config(&config)
        .env("TURNPIKE_LOG_LEVEL", "warn")
        .env("TURNPIKE_TRACING_INSTRUMENTATIONS", "request")
        .env("TURNPIKE_TRACING_SAMPLING_RATE", "1")
        .start();
    assert_eq!(call(gw.proxy, "GET", "/q", &[]).await.status, 200);
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let r = call(
        gw.proxy,
        "GET",
        "/l",
        &[("traceparent", &format!("00-{trace}-00f067aa0ba902b7-01"))],
    )
    .await;
    assert_eq!(r.status, 200);
    let records = || -> Vec<_> {
        collector
            .logs
            .lock()
            .unwrap()
            .iter()
            .flat_map(|(_, r)| r.resource_logs.clone())
            .flat_map(|rl| rl.scope_logs)
            .flat_map(|sl| sl.log_records)
            .collect()
    };
    assert!(
        eventually(Duration::from_secs(10), async || records().len() >= 2).await,
        "records: {:?}",
        records()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = records();
    let bodies: Vec<String> = got
        .iter()
        .map(|r| match r.body.as_ref().and_then(|b| b.value.as_ref()) {
            Some(Any::StringValue(s)) => s.clone(),
            other => panic!("body {other:?}"),
        })
        .collect();
    assert_eq!(bodies, ["boom 42 true", "careful"]);
    let boom = &got[0];
    assert_eq!(
        (boom.severity_number, boom.severity_text.as_str()),
        (17, "ERR")
    );
    assert_eq!(
        (got[1].severity_number, got[1].severity_text.as_str()),
        (13, "WARN")
    );
    assert_eq!(hex::encode(&boom.trace_id), trace);
    assert_eq!(boom.flags, 1, "sampled");
    assert_eq!(boom.span_id.len(), 8);
    assert!(boom.time_unix_nano > 0 && boom.observed_time_unix_nano == boom.time_unix_nano);
    let attr = |r: &opentelemetry_proto::tonic::logs::v1::LogRecord, k: &str| {
        r.attributes
            .iter()
            .find(|a| a.key == k)
            .and_then(|a| a.value.as_ref())
            .and_then(|v| v.value.clone())
    };
    assert_eq!(
        attr(boom, "introspection.current.line"),
        Some(Any::DoubleValue(1.0))
    );
    assert_eq!(
        attr(&got[1], "introspection.current.line"),
        Some(Any::DoubleValue(3.0))
    );
    assert!(matches!(
        attr(boom, "introspection.source"),
        Some(Any::StringValue(_))
    ));
    let id = r
        .header("x-kong-request-id")
        .expect("the request's id")
        .to_string();
    assert_eq!(attr(boom, "request.id"), Some(Any::StringValue(id)));
    // Kong's resource and scope, and the protobuf content type.
    let sent = collector.logs.lock().unwrap().clone();
    assert!(sent.iter().all(|(ct, _)| ct == "application/x-protobuf"));
    let rl = &sent[0].1.resource_logs[0];
    let resource: Vec<&KeyValue> = rl.resource.as_ref().unwrap().attributes.iter().collect();
    assert!(resource.iter().any(|a| a.key == "service.name"
        && a.value.as_ref().and_then(|v| v.value.clone())
            == Some(Any::StringValue("kong".into()))));
    assert_eq!(
        rl.scope_logs[0].scope.as_ref().unwrap().name,
        "kong-internal"
    );
}
