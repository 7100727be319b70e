//! Kong's ProtoBuf protocol to a plugin server (`ProtoBuf:1`, the Go PDK's embedded server;
//! Kong's `pb_rpc.lua`): frames of a 32-bit little-endian length and a message. A command is
//! an `RpcCall`, answered by an `RpcReturn`; during `cmd_handle_event`, before its answer,
//! the server sends PDK calls on the same connection (a frame with the method's name, one with
//! its argument message) and reads each answer (one frame), until an empty name ends them.
//!
//! Each PDK method has an argument and an answer type (Kong's `service Kong` in its
//! `pluginsocket.proto`); here they turn into and from the arguments and result of the same
//! PDK call the MessagePack servers make (`crate::lua::call_pdk`), as Kong's `pb_unwrap` and
//! `pb_wrap` turn them into Lua values.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use prost::Message;
use prost_types::value::Kind;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

/// A connection to a server, its reads buffered (a PDK call is two frames, each a length and
/// a message: unbuffered, four reads).
type Stream = BufReader<UnixStream>;

/// Kong's cosocket default.
const TIMEOUT: Duration = Duration::from_secs(60);
const POOL: usize = 32;
/// No message of the protocol comes near this; a larger length is a broken stream.
const MAX_FRAME: u32 = 64 << 20;

thread_local! {
    static IDLE: RefCell<HashMap<PathBuf, Vec<Stream>>> = RefCell::new(HashMap::new());
}

// The protocol's messages (field numbers as in Kong's `pluginsocket.proto`).

#[derive(Clone, PartialEq, Message)]
struct RpcCall {
    #[prost(int64, tag = "1")]
    sequence: i64,
    #[prost(oneof = "Call", tags = "33, 35, 36")]
    call: Option<Call>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Call {
    #[prost(message, tag = "33")]
    StartInstance(CmdStartInstance),
    #[prost(message, tag = "35")]
    CloseInstance(CmdInstance),
    #[prost(message, tag = "36")]
    HandleEvent(CmdHandleEvent),
}

#[derive(Clone, PartialEq, Message)]
struct CmdStartInstance {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(bytes = "vec", tag = "2")]
    config: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
struct CmdInstance {
    #[prost(int32, tag = "1")]
    instance_id: i32,
}

#[derive(Clone, PartialEq, Message)]
struct CmdHandleEvent {
    #[prost(int32, tag = "1")]
    instance_id: i32,
    #[prost(string, tag = "2")]
    event_name: String,
}

#[derive(Clone, PartialEq, Message)]
struct RpcReturn {
    #[prost(int64, tag = "1")]
    sequence: i64,
    #[prost(message, optional, tag = "33")]
    instance_status: Option<InstanceStatus>,
}

#[derive(Clone, PartialEq, Message)]
struct InstanceStatus {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(int32, tag = "2")]
    instance_id: i32,
}

#[derive(Clone, PartialEq, Message)]
struct Kv {
    #[prost(string, tag = "1")]
    k: String,
    #[prost(message, optional, tag = "2")]
    v: Option<prost_types::Value>,
}

#[derive(Clone, PartialEq, Message)]
struct BoolV {
    #[prost(bool, tag = "1")]
    v: bool,
}

#[derive(Clone, PartialEq, Message)]
struct IntV {
    #[prost(int32, tag = "1")]
    v: i32,
}

#[derive(Clone, PartialEq, Message)]
struct NumberV {
    #[prost(double, tag = "1")]
    v: f64,
}

#[derive(Clone, PartialEq, Message)]
struct StringV {
    #[prost(string, tag = "1")]
    v: String,
}

#[derive(Clone, PartialEq, Message)]
struct BytesV {
    #[prost(bytes = "vec", tag = "1")]
    v: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
struct ExitArgs {
    #[prost(int32, tag = "1")]
    status: i32,
    #[prost(bytes = "vec", tag = "2")]
    body: Vec<u8>,
    #[prost(message, optional, tag = "3")]
    headers: Option<prost_types::Struct>,
}

#[derive(Clone, PartialEq, Message)]
struct Target {
    #[prost(string, tag = "1")]
    host: String,
    #[prost(int32, tag = "2")]
    port: i32,
}

#[derive(Clone, PartialEq, Message)]
struct ConsumerSpec {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(bool, tag = "2")]
    by_username: bool,
}

