//! The serverless runtime and PDK, through the pre-function handler, on requests built here.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde_json::{json, Value};

use crate::pre_function::{schema, Serverless};
use crate::{Access, Handler, PluginCtx, ResponseHead, TestRequest};

fn handler(config: Value) -> Serverless {
    let config = crate::schema::validate(schema::FIELDS, &config).expect("valid config");
    Serverless::new("pre-function", &config, Default::default())
}

fn exit_of(a: Access) -> crate::Exit {
    match a {
        Access::Exit(e) => e,
        _ => panic!("expected an exit"),
    }
}

fn body_json(e: &crate::Exit) -> Value {
    serde_json::from_slice(&e.body).expect("JSON body")
}

#[test]
fn exit_with_a_table_sends_json_and_headers() {
    let h = handler(json!({"access": [
        "kong.response.exit(403, { message = 'go away' }, { ['X-Why'] = 'policy' })"
    ]}));
    let e = exit_of(TestRequest::new().run(&h));
    assert_eq!(e.status, StatusCode::FORBIDDEN);
    assert_eq!(body_json(&e), json!({"message": "go away"}));
    let get = |n: &str| {
        e.headers
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(get("x-why").unwrap(), "policy");
    assert_eq!(
        get("content-type").unwrap(),
        "application/json; charset=utf-8"
    );
}

#[test]
fn an_exit_inside_pcall_still_ends_the_request() {
    let h = handler(json!({"access": [
        "pcall(kong.response.exit, 401, 'no') kong.service.request.set_header('x-after', 'ran')"
    ]}));
    let mut req = TestRequest::new();
    let e = exit_of(req.run(&h));
    assert_eq!(e.status, StatusCode::UNAUTHORIZED);
    assert_eq!(&e.body[..], b"no");
}

#[test]
fn request_headers_are_read_and_set_for_the_upstream() {
    let h = handler(json!({"access": [
        "local v = kong.request.get_header('x_client') \
         kong.service.request.set_header('X-Upstream', v .. '!') \
         kong.service.request.clear_header('x-secret')"
    ]}));
    let mut req = TestRequest::new();
    req.headers
        .insert("x-client", HeaderValue::from_static("hello"));
    req.headers
        .insert("x-secret", HeaderValue::from_static("s"));
    assert!(matches!(req.run(&h), Access::Continue));
    assert_eq!(req.headers.get("x-upstream").unwrap(), "hello!");
    assert!(req.headers.get("x-secret").is_none());
}

#[test]
fn a_header_value_that_would_split_the_head_is_an_error() {
    let h = handler(json!({"access": [
        "kong.service.request.set_header('x-a', 'a\\r\\nx-injected: 1')"
    ]}));
    let mut req = TestRequest::new();
    let e = exit_of(req.run(&h));
    assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        body_json(&e),
        json!({"message": "An unexpected error occurred"})
    );
    assert!(req.headers.get("x-injected").is_none());
}

/// Kong's first run: a chunk that returns a function hands over to it, and its upvalues live
/// on between requests.
#[test]
fn a_returned_function_keeps_its_upvalues_between_requests() {
    let h = handler(json!({"access": [
        "local n = 0 return function() n = n + 1 kong.response.set_header('x-n', n) end"
    ]}));
    for expected in ["1", "2", "3"] {
        let mut req = TestRequest::new();
        assert!(matches!(req.run(&h), Access::Continue));
        let (_, v) = req.response_headers.last().expect("a header");
        assert_eq!(v, expected);
    }
}

#[test]
fn say_then_exit_answers_with_what_was_said() {
    let h = handler(json!({"access": ["ngx.say('hello ', 42) return ngx.exit(200)"]}));
    let e = exit_of(TestRequest::new().run(&h));
    assert_eq!(e.status, StatusCode::OK);
    assert_eq!(&e.body[..], b"hello 42\n");
    let h = handler(json!({"access": ["ngx.exit(ngx.HTTP_FORBIDDEN)"]}));
    let e = exit_of(TestRequest::new().run(&h));
    assert_eq!(body_json(&e), json!({"message": "Forbidden"}));
}

