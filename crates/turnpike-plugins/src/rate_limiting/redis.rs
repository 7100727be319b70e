//! The `redis` policy: counters shared by every node through one Redis server.
//!
//! Exact across nodes with one round trip per request: a Lua script reads every configured
//! window's counter, and only when all of them have room increments them all (setting each
//! key's expiry to its window's end). Redis runs scripts one at a time, so the check and the
//! increment are one atomic step cluster-wide: N nodes never let more than the limit through.
//! Kong increments after the check, in a timer, and overshoots under concurrency.
//!
//! Keys are Kong's (`ratelimit:<route>:<service>:<identifier>:<window start ms>:<period>`,
//! holding a plain count), so Kong and Turnpike nodes migrating side by side share counters.
//!
//! Each worker thread keeps its own multiplexed connection per Redis server (the workers run
//! one runtime each). A failed connection is retried by the next request after a second; in
//! between, requests do not wait on a dead server.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

/// Where the counters live: the plugin's `redis` record.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct RedisTarget {
    pub host: String,
    pub port: u16,
    pub username: Option<String>,
    pub password: Option<String>,
    pub database: i64,
    pub timeout: Duration,
    /// TLS to Redis; `ssl_verify` checks its certificate against the system's roots.
    pub ssl: bool,
    pub ssl_verify: bool,
}

impl RedisTarget {
    pub fn from_config(redis: &super::schema::Redis) -> Result<RedisTarget, String> {
        let host = redis
            .host
            .clone()
            .ok_or("redis.host is required with policy 'redis'")?;
        Ok(RedisTarget {
            host,
            port: redis.port,
            username: redis.username.clone(),
            password: redis.password.clone(),
            database: redis.database,
            timeout: Duration::from_millis(redis.timeout),
            ssl: redis.ssl,
            ssl_verify: redis.ssl_verify,
        })
    }

    fn client(&self) -> redis::RedisResult<redis::Client> {
        let addr = if self.ssl {
            redis::ConnectionAddr::TcpTls {
                host: self.host.clone(),
                port: self.port,
                // Kong's ssl_verify = false: any certificate (as lua-resty-redis does).
                insecure: !self.ssl_verify,
                tls_params: None,
            }
        } else {
            redis::ConnectionAddr::Tcp(self.host.clone(), self.port)
        };
        redis::Client::open(redis::ConnectionInfo {
            addr,
            redis: redis::RedisConnectionInfo {
                db: self.database,
                username: self.username.clone(),
                password: self.password.clone(),
                ..Default::default()
            },
        })
    }
}

/// Checks every window and, when all have room, counts the request in all of them.
/// KEYS: one per window. ARGV: limit and expiry (epoch seconds) per window.
/// Returns `{blocked window (1-based) or 0, count per window...}`: counts after the increment
/// when allowed, as read when blocked.
const SCRIPT: &str = r#"
local counts = {0}
for i, key in ipairs(KEYS) do
  local n = tonumber(redis.call('GET', key) or '0')
  counts[i + 1] = n
  if n + 1 > tonumber(ARGV[2 * i - 1]) then
    counts[1] = i
    return counts
  end
end
for i, key in ipairs(KEYS) do
  counts[i + 1] = redis.call('INCR', key)
  if counts[i + 1] == 1 then
    redis.call('EXPIREAT', key, ARGV[2 * i])
  end
end
return counts
"#;

static SCRIPT_HANDLE: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(SCRIPT));

/// A worker's connection to one Redis server.
#[derive(Default)]
struct Slot {
    conn: Option<redis::aio::MultiplexedConnection>,
    /// No new connection attempt before this (after a failure).
    retry_at: Option<Instant>,
    /// Set while one request connects; the others wait for it rather than give up (giving up
    /// would count them locally and let more than the limit through).
    connecting: Option<Rc<tokio::sync::Notify>>,
}

thread_local! {
    static SLOTS: RefCell<HashMap<Arc<RedisTarget>, Slot>> = RefCell::new(HashMap::new());
}

/// How long a worker waits before trying a failed server again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

async fn connection(
    target: &Arc<RedisTarget>,
) -> Result<redis::aio::MultiplexedConnection, String> {
    enum State {
        Ready(redis::aio::MultiplexedConnection),
        Wait(Rc<tokio::sync::Notify>),
        Connect(Rc<tokio::sync::Notify>),
    }
    loop {
        let now = Instant::now();
        let state = SLOTS.with_borrow_mut(|slots| {
            let slot = slots.entry(target.clone()).or_default();
            if let Some(c) = &slot.conn {
                return Ok(State::Ready(c.clone()));
            }
            if let Some(n) = &slot.connecting {
                return Ok(State::Wait(n.clone()));
            }
            if slot.retry_at.is_some_and(|t| now < t) {
                return Err("not connected (retrying in a moment)".to_string());
            }
            let n = Rc::new(tokio::sync::Notify::new());
            slot.connecting = Some(n.clone());
            Ok(State::Connect(n))
        })?;
        match state {
            State::Ready(c) => return Ok(c),
            State::Wait(n) => n.notified().await,
            State::Connect(n) => {
                let result = connect(target).await;
                n.notify_waiters();
                return result;
            }
        }
    }
}