#[derive(Clone, PartialEq, Message)]
struct Consumer {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(int64, tag = "2")]
    created_at: i64,
    #[prost(string, tag = "3")]
    username: String,
    #[prost(string, tag = "4")]
    custom_id: String,
    #[prost(string, repeated, tag = "5")]
    tags: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
struct Credential {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(string, tag = "2")]
    consumer_id: String,
}

#[derive(Clone, PartialEq, Message)]
struct AuthenticateArgs {
    #[prost(message, optional, tag = "1")]
    consumer: Option<Consumer>,
    #[prost(message, optional, tag = "2")]
    credential: Option<Credential>,
}

#[derive(Clone, PartialEq, Message)]
struct RawBodyResult {
    #[prost(oneof = "RawBody", tags = "1, 2, 3")]
    kind: Option<RawBody>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum RawBody {
    #[prost(bytes, tag = "1")]
    Content(Vec<u8>),
    #[prost(string, tag = "2")]
    BodyFilepath(String),
    #[prost(string, tag = "3")]
    Error(String),
}

#[derive(Clone, PartialEq, Message)]
struct Route {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(int64, tag = "2")]
    created_at: i64,
    #[prost(int64, tag = "3")]
    updated_at: i64,
    #[prost(string, tag = "4")]
    name: String,
    #[prost(string, repeated, tag = "5")]
    protocols: Vec<String>,
    #[prost(string, repeated, tag = "6")]
    methods: Vec<String>,
    #[prost(string, repeated, tag = "7")]
    hosts: Vec<String>,
    #[prost(string, repeated, tag = "8")]
    paths: Vec<String>,
    #[prost(int32, tag = "10")]
    https_redirect_status_code: i32,
    #[prost(int32, tag = "11")]
    regex_priority: i32,
    #[prost(bool, tag = "12")]
    strip_path: bool,
    #[prost(bool, tag = "13")]
    preserve_host: bool,
    #[prost(string, repeated, tag = "17")]
    tags: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
struct Service {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(int64, tag = "2")]
    created_at: i64,
    #[prost(int64, tag = "3")]
    updated_at: i64,
    #[prost(string, tag = "4")]
    name: String,
    #[prost(int32, tag = "5")]
    retries: i32,
    #[prost(string, tag = "6")]
    protocol: String,
    #[prost(string, tag = "7")]
    host: String,
    #[prost(int32, tag = "8")]
    port: i32,
    #[prost(string, tag = "9")]
    path: String,
    #[prost(int32, tag = "10")]
    connect_timeout: i32,
    #[prost(int32, tag = "11")]
    write_timeout: i32,
    #[prost(int32, tag = "12")]
    read_timeout: i32,
    #[prost(string, repeated, tag = "13")]
    tags: Vec<String>,
}

/// A PDK method's argument message.
#[derive(Debug, Clone, Copy, PartialEq)]
enum In {
    Empty,
    String,
    Int,
    Bool,
    Kv,
    List,
    Struct,
    Bytes,
    Exit,
    Target,
    ConsumerSpec,
    Authenticate,
}

/// A PDK method's answer message.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Out {
    Empty,
    String,
    Int,
    Number,
    Bool,
    Value,
    Struct,
    RawBody,
    Bytes,
    Consumer,
    Credential,
    Route,
    Service,
}