#[test]
fn query_and_path_for_the_upstream() {
    let h = handler(json!({"access": [
        "local q = kong.request.get_query() \
         kong.service.request.set_query({ b = q.a, flag = true }) \
         kong.service.request.set_path('/v2' .. kong.request.get_path())"
    ]}));
    let mut req = TestRequest::new();
    req.path = "/p";
    req.query = Some("a=x%20y&c=1");
    assert!(matches!(req.run(&h), Access::Continue));
    assert_eq!(req.upstream.query.as_deref(), Some("b=x%20y&flag"));
    assert_eq!(req.upstream.path.as_deref(), Some("/v2/p"));
}

/// `kong.request.get_uri_captures`, `kong.service.request.clear_query_arg`, `kong.nginx`.
#[test]
fn captures_query_args_and_kong_nginx() {
    let h = handler(json!({"access": [
        "local c = kong.request.get_uri_captures() \
         kong.service.request.set_header('x-caps', c.unnamed[1] .. ',' .. c.named.id) \
         kong.service.request.clear_query_arg('drop me') \
         kong.nginx.set_ctx('k', kong.nginx.get_subsystem()) \
         kong.service.request.set_header('x-ctx', kong.nginx.get_ctx('k'))"
    ]}));
    let mut req = TestRequest::new();
    req.query = Some("a=1&drop%20me=2&b=3&drop+me");
    req.captures = vec![
        (None, "v2".to_string()),
        (Some("id".to_string()), "42".to_string()),
    ];
    assert!(matches!(req.run(&h), Access::Continue));
    assert_eq!(req.headers.get("x-caps").unwrap(), "v2,42");
    assert_eq!(req.headers.get("x-ctx").unwrap(), "http");
    assert_eq!(req.upstream.query.as_deref(), Some("a=1&b=3"));
}

/// `kong.ctx.shared` lives from the access phase to header_filter and body_filter.
#[test]
fn ctx_shared_carries_from_access_to_the_response() {
    let h = handler(json!({
        "access": ["kong.ctx.shared.who = kong.request.get_header('x-user')"],
        "header_filter": ["kong.response.set_header('x-who', kong.ctx.shared.who)"],
        "body_filter": ["if ngx.arg[2] then ngx.arg[1] = 'by ' .. kong.ctx.shared.who end"],
    }));
    let mut req = TestRequest::new();
    req.headers
        .insert("x-user", HeaderValue::from_static("ann"));
    assert!(matches!(req.run(&h), Access::Continue));
    let mut headers = HeaderMap::new();
    let mut head = ResponseHead {
        status: StatusCode::OK,
        headers: &mut headers,
        from_upstream: true,
        consumer: None,
        ctx: &mut req.ctx,
        buffered: None,
    };
    let mut filter = h.header_filter(&mut head).expect("a body filter");
    assert_eq!(headers.get("x-who").unwrap(), "ann");
    assert_eq!(filter.filter(Bytes::from_static(b"x"), false), "x");
    assert_eq!(filter.filter(Bytes::new(), true), "by ann");
}

#[test]
fn get_raw_body_gathers_the_pieces_and_set_raw_body_replaces_them() {
    let h = handler(json!({"body_filter": [
        "local b = kong.response.get_raw_body() if b then kong.response.set_raw_body(b:upper()) end"
    ]}));
    let mut headers = HeaderMap::new();
    let mut ctx = PluginCtx::default();
    let mut head = ResponseHead {
        status: StatusCode::OK,
        headers: &mut headers,
        from_upstream: true,
        consumer: None,
        ctx: &mut ctx,
        buffered: None,
    };
    let mut f = h.header_filter(&mut head).unwrap();
    assert_eq!(f.filter(Bytes::from_static(b"ab"), false), "");
    assert_eq!(f.filter(Bytes::from_static(b"cd"), false), "");
    assert_eq!(f.filter(Bytes::new(), true), "ABCD");
}

