//! ldap-auth on the real binary against a real OpenLDAP server (slapd, started by the
//! harness): binds over plain LDAP, ldaps and StartTLS, Kong's refusals and challenge, the
//! bind cache (a stopped server still answers remembered credentials), hide_credentials and
//! anonymous.

use base64::Engine;
use serde_json::json;

use crate::common::slapd::{Slapd, BASE_DN};
use crate::common::*;

fn ldap(user: &str, pass: &str) -> String {
    format!(
        "ldap {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ldap_auth_binds_against_a_real_server() {
    let mut slapd = Slapd::start(&[("einstein", "password"), ("curie", "radium")]);
    let up = Upstream::start("ldap");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
consumers:
- username: guest
services:
- name: svc
  url: {url}
  routes:
  - name: plain
    paths: [/plain]
    plugins:
    - name: ldap-auth
      config: {{ldap_host: 127.0.0.1, ldap_port: {port}, base_dn: "{base}", attribute: uid, cache_ttl: 600}}
  - name: ldaps
    paths: [/ldaps]
    plugins:
    - name: ldap-auth
      config: {{ldap_host: 127.0.0.1, ldap_port: {tls_port}, ldaps: true, base_dn: "{base}", attribute: uid, hide_credentials: true, cache_ttl: 0}}
  - name: starttls
    paths: [/starttls]
    plugins:
    - name: ldap-auth
      config: {{ldap_host: 127.0.0.1, ldap_port: {port}, start_tls: true, base_dn: "{base}", attribute: uid, header_type: basic, cache_ttl: 0}}
  - name: verified
    paths: [/verified]
    plugins:
    - name: ldap-auth
      config: {{ldap_host: 127.0.0.1, ldap_port: {tls_port}, ldaps: true, verify_ldap_host: true, base_dn: "{base}", attribute: uid, cache_ttl: 0}}
  - name: either
    paths: [/either]
    plugins:
    - name: ldap-auth
      config: {{ldap_host: 127.0.0.1, ldap_port: {port}, base_dn: "{base}", attribute: uid, anonymous: guest}}
"#,
        url = up.url(),
        port = slapd.port,
        tls_port = slapd.tls_port,
        base = BASE_DN,
    ))
    .start();
    let p = gw.proxy;
    let good = ldap("einstein", "password");

    let r = call(p, "GET", "/plain", &[("authorization", &good)]).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let h = &r.json()["headers"];
    assert_eq!(h["x-credential-identifier"], "einstein");
    assert!(h["x-consumer-id"].is_null() && h["x-anonymous-consumer"].is_null());
    assert_eq!(h["authorization"], good.as_str());
    // Proxy-Authorization is read first; a wrong one there falls back to Authorization.
    let r = call(
        p,
        "GET",
        "/plain",
        &[
            ("proxy-authorization", &ldap("curie", "radium")),
            ("authorization", &good),
        ],
    )
    .await;
    assert_eq!(r.json()["headers"]["x-credential-identifier"], "curie");
    let r = call(
        p,
        "GET",
        "/plain",
        &[
            ("proxy-authorization", &ldap("curie", "wrong")),
            ("authorization", &good),
        ],
    )
    .await;
    assert_eq!(r.json()["headers"]["x-credential-identifier"], "einstein");

    // Kong's refusals.
    let r = call(p, "GET", "/plain", &[]).await;
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "Unauthorized"}))
    );
    assert_eq!(r.header("www-authenticate"), Some("LDAP realm=\"kong\""));
    let invalid = json!({"message": "Invalid authentication credentials"});
    for auth in [
        ldap("einstein", "wrong"),
        ldap("nobody", "password"),
        // A user name that tries to escape its DN.
        ldap("einstein,ou=people", "password"),
        ldap("einstein", ""),
        "Basic ZWluc3RlaW46cGFzc3dvcmQ=".to_string(),
        "ldap !!!".to_string(),
    ] {
        let r = call(p, "GET", "/plain", &[("authorization", &auth)]).await;
        assert_eq!((r.status, r.json()), (401, invalid.clone()), "{auth}");
        assert!(r.header("www-authenticate").is_none());
    }

    // ldaps with hide_credentials; StartTLS with another scheme name.
    let r = call(p, "GET", "/ldaps", &[("authorization", &good)]).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    assert!(r.json()["headers"]["authorization"].is_null());
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("curie:radium")
    );
    let r = call(p, "GET", "/starttls", &[("authorization", &basic)]).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let r = call(p, "GET", "/starttls", &[]).await;
    assert_eq!(r.header("www-authenticate"), Some("basic realm=\"kong\""));
    // A certificate that does not verify: the server cannot be asked, Kong's 500.
    let r = call(p, "GET", "/verified", &[("authorization", &good)]).await;
    assert_eq!(
        (r.status, r.json()),
        (500, json!({"message": "An unexpected error occurred"}))
    );

    // anonymous.
    let r = call(
        p,
        "GET",
        "/either",
        &[("authorization", &ldap("einstein", "nope"))],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["headers"]["x-consumer-username"], "guest");
    assert_eq!(r.json()["headers"]["x-anonymous-consumer"], "true");

    // The cache: with the server gone, remembered answers still hold (cache_ttl 600);
    // routes that remember nothing (cache_ttl 0) get 500.
    slapd.kill();
    let r = call(p, "GET", "/plain", &[("authorization", &good)]).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let r = call(
        p,
        "GET",
        "/plain",
        &[("authorization", &ldap("einstein", "wrong"))],
    )
    .await;
    assert_eq!(r.status, 401);
    let r = call(p, "GET", "/ldaps", &[("authorization", &good)]).await;
    assert_eq!(r.status, 500);
    // Back up: binds work again, on new connections.
    slapd.resume();
    let r = call(p, "GET", "/ldaps", &[("authorization", &good)]).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
}

#[tokio::test]
async fn ldap_auth_configs_are_checked() {
    let gw = Gateway::sqlite().start();
    let r = gw
        .admin(
            "POST",
            "/plugins",
            Some(json!({"name": "ldap-auth", "config": {}})),
        )
        .await;
    assert_eq!(r.status, 400);
    let f = &r.json()["fields"]["config"];
    for field in ["ldap_host", "base_dn", "attribute"] {
        assert_eq!(f[field], "required field missing", "{}", r.json());
    }
    let r = gw
        .admin(
            "POST",
            "/plugins",
            Some(json!({"name": "ldap-auth", "config": {"ldap_host": "h", "base_dn": "b", "attribute": "uid", "ldaps": true, "start_tls": true}})),
        )
        .await;
    assert_eq!(r.status, 400);
    assert!(
        String::from_utf8_lossy(&r.body)
            .contains("'ldaps' and 'start_tls' cannot be enabled simultaneously"),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    let r = gw
        .admin(
            "POST",
            "/plugins",
            Some(json!({"name": "ldap-auth", "config": {"ldap_host": "h", "base_dn": "b", "attribute": "uid"}})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    let c = &r.json()["config"];
    assert_eq!(
        (
            c["ldap_port"].clone(),
            c["cache_ttl"].clone(),
            c["header_type"].clone()
        ),
        (json!(389), json!(60), json!("ldap"))
    );
}
