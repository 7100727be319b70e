//! grpc-web (PRIORITY 3): a gRPC-Web client (a browser) calls a gRPC service through the
//! gateway, as Kong's `kong/plugins/grpc-web/{handler,deco}.lua` do it: CORS for the client,
//! `OPTIONS` answered, the request's gRPC-Web body (binary, or base64 in the `-text` modes)
//! sent upstream as gRPC (`Content-Type: application/grpc`, `TE: trailers`), and the
//! upstream's messages sent back in the request's content type, the upstream's trailers as
//! gRPC-Web's trailer frame (`0x80`) at the end of the body.
//!
//! The JSON modes (`+json`, `application/json`) transcode through the messages' protobuf
//! types, which need the `.proto` file of `proto` (compiled when the config is built,
//! [`crate::grpc_proto`]): the request's JSON message becomes the method's input message, and
//! each message of the answer the JSON Kong writes for it ([`crate::grpc_proto::json`]),
//! framed in `+json`, one after the other in `application/json`.

mod schema;

use std::sync::Arc;

use base64::Engine;
use bytes::{BufMut, Bytes, BytesMut};
use http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde_json::Value;

use prost::Message as _;
use prost_reflect::{DynamicMessage, MessageDescriptor};

use crate::grpc_proto::{self, json};
use crate::{Access, AccessRequest, BodyFilter, Exit, Handler, PluginSpec, ResponseHead};

pub struct GrpcWeb;

impl PluginSpec for GrpcWeb {
    fn name(&self) -> &'static str {
        "grpc-web"
    }
    fn priority(&self) -> i32 {
        3
    }
    fn fields(&self) -> &'static [crate::schema::Field] {
        schema::FIELDS
    }
    fn build(&self, config: &Value, ctx: &crate::BuildContext) -> Result<Arc<dyn Handler>, String> {
        let c: schema::Config = crate::typed(config)?;
        let origin = HeaderValue::from_str(&c.allow_origin_header).map_err(|e| e.to_string())?;
        let proto = match &c.proto {
            Some(path) => Some(
                ctx.runtime
                    .protos
                    .load(path)
                    .map_err(|e| format!("failed to load the .proto file {e}"))?,
            ),
            None => None,
        };
        Ok(Arc::new(Configured {
            origin,
            proto,
            pass_stripped_path: c.pass_stripped_path.unwrap_or(false),
        }))
    }
}

struct Configured {
    origin: HeaderValue,
    proto: Option<Arc<grpc_proto::Proto>>,
    pass_stripped_path: bool,
}

/// How a request's content type says its body is carried (Kong's `deco.lua` tables).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mode {
    base64: bool,
    framed: bool,
    json: bool,
}

fn mode(mimetype: &str) -> Option<Mode> {
    let (base64, framed, json) = match mimetype {
        "application/grpc-web" | "application/grpc-web+proto" => (false, true, false),
        "application/grpc-web-text" | "application/grpc-web-text+proto" => (true, true, false),
        "application/grpc-web+json" => (false, true, true),
        "application/grpc-web-text+json" => (true, true, true),
        "application/json" => (false, false, true),
        _ => return None,
    };
    Some(Mode {
        base64,
        framed,
        json,
    })
}

/// What the access phase leaves for the response: the request's content type and mode, and
/// in the JSON modes the method's output type.
struct Call {
    mimetype: HeaderValue,
    mode: Mode,
    output: Option<MessageDescriptor>,
}

fn bad_request(text: impl Into<Bytes>) -> Access {
    Access::Exit(Exit::text(StatusCode::BAD_REQUEST, text))
}

static ALLOW_ORIGIN: HeaderName = header::ACCESS_CONTROL_ALLOW_ORIGIN;

impl Handler for Configured {
    fn phases(&self) -> crate::Phases {
        crate::Phases::ACCESS | crate::Phases::RESPONSE
    }

    fn wants_body(&self) -> bool {
        true
    }

