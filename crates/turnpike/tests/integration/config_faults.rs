//! One bad entity must never freeze the configuration: what the data plane would refuse is
//! refused when written (Kong's 400 schema violation), and a stored entity that still fails is
//! left out, reported in the log, `/status` and the metrics, while every other change applies.

use serde_json::json;

use crate::common::*;

/// A PEM block whose content is no certificate.
const GARBAGE_CERT: &str = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";

/// An X.509 v1 certificate (no extensions; `openssl x509 -req` without `-extfile`) and its
/// key. OpenSSL, browsers and Kong accept it (webpki, rustls' verifier, refuses v1).
const V1_CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBJTCBzQIUPGOiB3Ja40rZtZiaUj9qAKr3gZMwCgYIKoZIzj0EAwIwFTETMBEG
A1UEAwwKdjEuZXhhbXBsZTAgFw0yNjExMjQyMDQ2MzhaGA8yMTI2MTAzMTIwNDYz
OFowFTETMBEGA1UEAwwKdjEuZXhhbXBsZTBZMBMGByqGSM49AgEGCCqGSM49AwEH
A0IABNDk7ne3I2TtkNTJoVwwXK6c2xVslQXsaDSe9NK7/0/SzMxR0h+fihpUaCYD
QAjaUOMgBMLhMOgEpRlolzBRpSAwCgYIKoZIzj0EAwIDRwAwRAIgPy2sSnFNWJ7u
c19HqhN+xjIYQbd1igPdWTJu2m48WkACIAvgssWi9CuDl+l8RhLO/s+Ew8ozKcc4
p/vNC1trPSG2
-----END CERTIFICATE-----
";
const V1_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgPcmBijqf7+tGLrlR
QjnXlP/0xA0PvFAB1Kwh/349N0yhRANCAATQ5O53tyNk7ZDUyaFcMFyunNsVbJUF
7Gg0nvTSu/9P0szMUdIfn4oaVGgmA0AI2lDjIATC4TDoBKUZaJcwUaUg
-----END PRIVATE KEY-----
";

