//! Kong's rewrite phase: the global plugins' `rewrite`, before the router, which sees what
//! they did (a path or Host a plugin set).

use turnpike_plugins::{spans, Access, AccessRequest};

use crate::runloop::ctx::Ended;
use crate::runloop::errors::exit_response;
use crate::runloop::forward::{client_ip, request_protocol};
use crate::runloop::session::Session;

/// Runs the global plugins' rewrite phase (only a node with global rewrite plugins pays for
/// its future); a plugin may answer instead, or wait (an operator's plugin calling out).
pub async fn run(s: &mut Session<'_>) -> Result<(), Ended> {
    let protocol = request_protocol(s.conn);
    let client_ip = client_ip(s.conn, &s.parts.headers);
    let rc = &mut *s.rc;
    let mut req = AccessRequest::new(
        s.parts.method.as_str(),
        s.target.path(),
        s.target.query(),
        &mut s.parts.headers,
        &mut rc.plugin_headers,
        s.conn.tls,
        client_ip,
        &mut rc.plugin_ctx,
        &mut rc.upstream,
    );
    req.server_port = s.conn.local_port;
    req.client_port = s.conn.peer.port();
    req.started = Some(rc.start);
    req.request_id = Some(&rc.request_id);
    for b in s.snap.global_rewrite.iter() {
        if b.protocols & protocol == 0 {
            continue;
        }
        let t = spans::start(&rc.spans, spans::PLUGIN_REWRITE);
        let exit = match b.handler.rewrite_waiting(&mut req) {
            Access::Continue => None,
            Access::Exit(e) => Some(e),
            wait @ Access::Wait(_) => turnpike_plugins::run_access_from(wait, &mut req).await,
        };
        if let (Some(t), Some(sp)) = (t, rc.spans.as_deref_mut()) {
            sp.plugin("rewrite", b.name, t);
        }
        if let Some(e) = exit {
            return Err(Box::new(exit_response(s.ctx, e, rc.start, rc.grpc)));
        }
    }
    Ok(())
}
