//! Router micro-benchmark: match time at 1, 100, 10k and 100k plain routes (one route per
//! path prefix and host, as in Kong's 100-route benchmark), and compile time per size.
//! Run: `cargo bench -p turnpike-router --bench router_match`.

use std::time::Instant;

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use http::HeaderMap;
use turnpike_config::declarative::{load, NoPlugins};
use turnpike_router::{RequestView, Router};

fn config(n: usize) -> serde_json::Value {
    let routes: Vec<serde_json::Value> = (0..n)
        .map(|i| serde_json::json!({"name": format!("r{i}"), "paths": [format!("/s{}-r{}", i / 10, i % 10)], "hosts": [format!("h{}.test", i % 100)]}))
        .collect();
    serde_json::json!({"_format_version": "3.0", "services": [{"name": "s", "host": "up", "routes": routes}]})
}

fn bench(c: &mut Criterion) {
    let headers = HeaderMap::new();
    for n in [1usize, 100, 10_000, 100_000] {
        let cfg = load(&config(n), &NoPlugins).unwrap();
        let t = Instant::now();
        let router = Router::build(&cfg).unwrap();
        eprintln!(
            "router compile: {n} routes in {:.1} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
        let i = n / 2;
        let path = format!("/s{}-r{}/users/42", i / 10, i % 10);
        let host = format!("h{}.test", i % 100);
        c.bench_function(&format!("match/{n}_routes"), |b| {
            b.iter(|| {
                let view = RequestView {
                    method: "GET",
                    host: black_box(&host),
                    port: 8000,
                    path: black_box(&path),
                    headers: &headers,
                    sni: None,
                    authority: "",
                    query: None,
                    tls: false,
                    peer: None,
                    local_ip: None,
                    protocol: None,
                };
                let m = router.find(&view).expect("route");
                black_box(m.route.route_index())
            })
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
