//! The credential cache: ttl expiry, invalidation by row, key, credential and consumer
//! (without a scan, and racing look-ups under way), row ids, and its bound.

use super::*;

#[test]
fn a_credential_with_a_ttl_stops_working_when_it_runs_out() {
    let c: Cache<u32, String> = Cache::new(Arc::default(), "t", "f");
    for (k, left) in [(1u32, 3600u64), (2, 0)] {
        c.entries().insert(
            k,
            Entry {
                value: Some("key".into()),
                fetched: c.now(),
                expires: c.now() + left * 1000,
                credential_id: None,
                consumer_id: None,
                lookup: Arc::from(""),
                row: 0,
            },
        );
    }
    assert!(c.get(&1).is_some());
    assert!(c.get(&2).is_none());
}

#[tokio::test]
async fn a_row_written_is_dropped_by_key_without_a_scan() {
    let store = Arc::new(Store::default());
    let gate = Arc::new(tokio::sync::Semaphore::new(
        tokio::sync::Semaphore::MAX_PERMITS,
    ));
    store.install(
        Arc::new(Held(gate)),
        CacheSettings {
            ttl: None,
            neg_ttl: None,
            max_bytes: 1 << 20,
        },
    );
    let c: Cache<Box<str>, String> = Cache::new(store, "t", "f").indexed_by_row();
    for k in ["tok-1", "tok-0"] {
        c.load(k.into(), k.into(), k, |_| Some("v".to_string()))
            .await;
    }
    assert!(c.get("tok-1").unwrap().value.is_some());
    assert!(c.get("tok-0").unwrap().value.is_none(), "a negative entry");
    // The row changed (say, a new access token): its entry goes, found by its id alone.
    c.invalidate_row::<str>("row-1", None);
    assert!(c.get("tok-1").is_none());
    assert!(c.get("tok-0").is_some(), "others stay");
    // A row written under a key that was a miss: the negative entry goes.
    c.invalidate_row("row-0", Some("tok-0"));
    assert!(c.get("tok-0").is_none());
}

/// A store whose look-ups each take a permit of the gate: `tok-N` finds the row `row-N`,
/// but for `tok-0`, which finds nothing.
struct Held(Arc<tokio::sync::Semaphore>);

impl CredentialSource for Held {
    fn find(&self, _: &'static str, _: &'static str, value: String) -> Lookup {
        let gate = self.0.clone();
        Box::pin(async move {
            gate.acquire().await.unwrap().forget();
            let n = value.strip_prefix("tok-").unwrap_or("0");
            Ok((n != "0").then(|| Found {
                id: format!("row-{n}"),
                fields: Map::new(),
                consumer_id: "c".into(),
                username: None,
                custom_id: None,
            }))
        })
    }
    fn write(&self, _: Write) -> Written {
        Box::pin(async { Ok(None) })
    }
}

/// An entry dropped and then loaded again before the cache's housekeeping (which reports
/// the drop) stays in the index by row: a delete of its row still finds it. (The report
/// used to remove the index's new entry, and a revoked token then kept working.)
#[tokio::test]
async fn an_entry_loaded_again_before_housekeeping_stays_indexed() {
    let store = Arc::new(Store::default());
    store.install(
        Arc::new(Held(Arc::new(tokio::sync::Semaphore::new(100)))),
        CacheSettings {
            ttl: None,
            neg_ttl: None,
            max_bytes: 1 << 20,
        },
    );
    let c: Cache<Box<str>, String> = Cache::new(store, "t", "f").indexed_by_row();
    let load = || {
        c.load("tok-1".into(), "tok-1".into(), "tok-1", |_| {
            Some("v".into())
        })
    };
    load().await;
    // Every entry dropped (an application changed), its report still pending; the token
    // is looked up again meanwhile.
    c.invalidate_all();
    load().await;
    assert!(c.get("tok-1").is_some_and(|e| e.value.is_some()));
    // Its row deleted: the entry goes.
    c.invalidate_row::<str>("row-1", None);
    assert!(c.get("tok-1").is_none());
}