#[tokio::test(flavor = "multi_thread")]
async fn what_the_data_plane_refuses_is_refused_on_write() {
    let gw = Gateway::sqlite().start();
    // A v1 certificate is taken, as Kong takes it (the data plane serves it: admin_api's
    // credentials_upstreams_targets_certificates).
    let r = gw
        .admin(
            "POST",
            "/certificates",
            Some(json!({"cert": V1_CERT, "key": V1_KEY, "snis": ["v1.example"]})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let v1 = r.json()["id"].as_str().unwrap().to_string();
    assert_eq!(
        gw.admin("DELETE", &format!("/certificates/{v1}"), None)
            .await
            .status,
        204
    );
    // A PEM that holds no certificate: Kong's schema violation on `cert`, nothing stored.
    let r = gw
        .admin(
            "POST",
            "/certificates",
            Some(json!({"cert": GARBAGE_CERT, "key": V1_KEY, "snis": ["v1.example"]})),
        )
        .await;
    assert_eq!(r.status, 400, "{:?}", r.body);
    let j = r.json();
    assert_eq!(j["name"], "schema violation", "{j}");
    assert_eq!(j["code"], 2, "{j}");
    assert!(
        j["fields"]["cert"]
            .as_str()
            .is_some_and(|m| m.starts_with("invalid certificate")),
        "{j}"
    );
    // A certificate and a key that do not belong together.
    let (cert, _) = cert_for("a.example");
    let (_, other_key) = cert_for("b.example");
    let r = gw
        .admin(
            "POST",
            "/certificates",
            Some(json!({"cert": cert, "key": other_key})),
        )
        .await;
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(
        r.json()["fields"]["@entity"],
        json!(["certificate does not match key"]),
        "{:?}",
        r.body
    );
    // A CA certificate that does not parse.
    let r = gw
        .admin(
            "POST",
            "/ca_certificates",
            Some(json!({"cert": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"})),
        )
        .await;
    assert_eq!(r.status, 400, "{:?}", r.body);
    let r = gw.admin("GET", "/certificates", None).await;
    assert_eq!(r.json()["data"], json!([]));
    // And later changes apply at once.
    let up = Upstream::start("after");
    gw.add_service_route(&up.url(), "/after").await;
    assert_eq!(until_status(gw.proxy, "/after", 200).await.status, 200);
}

/// A row the data plane cannot build (stored by an older version, or written to the database
/// directly) is left out and reported; everything else, and every later write, applies.
#[tokio::test(flavor = "multi_thread")]
async fn a_stored_entity_that_fails_is_left_out_and_reported() {
    let up = Upstream::start("kept");
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("p");
    let prefix_s = prefix.to_str().unwrap();
    let (good_cert, good_key) = cert_for("good.example");
    let cert_id;
    {
        let gw = Gateway::sqlite().env("TURNPIKE_PREFIX", prefix_s).start();
        gw.add_service_route(&up.url(), "/kept").await;
        let r = gw
            .admin(
                "POST",
                "/certificates",
                Some(json!({"cert": good_cert, "key": good_key, "snis": ["v1.example"]})),
            )
            .await;
        assert_eq!(r.status, 201, "{:?}", r.body);
        cert_id = r.json()["id"].as_str().unwrap().to_string();
    }
    // The stored certificate becomes one that does not parse, as if written to the database
    // directly.
    let entity = json!({"id": cert_id, "cert": GARBAGE_CERT, "key": V1_KEY, "created_at": 1, "updated_at": 1});
    let sql = format!(
        "UPDATE certificates SET entity = '{}' WHERE id = '{cert_id}';",
        entity.to_string().replace('\'', "''")
    );
    let out = std::process::Command::new("sqlite3")
        .arg(prefix.join("turnpike.db"))
        .arg(&sql)
        .output()
        .expect("sqlite3 (Debian package sqlite3)");
    assert!(out.status.success(), "{out:?}");

    let gw = Gateway::sqlite().env("TURNPIKE_PREFIX", prefix_s).start();
    // The rest of the stored config serves, and the bad entity is named.
    assert_eq!(until_status(gw.proxy, "/kept", 200).await.status, 200);
    let status = gw.status().await;
    let problems = status["configuration_problems"].as_array().unwrap().clone();
    // The certificate, and its SNI, which names it.
    assert_eq!(problems.len(), 2, "{status}");
    assert!(
        problems[0].as_str().unwrap().contains(&cert_id)
            && problems[0]
                .as_str()
                .unwrap()
                .contains("invalid certificate"),
        "{problems:?}"
    );
    let metrics = gw.admin("GET", "/metrics", None).await;
    let text = String::from_utf8_lossy(&metrics.body).to_string();
    assert!(
        text.lines().any(|l| l == "turnpike_config_problems 2"),
        "{text}"
    );
    assert!(gw.log_text().contains(&cert_id), "{}", gw.log_text());
    // Writes made afterwards apply.
    let r = gw
        .admin(
            "POST",
            "/services",
            Some(json!({"name": "later", "url": up.url()})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let r = gw
        .admin(
            "POST",
            "/services/later/routes",
            Some(json!({"paths": ["/later"]})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(until_status(gw.proxy, "/later", 200).await.status, 200);
    // Deleting the bad entity clears the report.
    let r = gw
        .admin("DELETE", &format!("/certificates/{cert_id}"), None)
        .await;
    assert_eq!(r.status, 204, "{:?}", r.body);
    assert!(
        eventually(std::time::Duration::from_secs(10), async || {
            gw.status().await["configuration_problems"] == json!([])
        })
        .await
    );
}

/// `POST /config` answers a small config with Kong's echo of its entities (streamed as it is
/// written), and a config over 4 MiB with its hash and counts (the echo of a 50 MiB config was 387 MB, held in memory while
/// it was written); deep nesting is refused before the YAML parser.
#[tokio::test(flavor = "multi_thread")]
async fn post_config_answers_without_amplification() {
    let gw = Gateway::with_config("_format_version: '3.0'\n").start();
    let small =
        "_format_version: '3.0'\nservices:\n- name: a\n  host: h\n  routes:\n  - paths: [/a]\n";
    let r = admin_raw(gw.admin, "POST", "/config", "text/yaml", small.into()).await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(r.json()["services"][0]["name"], "a");
    // Kong's documented form, `curl -X POST :8001/config -F config=@kong.yml`: the file as the
    // `config` part of a multipart body, as curl sends it.
    let multipart = format!(
        "--XyZ\r\nContent-Disposition: form-data; name=\"config\"; filename=\"kong.yml\"\r\nContent-Type: application/octet-stream\r\n\r\n{}\r\n--XyZ--\r\n",
        small.replace("name: a", "name: from-multipart")
    );
    let r = admin_raw(
        gw.admin,
        "POST",
        "/config",
        "multipart/form-data; boundary=XyZ",
        multipart.into(),
    )
    .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(r.json()["services"][0]["name"], "from-multipart");
    // An echo of many 64 KiB chunks is streamed as it is written (never whole in memory),
    // and arrives whole.
    let mut medium = String::from("_format_version: '3.0'\nservices:\n");
    for n in 0..3000 {
        medium.push_str(&format!(
            "- name: m{n}\n  url: http://m{n}.example:8080/api\n  routes:\n  - paths: [/m/{n}]\n"
        ));
    }
    let r = admin_raw(gw.admin, "POST", "/config", "text/yaml", medium.into()).await;
    assert_eq!(r.status, 201, "{:?}", &r.body[..r.body.len().min(300)]);
    assert!(r.body.len() > 8 * 64 * 1024, "{} bytes", r.body.len());
    assert_eq!(r.headers.get("transfer-encoding").unwrap(), "chunked");
    assert_eq!(
        r.headers.get("content-type").unwrap(),
        "application/json; charset=utf-8"
    );
    let j = r.json();
    assert_eq!(j["services"].as_array().unwrap().len(), 3000);
    assert_eq!(j["routes"].as_array().unwrap().len(), 3000);
    assert_eq!(j["services"][2999]["name"], "m2999");
    let mut big = String::from("_format_version: '3.0'\nservices:\n");
    let mut n = 0;
    while big.len() <= turnpike_admin::MAX_CONFIG_ECHO {
        big.push_str(&format!(
            "- name: service-{n:06}\n  url: http://upstream-{n}.internal.example:8080/api\n  routes:\n  - name: route-{n:06}\n    paths: [/svc/{n:06}]\n"
        ));
        n += 1;
    }
    let r = admin_raw(gw.admin, "POST", "/config", "text/yaml", big.into_bytes()).await;
    assert_eq!(r.status, 201, "{:?}", &r.body[..r.body.len().min(300)]);
    assert!(r.body.len() < 1024, "{} bytes answered", r.body.len());
    let j = r.json();
    assert_eq!(
        (j["services"].as_u64(), j["routes"].as_u64()),
        (Some(n), Some(n))
    );
    assert_eq!(
        j["configuration_hash"],
        gw.status().await["configuration_hash"]
    );
    // 100,000 levels of flow nesting: refused by the scanner (its message), not the parser.
    let deep = format!(
        "_format_version: '3.0'\nservices: {}{}\n",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let r = admin_raw(gw.admin, "POST", "/config", "text/yaml", deep.into_bytes()).await;
    assert_eq!(r.status, 400);
    assert!(
        String::from_utf8_lossy(&r.body).contains("nested deeper than 512 levels"),
        "{:?}",
        r.body
    );
    // The config applied before is still the one served.
    assert_eq!(
        gw.status().await["configuration_hash"],
        j["configuration_hash"]
    );
}

/// Secrets as Kong's `{vault://...}` references (the env vault, by its name or by a vaults
/// entity's prefix): resolved when the data plane is built, only in the fields Kong marks
/// `referenceable` (elsewhere a reference is the string it is, as in Kong), kept as references
/// in the stored config; one that cannot be resolved fails its plugin closed and says so in
/// /status.
#[tokio::test]
async fn vault_references_resolve_from_the_environment() {
    let up = Upstream::start("vaults");
    // The log receiver: the first request's head, as http-log sends it.
    let sink = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let sink_port = sink.local_addr().unwrap().port();
    let received = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut s, _) = sink.accept().unwrap();
        let mut head = Vec::new();
        let mut b = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut b).unwrap();
            assert!(n > 0, "the log request ended early");
            head.extend_from_slice(&b[..n]);
        }
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
        String::from_utf8_lossy(&head).into_owned()
    });
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
vaults:
- prefix: team-secrets
  name: env
  config: {{prefix: "TP_TEAM_"}}
services:
- name: s
  url: {url}
  routes:
  - name: literal
    paths: [/literal]
    plugins:
    - name: request-termination
      config: {{status_code: 418, message: "{{vault://env/tp-message}}"}}
  - name: logged
    paths: [/logged]
    plugins:
    - name: http-log
      config:
        http_endpoint: "{{vault://env/tp-log-url}}"
        headers: {{authorization: "{{vault://team-secrets/creds/token}}"}}
        queue: {{max_coalescing_delay: 0.01}}
"#,
        url = up.url()
    ))
    .env("TP_MESSAGE", "from the environment")
    .env(
        "TP_LOG_URL",
        &format!("http://127.0.0.1:{sink_port}/from-the-vault"),
    )
    .env("TP_TEAM_CREDS", r#"{"token": "Bearer from-a-JSON-secret"}"#)
    .start();
    let p = gw.proxy;
    // request-termination's message is not referenceable in Kong: it is the string written.
    let r = call(p, "GET", "/literal", &[]).await;
    assert_eq!(
        (r.status, r.json()["message"].clone()),
        (418, json!("{vault://env/tp-message}"))
    );
    // http-log's endpoint and header values are: the log goes where the vault says, with
    // the secret from a JSON variable through the vaults entity's prefix.
    assert_eq!(call(p, "GET", "/logged", &[]).await.status, 200);
    let head = tokio::task::spawn_blocking(move || received.join().unwrap())
        .await
        .unwrap();
    assert!(head.starts_with("POST /from-the-vault "), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("authorization: bearer from-a-json-secret\r\n"),
        "{head}"
    );
    // The Admin API shows the references, never the secrets; the schema says which fields
    // take one.
    let plugins = gw.admin("GET", "/plugins", None).await.json().to_string();
    assert!(plugins.contains("{vault://env/tp-log-url}"), "{plugins}");
    assert!(!plugins.contains("from-a-JSON-secret"), "{plugins}");
    let schema = gw
        .admin("GET", "/schemas/plugins/http-log", None)
        .await
        .json();
    let config = schema["fields"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|f| f.get("config"))
        .unwrap()
        .clone();
    let field = |name: &str| {
        config["fields"]
            .as_array()
            .unwrap()
            .iter()
            .find_map(|f| f.get(name))
            .unwrap()
            .clone()
    };
    assert_eq!(field("http_endpoint")["referenceable"], true);
    assert_eq!(field("headers")["values"]["referenceable"], true);
    assert_eq!(field("method").get("referenceable"), None);
    // Unresolvable (a start refuses such a file; a POST /config applies the rest): the
    // plugin fails closed, and /status names it.
    let r = gw
        .admin(
            "POST",
            "/config",
            Some(json!({
                "_format_version": "3.0",
                "services": [{"name": "s", "url": up.url(), "routes": [{
                    "name": "missing", "paths": ["/missing"],
                    "plugins": [{"name": "http-log",
                                 "config": {"http_endpoint": "{vault://env/not-set}"}}]
                }]}],
                "vaults": [{"prefix": "team-secrets", "name": "env", "config": {"prefix": "TP_TEAM_"}}]
            })),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(until_status(p, "/missing", 500).await.status, 500);
    let status = gw.admin("GET", "/status", None).await.json();
    assert!(
        status["configuration_problems"]
            .to_string()
            .contains("environment variable NOT_SET is not set"),
        "{status}"
    );
    let vaults = gw.admin("GET", "/vaults/team-secrets", None).await.json();
    assert_eq!(vaults["config"]["prefix"], "TP_TEAM_");
}
