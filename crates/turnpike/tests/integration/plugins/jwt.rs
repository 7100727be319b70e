//! jwt on the real binary: Kong 3.9's token sources, checks, messages and headers, every
//! algorithm family with keys made by `openssl` as operators make them, claims, anonymous,
//! and secrets through the declarative file and the Admin API (where a database node looks
//! them up by key and forgets them when they are deleted).

use std::path::Path;
use std::process::Command;

use aws_lc_rs::{hmac, rand, signature};
use base64::Engine;
use serde_json::{json, Value};

use crate::common::*;

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

/// A private key made by `openssl genpkey` (PKCS#8 PEM) and its public key (SPKI PEM).
struct KeyPair {
    pkcs8: Vec<u8>,
    public_pem: String,
}

fn openssl_key(dir: &Path, name: &str, args: &[&str]) -> KeyPair {
    let key = dir.join(format!("{name}.pem"));
    let out = Command::new("openssl")
        .args(["genpkey"])
        .args(args)
        .arg("-out")
        .arg(&key)
        .output()
        .expect("openssl");
    assert!(out.status.success(), "{out:?}");
    let public = Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(&key)
        .output()
        .expect("openssl");
    assert!(public.status.success());
    let pem = std::fs::read_to_string(&key).unwrap();
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    KeyPair {
        pkcs8: base64::engine::general_purpose::STANDARD
            .decode(body)
            .unwrap(),
        public_pem: String::from_utf8(public.stdout).unwrap(),
    }
}

