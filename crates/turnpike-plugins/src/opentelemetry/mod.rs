//! opentelemetry (PRIORITY 14): Kong 3.9's tracing plugin. The access phase reads the caller's
//! trace context (`propagation.extract`, or `header_type`), decides whether the trace is sampled
//! (`sampling_rate`, else the parent's decision, else the `tracing_sampling_rate` property),
//! and writes the context the upstream gets (`propagation.inject`; `preserve` writes the format
//! that came in). The header_filter phase may tell the client the trace id
//! (`http_response_header_for_traceid`). The log phase encodes the request's span as OTLP
//! protobuf and queues it; a sender thread batches spans under the resource
//! (`service.name`, `service.instance.id`, `service.version`, and `resource_attributes`) and
//! POSTs them to `traces_endpoint` with the queue's retries (http-log's sender).
//!
//! As in Kong, spans exist only when the `tracing_instrumentations` property turns tracing on
//! (anything but `off`); otherwise the plugin propagates context, marked not sampled. The
//! request span (`kong`, SERVER, its `http.*` attributes, an error status for 5xx) is always
//! made; the instrumentations the property names add, from what the request path recorded
//! (`crate::spans`): `kong.router`, a `kong.balancer` CLIENT span per try (the failed ones
//! with their status and an error), and `kong.{rewrite,access,header_filter}.plugin.<name>`.
//! With `balancer` on, the upstream's parent span is the last try's, made ahead of it as Kong's
//! `precreate_balancer_span` does. With `dns_query`, a `kong.dns` CLIENT span for each try's
//! look-up of a target's host name; with `db_query`, a `kong.database.query` CLIENT span for
//! each store look-up a plugin made (a key-auth key not cached yet). Not made:
//! `kong.internal.request` (no plugin makes an HTTP call on the request path).
//!
//! With `logs_endpoint`, the log phase also sends the request's log records (Kong's
//! request-scoped logs: what plugin code wrote through `kong.log`/`ngx.log` at or above the
//! node's log level, `crate::request_logs`) as OTLP log records with the request's trace, on a
//! queue of their own. Not sent: the worker's logs outside requests.

mod otlp;
pub(crate) mod propagation;
pub(crate) mod schema;

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use serde_json::Value;

use crate::http_log::{self, seconds, Target};
use crate::log::{ip_text, LogEntry};
use crate::{Access, AccessRequest, BodyFilter, BuildContext, Handler, PluginSpec, ResponseHead};

pub struct OpenTelemetry;

/// The node's tracing settings (properties read at start) and the plugin's queues.
#[derive(Default)]
pub struct State {
    settings: OnceLock<Settings>,
    queues: http_log::State,
}

struct Settings {
    /// `tracing_instrumentations` is not `off`: the request span is made.
    request_spans: bool,
    /// The `balancer` instrumentation is on: the upstream's parent is the balancer span.
    balancer_spans: bool,
    /// `tracing_sampling_rate`.
    sampling_rate: f64,
    node_id: String,
}

impl State {
    /// Sets the properties (once, at start).
    pub fn configure(&self, instrumentations: &[String], sampling_rate: f64, node_id: &str) {
        let _ = self.settings.set(Settings {
            request_spans: instrumentations.iter().any(|i| i != "off"),
            balancer_spans: crate::spans::instrumentations(instrumentations)
                & crate::spans::BALANCER
                != 0,
            sampling_rate,
            node_id: node_id.to_string(),
        });
    }

    /// The node's id (a span's `kong.node.id`, the resource's `service.instance.id`).
    pub fn node_id(&self) -> &str {
        &self.settings().node_id
    }

    fn settings(&self) -> &Settings {
        self.settings.get_or_init(|| Settings {
            request_spans: false,
            balancer_spans: false,
            sampling_rate: 0.01,
            node_id: String::new(),
        })
    }
}

