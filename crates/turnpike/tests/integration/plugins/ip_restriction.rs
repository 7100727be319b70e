//! ip-restriction on the real binary.

use crate::common::*;
use serde_json::json;

#[tokio::test]
async fn ip_restriction_runs_first_and_honours_trusted_proxies() {
    let up = Upstream::start("ip");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  routes:
  - name: denied
    paths: [/denied]
    plugins:
    - name: ip-restriction
      config: {{deny: [127.0.0.1]}}
  - name: allowlist
    paths: [/allowlist]
    plugins:
    - name: ip-restriction
      config: {{allow: [10.0.0.0/8], status: 401, message: "go away"}}
  - name: local
    paths: [/local]
    plugins:
    - name: ip-restriction
      config: {{allow: [127.0.0.0/8, "::1"]}}
  - name: both
    paths: [/both]
    plugins:
    - name: request-termination
      config: {{status_code: 418}}
    - name: ip-restriction
      config: {{deny: [127.0.0.1]}}
  - name: behind-proxy
    paths: [/behind-proxy]
    plugins:
    - name: ip-restriction
      config: {{deny: [203.0.113.7]}}
"#,
        url = up.url()
    ))
    .env("TURNPIKE_TRUSTED_IPS", "127.0.0.1")
    .start();
    let r = get(gw.proxy, "x", "/denied").await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.json(),
        json!({"message": "Your IP address is not allowed"})
    );
    let r = get(gw.proxy, "x", "/allowlist").await;
    assert_eq!((r.status, r.json()), (401, json!({"message": "go away"})));
    assert_eq!(get(gw.proxy, "x", "/local").await.status, 200);
    // PRIORITY: ip-restriction (990) before request-termination (2).
    assert_eq!(get(gw.proxy, "x", "/both").await.status, 403);
    // From a trusted proxy, the client is the one X-Real-IP names.
    assert_eq!(get(gw.proxy, "x", "/behind-proxy").await.status, 200);
    let r = send(
        gw.proxy,
        req("GET", "/behind-proxy")
            .header("x-real-ip", "203.0.113.7")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 403);

    // A bad list is refused with the entity and field named.
    let bad = write(
        gw.dir.path(),
        "bad.yml",
        "_format_version: '3.0'\nplugins:\n- name: ip-restriction\n  config: {allow: [10.0.0.0/40]}\n",
    );
    let (ok, out) = run(&["config", "parse", bad.to_str().unwrap()], &[]);
    assert!(!ok);
    assert!(
        out.contains("config.allow.1: invalid ip or cidr range"),
        "{out}"
    );
}
