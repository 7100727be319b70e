//! The streaming reader against the document reader, reloads compared with the running config
//! (what they share), configs written back as Kong exports them, and unique fields.

use super::*;

/// Timestamps aside (each reader takes the clock), a JSON document read entity by entity
/// gives the config the whole-document reader gives, hash included.
#[test]
fn streaming_reader_equals_the_document_reader() {
    fn strip_times(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("created_at");
                m.remove("updated_at");
                // A key-auth key's id is random (its key is generated when absent).
                if m.contains_key("key") {
                    m.remove("id");
                }
                m.values_mut().for_each(strip_times);
            }
            Value::Array(a) => a.iter_mut().for_each(strip_times),
            _ => {}
        }
    }
    let docs = [
        serde_json::json!({
            "_format_version": "3.0",
            "_transform": false,
            "_comment": "all kinds",
            "services": [
                {"name": "a", "url": "http://a.example:8080/p", "tags": ["t"],
                 "routes": [{"name": "ra", "paths": ["/a", "~/re$"], "methods": ["GET"],
                             "plugins": [{"name": "key-auth"}]}],
                 "plugins": [{"name": "rate-limiting", "config": {"minute": 5}}]},
                {"name": "b", "host": "b.example", "enabled": false}
            ],
            "routes": [{"name": "rb", "hosts": ["x.example"], "service": "b"},
                       {"id": "0A9B8C1E-0000-4000-8000-000000000001", "paths": ["/id"],
                        "service": {"name": "a"}}],
            "upstreams": [{"name": "up", "targets": [{"target": "10.0.0.1:80", "weight": 5}]}],
            "targets": [{"target": "10.0.0.2:80", "upstream": "up"}],
            "consumers": [
                {"username": "alice", "custom_id": "c-1",
                 "keyauth_credentials": [{"key": "k1"}, {"key": "k2", "tags": ["x"]}],
                 "basicauth_credentials": [{"username": "alice", "password": "pw"}],
                 "acls": [{"group": "admins"}],
                 "plugins": [{"name": "cors"}]},
                {"username": "bob"}
            ],
            "keyauth_credentials": [{"key": "k3", "consumer": "bob"}],
            "plugins": [{"name": "prometheus"}, {"name": "acl", "route": "ra",
                         "config": {"allow": ["admins"]}}]
        }),
        serde_json::json!({"_format_version": "3.0"}),
        serde_json::json!({"_format_version": "3.0", "services": []}),
        // Children before their parent's own fields (decK writes keys in alphabetical order).
        serde_json::json!({"_format_version": "3.0",
            "consumers": [{"acls": [{"group": "g"}],
                           "basicauth_credentials": [{"password": "p", "username": "x"}],
                           "keyauth_credentials": [{"key": "k"}], "username": "zed"}],
            "services": [{"host": "h", "routes": [{"name": "r1", "paths": ["/1"]},
                                                  {"name": "r2", "paths": ["/2"], "plugins": [{"name": "cors"}]}],
                          "name": "svc"}],
            "upstreams": [{"targets": [{"target": "10.0.0.9:80"}], "name": "u2"}]}),
    ];
    /// Every plugin enabled, its config as given.
    struct Any;
    impl PluginRegistry for Any {
        fn check(&self, _: &str, config: &Value) -> Option<Result<Value, Vec<(String, String)>>> {
            Some(Ok(config.clone()))
        }
        fn entities(&self) -> &'static [&'static PluginEntity] {
            Credentials.entities()
        }
        fn allows_consumer(&self, _name: &str) -> bool {
            true
        }
    }
    for doc in docs {
        let text = doc.to_string();
        let whole = load(&doc, &Any).unwrap_or_else(|e| panic!("{e}"));
        let streamed = load_json_streaming(&text, &Any).expect("read by the stream");
        let (mut a, mut b) = (streamed.to_json(), whole.to_json());
        strip_times(&mut a);
        strip_times(&mut b);
        assert_eq!(a, b);
        assert_eq!(streamed.hash, whole.hash);
        assert_eq!(streamed.transform, whole.transform);
        assert_eq!(streamed.credentials.len(), whole.credentials.len());
        // The same document as YAML: made JSON text, then read entity by entity.
        let yaml = serde_yaml::to_string(&doc).unwrap();
        let json = yaml::to_json_text(&yaml).unwrap();
        let consumed = load_json_streaming(&json, &Any).expect("read by the stream");
        assert_eq!(load_str(&yaml, &Any).unwrap().hash, whole.hash);
        let mut c = consumed.to_json();
        strip_times(&mut c);
        assert_eq!(c, b);
        assert_eq!(consumed.hash, whole.hash);
    }
}

