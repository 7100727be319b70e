use super::*;
use crate::upstream::pool::PoolSettings;
use crate::worker::stats::WorkerStats;
use tokio::io::AsyncWriteExt;

fn head(text: &str, method: &Method) -> Result<Option<Parsed>, HeadError> {
    let mut buf = BytesMut::from(text.as_bytes());
    parse_head(&mut buf, method, &mut RawHead::default())
}

/// The head parsed, its kept headers merged into the map; and the raw head as encoded.
fn parts(text: &str) -> (http::response::Parts, Framing) {
    parts_and_encoded(text).0
}

fn parts_and_encoded(text: &str) -> ((http::response::Parts, Framing), String) {
    let mut buf = BytesMut::from(text.as_bytes());
    let mut raw = RawHead::default();
    match parse_head(&mut buf, &Method::GET, &mut raw) {
        Ok(Some(Parsed::Head(mut p, f))) => {
            let mut encoded = Vec::new();
            raw.encode(&mut encoded);
            raw.merge_into(&mut p.headers);
            assert!(raw.lines.is_empty());
            ((p, f), String::from_utf8(encoded).unwrap())
        }
        _ => panic!("expected a complete head"),
    }
}

#[test]
fn raw_heads_are_written_as_they_came_without_hop_by_hop_headers() {
    let (_, encoded) = parts_and_encoded(
        "HTTP/1.1 200 OK\r\nServer: up\r\nDate: x\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n\r\n",
    );
    assert_eq!(
        encoded,
        "Server: up\r\nDate: x\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n"
    );
    // Bare LF line ends, trailing blanks and a chunked body's Content-Length.
    let (_, encoded) = parts_and_encoded(
        "HTTP/1.1 200 OK\nA:1\nB:  2  \r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\nC: 3\r\n\r\n",
    );
    assert_eq!(encoded, "A:1\r\nB:  2\r\nC: 3\r\n");
    let mut raw = RawHead::default();
    let mut buf =
        BytesMut::from(&b"HTTP/1.1 304 Not Modified\r\nDate: d\r\nContent-Length: 7\r\n\r\n"[..]);
    assert!(parse_head(&mut buf, &Method::GET, &mut raw).is_ok());
    assert_eq!(raw.content_length, Some(7));
    assert!(raw.has_date);
    assert_eq!(
        raw.names().collect::<Vec<_>>(),
        [&b"Date"[..], b"Content-Length"]
    );
    // Date and Content-Length named by Connection: dropped, and not counted as sent (the
    // client side then writes its own); the body is still framed by the length.
    let mut raw = RawHead::default();
    let mut buf = BytesMut::from(
        &b"HTTP/1.1 200 OK\r\nConnection: Date, Content-Length\r\nDate: d\r\nContent-Length: 3\r\nX: y\r\n\r\n"[..],
    );
    match parse_head(&mut buf, &Method::GET, &mut raw) {
        Ok(Some(Parsed::Head(_, f))) => assert!(matches!(f.kind, FramingKind::Length(3))),
        _ => panic!("expected a complete head"),
    }
    assert_eq!(raw.names().collect::<Vec<_>>(), [&b"X"[..]]);
    assert!(!raw.has_date && raw.content_length.is_none());
}

#[test]
fn response_heads() {
    let (p, f) = parts("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\nKeep-Alive: timeout=5\r\nX-Kept: y\r\n\r\n");
    assert_eq!(p.status, 200);
    assert!(matches!(f.kind, FramingKind::Length(5)) && f.keep_alive);
    // Hop-by-hop headers and those named by Connection never reach the client side.
    assert!(p.headers.get("connection").is_none() && p.headers.get("keep-alive").is_none());
    assert!(p.headers.get("x-secret").is_none());
    assert_eq!(p.headers["x-kept"], "y");
    assert_eq!(p.headers["content-length"], "5");

    let (p, f) =
        parts("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\n\r\n");
    assert!(matches!(f.kind, FramingKind::Chunked));
    assert!(
        p.headers.get("content-length").is_none() && p.headers.get("transfer-encoding").is_none()
    );

    let (_, f) = parts("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\n");
    assert!(!f.keep_alive);
    let (_, f) = parts("HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n");
    assert!(!f.keep_alive, "HTTP/1.0 closes unless it says keep-alive");
    let (_, f) = parts("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n");
    assert!(f.keep_alive);
    let (_, f) = parts("HTTP/1.1 200 OK\r\n\r\n");
    assert!(matches!(f.kind, FramingKind::UntilClose) && !f.keep_alive);
    let (_, f) = parts("HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n");
    assert!(matches!(f.kind, FramingKind::Empty));
    match head(
        "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n",
        &Method::HEAD,
    ) {
        Ok(Some(Parsed::Head(_, f))) => assert!(matches!(f.kind, FramingKind::Empty)),
        _ => panic!(),
    }
    assert!(matches!(
        head("HTTP/1.1 100 Continue\r\n\r\n", &Method::GET),
        Ok(Some(Parsed::Informational))
    ));
    assert!(matches!(
        head("HTTP/1.1 200 OK\r\nContent-Le", &Method::GET),
        Ok(None)
    ));
    for bad in [
        "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        "NOPE\r\n\r\n",
        "HTTP/1.1 99999 X\r\n\r\n",
    ] {
        assert!(
            matches!(head(bad, &Method::GET), Err(HeadError::Io(_))),
            "{bad:?}"
        );
    }
}

