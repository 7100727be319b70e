//! cors on the real binary.

use crate::common::*;

#[tokio::test]
async fn cors_answers_preflights_and_decorates_responses() {
    let up = Upstream::start("cors");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  routes:
  - name: r
    paths: [/api]
    plugins:
    - name: cors
      config: {{origins: ["https://app.test", "https://.*\\.app\\.test"], credentials: true, max_age: 300}}
"#,
        url = up.url()
    ))
    .start();
    let p = gw.proxy;
    let r = call(
        p,
        "OPTIONS",
        "/api",
        &[
            ("origin", "https://eu.app.test"),
            ("access-control-request-method", "POST"),
            ("access-control-request-headers", "x-token"),
        ],
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(
        r.header("x-upstream").is_none(),
        "a preflight is answered by the gateway"
    );
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://eu.app.test")
    );
    assert_eq!(r.header("access-control-allow-headers"), Some("x-token"));
    assert_eq!(r.header("access-control-max-age"), Some("300"));
    assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
    let r = call(p, "GET", "/api", &[("origin", "https://app.test")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-upstream"), Some("cors"));
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.test")
    );
    assert_eq!(r.header("vary"), Some("Origin"));
    let r = call(p, "GET", "/api", &[("origin", "https://evil.test")]).await;
    assert!(r.header("access-control-allow-origin").is_none());
}
