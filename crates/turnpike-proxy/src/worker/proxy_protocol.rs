//! The PROXY protocol (HAProxy's, v1 text and v2 binary) on listeners flagged
//! `proxy_protocol` (Kong's `proxy_listen`/`stream_listen` flag, nginx's `listen ...
//! proxy_protocol`): a load balancer in front (HAProxy, an AWS NLB) opens each connection
//! with a header naming the client it accepted. The header is read and consumed before
//! anything else (the TLS handshake included); a connection without a valid one is closed,
//! as nginx closes it ("broken header").
//!
//! What the address then changes is nginx's realip module: on an HTTP listener, with
//! `real_ip_header = proxy_protocol`, the named client becomes the connection's client when
//! the balancer is in `trusted_ips`; on a stream listener it becomes it whenever the balancer
//! is trusted (Kong's stream server lists `set_real_ip_from` for `trusted_ips`).

use std::net::SocketAddr;
use std::time::Duration;

use ppp::{HeaderResult, PartialResult};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// nginx's `proxy_protocol_timeout` (its default).
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// The largest header read: v1's is at most 107 bytes; v2's carries TLVs (an AWS NLB's VPC
/// endpoint id, TLS details) and stays far below this in practice.
const MAX_HEADER: usize = 4096;

/// Reads and consumes the PROXY header at the start of `stream`: the client address it
/// names, or `None` for one that names none (v1 `UNKNOWN`, v2 `LOCAL`: the balancer's own
/// health check). `Err` says why the connection must be closed.
pub async fn read_header(stream: &mut TcpStream) -> Result<Option<SocketAddr>, String> {
    let (len, source) = tokio::time::timeout(TIMEOUT, peek_header(stream))
        .await
        .map_err(|_| "no PROXY protocol header in time".to_string())??;
    let mut header = vec![0u8; len];
    stream
        .read_exact(&mut header)
        .await
        .map_err(|e| format!("reading the PROXY protocol header: {e}"))?;
    Ok(source)
}

async fn peek_header(stream: &TcpStream) -> Result<(usize, Option<SocketAddr>), String> {
    let mut buf = vec![0u8; MAX_HEADER];
    let mut seen = 0;
    loop {
        let n = stream
            .peek(&mut buf)
            .await
            .map_err(|e| format!("reading the PROXY protocol header: {e}"))?;
        if n == 0 {
            return Err("closed before a PROXY protocol header".into());
        }
        if n > seen {
            seen = n;
            match parse(&buf[..n]) {
                Parsed::Header(len, source) => return Ok((len, source)),
                Parsed::Broken => {
                    return Err(format!(
                        "broken header: {:?}",
                        String::from_utf8_lossy(&buf[..n.min(107)])
                    ))
                }
                Parsed::Partial if n == buf.len() => {
                    return Err("a PROXY protocol header too long".into())
                }
                Parsed::Partial => {}
            }
        }
        // Part of the header only: wait for the rest.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[derive(Debug, PartialEq)]
enum Parsed {
    /// The header's length in bytes and the client it names.
    Header(usize, Option<SocketAddr>),
    Partial,
    Broken,
}

fn parse(bytes: &[u8]) -> Parsed {
    let result = HeaderResult::parse(bytes);
    if result.is_incomplete() {
        return Parsed::Partial;
    }
    match result {
        HeaderResult::V1(Ok(h)) => {
            let source = match h.addresses {
                ppp::v1::Addresses::Tcp4(a) => {
                    Some(SocketAddr::from((a.source_address, a.source_port)))
                }
                ppp::v1::Addresses::Tcp6(a) => {
                    Some(SocketAddr::from((a.source_address, a.source_port)))
                }
                ppp::v1::Addresses::Unknown => None,
            };
            Parsed::Header(h.header.len(), source)
        }
        HeaderResult::V2(Ok(h)) => {
            let source = match (h.command, h.addresses) {
                (ppp::v2::Command::Local, _) => None,
                (_, ppp::v2::Addresses::IPv4(a)) => {
                    Some(SocketAddr::from((a.source_address, a.source_port)))
                }
                (_, ppp::v2::Addresses::IPv6(a)) => {
                    Some(SocketAddr::from((a.source_address, a.source_port)))
                }
                _ => None,
            };
            Parsed::Header(h.len(), source)
        }
        _ => Parsed::Broken,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_headers_and_what_follows_them() {
        let text = b"PROXY TCP4 203.0.113.7 10.0.0.1 51234 8000\r\nGET / HTTP/1.1\r\n";
        assert_eq!(
            parse(text),
            Parsed::Header(44, Some("203.0.113.7:51234".parse().unwrap()))
        );
        assert_eq!(&text[44..48], b"GET ");
        let v6 = b"PROXY TCP6 2001:db8::1 ::1 4000 443\r\n";
        assert_eq!(
            parse(v6),
            Parsed::Header(v6.len(), Some("[2001:db8::1]:4000".parse().unwrap()))
        );
        assert_eq!(parse(b"PROXY UNKNOWN\r\n"), Parsed::Header(15, None));
        assert_eq!(parse(b"PROXY TCP4 203.0"), Parsed::Partial);
        assert_eq!(parse(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), Parsed::Broken);
        assert_eq!(parse(b"PROXY TCP4 nonsense here 1 2\r\n"), Parsed::Broken);
    }

    #[test]
    fn v2_headers() {
        let header = ppp::v2::Builder::with_addresses(
            ppp::v2::Version::Two | ppp::v2::Command::Proxy,
            ppp::v2::Protocol::Stream,
            (
                "198.51.100.9:40000".parse::<SocketAddr>().unwrap(),
                "10.0.0.1:8000".parse::<SocketAddr>().unwrap(),
            ),
        )
        .build()
        .unwrap();
        let mut bytes = header.clone();
        bytes.extend_from_slice(b"\x16\x03\x01");
        assert_eq!(
            parse(&bytes),
            Parsed::Header(header.len(), Some("198.51.100.9:40000".parse().unwrap()))
        );
        assert_eq!(parse(&header[..10]), Parsed::Partial);
        let local = ppp::v2::Builder::with_addresses(
            ppp::v2::Version::Two | ppp::v2::Command::Local,
            ppp::v2::Protocol::Unspecified,
            ppp::v2::Addresses::Unspecified,
        )
        .build()
        .unwrap();
        assert_eq!(parse(&local), Parsed::Header(local.len(), None));
    }
}