/// The types of the PDK methods Kong's protocol has (`service Kong`).
fn signature(method: &str) -> Option<(In, Out)> {
    use In as I;
    use Out as O;
    Some(match method {
        "kong.client.get_ip" | "kong.client.get_forwarded_ip" => (I::Empty, O::String),
        "kong.client.get_port" | "kong.client.get_forwarded_port" => (I::Empty, O::Int),
        "kong.client.get_credential" => (I::Empty, O::Credential),
        "kong.client.load_consumer" => (I::ConsumerSpec, O::Consumer),
        "kong.client.get_consumer" => (I::Empty, O::Consumer),
        "kong.client.authenticate" => (I::Authenticate, O::Empty),
        "kong.client.get_protocol" => (I::Bool, O::String),
        "kong.ctx.shared.set" => (I::Kv, O::Empty),
        "kong.ctx.shared.get" => (I::String, O::Value),
        "kong.ip.is_trusted" => (I::String, O::Bool),
        "kong.log.alert" | "kong.log.crit" | "kong.log.err" | "kong.log.warn"
        | "kong.log.notice" | "kong.log.info" | "kong.log.debug" => (I::List, O::Empty),
        "kong.log.set_serialize_value" => (I::Kv, O::Empty),
        "kong.log.serialize" => (I::Empty, O::String),
        "kong.nginx.get_var" => (I::String, O::String),
        "kong.nginx.get_tls1_version_str" | "kong.nginx.get_subsystem" => (I::Empty, O::String),
        "kong.nginx.set_ctx" => (I::Kv, O::String),
        "kong.nginx.get_ctx" => (I::String, O::Value),
        "kong.nginx.req_start_time" => (I::Empty, O::Number),
        "kong.node.get_id" => (I::Empty, O::String),
        "kong.request.get_scheme"
        | "kong.request.get_host"
        | "kong.request.get_forwarded_scheme"
        | "kong.request.get_forwarded_host"
        | "kong.request.get_method"
        | "kong.request.get_path"
        | "kong.request.get_path_with_query"
        | "kong.request.get_raw_query" => (I::Empty, O::String),
        "kong.request.get_port" | "kong.request.get_forwarded_port" => (I::Empty, O::Int),
        "kong.request.get_http_version" => (I::Empty, O::Number),
        "kong.request.get_query_arg" | "kong.request.get_header" => (I::String, O::String),
        "kong.request.get_query" | "kong.request.get_headers" => (I::Int, O::Struct),
        "kong.request.get_raw_body" => (I::Empty, O::RawBody),
        "kong.response.get_status" => (I::Empty, O::Int),
        "kong.response.get_header" => (I::String, O::String),
        "kong.response.get_headers" => (I::Int, O::Struct),
        "kong.response.get_source" => (I::Empty, O::String),
        "kong.response.set_status" => (I::Int, O::Empty),
        "kong.response.set_header" | "kong.response.add_header" => (I::Kv, O::Empty),
        "kong.response.clear_header" => (I::String, O::Empty),
        "kong.response.set_headers" => (I::Struct, O::Empty),
        "kong.response.exit" => (I::Exit, O::Empty),
        "kong.router.get_route" => (I::Empty, O::Route),
        "kong.router.get_service" => (I::Empty, O::Service),
        "kong.service.set_upstream" => (I::String, O::Bool),
        "kong.service.set_target" => (I::Target, O::Empty),
        "kong.service.request.set_scheme"
        | "kong.service.request.set_path"
        | "kong.service.request.set_raw_query"
        | "kong.service.request.set_method"
        | "kong.service.request.clear_header" => (I::String, O::Empty),
        "kong.service.request.set_query" | "kong.service.request.set_headers" => {
            (I::Struct, O::Empty)
        }
        "kong.service.request.set_header" | "kong.service.request.add_header" => (I::Kv, O::Empty),
        "kong.service.request.set_raw_body" => (I::Bytes, O::Empty),
        "kong.service.response.get_status" => (I::Empty, O::Int),
        "kong.service.response.get_header" => (I::String, O::String),
        "kong.service.response.get_headers" => (I::Int, O::Struct),
        "kong.service.response.get_raw_body" => (I::Empty, O::Bytes),
        _ => return None,
    })
}

