//! gRPC through the gateway with real gRPC implementations on both sides: Python's `grpcio`
//! (Google's C core) as the server behind the gateway and as the client in front of it, over
//! h2c on a listener flagged `http2` and over TLS (ALPN h2), to `grpc` (h2c) and `grpcs`
//! (TLS) services. Kong 3.9's behaviour: `kong/runloop/handler.lua` (the checks after a gRPC
//! route matched, `@grpc`), `kong/pdk/response.lua` (the gateway's own answers to a gRPC
//! client) and `kong/error_handlers.lua` (upstream failures).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

use serde_json::{json, Value};

use crate::common::*;

mod transcoding;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/integration/grpc")
        .join(name)
}

/// `PYTHONPATH` for a Python with `grpcio`: the system's when it has it, else one installed
/// from PyPI into the target directory, once.
fn python_path() -> &'static str {
    static PATH: OnceLock<String> = OnceLock::new();
    PATH.get_or_init(|| python_with("grpc", "grpcio", "python-grpcio"))
}

/// `NODE_PATH` holding the official gRPC-Web client (npm `grpc-web`) and the XMLHttpRequest
/// it needs in Node (`xhr2`), installed from the npm registry into the target directory once.
fn node_path() -> &'static str {
    static PATH: OnceLock<String> = OnceLock::new();
    PATH.get_or_init(|| {
        node_modules_with("grpc-web-js", &["grpc-web@2.1.1", "xhr2@0.2.1"])
            .to_string_lossy()
            .into_owned()
    })
}

