//! Kong's MessagePack RPC to a plugin server (`kong/runloop/plugin_servers/rpc/mp_rpc.lua`),
//! the protocol of the Python and JavaScript PDKs: a request `[0, id, method, [args]]`, an
//! answer `[1, id, error, result]`, notifications `[2, label, args]` read and passed over.
//! Connections to a server's Unix socket are kept per worker thread and reused, as Kong keeps
//! them in its cosocket pool.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// Kong's cosocket default: a call that takes longer is an error.
const TIMEOUT: Duration = Duration::from_secs(60);
/// Idle connections kept per server and worker.
const POOL: usize = 32;

thread_local! {
    /// This worker's idle connections, by socket.
    static IDLE: RefCell<HashMap<PathBuf, Vec<Conn>>> = RefCell::new(HashMap::new());
    static NEXT_ID: Cell<u32> = const { Cell::new(0) };
}

struct Conn {
    stream: UnixStream,
    /// Bytes read past the last answer.
    buf: Vec<u8>,
}

/// Calls `method` with one argument and returns its result, or the server's error.
pub async fn call(socket: &Path, method: &str, arg: rmpv::Value) -> Result<rmpv::Value, String> {
    match tokio::time::timeout(TIMEOUT, call_inner(socket, method, arg)).await {
        Ok(r) => r,
        Err(_) => Err(format!("{method}: timeout")),
    }
}

async fn call_inner(socket: &Path, method: &str, arg: rmpv::Value) -> Result<rmpv::Value, String> {
    let id = NEXT_ID.with(|n| {
        let id = n.get().wrapping_add(1);
        n.set(id);
        id
    });
    let msg = rmpv::Value::Array(vec![
        0.into(),
        id.into(),
        method.into(),
        rmpv::Value::Array(vec![arg]),
    ]);
    let mut bytes = Vec::with_capacity(128);
    rmpv::encode::write_value(&mut bytes, &msg).map_err(|e| e.to_string())?;
    // A pooled connection the server closed meanwhile fails on write or read: then once more
    // on a new one.
    let pooled = IDLE.with_borrow_mut(|idle| idle.get_mut(socket).and_then(Vec::pop));
    let mut conn = match pooled {
        Some(mut c) => match exchange(&mut c, &bytes, id).await {
            Ok(v) => return finish(socket, c, v),
            Err(_) => connect(socket).await?,
        },
        None => connect(socket).await?,
    };
    let v = exchange(&mut conn, &bytes, id).await?;
    finish(socket, conn, v)
}

async fn connect(socket: &Path) -> Result<Conn, String> {
    let stream = UnixStream::connect(socket)
        .await
        .map_err(|e| format!("trying to connect: {e} ({})", socket.display()))?;
    Ok(Conn {
        stream,
        buf: Vec::new(),
    })
}

/// Pools the connection, and turns the answer into its result or error.
fn finish(
    socket: &Path,
    conn: Conn,
    answer: (rmpv::Value, rmpv::Value),
) -> Result<rmpv::Value, String> {
    IDLE.with_borrow_mut(|idle| {
        let list = idle.entry(socket.to_path_buf()).or_default();
        if list.len() < POOL {
            list.push(conn);
        }
    });
    let (error, result) = answer;
    match error {
        rmpv::Value::Nil => Ok(result),
        rmpv::Value::String(s) => Err(s.into_str().unwrap_or_default()),
        other => Err(other.to_string()),
    }
}

/// Writes a request and reads values until the answer to `id`: its (error, result).
async fn exchange(
    conn: &mut Conn,
    request: &[u8],
    id: u32,
) -> Result<(rmpv::Value, rmpv::Value), String> {
    conn.stream
        .write_all(request)
        .await
        .map_err(|e| e.to_string())?;
    loop {
        let value = read_value(conn).await?;
        let rmpv::Value::Array(mut parts) = value else {
            return Err("RPC answer is not an array".into());
        };
        match parts.first().and_then(rmpv::Value::as_u64) {
            Some(2) => continue, // a notification
            Some(1) if parts.len() == 4 => {
                if parts[1].as_u64() != Some(id as u64) {
                    return Err("unexpected RPC response ID from the plugin server".into());
                }
                let result = parts.pop().unwrap_or(rmpv::Value::Nil);
                let error = parts.pop().unwrap_or(rmpv::Value::Nil);
                return Ok((error, result));
            }
            _ => return Err("RPC response expected from the plugin server".into()),
        }
    }
}

/// Reads one whole MessagePack value.
async fn read_value(conn: &mut Conn) -> Result<rmpv::Value, String> {
    loop {
        if !conn.buf.is_empty() {
            let mut cursor = std::io::Cursor::new(&conn.buf[..]);
            match rmpv::decode::read_value(&mut cursor) {
                Ok(v) => {
                    let used = cursor.position() as usize;
                    conn.buf.drain(..used);
                    return Ok(v);
                }
                Err(e) if is_short(&e) => {}
                Err(e) => return Err(format!("bad MessagePack from the plugin server: {e}")),
            }
        }
        let mut chunk = [0u8; 4096];
        let n = conn
            .stream
            .read(&mut chunk)
            .await
            .map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("no data".into());
        }
        conn.buf.extend_from_slice(&chunk[..n]);
    }
}

/// The value is not all there yet.
fn is_short(e: &rmpv::decode::Error) -> bool {
    match e {
        rmpv::decode::Error::InvalidMarkerRead(io) | rmpv::decode::Error::InvalidDataRead(io) => {
            io.kind() == std::io::ErrorKind::UnexpectedEof
        }
        _ => false,
    }
}

/// A map of string keys, as the PDK's messages are.
pub fn map(entries: Vec<(&str, rmpv::Value)>) -> rmpv::Value {
    rmpv::Value::Map(entries.into_iter().map(|(k, v)| (k.into(), v)).collect())
}

/// The field `key` of a map.
pub fn field<'a>(v: &'a rmpv::Value, key: &str) -> Option<&'a rmpv::Value> {
    v.as_map()?
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
}
