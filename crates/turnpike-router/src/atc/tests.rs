//! Kong's router cases as data (`testdata/kong-router-cases.json`), run for every flavor they
//! name; Kong's translations of traditional routes, byte for byte; and Kong's engine (the
//! `atc-router` crate's own router and interpreter) run beside ours on the same matchers and
//! requests, which must agree on the route, the matched path and the captures.

use std::net::SocketAddr;

use http::HeaderMap;
use serde_json::{json, Value as Json};
use turnpike_config::atc::{RouterFlavor, HTTP_SCHEMA};
use turnpike_config::declarative::{load_str, Config, PluginRegistry};

use crate::{group_priority, RequestView, Router};

const CASES: &str = include_str!("../../testdata/kong-router-cases.json");

/// No plugins; routes read as `flavor` reads them (the crate's tests share it).
pub(crate) struct Flavored(pub(crate) RouterFlavor);

impl PluginRegistry for Flavored {
    fn check(&self, _: &str, _: &Json) -> Option<Result<Json, Vec<(String, String)>>> {
        None
    }
    fn router_flavor(&self) -> RouterFlavor {
        self.0
    }
}

fn config(routes: &Json, flavor: RouterFlavor) -> Result<Config, String> {
    let doc = json!({
        "_format_version": "3.0",
        "services": [{"name": "s", "host": "up", "routes": routes}],
    });
    load_str(&doc.to_string(), &Flavored(flavor)).map_err(|e| e.to_string())
}

/// A request of the corpus, owning what a view borrows.
struct Req {
    method: String,
    authority: String,
    host: String,
    port: u16,
    path: String,
    headers: HeaderMap,
    query: Option<String>,
    tls: bool,
    sni: Option<String>,
    peer: Option<SocketAddr>,
    local_ip: Option<std::net::IpAddr>,
}

impl Req {
    fn from(q: &Json) -> Req {
        let s = |k: &str| q.get(k).and_then(Json::as_str).map(String::from);
        let authority = s("host").unwrap_or_else(|| "example.com".into());
        let mut headers = HeaderMap::new();
        for (k, vs) in q
            .get("headers")
            .and_then(Json::as_object)
            .into_iter()
            .flatten()
        {
            for v in vs.as_array().unwrap() {
                headers.append(
                    http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    v.as_str().unwrap().parse().unwrap(),
                );
            }
        }
        let listener = q.get("port").and_then(Json::as_u64).unwrap_or(8000) as u16;
        let (host, port) = crate::atc::eval::split_host_port(&authority);
        Req {
            method: s("method").unwrap_or_else(|| "GET".into()),
            host: host.to_ascii_lowercase(),
            port: port.unwrap_or(listener),
            authority: authority.clone(),
            path: s("path").unwrap(),
            headers,
            query: s("query"),
            tls: q.get("tls").and_then(Json::as_bool).unwrap_or(false),
            sni: s("sni"),
            peer: s("src").map(|a| a.parse().unwrap()),
            local_ip: s("dst").map(|a| a.parse().unwrap()),
        }
    }

    fn view(&self) -> RequestView<'_> {
        RequestView {
            method: &self.method,
            host: &self.host,
            port: self.port,
            path: &self.path,
            headers: &self.headers,
            sni: self.sni.as_deref(),
            authority: &self.authority,
            query: self.query.as_deref(),
            tls: self.tls,
            peer: self.peer,
            local_ip: self.local_ip,
            protocol: None,
        }
    }
}

/// What a match found: the route's slot, the matched length and the captures.
type Outcome = Option<(usize, Option<usize>, Option<Vec<(Option<String>, String)>>)>;

fn outcome(m: Option<crate::Match<'_>>) -> Outcome {
    m.map(|m| (m.route.route_index(), m.matched_len, m.captures))
}