async fn connect(target: &Arc<RedisTarget>) -> Result<redis::aio::MultiplexedConnection, String> {
    let result = async {
        let client = target.client().map_err(|e| e.to_string())?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(target.timeout)
            .set_response_timeout(target.timeout);
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| e.to_string())
    }
    .await;
    SLOTS.with_borrow_mut(|slots| {
        let slot = slots.entry(target.clone()).or_default();
        slot.connecting = None;
        match &result {
            Ok(c) => slot.conn = Some(c.clone()),
            Err(_) => slot.retry_at = Some(Instant::now() + RETRY_AFTER),
        }
    });
    result
}

fn forget(target: &Arc<RedisTarget>) {
    SLOTS.with_borrow_mut(|slots| {
        if let Some(slot) = slots.get_mut(target) {
            slot.conn = None;
        }
    });
}

/// Runs the counting script: `Ok([blocked window or 0, counts...])`.
/// `down`: whether the last count failed (the node's, in its rate-limiting state): failures
/// are logged when it flips, not per request.
pub async fn count(
    target: &Arc<RedisTarget>,
    keys: &[String],
    args: &[u64],
    down: &AtomicBool,
) -> Result<Vec<i64>, String> {
    let mut invocation = SCRIPT_HANDLE.prepare_invoke();
    for k in keys {
        invocation.key(k);
    }
    for a in args {
        invocation.arg(*a);
    }
    let result = async {
        // A kept connection may have died with a Redis restart since its last use: one retry
        // on a new connection, so the restart costs no request. Not after a timeout: that
        // would double the wait on a server that hangs.
        for attempt in 0..2 {
            let mut conn = connection(target).await?;
            match tokio::time::timeout(
                target.timeout,
                invocation.invoke_async::<Vec<i64>>(&mut conn),
            )
            .await
            {
                Ok(Ok(v)) if super::answer_is_complete(&v, keys.len()) => return Ok(v),
                Ok(Ok(v)) => return Err(format!("unexpected script answer {v:?}")),
                Ok(Err(e)) => {
                    forget(target);
                    if attempt == 1 || !(e.is_io_error() || e.is_connection_dropped()) {
                        return Err(e.to_string());
                    }
                }
                Err(_) => {
                    forget(target);
                    return Err(format!("timed out after {:?}", target.timeout));
                }
            }
        }
        Err("unreachable".to_string())
    }
    .await;
    match &result {
        Ok(_) => {
            if down.swap(false, Ordering::Relaxed) {
                tracing::warn!(
                    "rate-limiting: redis at {}:{} answers again; counting there",
                    target.host,
                    target.port
                );
            }
        }
        Err(e) => {
            if !down.swap(true, Ordering::Relaxed) {
                tracing::error!(
                    "rate-limiting: redis at {}:{} failed ({e}); until it answers, fault_tolerant \
                     configs count on each node and others answer 500",
                    target.host,
                    target.port
                );
            }
        }
    }
    result
}

/// Adds `n` to a counter and returns its new total (the batched policy's push): INCRBY and
/// EXPIREAT in one round trip.
pub async fn add(
    target: &Arc<RedisTarget>,
    key: &str,
    n: u64,
    expire_at: u64,
) -> Result<i64, String> {
    let mut conn = connection(target).await?;
    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("INCRBY")
        .arg(key)
        .arg(n)
        .cmd("EXPIREAT")
        .arg(key)
        .arg(expire_at)
        .ignore();
    match tokio::time::timeout(target.timeout, pipe.query_async::<(i64,)>(&mut conn)).await {
        Ok(Ok((total,))) => Ok(total),
        Ok(Err(e)) => {
            forget(target);
            Err(e.to_string())
        }
        Err(_) => {
            forget(target);
            Err(format!("timed out after {:?}", target.timeout))
        }
    }
}

/// The counters under `keys` (absent ones 0), in one round trip (response-ratelimiting's
/// usage read).
pub async fn get_many(target: &Arc<RedisTarget>, keys: &[String]) -> Result<Vec<i64>, String> {
    let mut conn = connection(target).await?;
    let mut cmd = redis::cmd("MGET");
    for k in keys {
        cmd.arg(k);
    }
    match tokio::time::timeout(
        target.timeout,
        cmd.query_async::<Vec<Option<i64>>>(&mut conn),
    )
    .await
    {
        Ok(Ok(v)) => Ok(v.into_iter().map(|x| x.unwrap_or(0)).collect()),
        Ok(Err(e)) => {
            forget(target);
            Err(e.to_string())
        }
        Err(_) => {
            forget(target);
            Err(format!("timed out after {:?}", target.timeout))
        }
    }
}
