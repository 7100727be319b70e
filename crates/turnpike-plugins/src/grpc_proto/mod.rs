//! `.proto` files as Kong's gRPC plugins load them (`kong/tools/grpc.lua`): grpc-gateway and
//! grpc-web's JSON modes transcode through the message types a `proto` config names.
//!
//! A file is compiled (protox, into a prost-reflect descriptor pool) when a plugin config is
//! built, not per request, and kept per node by path and modification time, so every
//! instance naming the same file shares one pool and an edited file is read again at the next
//! config change. Imports are looked up as Kong's `protoc` instance looks them up:
//! `/usr/local/kong/include`, `/usr/include`, then the file's own directory; then
//! `google/api/annotations.proto` and `http.proto` (the `google.api.http` option, which Kong
//! expects beside the file; kept here so a file written for Kong needs nothing more) and the
//! well-known `google/protobuf/*.proto` types.
//!
//! The methods are those of the file's services and, as `each_method` recurses, of the files
//! it imports `public`ly; each with its `google.api.http` bindings for grpc-gateway.

pub mod json;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use prost_reflect::{DynamicMessage, FileDescriptor, MessageDescriptor, Value};
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};

/// One RPC of a loaded file.
pub struct Method {
    /// `/<package>.<Service>/<Method>`, the gRPC request path.
    pub path: String,
    pub input: MessageDescriptor,
    pub output: MessageDescriptor,
    /// Its `google.api.http` bindings, the rule's own first, then its `additional_bindings`.
    pub http: Vec<HttpRule>,
}

/// One `google.api.http` binding: an HTTP method (lower case, as Kong keys them), a path
/// template, and where the request body goes (`*`, a field name, or nowhere).
#[derive(Debug, Clone, PartialEq)]
pub struct HttpRule {
    pub method: &'static str,
    pub template: String,
    pub body: Option<String>,
}

/// A compiled `.proto` file.
pub struct Proto {
    pub methods: Vec<Method>,
}

impl Proto {
    /// The method a gRPC path names.
    pub fn method(&self, path: &str) -> Option<&Method> {
        self.methods.iter().find(|m| m.path == path)
    }

