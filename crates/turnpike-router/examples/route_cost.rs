//! Per-request routing cost, for callgrind: builds N routes of one kind and matches F requests
//! spread over them. `bench/router-instructions.sh` runs it with F and with 0 requests and
//! divides the difference by F: the instructions one match costs, build excluded.
//! Usage: route_cost <traditional|expressions> <routes> <requests> [cached]
//! `cached`: through a worker's match cache (`Router::find_cached`), as the proxy asks; the
//! 1,000 distinct requests fit in it, so past the first thousand every request is a hit.

use http::HeaderMap;
use turnpike_config::atc::RouterFlavor;
use turnpike_config::declarative::{load, PluginRegistry};
use turnpike_router::{RequestView, Router};

struct Flavored(RouterFlavor);

impl PluginRegistry for Flavored {
    fn check(
        &self,
        _: &str,
        _: &serde_json::Value,
    ) -> Option<Result<serde_json::Value, Vec<(String, String)>>> {
        None
    }
    fn router_flavor(&self) -> RouterFlavor {
        self.0
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let kind = args[1].as_str();
    let n: usize = args[2].parse().unwrap();
    let f: usize = args[3].parse().unwrap();
    // Kong's benchmark shape: one route per host and path prefix, with a method.
    let routes: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            let (host, path) = (format!("h{}.test", i % 100), format!("/s{}-r{}", i / 10, i % 10));
            match kind {
                "expressions" => serde_json::json!({"name": format!("r{i}"),
                    "expression": format!(r#"http.host == "{host}" && http.path ^= "{path}" && http.method == "GET""#)}),
                _ => serde_json::json!({"name": format!("r{i}"), "paths": [path], "hosts": [host], "methods": ["GET"]}),
            }
        })
        .collect();
    let flavor = if kind == "expressions" {
        RouterFlavor::Expressions
    } else {
        RouterFlavor::TraditionalCompatible
    };
    let doc = serde_json::json!({"_format_version": "3.0", "services": [{"name": "s", "host": "up", "routes": routes}]});
    let cfg = load(&doc, &Flavored(flavor)).unwrap();
    let mut problems = Vec::new();
    let router = std::sync::Arc::new(Router::build_skipping(&cfg, flavor, &mut problems));
    let cached = args.get(4).is_some_and(|a| a == "cached");
    let mut cache = turnpike_router::MatchCache::default();
    assert!(problems.is_empty(), "{problems:?}");
    let headers = HeaderMap::new();
    let reqs: Vec<(String, String)> = (0..1000)
        .map(|k| {
            let i = (k * 7919) % n;
            (
                format!("h{}.test", i % 100),
                format!("/s{}-r{}/users/42", i / 10, i % 10),
            )
        })
        .collect();
    let mut hits = 0usize;
    for k in 0..f {
        let (host, path) = &reqs[k % reqs.len()];
        let view = RequestView::basic("GET", host, 8000, path, &headers);
        let view = RequestView {
            authority: host,
            ..view
        };
        let found = if cached {
            router.find_cached(&view, &mut cache)
        } else {
            router.find(&view)
        };
        if std::hint::black_box(found).is_some() {
            hits += 1;
        }
    }
    assert_eq!(hits, f);
    println!("{kind} {n} routes, {f} requests matched");
}
