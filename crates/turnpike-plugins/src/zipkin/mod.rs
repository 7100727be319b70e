//! zipkin (PRIORITY 100000): Kong 3.9's Zipkin tracer. Each request gets a SERVER span (the
//! request: `http.*` tags, `lc`, static tags and those of the `Zipkin-Tags` header, the status,
//! consumer, credential and node) and a CLIENT span under it (`<name> (proxy)`: the service and
//! route, the phases as annotations `kas kaf khs khf kbs kbf` or as duration tags). The
//! upstream gets the proxy span's context (`propagation`, or `header_type` and
//! `default_header_type`; b3 by default); a request without a sampling decision is sampled at
//! `sample_ratio`. Sampled spans are written as Zipkin's v2 JSON and POSTed in batches to
//! `http_endpoint` through the shared queue and sender (http-log's).
//!
//! Where Kong reads nginx's phase clocks, this plugin takes the times it sees: the access
//! phase's start when it runs (first, by its priority), its end as the upstream request's start
//! (the header phase less the upstream's latency), the header phase when it runs, the body's end
//! at the log phase. Each balancer try is a CLIENT span `<name> (balancer try N)` with its
//! peer, the earlier (failed) ones tagged `error`, `kong.balancer.state` and their status; the
//! proxy span's remote endpoint is the last try's peer.

mod schema;

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use serde_json::Value;

use crate::http_log::{self, seconds, Target};
use crate::log::LogEntry;
use crate::opentelemetry::propagation;
use crate::{Access, AccessRequest, BodyFilter, BuildContext, Handler, PluginSpec, ResponseHead};

pub struct Zipkin;

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

struct Configured {
    propagation: propagation::Params,
    sample_ratio: f64,
    trace_id_bytes: usize,
    method_path: bool,
    local_service_name: String,
    default_service_name: Option<String>,
    include_credential: bool,
    tags_header: HeaderName,
    static_tags: Vec<(String, String)>,
    trace_id_header: Option<HeaderName>,
    annotations: bool,
    node_id: String,
    queue: Option<Arc<http_log::Queue>>,
}

/// A request's two spans, from the access phase to the log phase.
struct Trace {
    trace_id: Vec<u8>,
    request_id: [u8; 8],
    proxy_id: [u8; 8],
    parent_id: Option<[u8; 8]>,
    sampled: bool,
    name: String,
    access_start: u64,
    header_start: Option<u64>,
    header_end: Option<u64>,
    client_ip: std::net::IpAddr,
    tags: Vec<(String, String)>,
}