/// A look-up that a write of its row (or of its key) overtakes does not cache its answer,
/// which may predate the write; one that only other rows' writes overtake does.
#[tokio::test]
async fn a_write_overtaking_a_look_up_keeps_its_answer_out_only_for_its_own_row() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let store = Arc::new(Store::default());
    store.install(
        Arc::new(Held(gate.clone())),
        CacheSettings {
            ttl: None,
            neg_ttl: None,
            max_bytes: 1 << 20,
        },
    );
    let c: Cache<Box<str>, String> = Cache::new(store, "t", "f").indexed_by_row();
    type C = Cache<Box<str>, String>;
    // Keys and rows on stripes of their own, so that the cases below do not meet by chance.
    let names = [
        "tok-1", "row-1", "tok-0", "tok-7", "row-7", "tok-9", "row-9",
    ];
    let stripes: std::collections::HashSet<usize> =
        names.iter().map(|n| C::stripe_of(*n)).collect();
    assert_eq!(stripes.len(), names.len(), "pick other names");
    // Starts a look-up of `key`, lets `write` run while it waits, then lets it finish.
    async fn overtaken(c: &C, gate: &tokio::sync::Semaphore, key: &str, write: impl Fn(&C)) {
        let load = c.load(key.into(), key.into(), key, |_| Some("v".into()));
        let mut load = std::pin::pin!(load);
        assert!(futures_poll_once(load.as_mut()).await.is_none());
        write(c);
        gate.add_permits(1);
        load.await;
    }
    // Other rows written meanwhile (a new token, another deleted): cached all the same.
    overtaken(&c, &gate, "tok-1", |c| {
        c.invalidate_row("row-9", Some("tok-9"));
        c.invalidate_row::<str>("row-7", None);
    })
    .await;
    assert!(c.get("tok-1").is_some_and(|e| e.value.is_some()));
    // Its own row deleted meanwhile (a revoked token): not cached.
    overtaken(&c, &gate, "tok-7", |c| {
        c.invalidate_row::<str>("row-7", None)
    })
    .await;
    assert!(c.get("tok-7").is_none());
    // A miss overtaken by the write of its key (the token just created): not cached.
    overtaken(&c, &gate, "tok-0", |c| {
        c.invalidate_row("row-0", Some("tok-0"))
    })
    .await;
    assert!(c.get("tok-0").is_none());
    // Undisturbed, both are cached.
    for k in ["tok-7", "tok-0"] {
        gate.add_permits(1);
        c.load(k.into(), k.into(), k, |_| Some("v".into())).await;
        assert!(c.get(k).is_some(), "{k}");
    }
}

/// Polls a future once: its output if it is ready at once.
async fn futures_poll_once<F: Future + Unpin>(mut f: F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match Pin::new(&mut f).poll(cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        })
    })
    .await
}

/// A UUID in the store's form is kept as its bits, and only that form: any other text
/// (upper case, no hyphens, another length) stays text, so an id has one form and the
/// index by row finds it whichever way it is asked.
#[test]
fn row_ids_keep_uuids_as_bits_and_anything_else_as_text() {
    let id = "0b5c8a3e-5d6f-4a8b-9c0d-00000000002a";
    assert_eq!(
        RowId::new(id),
        RowId::Uuid([0x0b5c_8a3e_5d6f_4a8b, 0x9c0d_0000_0000_002a])
    );
    assert!(RowId::new(id).is(id));
    assert!(!RowId::new(id).is("0b5c8a3e-5d6f-4a8b-9c0d-00000000002b"));
    for other in [
        "0B5C8A3E-5D6F-4A8B-9C0D-00000000002A",
        "0b5c8a3e5d6f4a8b9c0d00000000002a",
        "0b5c8a3e-5d6f-4a8b-9c0d-00000000002a0",
        "0b5c8a3e-5d6f-4a8b-9c0d+00000000002a",
        "0b5c8a3e-5d6f-4a8b-9c0d-0000000000-a",
        "row-1",
    ] {
        assert_eq!(RowId::new(other), RowId::Text(Arc::from(other)), "{other}");
        assert!(RowId::new(other).is(other) && !RowId::new(other).is(id));
    }
    assert_eq!(std::mem::size_of::<Option<RowId>>(), 24);
}

#[test]
fn the_cache_is_bounded() {
    let c: Cache<u32, String> = Cache::new(Arc::default(), "t", "f");
    for k in 0..50_000u32 {
        c.entries().insert(
            k,
            Entry {
                value: Some(String::new()),
                fetched: c.now(),
                expires: u64::MAX,
                credential_id: None,
                consumer_id: None,
                lookup: Arc::from(""),
                row: 0,
            },
        );
    }
    // 16 MiB (the default bound here) at DEFAULT_WEIGHT bytes per found entry.
    let n = c.len();
    assert!(
        n > 0 && n <= (16 << 20) / u64::from(DEFAULT_WEIGHT),
        "{n} entries"
    );
}

#[test]
fn invalidation_by_credential_consumer_and_key() {
    let c: Cache<u32, String> = Cache::new(Arc::default(), "t", "f");
    let put = |k: u32, v: Option<&str>, cred: &str, consumer: &str| {
        c.entries().insert(
            k,
            Entry {
                value: v.map(String::from),
                fetched: c.now(),
                expires: u64::MAX,
                credential_id: Some(RowId::new(cred)),
                consumer_id: Some(Arc::from(consumer)),
                lookup: Arc::from(format!("lookup-{k}")),
                row: 0,
            },
        );
    };
    put(1, Some("a"), "cred-1", "alice");
    put(2, Some("b"), "cred-2", "bob");
    put(3, None, "", "");
    assert_eq!(c.get(&1).unwrap().value.as_deref(), Some("a"));
    c.invalidate("cred-1", None);
    assert!(c.get(&1).is_none() && c.get(&2).is_some());
    c.invalidate("bob", Some("lookup-3"));
    assert!(c.get(&2).is_none() && c.get(&3).is_none());
}