/// Serves `pieces` one write at a time on a real socket and reads one response through a
/// `Conn`; returns the body and whether the connection went back to the pool.
async fn exchange(pieces: Vec<&'static [u8]>) -> (Result<Vec<u8>, String>, usize) {
    exchange_holding(pieces, Duration::from_millis(200)).await
}

/// Like `exchange`, the upstream keeping the connection open `hold` after its last piece.
async fn exchange_holding(
    pieces: Vec<&'static [u8]>,
    hold: Duration,
) -> (Result<Vec<u8>, String>, usize) {
    tokio::task::LocalSet::new()
        .run_until(exchange_inner(pieces, hold))
        .await
}

async fn exchange_inner(
    pieces: Vec<&'static [u8]>,
    hold: Duration,
) -> (Result<Vec<u8>, String>, usize) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut req = [0u8; 1024];
        let _ = tokio::io::AsyncReadExt::read(&mut s, &mut req).await;
        for p in pieces {
            s.write_all(p).await.unwrap();
            s.flush().await.unwrap();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        tokio::time::sleep(hold).await;
    });
    let stats = std::sync::Arc::new(WorkerStats::default());
    let pool = Pool::new(
        PoolSettings {
            size: 4,
            max_requests: 100,
            idle_timeout: Duration::from_secs(60),
        },
        stats,
        crate::worker::deadline::Deadlines::new(),
    );
    let key = PeerKey {
        peer: 0,
        tls: None,
        dns: 0,
    };
    let stream = pool
        .open(key.peer, addr, None, Duration::from_secs(1))
        .await
        .unwrap();
    let mut conn = Box::new(Conn::new(stream, key));
    let req = http::Request::get("/")
        .header("host", "x")
        .body(())
        .unwrap()
        .into_parts()
        .0;
    let (_, framing) = match conn
        .send(
            &req,
            None,
            &Overrides::new(true),
            Timeouts {
                write: Duration::from_secs(1),
                read: Duration::from_secs(1),
            },
            &crate::worker::deadline::Deadlines::new(),
        )
        .await
    {
        Ok(x) => x,
        Err(e) => return (Err(format!("{e:?}")), 0),
    };
    let deadlines = crate::worker::deadline::Deadlines::new();
    let ticker = tokio::task::spawn_local(deadlines.clone().run());
    let body = UpstreamBody::new(
        conn,
        pool.clone(),
        framing,
        Duration::from_millis(100),
        deadlines,
    );
    let collected = http_body_util::BodyExt::collect(body)
        .await
        .map(|b| b.to_bytes().to_vec())
        .map_err(|e| e.to_string());
    ticker.abort();
    (collected, pool.idle_count())
}

#[tokio::test]
async fn chunked_bodies_split_anywhere_are_decoded() {
    let (body, idle) = exchange(vec![
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5",
        b";ext=1\r\nhel",
        b"lo\r",
        b"\n6\r\n world\r\n0\r\nTrailer: x\r\n",
        b"\r\n",
    ])
    .await;
    assert_eq!(body.unwrap(), b"hello world");
    assert_eq!(
        idle, 1,
        "a complete chunked body returns the connection to the pool"
    );
}

#[tokio::test]
async fn length_bodies_and_truncation() {
    let (body, idle) = exchange(vec![
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n01234",
        b"56789",
    ])
    .await;
    assert_eq!(body.unwrap(), b"0123456789");
    assert_eq!(idle, 1);
    // The upstream closes after 3 of 10 bytes: an error, and the connection is not reused.
    let (body, idle) = exchange(vec![b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"]).await;
    assert!(body.is_err());
    assert_eq!(idle, 0);
    let (body, idle) = exchange(vec![
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ])
    .await;
    assert!(body.is_err(), "invalid chunk size");
    assert_eq!(idle, 0);
    // Read until close: complete at EOF, never pooled.
    // (The upstream closes 20 ms after its last byte, well within the 100 ms read timeout.)
    let (body, idle) = exchange_holding(
        vec![b"HTTP/1.0 200 OK\r\n\r\nall of it"],
        Duration::from_millis(20),
    )
    .await;
    assert_eq!(body.unwrap(), b"all of it");
    assert_eq!(idle, 0);
}

#[tokio::test]
async fn a_stalled_body_times_out_instead_of_hanging() {
    let (body, idle) = exchange_holding(
        vec![b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"],
        Duration::from_secs(5),
    )
    .await;
    // Without the timeout the body would fail only when the upstream closes, 5 s later,
    // with "closed mid-body".
    let err = body.unwrap_err();
    assert!(err.contains("timed out"), "{err}");
    assert_eq!(idle, 0, "a timed-out connection is not pooled");
}