struct Configured {
    propagation: propagation::Params,
    /// The plugin's `sampling_rate`.
    plugin_rate: Option<f64>,
    global_rate: f64,
    request_spans: bool,
    balancer_spans: bool,
    trace_id_header: Option<HeaderName>,
    queue: Option<Arc<http_log::Queue>>,
    /// `logs_endpoint`'s queue.
    logs: Option<Arc<http_log::Queue>>,
}

/// This request's trace (Kong's root span and tracing context).
struct Trace {
    trace_id: TraceId,
    span_id: [u8; 8],
    parent_id: Option<[u8; 8]>,
    sampled: bool,
    start_ns: u64,
    request: Option<SpanRequest>,
    /// The last balancer try's span, made ahead (the upstream's parent), when `balancer` is
    /// traced.
    balancer_span_id: Option<[u8; 8]>,
}

struct SpanRequest {
    method: std::borrow::Cow<'static, str>,
    host: Option<HeaderValue>,
    target: Box<str>,
    tls: bool,
    version: http::Version,
    client_ip: std::net::IpAddr,
}

use crate::clock::now_ns;

/// A trace id (8 or 16 bytes as it came in, 16 when made here), inline: no allocation per
/// traced request.
struct TraceId {
    bytes: [u8; 16],
    len: u8,
}

impl TraceId {
    fn new(id: &[u8]) -> TraceId {
        let mut bytes = [0u8; 16];
        let len = id.len().min(16);
        bytes[..len].copy_from_slice(&id[..len]);
        TraceId {
            bytes,
            len: len as u8,
        }
    }

    fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

/// Kong's probability sampler: the trace id's low 64 bits against the rate's share of them.
fn sample(trace_id: &[u8], rate: f64) -> bool {
    if rate >= 1.0 {
        return true;
    }
    if rate <= 0.0 || trace_id.len() < 8 {
        return false;
    }
    let mut b = [0u8; 8];
    b.copy_from_slice(&trace_id[trace_id.len() - 8..]);
    (u64::from_be_bytes(b) as f64) < rate * u64::MAX as f64
}

impl Configured {
    /// Kong's sampling decision (`tracer.get_sampling_decision`).
    fn sampled(&self, trace_id: &[u8], parent: Option<bool>) -> bool {
        if !self.request_spans {
            // Propagation only: nothing is recorded, the callee is told so.
            return false;
        }
        match (self.plugin_rate, parent) {
            (Some(rate), None | Some(true)) => sample(trace_id, rate),
            (_, Some(p)) => p,
            (None, None) => sample(trace_id, self.global_rate),
        }
    }
}

struct Handle(Arc<Configured>);

impl Handler for Handle {
    fn phases(&self) -> crate::Phases {
        let mut p = crate::Phases::ACCESS | crate::Phases::LOG;
        if self.0.trace_id_header.is_some() {
            p = p | crate::Phases::RESPONSE;
        }
        p
    }