#[test]
fn kong_router_cases() {
    let data: Json = serde_json::from_str(CASES).unwrap();
    let mut ran = 0;
    for case in data["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        for flavor in case["flavors"].as_array().unwrap() {
            let flavor = RouterFlavor::parse(flavor.as_str().unwrap()).unwrap();
            let cfg = config(&case["routes"], flavor)
                .unwrap_or_else(|e| panic!("{name} ({flavor:?}): {e}"));
            let mut problems = Vec::new();
            let router = std::sync::Arc::new(Router::build_skipping(&cfg, flavor, &mut problems));
            assert!(problems.is_empty(), "{name}: {problems:?}");
            // Every request through a match cache too, twice (stored, then served from the
            // cache): the same answer as the router's, so the key holds every field a route
            // reads.
            let mut cache = crate::MatchCache::default();
            for _ in 0..2 {
                for q in case["requests"].as_array().unwrap() {
                    let req = Req::from(q);
                    let direct = outcome(router.find(&req.view()));
                    let cached = outcome(router.find_cached(&req.view(), &mut cache));
                    assert_eq!(cached, direct, "{name} ({flavor:?}), cached: {q}");
                }
            }
            for q in case["requests"].as_array().unwrap() {
                let req = Req::from(q);
                let m = router.find(&req.view());
                let got = m.as_ref().map(|m| m.route.route_index());
                let want = q["expect"].as_u64().map(|i| i as usize);
                assert_eq!(got, want, "{name} ({flavor:?}): {q}");
                if let Some(len) = q.get("prefix_len").and_then(Json::as_u64) {
                    assert_eq!(
                        m.as_ref().unwrap().matched_len,
                        Some(len as usize),
                        "{name}"
                    );
                }
                if let Some(c) = q.get("captures") {
                    let want: Vec<(Option<String>, String)> = c
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|p| {
                            (
                                p[0].as_str().map(String::from),
                                p[1].as_str().unwrap().to_string(),
                            )
                        })
                        .collect();
                    assert_eq!(m.as_ref().unwrap().captures.as_ref(), Some(&want), "{name}");
                }
                ran += 1;
            }
        }
    }
    assert!(ran > 60, "{ran} requests");
}

#[test]
fn traditional_routes_translate_as_kong_writes_them() {
    let data: Json = serde_json::from_str(CASES).unwrap();
    for t in data["translations"].as_array().unwrap() {
        let cfg = config(&json!([t["route"]]), RouterFlavor::TraditionalCompatible).unwrap();
        let route = &cfg.routes[0];
        let paths: Vec<&str> = route
            .paths
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(String::as_str)
            .collect();
        let got = super::translate::expression(route, &paths);
        assert_eq!(got.as_deref(), t["expression"].as_str(), "{}", t["source"]);
        // And Kong's engine reads it.
        turnpike_config::atc::parse(got.as_deref().unwrap(), &HTTP_SCHEMA).unwrap();
    }
}

/// Kong's engine, given the same matchers and the request's values, picks the same route and
/// records the same path and captures as ours.
#[test]
fn the_engine_agrees() {
    let data: Json = serde_json::from_str(CASES).unwrap();
    let mut compared = 0;
    for case in data["cases"].as_array().unwrap() {
        let flavor = RouterFlavor::Expressions;
        let Ok(cfg) = config(&case["routes"], flavor) else {
            continue;
        };
        let mut problems = Vec::new();
        let ours = Router::build_skipping(&cfg, flavor, &mut problems);
        let mut engine = atc_router::router::Router::new(&HTTP_SCHEMA);
        let mut owner = std::collections::HashMap::new();
        for (i, route) in cfg.routes.iter().enumerate() {
            for (src, priority, id) in super::sources(route, |g| group_priority(route, g)).unwrap()
            {
                engine.add_matcher(priority as usize, id, &src).unwrap();
                owner.insert(id, i);
            }
        }
        for q in case["requests"].as_array().unwrap() {
            let req = Req::from(q);
            let view = req.view();
            let result = run_engine(&engine, &view);
            let theirs = result.as_ref();
            let m = ours.find(&view);
            assert_eq!(
                m.as_ref().map(|m| m.route.route_index()),
                theirs.map(|r| owner[&r.uuid]),
                "{}: {q}",
                case["name"]
            );
            if let (Some(m), Some(r)) = (m, theirs) {
                let path = match r.matches.get("http.path") {
                    Some(atc_router::ast::Value::String(s)) => Some(s.len()),
                    _ => None,
                };
                assert_eq!(m.matched_len, path, "{}", case["name"]);
                // The engine keys a group by its number and, when named, by its name too.
                let groups = r
                    .captures
                    .keys()
                    .filter(|k| k.parse::<usize>().is_ok_and(|n| n > 0))
                    .count();
                assert_eq!(
                    m.captures.map_or(0, |c| c.len()),
                    groups,
                    "{}",
                    case["name"]
                );
            }
            compared += 1;
        }
    }
    assert!(compared > 40, "{compared}");
}

