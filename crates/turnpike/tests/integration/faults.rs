//! Upstream faults on the real binary, under a bounded load loop on loopback: a target killed
//! mid-traffic costs no idempotent request (retries, passive checks take it out) and comes back
//! through active checks; an upstream that takes requests and never answers gets idempotent
//! requests retried elsewhere and non-idempotent ones answered 504, never sent twice.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use bytes::Bytes;
use http_body_util::Full;

/// A load loop: `clients` tasks sending GETs on their own keep-alive connections until
/// `stop`, tallying statuses (0: the request failed at the client).
fn load(
    proxy: SocketAddr,
    clients: usize,
    stop: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<BTreeMap<u16, usize>>> {
    (0..clients)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut tally = BTreeMap::new();
                while !stop.load(Ordering::Relaxed) {
                    let r = call(proxy, "GET", "/", &[]).await;
                    *tally.entry(r.status).or_insert(0) += 1;
                }
                tally
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_target_killed_under_load_costs_no_request_and_comes_back() {
    let ports = [free_port(), free_port(), free_port()];
    let mut ups: Vec<Option<Upstream>> = ports
        .iter()
        .map(|p| Some(Upstream::start_on(&format!("t{p}"), *p)))
        .collect();
    let targets: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
upstreams:
- name: trio
  healthchecks:
    passive: {{unhealthy: {{tcp_failures: 1, timeouts: 1}}}}
    active:
      http_path: /status/200
      timeout: 0.5
      healthy: {{interval: 0.2, successes: 1}}
      unhealthy: {{interval: 0.2, tcp_failures: 1}}
  targets: [{{target: "{}"}}, {{target: "{}"}}, {{target: "{}"}}]
services:
- name: s
  host: trio
  retries: 2
  read_timeout: 2000
  routes: [{{paths: [/]}}]
"#,
        targets[0], targets[1], targets[2]
    ))
    .start();

    let stop = Arc::new(AtomicBool::new(false));
    let loops = load(gw.proxy, 4, stop.clone());
    tokio::time::sleep(Duration::from_millis(700)).await;

    // Killed mid-traffic: its open connections drop, in-flight requests included.
    ups[1] = None;
    assert!(
        eventually(Duration::from_secs(10), async || {
            gw.health_of("trio", &targets[1]).await == "UNHEALTHY"
        })
        .await,
        "the dead target was not marked unhealthy"
    );
    tokio::time::sleep(Duration::from_millis(700)).await;

    // Back on the same port: active checks mark it healthy and it takes traffic again.
    ups[1] = Some(Upstream::start_on("back", ports[1]));
    assert!(
        eventually(Duration::from_secs(10), async || {
            gw.health_of("trio", &targets[1]).await == "HEALTHY"
        })
        .await,
        "the target that came back stayed unhealthy"
    );
    let back = ups[1].as_ref().unwrap().connections.clone();
    assert!(
        eventually(Duration::from_secs(10), async || back
            .load(Ordering::SeqCst)
            > 0)
        .await,
        "no traffic reached the target that came back"
    );
    stop.store(true, Ordering::Relaxed);
    let mut total: BTreeMap<u16, usize> = BTreeMap::new();
    for l in loops {
        for (s, n) in l.await.unwrap() {
            *total.entry(s).or_insert(0) += n;
        }
    }
    let ok = total.get(&200).copied().unwrap_or(0);
    assert_eq!(total.len(), 1, "failed requests under load: {total:?}");
    assert!(ok > 50, "too little load to mean anything: {total:?}");
}

/// A TCP server that reads requests and never answers; returns its address and the request
/// lines it received.
fn silent_upstream() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let seen = seen2.clone();
            std::thread::spawn(move || {
                use std::io::Read;
                let mut buf = [0u8; 4096];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let text = String::from_utf8_lossy(&buf[..n]).to_string();
                    if let Some(line) = text.lines().next() {
                        if line.contains("HTTP/1.1") {
                            seen.lock().unwrap().push(line.to_string());
                        }
                    }
                }
            });
        }
    });
    (addr, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_requests_are_retried_only_when_idempotent() {
    let alive = Upstream::start("alive");
    let (silent, seen) = silent_upstream();
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
upstreams:
- name: pair
  targets: [{{target: "{silent}"}}, {{target: "{}"}}]
services:
- name: s
  host: pair
  retries: 1
  read_timeout: 300
  routes: [{{paths: [/]}}]
- name: lone
  url: http://{silent}
  retries: 0
  read_timeout: 300
  routes: [{{paths: [/lone]}}]
"#,
        alive.addr
    ))
    .env("TURNPIKE_NGINX_WORKER_PROCESSES", "1")
    .start();

    // Round-robin sends every other request to the silent target: GETs are retried on the
    // live one after read_timeout, and all succeed.
    for _ in 0..4 {
        let r = call(gw.proxy, "GET", "/", &[]).await;
        assert_eq!(r.status, 200);
    }
    let gets = seen.lock().unwrap().len();
    assert!(gets >= 1, "the silent target never got a GET");
    assert!(
        alive.connections.load(Ordering::SeqCst) > 0,
        "retries went to the live target"
    );

    // POSTs are not idempotent: the one that went to the silent target is answered 504 and
    // was sent once, not again to the other target.
    let mut statuses = BTreeMap::new();
    for _ in 0..4 {
        let r = send(
            gw.proxy,
            req("POST", "/")
                .body(Full::new(Bytes::from("payload")))
                .unwrap(),
        )
        .await;
        *statuses.entry(r.status).or_insert(0usize) += 1;
    }
    let posts_to_silent = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.starts_with("POST"))
        .count();
    let timed_out = statuses.get(&504).copied().unwrap_or(0);
    assert!(
        timed_out >= 1,
        "no POST met the silent target: {statuses:?}"
    );
    assert_eq!(
        timed_out + statuses.get(&200).copied().unwrap_or(0),
        4,
        "{statuses:?}"
    );
    // Each POST the silent target got is one the client saw fail: none was sent on.
    assert_eq!(posts_to_silent, timed_out, "{statuses:?}");

    // Nowhere else to go (retries 0): 504 after read_timeout, in Kong's words.
    let r = call(gw.proxy, "GET", "/lone", &[]).await;
    assert_eq!(r.status, 504);
    assert_eq!(r.json()["message"], "The upstream server is timed out");
}
