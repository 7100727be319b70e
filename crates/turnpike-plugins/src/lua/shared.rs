//! `ngx.shared.<name>`: OpenResty's shared dictionaries (`lua_shared_dict`), one per name the
//! node declares (Kong's own and `nginx_http_lua_shared_dict`), shared by every worker thread
//! of the node and bounded by its size: keys with strings, numbers or booleans, an expiry per
//! key, `get`, `get_stale`, `set`, `safe_set`, `add`, `safe_add`, `replace`, `delete`, `incr`,
//! `ttl`, `expire`, `get_keys`, `flush_all`, `flush_expired`, `capacity`, `free_space`.
//!
//! Full, a `set` evicts the oldest keys written (nginx's shm evicts the least recently used;
//! `safe_set` and `add` fail with "no memory" instead, as nginx's do).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mlua::{Lua, Table, Value};

/// What a key holds.
#[derive(Clone, Debug, PartialEq)]
enum Held {
    Str(Vec<u8>),
    Num(f64),
    Bool(bool),
}

impl Held {
    fn size(&self) -> u64 {
        match self {
            Held::Str(s) => s.len() as u64,
            Held::Num(_) | Held::Bool(_) => 8,
        }
    }
}

struct Entry {
    held: Held,
    expires: Option<Instant>,
    /// When it was written, for eviction (oldest first).
    written: u64,
}

/// Per-entry overhead counted against the dictionary's size (nginx's node and slab).
const OVERHEAD: u64 = 64;

struct Dict {
    capacity: u64,
    used: u64,
    entries: HashMap<Vec<u8>, Entry>,
    by_age: BTreeMap<u64, Vec<u8>>,
    clock: u64,
}

impl Dict {
    fn cost(key: &[u8], held: &Held) -> u64 {
        key.len() as u64 + held.size() + OVERHEAD
    }

    fn live(&self, key: &[u8], now: Instant) -> Option<&Entry> {
        self.entries
            .get(key)
            .filter(|e| e.expires.is_none_or(|t| t > now))
    }

    fn remove(&mut self, key: &[u8]) {
        if let Some(e) = self.entries.remove(key) {
            self.used -= Self::cost(key, &e.held);
            self.by_age.remove(&e.written);
        }
    }

    /// Writes `key`; `evict`: make room by dropping the oldest keys (else fail when full).
    fn put(&mut self, key: &[u8], held: Held, ttl: Option<Duration>, evict: bool) -> bool {
        self.remove(key);
        let cost = Self::cost(key, &held);
        if cost > self.capacity {
            return false;
        }
        while self.used + cost > self.capacity {
            if !evict {
                return false;
            }
            let Some((_, oldest)) = self.by_age.pop_first() else {
                return false;
            };
            if let Some(e) = self.entries.remove(&oldest) {
                self.used -= Self::cost(&oldest, &e.held);
            }
        }
        self.clock += 1;
        self.by_age.insert(self.clock, key.to_vec());
        self.entries.insert(
            key.to_vec(),
            Entry {
                held,
                expires: ttl.map(|t| Instant::now() + t),
                written: self.clock,
            },
        );
        self.used += cost;
        true
    }
}

/// The node's shared dictionaries, by name.
#[derive(Default)]
pub struct SharedDicts {
    dicts: HashMap<String, Arc<Mutex<Dict>>>,
}

impl SharedDicts {
    /// Dictionaries of these names and sizes (bytes).
    pub fn new(declared: impl IntoIterator<Item = (String, u64)>) -> SharedDicts {
        let dicts = declared
            .into_iter()
            .map(|(name, capacity)| {
                let d = Dict {
                    capacity,
                    used: 0,
                    entries: HashMap::new(),
                    by_age: BTreeMap::new(),
                    clock: 0,
                };
                (name, Arc::new(Mutex::new(d)))
            })
            .collect();
        SharedDicts { dicts }
    }
}

impl std::fmt::Debug for SharedDicts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.dicts.keys()).finish()
    }
}

/// An expiry in seconds as OpenResty takes it: 0 or none for never.
fn ttl_of(exptime: Option<f64>) -> Option<Duration> {
    exptime
        .filter(|t| *t > 0.0)
        .map(|t| Duration::from_secs_f64(t.min(1e9)))
}

fn held_of(v: &Value) -> mlua::Result<Option<Held>> {
    Ok(match v {
        Value::Nil => None,
        Value::String(s) => Some(Held::Str(s.as_bytes().to_vec())),
        Value::Integer(n) => Some(Held::Num(*n as f64)),
        Value::Number(n) => Some(Held::Num(*n)),
        Value::Boolean(b) => Some(Held::Bool(*b)),
        _ => return Err(mlua::Error::runtime("bad value type")),
    })
}

