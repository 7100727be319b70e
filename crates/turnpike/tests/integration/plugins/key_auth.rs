//! key-auth on the real binary.

use crate::common::*;
use serde_json::{json, Value};

#[tokio::test]
async fn key_auth_identifies_consumers() {
    let up = Upstream::start("keys");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
consumers:
- username: alice
  custom_id: A-1
  keyauth_credentials:
  - key: alice-key
- username: guest
- username: dora
  keyauth_credentials:
  - key: "{dora_digest}"
services:
- name: svc
  url: {url}
  routes:
  - name: plain
    paths: [/plain]
    plugins:
    - name: key-auth
  - name: hidden
    paths: [/hidden]
    plugins:
    - name: key-auth
      config: {{key_names: [x-api-key], hide_credentials: true, realm: api, run_on_preflight: false}}
  - name: open
    paths: [/open]
    plugins:
    - name: key-auth
      config: {{anonymous: guest}}
  - name: broken
    paths: [/broken]
    plugins:
    - name: key-auth
      config: {{anonymous: nobody}}
"#,
        url = up.url(),
        // A key stored as its digest (a Turnpike export): the key itself still works.
        dora_digest = {
            use sha2::Digest;
            format!("$sha256${}", hex::encode(sha2::Sha256::digest(b"dora-key")))
        }
    ))
    .start();
    let p = gw.proxy;
    // No key, a wrong key: Kong's 401s and challenge.
    let r = call(p, "GET", "/plain", &[]).await;
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "No API key found in request"}))
    );
    assert_eq!(r.header("www-authenticate"), Some("Key"));
    let r = call(p, "GET", "/plain", &[("apikey", "nope")]).await;
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "Unauthorized"}))
    );
    let r = call(
        p,
        "GET",
        "/plain",
        &[("apikey", "alice-key"), ("apikey", "alice-key")],
    )
    .await;
    assert_eq!(r.status, 401);
    // By header and by query; the upstream learns who it is, and spoofed identity headers go.
    let r = call(
        p,
        "GET",
        "/plain",
        &[
            ("apikey", "alice-key"),
            ("x-consumer-username", "mallory"),
            ("x-anonymous-consumer", "true"),
        ],
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let h = r.json()["headers"].clone();
    assert_eq!(h["x-consumer-username"], "alice");
    assert_eq!(h["x-consumer-custom-id"], "A-1");
    assert!(h["x-consumer-id"].is_string() && h["x-credential-identifier"].is_string());
    assert!(h["x-anonymous-consumer"].is_null());
    assert_eq!(h["apikey"], "alice-key");
    // Huge and non-ASCII keys: Kong's 401, nothing worse.
    let huge = "k".repeat(6000);
    let r = call(p, "GET", "/plain", &[("apikey", huge.as_str())]).await;
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "Unauthorized"}))
    );
    let r = call(p, "GET", &format!("/plain?apikey={huge}"), &[]).await;
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "Unauthorized"}))
    );
    let r = send(
        p,
        req("GET", "/plain")
            .header(
                "apikey",
                http::HeaderValue::from_bytes(&[0xff, 0xfe, b'k']).unwrap(),
            )
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "Unauthorized"}))
    );
    let r = call(p, "GET", "/plain", &[("apikey", "dora-key")]).await;
    assert_eq!(r.json()["headers"]["x-consumer-username"], "dora");
    let r = call(p, "GET", "/plain?apikey=alice-key&x=1", &[]).await;
    assert_eq!(r.status, 200);
    // strip_path (default on) leaves "/" of the path.
    assert_eq!(r.json()["uri"], "/?apikey=alice-key&x=1");

    // hide_credentials removes the key from the header or the query; realm; preflight.
    let r = call(p, "GET", "/hidden", &[("x-api-key", "alice-key")]).await;
    assert_eq!(r.status, 200);
    assert!(r.json()["headers"]["x-api-key"].is_null());
    let r = call(p, "GET", "/hidden?a=1&x-api-key=alice-key", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["uri"], "/?a=1");
    let r = call(p, "GET", "/hidden", &[]).await;
    assert_eq!(r.header("www-authenticate"), Some("Key realm=\"api\""));
    assert_eq!(call(p, "OPTIONS", "/hidden", &[]).await.status, 200);

    // anonymous: no key is the anonymous consumer; a good key still identifies.
    let r = call(p, "GET", "/open", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["headers"]["x-anonymous-consumer"], "true");
    assert_eq!(r.json()["headers"]["x-consumer-username"], "guest");
    let r = call(p, "GET", "/open", &[("apikey", "alice-key")]).await;
    assert_eq!(r.json()["headers"]["x-consumer-username"], "alice");
    let r = call(p, "GET", "/broken", &[]).await;
    assert_eq!(r.status, 500);
    assert!(r.json()["message"]
        .as_str()
        .unwrap()
        .contains("anonymous consumer nobody"));
}