/// A token of `claims` signed with `alg`: HMAC with `secret`, or the private key.
fn sign(alg: &str, claims: &Value, secret: &[u8], key: Option<&KeyPair>) -> String {
    let input = format!(
        "{}.{}",
        b64(json!({"typ": "JWT", "alg": alg}).to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let rng = rand::SystemRandom::new();
    let sig: Vec<u8> = match alg {
        "HS256" | "HS384" | "HS512" => {
            let a = match alg {
                "HS256" => hmac::HMAC_SHA256,
                "HS384" => hmac::HMAC_SHA384,
                _ => hmac::HMAC_SHA512,
            };
            hmac::sign(&hmac::Key::new(a, secret), input.as_bytes())
                .as_ref()
                .to_vec()
        }
        "RS256" | "PS256" | "RS512" => {
            let k = signature::RsaKeyPair::from_pkcs8(&key.unwrap().pkcs8).unwrap();
            let enc: &'static dyn signature::RsaEncoding = match alg {
                "RS256" => &signature::RSA_PKCS1_SHA256,
                "RS512" => &signature::RSA_PKCS1_SHA512,
                _ => &signature::RSA_PSS_SHA256,
            };
            let mut out = vec![0; k.public_modulus_len()];
            k.sign(enc, &rng, input.as_bytes(), &mut out).unwrap();
            out
        }
        "ES256" | "ES384" | "ES512" => {
            let a = match alg {
                "ES256" => &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
                "ES384" => &signature::ECDSA_P384_SHA384_FIXED_SIGNING,
                _ => &signature::ECDSA_P521_SHA512_FIXED_SIGNING,
            };
            let k = signature::EcdsaKeyPair::from_pkcs8(a, &key.unwrap().pkcs8).unwrap();
            k.sign(&rng, input.as_bytes()).unwrap().as_ref().to_vec()
        }
        "EdDSA" => {
            let k = signature::Ed25519KeyPair::from_pkcs8(&key.unwrap().pkcs8).unwrap();
            k.sign(input.as_bytes()).as_ref().to_vec()
        }
        other => panic!("{other}"),
    };
    format!("{input}.{}", b64(&sig))
}

fn bearer(t: &str) -> String {
    format!("Bearer {t}")
}

#[tokio::test]
async fn jwt_behaves_like_kong() {
    let dir = tempfile::tempdir().unwrap();
    let rsa = openssl_key(
        dir.path(),
        "rsa",
        &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
    );
    let p256 = openssl_key(
        dir.path(),
        "p256",
        &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
    );
    let p521 = openssl_key(
        dir.path(),
        "p521",
        &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-521"],
    );
    let ed = openssl_key(dir.path(), "ed", &["-algorithm", "ED25519"]);
    let indent = |pem: &str| pem.replace('\n', "\n      ");
    let up = Upstream::start("jwt");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
consumers:
- username: alice
  custom_id: A-1
  jwt_secrets:
  - key: alice-hs
    secret: s3cret
  - key: alice-hs512
    secret: s3cret
    algorithm: HS512
  - key: alice-b64
    secret: c2VjcmV0LWJ5dGVz
  - key: alice-rs
    algorithm: RS256
    rsa_public_key: |
      {rsa}
  - key: alice-ps
    algorithm: PS256
    rsa_public_key: |
      {rsa}
  - key: alice-es
    algorithm: ES256
    rsa_public_key: |
      {p256}
  - key: alice-es512
    algorithm: ES512
    rsa_public_key: |
      {p521}
  - key: alice-ed
    algorithm: EdDSA
    rsa_public_key: |
      {ed}
  keyauth_credentials:
  - key: alice-api-key
- username: guest
services:
- name: svc
  url: {url}
  routes:
  - name: plain
    paths: [/plain]
    plugins:
    - name: jwt
  - name: claims
    paths: [/claims]
    plugins:
    - name: jwt
      config: {{claims_to_verify: [exp, nbf], maximum_expiration: 3600}}
  - name: b64
    paths: [/b64]
    plugins:
    - name: jwt
      config: {{secret_is_base64: true}}
  - name: sources
    paths: [/sources]
    plugins:
    - name: jwt
      config: {{uri_param_names: [token], cookie_names: [session], header_names: [x-token], key_claim_name: kid, realm: api}}
  - name: either
    paths: [/either]
    plugins:
    - name: key-auth
      config: {{anonymous: guest}}
    - name: jwt
      config: {{anonymous: guest}}
  - name: preflight
    paths: [/preflight]
    plugins:
    - name: jwt
      config: {{run_on_preflight: false}}
"#,
        rsa = indent(rsa.public_pem.trim_end()),
        p256 = indent(p256.public_pem.trim_end()),
        p521 = indent(p521.public_pem.trim_end()),
        ed = indent(ed.public_pem.trim_end()),
        url = up.url()
    ))
    .start();
    let p = gw.proxy;
    let hs = |claims: Value| sign("HS256", &claims, b"s3cret", None);
    let good = hs(json!({"iss": "alice-hs"}));

    // No token: Kong's 401 and challenge.
    let r = call(p, "GET", "/plain", &[]).await;
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "Unauthorized"}))
    );
    assert_eq!(r.header("www-authenticate"), Some("Bearer"));

    // The token in the Authorization header and in the `jwt` query argument.
    let r = call(p, "GET", "/plain", &[("authorization", &bearer(&good))]).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let h = &r.json()["headers"];
    assert_eq!(h["x-consumer-username"], "alice");
    assert_eq!(h["x-consumer-custom-id"], "A-1");
    assert_eq!(h["x-credential-identifier"], "alice-hs");
    assert_eq!(h["authorization"], bearer(&good));
    let r = call(p, "GET", &format!("/plain?jwt={good}"), &[]).await;
    assert_eq!(r.status, 200);
    // The same token twice counts once; two different ones are refused.
    let r = call(
        p,
        "GET",
        &format!("/plain?jwt={good}"),
        &[("authorization", &bearer(&good))],
    )
    .await;
    assert_eq!(r.status, 200);
    let other = hs(json!({"iss": "alice-hs", "n": 1}));
    let r = call(
        p,
        "GET",
        &format!("/plain?jwt={other}"),
        &[("authorization", &bearer(&good))],
    )
    .await;
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "Multiple tokens provided"}))
    );
    assert_eq!(
        r.header("www-authenticate"),
        Some("Bearer error=\"invalid_token\"")
    );

    // Kong's messages for each way a token is wrong.
    let none = format!(
        "{}.{}.",
        b64(br#"{"alg":"none"}"#),
        b64(br#"{"iss":"alice-hs"}"#)
    );
    let tampered = {
        let mut parts: Vec<&str> = good.split('.').collect();
        let forged = b64(br#"{"iss":"alice-hs","admin":true}"#);
        parts[1] = &forged;
        parts.join(".")
    };
    for (token, message) in [
        ("abc.def.ghi".to_string(), "Bad token; invalid JSON"),
        ("not-a-token".to_string(), "Bad token; invalid JSON"),
        (none, "Bad token; invalid alg"),
        (hs(json!({"sub": "x"})), "No mandatory 'iss' in claims"),
        (hs(json!({"iss": ""})), "Invalid 'iss' in claims"),
        (
            hs(json!({"iss": "nobody"})),
            "No credentials found for given 'iss'",
        ),
        (
            sign("HS512", &json!({"iss": "alice-hs"}), b"s3cret", None),
            "Invalid algorithm",
        ),
        (
            sign("HS256", &json!({"iss": "alice-hs"}), b"wrong", None),
            "Invalid signature",
        ),
        (tampered, "Invalid signature"),
    ] {
        let r = call(p, "GET", "/plain", &[("authorization", &bearer(&token))]).await;
        assert_eq!(
            (r.status, r.json()),
            (401, json!({ "message": message })),
            "{token}"
        );
        assert_eq!(
            r.header("www-authenticate"),
            Some("Bearer error=\"invalid_token\"")
        );
    }

    // Every algorithm family, with keys from openssl.
    for (alg, kid, key) in [
        ("HS512", "alice-hs512", None),
        ("RS256", "alice-rs", Some(&rsa)),
        ("PS256", "alice-ps", Some(&rsa)),
        ("ES256", "alice-es", Some(&p256)),
        ("ES512", "alice-es512", Some(&p521)),
        ("EdDSA", "alice-ed", Some(&ed)),
    ] {
        let t = sign(alg, &json!({"iss": kid}), b"s3cret", key);
        let r = call(p, "GET", "/plain", &[("authorization", &bearer(&t))]).await;
        assert_eq!(r.status, 200, "{alg}: {:?}", r.json());
        assert_eq!(r.json()["headers"]["x-credential-identifier"], kid);
        // The last signature byte changed.
        let mut sig = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(t.rsplit('.').next().unwrap())
            .unwrap();
        *sig.last_mut().unwrap() ^= 1;
        let bad = format!("{}.{}", &t[..t.rfind('.').unwrap()], b64(&sig));
        let r = call(p, "GET", "/plain", &[("authorization", &bearer(&bad))]).await;
        assert_eq!(r.json(), json!({"message": "Invalid signature"}), "{alg}");
    }
    // A key made for one algorithm does not verify another's token.
    let t = sign("RS256", &json!({"iss": "alice-ps"}), b"", Some(&rsa));
    let r = call(p, "GET", "/plain", &[("authorization", &bearer(&t))]).await;
    assert_eq!(r.json(), json!({"message": "Invalid algorithm"}));

    // Registered claims, and the maximum expiration.
    // The gateway reads a coarse clock (as Kong's cached `ngx.time()`), a few ms behind the
    // test's: a token valid from "now" could be refused in the second's first ms, so the
    // tokens meant to be valid were minted a second ago.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    for (claims, status, body) in [
        (
            json!({"iss": "alice-hs", "exp": now + 60, "nbf": now - 1}),
            200,
            None,
        ),
        // A claim to verify must be there.
        (
            json!({"iss": "alice-hs", "exp": now + 60}),
            401,
            Some(json!({"nbf": "must be a number"})),
        ),
        (
            json!({"iss": "alice-hs", "exp": now - 2, "nbf": now - 3}),
            401,
            Some(json!({"exp": "token expired"})),
        ),
        (
            json!({"iss": "alice-hs", "exp": now + 60, "nbf": now + 600}),
            401,
            Some(json!({"nbf": "token not valid yet"})),
        ),
        (
            json!({"iss": "alice-hs", "exp": "soon"}),
            401,
            Some(json!({"exp": "must be a number", "nbf": "must be a number"})),
        ),
        (
            json!({"iss": "alice-hs", "exp": now + 7200, "nbf": now - 1}),
            401,
            Some(json!({"exp": "exceeds maximum allowed expiration"})),
        ),
    ] {
        let r = call(
            p,
            "GET",
            "/claims",
            &[("authorization", &bearer(&hs(claims.clone())))],
        )
        .await;
        assert_eq!(r.status, status, "{claims}");
        if let Some(b) = body {
            assert_eq!(r.json(), b, "{claims}");
        }
    }

    // secret_is_base64: the secret is the decoded bytes.
    let t = sign("HS256", &json!({"iss": "alice-b64"}), b"secret-bytes", None);
    let r = call(p, "GET", "/b64", &[("authorization", &bearer(&t))]).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let r = call(p, "GET", "/plain", &[("authorization", &bearer(&t))]).await;
    assert_eq!(r.json(), json!({"message": "Invalid signature"}));

    // Custom sources, the key in the token's header (`kid`), realm.
    let kid_token = {
        let input = format!(
            "{}.{}",
            b64(br#"{"alg":"HS256","kid":"alice-hs"}"#),
            b64(br#"{"sub":"someone"}"#)
        );
        let tag = hmac::sign(
            &hmac::Key::new(hmac::HMAC_SHA256, b"s3cret"),
            input.as_bytes(),
        );
        format!("{input}.{}", b64(tag.as_ref()))
    };
    for headers in [
        vec![("x-token", bearer(&kid_token))],
        vec![("cookie", format!("a=b; session={kid_token}"))],
    ] {
        let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let r = call(p, "GET", "/sources", &h).await;
        assert_eq!(r.status, 200, "{headers:?}: {:?}", r.json());
    }
    let r = call(p, "GET", &format!("/sources?token={kid_token}"), &[]).await;
    assert_eq!(r.status, 200);
    // The default sources are not read there.
    let r = call(
        p,
        "GET",
        "/sources",
        &[("authorization", &bearer(&kid_token))],
    )
    .await;
    assert_eq!(r.status, 401);
    assert_eq!(r.header("www-authenticate"), Some("Bearer realm=\"api\""));

    // anonymous: a logical OR with key-auth.
    let r = call(p, "GET", "/either", &[]).await;
    assert_eq!(r.json()["headers"]["x-consumer-username"], "guest");
    assert_eq!(r.json()["headers"]["x-anonymous-consumer"], "true");
    let r = call(p, "GET", "/either", &[("authorization", &bearer(&good))]).await;
    assert_eq!(r.json()["headers"]["x-consumer-username"], "alice");
    assert!(r.json()["headers"]["x-anonymous-consumer"].is_null());
    let r = call(p, "GET", "/either", &[("apikey", "alice-api-key")]).await;
    assert_eq!(r.json()["headers"]["x-consumer-username"], "alice");

    // run_on_preflight = false lets OPTIONS through.
    assert_eq!(call(p, "OPTIONS", "/preflight", &[]).await.status, 200);
    assert_eq!(call(p, "GET", "/preflight", &[]).await.status, 401);
}

/// A declarative file with a bad secret is refused as a whole, with Kong's messages.
#[tokio::test]
async fn bad_jwt_secrets_and_configs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (yaml, expect) in [
        (
            "consumers:\n- username: a\n  jwt_secrets:\n  - key: k\n    algorithm: RS256\n",
            "required field missing",
        ),
        (
            "consumers:\n- username: a\n  jwt_secrets:\n  - key: k\n    algorithm: ES256\n    rsa_public_key: not a key\n",
            "invalid key",
        ),
        (
            "consumers:\n- username: a\n  jwt_secrets:\n  - key: k\n    algorithm: none\n",
            "expected one of: HS256",
        ),
        (
            "plugins:\n- name: jwt\n  config: {maximum_expiration: 60}\n",
            "must contain 'exp'",
        ),
        (
            "plugins:\n- name: jwt\n  config: {claims_to_verify: [iat]}\n",
            "expected one of",
        ),
    ] {
        let f = write(dir.path(), "k.yml", &format!("_format_version: '3.0'\n{yaml}"));
        let (ok, out) = run(&["config", "parse", f.to_str().unwrap()], &[]);
        assert!(!ok, "{yaml}");
        assert!(out.contains(expect), "{yaml}: {out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_secrets_through_the_admin_api() {
    let dir = tempfile::tempdir().unwrap();
    let p256 = openssl_key(
        dir.path(),
        "p256",
        &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
    );
    let up = Upstream::start("jwt-admin");
    let gw = Gateway::sqlite().start();
    gw.add_service_route(&up.url(), "/j").await;
    let r = gw
        .admin("POST", "/services/s/plugins", Some(json!({"name": "jwt"})))
        .await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    let c = r.json()["config"].clone();
    assert_eq!(c["key_claim_name"], "iss");
    assert_eq!(c["uri_param_names"], json!(["jwt"]));
    assert_eq!(c["header_names"], json!(["authorization"]));
    assert_eq!(c["maximum_expiration"], 0);
    let r = gw
        .admin(
            "POST",
            "/plugins",
            Some(json!({"name": "jwt", "config": {"maximum_expiration": 10}})),
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["fields"]["config"]["claims_to_verify"],
        "must contain 'exp'"
    );

    assert_eq!(
        gw.admin("POST", "/consumers", Some(json!({"username": "bob"})))
            .await
            .status,
        201
    );
    // key and secret are generated; the algorithm defaults to HS256.
    let r = gw
        .admin("POST", "/consumers/bob/jwt", Some(json!({})))
        .await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    let cred = r.json();
    assert_eq!(cred["algorithm"], "HS256");
    let key = cred["key"].as_str().unwrap().to_string();
    let secret = cred["secret"].as_str().unwrap().to_string();
    assert_eq!(key.len(), 32);
    // Kong's errors for asymmetric algorithms without a usable key; nothing stored.
    let r = gw
        .admin(
            "POST",
            "/consumers/bob/jwt",
            Some(json!({"algorithm": "RS256"})),
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["fields"]["rsa_public_key"],
        "required field missing"
    );
    let r = gw
        .admin(
            "POST",
            "/consumers/bob/jwt",
            Some(json!({"algorithm": "ES256", "rsa_public_key": "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----"})),
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["fields"]["rsa_public_key"], "invalid key");
    let r = gw
        .admin(
            "POST",
            "/consumers/bob/jwt",
            Some(json!({"algorithm": "XX1"})),
        )
        .await;
    assert_eq!(r.status, 400);
    let r = gw
        .admin(
            "POST",
            "/consumers/bob/jwt",
            Some(json!({"key": "bob-es", "algorithm": "ES256", "rsa_public_key": p256.public_pem})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    assert_eq!(
        gw.admin("GET", "/jwts", None).await.json()["data"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        gw.admin("GET", "/consumers/bob/jwt/bob-es", None)
            .await
            .json()["algorithm"],
        "ES256"
    );

    // The database node looks the secret up by key. The plugin is live once a request
    // without a token is refused (the node applies writes in the background: on a loaded
    // machine the route can be live before the plugin is).
    let t = sign("HS256", &json!({"iss": key}), secret.as_bytes(), None);
    let proxy = gw.proxy;
    assert!(
        eventually(std::time::Duration::from_secs(10), async || {
            call(proxy, "GET", "/j", &[]).await.status == 401
        })
        .await
    );
    let auth = bearer(&t);
    assert!(
        eventually(std::time::Duration::from_secs(10), async || {
            call(proxy, "GET", "/j", &[("authorization", &auth)])
                .await
                .status
                == 200
        })
        .await
    );
    let r = call(proxy, "GET", "/j", &[("authorization", &auth)]).await;
    assert_eq!(r.json()["headers"]["x-consumer-username"], "bob");
    assert_eq!(r.json()["headers"]["x-credential-identifier"], key.as_str());
    let es = sign("ES256", &json!({"iss": "bob-es"}), b"", Some(&p256));
    let r = call(proxy, "GET", "/j", &[("authorization", &bearer(&es))]).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    // An unknown key, asked twice (the miss is cached), then created: it works at once.
    let later = sign("HS256", &json!({"iss": "later"}), b"later-secret", None);
    for _ in 0..2 {
        let r = call(proxy, "GET", "/j", &[("authorization", &bearer(&later))]).await;
        assert_eq!(
            r.json(),
            json!({"message": "No credentials found for given 'iss'"})
        );
    }
    let r = gw
        .admin(
            "POST",
            "/consumers/bob/jwt",
            Some(json!({"key": "later", "secret": "later-secret"})),
        )
        .await;
    assert_eq!(r.status, 201);
    let later_auth = bearer(&later);
    assert!(
        eventually(std::time::Duration::from_secs(10), async || {
            call(proxy, "GET", "/j", &[("authorization", &later_auth)])
                .await
                .status
                == 200
        })
        .await
    );
    // Deleted: the token stops working.
    assert_eq!(
        gw.admin("DELETE", &format!("/consumers/bob/jwt/{key}"), None)
            .await
            .status,
        204
    );
    assert!(
        eventually(std::time::Duration::from_secs(10), async || {
            call(proxy, "GET", "/j", &[("authorization", &auth)])
                .await
                .status
                == 401
        })
        .await
    );
}
