//! The store against a real SQLite file: Kong's CRUD semantics, errors and paging.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Map, Value};
use turnpike_config::declarative;
use turnpike_store::schema::{EntitySpec, Tables};

/// The bundled plugins: their entities (credentials) are tables of the store.
fn plugins() -> turnpike_plugins::Registry {
    turnpike_plugins::bundled()
}

fn by_table(table: &str) -> Option<&'static EntitySpec> {
    Tables::new(&plugins()).by_table(table)
}
use turnpike_store::{Backend, ListQuery, Store, StoreError, StoreOptions};

async fn store() -> (Store, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("turnpike-store-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.join("t.db").display());
    let s = Store::connect(
        StoreOptions {
            backend: Backend::Sqlite,
            url,
            pool_size: 4,
            timeout: Duration::from_secs(5),
            keepalive: None,
        },
        Arc::new(plugins()),
    )
    .await
    .unwrap();
    s.bootstrap().await.unwrap();
    (s, dir)
}

fn obj(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

#[tokio::test]
async fn crud_references_uniqueness_cascade_and_export() {
    let (s, dir) = store().await;
    let services = by_table("services").unwrap();
    let routes = by_table("routes").unwrap();
    let consumers = by_table("consumers").unwrap();
    let keys = by_table("keyauth_credentials").unwrap();

    let svc = s
        .insert(
            services,
            obj(json!({"name": "orders", "url": "http://10.0.0.1:8080/v1", "tags": ["t1", "t2"]})),
            None,
        )
        .await
        .unwrap();
    assert_eq!(svc["port"], 8080);
    assert_eq!(svc["path"], "/v1");
    let sid = svc["id"].as_str().unwrap().to_string();

    // Unique name: 409 with Kong's message.
    let e = s
        .insert(services, obj(json!({"name": "orders", "host": "x"})), None)
        .await
        .unwrap_err();
    assert_eq!(e.to_kong().0, 409);
    assert_eq!(
        e.to_kong().1["message"],
        "UNIQUE violation detected on '{name=\"orders\"}'"
    );

    // Schema violation: nothing written.
    let e = s
        .insert(services, obj(json!({"name": "bad", "port": 99999})), None)
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Schema(_)), "{e:?}");
    assert!(s.get(services, "bad").await.unwrap().is_none());

    // Route referencing the service by name; a dangling reference is a foreign-key error.
    let r = s
        .insert(
            routes,
            obj(json!({"name": "r1", "paths": ["/o"], "service": {"name": "orders"}})),
            None,
        )
        .await
        .unwrap();
    assert_eq!(r["service"]["id"], sid);
    let e = s
        .insert(
            routes,
            obj(
                json!({"paths": ["/x"], "service": {"id": "6f1e9e2a-0000-4000-8000-000000000009"}}),
            ),
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(e.to_kong().1["name"], "foreign key violation");

    // The service cannot go while a route uses it.
    let e = s.delete(services, "orders", None).await.unwrap_err();
    assert_eq!(e.to_kong().1["fields"]["@referenced_by"], "routes");

    // PATCH merges; PUT replaces and keeps created_at.
    let p = s
        .update(routes, "r1", obj(json!({"paths": ["/p"]})), None)
        .await
        .unwrap();
    assert_eq!(p["paths"], json!(["/p"]));
    assert_eq!(p["service"]["id"], sid);
    let put = s
        .upsert(
            routes,
            r["id"].as_str().unwrap(),
            obj(json!({"name": "r1", "hosts": ["h"]})),
            None,
        )
        .await
        .unwrap();
    assert_eq!(put["created_at"], r["created_at"]);
    assert!(put["service"].is_null() || put.get("service").is_none());

    // Tags: AND / OR filters, paging with an opaque offset.
    for i in 0..5 {
        s.insert(services, obj(json!({"name": format!("s{i}"), "host": "h", "tags": if i % 2 == 0 { json!(["even", "t1"]) } else { json!(["odd"]) }})), None).await.unwrap();
    }
    let q = ListQuery::parse("tags=even,t1").unwrap();
    assert_eq!(s.list(services, &q).await.unwrap().data.len(), 3);
    let q = ListQuery::parse("tags=odd/t2").unwrap();
    assert_eq!(s.list(services, &q).await.unwrap().data.len(), 3);
    let mut q = ListQuery::parse("size=2").unwrap();
    let mut seen = Vec::new();
    loop {
        let page = s.list(services, &q).await.unwrap();
        seen.extend(
            page.data
                .iter()
                .map(|v| v["name"].as_str().unwrap().to_string()),
        );
        match page.offset {
            Some(o) => q.offset = Some(o),
            None => break,
        }
    }
    assert_eq!(seen.len(), 6);
    assert!(matches!(
        s.list(
            services,
            &ListQuery {
                offset: Some("!!".into()),
                size: 10,
                ..Default::default()
            }
        )
        .await,
        Err(StoreError::InvalidOffset(_))
    ));

    // Credentials cascade with their consumer.
    let c = s
        .insert(consumers, obj(json!({"username": "alice"})), None)
        .await
        .unwrap();
    let cid = c["id"].as_str().unwrap().to_string();
    let k = s
        .insert(
            keys,
            obj(json!({"key": "secret-1"})),
            Some(("consumer".into(), cid.clone())),
        )
        .await
        .unwrap();
    assert_eq!(k["consumer"]["id"], cid);
    assert_eq!(
        s.get(keys, "secret-1").await.unwrap().unwrap()["id"],
        k["id"]
    );
    s.delete(consumers, "alice", None).await.unwrap();
    assert!(s.get(keys, "secret-1").await.unwrap().is_none());

    // The export loads as a declarative config.
    let (version, export) = s.export().await.unwrap();
    assert!(version > 0);
    let cfg = declarative::load(&export, &plugins()).unwrap();
    assert_eq!(cfg.services.len(), 6);
    assert_eq!(cfg.routes.len(), 1);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn import_round_trips() {
    let (s, dir) = store().await;
    let cfg = declarative::load_str(
        "_format_version: '3.0'\nservices:\n- name: a\n  url: http://h:1\n  routes:\n  - name: ra\n    paths: [/a]\nconsumers:\n- username: u\n  keyauth_credentials:\n  - key: k1\nupstreams:\n- name: up\n  targets:\n  - target: 10.0.0.1:80\n",
        &plugins(),
    )
    .unwrap();
    assert_eq!(s.import(&cfg).await.unwrap(), 6);
    let (_, export) = s.export().await.unwrap();
    let back = declarative::load(&export, &plugins()).unwrap();
    assert_eq!(back.routes[0].id, cfg.routes[0].id);
    assert_eq!(back.credentials.len(), 1);
    assert_eq!(back.targets[0].target, "10.0.0.1:80");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn change_log_names_every_touched_row() {
    let (s, dir) = store().await;
    let services = by_table("services").unwrap();
    let consumers = by_table("consumers").unwrap();
    let keys = by_table("keyauth_credentials").unwrap();
    let v0 = s.config_version().await.unwrap();
    let svc = s
        .insert(services, obj(json!({"name": "a", "host": "h"})), None)
        .await
        .unwrap();
    let c = s
        .insert(consumers, obj(json!({"username": "u"})), None)
        .await
        .unwrap();
    let cid = c["id"].as_str().unwrap().to_string();
    let k = s
        .insert(
            keys,
            obj(json!({"key": "k"})),
            Some(("consumer".into(), cid.clone())),
        )
        .await
        .unwrap();
    let (v1, delta) = s.changes_since(v0).await.unwrap().unwrap();
    assert_eq!(v1, v0 + 3);
    assert_eq!(delta.len(), 3);
    assert!(delta.iter().all(|(_, _, e)| e.is_some()));
    // A failed write leaves no version and no change behind.
    assert!(s
        .insert(services, obj(json!({"name": "a", "host": "h"})), None)
        .await
        .is_err());
    assert_eq!(s.config_version().await.unwrap(), v1);
    // A cascade lists the children it removed.
    s.delete(consumers, "u", None).await.unwrap();
    let (v2, delta) = s.changes_since(v1).await.unwrap().unwrap();
    assert_eq!(v2, v1 + 1);
    let mut gone: Vec<&str> = delta
        .iter()
        .filter(|(_, _, e)| e.is_none())
        .map(|(_, id, _)| id.as_str())
        .collect();
    gone.sort();
    let mut want = vec![cid.as_str(), k["id"].as_str().unwrap()];
    want.sort();
    assert_eq!(gone, want);
    assert_eq!(s.changes_since(v2).await.unwrap().unwrap().1.len(), 0);
    let _ = svc;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_are_exact_under_concurrency() {
    let (s, dir) = store().await;
    let s = Arc::new(s);
    let window = |period: &'static str, limit: i64| turnpike_store::CounterWindow {
        route_id: "r".into(),
        service_id: "s".into(),
        identifier: "1.2.3.4".into(),
        period,
        period_date: 1000,
        limit,
        expire_at: 2000,
    };
    assert_eq!(
        s.count_request(&[window("minute", 3), window("hour", 5)])
            .await
            .unwrap(),
        vec![0, 1, 1]
    );
    // Blocked by the tighter window: nothing is counted.
    assert_eq!(
        s.count_request(&[window("minute", 3), window("hour", 1)])
            .await
            .unwrap()[0],
        2
    );
    assert_eq!(
        s.count_request(&[window("minute", 3), window("hour", 5)])
            .await
            .unwrap(),
        vec![0, 2, 2]
    );
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            s.count_request(&[window("day", 20)]).await.unwrap()[0] == 0
        }));
    }
    let mut allowed = 0;
    for t in tasks {
        if t.await.unwrap() {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 20);
    assert_eq!(s.purge_counters(1999).await.unwrap(), 0);
    assert_eq!(s.purge_counters(2001).await.unwrap(), 3);
    let _ = std::fs::remove_dir_all(dir);
}