/// A PDK call's argument message as the call's arguments (Kong's `pb_unwrap`).
pub fn arguments(method: &str, data: &[u8]) -> Result<rmpv::Value, String> {
    let (input, _) = signature(method).ok_or_else(|| format!("method \"{method}\" not found"))?;
    let bad = |e: prost::DecodeError| format!("{method}: bad argument: {e}");
    let args: Vec<rmpv::Value> = match input {
        In::Empty => vec![],
        In::String => vec![StringV::decode(data).map_err(bad)?.v.into()],
        In::Int => vec![IntV::decode(data).map_err(bad)?.v.into()],
        In::Bool => vec![BoolV::decode(data).map_err(bad)?.v.into()],
        In::Bytes => vec![rmpv::Value::Binary(BytesV::decode(data).map_err(bad)?.v)],
        In::Kv => {
            let kv = Kv::decode(data).map_err(bad)?;
            vec![
                kv.k.into(),
                kv.v.as_ref().map_or(rmpv::Value::Nil, from_value),
            ]
        }
        In::List => prost_types::ListValue::decode(data)
            .map_err(bad)?
            .values
            .iter()
            .map(from_value)
            .collect(),
        In::Struct => vec![from_struct(
            &prost_types::Struct::decode(data).map_err(bad)?,
        )],
        In::Exit => {
            let e = ExitArgs::decode(data).map_err(bad)?;
            vec![
                e.status.into(),
                rmpv::Value::Binary(e.body),
                e.headers.as_ref().map_or(rmpv::Value::Nil, from_struct),
            ]
        }
        In::Target => {
            let t = Target::decode(data).map_err(bad)?;
            vec![t.host.into(), t.port.into()]
        }
        In::ConsumerSpec => {
            let c = ConsumerSpec::decode(data).map_err(bad)?;
            vec![c.id.into(), c.by_username.into()]
        }
        In::Authenticate => {
            let a = AuthenticateArgs::decode(data).map_err(bad)?;
            let consumer = a.consumer.map_or(rmpv::Value::Nil, |c| {
                map(vec![
                    ("id", c.id.into()),
                    ("username", c.username.into()),
                    ("custom_id", c.custom_id.into()),
                ])
            });
            let credential = a.credential.map_or(rmpv::Value::Nil, |c| {
                map(vec![
                    ("id", c.id.into()),
                    ("consumer_id", c.consumer_id.into()),
                ])
            });
            vec![consumer, credential]
        }
    };
    Ok(rmpv::Value::Array(args))
}

