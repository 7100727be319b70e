//! session on the real binary, set up as Kong's documentation sets it up: key-auth with an
//! anonymous consumer that request-termination turns away, and the session plugin that keeps
//! a signed-in consumer signed in by cookie. Cookies are checked for their attributes, forgery,
//! timeouts, logout (query and form body) and the session headers.

use serde_json::json;

use crate::common::*;

/// The `name=value` of the Set-Cookie for `name`, and the whole header.
fn set_cookie(r: &Reply, name: &str) -> Option<(String, String)> {
    r.headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with(&format!("{name}=")))
        .map(|v| (v.split(';').next().unwrap().to_string(), v.to_string()))
}

#[tokio::test]
async fn session_keeps_a_consumer_signed_in_as_kong_documents() {
    let up = Upstream::start("session");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
consumers:
- username: alice
  custom_id: A-1
  keyauth_credentials:
  - id: 3bd1b8b5-0b5b-4ab5-8d3c-8d7b0e8f6d1a
    key: alice-key
- username: anonymous
  plugins:
  - name: request-termination
    config: {{status_code: 403, message: "So long and thanks for all the fish!"}}
services:
- name: svc
  url: {url}
  routes:
  - name: app
    paths: [/app]
    plugins:
    - name: session
      config: {{secret: "opensesame", response_headers: [audience, timeout], request_headers: [id]}}
    - name: key-auth
      config: {{anonymous: anonymous}}
  - name: short
    paths: [/short]
    plugins:
    - name: session
      config: {{secret: "opensesame", absolute_timeout: 1, cookie_name: short, cookie_secure: false, cookie_same_site: Lax, read_body_for_logout: true}}
    - name: key-auth
      config: {{anonymous: anonymous}}
"#,
        url = up.url()
    ))
    .start();
    let p = gw.proxy;

    // Signed in with the key: the session cookie comes back.
    let r = call(p, "GET", "/app", &[("apikey", "alice-key")]).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let (cookie, header) = set_cookie(&r, "session").expect("a session cookie");
    assert!(
        // lua-resty-session's attributes, in its order.
        header.ends_with("; Path=/; SameSite=Strict; Secure; HttpOnly"),
        "{header}"
    );
    // Kong's anonymous consumer is turned away without a key or a session.
    let r = call(p, "GET", "/app", &[]).await;
    assert_eq!(
        (r.status, r.json()),
        (
            403,
            json!({"message": "So long and thanks for all the fish!"})
        )
    );
    assert!(
        set_cookie(&r, "session").is_none(),
        "no session for the anonymous"
    );

    // The cookie alone signs alice in, with the credential that made the session.
    let r = call(
        p,
        "GET",
        "/app",
        &[("cookie", &format!("theme=dark; {cookie}"))],
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let h = &r.json()["headers"];
    assert_eq!(h["x-consumer-username"], "alice");
    assert_eq!(h["x-consumer-custom-id"], "A-1");
    assert_eq!(
        h["x-credential-identifier"],
        "3bd1b8b5-0b5b-4ab5-8d3c-8d7b0e8f6d1a"
    );
    assert!(h["x-anonymous-consumer"].is_null());
    assert!(h["session-id"].is_string(), "{h}");
    assert_eq!(r.header("session-audience"), Some("default"));
    let timeout: u64 = r.header("session-timeout").unwrap().parse().unwrap();
    assert!(timeout <= 900 && timeout > 800, "{timeout}");
    assert!(
        set_cookie(&r, "session").is_none(),
        "not renewed on every request"
    );

    // Forged, truncated or foreign cookies sign nobody in.
    let value = cookie.split_once('=').unwrap().1.to_string();
    let mut forged = value.clone().into_bytes();
    let mid = forged.len() / 2;
    forged[mid] = if forged[mid] == b'A' { b'B' } else { b'A' };
    for bad in [
        format!("session={}", String::from_utf8(forged).unwrap()),
        format!("session={}", &value[..value.len() - 4]),
        "session=".to_string(),
        format!("short={value}"),
    ] {
        let r = call(p, "GET", "/app", &[("cookie", &bad)]).await;
        assert_eq!(r.status, 403, "{bad}");
    }

    // Logout: one of logout_methods with the query argument clears the cookie.
    let r = call(
        p,
        "DELETE",
        "/app?session_logout=true",
        &[("cookie", &cookie)],
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.body.is_empty());
    let (cleared, header) = set_cookie(&r, "session").unwrap();
    assert_eq!(cleared, "session=");
    assert!(header.contains("Max-Age=0"), "{header}");
    // GET is not a logout method by default: the request goes through.
    let r = call(p, "GET", "/app?session_logout=true", &[("cookie", &cookie)]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["headers"]["x-consumer-username"], "alice");

    // absolute_timeout, other cookie attributes, and logout by form body.
    let r = call(p, "GET", "/short", &[("apikey", "alice-key")]).await;
    let (short, header) = set_cookie(&r, "short").unwrap();
    assert!(
        header.ends_with("; Path=/; SameSite=Lax; HttpOnly"),
        "{header}"
    );
    let logout = send(
        p,
        req("POST", "/short")
            .header("cookie", &short)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(http_body_util::Full::new(bytes::Bytes::from_static(
                b"a=1&session_logout=yes",
            )))
            .unwrap(),
    )
    .await;
    assert_eq!(logout.status, 200);
    assert!(set_cookie(&logout, "short")
        .unwrap()
        .1
        .contains("Max-Age=0"));
    assert_eq!(
        call(p, "GET", "/short", &[("cookie", &short)]).await.status,
        200
    );
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    assert_eq!(
        call(p, "GET", "/short", &[("cookie", &short)]).await.status,
        403
    );
}

