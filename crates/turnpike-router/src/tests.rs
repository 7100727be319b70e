use super::*;
use turnpike_config::declarative::{load_str, NoPlugins};

fn router(yaml: &str) -> (Router, Config) {
    let cfg = load_str(yaml, &NoPlugins).unwrap_or_else(|e| panic!("{e}"));
    (Router::build(&cfg).unwrap(), cfg)
}

struct Req<'a> {
    method: &'a str,
    host: &'a str,
    port: u16,
    path: &'a str,
    headers: HeaderMap,
    sni: Option<&'a str>,
    tls: bool,
}

fn req(path: &str) -> Req<'_> {
    Req {
        method: "GET",
        host: "example.com",
        port: 8000,
        path,
        headers: HeaderMap::new(),
        sni: None,
        tls: false,
    }
}

fn find(r: &Router, cfg: &Config, q: &Req) -> Option<(String, Option<usize>)> {
    let view = RequestView {
        method: q.method,
        host: q.host,
        port: q.port,
        path: q.path,
        headers: &q.headers,
        sni: q.sni,
        authority: "",
        query: None,
        tls: q.tls,
        peer: None,
        local_ip: None,
        protocol: None,
    };
    r.find(&view).map(|m| {
        (
            cfg.routes[m.route.route_index()]
                .name
                .clone()
                .unwrap_or_default(),
            m.matched_len,
        )
    })
}

fn name(r: &Router, cfg: &Config, q: &Req) -> String {
    find(r, cfg, q)
        .map(|x| x.0)
        .unwrap_or_else(|| "<none>".into())
}

const BASE: &str = "_format_version: '3.0'\nservices:\n- name: s\n  host: up\n  routes:\n";

#[test]
fn longest_prefix_wins_and_prefix_is_byte_prefix() {
    let (r, c) = router(&format!(
        "{BASE}  - {{name: root, paths: [/]}}\n  - {{name: api, paths: [/api]}}\n  - {{name: apiv1, paths: [/api/v1]}}\n"
    ));
    assert_eq!(name(&r, &c, &req("/")), "root");
    assert_eq!(name(&r, &c, &req("/apix")), "api");
    assert_eq!(name(&r, &c, &req("/api/v1/users")), "apiv1");
    assert_eq!(name(&r, &c, &req("/other")), "root");
    assert_eq!(find(&r, &c, &req("/api/v1/x")).unwrap().1, Some(7));
}

#[test]
fn hosts_exact_wildcards_and_ports() {
    let (r, c) = router(&format!(
        "{BASE}  - {{name: exact, hosts: [example.com]}}\n  - {{name: suffix, hosts: ['*.example.org']}}\n  - {{name: prefix, hosts: ['example.*']}}\n  - {{name: port, hosts: ['ported.com:9000']}}\n"
    ));
    assert_eq!(name(&r, &c, &req("/")), "exact");
    let mut q = req("/");
    q.host = "a.b.example.org";
    assert_eq!(name(&r, &c, &q), "suffix");
    q.host = "example.org";
    assert_eq!(name(&r, &c, &q), "prefix");
    q.host = "example.net";
    assert_eq!(name(&r, &c, &q), "prefix");
    q.host = "ported.com";
    assert_eq!(name(&r, &c, &q), "<none>");
    q.port = 9000;
    assert_eq!(name(&r, &c, &q), "port");
    q.host = "nothing.test";
    assert_eq!(name(&r, &c, &q), "<none>");
}

#[test]
fn plain_host_beats_wildcard_host() {
    let (r, c) = router(&format!(
        "{BASE}  - {{name: wild, hosts: ['*.example.com']}}\n  - {{name: plain, hosts: [api.example.com]}}\n"
    ));
    let mut q = req("/");
    q.host = "api.example.com";
    assert_eq!(name(&r, &c, &q), "plain");
    q.host = "web.example.com";
    assert_eq!(name(&r, &c, &q), "wild");
}

