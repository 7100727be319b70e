//! `head-parse (ours|httparse) N`: parses the plain case's response head and request head N
//! times. Run under callgrind twice (N and 1) by bench/experiments/head-parse.sh.

#[allow(dead_code)]
#[path = "../../../crates/turnpike-proxy/src/h1_parse.rs"]
mod h1_parse;

use std::hint::black_box;

/// What the reference upstream (nginx, `return 200 "ok\n"`) answers, and what
/// bench/instructions.sh's client (Python's http.client) sends.
const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Mon, 23 Nov 2026 20:50:00 GMT\r\nContent-Type: text/plain\r\nContent-Length: 3\r\nConnection: keep-alive\r\n\r\nok\n";
const REQUEST: &[u8] =
    b"GET / HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nAccept-Encoding: identity\r\n\r\n";

fn main() {
    let mut args = std::env::args().skip(1);
    let which = args.next().expect("ours|httparse");
    let n: usize = args.next().expect("N").parse().expect("N");
    let mut total = 0usize;
    // Offsets kept on the stack, as the proxy keeps them.
    let mut fields = [h1_parse::Field {
        name_start: 0,
        name_end: 0,
        value_start: 0,
        value_end: 0,
    }; 16];
    for _ in 0..n {
        if which == "ours" {
            let mut k = 0;
            let (_, len) = h1_parse::response(black_box(RESPONSE), 16, |f| {
                fields[k] = f;
                k += 1;
            })
            .unwrap()
            .unwrap();
            total += len + black_box(&fields[..k]).len();
            let mut k = 0;
            let (_, len) = h1_parse::request(black_box(REQUEST), 16, |f| {
                fields[k] = f;
                k += 1;
            })
            .unwrap()
            .unwrap();
            total += len + black_box(&fields[..k]).len();
        } else {
            let mut h = [httparse::EMPTY_HEADER; 16];
            let mut r = httparse::Response::new(&mut h);
            if let httparse::Status::Complete(len) = r.parse(black_box(RESPONSE)).unwrap() {
                total += len + black_box(&r.headers).len();
            }
            let mut h = [httparse::EMPTY_HEADER; 16];
            let mut r = httparse::Request::new(&mut h);
            if let httparse::Status::Complete(len) = r.parse(black_box(REQUEST)).unwrap() {
                total += len + black_box(&r.headers).len();
            }
        }
    }
    println!("{total}");
}