/// Documents with errors, and those that need the whole document, are left to the document
/// reader: `load_str` reports the same errors whatever the format.
#[test]
fn streaming_reader_leaves_errors_and_old_formats_to_the_document_reader() {
    let left = [
        r#"{"_format_version": "3.0", "services": [{"name": "a", "port": 99999}]}"#,
        r#"{"_format_version": "3.0", "routes": [{"paths": ["/"], "service": "nope"}]}"#,
        r#"{"_format_version": "3.0", "consumers": [{"username": "a"}, {"username": "a"}]}"#,
        r#"{"_format_version": "3.0", "consumers": [{"username": "a", "keyauth_credentials": [{"key": "k"}]}, {"username": "b", "keyauth_credentials": [{"key": "k"}]}]}"#,
        r#"{"_format_version": "3.0", "bogus": []}"#,
        r#"{"_format_version": "3.0", "services": {}}"#,
        r#"{"_format_version": "3.0", "services": [1]}"#,
        r#"{"services": [{"name": "a", "host": "h"}], "_format_version": "3.0"}"#,
        r#"{"_format_version": "1.1", "services": [{"name": "a", "host": "h", "routes": [{"paths": ["/x$"]}]}]}"#,
        r#"{"_format_version": "3.0", "services": [], "services": []}"#,
        r#"{"_format_version": "3.0"} trailing"#,
        r#"{"_format_version": "3.0", "_transform": "yes"}"#,
        r#"{"_format_version": "3.0", "services": [{"name": "s", "host": "h", "routes": [{"paths": ["/"], "service": "s"}]}]}"#,
        r#"{"_format_version": "3.0", "services": [{"name": "s", "host": "h", "routes": [{"paths": ["/"]}, "x"]}]}"#,
        r#"{"_format_version": "3.0", "services": [{"name": "s", "host": "h", "routes": [{"name": "r", "paths": ["/"]}]}, {"name": "t", "host": "h", "routes": [{"name": "r", "paths": ["/t"]}]}]}"#,
    ];
    for text in left {
        assert!(load_json_streaming(text, &Credentials).is_none(), "{text}");
        let v: Result<Value, _> = serde_json::from_str(text);
        let direct = match v {
            Ok(v) => load(&v, &Credentials)
                .map(|c| c.hash)
                .map_err(|e| e.to_string()),
            Err(_) => Err("unparsable".into()),
        };
        let via = load_str(text, &Credentials)
            .map(|c| c.hash)
            .map_err(|e| e.to_string());
        match (direct, via) {
            (Err(_), Err(_)) | (Ok(_), Ok(_)) => {}
            (a, b) => panic!("{text}: {a:?} vs {b:?}"),
        }
    }
    // Moved `_format_version` and old formats still load, through the document reader.
    assert!(load_str(left[7], &Credentials).is_ok());
    let old = load_str(left[8], &Credentials).unwrap();
    assert_eq!(old.routes[0].paths.as_ref().unwrap()[0], "~/x$");
    let e = load_str(left[0], &Credentials).unwrap_err().to_string();
    assert!(
        e.contains("port: value should be between 0 and 65535"),
        "{e}"
    );
}

/// A credential keeps only its set fields, and is still written with every field of its
/// entity, null when not set, as Kong writes it.
#[test]
fn credentials_keep_set_fields_and_write_every_field() {
    let c = ok(r#"
_format_version: "3.0"
consumers:
  - username: alice
    keyauth_credentials:
      - key: k1
      - key: k2
        ttl: 60
        tags: [a]
"#);
    let j = |i: usize| serde_json::to_value(&c.credentials[i]).unwrap();
    let first = j(0);
    assert_eq!(first["key"], "k1");
    assert!(first.get("ttl").is_some_and(Value::is_null), "{first}");
    assert!(first.get("tags").is_some_and(Value::is_null), "{first}");
    assert_eq!(first["consumer"]["id"], *c.consumers[0].id);
    assert_eq!(c.credentials[0].fields.get("ttl"), None);
    let names: Vec<&str> = c.credentials[0].fields.iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["key", "ttl", "tags"]);
    let second = j(1);
    assert_eq!(second["ttl"], 60);
    assert_eq!(second["tags"], serde_json::json!(["a"]));
}

