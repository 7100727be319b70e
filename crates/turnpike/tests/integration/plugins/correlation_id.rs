//! correlation-id on the real binary.

use crate::common::*;

#[tokio::test]
async fn correlation_id_goes_upstream_and_back() {
    let up = Upstream::start("cid");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  routes:
  - name: r
    paths: [/r]
plugins:
- name: correlation-id
  config: {{header_name: X-Correlation, echo_downstream: true}}
"#,
        url = up.url()
    ))
    .start();
    let r = get(gw.proxy, "x", "/r").await;
    assert_eq!(r.status, 200);
    let echoed = r.header("x-correlation").unwrap().to_string();
    assert!(echoed.ends_with("#1"), "{echoed}");
    assert_eq!(r.json()["headers"]["x-correlation"], echoed);
    let r2 = get(gw.proxy, "x", "/r").await;
    assert!(r2.header("x-correlation").unwrap().ends_with("#2"));
    // The client's own id is kept.
    let r = send(
        gw.proxy,
        req("GET", "/r")
            .header("x-correlation", "mine")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(r.header("x-correlation"), Some("mine"));
    assert_eq!(r.json()["headers"]["x-correlation"], "mine");
    // A request no route matches runs no plugin (Kong runs only global rewrite-phase ones).
    assert!(get(gw.proxy, "x", "/nowhere")
        .await
        .header("x-correlation")
        .is_none());
}