#[test]
fn header_filter_changes_status_and_headers() {
    let h = handler(json!({"header_filter": [
        "if kong.service.response.get_status() == 404 then kong.response.set_status(410) end \
         kong.response.clear_header('server') ngx.header['X-Seen'] = kong.response.get_source()"
    ]}));
    let mut headers = HeaderMap::new();
    headers.insert("server", HeaderValue::from_static("up"));
    let mut ctx = PluginCtx::default();
    let mut head = ResponseHead {
        status: StatusCode::NOT_FOUND,
        headers: &mut headers,
        from_upstream: true,
        consumer: None,
        ctx: &mut ctx,
        buffered: None,
    };
    assert!(h.header_filter(&mut head).is_none());
    assert_eq!(head.status, StatusCode::GONE);
    assert!(headers.get("server").is_none());
    assert_eq!(headers.get("x-seen").unwrap(), "service");
}

/// The sandbox: no os.execute, io, load or unlisted modules; kong's tables cannot be changed;
/// each chunk's globals are its own.
#[test]
fn the_sandbox_keeps_the_code_in() {
    for code in [
        "os.execute('true')",
        "io.open('/etc/passwd')",
        "load('return 1')()",
        "require('os')",
        "kong.request = nil",
        "string.len = nil",
        "kong.log.err = nil",
        "ngx.say = nil",
    ] {
        let h = handler(json!({ "access": [code] }));
        match TestRequest::new().run(&h) {
            Access::Exit(e) => assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR, "{code}"),
            _ => panic!("{code} ran"),
        }
    }
    // What the sandbox allows.
    let h = handler(json!({"access": [
        "x = string.format('%d', math.floor(2.5)) kong.response.set_header('x', x .. tostring(os.time() > 0))"
    ]}));
    let mut req = TestRequest::new();
    assert!(matches!(req.run(&h), Access::Continue));
    assert_eq!(req.response_headers[0].1, "2true");
    // The modules were left as they were for the next chunk, and kong.log still calls.
    let h = handler(json!({"access": [
        "kong.log('still callable') kong.response.set_header('x', string.len('abc'))"
    ]}));
    let mut req = TestRequest::new();
    assert!(matches!(req.run(&h), Access::Continue));
    assert_eq!(req.response_headers[0].1, "3");
}

#[test]
fn phases_outside_their_place_are_refused() {
    // (kong.response.set_status is allowed in access, as in Kong; the body is body_filter's.)
    let h = handler(json!({"access": ["kong.response.get_raw_body()"]}));
    let e = exit_of(TestRequest::new().run(&h));
    assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
}

#[test]
fn configs_are_checked_as_kong_checks_them() {
    let none = crate::schema::validate(schema::FIELDS, &json!({})).unwrap();
    let errs = schema::entity_checks(&none);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].0, "/@entity");
    assert!(errs[0]
        .1
        .starts_with("at least one of these fields must be non-empty: 'config.certificate'"));
    let errs = schema::lua_checks(
        "pre-function",
        &json!({"access": ["local = 1"]}),
        &Default::default(),
    );
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].0, "access");
    assert!(
        errs[0]
            .1
            .starts_with("error parsing pre-function: [string \"local = 1\"]:1:"),
        "{}",
        errs[0].1
    );
    let ok =
        crate::schema::validate(schema::FIELDS, &json!({"log": ["kong.log.err('x')"]})).unwrap();
    assert!(schema::entity_checks(&ok).is_empty());
    assert!(schema::lua_checks("pre-function", &ok, &Default::default()).is_empty());
}