    fn access(&self, req: &mut AccessRequest<'_>) -> Access {
        req.response_headers
            .push((ALLOW_ORIGIN.clone(), self.origin.clone()));
        if req.method == "OPTIONS" {
            return Access::Exit(grpc_proto::preflight(
                "application/grpc-web-text+proto",
                self.origin.clone(),
                "POST",
                "content-type,x-grpc-web,x-user-agent",
            ));
        }
        if self.pass_stripped_path {
            // Kong's `ngx.req.set_uri(upstream_uri)`: the upstream gets the stripped path.
            req.ctx.insert(crate::PassStrippedPath);
        }
        let mimetype = req
            .headers
            .get(header::CONTENT_TYPE)
            .cloned()
            .unwrap_or_else(|| HeaderValue::from_static(""));
        let mode = mimetype.to_str().ok().and_then(mode);
        const NEEDS_PROTO: &str = "transcoding requests require a .proto file defining the service";
        let Some(mode) = mode else {
            return bad_request(NEEDS_PROTO);
        };
        // The method's types, for the JSON modes: by the request's path, or with
        // pass_stripped_path by its last two segments (`/<package>.<Service>/<Method>`,
        // what the route's prefix leaves).
        let method = if mode.json {
            let Some(proto) = &self.proto else {
                return bad_request(NEEDS_PROTO);
            };
            let path = if self.pass_stripped_path {
                let mut cut = req.path.rmatch_indices('/');
                match (cut.next(), cut.next()) {
                    (Some(_), Some((i, _))) => &req.path[i..],
                    _ => req.path,
                }
            } else {
                req.path
            };
            match proto.method(path) {
                Some(m) => Some(m),
                None => {
                    return bad_request(format!("Unknown path {}", grpc_proto::lua_quote(path)))
                }
            }
        } else {
            None
        };
        let body = req.body.take().unwrap_or_default();
        let body = if mode.base64 {
            match base64::engine::general_purpose::STANDARD.decode(strip_ws(&body)) {
                Ok(b) => Bytes::from(b),
                Err(_) => return bad_request("invalid base64 in the gRPC-Web request body"),
            }
        } else {
            body
        };
        let body = match method {
            None => body,
            Some(m) => {
                let text = if mode.framed {
                    match grpc_proto::unframe(&body) {
                        Some((_, msg, _)) => msg,
                        None => return bad_request("a gRPC-Web frame was expected in the body"),
                    }
                } else {
                    &body[..]
                };
                let value: serde_json::Value = match serde_json::from_slice(text) {
                    Ok(v) => v,
                    Err(e) => {
                        let why = json::cjson_error(text).unwrap_or_else(|| e.to_string());
                        return bad_request(format!("decode json err: {why}"));
                    }
                };
                match json::from_json(&m.input, &value) {
                    Ok(msg) => Bytes::from(grpc_proto::frame(0, &msg.encode_to_vec())),
                    Err(e) => {
                        tracing::error!("grpc-web: {e}");
                        return bad_request("failed to encode payload");
                    }
                }
            }
        };
        req.body = Some(body);
        req.headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        req.headers
            .insert(header::TE, HeaderValue::from_static("trailers"));
        req.ctx.insert(Call {
            mimetype,
            mode,
            output: method.map(|m| m.output.clone()),
        });
        Access::Continue
    }

    fn header_filter(&self, resp: &mut ResponseHead<'_>) -> Option<Box<dyn BodyFilter>> {
        let call = resp.ctx.get::<Call>()?;
        let mode = call.mode;
        let output = call.output.clone();
        resp.headers
            .insert(header::CONTENT_TYPE, call.mimetype.clone());
        resp.headers.remove(header::CONTENT_LENGTH);
        // A trailers-only answer (an error, no message): its status came as headers.
        let status = resp.headers.get("grpc-status").cloned();
        let message = resp.headers.get("grpc-message").cloned();
        Some(Box::new(Downstream {
            mode,
            output,
            pending: BytesMut::new(),
            status,
            message,
        }))
    }
}

/// Base64 text as it came, less the line breaks and spaces some clients put in.
fn strip_ws(b: &[u8]) -> Vec<u8> {
    b.iter()
        .copied()
        .filter(|c| !c.is_ascii_whitespace())
        .collect()
}

/// The response body on its way to the client: each piece re-encoded for the client's mode,
/// the trailer frame at the end.
struct Downstream {
    mode: Mode,
    /// The JSON modes: the messages' type, and what has come of a frame not yet whole.
    output: Option<MessageDescriptor>,
    pending: BytesMut,
    status: Option<HeaderValue>,
    message: Option<HeaderValue>,
}