/// A PDK call's result as its answer message (Kong's `pb_wrap`); nothing (an empty frame) for
/// a `nil` result, as Kong sends.
pub fn answer(method: &str, result: &rmpv::Value) -> Vec<u8> {
    let Some((_, out)) = signature(method) else {
        return Vec::new();
    };
    let s = |v: &rmpv::Value| -> String {
        match v {
            rmpv::Value::String(s) => s.as_str().unwrap_or_default().to_string(),
            rmpv::Value::Binary(b) => String::from_utf8_lossy(b).into_owned(),
            rmpv::Value::Nil => String::new(),
            other => other.to_string(),
        }
    };
    if result.is_nil() && out != Out::RawBody {
        return Vec::new();
    }
    let field = |k: &str| {
        crate::pluginserver::rpc::field(result, k)
            .cloned()
            .unwrap_or(rmpv::Value::Nil)
    };
    let strings = |k: &str| -> Vec<String> {
        field(k)
            .as_array()
            .map_or(Vec::new(), |l| l.iter().map(&s).collect())
    };
    let int = |k: &str| field(k).as_i64().unwrap_or(0);
    match out {
        Out::Empty => Vec::new(),
        Out::String => StringV { v: s(result) }.encode_to_vec(),
        Out::Int => IntV {
            v: result
                .as_i64()
                .or_else(|| result.as_f64().map(|f| f as i64))
                .unwrap_or(0) as i32,
        }
        .encode_to_vec(),
        Out::Number => NumberV {
            v: result
                .as_f64()
                .or_else(|| result.as_i64().map(|i| i as f64))
                .unwrap_or(0.0),
        }
        .encode_to_vec(),
        Out::Bool => BoolV {
            v: result.as_bool().unwrap_or(false),
        }
        .encode_to_vec(),
        Out::Value => to_value(result).encode_to_vec(),
        Out::Struct => to_struct(result).encode_to_vec(),
        Out::Bytes => BytesV {
            v: match result {
                rmpv::Value::Binary(b) => b.clone(),
                other => s(other).into_bytes(),
            },
        }
        .encode_to_vec(),
        Out::RawBody => RawBodyResult {
            kind: Some(match result {
                rmpv::Value::Binary(b) => RawBody::Content(b.clone()),
                rmpv::Value::String(t) => RawBody::Content(t.as_bytes().to_vec()),
                _ => RawBody::Error("Can't read request body".into()),
            }),
        }
        .encode_to_vec(),
        Out::Consumer => Consumer {
            id: s(&field("id")),
            created_at: int("created_at"),
            username: s(&field("username")),
            custom_id: s(&field("custom_id")),
            tags: strings("tags"),
        }
        .encode_to_vec(),
        Out::Credential => Credential {
            id: s(&field("id")),
            consumer_id: s(&field("consumer_id")),
        }
        .encode_to_vec(),
        Out::Route => Route {
            id: s(&field("id")),
            created_at: int("created_at"),
            updated_at: int("updated_at"),
            name: s(&field("name")),
            protocols: strings("protocols"),
            methods: strings("methods"),
            hosts: strings("hosts"),
            paths: strings("paths"),
            https_redirect_status_code: int("https_redirect_status_code") as i32,
            regex_priority: int("regex_priority") as i32,
            strip_path: field("strip_path").as_bool().unwrap_or(false),
            preserve_host: field("preserve_host").as_bool().unwrap_or(false),
            tags: strings("tags"),
        }
        .encode_to_vec(),
        Out::Service => Service {
            id: s(&field("id")),
            created_at: int("created_at"),
            updated_at: int("updated_at"),
            name: s(&field("name")),
            retries: int("retries") as i32,
            protocol: s(&field("protocol")),
            host: s(&field("host")),
            port: int("port") as i32,
            path: s(&field("path")),
            connect_timeout: int("connect_timeout") as i32,
            write_timeout: int("write_timeout") as i32,
            read_timeout: int("read_timeout") as i32,
            tags: strings("tags"),
        }
        .encode_to_vec(),
    }
}

fn map(entries: Vec<(&str, rmpv::Value)>) -> rmpv::Value {
    crate::pluginserver::rpc::map(entries)
}

fn from_value(v: &prost_types::Value) -> rmpv::Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => rmpv::Value::Nil,
        Some(Kind::NumberValue(n)) => {
            if n.fract() == 0.0 && n.abs() < 9.0e15 {
                (*n as i64).into()
            } else {
                rmpv::Value::F64(*n)
            }
        }
        Some(Kind::StringValue(s)) => s.as_str().into(),
        Some(Kind::BoolValue(b)) => (*b).into(),
        Some(Kind::StructValue(s)) => from_struct(s),
        Some(Kind::ListValue(l)) => rmpv::Value::Array(l.values.iter().map(from_value).collect()),
    }
}

fn from_struct(s: &prost_types::Struct) -> rmpv::Value {
    rmpv::Value::Map(
        s.fields
            .iter()
            .map(|(k, v)| (k.as_str().into(), from_value(v)))
            .collect(),
    )
}

fn to_value(v: &rmpv::Value) -> prost_types::Value {
    let kind = match v {
        rmpv::Value::Nil => Kind::NullValue(0),
        rmpv::Value::Boolean(b) => Kind::BoolValue(*b),
        rmpv::Value::Integer(i) => Kind::NumberValue(i.as_f64().unwrap_or(0.0)),
        rmpv::Value::F32(f) => Kind::NumberValue(*f as f64),
        rmpv::Value::F64(f) => Kind::NumberValue(*f),
        rmpv::Value::String(s) => Kind::StringValue(s.as_str().unwrap_or_default().to_string()),
        rmpv::Value::Binary(b) => Kind::StringValue(String::from_utf8_lossy(b).into_owned()),
        rmpv::Value::Array(items) => Kind::ListValue(prost_types::ListValue {
            values: items.iter().map(to_value).collect(),
        }),
        rmpv::Value::Map(_) => Kind::StructValue(to_struct(v)),
        rmpv::Value::Ext(..) => Kind::NullValue(0),
    };
    prost_types::Value { kind: Some(kind) }
}

