//! basic-auth on the real binary: Kong's behaviour and errors, passwords hashed at rest with
//! argon2id (Kong's salted SHA-1 still accepted), the verified-credential cache, and floods of
//! wrong passwords.

use std::time::Duration;

use crate::common::*;
use base64::Engine;
use serde_json::json;

/// A GET with these headers (raw bytes: some tests send values that are not text).
async fn get_with(addr: std::net::SocketAddr, path: &str, headers: &[(&str, &[u8])]) -> Reply {
    call_raw(addr, "GET", path, headers).await
}

fn basic(user: &str, pass: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
    )
}

#[tokio::test]
async fn basic_auth_behaves_like_kong() {
    let up = Upstream::start("basic");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
consumers:
- username: alice
  custom_id: A-1
  basicauth_credentials:
  - username: alice
    password: "open sesame"
  keyauth_credentials:
  - key: alice-key
- username: guest
services:
- name: svc
  url: {url}
  routes:
  - name: plain
    paths: [/plain]
    plugins:
    - name: basic-auth
  - name: hidden
    paths: [/hidden]
    plugins:
    - name: basic-auth
      config: {{hide_credentials: true, realm: api}}
  - name: either
    paths: [/either]
    plugins:
    - name: key-auth
      config: {{anonymous: guest}}
    - name: basic-auth
      config: {{anonymous: guest}}
"#,
        url = up.url()
    ))
    .start();
    let p = gw.proxy;
    let good = basic("alice", "open sesame");
    let unauthorized = json!({"message": "Unauthorized"});
    // No header, wrong password, unknown user, malformed values: Kong's 401 and challenge.
    for headers in [
        vec![],
        vec![("authorization", basic("alice", "open sesamE").into_bytes())],
        vec![("authorization", basic("bob", "open sesame").into_bytes())],
        vec![("authorization", b"Basic !!!not base64".to_vec())],
        vec![("authorization", b"Bearer abc".to_vec())],
        vec![("authorization", b"Basic".to_vec())],
        vec![("authorization", basic("alice", "").into_bytes())],
        // Not UTF-8 in the header, then not UTF-8 inside the decoded credentials.
        vec![(
            "authorization",
            vec![b'B', b'a', b's', b'i', b'c', b' ', 0xff],
        )],
        vec![(
            "authorization",
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode([0xff, b':', 0xfe])
            )
            .into_bytes(),
        )],
        // A huge value.
        vec![(
            "authorization",
            basic("alice", &"x".repeat(6000)).into_bytes(),
        )],
    ] {
        let h: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_slice())).collect();
        let r = get_with(p, "/plain", &h).await;
        assert_eq!(
            (r.status, r.json()),
            (401, unauthorized.clone()),
            "{headers:?}"
        );
        assert_eq!(
            r.header("www-authenticate"),
            Some("Basic realm=\"service\"")
        );
    }
    let r = get_with(p, "/plain", &[("authorization", good.as_bytes())]).await;
    assert_eq!(r.status, 200);
    let h = r.json()["headers"].clone();
    assert_eq!(h["x-consumer-username"], "alice");
    assert_eq!(h["x-consumer-custom-id"], "A-1");
    // Kong names a basic-auth credential by its username (logs and limit_by use its id).
    assert_eq!(h["x-credential-identifier"], "alice");
    assert_eq!(h["authorization"], good.as_str());
    // Proxy-Authorization is read first, as Kong does.
    let r = get_with(
        p,
        "/plain",
        &[
            ("proxy-authorization", good.as_bytes()),
            ("authorization", b"Basic bm9wZTpub3Bl"),
        ],
    )
    .await;
    assert_eq!(r.status, 200);

    // hide_credentials; realm.
    let r = get_with(p, "/hidden", &[("authorization", good.as_bytes())]).await;
    assert_eq!(r.status, 200);
    assert!(r.json()["headers"]["authorization"].is_null());
    let r = get_with(p, "/hidden", &[]).await;
    assert_eq!(r.header("www-authenticate"), Some("Basic realm=\"api\""));

    // anonymous on both: a logical OR of key-auth and basic-auth.
    let r = get_with(p, "/either", &[]).await;
    assert_eq!(r.json()["headers"]["x-consumer-username"], "guest");
    assert_eq!(r.json()["headers"]["x-anonymous-consumer"], "true");
    let r = get_with(p, "/either", &[("authorization", good.as_bytes())]).await;
    assert_eq!(r.json()["headers"]["x-consumer-username"], "alice");
    assert!(r.json()["headers"]["x-anonymous-consumer"].is_null());
    let r = get_with(p, "/either", &[("apikey", b"alice-key")]).await;
    assert_eq!(r.json()["headers"]["x-consumer-username"], "alice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_are_hashed_at_rest_and_verified_once() {
    let up = Upstream::start("basic-admin");
    let gw = Gateway::sqlite().start();
    gw.add_service_route(&up.url(), "/b").await;
    let r = gw
        .admin(
            "POST",
            "/services/s/plugins",
            Some(json!({"name": "basic-auth"})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.json());
    assert_eq!(r.json()["config"]["realm"], "service");
    let c = gw
        .admin("POST", "/consumers", Some(json!({"username": "carol"})))
        .await;
    let consumer_id = c.json()["id"].as_str().unwrap().to_string();
    let r = gw
        .admin(
            "POST",
            "/consumers/carol/basic-auth",
            Some(json!({"username": "carol", "password": "hunter2"})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.json());
    let cred_id = r.json()["id"].as_str().unwrap().to_string();
    let stored = r.json()["password"].as_str().unwrap().to_string();
    assert!(stored.starts_with("$argon2id$"), "{stored}");
    // The database holds the hash, never the password.
    let db = std::fs::read(gw.dir.path().join("prefix/turnpike.db")).unwrap_or_default();
    assert!(!db.windows(7).any(|w| w == b"hunter2"));

    let proxy = gw.proxy;
    let good = basic("carol", "hunter2");
    assert!(
        eventually(Duration::from_secs(10), async || {
            get_with(proxy, "/b", &[("authorization", good.as_bytes())])
                .await
                .status
                == 200
        })
        .await
    );
    // Cached: the same header again, many times, concurrently.
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let good = good.clone();
        tasks.push(tokio::spawn(async move {
            get_with(proxy, "/b", &[("authorization", good.as_bytes())])
                .await
                .status
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }

    // A new password takes effect at once: the cached verification was for the old hash.
    let r = gw
        .admin(
            "PATCH",
            &format!("/consumers/carol/basic-auth/{cred_id}"),
            Some(json!({"password": "correct horse"})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json());
    assert_ne!(r.json()["password"], stored.as_str());
    assert!(
        eventually(Duration::from_secs(10), async || {
            get_with(proxy, "/b", &[("authorization", good.as_bytes())])
                .await
                .status
                == 401
        })
        .await,
        "{}",
        gw.log_text()
    );
    let new = basic("carol", "correct horse");
    assert_eq!(
        get_with(proxy, "/b", &[("authorization", new.as_bytes())])
            .await
            .status,
        200
    );

    // Kong's stored form (sha1 of password and consumer id, from a Kong database or a decK
    // dump) is kept as it is and still verifies.
    use sha1::Digest;
    let kong_hash = hex::encode(sha1::Sha1::digest(format!("legacy-pw{consumer_id}")));
    let r = gw
        .admin(
            "POST",
            "/consumers/carol/basic-auth",
            Some(json!({"username": "carol-old", "password": kong_hash})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.json());
    assert_eq!(r.json()["password"], kong_hash.as_str());
    let legacy = basic("carol-old", "legacy-pw");
    assert!(
        eventually(Duration::from_secs(10), async || {
            get_with(proxy, "/b", &[("authorization", legacy.as_bytes())])
                .await
                .status
                == 200
        })
        .await
    );

    // A flood of wrong passwords: every answer is 401 or (when verifications are all busy)
    // 503 with Retry-After; never a 500, and other traffic is still served.
    let mut tasks = Vec::new();
    for i in 0..40 {
        let bad = basic("carol", &format!("guess-{i}"));
        tasks.push(tokio::spawn(async move {
            let r = get_with(proxy, "/b", &[("authorization", bad.as_bytes())]).await;
            (r.status, r.header("retry-after").map(String::from))
        }));
    }
    let r = get_with(proxy, "/b", &[("authorization", new.as_bytes())]).await;
    assert_eq!(r.status, 200);
    for t in tasks {
        match t.await.unwrap() {
            (401, _) => {}
            (503, Some(_)) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    // Required fields and bad configs: Kong-shaped violations.
    let r = gw
        .admin(
            "POST",
            "/consumers/carol/basic-auth",
            Some(json!({"username": "x"})),
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["fields"]["password"], "required field missing");
    let r = gw
        .admin(
            "POST",
            "/plugins",
            Some(json!({"name": "basic-auth", "config": {"hide_credentials": "yes"}})),
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["fields"]["config"]["hide_credentials"],
        "expected a boolean"
    );
}