impl Configured {
    /// The request's spans as Zipkin's v2 JSON (Kong's `reporter`), written as text: a
    /// `serde_json::Value` tree per span and its printing cost ~100,000 instructions a request.
    fn spans(&self, t: &Trace, e: &LogEntry<'_>) -> Vec<Bytes> {
        let now = now_us();
        let start = now
            .saturating_sub(e.latency_request_ms * 1000)
            .min(t.access_start);
        let header_start = t.header_start.unwrap_or(now);
        let header_end = t.header_end.unwrap_or(header_start);
        let access_end = header_start
            .saturating_sub(e.latency_proxy_ms.unwrap_or(0) * 1000)
            .max(t.access_start);
        let trace_id = hex::encode(&t.trace_id);
        let request_id = hex::encode(t.request_id);
        let service_name = e.service.and_then(|s| s.name.as_deref());
        let tries = e.spans.map(|s| s.tries.borrow());
        let tries = tries.as_deref().map_or(&[][..], |t| &t[..]);
        let remote = |o: &mut Json, t: &crate::spans::TrySpan| {
            if let Some(n) = service_name.or(self.default_service_name.as_deref()) {
                o.str("serviceName", n);
            }
            match t.ip {
                Some(std::net::IpAddr::V4(a)) => {
                    o.str("ipv4", &crate::log::ip_text(std::net::IpAddr::V4(a)))
                }
                Some(std::net::IpAddr::V6(a)) => o.str("ipv6", &a.to_string()),
                None => {}
            }
            o.num("port", t.port as u64);
        };
        let service_and_route = |o: &mut Json| {
            if let Some(s) = e.service {
                o.str("kong.service", &s.id);
                if let Some(n) = &s.name {
                    o.str("kong.service_name", n);
                }
            }
            o.str("kong.route", &e.route.id);
            if let Some(n) = &e.route.name {
                o.str("kong.route_name", n);
            }
        };
        let mut out = Vec::with_capacity(2 + tries.len());
        for (i, try_) in tries.iter().enumerate() {
            let spans = e.spans.expect("tries come with their record");
            let start = spans.ns(try_.start) / 1000;
            let end = try_.end.map_or(now, |end| spans.ns(end) / 1000);
            let mut b = Json::new();
            b.str("traceId", &trace_id);
            b.str("name", &format!("{} (balancer try {})", t.name, i + 1));
            b.str("parentId", &request_id);
            b.str("id", &hex::encode((fastrand::u64(..) | 1).to_be_bytes()));
            b.str("kind", "CLIENT");
            b.num("timestamp", start);
            b.num("duration", end.saturating_sub(start));
            b.object("localEndpoint", |o| {
                o.str("serviceName", &self.local_service_name)
            });
            b.object("remoteEndpoint", |o| remote(o, try_));
            b.object("tags", |o| {
                o.str("kong.balancer.try", &(i + 1).to_string());
                if i + 1 < tries.len() {
                    o.str("error", "true");
                    o.str("kong.balancer.state", "failed");
                    o.str("http.status_code", &try_.failed.unwrap_or(502).to_string());
                }
                service_and_route(o);
            });
            b.raw("annotations", "[]");
            out.push(b.finish());
        }

        // The request span.
        let mut r = Json::new();
        r.str("traceId", &trace_id);
        r.str("name", &t.name);
        if let Some(p) = t.parent_id {
            r.str("parentId", &hex::encode(p));
        }
        r.str("id", &request_id);
        r.str("kind", "SERVER");
        r.num("timestamp", start);
        r.num("duration", now.saturating_sub(start));
        r.object("localEndpoint", |o| {
            o.str("serviceName", &self.local_service_name)
        });
        r.object("remoteEndpoint", |o| {
            match t.client_ip {
                std::net::IpAddr::V4(a) => {
                    o.str("ipv4", &crate::log::ip_text(std::net::IpAddr::V4(a)))
                }
                std::net::IpAddr::V6(a) => o.str("ipv6", &a.to_string()),
            }
            if let Some(n) = &self.default_service_name {
                o.str("serviceName", n);
            }
        });
        r.object("tags", |o| {
            for (k, v) in &t.tags {
                o.str(k, v);
            }
            o.str("http.status_code", &e.status.to_string());
            if let Some(c) = e.consumer {
                if !c.consumer_id().is_empty() {
                    o.str("kong.consumer", c.consumer_id());
                }
                if let (true, Some(cred)) = (self.include_credential, c.credential_id()) {
                    o.str("kong.credential", cred);
                }
            }
            o.str("kong.node.id", &self.node_id);
        });
        r.raw("annotations", "[]");
        let request = r.finish();

        // The proxy span.
        let mut p = Json::new();
        p.str("traceId", &trace_id);
        p.str("name", &format!("{} (proxy)", t.name));
        p.str("parentId", &request_id);
        p.str("id", &hex::encode(t.proxy_id));
        p.str("kind", "CLIENT");
        p.num("timestamp", t.access_start);
        p.num("duration", now.saturating_sub(t.access_start));
        p.object("localEndpoint", |o| {
            o.str("serviceName", &self.local_service_name)
        });
        match (
            tries.last(),
            service_name.or(self.default_service_name.as_deref()),
        ) {
            (Some(last), _) => p.object("remoteEndpoint", |o| remote(o, last)),
            (None, Some(n)) => p.object("remoteEndpoint", |o| o.str("serviceName", n)),
            (None, None) => p.raw("remoteEndpoint", "null"),
        }
        let ms = |a: u64, b: u64| (b.saturating_sub(a) / 1000).to_string();
        p.object("tags", |o| {
            service_and_route(o);
            if let Some(s) = e.service {
                o.str("peer.hostname", &s.host);
            }
            if !self.annotations {
                o.str("kong.access.duration_ms", &ms(t.access_start, access_end));
                o.str(
                    "kong.header_filter.duration_ms",
                    &ms(header_start, header_end),
                );
                o.str("kong.body_filter.duration_ms", &ms(header_end, now));
            }
        });
        let mut annotations = String::from("[");
        if self.annotations {
            for (i, (value, at)) in [
                ("kas", t.access_start),
                ("kaf", access_end),
                ("khs", header_start),
                ("khf", header_end),
                ("kbs", header_end),
                ("kbf", now),
            ]
            .into_iter()
            .enumerate()
            {
                if i > 0 {
                    annotations.push(',');
                }
                let _ = write!(annotations, r#"{{"value":"{value}","timestamp":{at}}}"#);
            }
        }
        annotations.push(']');
        p.raw("annotations", &annotations);
        out.push(p.finish());
        out.push(request);
        out
    }
}

/// A JSON object written as text, strings escaped by serde_json.
struct Json(Vec<u8>, bool);

impl Json {
    fn new() -> Json {
        let mut out = Vec::with_capacity(512);
        out.push(b'{');
        Json(out, true)
    }