fn to_lua(lua: &Lua, h: &Held) -> mlua::Result<Value> {
    Ok(match h {
        Held::Str(s) => Value::String(lua.create_string(s)?),
        Held::Num(n) if n.fract() == 0.0 && n.abs() < 9.0e15 => Value::Integer(*n as i64),
        Held::Num(n) => Value::Number(*n),
        Held::Bool(b) => Value::Boolean(*b),
    })
}

fn err(lua: &Lua, msg: &str) -> mlua::Result<(Value, Value)> {
    Ok((Value::Nil, Value::String(lua.create_string(msg)?)))
}

/// A write's answer: `value` when it was stored, else nginx's "no memory".
fn stored(lua: &Lua, ok: bool, value: Value) -> mlua::Result<(Value, Value)> {
    if ok {
        Ok((value, Value::Nil))
    } else {
        err(lua, "no memory")
    }
}

/// `ngx.shared`: a table of the node's dictionaries by name.
pub(super) fn table(lua: &Lua, dicts: &SharedDicts) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    for (name, d) in &dicts.dicts {
        t.set(name.as_str(), dict(lua, d.clone())?)?;
    }
    Ok(t)
}

type Shared = Arc<Mutex<Dict>>;

fn lock(d: &Shared) -> std::sync::MutexGuard<'_, Dict> {
    d.lock().unwrap_or_else(|p| p.into_inner())
}

