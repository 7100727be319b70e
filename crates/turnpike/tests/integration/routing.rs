//! Routing rules of Kong's traditional_compatible router, end to end through the real binary.

use crate::common::*;
use bytes::Bytes;
use http_body_util::Full;

// `dead`: a port that refuses connections (held by the caller, see `dead_port`).
fn config(up: &Upstream, up2: &Upstream, dead: u16) -> String {
    format!(
        r#"
_format_version: "3.0"
services:
  - name: main
    url: {u1}/svc
    routes:
      - name: prefix
        paths: [/api]
      - name: keep-path
        paths: [/keep]
        strip_path: false
      - name: regex
        paths: ['~/users/(?<id>\d+)$']
      - name: host-exact
        hosts: [exact.test]
      - name: host-wild
        hosts: ['*.wild.test']
      - name: method
        paths: [/m]
        methods: [POST]
      - name: header
        paths: [/h]
        headers: {{x-version: [v2]}}
      - name: preserve
        hosts: [preserve.test]
        preserve_host: true
      - name: https-only
        paths: [/secure]
        protocols: [https]
      - name: https-redirect
        paths: [/moved]
        protocols: [https]
        https_redirect_status_code: 301
  - name: other
    url: {u2}
    routes:
      - name: other-h
        paths: [/h]
      - name: no-strip-root
        paths: [/o]
  - name: refused
    url: http://127.0.0.1:{dead}
    retries: 2
    routes: [{{name: refused, paths: [/refused]}}]
  - name: slow
    url: {u1}
    read_timeout: 300
    routes: [{{name: slow, paths: [/delay], strip_path: false}}]
  - name: disabled
    url: {u1}
    enabled: false
    routes: [{{name: disabled, paths: [/disabled]}}]
  - name: nopeer
    host: empty-upstream
    routes: [{{name: no-peer, paths: [/nopeer]}}]
  - name: lb
    host: balanced
    routes: [{{name: lb, paths: [/lb]}}]
upstreams:
  - name: empty-upstream
    targets: [{{target: "127.0.0.1:1", weight: 0}}]
  - name: balanced
    targets: [{{target: "{a1}"}}, {{target: "{a2}"}}]
"#,
        u1 = up.url(),
        u2 = up2.url(),
        a1 = up.addr,
        a2 = up2.addr,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn kong_routing_rules_end_to_end() {
    let up = Upstream::start("one");
    let up2 = Upstream::start("two");
    let (_dead, dead) = dead_port();
    let yaml = config(&up, &up2, dead);
    let gw = Gateway::with_config(&yaml).start();
    let p = gw.proxy;

    // Prefix route with strip_path: the matched prefix is replaced by the service path.
    let r = get(p, "localhost", "/api/items?x=1").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let j = r.json();
    assert_eq!(j["upstream"], "one");
    assert_eq!(j["uri"], "/svc/items?x=1");
    // Host sent upstream is the service host:port, not the client's.
    assert_eq!(j["headers"]["host"], up.addr.to_string());
    assert_eq!(j["headers"]["x-forwarded-host"], "localhost");
    assert_eq!(j["headers"]["x-forwarded-proto"], "http");
    assert_eq!(j["headers"]["x-forwarded-prefix"], "/api");
    assert_eq!(j["headers"]["x-forwarded-path"], "/api/items");
    assert_eq!(
        j["headers"]["x-forwarded-port"],
        gw.proxy.port().to_string()
    );
    assert_eq!(j["headers"]["x-forwarded-for"], "127.0.0.1");
    assert_eq!(j["headers"]["x-real-ip"], "127.0.0.1");
    assert_eq!(
        j["headers"]["x-kong-request-id"].as_str().unwrap().len(),
        32
    );
    // Kong's response headers.
    assert!(r.header("via").unwrap().starts_with("1.1 turnpike/"));
    assert!(r.header("x-kong-upstream-latency").is_some());
    assert!(r.header("x-kong-proxy-latency").is_some());
    assert_eq!(
        r.header("x-kong-request-id"),
        j["headers"]["x-kong-request-id"].as_str()
    );

    // strip_path false keeps the path after the service path.
    assert_eq!(
        get(p, "localhost", "/keep/x").await.json()["uri"],
        "/svc/keep/x"
    );
    // Regex path (anchored, with a capture); strip removes the matched part.
    assert_eq!(get(p, "localhost", "/users/42").await.json()["uri"], "/svc");
    let r = get(p, "localhost", "/users/42/extra").await;
    assert_eq!(r.status, 404, "{:?}", r.body);
    // Hosts: exact and wildcard; the client's Host is replaced unless preserve_host.
    assert_eq!(
        get(p, "exact.test", "/anything").await.json()["uri"],
        "/svc/anything"
    );
    assert_eq!(
        get(p, "a.b.wild.test:1234", "/w").await.json()["uri"],
        "/svc/w"
    );
    assert_eq!(
        get(p, "preserve.test", "/p").await.json()["headers"]["host"],
        "preserve.test"
    );
    // Methods and headers.
    assert_eq!(get(p, "localhost", "/m").await.status, 404);
    let r = send(
        p,
        req("POST", "/m")
            .body(Full::new(Bytes::from("hello")))
            .unwrap(),
    )
    .await;
    assert_eq!(r.json()["body_len"], 5);
    let r = send(
        p,
        req("GET", "/h")
            .header("x-version", "V2")
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(
        r.json()["upstream"],
        "one",
        "the header route outranks the plain one"
    );
    assert_eq!(get(p, "localhost", "/h").await.json()["upstream"], "two");
    // Service without a path, route stripped to the root.
    assert_eq!(get(p, "localhost", "/o").await.json()["uri"], "/");
    assert_eq!(get(p, "localhost", "/o/x").await.json()["uri"], "/x");

    // No route: Kong's 404 body, JSON by default, text when asked.
    let r = get(p, "localhost", "/nothing-here").await;
    assert_eq!(r.status, 404);
    let j = r.json();
    assert_eq!(j["message"], "no Route matched with those values");
    assert_eq!(j["request_id"].as_str(), r.header("x-kong-request-id"));
    assert!(r.header("server").unwrap().starts_with("turnpike/"));
    let r = send(
        p,
        req("GET", "/nothing")
            .header("accept", "text/html")
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    assert!(r.header("content-type").unwrap().starts_with("text/html"));
    assert!(String::from_utf8_lossy(&r.body).contains("no Route matched with those values"));
    // Routes of a disabled service are not routed.
    let r = get(p, "localhost", "/disabled").await;
    assert_eq!(r.status, 404, "{:?}", r.body);

    // HTTPS-only routes over plain HTTP: 426 by default, or the configured redirect.
    let r = get(p, "localhost", "/secure").await;
    assert_eq!(r.status, 426);
    assert_eq!(r.json()["message"], "Please use HTTPS protocol");
    let r = get(p, "example.com", "/moved/x?y=1").await;
    assert_eq!(r.status, 301);
    assert_eq!(
        r.header("location"),
        Some("https://example.com/moved/x?y=1")
    );
    let (r, _, _) = get_tls(gw.proxy_tls, "localhost", "/secure", false).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["headers"]["x-forwarded-proto"], "https");

    // Upstream failures, in Kong's words.
    let r = get(p, "localhost", "/refused").await;
    assert_eq!(r.status, 502);
    assert_eq!(
        r.json()["message"],
        "An invalid response was received from the upstream server"
    );
    let r = get(p, "localhost", "/delay/2000").await;
    assert_eq!(r.status, 504);
    assert_eq!(r.json()["message"], "The upstream server is timed out");
    let r = get(p, "localhost", "/nopeer").await;
    assert_eq!(r.status, 503);
    assert_eq!(
        r.json()["message"],
        "failure to get a peer from the ring-balancer"
    );

    // A service whose host names an upstream is balanced over its targets.
    let mut seen = std::collections::HashSet::new();
    for _ in 0..6 {
        seen.insert(
            get(p, "localhost", "/lb").await.json()["upstream"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(seen.len(), 2, "both targets get traffic: {seen:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn trusted_ips_keep_client_forwarded_headers() {
    let up = Upstream::start("one");
    let yaml = format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/]}}]}}]\n",
        up.url()
    );
    let spoof = |gw: &Gateway| {
        let p = gw.proxy;
        async move {
            let r = send(
                p,
                req("GET", "/x")
                    .header("x-forwarded-proto", "https")
                    .header("x-forwarded-for", "1.2.3.4")
                    .header("x-forwarded-host", "spoofed.test")
                    .body(Full::new(Bytes::new()))
                    .unwrap(),
            )
            .await;
            r.json()
        }
    };
    let gw = Gateway::with_config(&yaml).start();
    let j = spoof(&gw).await;
    assert_eq!(j["headers"]["x-forwarded-proto"], "http");
    assert_eq!(j["headers"]["x-forwarded-host"], "localhost");
    assert_eq!(j["headers"]["x-forwarded-for"], "1.2.3.4, 127.0.0.1");
    drop(gw);
    let gw = Gateway::with_config(&yaml)
        .env("TURNPIKE_TRUSTED_IPS", "127.0.0.0/8")
        .start();
    let j = spoof(&gw).await;
    assert_eq!(j["headers"]["x-forwarded-proto"], "https");
    assert_eq!(j["headers"]["x-forwarded-host"], "spoofed.test");
}

