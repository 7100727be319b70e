//! acl on the real binary.

use crate::common::*;
use serde_json::json;

#[tokio::test]
async fn acl_after_authentication() {
    let up = Upstream::start("acl");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
consumers:
- username: alice
  keyauth_credentials: [{{key: ka}}]
  acls: [{{group: admins}}, {{group: ops}}]
- username: bob
  keyauth_credentials: [{{key: kb}}]
  acls: [{{group: users}}]
services:
- name: svc
  url: {url}
  routes:
  - name: admin
    paths: [/admin]
    plugins:
    - name: key-auth
    - name: acl
      config: {{allow: [admins]}}
  - name: no-users
    paths: [/no-users]
    plugins:
    - name: key-auth
    - name: acl
      config: {{deny: [users], hide_groups_header: true}}
  - name: unauthenticated
    paths: [/unauth]
    plugins:
    - name: acl
      config: {{allow: [admins]}}
"#,
        url = up.url()
    ))
    .start();
    let p = gw.proxy;
    let r = call(
        p,
        "GET",
        "/admin",
        &[("apikey", "ka"), ("x-consumer-groups", "forged")],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["headers"]["x-consumer-groups"], "admins, ops");
    let r = call(p, "GET", "/admin", &[("apikey", "kb")]).await;
    assert_eq!(
        (r.status, r.json()),
        (403, json!({"message": "You cannot consume this service"}))
    );
    assert_eq!(
        call(p, "GET", "/no-users", &[("apikey", "kb")])
            .await
            .status,
        403
    );
    let r = call(p, "GET", "/no-users", &[("apikey", "ka")]).await;
    assert_eq!(r.status, 200);
    assert!(r.json()["headers"]["x-consumer-groups"].is_null());
    let r = call(p, "GET", "/unauth", &[]).await;
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "Unauthorized"}))
    );
    // Both lists, or neither: refused.
    let bad = write(
        gw.dir.path(),
        "bad.yml",
        "_format_version: '3.0'\nplugins:\n- name: acl\n  config: {allow: [a], deny: [b]}\n",
    );
    let (ok, out) = run(&["config", "parse", bad.to_str().unwrap()], &[]);
    assert!(!ok && out.contains("only one of these fields"), "{out}");
}
