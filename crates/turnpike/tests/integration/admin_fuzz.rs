//! Hostile input for the Admin API: thousands of seeded random requests (paths with odd
//! characters, every method, bodies of random shape, type and encoding) against the real binary
//! on SQLite. Nothing may answer 5xx, the process must survive, and the store must still load
//! into a config the proxy serves.

use crate::common::*;
use bytes::Bytes;
use http_body_util::Full;
use serde_json::{json, Map, Value};

/// xorshift64*: deterministic, so a failure replays with the same seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
}

const COLLECTIONS: &[&str] = &[
    "services",
    "routes",
    "upstreams",
    "targets",
    "consumers",
    "plugins",
    "certificates",
    "snis",
    "ca_certificates",
    "key-auths",
    "basic-auths",
    "acls",
    "jwts",
    "hmac-auths",
    "oauth2",
    "tags",
    "schemas",
    "config",
    "status",
    "nope",
];
const CHILDREN: &[&str] = &[
    "routes",
    "plugins",
    "service",
    "targets",
    "key-auth",
    "basic-auth",
    "acls",
    "snis",
    "upstream",
    "consumer",
    "route",
    "validate",
    "x",
];
const FIELDS: &[&str] = &[
    "id",
    "name",
    "host",
    "port",
    "url",
    "path",
    "protocol",
    "retries",
    "paths",
    "hosts",
    "methods",
    "headers",
    "service",
    "route",
    "consumer",
    "upstream",
    "certificate",
    "config",
    "tags",
    "protocols",
    "strip_path",
    "regex_priority",
    "key",
    "username",
    "custom_id",
    "password",
    "target",
    "weight",
    "cert",
    "key_alt",
    "snis",
    "group",
    "enabled",
    "created_at",
    "algorithm",
    "healthchecks",
    "client_certificate",
    "ca_certificates",
    "https_redirect_status_code",
    "",
    "é",
    "a.b",
    "__proto__",
];
const STRINGS: &[&str] = &[
    "",
    "a",
    "svc",
    "/",
    "/a",
    "~/(",
    "~/[a-z]+",
    "http://127.0.0.1:1/x",
    "https://",
    "::1",
    "*.example.com",
    "example.*",
    "10.0.0.1:80",
    "x'; DROP TABLE services;--",
    "\u{0}",
    "é🦀",
    "00000000-0000-4000-8000-000000000000",
    "GET",
    "-----BEGIN CERTIFICATE-----",
    "%00%ff",
    "a/b",
    "a,b",
    "1e309",
];

fn value(r: &mut Rng, depth: u32) -> Value {
    match r.below(if depth > 2 { 6 } else { 9 }) {
        0 => Value::Null,
        1 => Value::Bool(r.below(2) == 0),
        2 => json!(*r.pick(&[0i64, -1, 1, 80, 65536, i64::MAX, i64::MIN, 2147483647])),
        3 => json!(*r.pick(&[0.5f64, -1e308, 1e308])),
        4 | 5 => Value::String(r.pick(STRINGS).to_string()),
        6 | 7 => Value::Array((0..r.below(4)).map(|_| value(r, depth + 1)).collect()),
        _ => Value::Object(object(r, depth + 1)),
    }
}

fn object(r: &mut Rng, depth: u32) -> Map<String, Value> {
    (0..r.below(6))
        .map(|_| (r.pick(FIELDS).to_string(), value(r, depth)))
        .collect()
}

/// A valid entity body and the collection it belongs to.
fn template(r: &mut Rng) -> (&'static str, Map<String, Value>) {
    let n = r.below(1000);
    let (c, v) = match r.below(7) {
        0 => (
            "services",
            json!({"name": format!("s{n}"), "url": "http://127.0.0.1:9/x"}),
        ),
        1 => (
            "routes",
            json!({"name": format!("r{n}"), "paths": [format!("/p{n}")], "service": {"name": "svc"}}),
        ),
        2 => ("consumers", json!({"username": format!("u{n}")})),
        3 => ("upstreams", json!({"name": format!("up{}", n % 3)})),
        4 => (
            "targets",
            json!({"target": format!("10.0.0.{}:80", n % 250), "upstream": {"name": "up1"}}),
        ),
        5 => (
            "key-auths",
            json!({"key": format!("k{n}"), "consumer": {"username": format!("u{}", n % 50)}}),
        ),
        _ => (
            "routes",
            json!({"paths": [format!("~/re{n}/(?<x>[a-z]+)")], "regex_priority": n, "service": {"name": "svc"}}),
        ),
    };
    (c, v.as_object().unwrap().clone())
}