/// A reload compared with the running config: unchanged routes are the running config's
/// own, changed, added and removed ones are named, and anything else changed is noticed.
#[test]
fn a_new_config_is_compared_with_the_running_one() {
    let doc = |path: &str, extra_route: bool, consumer: &str| {
        let mut routes = vec![
            serde_json::json!({"name": "a", "paths": ["/a"]}),
            serde_json::json!({"name": "b", "paths": [path]}),
        ];
        if extra_route {
            routes.push(serde_json::json!({"name": "c", "paths": ["/c"]}));
        }
        serde_json::json!({"_format_version": "3.0",
            "services": [{"name": "s", "host": "h", "routes": routes}],
            "consumers": [{"username": consumer}]})
        .to_string()
    };
    let mut old = ok(&doc("/b", true, "u"));
    old.routes = old
        .routes
        .iter()
        .map(|r| {
            let mut r = (**r).clone();
            r.created_at -= 100;
            std::sync::Arc::new(r)
        })
        .collect();
    // The same document again: nothing changes, every route is shared.
    let mut same = ok(&doc("/b", true, "u"));
    let c = same.changes_from(&old).expect("a patch");
    assert!(c.routes.is_empty() && !c.others, "{c:?}");
    assert_eq!(c.from, old.hash);
    for (n, o) in same.routes.iter().zip(&old.routes) {
        assert!(std::sync::Arc::ptr_eq(n, o));
    }
    // One route changed, one removed, a consumer renamed.
    let mut new = ok(&doc("/b2", false, "v"));
    let c = new.changes_from(&old).expect("a patch");
    let (b, cid) = (&old.routes[1].id, &old.routes[2].id);
    assert_eq!(c.routes, vec![b.clone(), cid.clone()]);
    assert!(c.others);
    assert!(std::sync::Arc::ptr_eq(&new.routes[0], &old.routes[0]));
    assert_eq!(new.routes[0].created_at, old.routes[0].created_at);
    assert_ne!(new.routes[1].created_at, old.routes[1].created_at);
    // Kept routes in another order: compiled whole.
    let mut swapped = ok(&serde_json::json!({"_format_version": "3.0",
        "services": [{"name": "s", "host": "h", "routes": [
            {"name": "b", "paths": ["/b"]}, {"name": "a", "paths": ["/a"]}]}]})
    .to_string());
    assert!(swapped.changes_from(&old).is_none());
}

/// The config written straight to text is the config as values, keys in Kong's order.
#[test]
fn config_is_written_as_kong_exports_it() {
    let c = ok(r#"
_format_version: "3.0"
services: [{name: s, host: h, routes: [{name: r, paths: [/]}]}]
consumers:
  - username: alice
    keyauth_credentials: [{key: k}]
    acls: [{group: g}]
"#);
    let text = serde_json::to_string(&c.json()).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v, c.to_json());
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        [
            "_format_version",
            "_transform",
            "services",
            "routes",
            "consumers",
            "keyauth_credentials",
            "acls"
        ]
    );
    assert_eq!(v["keyauth_credentials"][0]["key"], "k");
    assert!(!text.contains("upstreams"));
}

/// A reload read against the running config shares the routes it leaves alone as it reads
/// them, and never a route whose fields or service changed.
#[test]
fn a_reload_shares_unchanged_routes_as_it_reads_them() {
    let doc = |b_path: &str, c_service: &str| {
        serde_json::json!({"_format_version": "3.0",
            "services": [
                {"name": "s", "host": "h", "routes": [
                    {"name": "a", "paths": ["/a"]}, {"name": "b", "paths": [b_path]}]},
                {"name": "t", "host": "h2"}],
            "routes": [{"name": "c", "paths": ["/c"], "service": c_service}]})
        .to_string()
    };
    let mut old = load_json_streaming(&doc("/b", "s"), &Credentials).unwrap();
    for r in &mut old.routes {
        std::sync::Arc::make_mut(r).created_at -= 100;
    }
    let new = load_json_streaming_against(&doc("/b2", "t"), &Credentials, Some(&old)).unwrap();
    assert!(std::sync::Arc::ptr_eq(&new.routes[0], &old.routes[0]));
    assert!(!std::sync::Arc::ptr_eq(&new.routes[1], &old.routes[1]));
    assert_eq!(new.routes[1].paths.as_ref().unwrap()[0], "/b2");
    // c moved to service t: its own copy, naming t.
    assert!(!std::sync::Arc::ptr_eq(&new.routes[2], &old.routes[2]));
    assert_eq!(
        new.routes[2].service.as_ref().unwrap().id,
        new.services[1].id.clone()
    );
    assert_eq!(
        old.routes[2].service.as_ref().unwrap().id,
        old.services[0].id.clone()
    );
    // The same document: every route shared, and equal to a whole read.
    let same = load_json_streaming_against(&doc("/b", "s"), &Credentials, Some(&old)).unwrap();
    for (n, o) in same.routes.iter().zip(&old.routes) {
        assert!(std::sync::Arc::ptr_eq(n, o));
    }
    let mut again = same.clone();
    let c = again.changes_from(&old).unwrap();
    assert!(c.routes.is_empty() && !c.others, "{c:?}");
}