#[test]
fn cjson_is_there_for_code_that_requires_it_when_allowed() {
    // Not in untrusted_lua_sandbox_requires (empty by default): refused.
    let h = handler(json!({"access": ["local cjson = require 'cjson'"]}));
    assert_eq!(
        exit_of(TestRequest::new().run(&h)).status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
}

#[test]
fn each_node_runs_lua_under_its_own_untrusted_lua_settings() {
    // Two nodes' settings in one process (the plugins' runtime is per node, not static): one
    // lets `require 'cjson'` through the sandbox, the other does not, one refuses Lua at all.
    let config = crate::schema::validate(
        schema::FIELDS,
        &json!({"access": ["local cjson = require 'cjson'"]}),
    )
    .unwrap();
    let allowing = std::sync::Arc::new(super::Settings {
        requires: vec!["cjson".into()],
        ..Default::default()
    });
    let allowed = Serverless::new("pre-function", &config, allowing.clone());
    let refused = Serverless::new("pre-function", &config, Default::default());
    assert!(matches!(TestRequest::new().run(&allowed), Access::Continue));
    assert_eq!(
        exit_of(TestRequest::new().run(&refused)).status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert!(matches!(TestRequest::new().run(&allowed), Access::Continue));
    let off = std::sync::Arc::new(super::Settings {
        mode: super::Mode::Off,
        ..Default::default()
    });
    let errs = schema::lua_checks("pre-function", &config, &off);
    assert_eq!(
        errs,
        vec![("access".to_string(), super::DISABLED.to_string())]
    );
    assert!(schema::lua_checks("pre-function", &config, &allowing).is_empty());
}

#[test]
fn get_headers_reads_any_case_and_many_values() {
    let h = handler(json!({"access": [
        "local h = kong.request.get_headers() \
         kong.response.set_header('x-out', h.x_multi[1] .. h['X-Multi'][2] .. h.single)"
    ]}));
    let mut req = TestRequest::new();
    req.headers.append("x-multi", HeaderValue::from_static("a"));
    req.headers.append("x-multi", HeaderValue::from_static("b"));
    req.headers.insert("single", HeaderValue::from_static("c"));
    assert!(matches!(req.run(&h), Access::Continue));
    assert_eq!(
        req.response_headers[0],
        (
            HeaderName::from_static("x-out"),
            HeaderValue::from_static("abc")
        )
    );
}

#[test]
fn custom_fields_are_checked_and_set_at_dotted_paths() {
    assert!(
        super::check_log_fields("file-log", &json!({"path": "/tmp/x"}), &Default::default())
            .is_empty()
    );
    let errs = super::check_log_fields(
        "file-log",
        &json!({"custom_fields_by_lua": {"ok": "return 1", "bad": "return +"}}),
        &Default::default(),
    );
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].0, "custom_fields_by_lua.bad");
    let mut j = json!({"request": {"size": 1}, "gone": true});
    crate::log::set_path(&mut j, "request.headers.x", Some(json!("v")));
    crate::log::set_path(&mut j, "gone", None);
    crate::log::set_path(&mut j, "top", Some(json!(2)));
    assert_eq!(
        j,
        json!({"request": {"size": 1, "headers": {"x": "v"}}, "top": 2})
    );
}

/// Tables that contain themselves, or nest where a flat value is wanted, are errors (Kong's
/// 500), never a walk that runs out of stack.
#[test]
fn self_referencing_tables_are_errors_not_crashes() {
    for code in [
        "local t = {} t[1] = t kong.service.request.set_header('x', t)",
        "local t = {} t[1] = t ngx.say(t)",
        "kong.response.set_header('x', {{'a'}})",
    ] {
        let h = handler(json!({ "access": [code] }));
        let e = exit_of(TestRequest::new().run(&h));
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR, "{code}");
    }
    // Flat arrays still make one line each; nested ngx.say arrays are written flat.
    let h = handler(json!({"access": [
        "kong.response.set_header('X_Many', {'a', 1}) ngx.say({'a', {'b', {'c'}}}) ngx.exit(200)"
    ]}));
    let mut req = TestRequest::new();
    let e = exit_of(req.run(&h));
    assert_eq!(&e.body[..], b"abc\n");
    let many: Vec<_> = req
        .response_headers
        .iter()
        .filter(|(k, _)| k == "x_many" || k == "x-many")
        .map(|(_, v)| v.to_str().unwrap().to_string())
        .collect();
    assert_eq!(many, ["a", "1"]);
}