#[tokio::test]
async fn key_auth_credentials_through_the_admin_api() {
    key_auth_credentials(false).await;
}

/// `key_auth_hash_keys = on`: the store keeps digests, the key is shown once.
#[tokio::test]
async fn key_auth_credentials_hashed_at_rest() {
    key_auth_credentials(true).await;
}

async fn key_auth_credentials(hashed: bool) {
    let up = Upstream::start("keys-admin");
    let gw = Gateway::sqlite()
        .env(
            "TURNPIKE_KEY_AUTH_HASH_KEYS",
            if hashed { "on" } else { "off" },
        )
        .start();
    gw.add_service_route(&up.url(), "/k").await;
    assert_eq!(
        gw.admin(
            "POST",
            "/services/s/plugins",
            Some(json!({"name": "key-auth"}))
        )
        .await
        .status,
        201
    );
    assert_eq!(
        gw.admin("POST", "/consumers", Some(json!({"username": "bob"})))
            .await
            .status,
        201
    );
    let k = gw.admin("POST", "/consumers/bob/key-auth", None).await;
    assert_eq!(k.status, 201);
    let key = k.json()["key"].as_str().unwrap().to_string();
    assert_eq!(key.len(), 32, "{key}");
    let id = k.json()["id"].as_str().unwrap().to_string();
    let stored = gw.admin("GET", &format!("/key-auths/{id}"), None).await;
    let read_back = stored.json()["key"].as_str().unwrap().to_string();
    let db = std::fs::read(gw.dir.path().join("prefix/turnpike.db")).unwrap_or_default();
    if hashed {
        // The generated key is shown once, in this answer; the store keeps only its digest.
        assert!(
            read_back.starts_with("$sha256$") && read_back.len() == 8 + 64,
            "{read_back}"
        );
        assert!(!db.windows(key.len()).any(|w| w == key.as_bytes()));
    } else {
        // Kong's behaviour: the key reads back as written (decK compares it with its file).
        assert_eq!(read_back, key);
        let listed = gw.admin("GET", "/consumers/bob/key-auth", None).await;
        assert_eq!(listed.json()["data"][0]["key"], key.as_str());
    }
    // Found by the key itself, as Kong's endpoint key allows; a second copy is a conflict.
    let r = gw.admin("GET", &format!("/key-auths/{key}"), None).await;
    assert_eq!(
        (r.status, r.json()["id"].as_str()),
        (200, Some(id.as_str()))
    );
    let r = gw
        .admin("POST", "/consumers/bob/key-auth", Some(json!({"key": key})))
        .await;
    assert_eq!(r.status, 409, "{}", r.json());
    let proxy = gw.proxy;
    // The node applies Admin API writes through its config sync: wait for key-auth to be on
    // (a loaded machine can take longer than the calls above).
    until_status(proxy, "/k", 401).await;
    // A key asked for before it exists is cached as missing; creating it ends that at once.
    for _ in 0..2 {
        let r = call(proxy, "GET", "/k", &[("apikey", "chosen-key")]).await;
        assert_eq!(r.status, 401);
    }
    let r = gw
        .admin(
            "POST",
            "/consumers/bob/key-auth",
            Some(json!({"key": "chosen-key"})),
        )
        .await;
    assert_eq!(
        (r.status, r.json()["key"].as_str()),
        (201, Some("chosen-key"))
    );
    assert!(
        eventually(std::time::Duration::from_secs(10), async || {
            call(proxy, "GET", "/k", &[("apikey", "chosen-key")])
                .await
                .status
                == 200
        })
        .await
    );
    // Renaming the consumer reaches the identity cached with its key.
    let r = gw
        .admin(
            "PATCH",
            "/consumers/bob",
            Some(json!({"username": "robert"})),
        )
        .await;
    assert_eq!(r.status, 200);
    assert!(
        eventually(std::time::Duration::from_secs(10), async || {
            call(proxy, "GET", "/k", &[("apikey", "chosen-key")])
                .await
                .json()["headers"]["x-consumer-username"]
                == "robert"
        })
        .await
    );
    assert!(
        eventually(std::time::Duration::from_secs(10), async || {
            call(proxy, "GET", "/k", &[("apikey", key.as_str())])
                .await
                .status
                == 200
        })
        .await
    );
    // Deleting the consumer revokes the key.
    assert_eq!(
        gw.admin("DELETE", "/consumers/robert", None).await.status,
        204
    );
    assert!(
        eventually(std::time::Duration::from_secs(10), async || {
            call(proxy, "GET", "/k", &[("apikey", key.as_str())])
                .await
                .status
                == 401
        })
        .await
    );
    // Bad key-auth configs are Kong-shaped schema violations.
    let r = gw
        .admin(
            "POST",
            "/plugins",
            Some(json!({"name": "key-auth", "config": {"key_names": ["bad name"]}})),
        )
        .await;
    assert_eq!(r.status, 400);
    assert!(
        r.json()["fields"]["config"]["key_names"][0]
            .as_str()
            .unwrap()
            .starts_with("bad header name 'bad name'"),
        "{:?}",
        r.json()
    );
}

