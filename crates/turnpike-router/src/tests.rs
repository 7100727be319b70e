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
}

fn req(path: &str) -> Req<'_> {
    Req {
        method: "GET",
        host: "example.com",
        port: 8000,
        path,
        headers: HeaderMap::new(),
        sni: None,
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
    };
    r.find(&view).map(|m| {
        (
            cfg.routes[m.route.route_index]
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
    };
    let m = r.find(&view).unwrap();
    assert_eq!(m.matched_len, Some(9));
    assert_eq!(m.captures.as_ref().unwrap()[0], (None, "42".to_string()));
    // Regex paths are anchored at the start of the path.
    assert_eq!(name(&r, &c, &req("/x/users/42")), "<none>");
}

#[test]
fn snis_need_tls() {
    let (r, c) = router(&format!(
        "{BASE}  - {{name: sni, protocols: [https], snis: [secure.example.com]}}\n  - {{name: other, paths: [/other]}}\n"
    ));
    assert_eq!(name(&r, &c, &req("/")), "<none>");
    let mut q = req("/");
    q.sni = Some("secure.example.com");
    assert_eq!(name(&r, &c, &q), "sni");
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

#[test]
fn equal_priority_prefers_file_order() {
    let (r, c) = router(&format!(
        "{BASE}  - {{name: first, paths: [/a]}}\n  - {{name: second, paths: [/a]}}\n"
    ));
    assert_eq!(name(&r, &c, &req("/a")), "first");
}