/// A test client's output: its JSON list of results, or a panic showing what it printed.
fn results(out: &std::process::Output) -> Vec<Value> {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str::<Vec<Value>>(&text).unwrap_or_else(|_| {
        panic!(
            "client output: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Runs `calls` with the official gRPC-Web client in Node (`grpc_web_client.js`) against
/// `base` in `format` (`text` or `binary`): one result each.
fn grpc_web_calls(base: &str, format: &str, calls: Value) -> Vec<Value> {
    let out = Command::new("node")
        .arg(fixture("grpc_web_client.js"))
        .args([base, format, &calls.to_string()])
        .env("NODE_PATH", node_path())
        .output()
        .expect("run node");
    results(&out)
}

/// A grpcio server (`echo_server.py`) on a free port, killed on drop.
pub struct GrpcServer {
    child: Child,
    pub port: u16,
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl GrpcServer {
    /// `tls`: certificate and key PEM files (the server then speaks TLS with ALPN h2).
    pub fn start(name: &str, tls: Option<(&Path, &Path)>) -> GrpcServer {
        for _ in 0..3 {
            let port = free_port();
            let mut cmd = Command::new("python3");
            cmd.arg(fixture("echo_server.py"))
                .arg(port.to_string())
                .arg(name)
                .env("PYTHONPATH", python_path())
                .stdout(Stdio::piped())
                .stderr(Stdio::null());
            if let Some((c, k)) = tls {
                cmd.arg(c).arg(k);
            }
            let mut child = cmd.spawn().expect("start the gRPC server");
            let mut line = String::new();
            let _ = BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
            if line.trim() == "ready" {
                return GrpcServer { child, port };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("the gRPC server did not start");
    }
}

/// Runs `calls` with grpcio's client against `target` (see `client.py`): one result each.
pub fn grpc_calls(target: &str, calls: Value, args: &[&str]) -> Vec<Value> {
    let out = Command::new("python3")
        .arg(fixture("client.py"))
        .arg(target)
        .arg(calls.to_string())
        .args(args)
        .env("PYTHONPATH", python_path())
        .output()
        .expect("run the gRPC client");
    results(&out)
}

fn unary(method: &str, request: &str, metadata: Value) -> Value {
    json!({"method": format!("/echo.Echo/{method}"), "request": request, "metadata": metadata})
}

fn config(grpc_port: u16, grpcs_port: u16, dead: u16, cert: &str, key: &str) -> String {
    let doc = json!({
        "_format_version": "3.0",
        "services": [
            {"name": "g", "url": format!("grpc://127.0.0.1:{grpc_port}"), "routes": [
                {"name": "any", "protocols": ["grpc", "grpcs"], "hosts": ["grpc.test"]},
                {"name": "secure-only", "protocols": ["grpcs"], "hosts": ["secure.test"]},
                {"name": "keyed", "protocols": ["grpc"], "hosts": ["keyed.test"],
                 "plugins": [{"name": "key-auth"}]},
                {"name": "http-route", "protocols": ["http"], "hosts": ["http.test"]},
            ]},
            {"name": "gs", "url": format!("grpcs://localhost:{grpcs_port}"), "routes": [
                {"name": "to-grpcs", "protocols": ["grpc", "grpcs"], "hosts": ["tls-upstream.test"]},
            ]},
            {"name": "down", "url": format!("grpc://127.0.0.1:{dead}"), "routes": [
                {"name": "to-down", "protocols": ["grpc"], "hosts": ["down.test"]},
            ]},
        ],
        "consumers": [{"username": "u", "keyauth_credentials": [{"key": "k1"}]}],
        "certificates": [{"cert": cert, "key": key, "snis": [{"name": "secure.test"}]}],
    });
    serde_json::to_string(&doc).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_calls_of_every_kind_through_h2c_and_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (ucert, ukey) = cert_for("localhost");
    let ucert_path = write(dir.path(), "up.crt", &ucert);
    let ukey_path = write(dir.path(), "up.key", &ukey);
    let plain = GrpcServer::start("plain", None);
    let tls = GrpcServer::start("tls", Some((&ucert_path, &ukey_path)));
    let (_dead_socket, dead) = dead_port();
    let (cert, key) = cert_for("secure.test");
    let ca = write(dir.path(), "gw.crt", &cert);
    let gw = Gateway::with_config(&config(plain.port, tls.port, dead, &cert, &key)).start_h2();
    let h2c = gw.proxy.to_string();
    let as_host = |h: &str| vec!["--authority".to_string(), h.to_string()];
    let run = |host: &str, calls: Value| {
        let a = as_host(host);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        grpc_calls(&h2c, calls, &a)
    };

    // Every kind of call, h2c to an h2c upstream: messages, metadata and trailers pass.
    let r = run(
        "grpc.test",
        json!([
            unary("Unary", "hi", json!([])),
            {"method": "/echo.Echo/ServerStream", "kind": "server", "request": "3:x"},
            {"method": "/echo.Echo/ClientStream", "kind": "client", "request": ["a", "b", "c"]},
            {"method": "/echo.Echo/Bidi", "kind": "bidi", "request": ["p", "q"]},
            unary("Fail", "PERMISSION_DENIED:not you", json!([])),
            unary("Meta", "", json!([["x-custom", "v"]])),
        ]),
    );
    assert_eq!(r[0]["code"], "OK", "{r:?}");
    assert_eq!(r[0]["responses"], json!(["plain:hi"]));
    assert_eq!(r[0]["initial_metadata"]["x-server"], "plain");
    // Kong's Via for a gRPC upstream names HTTP/2.
    let via = r[0]["initial_metadata"]["via"].as_str().unwrap_or_default();
    assert!(via.starts_with("2 turnpike/"), "{via}");
    assert_eq!(r[1]["responses"], json!(["x0", "x1", "x2"]), "{r:?}");
    assert_eq!(r[2]["responses"], json!(["a,b,c"]), "{r:?}");
    assert_eq!(r[3]["responses"], json!(["P", "Q"]), "{r:?}");
    assert_eq!(r[4]["code"], "PERMISSION_DENIED");
    assert_eq!(r[4]["details"], "not you");
    assert_eq!(r[4]["trailing_metadata"]["x-trailer"], "kept");
    assert_eq!(r[5]["code"], "OK");
    let meta: Value = serde_json::from_str(r[5]["responses"][0].as_str().unwrap()).unwrap();
    assert_eq!(meta["x-custom"], "v");
    assert_eq!(meta["x-forwarded-proto"], "http");
    assert_eq!(meta["x-forwarded-host"], "grpc.test");
    assert_eq!(meta["x-forwarded-path"], "/echo.Echo/Meta");
    assert_eq!(meta["x-real-ip"], "127.0.0.1");

    // A grpcs upstream (TLS, ALPN h2; not verified, as Kong's grpc_pass) from h2c.
    let r = run("tls-upstream.test", json!([unary("Unary", "s", json!([]))]));
    assert_eq!(r[0]["responses"], json!(["tls:s"]), "{r:?}");

    // The gateway's own answers reach a gRPC client as gRPC statuses (Kong's table and
    // canonical messages; upstream failures with the error handler's message).
    let r = run("nowhere.test", json!([unary("Unary", "x", json!([]))]));
    assert_eq!(
        (&r[0]["code"], &r[0]["details"]),
        (&json!("NOT_FOUND"), &json!("NotFound"))
    );
    let r = run(
        "keyed.test",
        json!([
            unary("Unary", "x", json!([])),
            unary("Unary", "x", json!([["apikey", "k1"]])),
        ]),
    );
    assert_eq!(
        (&r[0]["code"], &r[0]["details"]),
        (&json!("UNAUTHENTICATED"), &json!("Unauthenticated"))
    );
    assert_eq!(r[1]["responses"], json!(["plain:x"]), "{r:?}");
    let r = run("down.test", json!([unary("Unary", "x", json!([]))]));
    assert_eq!(r[0]["code"], "INTERNAL", "{r:?}");
    assert_eq!(
        r[0]["details"],
        "An invalid response was received from the upstream server"
    );
    // Cleartext gRPC on a grpcs-only route: Kong's HTTP 200 with grpc-status 1.
    let r = run("secure.test", json!([unary("Unary", "x", json!([]))]));
    assert_eq!(
        (&r[0]["code"], &r[0]["details"]),
        (
            &json!("CANCELLED"),
            &json!("gRPC request matched gRPCs route")
        )
    );
    // A gRPC service behind an http route takes gRPC too.
    let r = run("http.test", json!([unary("Unary", "h", json!([]))]));
    assert_eq!(r[0]["responses"], json!(["plain:h"]), "{r:?}");

    // Over TLS (ALPN h2), the grpcs-only route serves.
    let ca = ca.to_string_lossy().into_owned();
    let r = grpc_calls(
        &gw.proxy_tls.to_string(),
        json!([
            unary("Unary", "t", json!([])),
            {"method": "/echo.Echo/Bidi", "kind": "bidi", "request": ["m"]},
            unary("Meta", "", json!([])),
        ]),
        &["--tls", &ca, "--authority", "secure.test"],
    );
    assert_eq!(r[0]["responses"], json!(["plain:t"]), "{r:?}");
    assert_eq!(r[1]["responses"], json!(["M"]), "{r:?}");
    let meta: Value = serde_json::from_str(r[2]["responses"][0].as_str().unwrap()).unwrap();
    assert_eq!(meta["x-forwarded-proto"], "https");

    // Not gRPC, or not HTTP/2, on a gRPC route: Kong's 415 and 426.
    let http1_post = |ctype: &str| {
        http::Request::builder()
            .method("POST")
            .uri("/echo.Echo/Unary")
            .header("host", "grpc.test")
            .header("content-type", ctype)
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap()
    };
    let r = send(gw.proxy, http1_post("application/grpc")).await;
    assert_eq!(r.status, 426);
    assert_eq!(r.header("upgrade"), Some("HTTP/2"));
    assert_eq!(r.json()["message"], "Please use HTTP2 protocol");
    let r = send(gw.proxy, http1_post("application/json")).await;
    assert_eq!(r.status, 415);
    assert_eq!(r.json()["message"], "Non-gRPC request matched gRPC route");
    // Upstream connections are reused: at most one HTTP/2 connection per peer per worker (two
    // workers, two peers that answered) carried the 12 calls that reached an upstream.
    let mut status = Value::Null;
    assert!(
        eventually(std::time::Duration::from_secs(10), async || {
            status = gw.status().await;
            status["upstream"]["requests"].as_u64() >= Some(12)
        })
        .await,
        "{status}"
    );
    assert!(
        status["upstream"]["connections_opened"].as_u64() <= Some(4),
        "{status}"
    );
    assert!(!gw.log_text().contains("panicked"));
}

/// The service's timeouts and retries, balancing, plugins and large messages on gRPC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_timeouts_retries_limits_and_large_messages() {
    let up = GrpcServer::start("up", None);
    let (_dead_socket, dead) = dead_port();
    let doc = json!({
        "_format_version": "3.0",
        "upstreams": [{"name": "pool", "targets": [
            {"target": format!("127.0.0.1:{dead}")},
            {"target": format!("127.0.0.1:{}", up.port)},
        ]}],
        "services": [
            {"name": "balanced", "url": "grpc://pool", "routes": [
                {"name": "b", "protocols": ["grpc"], "hosts": ["balanced.test"]},
            ]},
            {"name": "slow", "url": format!("grpc://127.0.0.1:{}", up.port), "read_timeout": 300,
             "routes": [{"name": "s", "protocols": ["grpc"], "hosts": ["slow.test"]}]},
            {"name": "limited", "url": format!("grpc://127.0.0.1:{}", up.port), "routes": [
                {"name": "l", "protocols": ["grpc"], "hosts": ["limited.test"],
                 "plugins": [{"name": "rate-limiting", "config": {"minute": 2, "policy": "local"}}]},
                {"name": "acl", "protocols": ["grpc"], "hosts": ["ip.test"],
                 "plugins": [{"name": "ip-restriction", "config": {"deny": ["127.0.0.1"]}}]},
                {"name": "sized", "protocols": ["grpc"], "hosts": ["size.test"],
                 "plugins": [{"name": "request-size-limiting",
                              "config": {"allowed_payload_size": 1, "size_unit": "kilobytes"}}]},
            ]},
        ],
    });
    let gw = Gateway::with_config(&doc.to_string()).start_h2();
    let target = gw.proxy.to_string();
    let at = |host: &str, calls: Value| grpc_calls(&target, calls, &["--authority", host]);

    // A dead target is retried on the live one: every call succeeds.
    let calls: Vec<Value> = (0..6)
        .map(|i| unary("Unary", &i.to_string(), json!([])))
        .collect();
    let r = at("balanced.test", Value::Array(calls));
    for (i, c) in r.iter().enumerate() {
        assert_eq!(c["responses"], json!([format!("up:{i}")]), "{r:?}");
    }
    // The service's read_timeout: the gateway's 504, DeadlineExceeded with Kong's message; a
    // call within it passes.
    let r = at(
        "slow.test",
        json!([
            unary("Sleep", "1000", json!([])),
            unary("Sleep", "10", json!([]))
        ]),
    );
    assert_eq!(r[0]["code"], "DEADLINE_EXCEEDED", "{r:?}");
    assert_eq!(r[0]["details"], "The upstream server is timing out");
    assert_eq!(r[1]["responses"], json!(["slept"]), "{r:?}");
    // The read timeout counts between two frames (nginx's grpc_read_timeout), not over the
    // call: six messages 100 ms apart take longer than the 300 ms but pass; a gap of 1.5 s
    // after the first message ends the call with the client's stream reset, not an OK.
    let stream =
        |req: &str| json!({"method": "/echo.Echo/SlowStream", "kind": "server", "request": req});
    let r = at("slow.test", json!([stream("6:100"), stream("2:1500")]));
    assert_eq!(r[0]["code"], "OK", "{r:?}");
    assert_eq!(
        r[0]["responses"],
        json!(["0", "1", "2", "3", "4", "5"]),
        "{r:?}"
    );
    assert_eq!(r[1]["responses"], json!(["0"]), "{r:?}");
    assert_eq!(r[1]["code"], "INTERNAL", "{r:?}");
    assert!(
        gw.log_text().contains("upstream timed out"),
        "{}",
        gw.log_text()
    );
    // A client deadline shorter than the call ends it on time (the gateway holds nothing back).
    let r = at(
        "balanced.test",
        json!([{"method": "/echo.Echo/Sleep", "request": "2000", "timeout": 0.3}]),
    );
    assert_eq!(r[0]["code"], "DEADLINE_EXCEEDED", "{r:?}");
    // rate-limiting: ResourceExhausted after the limit; ip-restriction: PermissionDenied.
    let calls: Vec<Value> = (0..3).map(|_| unary("Unary", "r", json!([]))).collect();
    let r = at("limited.test", Value::Array(calls));
    assert_eq!(r[0]["code"], "OK", "{r:?}");
    assert_eq!(r[1]["code"], "OK", "{r:?}");
    assert_eq!(
        (&r[2]["code"], &r[2]["details"]),
        (&json!("RESOURCE_EXHAUSTED"), &json!("ResourceExhausted"))
    );
    let r = at("ip.test", json!([unary("Unary", "x", json!([]))]));
    assert_eq!(
        (&r[0]["code"], &r[0]["details"]),
        (&json!("PERMISSION_DENIED"), &json!("PermissionDenied"))
    );
    // request-size-limiting on calls with no declared length, held as they stream (not read
    // whole first): a call within 1 KiB passes; a client stream past it gets Kong's 413 as
    // its gRPC status (with the status's name as the message, as for every gateway error
    // above), and so does a unary call past it.
    let client = |n: usize, size: usize| {
        json!({"method": "/echo.Echo/ClientStream", "kind": "client",
               "request": vec!["z"; n], "repeat": size})
    };
    let r = at(
        "size.test",
        json!([
            client(3, 100),
            client(8, 300),
            {"method": "/echo.Echo/Unary", "request": "x", "repeat": 4096},
            unary("Unary", "small", json!([])),
        ]),
    );
    assert_eq!(
        (&r[0]["code"], &r[0]["responses"]),
        (&json!("OK"), &json!([302])),
        "{r:?}"
    );
    for over in [&r[1], &r[2]] {
        assert_eq!(
            (&over["code"], &over["details"]),
            (&json!("INVALID_ARGUMENT"), &json!("InvalidArgument")),
            "{r:?}"
        );
    }
    assert_eq!(r[3]["code"], "OK", "the connection serves on: {r:?}");
    // Large messages both ways, streamed (3 MiB each way; 8 messages of 1 MiB in a bidi call).
    let r = at(
        "slow.test",
        json!([
            {"method": "/echo.Echo/Unary", "request": "x", "repeat": 3 << 20},
            {"method": "/echo.Echo/Bidi", "kind": "bidi", "request": vec!["y"; 8], "repeat": 1 << 20},
        ]),
    );
    assert_eq!(r[0]["responses"], json!([(3 << 20) + 3]), "{r:?}");
    assert_eq!(r[1]["responses"], json!(vec![1 << 20; 8]), "{r:?}");
    assert!(!gw.log_text().contains("panicked"));
}

fn grpc_frame(flag: u8, msg: &[u8]) -> Vec<u8> {
    let mut f = vec![flag];
    f.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    f.extend_from_slice(msg);
    f
}

/// The frames of a gRPC-Web body: (flag, payload).
fn grpc_frames(mut b: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    while b.len() >= 5 {
        let n = u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize;
        out.push((b[0], b[5..5 + n].to_vec()));
        b = &b[5 + n..];
    }
    assert!(b.is_empty(), "a partial frame left");
    out
}

/// grpc-web-text bodies are base64 pieces one after the other, each padded: decoded four
/// characters at a time, as gRPC-Web clients decode them.
fn unbase64_pieces(text: &[u8]) -> Vec<u8> {
    use base64::Engine;
    text.chunks(4)
        .flat_map(|c| base64::engine::general_purpose::STANDARD.decode(c).unwrap())
        .collect()
}

/// The grpc-web plugin: a gRPC-Web client over HTTP/1.1 (binary and text modes), a grpcio
/// server behind; CORS preflight, the trailer frame from the upstream's trailers (or its
/// trailers-only answer), Kong's 400 for a mode that needs a .proto.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_web_clients_reach_a_grpc_service() {
    use base64::Engine;
    let up = GrpcServer::start("web", None);
    let doc = json!({
        "_format_version": "3.0",
        "services": [{"name": "g", "url": format!("grpc://127.0.0.1:{}", up.port), "routes": [
            {"name": "web", "protocols": ["http"], "paths": ["/"], "hosts": ["web.test"],
             "plugins": [{"name": "grpc-web", "config": {"allow_origin_header": "https://app.test"}}]},
            {"name": "stripped", "protocols": ["http"], "paths": ["/web"], "hosts": ["prefixed.test"],
             "plugins": [{"name": "grpc-web", "config": {"pass_stripped_path": true}}]},
            {"name": "unstripped", "protocols": ["http"], "paths": ["/raw"], "hosts": ["prefixed.test"],
             "plugins": [{"name": "grpc-web"}]},
        ]}],
    });
    let gw = Gateway::with_config(&doc.to_string()).start();
    let post = |path: &str, ctype: &str, body: Vec<u8>| {
        http::Request::builder()
            .method("POST")
            .uri(path)
            .header("host", "web.test")
            .header("content-type", ctype)
            .header("x-grpc-web", "1")
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .unwrap()
    };
    let trailer = |status: &str, msg: &str| {
        (
            0x80u8,
            format!("grpc-status:{status}\r\ngrpc-message:{msg}\r\n").into_bytes(),
        )
    };

    // Binary mode, unary.
    let r = send(
        gw.proxy,
        post(
            "/echo.Echo/Unary",
            "application/grpc-web+proto",
            grpc_frame(0, b"hi"),
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.header("content-type"), Some("application/grpc-web+proto"));
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.test")
    );
    assert_eq!(
        grpc_frames(&r.body),
        vec![(0, b"web:hi".to_vec()), trailer("0", "")]
    );
    // Text mode, server streaming.
    let body = base64::engine::general_purpose::STANDARD.encode(grpc_frame(0, b"3:s"));
    let r = send(
        gw.proxy,
        post(
            "/echo.Echo/ServerStream",
            "application/grpc-web-text",
            body.into_bytes(),
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.header("content-type"), Some("application/grpc-web-text"));
    assert_eq!(
        grpc_frames(&unbase64_pieces(&r.body)),
        vec![
            (0, b"s0".to_vec()),
            (0, b"s1".to_vec()),
            (0, b"s2".to_vec()),
            trailer("0", "")
        ]
    );
    // An error: the upstream's status in the trailer frame.
    let r = send(
        gw.proxy,
        post(
            "/echo.Echo/Fail",
            "application/grpc-web",
            grpc_frame(0, b"PERMISSION_DENIED:no"),
        ),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(grpc_frames(&r.body).last(), Some(&trailer("7", "no")));
    // An error after a message: the status came in the upstream's HTTP/2 trailers.
    let r = send(
        gw.proxy,
        post(
            "/echo.Echo/StreamFail",
            "application/grpc-web",
            grpc_frame(0, b"FAILED_PRECONDITION:late"),
        ),
    )
    .await;
    assert_eq!(
        grpc_frames(&r.body),
        vec![(0, b"partial".to_vec()), trailer("9", "late")]
    );
    // CORS preflight.
    let r = send(
        gw.proxy,
        http::Request::builder()
            .method("OPTIONS")
            .uri("/echo.Echo/Unary")
            .header("host", "web.test")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(&r.body[..], b"OK");
    assert_eq!(r.header("access-control-allow-methods"), Some("POST"));
    assert_eq!(
        r.header("access-control-allow-headers"),
        Some("content-type,x-grpc-web,x-user-agent")
    );
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.test")
    );
    // A gRPC service gets the request's own path (nginx's grpc_pass), unless grpc-web's
    // pass_stripped_path asks for the route's stripped one.
    let prefixed = |path: &str| {
        http::Request::builder()
            .method("POST")
            .uri(path)
            .header("host", "prefixed.test")
            .header("content-type", "application/grpc-web")
            .body(http_body_util::Full::new(bytes::Bytes::from(grpc_frame(
                0, b"p",
            ))))
            .unwrap()
    };
    let r = send(gw.proxy, prefixed("/web/echo.Echo/Unary")).await;
    assert_eq!(
        grpc_frames(&r.body),
        vec![(0, b"web:p".to_vec()), trailer("0", "")],
        "{:?}",
        r.body
    );
    let r = send(gw.proxy, prefixed("/raw/echo.Echo/Unary")).await;
    let frames = grpc_frames(&r.body);
    let last = String::from_utf8_lossy(&frames.last().unwrap().1).to_string();
    assert!(last.starts_with("grpc-status:12\r\n"), "{last:?}");
    // JSON needs the service's .proto: Kong's 400.
    let r = send(
        gw.proxy,
        post("/echo.Echo/Unary", "application/json", b"{}".to_vec()),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        &r.body[..],
        b"transcoding requests require a .proto file defining the service"
    );
    assert!(!gw.log_text().contains("panicked"));
}

/// The official gRPC-Web client (npm `grpc-web`, what browsers run), in Node, through the
/// grpc-web plugin to a grpcio server: text and binary modes, unary and server streaming,
/// the upstream's initial metadata and request metadata passed through, and statuses from the
/// trailer frame (an error before any message, and one after a message).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_grpc_web_client_reaches_a_grpc_service() {
    let up = GrpcServer::start("web", None);
    let doc = json!({
        "_format_version": "3.0",
        "services": [{"name": "g", "url": format!("grpc://127.0.0.1:{}", up.port), "routes": [
            {"name": "web", "protocols": ["http"], "paths": ["/"],
             "plugins": [{"name": "grpc-web"}]},
        ]}],
    });
    let gw = Gateway::with_config(&doc.to_string()).start();
    let base = format!("http://{}", gw.proxy);
    for format in ["text", "binary"] {
        let r = grpc_web_calls(
            &base,
            format,
            json!([
                {"method": "Unary", "request": "hi"},
                {"method": "ServerStream", "kind": "server", "request": "3:s"},
                {"method": "Meta", "request": "", "metadata": {"x-who": "js"}},
                {"method": "Fail", "request": "PERMISSION_DENIED:nope"},
                {"method": "StreamFail", "kind": "server", "request": "FAILED_PRECONDITION:late"},
            ]),
        );
        assert_eq!(r[0]["code"], 0, "{format}: {r:?}");
        assert_eq!(r[0]["responses"], json!(["web:hi"]), "{format}: {r:?}");
        assert_eq!(r[0]["headers"]["x-server"], "web", "{format}: {r:?}");
        assert_eq!(
            r[1]["responses"],
            json!(["s0", "s1", "s2"]),
            "{format}: {r:?}"
        );
        assert_eq!(r[1]["code"], 0, "{format}: {r:?}");
        let seen: Value = serde_json::from_str(r[2]["responses"][0].as_str().unwrap()).unwrap();
        assert_eq!(seen["x-who"], "js", "{format}: {seen}");
        assert_eq!(seen["x-grpc-web"], "1", "{format}: {seen}");
        assert_eq!(
            (&r[3]["code"], &r[3]["message"]),
            (&json!(7), &json!("nope"))
        );
        assert_eq!(r[4]["responses"], json!(["partial"]), "{format}: {r:?}");
        assert_eq!(
            (&r[4]["code"], &r[4]["message"]),
            (&json!(9), &json!("late"))
        );
    }
    assert!(!gw.log_text().contains("panicked"));
}

/// Bad input on the gRPC paths, each answered or closed without a panic while other calls
/// keep flowing: malformed HTTP/2 after the preface (a SETTINGS frame whose length is not a
/// multiple of 6: the connection ends with a GOAWAY), a grpc-web body with a truncated length
/// prefix (the upstream's error comes back in the trailer frame), and grpc-web text that is
/// not base64.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_on_the_grpc_paths_is_answered_not_panicked_on() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let up = GrpcServer::start("bad", None);
    let doc = json!({
        "_format_version": "3.0",
        "services": [{"name": "g", "url": format!("grpc://127.0.0.1:{}", up.port), "routes": [
            {"name": "grpc", "protocols": ["grpc"], "hosts": ["g.test"]},
            {"name": "web", "protocols": ["http"], "hosts": ["web.test"], "paths": ["/"],
             "plugins": [{"name": "grpc-web"}]},
        ]}],
    });
    let gw = Gateway::with_config(&doc.to_string()).start_h2();
    let target = gw.proxy.to_string();

    // Malformed HTTP/2: the preface, then a SETTINGS frame of 5 bytes.
    let mut s = tokio::net::TcpStream::connect(gw.proxy).await.unwrap();
    let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    bytes.extend_from_slice(&[0, 0, 5, 0x4, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5]);
    s.write_all(&bytes).await.unwrap();
    let mut back = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut back))
        .await
        .expect("the connection is closed")
        .ok();
    // A GOAWAY (frame type 7) among the frames the server wrote.
    let mut frames = &back[..];
    let mut goaway = false;
    while frames.len() >= 9 {
        let len =
            (usize::from(frames[0]) << 16) | (usize::from(frames[1]) << 8) | usize::from(frames[2]);
        goaway |= frames[3] == 7;
        frames = &frames[(9 + len).min(frames.len())..];
    }
    assert!(goaway, "{back:?}");

    // grpc-web: a truncated length prefix, and text that is not base64.
    let post = |ctype: &str, body: Vec<u8>| {
        http::Request::builder()
            .method("POST")
            .uri("/echo.Echo/Unary")
            .header("host", "web.test")
            .header("content-type", ctype)
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .unwrap()
    };
    let r = send(gw.proxy, post("application/grpc-web", vec![0, 0, 0])).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let frames = grpc_frames(&r.body);
    let trailer = String::from_utf8_lossy(&frames.last().expect("a trailer frame").1).to_string();
    assert!(
        trailer.starts_with("grpc-status:") && !trailer.starts_with("grpc-status:0"),
        "{trailer:?}"
    );
    let r = send(
        gw.proxy,
        post("application/grpc-web-text", b"!!not base64!!".to_vec()),
    )
    .await;
    assert!(r.status >= 200, "answered: {}", r.status);

    // Other calls flow.
    let r = grpc_calls(
        &target,
        json!([unary("Unary", "after", json!([]))]),
        &["--authority", "g.test"],
    );
    assert_eq!(r[0]["responses"], json!(["bad:after"]), "{r:?}");
    assert!(!gw.log_text().contains("panicked"));
}
