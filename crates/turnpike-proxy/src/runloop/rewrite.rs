//! Kong's rewrite phase: the global plugins' `rewrite`, before the router, which sees what
//! they did (a path or Host a plugin set).

use http::request::Parts;
use turnpike_plugins::{spans, AccessRequest, Exit};

use crate::runloop::ctx::RequestCtx;
use crate::runloop::forward::{client_ip, request_protocol};
use crate::snapshot::Snapshot;
use crate::worker::ctx::ConnInfo;

/// Runs the global plugins' rewrite phase; a plugin may answer instead (`Exit`).
pub fn run(
    snap: &Snapshot,
    conn: &ConnInfo,
    parts: &mut Parts,
    (path, query): (&str, Option<&str>),
    rc: &mut RequestCtx,
) -> Option<Exit> {
    if snap.global_rewrite.is_empty() {
        return None;
    }
    let protocol = request_protocol(conn);
    let client_ip = client_ip(conn, &parts.headers);
    let mut req = AccessRequest::new(
        parts.method.as_str(),
        path,
        query,
        &mut parts.headers,
        &mut rc.plugin_headers,
        conn.tls,
        client_ip,
        &mut rc.plugin_ctx,
    );
    for b in snap.global_rewrite.iter() {
        if b.protocols & protocol == 0 {
            continue;
        }
        let t = spans::start(&rc.spans, spans::PLUGIN_REWRITE);
        let exit = b.handler.rewrite(&mut req);
        if let (Some(t), Some(s)) = (t, rc.spans.as_deref_mut()) {
            s.plugin("rewrite", b.name, t);
        }
        if exit.is_some() {
            return exit;
        }
    }
    rc.upstream_query = req.upstream_query;
    rc.upstream_path = req.upstream_path;
    rc.upstream_host = req.upstream_host;
    None
}
