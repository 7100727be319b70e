//! REST and JSON clients reaching a gRPC service through the grpc-gateway plugin and
//! grpc-web's JSON modes: Kong's own fixtures (`targetservice.proto`, `hello.proto`) served
//! by grpc-go (`target/main.go`, built with the Go toolchain, its .proto files compiled by
//! bufbuild/protocompile — not by the gateway's compiler), and the cases of Kong's
//! `spec/03-plugins/28-grpc-gateway/01-proxy_spec.lua` and `32-grpc-web/01-proxy_spec.lua`
//! with the answers those specs expect, through curl and hyper.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

use serde_json::{json, Value};

use crate::common::*;

fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration/grpc/target")
}

fn target_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| go_build("grpc/target", "grpc-target"))
}

/// The grpc-go server on a free port, killed on drop.
struct Target {
    child: Child,
    port: u16,
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Target {
    fn start() -> Target {
        let google_api = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../turnpike-plugins/src/grpc_proto/include");
        for _ in 0..3 {
            let port = free_port();
            let mut child = Command::new(target_bin())
                .arg(port.to_string())
                .arg(target_dir())
                .arg(&google_api)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("start the gRPC target");
            let mut line = String::new();
            let _ = BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
            if line.trim() == "listening" {
                return Target { child, port };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("the gRPC target did not start");
    }
}

fn proto(name: &str) -> String {
    target_dir().join(name).to_string_lossy().into_owned()
}

/// curl's answer: status, headers (lower-cased names), body.
fn curl(args: &[&str]) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let out = Command::new("curl")
        .args(["-s", "-i"])
        .args(args)
        .output()
        .expect("run curl");
    let raw = out.stdout;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head in curl's output");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, raw[split + 4..].to_vec())
}

fn header<'a>(h: &'a [(String, String)], name: &str) -> Option<&'a str> {
    h.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

fn json_of(body: &[u8]) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(body)))
}