#[test]
fn kong_cache_runs_the_callback_once_keeps_misses_and_forgets_on_invalidate() {
    // One node's settings: its cache generation carries the invalidations between workers.
    let settings = std::sync::Arc::new(super::Settings {
        shared: std::sync::Arc::new(super::shared::SharedDicts::new([(
            "kong_db_cache".to_string(),
            1 << 20,
        )])),
        ..Default::default()
    });
    let config = crate::schema::validate(
        schema::FIELDS,
        &json!({"access": [
            "calls = (calls or 0) \
             local function load(k) calls = calls + 1 if k == 'none' then return nil end return { v = k .. calls } end \
             local a, err, lvl = kong.cache:get('k', nil, load, 'k') \
             local b, _, lvl2 = kong.cache:get('k', nil, load, 'k') \
             local n, nerr = kong.cache:get('missing', { neg_ttl = 100 }, load, 'none') \
             local n2 = kong.cache:get('missing', nil, load, 'none') \
             local ttl, _, pv = kong.cache:probe('k') \
             local bad, berr = kong.cache:get('boom', nil, function() error('kaput') end) \
             local same = a == b \
             kong.cache:invalidate('k') \
             local c = kong.cache:get('k', nil, load, 'k') \
             local ok, kerr = pcall(kong.cache.get, kong.cache, 12) \
             kong.service.request.set_header('x-out', table.concat({ a.v, tostring(same), lvl, lvl2, \
               tostring(n), tostring(n2), calls, tostring(pv and pv.v), ttl, c.v, berr, kerr }, '|'))"
        ]}),
    )
    .unwrap();
    let h = Serverless::new("pre-function", &config, settings);
    let mut req = TestRequest::new();
    assert!(matches!(req.run(&h), Access::Continue));
    let out = req
        .headers
        .get("x-out")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let parts: Vec<&str> = out.split('|').collect();
    // The first get ran the callback (level 3), the second hit (level 1) the same table.
    assert_eq!(&parts[..4], ["k1", "true", "3", "1"], "{out}");
    // A nil result is a cached miss: the callback ran once for both gets (three runs in all:
    // 'k', 'missing', and 'k' again after the invalidation).
    assert_eq!(&parts[4..7], ["nil", "nil", "3"], "{out}");
    // probe: no expiry (0), the value kept.
    assert_eq!(&parts[7..9], ["k1", "0"], "{out}");
    // After invalidate the callback runs again.
    assert_eq!(parts[9], "k3", "{out}");
    assert!(
        parts[10].starts_with("failed to get from node cache: callback threw an error:"),
        "{out}"
    );
    assert!(parts[11].contains("key must be a string"), "{out}");
}

#[test]
fn a_kong_cache_invalidation_reaches_the_other_workers() {
    let settings = std::sync::Arc::new(super::Settings {
        shared: std::sync::Arc::new(super::shared::SharedDicts::new([(
            "kong_db_cache".to_string(),
            1 << 20,
        )])),
        ..Default::default()
    });
    let handler_of = |code: &str| {
        let config = crate::schema::validate(schema::FIELDS, &json!({ "access": [code] })).unwrap();
        Serverless::new("pre-function", &config, settings.clone())
    };
    let reader = handler_of(
        "runs = (runs or 0) \
         local v = kong.cache:get('shared-key', nil, function() runs = runs + 1 return runs end) \
         kong.service.request.set_header('x-v', tostring(v))",
    );
    let invalidator = handler_of("kong.cache:invalidate('shared-key')");
    let read = |h: &Serverless| {
        let mut req = TestRequest::new();
        assert!(matches!(req.run(h), Access::Continue));
        req.headers
            .get("x-v")
            .unwrap()
            .to_str()
            .unwrap()
            .to_string()
    };
    // This thread (a worker) caches the value: reads agree until another worker invalidates.
    assert_eq!(read(&reader), "1");
    assert_eq!(read(&reader), "1");
    std::thread::scope(|s| {
        s.spawn(|| {
            assert!(matches!(
                TestRequest::new().run(&invalidator),
                Access::Continue
            ));
        });
    });
    assert_eq!(read(&reader), "2");
}