#[test]
fn more_fields_win_then_headers_then_regex_priority() {
    let (r, c) = router(&format!(
        "{BASE}  - {{name: path, paths: [/a]}}\n  - {{name: path-method, paths: [/a], methods: [POST]}}\n  - {{name: path-header, paths: [/a], headers: {{x-v: [one, two]}}}}\n  - {{name: path-2headers, paths: [/a], headers: {{x-v: [one], x-w: ['~*^ab+c$']}}}}\n"
    ));
    assert_eq!(name(&r, &c, &req("/a")), "path");
    let mut q = req("/a");
    q.method = "POST";
    assert_eq!(name(&r, &c, &q), "path-method");
    let mut q = req("/a");
    q.headers.insert("x-v", "TWO".parse().unwrap());
    assert_eq!(name(&r, &c, &q), "path-header");
    q.headers.insert("x-v", "one".parse().unwrap());
    q.headers.insert("x-w", "ABBBC".parse().unwrap());
    assert_eq!(name(&r, &c, &q), "path-2headers");
}

#[test]
fn regex_paths_priority_and_captures() {
    let (r, c) = router(&format!(
        "{BASE}  - {{name: plain, paths: [/users/me]}}\n  - {{name: re-low, paths: ['~/users/(?<id>\\d+)$'], regex_priority: 1}}\n  - {{name: re-high, paths: ['~/users/(\\d+)'], regex_priority: 5}}\n"
    ));
    // A regex path outranks a plain path of any length (REGEX_URL bit) at equal field counts.
    assert_eq!(name(&r, &c, &req("/users/42")), "re-high");
    assert_eq!(name(&r, &c, &req("/users/me")), "plain");
    let view = RequestView {
        method: "GET",
        host: "x",
        port: 1,
        path: "/users/42/x",
        headers: &HeaderMap::new(),
        sni: None,
        authority: "",
        query: None,
        tls: false,
        peer: None,
        local_ip: None,
        protocol: None,
    };
    let m = r.find(&view).unwrap();
    assert_eq!(m.matched_len, Some(9));
    assert_eq!(m.captures.as_ref().unwrap()[0], (None, "42".to_string()));
    // Regex paths are anchored at the start of the path.
    assert_eq!(name(&r, &c, &req("/x/users/42")), "<none>");
}

/// Kong's `(net.protocol != "https" || tls.sni == ...)`: SNIs bind TLS requests only; a
/// plain request reaches the route (and then its HTTPS redirect).
#[test]
fn snis_bind_tls_requests() {
    let (r, c) = router(&format!(
        "{BASE}  - {{name: sni, protocols: [https], snis: [secure.example.com]}}\n  - {{name: other, paths: [/other]}}\n"
    ));
    assert_eq!(name(&r, &c, &req("/")), "sni");
    let mut q = req("/");
    q.tls = true;
    assert_eq!(name(&r, &c, &q), "<none>");
    q.sni = Some("secure.example.com");
    assert_eq!(name(&r, &c, &q), "sni");
    q.sni = Some("other.example.com");
    assert_eq!(name(&r, &c, &q), "<none>");
}

#[test]
fn stream_routes_are_not_http_routes() {
    let (r, c) = router(
        "_format_version: '3.0'\nservices:\n- name: s\n  protocol: tcp\n  host: up\n  port: 9\n  routes:\n  - {name: tcp, protocols: [tcp], destinations: [{port: 9}]}\n",
    );
    assert!(r.is_empty());
    assert_eq!(name(&r, &c, &req("/")), "<none>");
}

#[test]
fn many_routes_use_the_index() {
    let mut yaml = String::from(BASE);
    for i in 0..2000 {
        yaml.push_str(&format!(
            "  - {{name: r{i}, paths: [/route-{i}], hosts: [h{}.test]}}\n",
            i % 10
        ));
    }
    let (r, c) = router(&yaml);
    let mut q = req("/route-1234/x");
    q.host = "h4.test";
    assert_eq!(name(&r, &c, &q), "r1234");
    q.host = "h5.test";
    assert_eq!(name(&r, &c, &q), "<none>");
}