    fn key(&mut self, k: &str) {
        if !std::mem::take(&mut self.1) {
            self.0.push(b',');
        }
        let _ = serde_json::to_writer(&mut self.0, k);
        self.0.push(b':');
    }

    fn str(&mut self, k: &str, v: &str) {
        self.key(k);
        let _ = serde_json::to_writer(&mut self.0, v);
    }

    fn num(&mut self, k: &str, v: u64) {
        self.key(k);
        let _ = write!(Utf8(&mut self.0), "{v}");
    }

    fn raw(&mut self, k: &str, v: &str) {
        self.key(k);
        self.0.extend_from_slice(v.as_bytes());
    }

    fn object(&mut self, k: &str, f: impl FnOnce(&mut Json)) {
        self.key(k);
        let mut inner = Json(std::mem::take(&mut self.0), true);
        inner.0.push(b'{');
        f(&mut inner);
        inner.0.push(b'}');
        self.0 = inner.0;
    }

    fn finish(mut self) -> Bytes {
        self.0.push(b'}');
        Bytes::from(self.0)
    }
}

/// `fmt::Write` into bytes.
struct Utf8<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for Utf8<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// `Zipkin-Tags: name=value;name2=value2` (Kong's `request_tags`).
fn header_tags(v: &str) -> impl Iterator<Item = (String, String)> + '_ {
    v.split(';').filter_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        let (k, v) = (k.trim(), v.trim());
        (!k.is_empty()).then(|| (k.to_string(), v.to_string()))
    })
}

struct Handle(Arc<Configured>);

impl Handler for Handle {
    fn phases(&self) -> crate::Phases {
        crate::Phases::ACCESS | crate::Phases::RESPONSE | crate::Phases::LOG
    }

    fn log_tries(&self) -> bool {
        true
    }

    fn access(&self, req: &mut AccessRequest<'_>) -> Access {
        let conf = &self.0;
        let access_start = now_us();
        let (found, mut ex) = match conf.propagation.extract(req.headers) {
            Some((f, e)) => (Some(f), e),
            None => (None, propagation::Extracted::default()),
        };
        let sampled = ex
            .sampled
            .unwrap_or_else(|| fastrand::f64() < conf.sample_ratio);
        let trace_id = ex.trace_id.take().unwrap_or_else(|| {
            let id = (fastrand::u128(..) | 1).to_be_bytes();
            id[16 - conf.trace_id_bytes..].to_vec()
        });
        let request_id = (fastrand::u64(..) | 1).to_be_bytes();
        let proxy_id = (fastrand::u64(..) | 1).to_be_bytes();
        conf.propagation.inject(
            req.headers,
            found,
            ex.single_header,
            &propagation::Inject {
                trace_id: &trace_id,
                span_id: proxy_id,
                parent_id: Some(request_id),
                sampled,
                flags: ex.flags.unwrap_or(0) & !1,
            },
        );
        let mut tags = Vec::new();
        let mut name = req.method.to_string();
        if sampled {
            if conf.method_path {
                let _ = write!(name, " {}", req.path);
            }
            let host = req
                .headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("");
            let protocol = match req.version {
                http::Version::HTTP_10 => "HTTP/1.0",
                http::Version::HTTP_2 => "HTTP/2",
                _ => "HTTP/1.1",
            };
            tags = vec![
                ("lc".to_string(), "kong".to_string()),
                ("http.method".into(), req.method.to_string()),
                ("http.host".into(), host.to_string()),
                ("http.path".into(), req.path.to_string()),
                ("http.protocol".into(), protocol.into()),
            ];
            tags.extend(conf.static_tags.iter().cloned());
            if let Some(v) = req
                .headers
                .get(&conf.tags_header)
                .and_then(|v| v.to_str().ok())
            {
                tags.extend(header_tags(v));
            }
        }
        req.ctx.insert(Trace {
            trace_id,
            request_id,
            proxy_id,
            parent_id: ex.span_id,
            sampled,
            name,
            access_start,
            header_start: None,
            header_end: None,
            client_ip: req.client_ip,
            tags,
        });
        Access::Continue
    }

    fn header_filter(&self, resp: &mut ResponseHead<'_>) -> Option<Box<dyn BodyFilter>> {
        let start = now_us();
        let t = resp.ctx.get_mut::<Trace>()?;
        t.header_start = Some(start);
        if let Some(name) = &self.0.trace_id_header {
            if let Ok(v) = HeaderValue::from_str(&hex::encode(&t.trace_id)) {
                resp.headers.append(name.clone(), v);
            }
        }
        if let Some(t) = resp.ctx.get_mut::<Trace>() {
            t.header_end = Some(now_us());
        }
        None
    }