#[test]
fn forwarded_getters_methods_bodies_tables_and_the_node() {
    let h = handler(json!({"access": [
        "local ok, e = pcall(function() kong.service.request.set_header('x-out', table.concat({ \
           kong.request.get_forwarded_scheme(), kong.request.get_forwarded_host(), \
           kong.request.get_forwarded_port(), kong.request.get_forwarded_path(), \
           tostring(kong.request.get_forwarded_prefix()) }, '|')) \
         kong.service.request.set_method('PUT') \
         local ok, err = pcall(kong.service.request.set_method, 'BREW') \
         kong.service.request.set_header('x-bad-method', tostring(err):match('invalid method: %w+')) \
         kong.service.request.set_body({ a = 1 }, 'application/json') \
         local t = kong.table.merge({ x = 1 }, { y = 2 }) kong.table.clear(t) \
         kong.service.request.set_header('x-table', tostring(next(t))) \
         kong.service.request.set_header('x-node', type(kong.node.get_id()) .. ',' .. type(kong.node.get_hostname())) end) \
         if not ok then kong.response.exit(599, tostring(e)) end"
    ]}));
    // A request through a proxy that says where it came from, with a body.
    let forwarded = |trusted: bool| {
        let mut req = TestRequest::new();
        req.trusted = trusted;
        for (k, v) in [
            ("host", "gw.test:8000"),
            ("x-forwarded-proto", "HTTPS"),
            ("x-forwarded-host", "public.test:443"),
            ("x-forwarded-port", "443"),
            ("x-forwarded-prefix", "/api"),
        ] {
            req.headers.insert(k, HeaderValue::from_static(v));
        }
        req.body = Some(Bytes::from_static(b"old"));
        req
    };
    let mut req = forwarded(false);
    // Not from a trusted address: the request's own values.
    match req.run(&h) {
        Access::Continue => {}
        Access::Exit(e) => panic!("{}: {}", e.status, String::from_utf8_lossy(&e.body)),
        Access::Wait(_) => panic!("waits"),
    }
    assert_eq!(req.headers.get("x-out").unwrap(), "http|gw.test|8000|/|nil");
    assert_eq!(req.upstream.method, Some(http::Method::PUT));
    assert_eq!(
        req.headers.get("x-bad-method").unwrap(),
        "invalid method: BREW"
    );
    assert_eq!(
        req.headers
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string()),
        Some("application/json".to_string()),
        "{:?} {:?}",
        req.headers,
        req.body
    );
    assert_eq!(req.headers.get("x-table").unwrap(), "nil");
    assert_eq!(req.headers.get("x-node").unwrap(), "string,string");
    // From a trusted one: the X-Forwarded-* values.
    let mut req = forwarded(true);
    assert!(matches!(req.run(&h), Access::Continue));
    assert_eq!(
        req.headers.get("x-out").unwrap(),
        "https|public.test|443|/|/api"
    );
}

#[test]
fn request_id_start_time_client_port_and_trusted_ips() {
    let settings = std::sync::Arc::new(super::Settings {
        trusted_ips: vec![("10.0.0.0".parse().unwrap(), 8)],
        ..Default::default()
    });
    let config = crate::schema::validate(
        schema::FIELDS,
        &json!({"access": [
            "local now = ngx.now() * 1000 \
             local started = kong.request.get_start_time() \
             kong.service.request.set_header('x-out', table.concat({ kong.request.get_id(), \
               kong.client.get_port(), tostring(kong.ip.is_trusted('10.1.2.3')), \
               tostring(kong.ip.is_trusted('192.168.0.1')), \
               tostring(started <= now + 1 and started > now - 60000) }, '|'))"
        ]}),
    )
    .unwrap();
    let h = Serverless::new("pre-function", &config, settings);
    let mut req = TestRequest::new();
    assert!(matches!(req.run(&h), Access::Continue));
    assert_eq!(
        req.headers.get("x-out").unwrap(),
        "test-request-id|54321|true|false|true"
    );
}

