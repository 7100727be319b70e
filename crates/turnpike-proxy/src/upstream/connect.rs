//! Opening a connection to an upstream: TCP within the service's connect timeout, then TLS
//! with the service's client configuration; and handing one to hyper's client for an
//! upgrade (WebSocket).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A plain or TLS connection to an upstream.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[derive(Debug)]
pub enum ConnectError {
    Timeout,
    Refused(std::io::Error),
    Tls(std::io::Error),
    Handshake(hyper::Error),
}

/// TLS parameters of an upstream connection: the client configuration and the server name.
pub type TlsParams<'a> = Option<(
    &'a Arc<rustls::ClientConfig>,
    rustls::pki_types::ServerName<'static>,
)>;

/// A TCP connection to `addr`, with Nagle off.
pub async fn tcp(addr: SocketAddr, connect_timeout: Duration) -> Result<TcpStream, ConnectError> {
    let tcp = match tokio::time::timeout(connect_timeout, TcpStream::connect(addr)).await {
        Err(_) => return Err(ConnectError::Timeout),
        Ok(Err(e)) => return Err(ConnectError::Refused(e)),
        Ok(Ok(s)) => s,
    };
    let _ = tcp.set_nodelay(true);
    Ok(tcp)
}

/// `tcp` as it is (no `tls`), or with a TLS handshake done over it.
pub async fn secure(
    tcp: TcpStream,
    tls: TlsParams<'_>,
    connect_timeout: Duration,
) -> Result<Stream, ConnectError> {
    match tls {
        None => Ok(Stream::Plain(tcp)),
        Some((cfg, name)) => {
            let connector = tokio_rustls::TlsConnector::from(cfg.clone());
            match tokio::time::timeout(connect_timeout, connector.connect(name, tcp)).await {
                Err(_) => Err(ConnectError::Timeout),
                Ok(Err(e)) => Err(ConnectError::Tls(e)),
                Ok(Ok(s)) => Ok(Stream::Tls(Box::new(s))),
            }
        }
    }
}

/// Hands `stream` to hyper's HTTP/1.1 client, for a request that upgrades (WebSocket): the
/// connection is driven by its own task and never pooled.
pub async fn hyper_client<B>(stream: Stream) -> Result<SendRequest<B>, ConnectError>
where
    B: http_body::Body + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (sender, conn) = hyper::client::conn::http1::Builder::new()
        .handshake(TokioIo::new(stream))
        .await
        .map_err(ConnectError::Handshake)?;
    tokio::task::spawn_local(async move {
        let _ = conn.with_upgrades().await;
    });
    Ok(sender)
}