// Rate-limit tests use the `year` window: a test never straddles its boundary, where a
// minute or hour window could reset in the middle of a CI run.

/// key-auth's key_in_body: URL-encoded, JSON and multipart bodies, read whole before the
/// chain runs; hide_credentials takes the key out of the body the upstream gets.
#[tokio::test]
async fn key_auth_reads_keys_from_bodies() {
    let up = Upstream::start("keys-body");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
consumers:
- username: alice
  keyauth_credentials: [{{key: alice-key}}]
services:
- name: svc
  url: {url}
  routes:
  - name: hidden
    paths: [/hidden]
    plugins:
    - name: key-auth
      config: {{key_in_body: true, key_in_header: false, key_in_query: false, hide_credentials: true}}
  - name: kept
    paths: [/kept]
    plugins:
    - name: key-auth
      config: {{key_in_body: true}}
"#,
        url = up.url()
    ))
    .start();
    let p = gw.proxy;
    let post = |path: &'static str, ct: &'static str, body: Vec<u8>| async move {
        send(
            p,
            req("POST", path)
                .header("content-type", ct)
                .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                .unwrap(),
        )
        .await
    };
    let r = post(
        "/hidden",
        "application/x-www-form-urlencoded",
        b"x=1&apikey=alice-key".to_vec(),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["headers"]["x-consumer-username"], "alice");
    assert_eq!(r.json()["body_len"], 3);
    assert_eq!(r.json()["headers"]["content-length"], "3");
    let r = post(
        "/hidden",
        "application/json",
        br#"{"apikey": "alice-key", "a": 1}"#.to_vec(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["body_len"], br#"{"a":1}"#.len());
    let multipart = b"--B\r\nContent-Disposition: form-data; name=\"apikey\"\r\n\r\nalice-key\r\n--B\r\nContent-Disposition: form-data; name=\"f\"\r\n\r\nv\r\n--B--\r\n";
    let r = post(
        "/hidden",
        "multipart/form-data; boundary=B",
        multipart.to_vec(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.json()["body_len"].as_u64().unwrap() < multipart.len() as u64);
    // Not in the body (and header and query are off here): Kong's 401s.
    let r = post("/hidden", "application/json", br#"{"a": 1}"#.to_vec()).await;
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "No API key found in request"}))
    );
    let r = post("/hidden", "application/json", b"{broken".to_vec()).await;
    assert_eq!(r.status, 401);
    let r = call(p, "GET", "/hidden", &[("apikey", "alice-key")]).await;
    assert_eq!(r.status, 401);
    let r = post(
        "/hidden",
        "application/x-www-form-urlencoded",
        b"apikey=wrong".to_vec(),
    )
    .await;
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "Unauthorized"}))
    );
    // Without hide_credentials the upstream gets the body as sent; headers still work.
    let body = b"apikey=alice-key&payload=0123456789".to_vec();
    let r = post("/kept", "application/x-www-form-urlencoded", body.clone()).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["body_len"], body.len());
    let r = call(p, "GET", "/kept", &[("apikey", "alice-key")]).await;
    assert_eq!(r.status, 200);
    // A body too large to read whole for the plugin: 413, not unbounded memory.
    let r = post(
        "/kept",
        "application/x-www-form-urlencoded",
        vec![b'a'; 9 << 20],
    )
    .await;
    assert_eq!(r.status, 413);
}