    fn access(&self, req: &mut AccessRequest<'_>) -> Access {
        let conf = &self.0;
        let (found, mut ex) = match conf.propagation.extract(req.headers) {
            Some((f, e)) => (Some(f), e),
            None => (None, propagation::Extracted::default()),
        };
        // Ids from the thread's fast generator (they name a trace, they guard nothing).
        let trace_id = match ex.trace_id.take() {
            Some(id) => TraceId::new(&id),
            None => TraceId {
                bytes: (fastrand::u128(..) | 1).to_be_bytes(),
                len: 16,
            },
        };
        let span_id = (fastrand::u64(..) | 1).to_be_bytes();
        let sampled = conf.sampled(trace_id.as_slice(), ex.sampled);
        // Kong's precreate_balancer_span: the upstream's parent is the balancer span.
        let balancer_span_id =
            (sampled && conf.balancer_spans).then(|| (fastrand::u64(..) | 1).to_be_bytes());
        let ctx = propagation::Inject {
            trace_id: trace_id.as_slice(),
            span_id: balancer_span_id.unwrap_or(span_id),
            // The balancer span's parent is this request's span.
            parent_id: if balancer_span_id.is_some() {
                Some(span_id)
            } else {
                ex.span_id
            },
            sampled,
            flags: ex.flags.unwrap_or(0) & !1,
        };
        conf.propagation
            .inject(req.headers, found, ex.single_header, &ctx);
        // What the span will say of the request (its text is written in the log phase).
        let request = sampled.then(|| {
            SpanRequest {
                // The usual methods without an allocation.
                method: match req.method {
                    "GET" => "GET".into(),
                    "POST" => "POST".into(),
                    "PUT" => "PUT".into(),
                    "DELETE" => "DELETE".into(),
                    "PATCH" => "PATCH".into(),
                    "HEAD" => "HEAD".into(),
                    "OPTIONS" => "OPTIONS".into(),
                    m => m.to_string().into(),
                },
                host: req.headers.get(http::header::HOST).cloned(),
                target: if req.target.is_empty() {
                    match req.query {
                        Some(q) => format!("{}?{q}", req.path).into(),
                        None => req.path.into(),
                    }
                } else {
                    req.target.into()
                },
                tls: req.tls,
                version: req.version,
                client_ip: req.client_ip,
            }
        });
        req.ctx.insert(Trace {
            trace_id,
            span_id,
            parent_id: ex.span_id,
            sampled,
            start_ns: now_ns(),
            request,
            balancer_span_id,
        });
        Access::Continue
    }

    fn header_filter(&self, resp: &mut ResponseHead<'_>) -> Option<Box<dyn BodyFilter>> {
        let name = self.0.trace_id_header.as_ref()?;
        let t = resp.ctx.get::<Trace>()?;
        if let Ok(v) = HeaderValue::from_str(&hex::encode(t.trace_id.as_slice())) {
            resp.headers.append(name.clone(), v);
        }
        None
    }