#[tokio::test]
async fn session_configs_through_the_admin_api() {
    let gw = Gateway::sqlite().start();
    let r = gw
        .admin(
            "POST",
            "/plugins",
            Some(json!({"name": "session", "config": {"cookie_lifetime": 120, "cookie_samesite": "off"}})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    let c = &r.json()["config"];
    // A random secret when none is given; Kong's deprecated names moved into place.
    assert!(c["secret"].as_str().is_some_and(|s| s.len() >= 40), "{c}");
    assert_eq!(c["rolling_timeout"], 120);
    assert_eq!(c["cookie_same_site"], "Lax");
    assert_eq!(c["logout_methods"], json!(["POST", "DELETE"]));
    let r = gw
        .admin(
            "POST",
            "/routes",
            Some(json!({"name": "r", "paths": ["/r"]})),
        )
        .await;
    assert_eq!(r.status, 201);
    for (config, field) in [
        (json!({"cookie_same_site": "Sometimes"}), "cookie_same_site"),
        (json!({"logout_methods": ["PUT"]}), "logout_methods"),
    ] {
        let r = gw
            .admin(
                "POST",
                "/routes/r/plugins",
                Some(json!({"name": "session", "config": config})),
            )
            .await;
        assert_eq!(r.status, 400, "{config}");
        assert!(
            !r.json()["fields"]["config"][field].is_null(),
            "{}",
            r.json()
        );
    }
}

/// The Kong-made cookies of `session/testdata/kong-cookies.json` (lua-resty-session 4.0.5
/// itself made them, in 2023: the plugins below turn the timeouts off to open them today).
fn kong_vectors() -> serde_json::Value {
    serde_json::from_str(include_str!(
        "../../../../turnpike-plugins/src/session/testdata/kong-cookies.json"
    ))
    .unwrap()
}

fn cookie_of(set_cookie: &serde_json::Value) -> String {
    set_cookie
        .as_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string()
}

const ALICE: &str = "8a2e8e4d-3b1f-4a5e-9c3d-0f1e2d3c4b5a";
const ALICE_KEY: &str = "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f";

fn kong_site(url: &str, storage: &str) -> String {
    format!(
        r#"_format_version: "3.0"
consumers:
- id: {ALICE}
  username: alice
  keyauth_credentials:
  - id: {ALICE_KEY}
    key: alice-key
- username: anonymous
  plugins:
  - name: request-termination
    config: {{status_code: 403}}
services:
- name: svc
  url: {url}
  routes:
  - name: app
    paths: [/app]
    plugins:
    - name: session
      config: {{secret: kong-session-secret, storage: {storage}, idling_timeout: 0, rolling_timeout: 0, absolute_timeout: 0, response_headers: [id, subject]}}
    - name: key-auth
      config: {{anonymous: anonymous}}
"#
    )
}

/// A user signed in on Kong stays signed in after the switch: the session cookie Kong made
/// opens here, for the consumer and credential it names.
#[tokio::test]
async fn sessions_made_by_kong_keep_working() {
    let v = kong_vectors();
    let up = Upstream::start("kong-sessions");
    let gw = Gateway::with_config(&kong_site(&up.url(), "cookie")).start();
    let cookie = cookie_of(&v["cases"][0]["set_cookie"]);
    let r = call(gw.proxy, "GET", "/app", &[("cookie", &cookie)]).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let h = &r.json()["headers"];
    assert_eq!(h["x-consumer-username"], "alice");
    assert_eq!(h["x-credential-identifier"], ALICE_KEY);
    assert_eq!(r.header("session-subject"), Some("alice"));
    assert_eq!(
        r.header("session-id"),
        Some("AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA")
    );
    // Another audience's cookie (Kong's `audience`) is no session here.
    let other = cookie_of(&v["cases"][1]["set_cookie"]).replace("portal_session=", "session=");
    assert_eq!(
        call(gw.proxy, "GET", "/app", &[("cookie", &other)])
            .await
            .status,
        403
    );
    // A session Kong deflated and split into three cookies (160 authenticated groups): the
    // chunks put together, inflated, and the groups given to the upstream as Kong does.
    let chunked = &v["cases"][6];
    assert_eq!(chunked["name"], "deflated and chunked");
    let cookies: Vec<String> = chunked["set_cookie"]
        .as_array()
        .unwrap()
        .iter()
        .map(cookie_of)
        .collect();
    assert_eq!(cookies.len(), 3);
    let r = call(gw.proxy, "GET", "/app", &[("cookie", &cookies.join("; "))]).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let groups: Vec<&str> = chunked["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_str().unwrap())
        .collect();
    let h = &r.json()["headers"];
    assert_eq!(h["x-consumer-username"], "alice");
    assert_eq!(h["x-authenticated-groups"], groups.join(", ").as_str());
    // Without its last chunk it is no session.
    let r = call(
        gw.proxy,
        "GET",
        "/app",
        &[("cookie", &cookies[..2].join("; "))],
    )
    .await;
    assert_eq!(r.status, 403);
    // And one made here is the same kind of cookie: 110 characters of header, then the payload.
    let r = call(gw.proxy, "GET", "/app", &[("apikey", "alice-key")]).await;
    let (made, _) = set_cookie(&r, "session").unwrap();
    assert!(made.len() > "session=".len() + 110, "{made}");
    assert!(made["session=".len()..].starts_with("AQAA"), "{made}");
}

/// `storage = kong`: the session in the database (Kong's `sessions` entity), the cookie holds
/// its header; a session Kong stored opens too; logout deletes the row.
#[tokio::test]
async fn sessions_kept_in_the_database() {
    let v = kong_vectors();
    let up = Upstream::start("stored-sessions");
    let gw = Gateway::sqlite().start();
    // A database node takes the same entities through the Admin API.
    for (path, body) in [
        ("/consumers", json!({"id": ALICE, "username": "alice"})),
        (
            "/consumers/alice/key-auth",
            json!({"id": ALICE_KEY, "key": "alice-key"}),
        ),
        ("/consumers", json!({"username": "anonymous"})),
        (
            "/consumers/anonymous/plugins",
            json!({"name": "request-termination", "config": {"status_code": 403}}),
        ),
        ("/services", json!({"name": "svc", "url": up.url()})),
        (
            "/services/svc/routes",
            json!({"name": "app", "paths": ["/app"]}),
        ),
        (
            "/routes/app/plugins",
            json!({"name": "session", "config": {"secret": "kong-session-secret", "storage": "kong",
                "idling_timeout": 0, "rolling_timeout": 0, "absolute_timeout": 0,
                "response_headers": ["id"]}}),
        ),
        (
            "/routes/app/plugins",
            json!({"name": "key-auth", "config": {"anonymous": "anonymous"}}),
        ),
    ] {
        let r = gw.admin("POST", path, Some(body)).await;
        assert_eq!(r.status, 201, "{path}: {:?}", r.json());
    }
    until_status(gw.proxy, "/app", 403).await;
    let r = call(gw.proxy, "GET", "/app", &[("apikey", "alice-key")]).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let (cookie, _) = set_cookie(&r, "session").unwrap();
    assert_eq!(
        cookie.len(),
        "session=".len() + 110,
        "the header alone: {cookie}"
    );
    let id = r.header("session-id").unwrap().to_string();
    // Stored in the background, as Kong's header_filter does.
    let mut row = serde_json::Value::Null;
    for _ in 0..50 {
        let got = gw.admin("GET", &format!("/sessions/{id}"), None).await;
        if got.status == 200 {
            row = got.json();
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(row["session_id"], id.as_str(), "{row} {}", gw.log_text());
    let data: serde_json::Value = serde_json::from_str(row["data"].as_str().unwrap()).unwrap();
    assert!(data[0].as_str().is_some_and(|p| p.len() > 100), "{row}");
    assert!(row["ttl"].as_i64().is_some(), "{row}");
    let r = call(gw.proxy, "GET", "/app", &[("cookie", &cookie)]).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    assert_eq!(r.json()["headers"]["x-consumer-username"], "alice");

    // A session Kong stored (its row as Kong's storage writes it), under Kong's cookie.
    let kong = &v["cases"][2];
    let (key, stored) = kong["stored"].as_object().unwrap().iter().next().unwrap();
    let r = gw
        .admin(
            "POST",
            "/sessions",
            Some(json!({"session_id": key, "data": stored["value"]})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    let kong_cookie = cookie_of(&kong["set_cookie"]);
    let r = call(gw.proxy, "GET", "/app", &[("cookie", &kong_cookie)]).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    assert_eq!(r.json()["headers"]["x-credential-identifier"], ALICE_KEY);

    // Logout: the row goes, and the cookie opens nothing after.
    let r = call(
        gw.proxy,
        "POST",
        "/app?session_logout=1",
        &[("cookie", &cookie)],
    )
    .await;
    assert_eq!(r.status, 200);
    let mut gone = false;
    for _ in 0..50 {
        if gw
            .admin("GET", &format!("/sessions/{id}"), None)
            .await
            .status
            == 404
        {
            gone = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(gone, "the session's row is still there");
    let r = call(gw.proxy, "GET", "/app", &[("cookie", &cookie)]).await;
    assert_eq!(r.status, 403);
}

/// DB-less nodes have no database to keep sessions in: `storage = kong` is refused there,
/// with the reason.
#[tokio::test]
async fn kong_storage_needs_a_database() {
    let up = Upstream::start("dbless-sessions");
    let gw = Gateway::with_config(&kong_site(&up.url(), "cookie")).start();
    let r = gw
        .admin(
            "POST",
            "/config",
            Some(json!({"config": kong_site(&up.url(), "kong")})),
        )
        .await;
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert!(
        r.json()
            .to_string()
            .contains("not available in DB-less mode"),
        "{}",
        r.json()
    );
}

/// Authenticated groups (Kong's `ngx.ctx.authenticated_groups`, here set by Lua code as a
/// custom auth plugin would) are kept in the session, restored from it on later requests for
/// acl and the upstream; a session too big for one cookie is deflated and split into
/// `session`, `session2`, ... as lua-resty-session does, and a logout clears every chunk.
#[tokio::test]
async fn authenticated_groups_live_in_the_session_and_big_sessions_are_chunked() {
    let up = Upstream::start("session-groups");
    let groups_code = "if kong.request.get_header('apikey') then \
        local g = {'admins'} \
        for i = 1, 600 do g[#g + 1] = string.format('%08x%08x', (i * 2654435761) % 4294967296, (i * 2246822519 + 7) % 4294967296) end \
        ngx.ctx.authenticated_groups = g end";
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
consumers:
- username: alice
  keyauth_credentials:
  - key: alice-key
  acls:
  - group: users
- username: anonymous
  plugins:
  - name: request-termination
    config: {{status_code: 403, message: anonymous}}
services:
- name: svc
  url: {url}
  routes:
  - name: admins
    paths: [/admins]
    plugins:
    - name: pre-function
      config: {{access: ["{groups_code}"]}}
    - name: session
      config: {{secret: s3cr3t, cookie_secure: false}}
    - name: key-auth
      config: {{anonymous: anonymous}}
    - name: acl
      config: {{allow: [admins], always_use_authenticated_groups: true}}
  - name: ops
    paths: [/ops]
    plugins:
    - name: session
      config: {{secret: s3cr3t, cookie_secure: false}}
    - name: key-auth
      config: {{anonymous: anonymous}}
    - name: acl
      config: {{allow: [ops], always_use_authenticated_groups: true}}
  - name: users
    paths: [/users]
    plugins:
    - name: session
      config: {{secret: s3cr3t, cookie_secure: false}}
    - name: key-auth
      config: {{anonymous: anonymous}}
    - name: acl
      config: {{allow: [users]}}
"#,
        url = up.url()
    ))
    .start();
    let p = gw.proxy;

    // Signed in with the key; acl takes the groups the Lua code set (always_use...).
    let r = call(p, "GET", "/admins", &[("apikey", "alice-key")]).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let sent = r.json()["headers"]["x-authenticated-groups"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(sent.starts_with("admins, "), "{sent}");
    assert_eq!(sent.split(", ").count(), 601);
    // The session: past 4 KiB even deflated, so split, each cookie within 4 KiB.
    let chunks: Vec<String> = r
        .headers
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    let names: Vec<&str> = chunks
        .iter()
        .map(|c| c.split('=').next().unwrap())
        .collect();
    assert!(names.len() >= 2, "{names:?}");
    for (i, n) in names.iter().enumerate() {
        let want = if i == 0 {
            "session".to_string()
        } else {
            format!("session{}", i + 1)
        };
        assert_eq!(*n, want);
    }
    for c in &chunks {
        let (pair, attrs) = c.split_once(';').unwrap();
        assert!(pair.len() <= 4096, "{}", pair.len());
        assert_eq!(attrs, " Path=/; SameSite=Strict; HttpOnly");
    }
    // Deflated: lua-resty-session's flag (0x0010) in the header.
    let first = chunks[0].split(';').next().unwrap()["session=".len()..].to_string();
    assert!(first.starts_with("ARAA"), "{}", &first[..8]);
    let jar: Vec<&str> = chunks
        .iter()
        .map(|c| c.split(';').next().unwrap())
        .collect();
    let jar = jar.join("; ");

    // The cookie alone: the groups come back from the session, for acl and the upstream.
    let r = call(p, "GET", "/admins", &[("cookie", &jar)]).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    assert_eq!(r.json()["headers"]["x-authenticated-groups"], sent.as_str());
    assert_eq!(r.json()["headers"]["x-consumer-username"], "alice");
    // ... and they decide on a route that wants a group they do not hold.
    let r = call(p, "GET", "/ops", &[("cookie", &jar)]).await;
    assert_eq!(
        (r.status, r.json()),
        (403, json!({"message": "You cannot consume this service"}))
    );
    // Without always_use_authenticated_groups, the consumer's own groups decide.
    let r = call(p, "GET", "/users", &[("cookie", &jar)]).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    assert_eq!(r.json()["headers"]["x-consumer-groups"], "users");
    // A client's own X-Authenticated-Groups is not believed.
    let r = call(
        p,
        "GET",
        "/ops",
        &[("apikey", "alice-key"), ("x-authenticated-groups", "ops")],
    )
    .await;
    assert_eq!(r.status, 403);

    // Logout clears the session's every cookie.
    let r = call(
        p,
        "DELETE",
        "/admins?session_logout=true",
        &[("cookie", &jar)],
    )
    .await;
    assert_eq!(r.status, 200);
    let cleared: Vec<String> = r
        .headers
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_string())
        .collect();
    let want: Vec<String> = names.iter().map(|n| format!("{n}=")).collect();
    assert_eq!(cleared, want);
}
