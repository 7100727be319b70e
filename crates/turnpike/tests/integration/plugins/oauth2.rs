//! oauth2's token check on the real binary, on a database node: tokens written through
//! `POST /oauth2_tokens` (as the site in issue #24 wrote them) authenticate requests for their
//! service, with Kong's headers and errors; deleted or expired tokens stop working; misses are
//! remembered but a token created after one works at once. The endpoints
//! (`/oauth2/token`, `/oauth2/authorize`) issue tokens by every grant, as Kong's do.

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
    // A token with a ttl: the answer shows the whole seconds left (as Kong reads it back),
    // not the stored expiry.
    let mut with_ttl = token("tok-ttl", &service, 7200);
    with_ttl["ttl"] = json!(3600);
    let r = admin("POST", "/oauth2_tokens".into(), Some(with_ttl)).await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    let ttl = r.json()["ttl"].as_i64().unwrap();
    assert!((3590..=3600).contains(&ttl), "{ttl}");
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
    // As Kong's docs write it: a form, its numbers typed by the token's schema.
    let form = format!(
        "credential.id={}&service.id={}&access_token=tok-form&expires_in=7200&ttl=600&scope=email",
        app["id"].as_str().unwrap(),
        service["id"].as_str().unwrap()
    );
    let r = post_form(gw.admin, "/oauth2_tokens", &form, &[]).await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    assert_eq!(r.json()["expires_in"], json!(7200));
    let ttl = r.json()["ttl"].as_i64().unwrap();
    assert!((590..=600).contains(&ttl), "{ttl}");
    let r = post_form(
        gw.admin,
        "/oauth2_tokens",
        "credential.id=x&expires_in=soon",
        &[],
    )
    .await;
    assert_eq!(r.status, 400, "{:?}", r.json());
    assert_eq!(r.json()["fields"]["expires_in"], "expected an integer");
    // An application as a form: one redirect URI is a list of one, `hash_secret` a boolean.
    let r = post_form(
        gw.admin,
        "/consumers/owner/oauth2",
        "name=formapp&redirect_uris=https://example.com/f&hash_secret=true&client_secret=s3cret",
        &[],
    )
    .await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    assert_eq!(r.json()["redirect_uris"], json!(["https://example.com/f"]));
    assert_eq!(r.json()["hash_secret"], json!(true));
    assert_ne!(r.json()["client_secret"], "s3cret", "stored hashed");

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
    assert_eq!(
        call(p, "GET", "/o", &[("authorization", "Bearer tok-form")])
            .await
            .status,
        200
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
    // Kong 3.9 (`do_authentication`): a token issued for a service is valid on that service
    // only, even where the plugin takes global credentials.
    assert_eq!(
        call(p, "GET", "/other", &[("authorization", "Bearer tok-1")])
            .await
            .json(),
        invalid
    );
    // A global token (no service) works where the plugin takes global credentials; elsewhere
    // it is refused with Kong's own description and no challenge (`load_token`'s exit).
    let mut global = token("tok-global", &other, 7200);
    global.as_object_mut().unwrap().remove("service");
    let r = admin("POST", "/oauth2_tokens".into(), Some(global)).await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    let global_auth = [("authorization", "Bearer tok-global")];
    assert!(
        eventually(Duration::from_secs(10), async || call(
            p,
            "GET",
            "/other",
            &global_auth
        )
        .await
        .status
            == 200)
        .await
    );
    let r = call(p, "GET", "/o", &global_auth).await;
    assert_eq!(
        (r.status, r.json()),
        (
            401,
            json!({"error": "invalid_token", "error_description": "The access token is global, but the current plugin is configured without 'global_credentials'"})
        )
    );
    assert_eq!(r.header("www-authenticate"), None);

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
    // An explicit null is refused, as Kong refuses it: decK sends one for an auto field its
    // file leaves out, and a key drawn there would change on every sync.
    let schema = gw
        .admin("GET", "/schemas/plugins/oauth2", None)
        .await
        .json();
    let config = schema["fields"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|f| f.get("config"))
        .unwrap()["fields"]
        .clone();
    let key = config
        .as_array()
        .unwrap()
        .iter()
        .find_map(|f| f.get("provision_key"))
        .unwrap();
    assert_eq!(
        (&key["auto"], &key["required"]),
        (&json!(true), &json!(true))
    );
    let id = r.json()["id"].as_str().unwrap().to_string();
    for (method, path) in [
        ("POST", "/plugins".to_string()),
        ("PUT", format!("/plugins/{id}")),
    ] {
        let r = gw
            .admin(
                method,
                &path,
                Some(json!({"name": "oauth2", "config": {"enable_implicit_grant": true, "provision_key": null}})),
            )
            .await;
        assert_eq!(r.status, 400, "{method} {:?}", r.json());
        assert_eq!(
            r.json()["fields"]["config"]["provision_key"],
            "required field missing"
        );
    }
    // The stored key is as it was.
    let stored = gw
        .admin("GET", &format!("/plugins/{id}"), None)
        .await
        .json();
    assert_eq!(stored["config"]["provision_key"], c["provision_key"]);
}