    fn log(&self, entry: &LogEntry<'_>) {
        if let Some(logs) = &self.0.logs {
            send_logs(logs, entry);
        }
        let (Some(queue), Some(t)) = (&self.0.queue, entry.ctx.and_then(|c| c.get::<Trace>()))
        else {
            return;
        };
        let Some(r) = t.request.as_ref().filter(|_| t.sampled) else {
            return;
        };
        let host = r.host.as_ref().and_then(|h| h.to_str().ok()).unwrap_or("");
        let scheme = if r.tls { "https" } else { "http" };
        let flavor = match r.version {
            http::Version::HTTP_10 => "1.0",
            http::Version::HTTP_2 => "2",
            _ => "1.1",
        };
        let ip = ip_text(r.client_ip);
        let end_ns = now_ns();
        // The request's start, as Kong's KONG_PROCESSING_START, when the path recorded it.
        let start_ns = entry.spans.map_or(t.start_ns, |s| s.start_ns());
        let trace_id = propagation::pad16(t.trace_id.as_slice());
        let span = otlp::Span {
            trace_id,
            span_id: t.span_id,
            parent_span_id: t.parent_id,
            name: "kong",
            kind: 2,
            start_ns,
            end_ns: end_ns.max(start_ns),
            attributes: &[],
            status: if entry.status >= 500 { 2 } else { 0 },
        };
        // The attributes' texts and, for each of the seven, its keys and tags (under 40 bytes).
        let texts = r.method.len() + 2 * (scheme.len() + host.len()) + 3 + r.target.len();
        let more = texts + flavor.len() + ip.len() + 7 * 40;
        // Written by literal keys: their bytes are constants in the code.
        queue.offer(otlp::encode_span_with(&span, more, |out| {
            otlp::attribute(out, "http.method", otlp::Value::Str(&r.method));
            let url = [scheme, "://", host, &r.target];
            otlp::attribute(out, "http.url", otlp::Value::Concat(&url));
            otlp::attribute(out, "http.host", otlp::Value::Str(host));
            otlp::attribute(out, "http.scheme", otlp::Value::Str(scheme));
            otlp::attribute(out, "http.flavor", otlp::Value::Str(flavor));
            otlp::attribute(out, "net.peer.ip", otlp::Value::Str(&ip));
            let status = otlp::Value::Int(entry.status as i64);
            otlp::attribute(out, "http.status_code", status);
        }));
        if let Some(spans) = entry.spans {
            instrumentation_spans(queue, spans, t, trace_id, end_ns, entry.service, entry.ctx);
        }
    }
}

/// The spans of the instrumentations the request path recorded, children of the request span.
fn instrumentation_spans(
    queue: &http_log::Queue,
    spans: &crate::spans::Spans,
    t: &Trace,
    trace_id: [u8; 16],
    end_ns: u64,
    service: Option<&turnpike_config::declarative::Service>,
    ctx: Option<&crate::PluginCtx>,
) {
    let child = |name: &str,
                 kind: u64,
                 start_ns: u64,
                 end_ns: u64,
                 attributes: &[(&str, otlp::Value<'_>)],
                 status: u64| {
        otlp::encode_span(&otlp::Span {
            trace_id,
            span_id: (fastrand::u64(..) | 1).to_be_bytes(),
            parent_span_id: Some(t.span_id),
            name,
            kind,
            start_ns,
            end_ns: end_ns.max(start_ns),
            attributes,
            status,
        })
    };
    if let Some((a, b)) = spans.router {
        queue.offer(child("kong.router", 1, spans.ns(a), spans.ns(b), &[], 0));
    }
    for p in &spans.plugins {
        let name = format!("kong.{}.plugin.{}", p.phase, p.plugin);
        queue.offer(child(&name, 1, spans.ns(p.start), spans.ns(p.end), &[], 0));
    }
    // Kong's `kong.database.query` (CLIENT): each store look-up a plugin made for the request.
    if spans.has(crate::spans::DB_QUERY) {
        if let Some(queries) = ctx.and_then(|c| c.get::<crate::credentials::DbQueries>()) {
            for q in &queries.0 {
                let statement = q.statement();
                let attributes = [
                    ("db.system", otlp::Value::Str(q.system)),
                    ("db.statement", otlp::Value::Str(&statement)),
                ];
                let (start, end) = (spans.ns(q.start), spans.ns(q.end));
                queue.offer(child("kong.database.query", 3, start, end, &attributes, 0));
            }
        }
    }
    // Kong's `kong.dns` (CLIENT): the name and port looked up, the address found or an error.
    for d in spans.dns.borrow().iter() {
        let ip = d.ip.map(ip_text);
        let mut attributes = vec![
            ("dns.record.domain", otlp::Value::Str(&d.domain)),
            ("dns.record.port", otlp::Value::Int(d.port as i64)),
        ];
        if let Some(ip) = &ip {
            attributes.push(("dns.record.ip", otlp::Value::Str(ip)));
        }
        let status = if ip.is_none() { 2 } else { 0 };
        let (start, end) = (spans.ns(d.start), spans.ns(d.end));
        queue.offer(child("kong.dns", 3, start, end, &attributes, status));
    }
    // Tries recorded for another plugin (zipkin) are not this instrumentation's.
    let recorded = spans.tries.borrow();
    let tries: &[crate::spans::TrySpan] = if spans.has(crate::spans::BALANCER) {
        &recorded
    } else {
        &[]
    };
    let last = tries.len();
    for (i, try_) in tries.iter().enumerate() {
        let ip = try_.ip.map(ip_text);
        let mut attributes = vec![
            ("try_count", otlp::Value::Int(i as i64 + 1)),
            ("net.peer.port", otlp::Value::Int(try_.port as i64)),
        ];
        if let Some(ip) = &ip {
            attributes.push(("net.peer.ip", otlp::Value::Str(ip)));
        }
        // Kong's balancer_data.hostname: the name the service (or its upstream) points at.
        if let Some(host) = service.map(|s| &*s.host).filter(|h| !h.is_empty()) {
            attributes.push(("net.peer.name", otlp::Value::Str(host)));
        }
        if let Some(code) = try_.failed {
            attributes.push(("http.status_code", otlp::Value::Int(code as i64)));
        }
        let start_ns = spans.ns(try_.start);
        let end = try_.end.map_or(end_ns, |e| spans.ns(e));
        let status = if try_.failed.is_some() { 2 } else { 0 };
        let mut span = otlp::Span {
            trace_id,
            span_id: (fastrand::u64(..) | 1).to_be_bytes(),
            parent_span_id: Some(t.span_id),
            name: "kong.balancer",
            kind: 3,
            start_ns,
            end_ns: end.max(start_ns),
            attributes: &attributes,
            status,
        };
        // The last try, when it answered, is the span the upstream was told of (Kong makes a
        // new span for a failed one, as for every earlier try).
        if i + 1 == last && try_.failed.is_none() {
            if let Some(id) = t.balancer_span_id {
                span.span_id = id;
            }
        }
        queue.offer(otlp::encode_span(&span));
    }
}

/// The request's log records, each queued as an encoded `LogRecord` with the request's trace.
fn send_logs(queue: &http_log::Queue, entry: &LogEntry<'_>) {
    let Some(ctx) = entry.ctx else { return };
    let Some(logs) = ctx.get::<crate::request_logs::RequestLogs>() else {
        return;
    };
    let trace = ctx.get::<Trace>().map(|t| otlp::LogTrace {
        trace_id: propagation::pad16(t.trace_id.as_slice()),
        span_id: t.sampled.then_some(t.span_id),
        flags: t.sampled as u32,
    });
    for r in &logs.0 {
        queue.offer(otlp::encode_log(
            r,
            entry.request_id.to_str().ok(),
            trace.as_ref(),
        ));
    }
}

/// The sender's target for `endpoint`, the config's field `field` (`traces_endpoint`,
/// `logs_endpoint`).
fn target(
    c: &schema::Config,
    node_id: &str,
    field: &str,
    endpoint: &str,
) -> Result<(Target, usize), String> {
    let uri: http::Uri = endpoint.parse().map_err(|e| format!("{field}: {e}"))?;
    let mut headers = Vec::new();
    for (k, v) in c.headers.iter().flatten() {
        let name = HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| format!("headers: invalid header name '{k}'"))?;
        let value =
            HeaderValue::from_str(v).map_err(|_| format!("headers: invalid value for '{k}'"))?;
        headers.push((name, value));
    }
    // Kong's defaults, then the config's (which may override them).
    let mut attributes: Vec<(String, String)> = vec![
        ("service.name".into(), "kong".into()),
        ("service.instance.id".into(), node_id.to_string()),
        (
            "service.version".into(),
            crate::registry::KONG_VERSION.into(),
        ),
    ];
    for (k, v) in c.resource_attributes.iter().flatten() {
        attributes.retain(|(name, _)| name != k);
        attributes.push((k.clone(), v.clone()));
    }
    let resource = Arc::new(otlp::encode_resource(&attributes));
    let q = &c.queue;
    let batch = c
        .batch_span_count
        .filter(|n| *n > 0 && q.max_batch_size == 200);
    let delay = c
        .batch_flush_delay
        .filter(|_| q.max_coalescing_delay == 1.0)
        .map(|d| d as f64);
    Ok((
        Target {
            uri,
            method: http::Method::POST,
            content_type: HeaderValue::from_static("application/x-protobuf"),
            headers,
            timeout: std::time::Duration::from_millis(
                c.connect_timeout.max(c.send_timeout).max(c.read_timeout),
            ),
            batch: batch.unwrap_or(q.max_batch_size).max(1) as usize,
            coalescing: seconds(delay.unwrap_or(q.max_coalescing_delay)),
            max_retry_time: seconds(q.max_retry_time),
            initial_retry_delay: seconds(q.initial_retry_delay),
            max_retry_delay: seconds(q.max_retry_delay),
            assemble: Arc::new(move |spans: &[Bytes]| otlp::encode_request(&resource, spans)),
            plugin: "opentelemetry",
        },
        q.max_entries.unwrap_or(10000) as usize,
    ))
}

impl PluginSpec for OpenTelemetry {
    fn name(&self) -> &'static str {
        "opentelemetry"
    }
    fn priority(&self) -> i32 {
        14
    }
    /// Kong's `protocols = typedefs.protocols_http`.
    fn http_only(&self) -> bool {
        true
    }
    fn fields(&self) -> &'static [crate::schema::Field] {
        schema::FIELDS
    }
    fn shorthands(&self, config: &mut Value) {
        // Kong 3.x's `endpoint`, now `traces_endpoint`.
        if let Some(m) = config.as_object_mut() {
            if let Some(e) = m.remove("endpoint") {
                if !e.is_null() {
                    m.entry("traces_endpoint").or_insert(e);
                }
            }
        }
    }
    fn entity_checks(&self, config: &Value) -> Vec<(String, String)> {
        schema::entity_checks(config)
    }
    fn build(&self, config: &Value, ctx: &BuildContext) -> Result<Arc<dyn Handler>, String> {
        let c: schema::Config = crate::typed(config)?;
        let state = &ctx.runtime.opentelemetry;
        let settings = state.settings();

        let queue = match &c.traces_endpoint {
            Some(e) if settings.request_spans => Some(http_log::start_queue(
                &state.queues,
                &ctx.runtime.spawner,
                config.to_string(),
                || target(&c, &settings.node_id, "traces_endpoint", e),
            )?),
            _ => None,
        };
        // Logs go whatever `tracing_instrumentations` says, on a queue of their own.
        let logs = match &c.logs_endpoint {
            Some(e) => Some(http_log::start_queue(
                &state.queues,
                &ctx.runtime.spawner,
                format!("{config}:logs"),
                || target(&c, &settings.node_id, "logs_endpoint", e),
            )?),
            None => None,
        };
        Ok(Arc::new(Handle(Arc::new(Configured {
            propagation: propagation::Params::new(&c.propagation, &c.header_type, None),
            plugin_rate: c.sampling_rate,
            global_rate: settings.sampling_rate,
            request_spans: settings.request_spans,
            balancer_spans: settings.balancer_spans,
            trace_id_header: c
                .http_response_header_for_traceid
                .as_deref()
                .and_then(|h| HeaderName::from_bytes(h.to_ascii_lowercase().as_bytes()).ok()),
            queue,
            logs,
        }))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_read_as_std_writes_them() {
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "10.200.30.4",
            "255.255.255.255",
            "::1",
            "fe80::1",
        ] {
            assert_eq!(&*ip_text(ip.parse().unwrap()), ip);
        }
    }

    #[test]
    fn the_sampler_follows_the_rate_and_the_parent() {
        assert!(sample(&[0xff; 16], 1.0));
        assert!(!sample(&[0; 16], 0.0));
        assert!(sample(&[0; 16], 0.5));
        assert!(!sample(&[0xff; 16], 0.5));
        let mut c = Configured {
            propagation: propagation::Params::new(
                &schema::Propagation {
                    extract: Some(Vec::new()),
                    clear: None,
                    inject: None,
                    default_format: "w3c".into(),
                },
                "preserve",
                None,
            ),
            plugin_rate: None,
            global_rate: 0.0,
            request_spans: true,
            balancer_spans: false,
            trace_id_header: None,
            queue: None,
            logs: None,
        };
        assert!(c.sampled(&[0; 16], Some(true)), "parent-based");
        assert!(!c.sampled(&[0; 16], None), "the global rate");
        c.plugin_rate = Some(1.0);
        assert!(c.sampled(&[0; 16], None));
        assert!(!c.sampled(&[0; 16], Some(false)), "a parent's no stands");
        c.request_spans = false;
        assert!(
            !c.sampled(&[0; 16], Some(true)),
            "tracing off: propagation only"
        );
    }
}
