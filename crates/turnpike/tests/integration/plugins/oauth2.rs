//! oauth2's token check on the real binary, on a database node: tokens written through
//! `POST /oauth2_tokens` (as the site in issue #24 wrote them) authenticate requests for their
//! service, with Kong's headers and errors; deleted or expired tokens stop working; misses are
//! remembered but a token created after one works at once. The token endpoints
//! (`/oauth2/token`, `/oauth2/authorize`) are not built yet.

use std::time::Duration;

use serde_json::{json, Value};

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_from_the_admin_api_authenticate_requests() {
    let up = Upstream::start("oauth2");
    let gw = Gateway::sqlite().start();
    let admin = |m: &'static str, p: String, b: Option<Value>| {
        let a = gw.admin;
        async move { admin_call(a, m, &p, b).await }
    };
    for (path, body) in [
        ("/services", json!({"name": "s", "url": up.url()})),
        ("/services/s/routes", json!({"name": "r", "paths": ["/o"]})),
        ("/services", json!({"name": "other", "url": up.url()})),
        (
            "/services/other/routes",
            json!({"name": "r2", "paths": ["/other"]}),
        ),
        (
            "/services/s/plugins",
            json!({"name": "oauth2", "config": {"enable_client_credentials": true, "hide_credentials": true}}),
        ),
        (
            "/services/other/plugins",
            json!({"name": "oauth2", "config": {"enable_password_grant": true, "global_credentials": true}}),
        ),
        (
            "/consumers",
            json!({"username": "owner", "custom_id": "C-1"}),
        ),
    ] {
        let r = admin("POST", path.to_string(), Some(body)).await;
        assert_eq!(r.status, 201, "{path}: {:?}", r.json());
    }
    let app = admin(
        "POST",
        "/consumers/owner/oauth2".into(),
        Some(json!({"name": "app", "redirect_uris": ["https://example.com/cb"]})),
    )
    .await
    .json();
    let service = admin("GET", "/services/s".into(), None).await.json();
    let other = admin("GET", "/services/other".into(), None).await.json();
    let token = |access: &str, service: &Value, expires_in: u64| {
        json!({"credential": {"id": app["id"]}, "service": {"id": service["id"]}, "access_token": access,
               "expires_in": expires_in, "scope": "email profile", "authenticated_userid": "user-7"})
    };
    let r = admin(
        "POST",
        "/oauth2_tokens".into(),
        Some(token("tok-1", &service, 7200)),
    )
    .await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    assert_eq!(r.json()["token_type"], "bearer");
    // A token with a ttl: the answer shows the ttl as written, not the stored expiry.
    let mut with_ttl = token("tok-ttl", &service, 7200);
    with_ttl["ttl"] = json!(3600);
    let r = admin("POST", "/oauth2_tokens".into(), Some(with_ttl)).await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    assert_eq!(r.json()["ttl"], 3600);
    assert!(r.json().get("_expires_at").is_none(), "{}", r.json());
    // Kong's schema errors; nothing stored.
    let r = admin(
        "POST",
        "/oauth2_tokens".into(),
        Some(json!({"expires_in": 10})),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["fields"]["credential"], "required field missing");
    let r = admin(
        "POST",
        "/oauth2_tokens".into(),
        Some(token("tok-1", &service, 10)),
    )
    .await;
    assert_eq!(r.status, 409);

    let p = gw.proxy;
    assert!(
        eventually(Duration::from_secs(10), async || {
            call(p, "GET", "/o", &[("authorization", "Bearer tok-1")])
                .await
                .status
                == 200
        })
        .await
    );
    let r = call(
        p,
        "GET",
        "/o?a=1",
        &[
            ("authorization", "Bearer tok-1"),
            ("x-authenticated-scope", "admin"),
        ],
    )
    .await;
    let h = &r.json()["headers"];
    assert_eq!(h["x-consumer-username"], "owner");
    assert_eq!(h["x-consumer-custom-id"], "C-1");
    assert_eq!(h["x-credential-identifier"], app["client_id"]);
    assert_eq!(
        h["x-authenticated-scope"], "email profile",
        "the client's own is replaced"
    );
    assert_eq!(h["x-authenticated-userid"], "user-7");
    assert!(h["authorization"].is_null(), "hide_credentials");
    // The query argument; hidden from the upstream too.
    let r = call(p, "GET", "/o?access_token=tok-1&b=2", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["uri"], "/?b=2", "{:?}", r.json());

    // Kong's refusals.
    let r = call(p, "GET", "/o", &[]).await;
    assert_eq!(
        (r.status, r.json()),
        (
            401,
            json!({"error": "invalid_request", "error_description": "The access token is missing"})
        )
    );
    assert_eq!(
        r.header("www-authenticate"),
        Some("Bearer realm=\"service\"")
    );
    let invalid = json!({"error": "invalid_token", "error_description": "The access token is invalid or has expired"});
    for _ in 0..3 {
        let r = call(p, "GET", "/o", &[("authorization", "Bearer made-up")]).await;
        assert_eq!((r.status, r.json()), (401, invalid.clone()));
        assert_eq!(
            r.header("www-authenticate"),
            Some("Bearer realm=\"service\" error=\"invalid_token\" error_description=\"The access token is invalid or has expired\"")
        );
    }
    // A token for another service is refused, unless that plugin takes global credentials.
    let r = admin(
        "POST",
        "/oauth2_tokens".into(),
        Some(token("tok-other", &other, 7200)),
    )
    .await;
    assert_eq!(r.status, 201);
    let other_auth = [("authorization", "Bearer tok-other")];
    assert!(
        eventually(Duration::from_secs(10), async || call(
            p,
            "GET",
            "/other",
            &other_auth
        )
        .await
        .status
            == 200)
        .await
    );
    assert_eq!(call(p, "GET", "/o", &other_auth).await.json(), invalid);
    assert_eq!(
        call(p, "GET", "/other", &[("authorization", "Bearer tok-1")])
            .await
            .status,
        200
    );

    // A miss is remembered, but a token created afterwards works at once.
    assert_eq!(
        call(p, "GET", "/o", &[("authorization", "Bearer later")])
            .await
            .status,
        401
    );
    assert_eq!(
        admin(
            "POST",
            "/oauth2_tokens".into(),
            Some(token("later", &service, 7200))
        )
        .await
        .status,
        201
    );
    assert!(
        eventually(Duration::from_secs(10), async || {
            call(p, "GET", "/o", &[("authorization", "Bearer later")])
                .await
                .status
                == 200
        })
        .await
    );
    // Expired after expires_in; deleted tokens stop working.
    assert_eq!(
        admin(
            "POST",
            "/oauth2_tokens".into(),
            Some(token("short", &service, 1))
        )
        .await
        .status,
        201
    );
    assert!(
        eventually(Duration::from_secs(10), async || {
            call(p, "GET", "/o", &[("authorization", "Bearer short")])
                .await
                .status
                == 200
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(
        call(p, "GET", "/o", &[("authorization", "Bearer short")])
            .await
            .json(),
        invalid
    );
    assert_eq!(
        admin("DELETE", "/oauth2_tokens/tok-1".into(), None)
            .await
            .status,
        204
    );
    assert!(
        eventually(Duration::from_secs(10), async || {
            call(p, "GET", "/o", &[("authorization", "Bearer tok-1")])
                .await
                .status
                == 401
        })
        .await
    );
    // Deleting the application deletes its tokens.
    assert_eq!(
        admin(
            "DELETE",
            format!("/oauth2/{}", app["client_id"].as_str().unwrap()),
            None
        )
        .await
        .status,
        204
    );
    assert_eq!(
        admin("GET", "/oauth2_tokens".into(), None).await.json()["data"],
        json!([])
    );
}

#[tokio::test]
async fn oauth2_needs_a_database_and_a_grant() {
    let dir = tempfile::tempdir().unwrap();
    for (yaml, expect) in [
        (
            "plugins:\n- name: oauth2\n  config: {enable_client_credentials: true}\n",
            "not supported in DB-less mode",
        ),
        (
            "oauth2_tokens:\n- access_token: t\n  expires_in: 10\n",
            "kept in a database only",
        ),
    ] {
        let f = write(
            dir.path(),
            "k.yml",
            &format!("_format_version: '3.0'\n{yaml}"),
        );
        let (ok, out) = run(&["config", "parse", f.to_str().unwrap()], &[]);
        assert!(!ok && out.contains(expect), "{yaml}: {out}");
    }
    let gw = Gateway::sqlite().start();
    let r = gw
        .admin("POST", "/plugins", Some(json!({"name": "oauth2"})))
        .await;
    assert_eq!(r.status, 400);
    assert!(
        String::from_utf8_lossy(&r.body).contains("enable_client_credentials"),
        "{:?}",
        r.json()
    );
    let r = gw
        .admin(
            "POST",
            "/plugins",
            Some(json!({"name": "oauth2", "config": {"enable_implicit_grant": true}})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    let c = &r.json()["config"];
    assert_eq!(
        (c["token_expiration"].clone(), c["pkce"].clone()),
        (json!(7200), json!("lax"))
    );
    assert!(
        c["provision_key"].as_str().is_some_and(|k| k.len() == 32),
        "{c}"
    );
}