impl Downstream {
    fn encode(&self, b: Bytes) -> Bytes {
        if self.mode.base64 && !b.is_empty() {
            Bytes::from(base64::engine::general_purpose::STANDARD.encode(&b))
        } else {
            b
        }
    }
}

impl Downstream {
    /// The whole messages received so far as JSON, framed unless the mode is unframed.
    fn transcode(&mut self, output: &MessageDescriptor, piece: &[u8]) -> Bytes {
        self.pending.extend_from_slice(piece);
        let mut out = Vec::new();
        while let Some((_, msg, used)) = grpc_proto::unframe(&self.pending) {
            match DynamicMessage::decode(output.clone(), msg) {
                Ok(m) => {
                    let text = serde_json::to_vec(&json::to_json(&m)).unwrap_or_default();
                    if self.mode.framed {
                        out.extend_from_slice(&grpc_proto::frame(0, &text));
                    } else {
                        out.extend_from_slice(&text);
                    }
                }
                Err(e) => tracing::error!(
                    "grpc-web: the upstream's message is not a {}: {e}",
                    output.full_name()
                ),
            }
            let _ = self.pending.split_to(used);
        }
        Bytes::from(out)
    }
}

impl BodyFilter for Downstream {
    fn filter(&mut self, piece: Bytes, eof: bool) -> Bytes {
        let piece = match self.output.clone() {
            Some(output) => self.transcode(&output, &piece),
            None => piece,
        };
        let piece = self.encode(piece);
        if !eof || !self.mode.framed {
            return piece;
        }
        let text = format!(
            "grpc-status:{}\r\ngrpc-message:{}\r\n",
            self.status
                .as_ref()
                .and_then(|v| v.to_str().ok())
                .unwrap_or("0"),
            self.message
                .as_ref()
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
        );
        let mut frame = BytesMut::with_capacity(5 + text.len());
        frame.put_u8(0x80);
        frame.put_u32(text.len() as u32);
        frame.put_slice(text.as_bytes());
        let trailer = self.encode(frame.freeze());
        let mut out = BytesMut::with_capacity(piece.len() + trailer.len());
        out.put_slice(&piece);
        out.put_slice(&trailer);
        out.freeze()
    }

    fn trailers(&mut self, trailers: &HeaderMap) {
        if let Some(s) = trailers.get("grpc-status") {
            self.status = Some(s.clone());
        }
        if let Some(m) = trailers.get("grpc-message") {
            self.message = Some(m.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_follow_kongs_tables() {
        assert_eq!(
            mode("application/grpc-web-text"),
            Some(Mode {
                base64: true,
                framed: true,
                json: false
            })
        );
        assert_eq!(mode("application/json").map(|m| m.framed), Some(false));
        assert_eq!(
            mode("application/grpc-web+json").map(|m| m.json),
            Some(true)
        );
        assert_eq!(mode("application/grpc"), None);
    }

    #[test]
    fn the_trailer_frame_carries_the_upstreams_status() {
        let mut d = Downstream {
            mode: mode("application/grpc-web").unwrap(),
            output: None,
            pending: BytesMut::new(),
            status: None,
            message: None,
        };
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static("7"));
        t.insert("grpc-message", HeaderValue::from_static("nope"));
        assert_eq!(
            d.filter(Bytes::from_static(b"\0\0\0\0\x01x"), false).len(),
            6
        );
        d.trailers(&t);
        let end = d.filter(Bytes::new(), true);
        assert_eq!(&end[..5], b"\x80\0\0\0\x22");
        assert_eq!(&end[5..], b"grpc-status:7\r\ngrpc-message:nope\r\n");
        // Text mode: each piece base64 on its own, as Kong encodes chunk by chunk.
        let mut d = Downstream {
            mode: mode("application/grpc-web-text").unwrap(),
            output: None,
            pending: BytesMut::new(),
            status: None,
            message: None,
        };
        let end = d.filter(Bytes::new(), true);
        let raw = base64::engine::general_purpose::STANDARD
            .decode(&end)
            .unwrap();
        assert_eq!(&raw[5..], b"grpc-status:0\r\ngrpc-message:\r\n");
    }
}