/// Kong's engine keeps matchers by (priority, id) and tries the largest first: among equal
/// priorities the larger route id wins under the ATC flavors, whatever the file order; the
/// traditional flavor keeps creation time, then file order.
#[test]
fn equal_priority_prefers_the_larger_id_or_file_order() {
    let yaml = format!(
        "{BASE}  - {{name: first, id: 00000000-0000-4000-8000-000000000001, paths: [/a]}}\n  - {{name: second, id: 00000000-0000-4000-8000-000000000002, paths: [/a]}}\n  - {{name: third, id: 00000000-0000-4000-8000-000000000000, paths: [/a]}}\n"
    );
    let (r, c) = router(&yaml);
    assert_eq!(name(&r, &c, &req("/a")), "second");
    let mut problems = Vec::new();
    let t = Router::build_skipping(&c, RouterFlavor::Traditional, &mut problems);
    assert_eq!(name(&t, &c, &req("/a")), "first");
}

/// A router patched route by route routes every request as one built whole from the patched
/// config: same winner (ties included: equal priorities and `created_at`, file order), after
/// adds, updates and removals that reuse slots.
#[test]
fn a_patched_router_routes_as_a_rebuilt_one() {
    let mut seed = 7u64;
    let mut next = move |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    let route = |i: u64, next: &mut dyn FnMut(u64) -> u64| -> String {
        let paths = match next(4) {
            0 => format!("[/p{}]", next(6)),
            1 => format!("[/p{}/x, /q{}]", next(6), next(3)),
            2 => format!("['~/p{}/[0-9]+$']", next(6)),
            _ => "[/]".to_string(),
        };
        let hosts = match next(3) {
            0 => format!(", hosts: [h{}.test]", next(3)),
            1 => ", hosts: ['*.test']".to_string(),
            _ => String::new(),
        };
        let methods = if next(3) == 0 { ", methods: [GET]" } else { "" };
        // One created_at for all (a load stamps a missing one with the time of day).
        format!("  - {{name: r{i}, created_at: 1700000000, paths: {paths}{hosts}{methods}}}\n")
    };
    let mut routes: Vec<(u64, String)> = (0..40).map(|i| (i, route(i, &mut next))).collect();
    let doc = |routes: &[(u64, String)]| {
        let body: String = routes.iter().map(|r| r.1.clone()).collect();
        format!("{BASE}{body}")
    };
    let (mut patched, _) = router(&doc(&routes));
    // Slot of each route by name (slots are positions at the full build).
    let mut slots: std::collections::HashMap<u64, usize> =
        routes.iter().enumerate().map(|(s, r)| (r.0, s)).collect();
    let mut fresh_id = 40;
    for round in 0..30 {
        let before = patched.clone();
        match next(3) {
            0 if routes.len() > 5 => {
                let at = next(routes.len() as u64) as usize;
                let (name, _) = routes.remove(at);
                patched.remove(slots.remove(&name).unwrap());
            }
            1 => {
                let at = next(routes.len() as u64) as usize;
                routes[at].1 = route(routes[at].0, &mut next);
                let cfg = load_str(&doc(&routes), &NoPlugins).unwrap();
                let r = &cfg.routes[at];
                patched
                    .update(slots[&routes[at].0], r, Some((0, true)))
                    .unwrap();
            }
            _ => {
                routes.push((fresh_id, route(fresh_id, &mut next)));
                let cfg = load_str(&doc(&routes), &NoPlugins).unwrap();
                let (slot, compiled) = patched.add(cfg.routes.last().unwrap(), Some((0, true)));
                compiled.unwrap();
                slots.insert(fresh_id, slot);
                fresh_id += 1;
            }
        }
        let (rebuilt, cfg) = router(&doc(&routes));
        let by_slot: std::collections::HashMap<usize, u64> =
            slots.iter().map(|(n, s)| (*s, *n)).collect();
        for host in ["h0.test", "h1.test", "h2.test", "a.test", "other"] {
            for path in [
                "/", "/p1", "/p2/x", "/p3/17", "/q1", "/q2/y", "/p5/x/1", "/z",
            ] {
                for method in ["GET", "POST"] {
                    let mut q = req(path);
                    q.host = host;
                    q.method = method;
                    let want = find(&rebuilt, &cfg, &q).map(|x| x.0);
                    let view = RequestView {
                        method,
                        host,
                        port: 8000,
                        path,
                        headers: &q.headers,
                        sni: None,
                        authority: "",
                        query: None,
                        tls: false,
                        peer: None,
                        local_ip: None,
                        protocol: None,
                    };
                    let got = patched
                        .find(&view)
                        .map(|m| format!("r{}", by_slot[&m.route.route_index()]));
                    if got != want {
                        let d = doc(&routes);
                        let lines: Vec<&str> = d
                            .lines()
                            .filter(|l| {
                                got.as_ref()
                                    .is_some_and(|g| l.contains(&format!("name: {g},")))
                                    || want
                                        .as_ref()
                                        .is_some_and(|g| l.contains(&format!("name: {g},")))
                            })
                            .collect();
                        panic!("round {round}: {method} {host}{path}: patched {got:?}, rebuilt {want:?}: {lines:?}");
                    }
                }
            }
        }
        // The router the patch started from is untouched (it serves until the swap).
        drop(before);
    }
}