    fn log(&self, e: &LogEntry<'_>) {
        let (Some(queue), Some(t)) = (&self.0.queue, e.ctx.and_then(|c| c.get::<Trace>())) else {
            return;
        };
        if !t.sampled {
            return;
        }
        for span in self.0.spans(t, e) {
            queue.offer(span);
        }
    }
}

/// A batch of spans: Zipkin's v2 JSON array.
fn json_array(spans: &[Bytes]) -> Bytes {
    let mut out = Vec::with_capacity(spans.iter().map(|s| s.len() + 1).sum::<usize>() + 2);
    out.push(b'[');
    for (i, s) in spans.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(s);
    }
    out.push(b']');
    Bytes::from(out)
}

fn target(c: &schema::Config, endpoint: &str) -> Result<(Target, usize), String> {
    let uri: http::Uri = endpoint
        .parse()
        .map_err(|e| format!("http_endpoint: {e}"))?;
    let q = &c.queue;
    Ok((
        Target {
            uri,
            method: http::Method::POST,
            content_type: HeaderValue::from_static("application/json"),
            headers: Vec::new(),
            timeout: std::time::Duration::from_millis(
                c.connect_timeout.max(c.send_timeout).max(c.read_timeout),
            ),
            batch: q.max_batch_size.max(1) as usize,
            coalescing: seconds(q.max_coalescing_delay),
            max_retry_time: seconds(q.max_retry_time),
            initial_retry_delay: seconds(q.initial_retry_delay),
            max_retry_delay: seconds(q.max_retry_delay),
            assemble: Arc::new(json_array),
            plugin: "zipkin",
        },
        q.max_entries.unwrap_or(10000) as usize,
    ))
}

impl PluginSpec for Zipkin {
    fn name(&self) -> &'static str {
        "zipkin"
    }
    fn priority(&self) -> i32 {
        100000
    }
    fn fields(&self) -> &'static [crate::schema::Field] {
        schema::FIELDS
    }
    fn entity_checks(&self, config: &Value) -> Vec<(String, String)> {
        schema::entity_checks(config)
    }
    fn build(&self, config: &Value, ctx: &BuildContext) -> Result<Arc<dyn Handler>, String> {
        let c: schema::Config = crate::typed(config)?;
        let queue = match &c.http_endpoint {
            Some(endpoint) => Some(http_log::start_queue(
                &ctx.runtime.zipkin,
                &ctx.runtime.spawner,
                config.to_string(),
                || target(&c, endpoint),
            )?),
            None => None,
        };
        Ok(Arc::new(Handle(Arc::new(Configured {
            propagation: propagation::Params::new(
                &c.propagation,
                &c.header_type,
                Some(&c.default_header_type),
            ),
            sample_ratio: c.sample_ratio,
            trace_id_bytes: if c.traceid_byte_count == 8 { 8 } else { 16 },
            method_path: c.http_span_name == "method_path",
            local_service_name: c.local_service_name.clone(),
            default_service_name: c.default_service_name.clone(),
            include_credential: c.include_credential,
            tags_header: HeaderName::from_bytes(c.tags_header.to_ascii_lowercase().as_bytes())
                .map_err(|_| "tags_header: not a header name".to_string())?,
            static_tags: c
                .static_tags
                .iter()
                .flatten()
                .map(|t| (t.name.clone(), t.value.clone()))
                .collect(),
            trace_id_header: c
                .http_response_header_for_traceid
                .as_deref()
                .and_then(|h| HeaderName::from_bytes(h.to_ascii_lowercase().as_bytes()).ok()),
            annotations: c.phase_duration_flavor == "annotations",
            node_id: ctx.runtime.opentelemetry.node_id().to_string(),
            queue,
        }))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_tags_read_as_kongs() {
        let tags: Vec<_> = header_tags("foo=bar; baz = qux ;=skip;novalue").collect();
        assert_eq!(
            tags,
            [("foo".into(), "bar".into()), ("baz".into(), "qux".into())]
        );
    }

    #[test]
    fn objects_are_json() {
        let mut o = Json::new();
        o.str("a", "q\"uote");
        o.num("n", 7);
        o.object("o", |i| {
            i.str("x", "y");
            i.raw("z", "null");
        });
        o.raw("l", "[]");
        let v: Value = serde_json::from_slice(&o.finish()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"a": "q\"uote", "n": 7, "o": {"x": "y", "z": null}, "l": []})
        );
    }

    #[test]
    fn a_batch_is_a_json_array() {
        let b = json_array(&[Bytes::from_static(b"{\"a\":1}"), Bytes::from_static(b"{}")]);
        assert_eq!(&b[..], b"[{\"a\":1},{}]");
    }
}