/// The export lists each table's rows in id order (Kong's paging order, and the router's last
/// tie-break on a database node), whatever order they were written in: SQLite's rows are read
/// in rowid order and sorted by id as bytes, as `ORDER BY id` would.
#[tokio::test]
async fn export_lists_rows_in_id_order() {
    let (s, dir) = store().await;
    let services = by_table("services").unwrap();
    let ids = [
        "f0000000-0000-4000-8000-000000000000",
        "00000000-0000-4000-8000-000000000009",
        "a0000000-0000-4000-8000-000000000000",
        "0a000000-0000-4000-8000-000000000000",
        "00000000-0000-4000-8000-00000000000a",
    ];
    for (i, id) in ids.iter().enumerate() {
        s.insert(
            services,
            obj(json!({"id": id, "name": format!("s{i}"), "host": "h"})),
            None,
        )
        .await
        .unwrap();
    }
    let (_, export) = s.export().await.unwrap();
    let got: Vec<&str> = export["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["id"].as_str().unwrap())
        .collect();
    let mut want = ids.to_vec();
    want.sort();
    assert_eq!(got, want);
    let _ = std::fs::remove_dir_all(dir);
}

/// A config sync does not read the tables the data plane reads by key: their rows are
/// neither read nor held at a start (100k key-auth keys were read and dropped).
#[tokio::test]
async fn export_skips_the_tables_read_by_key() {
    let (s, dir) = store().await;
    let consumers = by_table("consumers").unwrap();
    let keys = by_table("keyauth_credentials").unwrap();
    let c = s
        .insert(consumers, obj(json!({"username": "alice"})), None)
        .await
        .unwrap();
    s.insert(
        keys,
        obj(json!({"key": "k1", "consumer": {"id": c["id"]}})),
        None,
    )
    .await
    .unwrap();
    let rows = |raw: &Vec<(&str, Vec<String>)>, t: &str| {
        raw.iter()
            .find(|(table, _)| *table == t)
            .map(|(_, r)| r.len())
    };
    let (_, all) = s.export_raw(&[]).await.unwrap();
    assert_eq!(rows(&all, "keyauth_credentials"), Some(1));
    let (_, some) = s.export_raw(&["keyauth_credentials"]).await.unwrap();
    assert_eq!(rows(&some, "keyauth_credentials"), None);
    assert_eq!(rows(&some, "consumers"), Some(1));
    let _ = std::fs::remove_dir_all(dir);
}

/// SQLite's rows are read a batch at a time (1,000 joined into one text): every row comes back
/// once, in id order, across batches and gaps left by deletes, its text whole (a string
/// holding the batches' separator, U+001E, included).
#[tokio::test]
async fn export_reads_sqlite_rows_in_batches() {
    let (s, dir) = store().await;
    let consumers = by_table("consumers").unwrap();
    let mut ids = Vec::new();
    for i in 0..2_345u32 {
        // Ids out of insertion (rowid) order.
        let id = format!(
            "{:08x}-0000-4000-8000-000000000000",
            i.wrapping_mul(2_654_435_761)
        );
        let name = if i == 7 {
            "sep\u{1e}arated".to_string()
        } else {
            format!("u{i}")
        };
        s.insert(consumers, obj(json!({"id": id, "username": name})), None)
            .await
            .unwrap();
        ids.push(id);
    }
    for id in ids.iter().step_by(3).take(400) {
        s.delete(consumers, id, None).await.unwrap();
    }
    let deleted: std::collections::HashSet<&String> = ids.iter().step_by(3).take(400).collect();
    let (_, export) = s.export().await.unwrap();
    let rows = export["consumers"].as_array().unwrap();
    let got: Vec<&str> = rows.iter().map(|v| v["id"].as_str().unwrap()).collect();
    let mut want: Vec<&str> = ids
        .iter()
        .filter(|i| !deleted.contains(i))
        .map(|s| s.as_str())
        .collect();
    want.sort();
    assert_eq!(got, want);
    assert!(rows.iter().any(|v| v["username"] == "sep\u{1e}arated"));
    let _ = std::fs::remove_dir_all(dir);
}