#[test]
fn code_that_never_gives_the_worker_back_is_stopped_with_kongs_500() {
    // An endless loop, and one that catches the budget's error and goes on: both end.
    for code in [
        "while true do end",
        "local n = 0 while true do pcall(function() while true do n = n + 1 end end) end",
    ] {
        let h = handler(json!({ "access": [code] }));
        let e = exit_of(TestRequest::new().run(&h));
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR, "{code}");
        assert_eq!(
            body_json(&e),
            json!({"message": "An unexpected error occurred"})
        );
    }
    // The worker's state serves the next call as before.
    let h = handler(json!({"access": ["kong.service.request.set_header('x-ok', 'yes')"]}));
    let mut req = TestRequest::new();
    assert!(matches!(req.run(&h), Access::Continue));
    assert_eq!(req.headers.get("x-ok").unwrap(), "yes");
}

/// Every function of Kong's PDK (the `@function` tags of Kong 3.9.1's `kong/pdk/`, read from
/// the mirror of github.com/Kong/kong at test time) that this runtime has not is named in
/// docs/pdk-coverage.md, and nothing else is: the page says precisely what is missing.
#[test]
fn the_pdk_coverage_page_names_every_missing_function() {
    let mirrors = std::env::var("TURNPIKE_TEST_MIRRORS").unwrap_or_else(|_| "/work/.mirror".into());
    let git_dir = std::path::Path::new(&mirrors).join("Kong+kong/repo");
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("--git-dir")
            .arg(&git_dir)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let Some(files) = git(&["ls-tree", "-r", "--name-only", "3.9.1", "kong/pdk"]) else {
        eprintln!("skipped: no mirror of github.com/Kong/kong here (fetch github:Kong/kong)");
        return;
    };
    let mut kong_functions = std::collections::BTreeSet::new();
    for f in files.lines().filter(|f| !f.contains("/private/")) {
        let text = git(&["show", &format!("3.9.1:{f}")]).unwrap_or_default();
        for line in text.lines() {
            if let Some(rest) = line.split("@function ").nth(1) {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '.' || *c == '_')
                    .collect();
                if name.starts_with("kong.") {
                    kong_functions.insert(name);
                }
            }
        }
    }
    assert!(kong_functions.len() > 100, "{kong_functions:?}");
    let settings = std::sync::Arc::new(super::Settings::default());
    let names: Vec<String> = kong_functions.iter().cloned().collect();
    let missing: Vec<String> = super::with_runtime(&settings, |rt| {
        rt.lua
            .load(
                r#"local names = ...
                local missing = {}
                for _, n in ipairs(names) do
                  local v = _G
                  for seg in n:gmatch("[^.]+") do
                    if type(v) ~= "table" then v = nil break end
                    v = rawget(v, seg) or v[seg]
                  end
                  if v == nil then missing[#missing + 1] = n end
                end
                return missing"#,
            )
            .call::<Vec<String>>(names)
            .unwrap()
    })
    .unwrap();
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/pdk-coverage.md"
    ))
    .unwrap_or_default();
    let listed: Vec<String> = page
        .split("## Not implemented")
        .nth(1)
        .unwrap_or("")
        .lines()
        .filter_map(|l| l.strip_prefix("- `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect();
    assert_eq!(
        listed, missing,
        "docs/pdk-coverage.md's list is not what is missing; missing now: {missing:#?}"
    );
}

/// `kong.vault` in a plugin config's code: references recognised and taken apart, but no
/// secret read (the sandbox's environment is `untrusted_lua_sandbox_environment`'s alone).
#[test]
fn kong_vault_parses_references_and_keeps_secrets_from_configs() {
    let h = handler(json!({"access": [
        "local p = kong.vault.parse_reference('{vault://env/my-secret/key}') \
         local none, err = kong.vault.get('{vault://env/home}') \
         kong.service.request.set_header('x-v', table.concat({ \
           tostring(kong.vault.is_reference('{vault://env/x}')), \
           tostring(kong.vault.is_reference('plain')), p.name, p.resource, p.key, \
           tostring(none), err:find('cannot read secrets') and 'refused' or err }, ','))"
    ]}));
    let mut req = TestRequest::new();
    assert!(matches!(req.run(&h), Access::Continue));
    assert_eq!(
        req.headers.get("x-v").unwrap(),
        "true,false,env,my-secret,key,nil,refused"
    );
}