fn path(r: &mut Rng, known: &[String]) -> String {
    let key = |r: &mut Rng| -> String {
        match r.below(4) {
            0 if !known.is_empty() => r.pick(known).clone(),
            1 => "%2F..%2F%00".into(),
            2 => "00000000-0000-4000-8000-000000000000".into(),
            _ => r
                .pick(&["svc", "a", "é", "%25", "x%20y", "10.0.0.1:80"])
                .to_string(),
        }
    };
    let mut p = format!("/{}", r.pick(COLLECTIONS));
    for _ in 0..r.below(4) {
        if r.below(2) == 0 {
            p.push('/');
            p.push_str(&key(r));
        } else {
            p.push('/');
            let child = *r.pick(CHILDREN);
            p.push_str(child);
        }
    }
    if r.below(3) == 0 {
        let query = *r.pick(&[
            "?size=0",
            "?size=1001",
            "?size=x",
            "?offset=%%%",
            "?tags=",
            "?tags=a,b/c",
            "?size=2&offset=AAAA",
            "?tags=a%2Fb",
        ]);
        p.push_str(query);
    }
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_admin_requests_never_break_the_gateway() {
    let up = Upstream::start("fuzz");
    let gw = Gateway::sqlite().start();
    // Some real entities so that random paths hit existing ones too.
    let s = gw
        .admin(
            "POST",
            "/services",
            Some(json!({"name": "svc", "url": up.url()})),
        )
        .await;
    let sid = s.json()["id"].as_str().unwrap().to_string();
    assert_eq!(
        gw.admin(
            "POST",
            "/services/svc/routes",
            Some(json!({"name": "a", "paths": ["/fuzz"]}))
        )
        .await
        .status,
        201
    );
    let mut known = vec![sid, "svc".to_string(), "a".to_string()];

    // FUZZ_SEED / FUZZ_N explore further than CI's fixed run.
    let seed = std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_1234_abcd_0001u64);
    let n: usize = std::env::var("FUZZ_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    let mut r = Rng(seed | 1);
    let (mut sender, _conn) = h1_client(gw.admin).await;
    let mut by_status = std::collections::BTreeMap::new();
    for i in 0..n {
        let mut method = *r.pick(&["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]);
        let mut p = path(&mut r, &known);
        let (ct, body): (&str, Vec<u8>) = if r.below(5) < 2 {
            // Create something plausible, sometimes with one field gone wrong.
            let (collection, mut t) = template(&mut r);
            if r.below(2) == 0 {
                t.insert(r.pick(FIELDS).to_string(), value(&mut r, 1));
            }
            method = "POST";
            p = format!("/{collection}");
            (
                "application/json",
                Value::Object(t).to_string().into_bytes(),
            )
        } else {
            match r.below(6) {
                0 => ("application/json", b"{\"name\": ".to_vec()),
                1 => ("application/json", vec![0xff, 0xfe, b'{', b'}']),
                2 => {
                    let form: Vec<String> = object(&mut r, 0)
                        .into_iter()
                        .map(|(k, v)| format!("{}[]={}", k, v.to_string().replace('&', "%26")))
                        .collect();
                    (
                        "application/x-www-form-urlencoded",
                        form.join("&").into_bytes(),
                    )
                }
                3 => ("text/plain", b"\x00\x01\x02".to_vec()),
                4 => (
                    "application/json",
                    Value::Object(object(&mut r, 0)).to_string().into_bytes(),
                ),
                // A valid entity with one field changed to something random: reaches the deeper
                // checks (references, uniqueness, the config build) rather than the first error.
                _ => {
                    let (_, mut t) = template(&mut r);
                    t.insert(r.pick(FIELDS).to_string(), value(&mut r, 1));
                    (
                        "application/json",
                        Value::Object(t).to_string().into_bytes(),
                    )
                }
            }
        };
        let request = req(method, &p)
            .header("content-type", ct)
            .body(Full::new(Bytes::from(body.clone())))
            .unwrap();
        if sender.ready().await.is_err() {
            sender = h1_client(gw.admin).await.0;
        }
        let resp = match sender.send_request(request).await {
            Ok(resp) => collect(resp).await,
            Err(e) => panic!(
                "request {i} {method} {p}: connection failed: {e}\n{}",
                gw.log_text()
            ),
        };
        assert!(
            resp.status < 500,
            "request {i}: {method} {p} {:?} -> {} {:?}",
            String::from_utf8_lossy(&body),
            resp.status,
            resp.body
        );
        // Every error body is Kong-shaped JSON with a message.
        if resp.status >= 400 && resp.status != 405 {
            let v: Value = serde_json::from_slice(&resp.body)
                .unwrap_or_else(|_| panic!("request {i}: {method} {p}: not JSON: {:?}", resp.body));
            assert!(v["message"].is_string(), "request {i}: {method} {p}: {v}");
        }
        if resp.status == 201 {
            if let Ok(v) = serde_json::from_slice::<Value>(&resp.body) {
                if let Some(id) = v["id"].as_str() {
                    known.push(id.to_string());
                }
            }
        }
        *by_status.entry(resp.status).or_insert(0) += 1;
    }
    eprintln!("statuses: {by_status:?}");
    assert!(
        by_status.keys().any(|s| *s < 300),
        "nothing succeeded: {by_status:?}"
    );
    // Still alive, still consistent: the proxy serves and a restart-free rebuild works.
    assert_eq!(gw.status().await["database"]["reachable"], true);
    let r = gw
        .admin(
            "PUT",
            "/routes/fuzz-final",
            Some(json!({"paths": ["/final"], "service": {"name": "svc"}})),
        )
        .await;
    if r.status == 200 {
        assert_eq!(until_status(gw.proxy, "/final", 200).await.status, 200);
    }
    let log = gw.log_text();
    assert!(!log.contains("panicked"), "{log}");
    // Whatever the store accepted, the nodes could build: no write may wedge the sync.
    assert!(!log.contains("keeping the current config"), "{log}");
    assert!(!log.contains("incremental update failed"), "{log}");
}