/// Consumers and their credentials are shared the same way: by id, and a key-auth key (whose
/// id is random when the file gives none) by its key, taking the running key's id.
#[test]
fn a_reload_shares_unchanged_consumers_and_keys() {
    let doc = |second_key: &str| {
        serde_json::json!({"_format_version": "3.0", "consumers": [
            {"username": "a", "keyauth_credentials": [{"key": "ka"}], "acls": [{"group": "g"}]},
            {"username": "b", "keyauth_credentials": [{"key": second_key}]}]})
        .to_string()
    };
    let old = load_json_streaming(&doc("kb"), &Credentials).unwrap();
    let same = load_json_streaming_against(&doc("kb"), &Credentials, Some(&old)).unwrap();
    for (n, o) in same.consumers.iter().zip(&old.consumers) {
        assert!(std::sync::Arc::ptr_eq(n, o));
    }
    for (n, o) in same.credentials.iter().zip(&old.credentials) {
        assert!(std::sync::Arc::ptr_eq(n, o), "{n:?}");
    }
    let changed = load_json_streaming_against(&doc("kb2"), &Credentials, Some(&old)).unwrap();
    let key = |c: &Config, k: &str| {
        c.credentials
            .iter()
            .position(|x| x.fields.get("key").and_then(|v| v.as_str()) == Some(k))
            .unwrap()
    };
    let (n, o) = (key(&changed, "ka"), key(&old, "ka"));
    assert!(std::sync::Arc::ptr_eq(
        &changed.credentials[n],
        &old.credentials[o]
    ));
    let n = key(&changed, "kb2");
    assert!(!old
        .credentials
        .iter()
        .any(|o| std::sync::Arc::ptr_eq(o, &changed.credentials[n])));
    assert_eq!(
        *changed.credentials[n].consumer.id,
        *changed.consumers[1].id
    );
    let mut c = changed.clone();
    assert!(c.changes_from(&old).unwrap().others);
    let mut s = same.clone();
    assert!(!s.changes_from(&old).unwrap().others);
}

/// Kong's unique fields across tables: each repeated value is the later entity's error, once,
/// and equal values of different fields or tables are not repeats.
#[test]
fn unique_fields_are_checked_per_table_and_field() {
    let doc = serde_json::json!({"_format_version": "3.0",
        "consumers": [
            {"username": "a", "custom_id": "x", "keyauth_credentials": [{"key": "k1"}]},
            {"username": "b", "custom_id": "a", "keyauth_credentials": [{"key": "k2"}]},
            {"username": "a", "custom_id": "x", "keyauth_credentials": [{"key": "k1"}]}],
        "services": [{"name": "a", "host": "h", "routes": [{"name": "a", "paths": ["/"]}]}]})
    .to_string();
    // The streaming reader leaves a document with errors to the document reader.
    assert!(load_json_streaming(&doc, &Credentials).is_none());
    {
        let text = load_str(&doc, &Credentials).unwrap_err().to_string();
        let count = |s: &str| text.matches(s).count();
        assert_eq!(count("uniqueness violation"), 4, "{text}");
        assert_eq!(count("with primary key set to"), 1, "{text}");
        assert_eq!(
            count("'consumers' entity with username set to 'a'"),
            1,
            "{text}"
        );
        assert_eq!(
            count("'consumers' entity with custom_id set to 'x'"),
            1,
            "{text}"
        );
        assert_eq!(
            count("'keyauth_credentials' entity with key set to 'k1'"),
            1,
            "{text}"
        );
    }
}

#[test]
fn extension_keys_hold_anchors_and_are_not_entities() {
    // decK files keep shared values under top-level `x-` keys and merge them with `<<`.
    let yaml = "_format_version: \"3.0\"\nx-defaults: &defaults\n  connect_timeout: 5000\n  retries: 2\nservices:\n  - name: a\n    url: http://127.0.0.1:9\n    <<: *defaults\n";
    let c = ok(yaml);
    assert_eq!(c.services.len(), 1);
    assert_eq!(c.services[0].connect_timeout, 5000);
    assert_eq!(c.services[0].retries, 2);
    // JSON, read entity by entity or whole: the same config, the same hash.
    let json = r#"{"_format_version": "3.0", "x-note": {"any": ["thing"]}, "services": [{"name": "a", "url": "http://127.0.0.1:9"}]}"#;
    let streamed = super::load_json_streaming(json, &Credentials).expect("streamed");
    let whole = super::load(&serde_json::from_str(json).unwrap(), &Credentials).unwrap();
    assert_eq!(streamed.services.len(), 1);
    assert_eq!(streamed.hash, whole.hash);
    // Any other unknown top-level key stays an error.
    assert!(err("_format_version: \"3.0\"\ny-defaults: {}\n")
        .to_string()
        .contains("y-defaults: unknown field"));
}