/// One dictionary's methods (called as `dict:get(key)`: the first argument is the table).
fn dict(lua: &Lua, d: Shared) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    let f = |d: &Shared| d.clone();

    let s = f(&d);
    t.set(
        "get",
        lua.create_function(move |lua, (_, key): (Value, mlua::LuaString)| {
            let dict = lock(&s);
            match dict.live(&key.as_bytes(), Instant::now()) {
                Some(e) => Ok((to_lua(lua, &e.held)?, Value::Nil)),
                None => Ok((Value::Nil, Value::Nil)),
            }
        })?,
    )?;
    let s = f(&d);
    t.set(
        "get_stale",
        lua.create_function(move |lua, (_, key): (Value, mlua::LuaString)| {
            let dict = lock(&s);
            match dict.entries.get(&*key.as_bytes()) {
                Some(e) => {
                    let stale = e.expires.is_some_and(|t| t <= Instant::now());
                    Ok((to_lua(lua, &e.held)?, Value::Nil, Value::Boolean(stale)))
                }
                None => Ok((Value::Nil, Value::Nil, Value::Boolean(false))),
            }
        })?,
    )?;
    // set / safe_set / add / safe_add / replace.
    for (name, mode) in [
        ("set", 0u8),
        ("safe_set", 1),
        ("add", 2),
        ("safe_add", 3),
        ("replace", 4),
    ] {
        let s = f(&d);
        t.set(
            name,
            lua.create_function(
                move |lua, (_, key, value, exptime): (Value, mlua::LuaString, Value, Option<f64>)| {
                    let key = key.as_bytes().to_vec();
                    let mut dict = lock(&s);
                    let Some(held) = held_of(&value)? else {
                        // nil: a delete (set) or nothing to add.
                        dict.remove(&key);
                        return Ok((Value::Boolean(true), Value::Nil));
                    };
                    let exists = dict.live(&key, Instant::now()).is_some();
                    if (mode == 2 || mode == 3) && exists {
                        return err(lua, "exists");
                    }
                    if mode == 4 && !exists {
                        return err(lua, "not found");
                    }
                    let evict = matches!(mode, 0 | 2 | 4);
                    let ok = dict.put(&key, held, ttl_of(exptime), evict);
                    stored(lua, ok, Value::Boolean(true))
                },
            )?,
        )?;
    }
    let s = f(&d);
    t.set(
        "delete",
        lua.create_function(move |_, (_, key): (Value, mlua::LuaString)| {
            lock(&s).remove(&key.as_bytes());
            Ok(())
        })?,
    )?;
    let s = f(&d);
    t.set(
        "incr",
        lua.create_function(
            move |lua,
                  (_, key, by, init, init_ttl): (
                Value,
                mlua::LuaString,
                f64,
                Option<f64>,
                Option<f64>,
            )| {
                let key = key.as_bytes().to_vec();
                let mut dict = lock(&s);
                let now = Instant::now();
                let (base, ttl) = match dict.live(&key, now) {
                    Some(Entry {
                        held: Held::Num(n),
                        expires,
                        ..
                    }) => (*n, expires.map(|t| t.saturating_duration_since(now))),
                    Some(_) => return err(lua, "not a number"),
                    None => match init {
                        Some(i) => (i, ttl_of(init_ttl)),
                        None => return err(lua, "not found"),
                    },
                };
                let n = base + by;
                let ok = dict.put(&key, Held::Num(n), ttl, true);
                stored(lua, ok, to_lua(lua, &Held::Num(n))?)
            },
        )?,
    )?;
    let s = f(&d);
    t.set(
        "ttl",
        lua.create_function(move |lua, (_, key): (Value, mlua::LuaString)| {
            let dict = lock(&s);
            let now = Instant::now();
            match dict.live(&key.as_bytes(), now) {
                Some(e) => Ok((
                    Value::Number(
                        e.expires
                            .map_or(0.0, |t| t.saturating_duration_since(now).as_secs_f64()),
                    ),
                    Value::Nil,
                )),
                None => err(lua, "not found"),
            }
        })?,
    )?;
    let s = f(&d);
    t.set(
        "expire",
        lua.create_function(
            move |lua, (_, key, exptime): (Value, mlua::LuaString, Option<f64>)| {
                let mut dict = lock(&s);
                let now = Instant::now();
                if dict.live(&key.as_bytes(), now).is_none() {
                    return err(lua, "not found");
                }
                if let Some(e) = dict.entries.get_mut(&*key.as_bytes()) {
                    e.expires = ttl_of(exptime).map(|t| now + t);
                }
                Ok((Value::Boolean(true), Value::Nil))
            },
        )?,
    )?;
    let s = f(&d);
    t.set(
        "get_keys",
        lua.create_function(move |lua, (_, max): (Value, Option<usize>)| {
            let dict = lock(&s);
            let now = Instant::now();
            let max = match max {
                Some(0) => usize::MAX,
                Some(n) => n,
                None => 1024,
            };
            let keys = lua.create_table()?;
            for (i, k) in dict
                .entries
                .iter()
                .filter(|(_, e)| e.expires.is_none_or(|t| t > now))
                .map(|(k, _)| k)
                .take(max)
                .enumerate()
            {
                keys.set(i + 1, lua.create_string(k)?)?;
            }
            Ok(keys)
        })?,
    )?;
    let s = f(&d);
    t.set(
        "flush_all",
        lua.create_function(move |_, _: Value| {
            let mut dict = lock(&s);
            dict.entries.clear();
            dict.by_age.clear();
            dict.used = 0;
            Ok(())
        })?,
    )?;
    let s = f(&d);
    t.set(
        "flush_expired",
        lua.create_function(move |_, _: mlua::MultiValue| {
            let mut dict = lock(&s);
            let now = Instant::now();
            let gone: Vec<Vec<u8>> = dict
                .entries
                .iter()
                .filter(|(_, e)| e.expires.is_some_and(|t| t <= now))
                .map(|(k, _)| k.clone())
                .collect();
            for k in &gone {
                dict.remove(k);
            }
            Ok(gone.len())
        })?,
    )?;
    let s = f(&d);
    t.set(
        "capacity",
        lua.create_function(move |_, _: Value| Ok(lock(&s).capacity))?,
    )?;
    let s = f(&d);
    t.set(
        "free_space",
        lua.create_function(move |_, _: Value| {
            let dict = lock(&s);
            Ok(dict.capacity - dict.used)
        })?,
    )?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(lua: &Lua, code: &str) -> mlua::Result<Value> {
        lua.load(code).eval()
    }

    #[test]
    fn dictionaries_keep_values_expiries_and_their_bound() {
        let dicts = SharedDicts::new([("d".to_string(), 1000u64)]);
        let lua = Lua::new();
        lua.globals()
            .set("shared", table(&lua, &dicts).unwrap())
            .unwrap();
        let out = run(
            &lua,
            r#"
            local d = shared.d
            assert(d:set("a", "x"))
            assert(d:get("a") == "x")
            assert(select(2, d:add("a", "y")) == "exists")
            assert(select(2, d:replace("nope", 1)) == "not found")
            assert(d:incr("n", 2, 40) == 42)
            assert(d:incr("n", 1) == 43)
            assert(select(2, d:incr("a", 1)) == "not a number")
            assert(select(2, d:incr("missing", 1)) == "not found")
            d:set("t", true, 0.05)
            assert(d:ttl("t") > 0)
            d:delete("a")
            assert(d:get("a") == nil)
            return #d:get_keys(0)
            "#,
        )
        .unwrap();
        assert_eq!(out, Value::Integer(2));
        std::thread::sleep(Duration::from_millis(80));
        let out = run(
            &lua,
            r#"
            local d = shared.d
            local v, _, stale = d:get_stale("t")
            assert(d:get("t") == nil and v == true and stale == true)
            -- Full: set evicts the oldest, safe_set refuses.
            for i = 1, 50 do d:set("k" .. i, string.rep("v", 20)) end
            assert(d:get("k50") and not d:get("k1"))
            assert(d:free_space() >= 0 and d:capacity() == 1000)
            assert(select(2, d:safe_set("big", string.rep("v", 2000))) == "no memory")
            return d:get("n")
            "#,
        )
        .unwrap();
        // The oldest keys went first; the counter was written before them.
        assert_eq!(out, Value::Nil);
        // Shared: another state of the same node sees the same dictionary.
        let other = Lua::new();
        other
            .globals()
            .set("shared", table(&other, &dicts).unwrap())
            .unwrap();
        let v = run(&other, "return shared.d:get('k50')").unwrap();
        assert!(matches!(v, Value::String(_)));
    }
}