#[test]
fn an_expression_route_implies_its_host_and_path_for_the_index() {
    let cfg = config(
        &json!([
            {"id": "e8fb37f1-102d-461e-9c51-6608a6bb8101",
             "expression": r#"(http.host == "A.test" || http.host == "b.test") && http.path ^= "/x""#},
            {"id": "e8fb37f1-102d-461e-9c51-6608a6bb8102",
             "expression": r#"lower(http.host) == "c.test" && http.path ~ "^/y""#},
        ]),
        RouterFlavor::Expressions,
    )
    .unwrap();
    let p = super::programs(&cfg.routes[0], |_| 0).unwrap();
    let hosts: Vec<&str> = p[0]
        .0
        .hosts
        .as_ref()
        .unwrap()
        .iter()
        .map(|h| &**h)
        .collect();
    assert_eq!(hosts, ["a.test", "b.test"]);
    let paths: Vec<&str> = p[0]
        .0
        .paths
        .as_ref()
        .unwrap()
        .iter()
        .map(|h| &**h)
        .collect();
    assert_eq!(paths, ["/x"]);
    let p = super::programs(&cfg.routes[1], |_| 0).unwrap();
    assert!(p[0].0.hosts.is_none() && p[0].0.paths.is_none());
    // Host matching is case-sensitive in Kong's ATC flavors: the index files the route
    // under "a.test", and the expression still wants "A.test".
    let mut problems = Vec::new();
    let r = Router::build_skipping(&cfg, RouterFlavor::Expressions, &mut problems);
    let headers = HeaderMap::new();
    let mut v = RequestView::basic("GET", "a.test", 80, "/x", &headers);
    v.authority = "A.test";
    assert!(r.find(&v).is_some());
    v.authority = "a.test";
    assert!(r.find(&v).is_none());
}

/// Routes the flavor's schema refuses, with Kong's messages.
#[test]
fn bad_expression_routes_get_kong_messages() {
    let bad = |route: Json| config(&json!([route]), RouterFlavor::Expressions).unwrap_err();
    let e = bad(json!({"expression": r#"http.path ^= "/a""#, "paths": ["/foo"]}));
    assert!(e.contains("Router Expression failed validation: cannot set 'expression' with 'methods', 'hosts', 'paths', 'headers', 'snis', 'sources' or 'destinations' simultaneously"), "{e}");
    let e = bad(json!({"expression": r#"http.path ^= "/a""#, "regex_priority": 1}));
    assert!(
        e.contains("cannot set 'regex_priority' with 'expression' simultaneously"),
        "{e}"
    );
    let e = bad(json!({"paths": ["/a"], "priority": 1}));
    assert!(e.contains("cannot set 'priority' with"), "{e}");
    let e = bad(json!({"expression": r#"http.path = "/a""#}));
    assert!(
        e.contains("Router Expression failed validation:  --> 1:11"),
        "{e}"
    );
    let e = bad(json!({"expression": r#"http.nope == "/a""#}));
    assert!(
        e.contains("Router Expression failed validation: Unknown LHS field"),
        "{e}"
    );
    let e =
        bad(json!({"expression": r#"tls.sni == "a" && http.path == "/""#, "protocols": ["tls"]}));
    assert!(e.contains("Unknown LHS field"), "{e}");
    let e = bad(json!({"expression": r#"http.path ^= "/""#, "priority": -1}));
    assert!(e.contains("priority"), "{e}");
    let e = bad(json!({"protocols": ["http"]}));
    assert!(e.contains("must set one of 'methods', 'hosts', 'headers', 'paths', 'expression' when 'protocols' is 'http'"), "{e}");
    // Not a field of the other flavors.
    let e = config(
        &json!([{"expression": r#"http.path ^= "/a""#}]),
        RouterFlavor::TraditionalCompatible,
    )
    .unwrap_err();
    assert!(e.contains("expression: unknown field"), "{e}");
}

/// Kong's engine on a request: the context filled with the values of every field its
/// matchers read, then its own `execute`.
fn run_engine(
    engine: &atc_router::router::Router<'_>,
    view: &RequestView<'_>,
) -> Option<atc_router::context::Match> {
    let mut ctx = atc_router::context::Context::new(&HTTP_SCHEMA);
    let mut fields = super::eval::Fields::new(view);
    for field in engine.fields.keys() {
        for v in fields.engine_values(field) {
            ctx.add_value(field, v);
        }
    }
    let found = engine.execute(&mut ctx);
    ctx.result.filter(|_| found)
}

/// A small deterministic generator (xorshift), so that a failing seed can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn some<'a>(&mut self, pool: &[&'a str], max: usize) -> Vec<&'a str> {
        let n = 1 + self.below(max);
        let mut out: Vec<&str> = (0..n).map(|_| pool[self.below(pool.len())]).collect();
        out.sort();
        out.dedup();
        out
    }
}

/// The traditional_compatible router (our index and matchers) against Kong's engine running
/// the expressions Kong's `get_expression` writes for the same routes, with Kong's priorities
/// and ids: random routes of every traditional field, random requests, the same winner.
#[test]
fn traditional_compatible_agrees_with_the_engine_on_translated_routes() {
    const PATHS: &[&str] = &[
        "/",
        "/a",
        "/a/b",
        "/ab",
        "~/a/\\d+$",
        "~/b(?<x>[a-z]+)",
        "/c/",
    ];
    const HOSTS: &[&str] = &["a.test", "*.b.test", "c.*", "a.test:8000", "d.test"];
    const SNIS: &[&str] = &["a.test", "*.b.test", "s.test"];
    const REQ_PATHS: &[&str] = &["/", "/a", "/a/b", "/a/12", "/ab", "/bxyz", "/c/d", "/z"];
    const REQ_HOSTS: &[&str] = &[
        "a.test",
        "a.test:8000",
        "x.b.test",
        "c.org",
        "d.test",
        "e.test",
    ];
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut compared = 0;
    for round in 0..150 {
        let mut routes = Vec::new();
        for i in 0..12 {
            let mut r = serde_json::Map::new();
            r.insert(
                "id".into(),
                json!(format!(
                    "00000000-0000-4000-8000-{:012x}",
                    rng.next() % 4096 * 4096 + i
                )),
            );
            r.insert("name".into(), json!(format!("r{i}")));
            let mut any = false;
            if rng.chance(70) {
                r.insert("paths".into(), json!(rng.some(PATHS, 3)));
                any = true;
            }
            if rng.chance(40) {
                r.insert("hosts".into(), json!(rng.some(HOSTS, 2)));
                any = true;
            } else if rng.chance(15) {
                // Kong's quirk: an empty hosts array still sets the plain-host bit.
                r.insert("hosts".into(), json!([]));
            }
            if rng.chance(30) {
                r.insert("methods".into(), json!(rng.some(&["GET", "POST"], 1)));
                any = true;
            }
            if rng.chance(25) {
                r.insert(
                    "headers".into(),
                    json!({"x-v": rng.some(&["1", "Two", "~*^V\\d", "~*^T\\D"], 2)}),
                );
                any = true;
            }
            if rng.chance(20) {
                r.insert("snis".into(), json!(rng.some(SNIS, 2)));
                if rng.chance(50) {
                    r.insert("protocols".into(), json!(["https"]));
                }
            }
            if rng.chance(30) {
                r.insert("regex_priority".into(), json!(rng.below(3)));
            }
            if !any {
                r.insert("paths".into(), json!(["/"]));
            }
            routes.push(Json::Object(r));
        }
        let cfg = config(&Json::Array(routes), RouterFlavor::TraditionalCompatible)
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        let mut problems = Vec::new();
        let ours = Router::build_skipping(&cfg, RouterFlavor::TraditionalCompatible, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        let mut engine = atc_router::router::Router::new(&HTTP_SCHEMA);
        let mut owner = std::collections::HashMap::new();
        let mut shown = Vec::new();
        for (i, route) in cfg.routes.iter().enumerate() {
            let paths: Vec<String> = route.paths.as_deref().unwrap_or_default().to_vec();
            let mut groups = super::translate::path_groups(&paths);
            if groups.is_empty() {
                groups.push(Vec::new());
            }
            let split = groups.len() > 1;
            for (g, group) in groups.iter().enumerate() {
                let src = super::translate::expression(route, group).unwrap();
                let id = if split {
                    super::translate::split_id(&route.id, g + 1)
                } else {
                    uuid::Uuid::parse_str(&route.id).unwrap()
                };
                engine
                    .add_matcher(group_priority(route, group) as usize, id, &src)
                    .unwrap_or_else(|e| panic!("{src}: {e}"));
                owner.insert(id, i);
                shown.push(format!("r{i} {:x}: {src}", group_priority(route, group)));
            }
        }
        for _ in 0..40 {
            let authority = REQ_HOSTS[rng.below(REQ_HOSTS.len())];
            let method = ["GET", "POST"][rng.below(2)];
            let mut q = json!({
                "method": method,
                "path": REQ_PATHS[rng.below(REQ_PATHS.len())],
                "host": authority,
            });
            if rng.chance(40) {
                let v = ["1", "two", "v7", "V8", "x"][rng.below(5)];
                q["headers"] = json!({ "x-v": [v] });
            }
            if rng.chance(40) {
                q["tls"] = json!(true);
                if rng.chance(80) {
                    let sni = ["a.test", "y.b.test", "s.test", "n.test"][rng.below(4)];
                    q["sni"] = json!(sni);
                }
            }
            let req = Req::from(&q);
            let view = req.view();
            let result = run_engine(&engine, &view);
            let theirs = result.as_ref().map(|r| owner[&r.uuid]);
            let m = ours.find(&view);
            let got = m.as_ref().map(|m| m.route.route_index());
            assert_eq!(got, theirs, "round {round}: {q}\n{}", shown.join("\n"));
            if let (Some(m), Some(r)) = (&m, result.as_ref()) {
                if let Some(atc_router::ast::Value::String(p)) = r.matches.get("http.path") {
                    assert_eq!(m.matched_len, Some(p.len()), "round {round}: {q}");
                }
            }
            compared += 1;
        }
    }
    assert_eq!(compared, 6000);
}