    /// Compiles the file at `path` with its imports.
    pub fn compile(path: &Path) -> Result<Proto, String> {
        let abs = std::path::absolute(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let dir = abs.parent().unwrap_or(Path::new("/")).to_path_buf();
        let mut resolver = ChainFileResolver::new();
        for d in ["/usr/local/kong/include", "/usr/include"] {
            if Path::new(d).is_dir() && !abs.starts_with(d) {
                resolver.add(protox::file::IncludeFileResolver::new(d.into()));
            }
        }
        resolver.add(protox::file::IncludeFileResolver::new(dir));
        resolver.add(GoogleApi);
        resolver.add(GoogleFileResolver::new());
        let mut compiler = protox::Compiler::with_file_resolver(resolver);
        compiler.include_imports(true);
        compiler
            .open_file(&abs)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let pool = compiler.descriptor_pool();
        let name = compiler
            .files()
            .find(|f| !f.is_import())
            .map(|f| f.name().to_string())
            .ok_or_else(|| format!("{}: not compiled", path.display()))?;
        let file = pool
            .get_file_by_name(&name)
            .ok_or_else(|| format!("{}: not compiled", path.display()))?;
        let mut methods = Vec::new();
        let http = pool.get_extension_by_name("google.api.http");
        collect(&file, http.as_ref(), &mut methods, &mut Vec::new());
        Ok(Proto { methods })
    }
}

/// The methods of `file`'s services, then of its public imports' (Kong's `each_method_recur`
/// visits the public imports first; paths are unique, so the order only matters for
/// grpc-gateway's bindings, where the file's own come first here).
fn collect(
    file: &FileDescriptor,
    http: Option<&prost_reflect::ExtensionDescriptor>,
    out: &mut Vec<Method>,
    seen: &mut Vec<String>,
) {
    if seen.iter().any(|s| s == file.name()) {
        return;
    }
    seen.push(file.name().to_string());
    for service in file.services() {
        for m in service.methods() {
            let rules = http
                .map(|ext| {
                    let options = m.options();
                    if !options.has_extension(ext) {
                        return Vec::new();
                    }
                    match &*options.get_extension(ext) {
                        Value::Message(rule) => http_rules(rule),
                        _ => Vec::new(),
                    }
                })
                .unwrap_or_default();
            out.push(Method {
                path: format!("/{}/{}", service.full_name(), m.name()),
                input: m.input(),
                output: m.output(),
                http: rules,
            });
        }
    }
    for dep in file.public_dependencies() {
        collect(&dep, http, out, seen);
    }
}

/// A `google.api.HttpRule`'s bindings: its own pattern, then each of `additional_bindings`
/// (which, as the rule's definition says, do not nest). `custom` patterns are skipped, as
/// Kong skips them.
fn http_rules(rule: &DynamicMessage) -> Vec<HttpRule> {
    let mut out = Vec::new();
    let text = |m: &DynamicMessage, name: &str| -> Option<String> {
        let v = m.get_field_by_name(name)?;
        match &*v {
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            _ => None,
        }
    };
    let one = |m: &DynamicMessage, out: &mut Vec<HttpRule>| {
        for method in ["get", "put", "post", "delete", "patch"] {
            if let Some(template) = text(m, method) {
                out.push(HttpRule {
                    method,
                    template,
                    body: text(m, "body"),
                });
            }
        }
    };
    one(rule, &mut out);
    if let Some(v) = rule.get_field_by_name("additional_bindings") {
        if let Value::List(list) = &*v {
            for b in list {
                if let Value::Message(b) = b {
                    one(b, &mut out);
                }
            }
        }
    }
    out
}

/// `google/api/annotations.proto` and `google/api/http.proto` (googleapis, Apache 2.0).
struct GoogleApi;

impl FileResolver for GoogleApi {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        let source = match name {
            "google/api/annotations.proto" => include_str!("include/google/api/annotations.proto"),
            "google/api/http.proto" => include_str!("include/google/api/http.proto"),
            _ => return Err(protox::Error::file_not_found(name)),
        };
        File::from_source(name, source)
    }
}

/// A compiled file with the modification time it was read at.
type Compiled = (Option<SystemTime>, Arc<Proto>);

/// The node's compiled files, by path, each with the modification time it was read at.
#[derive(Default)]
pub struct Cache {
    files: Mutex<HashMap<PathBuf, Compiled>>,
}

impl Cache {
    /// The compiled file at `path`: the one kept when the file has not changed since.
    pub fn load(&self, path: &str) -> Result<Arc<Proto>, String> {
        let path = PathBuf::from(path);
        let mtime = std::fs::metadata(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .modified()
            .ok();
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((t, p)) = files.get(&path) {
            if *t == mtime && mtime.is_some() {
                return Ok(p.clone());
            }
        }
        let proto = Arc::new(Proto::compile(&path)?);
        files.insert(path, (mtime, proto.clone()));
        Ok(proto)
    }
}

/// The answer grpc-gateway and grpc-web give a CORS preflight (`OPTIONS`): `200 OK` with
/// their `CORS_HEADERS` (Kong's handlers).
pub fn preflight(
    content_type: &'static str,
    origin: http::HeaderValue,
    methods: &'static str,
    headers: &'static str,
) -> crate::Exit {
    use http::{header, HeaderValue};
    crate::Exit {
        status: http::StatusCode::OK,
        headers: vec![
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (header::ACCESS_CONTROL_ALLOW_ORIGIN, origin),
            (
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static(methods),
            ),
            (
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                HeaderValue::from_static(headers),
            ),
        ],
        body: bytes::Bytes::from_static(b"OK"),
    }
}

/// A gRPC message frame: flags (0: an uncompressed message; 0x80: grpc-web's trailers), the
/// length, big-endian, and the message.
pub fn frame(flags: u8, msg: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + msg.len());
    out.push(flags);
    out.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    out.extend_from_slice(msg);
    out
}

/// The first whole frame at the start of `buf`: (flags, message, bytes it took).
pub fn unframe(buf: &[u8]) -> Option<(u8, &[u8], usize)> {
    let head = buf.get(..5)?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let msg = buf.get(5..5 + len)?;
    Some((head[0], msg, 5 + len))
}

