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

/// No plugins; routes read as `flavor` reads them.
struct Flavored(RouterFlavor);

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
        }
    }
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
            let router = Router::build_skipping(&cfg, flavor, &mut problems);
            assert!(problems.is_empty(), "{name}: {problems:?}");
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
    use atc_router::context::Context;
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
            let mut ctx = Context::new(&HTTP_SCHEMA);
            let mut fields = super::eval::Fields::new(&view);
            for field in engine.fields.keys() {
                for v in fields.engine_values(field) {
                    ctx.add_value(field, v);
                }
            }
            let found = engine.execute(&mut ctx);
            let theirs = ctx.result.as_ref().filter(|_| found);
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