/// Kong's `GET /cache/{key}`: what the node holds under Kong's cache key of a credential
/// (`keyauth_credentials:<key>:::::<workspace>`): the credential once a request used it,
/// `{}` for a key remembered as missing, 404 for one never asked for; `DELETE /cache/{key}`
/// drops that entry alone.
#[tokio::test]
async fn the_node_cache_reads_by_kong_cache_keys() {
    let up = Upstream::start("cache-keys");
    let gw = Gateway::sqlite().start();
    gw.add_service_route(&up.url(), "/k").await;
    let r = gw
        .admin(
            "POST",
            "/services/s/plugins",
            Some(json!({"name": "key-auth"})),
        )
        .await;
    assert_eq!(r.status, 201);
    let r = gw
        .admin("POST", "/consumers", Some(json!({"username": "carol"})))
        .await;
    assert_eq!(r.status, 201);
    let r = gw
        .admin(
            "POST",
            "/consumers/carol/key-auth",
            Some(json!({"key": "k:with:colons"})),
        )
        .await;
    assert_eq!(r.status, 201);
    let id = r.json()["id"].as_str().unwrap().to_string();
    let ws = "00000000-0000-4000-8000-000000000000";
    let entry = |key: &str| format!("/cache/keyauth_credentials:{key}:::::{ws}");
    until_status(gw.proxy, "/k", 401).await;
    // Never asked for: nothing cached.
    assert_eq!(
        gw.admin("GET", &entry("k:with:colons"), None).await.status,
        404
    );
    // A use caches the credential. A change still on its way to the node (the consumer's,
    // the key's) clears the caches when it lands: used and read again until it stays.
    let proxy = gw.proxy;
    assert!(
        eventually(std::time::Duration::from_secs(10), async || {
            let r = call(proxy, "GET", "/k", &[("apikey", "k:with:colons")]).await;
            r.status == 200 && gw.admin("GET", &entry("k:with:colons"), None).await.status == 200
        })
        .await
    );
    // A key no one has: its miss is cached too. Both entries read back together (used again
    // when a change that landed meanwhile cleared the caches, as above).
    let mut read = (Value::Null, Value::Null);
    assert!(
        eventually(std::time::Duration::from_secs(10), async || {
            let r = call(proxy, "GET", "/k", &[("apikey", "k:with:colons")]).await;
            assert_eq!(r.status, 200);
            let r = call(proxy, "GET", "/k", &[("apikey", "nobody")]).await;
            assert_eq!(r.status, 401);
            let (hit, miss) = (
                gw.admin("GET", &entry("k:with:colons"), None).await,
                gw.admin("GET", &entry("nobody"), None).await,
            );
            if hit.status != 200 || miss.status != 200 {
                return false;
            }
            read = (hit.json(), miss.json());
            true
        })
        .await,
        "the key and the miss were not both cached"
    );
    assert_eq!(read.0["id"], id.as_str());
    assert_eq!(read.0["key"], "k:with:colons");
    assert_eq!(read.1, json!({}));
    // Percent-encoded as a client may send it.
    let r = gw
        .admin(
            "GET",
            &format!("/cache/keyauth_credentials%3Anobody%3A%3A%3A%3A%3A{ws}"),
            None,
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(gw.admin("GET", "/cache/some-key", None).await.status, 404);
    // One entry dropped; the other stays.
    let r = gw.admin("DELETE", &entry("k:with:colons"), None).await;
    assert_eq!(r.status, 204);
    assert_eq!(
        gw.admin("GET", &entry("k:with:colons"), None).await.status,
        404
    );
    assert_eq!(gw.admin("GET", &entry("nobody"), None).await.status, 200);
    // And the key still works: looked up again, and cached again (a config change the node
    // applies meanwhile may clear the caches: asked again then).
    let mut cached = false;
    for _ in 0..20 {
        let r = call(gw.proxy, "GET", "/k", &[("apikey", "k:with:colons")]).await;
        assert_eq!(r.status, 200);
        if gw.admin("GET", &entry("k:with:colons"), None).await.status == 200 {
            cached = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(cached, "the key was not cached again");
    assert_eq!(gw.admin("DELETE", "/cache", None).await.status, 204);
    assert_eq!(gw.admin("GET", &entry("nobody"), None).await.status, 404);
}