/// Lua's `%q`, as Kong's error messages quote a path or a method: the text in double quotes, `"` and `\` escaped, a newline as `\` and a newline.
pub fn lua_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\\n"),
            '\r' => out.push_str("\\r"),
            '\0' => out.push_str("\\0"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\{}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn compiles_a_file_with_its_http_bindings_and_public_imports() {
        let dir = tempdir();
        fixture(
            &dir,
            "common.proto",
            r#"syntax = "proto3"; package common;
               message Ping { string text = 1; }
               service Health { rpc Check(Ping) returns (Ping); }"#,
        );
        let main = fixture(
            &dir,
            "main.proto",
            r#"syntax = "proto3"; package demo.v1;
               import public "common.proto";
               import "google/api/annotations.proto";
               import "google/protobuf/timestamp.proto";
               message Req { string name = 1; google.protobuf.Timestamp at = 2; }
               service Greeter {
                 rpc Hello(Req) returns (common.Ping) {
                   option (google.api.http) = {
                     get: "/v1/hello/{name}"
                     additional_bindings { post: "/v1/hello" body: "*" }
                   };
                 }
                 rpc Plain(Req) returns (Req);
               }"#,
        );
        let proto = Proto::compile(&main).unwrap();
        let paths: Vec<_> = proto.methods.iter().map(|m| m.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/demo.v1.Greeter/Hello",
                "/demo.v1.Greeter/Plain",
                "/common.Health/Check"
            ]
        );
        let hello = proto.method("/demo.v1.Greeter/Hello").unwrap();
        assert_eq!(hello.input.full_name(), "demo.v1.Req");
        assert_eq!(hello.output.full_name(), "common.Ping");
        assert_eq!(
            hello.http,
            [
                HttpRule {
                    method: "get",
                    template: "/v1/hello/{name}".into(),
                    body: None
                },
                HttpRule {
                    method: "post",
                    template: "/v1/hello".into(),
                    body: Some("*".into())
                },
            ]
        );
        assert!(proto
            .method("/demo.v1.Greeter/Plain")
            .unwrap()
            .http
            .is_empty());
    }

    #[test]
    fn a_bad_file_is_an_error_naming_it() {
        let dir = tempdir();
        let bad = fixture(&dir, "bad.proto", "syntax = \"proto3\"; message {");
        let e = Proto::compile(&bad).err().unwrap();
        assert!(e.contains("bad.proto"), "{e}");
        let missing = fixture(
            &dir,
            "imports.proto",
            "syntax = \"proto3\"; import \"nope.proto\";",
        );
        let e = Proto::compile(&missing).err().unwrap();
        assert!(e.contains("nope.proto"), "{e}");
        assert!(Cache::default().load("/nonexistent/x.proto").is_err());
    }

    #[test]
    fn the_cache_reads_a_changed_file_again() {
        let dir = tempdir();
        let p = fixture(
            &dir,
            "a.proto",
            "syntax = \"proto3\"; message A {}\nservice S { rpc M(A) returns (A); }",
        );
        let cache = Cache::default();
        let a = cache.load(p.to_str().unwrap()).unwrap();
        let b = cache.load(p.to_str().unwrap()).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        std::thread::sleep(std::time::Duration::from_millis(20));
        fixture(
            &dir,
            "a.proto",
            "syntax = \"proto3\"; message A {}\nservice S { rpc N(A) returns (A); }",
        );
        let c = cache.load(p.to_str().unwrap()).unwrap();
        assert_eq!(c.methods[0].path, "/S/N");
    }

    #[test]
    fn errors_quote_as_lua_does() {
        assert_eq!(lua_quote("/a\"b\\c\n"), "\"/a\\\"b\\\\c\\\n\"");
    }

    #[test]
    fn frames_round_trip() {
        let f = frame(0, b"abc");
        assert_eq!(f, b"\0\0\0\0\x03abc");
        assert_eq!(unframe(&f), Some((0, &b"abc"[..], 8)));
        assert_eq!(unframe(&f[..6]), None);
    }

    pub(super) fn tempdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "turnpike-proto-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