/// What the router keeps per route, guarded: at 100k routes each 8 bytes is 0.8 MB (issue #23's
/// memory breakdown in BENCHMARKS.md).
#[test]
fn per_route_sizes_stay_small() {
    use std::mem::size_of;
    assert!(size_of::<RouteEntry>() <= 24, "{}", size_of::<RouteEntry>());
    assert!(size_of::<Slot>() <= 56, "{}", size_of::<Slot>());
    // 72 since the ATC flavors' tie-break by matcher id (Kong's engine orders equal
    // priorities by the 128-bit id): 0.8 MB more at 100k routes.
    assert!(size_of::<Matcher>() <= 72, "{}", size_of::<Matcher>());
    // 184 since `expression` and `priority` (one pointer, null outside the expressions flavor).
    assert!(size_of::<Route>() <= 184, "{}", size_of::<Route>());
}

#[test]
fn standard_methods_are_bits_and_others_names() {
    let (r, c) = router(&format!(
        "{BASE}  - {{name: std, paths: [/a], methods: [GET, POST]}}\n  - {{name: custom, paths: [/b], methods: [PURGE]}}\n  - {{name: mixed, paths: [/c], methods: [GET, PURGE]}}\n  - {{name: any, paths: [/d]}}\n"
    ));
    let with = |path, method| {
        let mut q = req(path);
        q.method = method;
        name(&r, &c, &q)
    };
    assert_eq!(with("/a", "GET"), "std");
    assert_eq!(with("/a", "POST"), "std");
    assert_eq!(with("/a", "PUT"), "<none>");
    assert_eq!(with("/a", "PURGE"), "<none>");
    // Case matters, as in Kong (methods are upper case by the schema).
    assert_eq!(with("/a", "get"), "<none>");
    assert_eq!(with("/b", "PURGE"), "custom");
    assert_eq!(with("/b", "GET"), "<none>");
    assert_eq!(with("/c", "GET"), "mixed");
    assert_eq!(with("/c", "PURGE"), "mixed");
    assert_eq!(with("/c", "POST"), "<none>");
    assert_eq!(with("/d", "PATCH"), "any");
    // A route of paths and standard methods holds no filters box.
    let m = |slot: usize| r.matcher(r.slots[slot].matchers[0]);
    assert!(m(0).filters.is_none() && m(0).methods == 0b101);
    assert!(m(1).filters.as_ref().is_some_and(|f| f.methods.is_some()) && m(1).methods == 0);
    assert!(m(2).methods == 0);
    // The match cache keys on the method for both kinds.
    assert!(r.keys.method);
}
