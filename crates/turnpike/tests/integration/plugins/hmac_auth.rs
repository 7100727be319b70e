//! hmac-auth on the real binary: requests signed as Kong's documentation signs them (openssl
//! on the command line, and here in the test), every refusal with Kong's status and message,
//! body digests, anonymous, and credentials through the declarative file and the Admin API.

use std::process::{Command, Stdio};

use aws_lc_rs::{digest, hmac};
use base64::Engine;
use serde_json::json;

use crate::common::*;

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

fn http_date(offset: i64) -> String {
    let t = std::time::SystemTime::now() + std::time::Duration::from_secs(offset.max(0) as u64)
        - std::time::Duration::from_secs((-offset).max(0) as u64);
    httpdate::fmt_http_date(t)
}

fn sign(alg: hmac::Algorithm, secret: &str, signing: &str) -> String {
    b64(hmac::sign(&hmac::Key::new(alg, secret.as_bytes()), signing.as_bytes()).as_ref())
}

fn header(user: &str, alg: &str, headers: &str, sig: &str) -> String {
    format!(
        "hmac username=\"{user}\", algorithm=\"{alg}\", headers=\"{headers}\", signature=\"{sig}\""
    )
}

#[tokio::test]
async fn hmac_auth_behaves_like_kong() {
    let up = Upstream::start("hmac");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
consumers:
- username: alice
  custom_id: A-1
  hmacauth_credentials:
  - username: alice-hmac
    secret: s3cret
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
    - name: hmac-auth
  - name: strict
    paths: [/strict]
    plugins:
    - name: hmac-auth
      config: {{enforce_headers: [date, request-line], algorithms: [hmac-sha256], hide_credentials: true, clock_skew: 30, realm: api}}
  - name: body
    paths: [/body]
    plugins:
    - name: hmac-auth
      config: {{validate_request_body: true}}
  - name: either
    paths: [/either]
    plugins:
    - name: key-auth
      config: {{anonymous: guest}}
    - name: hmac-auth
      config: {{anonymous: guest}}
"#,
        url = up.url()
    ))
    .start();
    let p = gw.proxy;
    let date = http_date(0);

    // Kong's documented example: date only, hmac-sha1.
    let sig = sign(
        hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
        "s3cret",
        &format!("date: {date}"),
    );
    let auth = header("alice-hmac", "hmac-sha1", "date", &sig);
    let r = call(
        p,
        "GET",
        "/plain",
        &[("date", &date), ("authorization", &auth)],
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let h = &r.json()["headers"];
    assert_eq!(h["x-consumer-username"], "alice");
    assert_eq!(h["x-consumer-custom-id"], "A-1");
    assert_eq!(h["x-credential-identifier"], "alice-hmac");
    assert_eq!(h["authorization"], auth.as_str());
    // Proxy-Authorization works too, and X-Date may stand in for Date.
    let sig = sign(hmac::HMAC_SHA256, "s3cret", &format!("x-date: {date}"));
    let auth2 = header("alice-hmac", "hmac-sha256", "x-date", &sig);
    let r = call(
        p,
        "GET",
        "/plain",
        &[("x-date", &date), ("proxy-authorization", &auth2)],
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.json());

    // The request line, with the query as sent, and every algorithm.
    for (alg, name) in [
        (hmac::HMAC_SHA256, "hmac-sha256"),
        (hmac::HMAC_SHA384, "hmac-sha384"),
        (hmac::HMAC_SHA512, "hmac-sha512"),
    ] {
        let signing = format!("date: {date}\nGET /plain?a=1&b=%20 HTTP/1.1\nx-custom:");
        let auth = header(
            "alice-hmac",
            name,
            "date request-line x-custom",
            &sign(alg, "s3cret", &signing),
        );
        let r = call(
            p,
            "GET",
            "/plain?a=1&b=%20",
            &[("date", &date), ("authorization", &auth)],
        )
        .await;
        assert_eq!(r.status, 200, "{name}: {:?}", r.json());
    }

    // Kong's refusals.
    let unauthorized = |m: &str| json!({ "message": m });
    let r = call(p, "GET", "/plain", &[("date", &date)]).await;
    assert_eq!((r.status, r.json()), (401, unauthorized("Unauthorized")));
    assert_eq!(r.header("www-authenticate"), Some("hmac"));
    let old = http_date(-1000);
    let sig_old = sign(hmac::HMAC_SHA256, "s3cret", &format!("date: {old}"));
    let no_date = "HMAC signature cannot be verified, a valid date or x-date header is required for HMAC Authentication";
    for headers in [
        vec![("authorization", auth.clone())],
        vec![
            ("date", "yesterday".to_string()),
            ("authorization", auth.clone()),
        ],
        vec![
            ("date", old.clone()),
            (
                "authorization",
                header("alice-hmac", "hmac-sha256", "date", &sig_old),
            ),
        ],
    ] {
        let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let r = call(p, "GET", "/plain", &h).await;
        assert_eq!(
            (r.status, r.json()),
            (401, unauthorized(no_date)),
            "{headers:?}"
        );
    }
    for (auth, message) in [
        ("Basic abc".to_string(), "HMAC signature cannot be verified"),
        (
            header("nobody", "hmac-sha1", "date", &sig),
            "HMAC signature cannot be verified",
        ),
        (
            header("alice-hmac", "hmac-md5", "date", &sig),
            "HMAC signature cannot be verified",
        ),
        (
            header("alice-hmac", "hmac-sha256", "date", &sig),
            "HMAC signature does not match",
        ),
        (
            header("alice-hmac", "hmac-sha1", "date", "!!!"),
            "HMAC signature does not match",
        ),
    ] {
        let r = call(
            p,
            "GET",
            "/plain",
            &[("date", &date), ("authorization", &auth)],
        )
        .await;
        assert_eq!((r.status, r.json()), (401, unauthorized(message)), "{auth}");
    }

    // enforce_headers, algorithms, hide_credentials, realm.
    let signing = format!("date: {date}\nGET /strict HTTP/1.1");
    let good = header(
        "alice-hmac",
        "hmac-sha256",
        "date request-line",
        &sign(hmac::HMAC_SHA256, "s3cret", &signing),
    );
    let r = call(
        p,
        "GET",
        "/strict",
        &[("date", &date), ("authorization", &good)],
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    assert!(r.json()["headers"]["authorization"].is_null());
    let date_only = header(
        "alice-hmac",
        "hmac-sha256",
        "date",
        &sign(hmac::HMAC_SHA256, "s3cret", &format!("date: {date}")),
    );
    let r = call(
        p,
        "GET",
        "/strict",
        &[("date", &date), ("authorization", &date_only)],
    )
    .await;
    assert_eq!(r.json(), unauthorized("HMAC signature cannot be verified"));
    assert_eq!(r.header("www-authenticate"), Some("hmac realm=\"api\""));
    let sha1 = header(
        "alice-hmac",
        "hmac-sha1",
        "date request-line",
        &sign(hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, "s3cret", &signing),
    );
    let r = call(
        p,
        "GET",
        "/strict",
        &[("date", &date), ("authorization", &sha1)],
    )
    .await;
    assert_eq!(r.json(), unauthorized("HMAC signature cannot be verified"));

    // validate_request_body: the Digest header must match the body; none only for no body.
    let body = r#"{"hello":"world"}"#;
    let digest = format!(
        "SHA-256={}",
        b64(digest::digest(&digest::SHA256, body.as_bytes()).as_ref())
    );
    let signing = format!("date: {date}\ndigest: {digest}");
    let auth = header(
        "alice-hmac",
        "hmac-sha256",
        "date digest",
        &sign(hmac::HMAC_SHA256, "s3cret", &signing),
    );
    let post = |b: &'static str, with_digest: bool| {
        let mut r = req("POST", "/body")
            .header("date", &date)
            .header("authorization", &auth)
            .header("content-type", "application/json");
        if with_digest {
            r = r.header("digest", &digest);
        }
        send(
            p,
            r.body(http_body_util::Full::new(bytes::Bytes::from_static(
                b.as_bytes(),
            )))
            .unwrap(),
        )
    };
    assert_eq!(post(r#"{"hello":"world"}"#, true).await.status, 200);
    let r = post(r#"{"hello":"World"}"#, true).await;
    assert_eq!(
        (r.status, r.json()),
        (401, unauthorized("HMAC signature does not match"))
    );
    let plain = header(
        "alice-hmac",
        "hmac-sha1",
        "date",
        &sign(
            hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
            "s3cret",
            &format!("date: {date}"),
        ),
    );
    let r = call(
        p,
        "GET",
        "/body",
        &[("date", &date), ("authorization", &plain)],
    )
    .await;
    assert_eq!(r.status, 200, "no body, no digest");

    // anonymous: a logical OR with key-auth.
    let r = call(p, "GET", "/either", &[]).await;
    assert_eq!(r.json()["headers"]["x-consumer-username"], "guest");
    let r = call(
        p,
        "GET",
        "/either",
        &[("date", &date), ("authorization", &plain)],
    )
    .await;
    assert_eq!(r.json()["headers"]["x-consumer-username"], "alice");
    let r = call(p, "GET", "/either", &[("apikey", "alice-key")]).await;
    assert_eq!(r.json()["headers"]["x-consumer-username"], "alice");
}

/// Kong's documented shell recipe (date, openssl dgst -hmac, base64), run as written, against
/// credentials made through the Admin API of a database node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hmac_auth_through_the_admin_api_with_openssl_signatures() {
    let up = Upstream::start("hmac-admin");
    let gw = Gateway::sqlite().start();
    gw.add_service_route(&up.url(), "/h").await;
    let r = gw
        .admin(
            "POST",
            "/services/s/plugins",
            Some(json!({"name": "hmac-auth"})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    assert_eq!(r.json()["config"]["clock_skew"], 300);
    assert_eq!(
        r.json()["config"]["algorithms"],
        json!(["hmac-sha1", "hmac-sha256", "hmac-sha384", "hmac-sha512"])
    );
    let r = gw
        .admin(
            "POST",
            "/plugins",
            Some(json!({"name": "hmac-auth", "config": {"clock_skew": 0}})),
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["fields"]["config"]["clock_skew"],
        "value must be greater than 0"
    );
    assert_eq!(
        gw.admin("POST", "/consumers", Some(json!({"username": "bob"})))
            .await
            .status,
        201
    );
    let r = gw
        .admin(
            "POST",
            "/consumers/bob/hmac-auth",
            Some(json!({"username": "bob-hmac"})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    let secret = r.json()["secret"].as_str().unwrap().to_string();
    assert_eq!(
        gw.admin(
            "POST",
            "/consumers/bob/hmac-auth",
            Some(json!({"secret": "x"}))
        )
        .await
        .json()["fields"]["username"],
        "required field missing"
    );

    let date = http_date(0);
    let mut openssl = Command::new("openssl")
        .args(["dgst", "-sha256", "-hmac", &secret, "-binary"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    openssl
        .stdin
        .take()
        .unwrap()
        .write_all(format!("date: {date}").as_bytes())
        .unwrap();
    let mac = openssl.wait_with_output().unwrap().stdout;
    let auth = header("bob-hmac", "hmac-sha256", "date", &b64(&mac));
    let proxy = gw.proxy;
    let (d, a) = (date.clone(), auth.clone());
    // Until the plugin and the credential are both applied (a 200 from the route alone,
    // before the plugin reaches the node, names no credential).
    assert!(
        eventually(std::time::Duration::from_secs(10), async || {
            let r = call(proxy, "GET", "/h", &[("date", &d), ("authorization", &a)]).await;
            r.status == 200 && r.json()["headers"]["x-credential-identifier"] == "bob-hmac"
        })
        .await
    );
    let r = call(
        proxy,
        "GET",
        "/h",
        &[("date", &date), ("authorization", &auth)],
    )
    .await;
    assert_eq!(r.json()["headers"]["x-credential-identifier"], "bob-hmac");
    // A changed secret takes effect on the next request.
    let r = gw
        .admin(
            "PATCH",
            "/consumers/bob/hmac-auth/bob-hmac",
            Some(json!({"secret": "rotated"})),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let (d, a) = (date.clone(), auth.clone());
    assert!(
        eventually(std::time::Duration::from_secs(10), async || {
            call(proxy, "GET", "/h", &[("date", &d), ("authorization", &a)])
                .await
                .status
                == 401
        })
        .await
    );
    let rotated = header(
        "bob-hmac",
        "hmac-sha256",
        "date",
        &sign(hmac::HMAC_SHA256, "rotated", &format!("date: {date}")),
    );
    let r = call(
        proxy,
        "GET",
        "/h",
        &[("date", &date), ("authorization", &rotated)],
    )
    .await;
    assert_eq!(r.status, 200);
}
