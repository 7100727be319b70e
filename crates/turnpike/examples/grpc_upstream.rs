//! The gRPC upstream of `bench/grpc.sh`: an h2c server (hyper) that answers every call with
//! the request's messages echoed back and `grpc-status: 0` in the trailers, as a unary gRPC
//! echo service does; a call to a method named `Stream` gets each request frame echoed as it
//! comes (a bidirectional streaming echo). Light enough that the proxy in front of it is the
//! bottleneck.
//!
//! Usage: grpc_upstream PORT [THREADS]

use std::convert::Infallible;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};

fn main() {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().and_then(|p| p.parse().ok()).unwrap_or(9101);
    let threads: usize = args.next().and_then(|t| t.parse().ok()).unwrap_or(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let svc = service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                    if req.uri().path().ends_with("/Stream") {
                        return Ok::<_, Infallible>(echo_stream(req.into_body()));
                    }
                    let body = req.into_body().collect().await.map(|b| b.to_bytes());
                    let body = body.unwrap_or_default();
                    let mut trailers = HeaderMap::new();
                    trailers.insert("grpc-status", HeaderValue::from_static("0"));
                    let frames: Vec<Result<Frame<Bytes>, Infallible>> =
                        vec![Ok(Frame::data(body)), Ok(Frame::trailers(trailers))];
                    let body = StreamBody::new(futures_util::stream::iter(frames));
                    let resp = Response::builder()
                        .header("content-type", "application/grpc")
                        .body(body.boxed_unsync())
                        .unwrap();
                    Ok::<_, Infallible>(resp)
                });
                // A load generator's calls end in resets (grpc-go cancels each finished
                // call's stream): h2's rapid-reset guards would take them for an attack and
                // close the connection under load.
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .max_pending_accept_reset_streams(None)
                    .max_local_error_reset_streams(None)
                    .max_concurrent_streams(None)
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
}

type Echoed = http_body_util::combinators::UnsyncBoxBody<Bytes, Infallible>;

/// A bidirectional streaming echo: each data frame of the request is sent back as it comes
/// (the frames are whole gRPC messages as clients write them, or parts of one: either way the
/// bytes come back in order), then `grpc-status: 0` once the client's stream ends.
fn echo_stream(body: hyper::body::Incoming) -> Response<Echoed> {
    use futures_util::StreamExt;
    let data = http_body_util::BodyStream::new(body).filter_map(|f| async move {
        f.ok()?
            .into_data()
            .ok()
            .map(|d| Ok::<_, Infallible>(Frame::data(d)))
    });
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let end = futures_util::stream::once(async move { Ok(Frame::trailers(trailers)) });
    Response::builder()
        .header("content-type", "application/grpc")
        .body(StreamBody::new(data.chain(end)).boxed_unsync())
        .unwrap()
}