fn to_struct(v: &rmpv::Value) -> prost_types::Struct {
    let fields: BTreeMap<String, prost_types::Value> = v
        .as_map()
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            let key = match k {
                rmpv::Value::String(s) => s.as_str().unwrap_or_default().to_string(),
                other => other.to_string(),
            };
            (key, to_value(v))
        })
        .collect();
    prost_types::Struct { fields }
}

/// A connection during one event: the server's PDK calls come on it.
pub struct Conn {
    socket: PathBuf,
    stream: Stream,
    sequence: i64,
}

/// What the server asked, on a connection in an event.
pub enum Next {
    /// The event is over; the connection went back to the pool.
    Ret,
    /// A PDK call: its method and argument message.
    Call(Conn, String, Vec<u8>),
}

async fn connect(socket: &Path) -> Result<Stream, String> {
    let pooled = IDLE.with_borrow_mut(|idle| idle.get_mut(socket).and_then(Vec::pop));
    match pooled {
        Some(s) => Ok(s),
        None => UnixStream::connect(socket)
            .await
            .map(BufReader::new)
            .map_err(|e| format!("trying to connect: {e} ({})", socket.display())),
    }
}

fn pool(socket: PathBuf, stream: Stream) {
    IDLE.with_borrow_mut(|idle| {
        let list = idle.entry(socket).or_default();
        if list.len() < POOL {
            list.push(stream);
        }
    });
}

async fn write_frame(s: &mut Stream, data: &[u8]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(4 + data.len());
    buf.extend_from_slice(&(data.len() as u32).to_le_bytes());
    buf.extend_from_slice(data);
    s.write_all(&buf).await
}

async fn read_frame(s: &mut Stream) -> Result<Vec<u8>, String> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)
        .await
        .map_err(|_| "closed".to_string())?;
    let len = u32::from_le_bytes(len);
    if len > MAX_FRAME {
        return Err(format!("a frame of {len} bytes from the plugin server"));
    }
    let mut data = vec![0u8; len as usize];
    s.read_exact(&mut data)
        .await
        .map_err(|_| "closed".to_string())?;
    Ok(data)
}

fn sequence() -> i64 {
    thread_local! { static SEQ: std::cell::Cell<i64> = const { std::cell::Cell::new(0) }; }
    SEQ.with(|s| {
        let n = s.get() + 1;
        s.set(n);
        n
    })
}

/// A command with no PDK calls (start or close an instance): its answer.
async fn command(socket: &Path, call: Call) -> Result<RpcReturn, String> {
    let fut = async {
        let mut stream = connect(socket).await?;
        let seq = sequence();
        let msg = RpcCall {
            sequence: seq,
            call: Some(call),
        }
        .encode_to_vec();
        write_frame(&mut stream, &msg)
            .await
            .map_err(|e| e.to_string())?;
        let answer = RpcReturn::decode(&read_frame(&mut stream).await?[..])
            .map_err(|e| format!("bad answer from the plugin server: {e}"))?;
        pool(socket.to_path_buf(), stream);
        Ok(answer)
    };
    tokio::time::timeout(TIMEOUT, fut)
        .await
        .unwrap_or_else(|_| Err("timeout".into()))
}

/// `cmd_start_instance`: the new instance's id.
pub async fn start_instance(socket: &Path, name: &str, config: &str) -> Result<i64, String> {
    let r = command(
        socket,
        Call::StartInstance(CmdStartInstance {
            name: name.to_string(),
            config: config.as_bytes().to_vec(),
        }),
    )
    .await?;
    r.instance_status
        .map(|s| s.instance_id as i64)
        .ok_or_else(|| "starting instance: no instance status in the answer".into())
}

/// `cmd_close_instance`.
pub async fn close_instance(socket: &Path, id: i64) -> Result<(), String> {
    command(
        socket,
        Call::CloseInstance(CmdInstance {
            instance_id: id as i32,
        }),
    )
    .await
    .map(|_| ())
}

