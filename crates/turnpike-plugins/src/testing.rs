//! A request for the plugins' unit tests.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::*;

#[cfg(test)]
/// A request for the plugins' unit tests: the parts `AccessRequest` borrows, owned here.
pub(crate) struct TestRequest {
    pub method: &'static str,
    pub query: Option<&'static str>,
    pub headers: HeaderMap,
    pub response_headers: Vec<(HeaderName, HeaderValue)>,
    pub client_ip: std::net::IpAddr,
    pub body: Option<Bytes>,
    pub ctx: PluginCtx,
}

#[cfg(test)]
impl TestRequest {
    pub fn new() -> TestRequest {
        TestRequest {
            method: "GET",
            query: None,
            headers: HeaderMap::new(),
            response_headers: Vec::new(),
            client_ip: "127.0.0.1".parse().unwrap(),
            body: None,
            ctx: PluginCtx::default(),
        }
    }

    /// Runs `handler`'s access phase on this request, waits included.
    pub fn run(&mut self, handler: &dyn Handler) -> Access {
        self.run_full(handler).0
    }

    /// Runs `handler`'s access phase; also returns the consumer it set.
    pub fn run_full(&mut self, handler: &dyn Handler) -> (Access, Option<Arc<Identity>>) {
        let mut req = AccessRequest {
            body: self.body.clone(),
            route_id: "r",
            ..AccessRequest::new(
                self.method,
                "/",
                self.query,
                &mut self.headers,
                &mut self.response_headers,
                false,
                self.client_ip,
                &mut self.ctx,
            )
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let outcome = match rt.block_on(run_access(handler, &mut req)) {
            Some(e) => Access::Exit(e),
            None => Access::Continue,
        };
        (outcome, req.consumer)
    }
}