#[tokio::test(flavor = "multi_thread")]
async fn headers_property_controls_kong_headers() {
    let up = Upstream::start("one");
    let yaml = format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/]}}]}}]\n",
        up.url()
    );
    let gw = Gateway::with_config(&yaml)
        .env("TURNPIKE_HEADERS", "off")
        .env("TURNPIKE_HEADERS_UPSTREAM", "off")
        .start();
    let r = get(gw.proxy, "localhost", "/").await;
    assert_eq!(r.status, 200);
    for h in [
        "via",
        "x-kong-upstream-latency",
        "x-kong-proxy-latency",
        "x-kong-request-id",
    ] {
        assert!(r.header(h).is_none(), "{h} should be off");
    }
    assert!(r.json()["headers"].get("x-kong-request-id").is_none());
    let r = get(gw.proxy, "localhost", "/").await;
    assert_eq!(r.status, 200);
}

/// A declarative file that shares settings through YAML anchors and merge keys (`<<`), as
/// Kong's reader (lyaml) applies them: the merged keys fill in what the mapping does not set,
/// its own keys win. Read the same way from `declarative_config` and from `POST /config`.
#[tokio::test(flavor = "multi_thread")]
async fn declarative_yaml_merge_keys_are_applied() {
    let up = Upstream::start("one");
    let yaml = format!(
        r#"
_format_version: "3.0"
services:
  - &base
    name: a
    url: {u}/svc
    retries: 2
    read_timeout: 7000
    routes: [{{name: ra, paths: [/a]}}]
  - <<: *base
    name: b
    retries: 4
    routes: [{{name: rb, paths: [/b]}}]
"#,
        u = up.url()
    );
    let gw = Gateway::with_config(&yaml).start();
    for path in ["/a/x", "/b/x"] {
        let r = get(gw.proxy, "localhost", path).await;
        assert_eq!(r.status, 200, "{path}: {:?}", r.body);
        assert_eq!(r.json()["uri"], "/svc/x");
    }
    let b = gw.admin("GET", "/services/b", None).await;
    assert_eq!(b.status, 200);
    let b = b.json();
    assert_eq!(b["retries"], 4);
    assert_eq!(b["read_timeout"], 7000);
    assert_eq!(b["path"], "/svc");

    // The same through POST /config, with a third service merging two mappings.
    let yaml = format!(
        "{yaml}  - <<: [*base, {{retries: 9, write_timeout: 3000}}]\n    name: c\n    routes: [{{name: rc, paths: [/c]}}]\n"
    );
    let post_config = |text: String| {
        gw.admin(
            "POST",
            "/config",
            Some(serde_json::json!({ "config": text })),
        )
    };
    let r = post_config(yaml).await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let c = gw.admin("GET", "/services/c", None).await.json();
    assert_eq!(c["retries"], 2);
    assert_eq!(c["write_timeout"], 3000);
    assert_eq!(c["read_timeout"], 7000);
    let r = get(gw.proxy, "localhost", "/c/y").await;
    assert_eq!(r.json()["uri"], "/svc/y");

    // A merge of something that is not a mapping: Kong's 400, the running config kept.
    let bad = "_format_version: \"3.0\"\nservices:\n  - <<: 5\n    name: d\n    url: http://x\n";
    let r = post_config(bad.into()).await;
    assert_eq!(r.status, 400, "{:?}", r.body);
    let text = String::from_utf8_lossy(&r.body);
    assert!(text.contains("invalid '<<' merge event"), "{text}");
    assert_eq!(gw.admin("GET", "/services/c", None).await.status, 200);
}