/// Kong's grpc-gateway spec, case by case, against grpc-go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_gateway_turns_rest_calls_into_grpc_calls_as_kongs_spec_expects() {
    let up = Target::start();
    let doc = json!({
        "_format_version": "3.0",
        "services": [{"name": "grpc", "url": format!("grpc://127.0.0.1:{}", up.port), "routes": [
            {"name": "rest", "protocols": ["http", "https"], "paths": ["/"],
             "plugins": [{"name": "grpc-gateway", "config": {"proto": proto("targetservice.proto")}}]},
            {"name": "no-proto", "protocols": ["http"], "paths": ["/bare"],
             "plugins": [{"name": "grpc-gateway"}]},
        ]}],
    });
    let gw = Gateway::with_config(&doc.to_string()).start();
    let base = format!("http://127.0.0.1:{}", gw.proxy.port());
    let get = |path: &str| curl(&[&format!("{base}{path}")]);
    let post = |path: &str, body: &str| {
        curl(&[
            "-H",
            "content-type: application/json",
            "--data-binary",
            body,
            &format!("{base}{path}"),
        ])
    };

    // main entrypoint; the additional binding; unbound query arguments left out (the
    // binding has `body: "*"`).
    for path in [
        "/v1/messages/john_doe",
        "/v1/messages/legacy/john_doe",
        "/v1/messages/john_doe?arg1=1&arg2.test=2",
    ] {
        let (status, h, body) = get(path);
        assert_eq!(status, 200, "{path}: {:?}", String::from_utf8_lossy(&body));
        assert_eq!(header(&h, "content-type"), Some("application/json"));
        assert_eq!(header(&h, "access-control-allow-origin"), Some("*"));
        assert_eq!(
            json_of(&body),
            json!({"reply": "hello john_doe", "boolean_test": false}),
            "{path}"
        );
    }
    // A path variable is percent-decoded; `**` takes the rest of the path.
    let (_, _, body) = get("/v1/messages/legacy/john%20doe/and/more");
    assert_eq!(json_of(&body)["reply"], "hello john doe/and/more");
    // Booleans from the query: anything but `0` and `false` is true.
    for (arg, want) in [("true", true), ("false", false), ("0", false), ("1", true)] {
        let (status, _, body) = get(&format!("/v1/messages/legacy/john_doe?boolean_test={arg}"));
        assert_eq!(status, 200);
        assert_eq!(
            json_of(&body),
            json!({"reply": "hello john_doe", "boolean_test": want}),
            "boolean_test={arg}"
        );
    }
    // Unknown path: Kong's 400, the text as the body.
    let (status, h, body) = get("/v1/messages/john_doe/bai");
    assert_eq!(status, 400);
    assert_eq!(
        String::from_utf8_lossy(&body),
        r#"failed to transcode .proto file Unknown path "/v1/messages/john_doe/bai""#
    );
    assert_eq!(header(&h, "content-type"), None);
    let (status, _, body) = curl(&["-X", "PUT", &format!("{base}/v1/messages/x")]);
    assert_eq!(status, 400);
    assert_eq!(
        String::from_utf8_lossy(&body),
        r#"failed to transcode .proto file Unknown method "put""#
    );
    // grpc-status to HTTP status: UNIMPLEMENTED is 500, the grpc-status header kept.
    let (status, h, _) = get("/v1/unknown/john_doe");
    assert_eq!(status, 500);
    assert_eq!(header(&h, "grpc-status"), Some("12"));
    // Timestamps as Kong's date hook writes them.
    let now: i64 = 1_796_294_430;
    let ago = now - 315;
    let iso = |t: i64| {
        let out = Command::new("date")
            .args(["-u", "-d", &format!("@{t}"), "+%Y-%m-%dT%H:%M:%S"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let (now_8601, ago_8601) = (iso(now), format!("{}Z", iso(ago)));
    let (status, _, body) = post(
        "/bounce",
        &json!({"message": "hi", "when": ago_8601, "now": now_8601}).to_string(),
    );
    assert_eq!(status, 200, "{:?}", String::from_utf8_lossy(&body));
    assert_eq!(
        json_of(&body),
        json!({"now": now_8601, "reply": "hello hi",
               "time_message": format!("{ago_8601} was 5m15s ago")})
    );
    // Structured query arguments into nested messages.
    let (status, _, body) = get(
        "/v1/grow/tail?name=lizard&hands.count=0&hands.endings=fingers&legs.count=4\
         &legs.endings=toes&tail.count=0&tail.endings=tip",
    );
    assert_eq!(status, 200, "{:?}", String::from_utf8_lossy(&body));
    assert_eq!(
        json_of(&body),
        json!({"name": "lizard", "hands": {"count": 0, "endings": "fingers"},
               "legs": {"count": 4, "endings": "toes"}, "tail": {"count": 1, "endings": "tip"}})
    );
    // Bad bodies: null, JSON that is not, a field of the wrong type.
    let (status, _, _) = post("/bounce", r#"{"message":null}"#);
    assert_eq!(status, 400);
    let (status, _, body) = post("/bounce", r#"{"message":"invalid}"#);
    assert_eq!(status, 400);
    assert_eq!(
        String::from_utf8_lossy(&body),
        "decode json err: Expected value but found unexpected end of string at character 21"
    );
    let (status, _, body) = post("/bounce", r#"{"message":1}"#);
    assert_eq!(status, 400);
    assert_eq!(String::from_utf8_lossy(&body), "failed to encode payload");
    // Kong's regressions #10801 and #10802: an empty list comes back as `[]`.
    for req in [
        json!({"array": [], "nullable": "ahaha"}),
        json!({"array": [], "nullable": ""}),
    ] {
        let (status, _, body) = post("/v1/echo", &req.to_string());
        assert_eq!(status, 200);
        assert_eq!(json_of(&body), req);
        assert!(String::from_utf8_lossy(&body).contains("[]"));
    }
    // CORS preflight.
    let (status, h, body) = curl(&["-X", "OPTIONS", &format!("{base}/v1/messages/x")]);
    assert_eq!(status, 200);
    assert_eq!(body, b"OK");
    assert_eq!(
        header(&h, "access-control-allow-methods"),
        Some("GET,POST,PATCH,DELETE")
    );
    assert_eq!(
        header(&h, "access-control-allow-headers"),
        Some("content-type")
    );
    // No proto: Kong's 400.
    let (status, _, body) = get("/bare/v1/messages/x");
    assert_eq!(status, 400);
    assert_eq!(
        String::from_utf8_lossy(&body),
        "transcoding requests require a .proto file defining the service"
    );
    // Clients as users run them: HTTP/1.0, Connection: close, a chunked body.
    let (status, _, body) = curl(&["--http1.0", &format!("{base}/v1/messages/old")]);
    assert_eq!(
        (status, json_of(&body)["reply"].clone()),
        (200, json!("hello old"))
    );
    let (status, _, body) = curl(&[
        "-H",
        "connection: close",
        "-H",
        "transfer-encoding: chunked",
        "-H",
        "content-type: application/json",
        "--data-binary",
        r#"{"message":"chunked","when":"2026-12-03T10:00:00Z","now":"2026-12-03T10:00:01"}"#,
        &format!("{base}/bounce"),
    ]);
    assert_eq!(status, 200, "{:?}", String::from_utf8_lossy(&body));
    assert_eq!(
        json_of(&body)["time_message"],
        "2026-12-03T10:00:00Z was 1s ago"
    );
    // The binding nested in an additional binding (`post: "/v1/messages/"` in the fixture) is
    // not one: additional bindings do not nest (google/api/http.proto), and Kong reads one
    // level too.
    let (status, _, _) = post("/v1/messages/", r#"{"greeting":"x"}"#);
    assert_eq!(status, 400);
    assert!(!gw.log_text().contains("panicked"));
}

/// grpc-web's JSON modes (Kong's grpc-web spec): `+json` framed with the trailer frame,
/// `application/json` plain, base64 in `-text+json`, a server stream's replies one after the
/// other, pass_stripped_path's method found under a route prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_web_json_modes_transcode_through_the_proto() {
    use base64::Engine;
    let up = Target::start();
    let hello = proto("hello.proto");
    let doc = json!({
        "_format_version": "3.0",
        "services": [{"name": "grpc", "url": format!("grpc://127.0.0.1:{}", up.port), "routes": [
            {"name": "web", "protocols": ["http"], "paths": ["/"],
             "plugins": [{"name": "grpc-web", "config": {"proto": hello}}]},
            {"name": "prefixed", "protocols": ["http"], "paths": ["/prefix"],
             "plugins": [{"name": "grpc-web", "config": {"proto": hello, "pass_stripped_path": true}}]},
        ]}],
    });
    let gw = Gateway::with_config(&doc.to_string()).start();
    let base = format!("http://127.0.0.1:{}", gw.proxy.port());
    let call = |path: &str, ctype: &str, body: &[u8]| {
        let file = std::env::temp_dir().join(format!("grpc-web-body-{}", fastrand_u64()));
        std::fs::write(&file, body).unwrap();
        let r = curl(&[
            "-H",
            &format!("content-type: {ctype}"),
            "--data-binary",
            &format!("@{}", file.display()),
            &format!("{base}{path}"),
        ]);
        let _ = std::fs::remove_file(file);
        r
    };
    let frame = |flags: u8, msg: &[u8]| {
        let mut f = vec![flags];
        f.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        f.extend_from_slice(msg);
        f
    };
    let trailer = frame(0x80, b"grpc-status:0\r\ngrpc-message:\r\n");

    // Kong's "Call gRPC-Web JSON via HTTP": byte for byte.
    let (status, h, body) = call(
        "/hello.HelloService/SayHello",
        "application/grpc-web+json",
        &frame(0, br#"{"greeting":"heya"}"#),
    );
    assert_eq!(status, 200, "{:?}", String::from_utf8_lossy(&body));
    assert_eq!(
        header(&h, "content-type"),
        Some("application/grpc-web+json")
    );
    let mut want = frame(0, br#"{"reply":"hello heya"}"#);
    want.extend_from_slice(&trailer);
    assert_eq!(body, want);
    // "Call plain JSON via HTTP", and under a stripped prefix.
    for path in [
        "/hello.HelloService/SayHello",
        "/prefix/hello.HelloService/SayHello",
    ] {
        let (status, _, body) = call(path, "application/json", br#"{"greeting":"heya"}"#);
        assert_eq!(status, 200, "{path}");
        assert_eq!(json_of(&body), json!({"reply": "hello heya"}), "{path}");
    }
    // Text mode: base64 both ways.
    let b64 = base64::engine::general_purpose::STANDARD;
    let (status, _, body) = call(
        "/hello.HelloService/SayHello",
        "application/grpc-web-text+json",
        b64.encode(frame(0, br#"{"greeting":"txt"}"#)).as_bytes(),
    );
    assert_eq!(status, 200);
    let raw: Vec<u8> = body
        .chunks(4)
        .flat_map(|c| b64.decode(c).unwrap())
        .collect();
    let mut want = frame(0, br#"{"reply":"hello txt"}"#);
    want.extend_from_slice(&trailer);
    assert_eq!(raw, want);
    // A server stream: each reply as its own JSON object (Kong's concatenation).
    let (status, _, body) = call(
        "/hello.HelloService/LotsOfReplies",
        "application/json",
        br#"{"greeting":"many"}"#,
    );
    assert_eq!(status, 200);
    assert_eq!(
        String::from_utf8_lossy(&body),
        r#"{"reply":"hello many 0"}{"reply":"hello many 1"}{"reply":"hello many 2"}"#
    );
    // Errors: an unknown method, JSON that is not, a field of the wrong type.
    let (status, _, body) = call("/hello.HelloService/Nope", "application/json", b"{}");
    assert_eq!(status, 400);
    assert_eq!(
        String::from_utf8_lossy(&body),
        r#"Unknown path "/hello.HelloService/Nope""#
    );
    let (status, _, body) = call(
        "/hello.HelloService/SayHello",
        "application/json",
        b"{\"greeting\":",
    );
    assert_eq!(status, 400);
    assert!(
        String::from_utf8_lossy(&body).starts_with("decode json err: Expected value"),
        "{:?}",
        String::from_utf8_lossy(&body)
    );
    let (status, _, _) = call(
        "/hello.HelloService/SayHello",
        "application/json",
        br#"{"greeting":5}"#,
    );
    assert_eq!(status, 400);
    // The binary mode still passes messages through untouched.
    let (status, _, body) = call(
        "/hello.HelloService/SayHello",
        "application/grpc-web+proto",
        &frame(0, b"\x0a\x02yo"),
    );
    assert_eq!(status, 200);
    let mut want = frame(0, b"\x0a\x08hello yo");
    want.extend_from_slice(&trailer);
    assert_eq!(body, want);
    assert!(!gw.log_text().contains("panicked"));
}

/// A `proto` that does not compile (or is not there): a node refuses a declarative file
/// naming it, with the plugin, the file and what is wrong; a `POST /config` applies as Kong's
/// does, the route failing closed (500, not proxied untranscoded) with the reason in the log
/// and in `/status`'s `configuration_problems`, every other route served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proto_that_does_not_compile_fails_closed_with_the_reason() {
    let up = Target::start();
    let dir = std::env::temp_dir().join(format!("bad-proto-{}", fastrand_u64()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.proto");
    std::fs::write(&bad, "syntax = \"proto3\";\nmessage {").unwrap();
    let bad = bad.to_string_lossy().into_owned();
    let good = proto("targetservice.proto");
    let with = |file: &str| {
        json!({
            "_format_version": "3.0",
            "services": [{"name": "grpc", "url": format!("grpc://127.0.0.1:{}", up.port), "routes": [
                {"name": "rest", "protocols": ["http"], "paths": ["/"],
                 "plugins": [{"name": "grpc-gateway", "config": {"proto": file}}]},
                {"name": "other", "protocols": ["http"], "paths": ["/other"],
                 "plugins": [{"name": "grpc-gateway", "config": {"proto": good}}]},
            ]}],
        })
    };
    let file = dir.join("kong.json");
    std::fs::write(&file, with(&bad).to_string()).unwrap();
    let parsed = Command::new(bin())
        .args(["config", "parse"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!parsed.status.success());
    let err = String::from_utf8_lossy(&parsed.stderr).into_owned();
    assert!(
        err.contains("grpc-gateway")
            && err.contains(&bad)
            && err.contains("expected an identifier"),
        "{err}"
    );
    let gw = Gateway::with_config(&with(&proto("targetservice.proto")).to_string()).start();
    let base = format!("http://127.0.0.1:{}", gw.proxy.port());
    for broken in [bad.clone(), "/nonexistent/x.proto".into()] {
        let r = gw.admin("POST", "/config", Some(with(&broken))).await;
        assert_eq!(r.status, 201, "{:?}", r.body);
        let (status, _, _) = curl(&[&format!("{base}/v1/messages/x")]);
        assert_eq!(status, 500);
        let (status, _, body) = curl(&[&format!("{base}/other/v1/messages/y")]);
        assert_eq!(status, 400, "{:?}", String::from_utf8_lossy(&body));
        let problems = gw.status().await["configuration_problems"].to_string();
        assert!(problems.contains(&broken), "{problems}");
        assert!(gw.log_text().contains(&broken));
    }
    let r = gw
        .admin("POST", "/config", Some(with(&proto("targetservice.proto"))))
        .await;
    assert_eq!(r.status, 201);
    let (status, _, body) = curl(&[&format!("{base}/v1/messages/again")]);
    assert_eq!(status, 200, "{:?}", String::from_utf8_lossy(&body));
    assert_eq!(json_of(&body)["reply"], "hello again");
    assert!(!gw.log_text().contains("panicked"));
    let _ = std::fs::remove_dir_all(dir);
}

fn fastrand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .elapsed()
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}