/// A form POST to the proxy, as Kong's documented `curl --data` examples send it; over
/// plain HTTP from a trusted peer that says it terminated TLS.
async fn post_form(
    proxy: std::net::SocketAddr,
    path: &str,
    form: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let mut b = req("POST", path)
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-forwarded-proto", "https");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    send(
        proxy,
        b.body(http_body_util::Full::new(bytes::Bytes::from(
            form.to_string(),
        )))
        .unwrap(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoints_issue_tokens_by_every_grant() {
    use base64::Engine;
    let up = Upstream::start("oauth2-grants");
    let gw = Gateway::sqlite()
        .env("TURNPIKE_TRUSTED_IPS", "127.0.0.1")
        .start();
    let admin = |m: &'static str, p: String, b: Option<Value>| {
        let a = gw.admin;
        async move { admin_call(a, m, &p, b).await }
    };
    for (path, body) in [
        ("/services", json!({"name": "s", "url": up.url()})),
        (
            "/services/s/routes",
            json!({"name": "r", "paths": ["/api"]}),
        ),
        (
            "/services/s/plugins",
            json!({"name": "oauth2", "config": {
                "enable_authorization_code": true, "enable_implicit_grant": true,
                "enable_client_credentials": true, "enable_password_grant": true,
                "provision_key": "pk", "scopes": ["email", "profile"],
                "accept_http_if_already_terminated": true, "token_expiration": 600,
                "hide_credentials": true}}),
        ),
        ("/consumers", json!({"username": "owner"})),
        (
            "/consumers/owner/oauth2",
            json!({"name": "app", "client_id": "cid", "client_secret": "csecret",
                   "redirect_uris": ["https://app.test/cb?x=1"]}),
        ),
        (
            "/consumers/owner/oauth2",
            json!({"name": "spa", "client_id": "pub", "client_type": "public",
                   "redirect_uris": ["https://spa.test/cb"]}),
        ),
        (
            "/consumers/owner/oauth2",
            json!({"name": "hashed", "client_id": "hid", "client_secret": "s3cret",
                   "hash_secret": true, "redirect_uris": ["https://h.test/cb"]}),
        ),
    ] {
        let r = admin("POST", path.to_string(), Some(body)).await;
        assert_eq!(r.status, 201, "{path}: {:?}", r.json());
    }
    let p = gw.proxy;
    // The application is in the data plane's snapshot once the config syncs (a token, not any
    // 200: before the plugin arrives, the route's upstream answers 200 too).
    // The three applications land one change after another: wait for the last one too.
    let first = "grant_type=client_credentials&client_id=cid&client_secret=csecret&scope=email";
    let last = "grant_type=client_credentials&client_id=hid&client_secret=s3cret";
    assert!(
        eventually(Duration::from_secs(10), async || {
            let r = post_form(p, "/api/oauth2/token", first, &[]).await;
            let h = post_form(p, "/api/oauth2/token", last, &[]).await;
            r.status == 200 && r.json()["access_token"].is_string() && h.status == 200
        })
        .await
    );
    let works = async |token: &str| {
        let r = call(
            p,
            "GET",
            "/api/x",
            &[("authorization", &format!("Bearer {token}"))],
        )
        .await;
        (r.status, r.json())
    };

    // client_credentials, with the secret in the body: no refresh token.
    let r = post_form(p, "/api/oauth2/token", first, &[]).await;
    assert_eq!(r.header("cache-control"), Some("no-store"));
    assert_eq!(r.header("pragma"), Some("no-cache"));
    let t = r.json();
    assert_eq!(
        (t["token_type"].as_str(), t["expires_in"].as_u64()),
        (Some("bearer"), Some(600))
    );
    assert!(t["refresh_token"].is_null(), "{t}");
    let (status, seen) = works(t["access_token"].as_str().unwrap()).await;
    assert_eq!(status, 200);
    assert_eq!(seen["headers"]["x-authenticated-scope"], "email");
    assert_eq!(seen["headers"]["x-credential-identifier"], "cid");
    assert!(
        seen["headers"]["authorization"].is_null(),
        "hide_credentials"
    );
    assert_eq!(seen["headers"]["x-consumer-username"], "owner");
    // ... and with HTTP Basic; a wrong secret there is a 401 with Kong's challenge.
    let basic = |id: &str, secret: &str| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{id}:{secret}"))
        )
    };
    let r = post_form(
        p,
        "/api/oauth2/token",
        "grant_type=client_credentials",
        &[("authorization", &basic("cid", "csecret"))],
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let r = post_form(
        p,
        "/api/oauth2/token",
        "grant_type=client_credentials",
        &[("authorization", &basic("cid", "wrong"))],
    )
    .await;
    assert_eq!(
        (r.status, r.json()),
        (
            401,
            json!({"error": "invalid_client", "error_description": "Invalid client authentication"})
        )
    );
    assert_eq!(
        r.header("www-authenticate"),
        Some("Basic realm=\"OAuth2.0\"")
    );

    // password: the provision key and a user; a refresh token comes back.
    let r = post_form(p, "/api/oauth2/token",
        "grant_type=password&client_id=cid&client_secret=csecret&provision_key=pk&authenticated_userid=u-9&scope=profile&state=st",
        &[]).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let t = r.json();
    assert_eq!(t["state"], "st");
    let refresh = t["refresh_token"].as_str().unwrap().to_string();
    let (status, seen) = works(t["access_token"].as_str().unwrap()).await;
    assert_eq!(
        (status, &seen["headers"]["x-authenticated-userid"]),
        (200, &json!("u-9"))
    );

    // refresh_token: a new pair; the old access token and refresh token are gone.
    let r = post_form(
        p,
        "/api/oauth2/token",
        &format!(
            "grant_type=refresh_token&client_id=cid&client_secret=csecret&refresh_token={refresh}"
        ),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let t2 = r.json();
    assert_ne!(t2["refresh_token"], t["refresh_token"]);
    let (status, seen) = works(t2["access_token"].as_str().unwrap()).await;
    assert_eq!(
        (status, &seen["headers"]["x-authenticated-scope"]),
        (200, &json!("profile"))
    );
    assert!(
        eventually(Duration::from_secs(10), async || works(
            t["access_token"].as_str().unwrap()
        )
        .await
        .0 == 401)
        .await,
        "the refreshed token stops working"
    );
    let r = post_form(
        p,
        "/api/oauth2/token",
        &format!(
            "grant_type=refresh_token&client_id=cid&client_secret=csecret&refresh_token={refresh}"
        ),
        &[],
    )
    .await;
    assert_eq!(
        r.json(),
        json!({"error": "invalid_request", "error_description": "Invalid refresh_token"})
    );

    // authorization_code: authorize (a JSON body here), then exchange the code once.
    let r = send(
        p,
        req("POST", "/api/oauth2/authorize")
            .header("content-type", "application/json")
            .header("x-forwarded-proto", "https")
            .body(http_body_util::Full::new(bytes::Bytes::from(
                json!({
            "response_type": "code", "client_id": "cid", "provision_key": "pk",
            "authenticated_userid": "u-1", "scope": "email profile", "state": "xyz"})
                .to_string(),
            )))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let uri = r.json()["redirect_uri"].as_str().unwrap().to_string();
    let code = uri
        .split("code=")
        .nth(1)
        .unwrap()
        .split('&')
        .next()
        .unwrap()
        .to_string();
    assert_eq!(
        uri,
        format!("https://app.test/cb?code={code}&state=xyz&x=1")
    );
    let exchange =
        format!("grant_type=authorization_code&client_id=cid&client_secret=csecret&code={code}");
    let r = post_form(p, "/api/oauth2/token", &exchange, &[]).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let (status, seen) = works(r.json()["access_token"].as_str().unwrap()).await;
    assert_eq!(
        (status, &seen["headers"]["x-authenticated-userid"]),
        (200, &json!("u-1"))
    );
    assert_eq!(seen["headers"]["x-authenticated-scope"], "email profile");
    let r = post_form(p, "/api/oauth2/token", &exchange, &[]).await;
    assert_eq!(
        r.json(),
        json!({"error": "invalid_request", "error_description": "Invalid code"}),
        "a code works once"
    );

    // PKCE: a public client must send a challenge, then the verifier.
    let authorize = |extra: &str| {
        format!("response_type=code&client_id=pub&provision_key=pk&authenticated_userid=u-2{extra}")
    };
    let r = post_form(p, "/api/oauth2/authorize", &authorize(""), &[]).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["redirect_uri"], "https://spa.test/cb?error=invalid_request&error_description=code_challenge%20is%20required%20for%20public%20clients");
    let verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
    let r = post_form(p, "/api/oauth2/authorize",
        &authorize("&code_challenge=E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM&code_challenge_method=S256"), &[]).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let uri = r.json()["redirect_uri"].as_str().unwrap().to_string();
    let code = uri.split("code=").nth(1).unwrap().to_string();
    let r = post_form(
        p,
        "/api/oauth2/token",
        &format!("grant_type=authorization_code&client_id=pub&code={code}"),
        &[],
    )
    .await;
    assert_eq!(
        r.json()["error_description"],
        "code_verifier is required for PKCE authorization requests"
    );
    let r = post_form(
        p,
        "/api/oauth2/token",
        &format!(
            "grant_type=authorization_code&client_id=pub&code={code}&code_verifier={}",
            "x".repeat(43)
        ),
        &[],
    )
    .await;
    assert_eq!(
        r.json(),
        json!({"error": "invalid_grant", "error_description": "Invalid code"})
    );
    let r = post_form(
        p,
        "/api/oauth2/token",
        &format!(
            "grant_type=authorization_code&client_id=pub&code={code}&code_verifier={verifier}"
        ),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let r = post_form(
        p,
        "/api/oauth2/token",
        &format!("grant_type=authorization_code&client_id=pub&client_secret=s&code={code}"),
        &[],
    )
    .await;
    assert_eq!(
        r.json()["error_description"],
        "client_secret is disallowed for public clients"
    );

    // Implicit: the token in the redirect's fragment, never refreshable.
    let r = post_form(
        p,
        "/api/oauth2/authorize",
        "response_type=token&client_id=cid&provision_key=pk&authenticated_userid=u-3&state=s1",
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let uri = r.json()["redirect_uri"].as_str().unwrap().to_string();
    let (base, fragment) = uri.split_once('#').unwrap();
    assert_eq!(base, "https://app.test/cb?x=1");
    assert!(
        fragment.contains("token_type=bearer")
            && fragment.contains("state=s1")
            && !fragment.contains("refresh_token"),
        "{fragment}"
    );
    let token = fragment
        .split("access_token=")
        .nth(1)
        .unwrap()
        .split('&')
        .next()
        .unwrap();
    assert_eq!(works(token).await.0, 200);

    // Kong's refusals.
    let expect = |status: u16, error: &str, description: &str| {
        (
            status,
            json!({"error": error, "error_description": description}),
        )
    };
    for (form, want) in [
        ("grant_type=nope&client_id=cid&client_secret=csecret", expect(400, "unsupported_grant_type", "Invalid grant_type")),
        ("grant_type=client_credentials&client_id=cid&client_secret=csecret&scope=admin", expect(400, "invalid_scope", "\"admin\" is an invalid scope")),
        ("grant_type=client_credentials&client_id=cid&client_secret=csecret&authenticated_userid=u", expect(400, "invalid_provision_key", "Invalid provision_key")),
        ("grant_type=password&client_id=cid&client_secret=csecret&provision_key=pk", expect(400, "invalid_authenticated_userid", "Missing authenticated_userid parameter")),
        ("grant_type=password&client_id=nobody&client_secret=x&provision_key=pk&authenticated_userid=u", expect(400, "invalid_client", "Invalid client authentication")),
        ("grant_type=password&client_id=cid&client_secret=csecret&provision_key=pk&authenticated_userid=u&redirect_uri=https://evil.test", expect(400, "invalid_request", "Invalid redirect_uri that does not match with any redirect_uri created with the application")),
    ] {
        let r = post_form(p, "/api/oauth2/token", form, &[]).await;
        assert_eq!((r.status, r.json()), want, "{form}");
    }
    for (form, want) in [
        (
            "response_type=code&client_id=cid&provision_key=bad&authenticated_userid=u",
            expect(400, "invalid_provision_key", "Invalid provision_key"),
        ),
        (
            "response_type=code&client_id=cid&provision_key=pk&authenticated_userid=%20",
            expect(
                400,
                "invalid_authenticated_userid",
                "Missing authenticated_userid parameter",
            ),
        ),
        (
            "response_type=code&client_id=nobody&provision_key=pk&authenticated_userid=u",
            expect(400, "invalid_client", "Invalid client authentication"),
        ),
    ] {
        let r = post_form(p, "/api/oauth2/authorize", form, &[]).await;
        assert_eq!((r.status, r.json()), want, "{form}");
    }
    // Errors with a known application go back in its redirect_uri.
    let r = post_form(
        p,
        "/api/oauth2/authorize",
        "response_type=nope&client_id=cid&provision_key=pk&authenticated_userid=u&state=s",
        &[],
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["redirect_uri"], "https://app.test/cb?error=unsupported_response_type&error_description=Invalid%20response_type&state=s&x=1");
    let r = post_form(p, "/api/oauth2/authorize", "response_type=code&client_id=cid&provision_key=pk&authenticated_userid=u&code_challenge_method=S256", &[]).await;
    assert!(
        r.json()["redirect_uri"]
            .as_str()
            .unwrap()
            .contains("code_challenge%20is%20required%20when%20code_method%20is%20present"),
        "{:?}",
        r.json()
    );
    // A JSON scope that is not a string; two X-Forwarded-Proto headers.
    let r = send(p, req("POST", "/api/oauth2/token")
        .header("content-type", "application/json")
        .header("x-forwarded-proto", "https")
        .body(http_body_util::Full::new(bytes::Bytes::from(json!({"grant_type": "client_credentials", "client_id": "cid", "client_secret": "csecret", "scope": ["email"]}).to_string()))).unwrap()).await;
    assert_eq!(
        (r.status, r.json()),
        expect(400, "invalid_scope", "scope must be a string")
    );
    let r = post_form(
        p,
        "/api/oauth2/token",
        first,
        &[("x-forwarded-proto", "https")],
    )
    .await;
    assert_eq!(
        (r.status, r.json()),
        expect(
            400,
            "access_denied",
            "Only one X-Forwarded-Proto header allowed"
        )
    );

    // Plain HTTP without a terminating proxy's word; GET at an endpoint.
    let r = send(
        p,
        req("POST", "/api/oauth2/token")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(http_body_util::Full::new(bytes::Bytes::from(first)))
            .unwrap(),
    )
    .await;
    assert_eq!(
        (r.status, r.json()),
        expect(400, "access_denied", "You must use HTTPS")
    );
    let r = call(p, "GET", "/api/oauth2/token", &[]).await;
    assert_eq!(
        (r.status, r.json()),
        expect(
            405,
            "invalid_method",
            "The HTTP method GET is invalid for the token endpoint"
        )
    );
    let r = call(p, "PUT", "/api/oauth2/authorize", &[]).await;
    assert_eq!(
        r.json()["error_description"],
        "The HTTP method PUT is invalid for the authorization endpoint"
    );
    // hash_secret: stored as an argon2id hash, verified against it.
    let apps = admin("GET", "/oauth2?size=10".into(), None).await.json();
    let hashed = apps["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["client_id"] == "hid")
        .unwrap()
        .clone();
    assert!(
        hashed["client_secret"]
            .as_str()
            .unwrap()
            .starts_with("$argon2id$"),
        "{hashed}"
    );
    assert_eq!(hashed["client_type"], "confidential", "Kong's default");
    let r = post_form(
        p,
        "/api/oauth2/token",
        "grant_type=client_credentials&client_id=hid&client_secret=s3cret",
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let hashed_token = r.json()["access_token"].as_str().unwrap().to_string();
    let r = post_form(
        p,
        "/api/oauth2/token",
        "grant_type=client_credentials&client_id=hid&client_secret=nope",
        &[],
    )
    .await;
    assert_eq!(r.status, 400);
    // A token in a form body (Kong's `retrieve_parameters`), taken out before the upstream
    // (hide_credentials).
    let r = send(
        p,
        req("POST", "/api/x")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(http_body_util::Full::new(bytes::Bytes::from(format!(
                "access_token={hashed_token}&a=1"
            ))))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    assert_eq!(r.json()["body_len"], 3, "the upstream got `a=1`");
    assert_eq!(r.json()["headers"]["content-length"], "3");

    // The endpoints never reach the upstream, and tokens are in the store.
    let tokens = admin("GET", "/oauth2_tokens".into(), None).await.json();
    assert!(tokens["data"].as_array().unwrap().len() >= 5, "{tokens}");
}

/// Rows of `oauth2_tokens` as the database holds them (expired ones included).
fn stored_tokens(sql_count: &dyn Fn(&str) -> String) -> i64 {
    sql_count("SELECT COUNT(*) FROM oauth2_tokens")
        .trim()
        .parse()
        .unwrap()
}

/// Writes an application, then tokens: `live` without a ttl and `expiring` with `ttl: 1`.
async fn write_tokens(admin: std::net::SocketAddr, live: usize, expiring: usize) {
    for (path, body) in [
        ("/consumers", json!({"username": "owner"})),
        (
            "/consumers/owner/oauth2",
            json!({"name": "app", "client_id": "cid"}),
        ),
    ] {
        let r = admin_call(admin, "POST", path, Some(body)).await;
        assert_eq!(r.status, 201, "{path}: {:?}", r.json());
    }
    let app = admin_call(admin, "GET", "/oauth2/cid", None).await.json();
    for i in 0..live + expiring {
        let mut t = json!({"credential": {"id": app["id"]}, "expires_in": 10, "tags": ["batch"]});
        if i >= live {
            t["ttl"] = json!(1);
        }
        let r = admin_call(admin, "POST", "/oauth2_tokens", Some(t)).await;
        assert_eq!(r.status, 201, "{:?}", r.json());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_tokens_leave_the_store_on_sqlite_and_postgres() {
    // SQLite: the node's own file.
    let gw = Gateway::sqlite()
        .env("TURNPIKE_TTL_CLEANUP_INTERVAL", "0.5")
        .start();
    let db = gw.dir.path().join("prefix/turnpike.db");
    let sqlite = |sql: &str| {
        let out = std::process::Command::new("sqlite3")
            .arg(&db)
            .arg(sql)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    write_tokens(gw.admin, 2, 5).await;
    // The expiry is a column the purge finds by index: set on the five with a ttl (some may
    // already be purged on a slow machine: a one-second ttl), unset on the two without.
    assert_eq!(
        sqlite("SELECT COUNT(*) FROM oauth2_tokens WHERE expires_at IS NULL").trim(),
        "2",
    );
    assert!(
        sqlite("SELECT COUNT(*) FROM oauth2_tokens WHERE expires_at IS NOT NULL")
            .trim()
            .parse::<u32>()
            .unwrap()
            <= 5
    );
    assert!(
        eventually(Duration::from_secs(10), async || stored_tokens(&sqlite)
            == 2)
        .await,
        "the 5 expired rows are deleted, the 2 live ones stay"
    );
    assert!(
        eventually(Duration::from_secs(10), async || sqlite(
            "SELECT COUNT(*) FROM tags WHERE entity_name = 'oauth2_tokens'"
        )
        .trim()
            == "2")
        .await,
        "their tags go with them"
    );

    // A store made before schema 5 (no expires_at column): `migrations up` adds it, filled
    // from each row's stored expiry.
    drop(gw);
    let gw = Gateway::sqlite()
        .env("TURNPIKE_TTL_CLEANUP_INTERVAL", "3600")
        .start();
    let db2 = gw.dir.path().join("prefix/turnpike.db");
    let sqlite2 = |sql: &str| {
        let out = std::process::Command::new("sqlite3")
            .arg(&db2)
            .arg(sql)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    write_tokens(gw.admin, 1, 2).await;
    let prefix = gw.dir.path().join("prefix");
    gw.signal("TERM");
    assert!(
        eventually(Duration::from_secs(10), async || {
            std::net::TcpStream::connect(gw.admin).is_err()
        })
        .await
    );
    sqlite2("DROP INDEX oauth2_tokens_expires_at; ALTER TABLE oauth2_tokens DROP COLUMN expires_at; UPDATE turnpike_meta SET value = 4 WHERE name = 'schema_version';");
    let env = [
        ("TURNPIKE_DATABASE", "sqlite"),
        ("TURNPIKE_PREFIX", prefix.to_str().unwrap()),
    ];
    let (ok, out) = run(&["migrations", "up"], &env);
    assert!(ok && out.contains("schema version 6"), "{out}");
    assert_eq!(
        sqlite2("SELECT COUNT(*) FROM oauth2_tokens WHERE expires_at IS NOT NULL").trim(),
        "2"
    );

    // PostgreSQL.
    let pg = crate::common::pg::Postgres::start();
    let env: Vec<(&str, String)> = pg.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (ok, out) = run(&["migrations", "bootstrap"], &env);
    assert!(ok, "{out}");
    let mut b = Gateway::with_config("_format_version: \"3.0\"\n")
        .env("TURNPIKE_TTL_CLEANUP_INTERVAL", "0.5");
    for (k, v) in &env {
        b = b.env(k, v);
    }
    let gw = b.start();
    let port = pg.port.to_string();
    let psql = |sql: &str| {
        let out = std::process::Command::new("psql")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "kong",
                "-d",
                "postgres",
                "-tAc",
                sql,
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    write_tokens(gw.admin, 3, 4).await;
    assert!(
        eventually(Duration::from_secs(10), async || stored_tokens(&psql) == 3).await,
        "{}",
        psql("SELECT COUNT(*) FROM oauth2_tokens")
    );
}