/// `cmd_handle_event`: the server's first PDK call, or the end.
pub async fn handle_event(socket: &Path, id: i64, event: &str) -> Result<Next, String> {
    let fut = async {
        let mut stream = connect(socket).await?;
        let seq = sequence();
        let msg = RpcCall {
            sequence: seq,
            call: Some(Call::HandleEvent(CmdHandleEvent {
                instance_id: id as i32,
                event_name: event.to_string(),
            })),
        }
        .encode_to_vec();
        write_frame(&mut stream, &msg)
            .await
            .map_err(|_| "closed".to_string())?;
        next(Conn {
            socket: socket.to_path_buf(),
            stream,
            sequence: seq,
        })
        .await
    };
    tokio::time::timeout(TIMEOUT, fut)
        .await
        .unwrap_or_else(|_| Err("timeout".into()))
}

/// Sends a PDK call's answer and reads what comes next.
pub async fn reply(mut conn: Conn, answer: Vec<u8>) -> Result<Next, String> {
    let fut = async {
        write_frame(&mut conn.stream, &answer)
            .await
            .map_err(|_| "closed".to_string())?;
        next(conn).await
    };
    tokio::time::timeout(TIMEOUT, fut)
        .await
        .unwrap_or_else(|_| Err("timeout".into()))
}

async fn next(mut conn: Conn) -> Result<Next, String> {
    let method = read_frame(&mut conn.stream).await?;
    if method.is_empty() {
        let r = RpcReturn::decode(&read_frame(&mut conn.stream).await?[..])
            .map_err(|e| format!("bad answer from the plugin server: {e}"))?;
        if r.sequence != conn.sequence {
            return Err("unexpected RPC response sequence from the plugin server".into());
        }
        pool(conn.socket, conn.stream);
        return Ok(Next::Ret);
    }
    let args = read_frame(&mut conn.stream).await?;
    let method = String::from_utf8(method).map_err(|_| "a PDK method name that is not text")?;
    Ok(Next::Call(conn, method, args))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_and_answers_cross_as_kong_wraps_them() {
        // kong.service.request.set_header(KV): name and value.
        let kv = Kv {
            k: "x-a".into(),
            v: Some(to_value(&"b".into())),
        }
        .encode_to_vec();
        assert_eq!(
            arguments("kong.service.request.set_header", &kv).unwrap(),
            rmpv::Value::Array(vec!["x-a".into(), "b".into()])
        );
        // kong.response.exit(ExitArgs): status, body, headers.
        let mut headers = prost_types::Struct::default();
        headers.fields.insert("x".into(), to_value(&"1".into()));
        let exit = ExitArgs {
            status: 403,
            body: b"no".to_vec(),
            headers: Some(headers),
        }
        .encode_to_vec();
        let args = arguments("kong.response.exit", &exit).unwrap();
        assert_eq!(args.as_array().unwrap()[0], rmpv::Value::from(403));
        assert_eq!(
            args.as_array().unwrap()[1],
            rmpv::Value::Binary(b"no".to_vec())
        );
        // A method the protocol has not is refused with Kong's message.
        assert_eq!(
            arguments("kong.nope", &[]).unwrap_err(),
            "method \"kong.nope\" not found"
        );
        // Answers: a string, a missing value (an empty frame), a multimap.
        let a = answer("kong.request.get_header", &"v".into());
        assert_eq!(StringV::decode(&a[..]).unwrap().v, "v");
        assert!(answer("kong.request.get_header", &rmpv::Value::Nil).is_empty());
        let h = rmpv::Value::Map(vec![(
            "a".into(),
            rmpv::Value::Array(vec!["1".into(), "2".into()]),
        )]);
        let s = prost_types::Struct::decode(&answer("kong.request.get_headers", &h)[..]).unwrap();
        assert_eq!(from_struct(&s), h);
        // Numbers: an Int answer from an integral Lua number.
        let i = answer("kong.request.get_port", &rmpv::Value::F64(8000.0));
        assert_eq!(IntV::decode(&i[..]).unwrap().v, 8000);
    }
}
