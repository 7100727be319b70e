//! The gRPC upstream of `bench/grpc.sh`: an h2c server (hyper) that answers every call with
//! the request's messages echoed back and `grpc-status: 0` in the trailers, as a unary gRPC
//! echo service does. Light enough that the proxy in front of it is the bottleneck.
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
                    let body = req.into_body().collect().await.map(|b| b.to_bytes());
                    let body = body.unwrap_or_default();
                    let mut trailers = HeaderMap::new();
                    trailers.insert("grpc-status", HeaderValue::from_static("0"));
                    let frames: Vec<Result<Frame<Bytes>, Infallible>> =
                        vec![Ok(Frame::data(body)), Ok(Frame::trailers(trailers))];
                    let body = StreamBody::new(futures_util::stream::iter(frames));
                    let resp = Response::builder()
                        .header("content-type", "application/grpc")
                        .body(body)
                        .unwrap();
                    Ok::<_, Infallible>(resp)
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
}
