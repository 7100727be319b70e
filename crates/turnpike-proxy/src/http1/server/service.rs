//! What the HTTP/1.1 server asks of the code that serves its requests.

use crate::http1::server::{conn::*, response::*};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use http::{Request, Response};

use crate::worker::deadline::Deadlines;

/// What the HTTP/1.1 server asks of whoever serves a connection's requests (the request
/// path, `runloop::Connection`). The server never imports it, as Pingora's protocols never
/// import its proxy; every method is monomorphised, so the indirection costs nothing.
pub trait Service {
    /// The request body `call` gets, made from the connection's body reader.
    type RequestBody: From<Http1Body>;
    /// The response body written back.
    type ResponseBody: ResponseBody;

    /// Serves one request. `seen`: which groups of header names it carries
    /// (`header_names::seen`, as the parser saw them); `upgrade`: where the connection goes
    /// once a 101 is written, for a request that asks to upgrade.
    fn call(
        &self,
        request: Request<Self::RequestBody>,
        seen: u32,
        upgrade: Option<PendingUpgrade>,
    ) -> impl std::future::Future<Output = Response<Self::ResponseBody>>;

    /// The answer to a request head that is refused (the connection then closes).
    fn refusal(&self, why: Refused) -> Response<Self::ResponseBody>;

    /// Where the headers of the response `call` returned that are kept outside its map wait
    /// to be written: set as `call` returns and emptied as the head is encoded, with no await
    /// between, so one slot per worker serves all its connections (held per connection, its
    /// ~400 bytes would stay with every idle one).
    fn outside_headers(&self) -> &RefCell<OutsideHeaders>;

    /// The worker is shutting down: the connection closes after its current request.
    fn closing(&self) -> bool;

    /// When a request on this connection last ended (the keep-alive timeout counts from there).
    fn last_active(&self) -> std::time::Instant;

    /// The worker's coarse clock and deadlines.
    fn deadlines(&self) -> &Rc<Deadlines>;

    fn limits(&self) -> Limits;
}

/// The connection's bounds, from the node's properties.
#[derive(Clone, Copy)]
pub struct Limits {
    /// nginx's keepalive_timeout (and client_header_timeout).
    pub keepalive_timeout: Duration,
    /// nginx's client_body_timeout.
    pub client_body_timeout: Duration,
    /// Request heads larger than this get 431.
    pub max_header_size: usize,
}

/// Why a request head was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    BadRequest,
    TooLarge,
}
