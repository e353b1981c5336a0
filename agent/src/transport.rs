//! How agentk reaches kas's agent listener: gRPC over HTTP/2 in cleartext (h2c), or
//! the same HTTP/2 connection carried in a WebSocket's binary messages, for networks
//! that only pass HTTP/1.1 (as GitLab's kas does). The agent listener takes both on
//! one port: an HTTP/2 connection starts with its preface (`PRI`), a WebSocket with
//! its `GET` handshake.
//!
//! URLs: `grpc://host:port` (or `http://`) for h2c, `ws://host:port/path` for the
//! WebSocket, and `grpcs://` / `wss://` for the same over TLS (to an ingress or the
//! podgate proxy's TLS listener in front of kas). All work through the podgate
//! proxy, which routes them by the agent token (`Authorization: Bearer`, sent on the
//! WebSocket handshake too).
//!
//! As GitLab's agentk and kas do:
//! - every call is gzip-compressed ([`gzip_server!`](crate::gzip_server!) on each server kas runs for
//!   agentk, [`gzip_client!`](crate::gzip_client!) on each of agentk's clients): GitLab's agentk dials
//!   with `grpc.UseCompressor(gzip)` (`cmd/agentk/agentkapp/app.go`);
//! - the WebSocket speaks subprotocol [`WS_TUNNEL_PROTOCOL`]: the client asks for it,
//!   the server selects it, and a client that did not ask gets the WebSocket closed
//!   with 1002 (protocol error), `Expecting "ws-tunnel" subprotocol, got ""`;
//! - inside the WebSocket, the `:authority` grpc-go sets (the kas URL, `ws://host:port`)
//!   is accepted ([`crate::ws_authority`])
//!   (`internal/tool/wstunnel/{api,client,server}.go` in GitLab's agent,
//!   <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/tool/wstunnel/server.go>).

use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, Bytes};
use futures_util::{Sink, Stream};
use hyper_util::rt::TokioIo;
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tonic::transport::server::Connected;
use tonic::transport::{Channel, Endpoint};

use crate::ws_authority::AuthorityFix;

/// The WebSocket subprotocol of gRPC tunnelled in a WebSocket (GitLab's
/// `wstunnel.TunnelWebSocketProtocol`).
pub const WS_TUNNEL_PROTOCOL: &str = "ws-tunnel";

/// A generated tonic server that takes gzip-compressed requests and compresses its
/// answers when the client accepts gzip (`grpc-accept-encoding`): GitLab's kas
/// installs grpc-go's gzip codec (`cmd/kas/kasapp/configured_app.go`,
/// <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/cmd/kas/kasapp/configured_app.go>)
/// and its agentk compresses every call. Every service on kas's agent listener goes
/// through it.
#[macro_export]
macro_rules! gzip_server {
    ($server:expr) => {
        $server
            .accept_compressed(::tonic::codec::CompressionEncoding::Gzip)
            .send_compressed(::tonic::codec::CompressionEncoding::Gzip)
    };
}

/// A generated tonic client that compresses its requests with gzip and accepts
/// gzip-compressed answers, as GitLab's agentk dials kas
/// (`grpc.WithDefaultCallOptions(grpc.UseCompressor(gzip.Name))`,
/// <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/cmd/agentk/agentkapp/app.go>).
#[macro_export]
macro_rules! gzip_client {
    ($client:expr) => {
        $client
            .send_compressed(::tonic::codec::CompressionEncoding::Gzip)
            .accept_compressed(::tonic::codec::CompressionEncoding::Gzip)
    };
}

/// Transport errors.
#[derive(Debug, Error)]
pub enum Error {
    /// The kas URL is not one agentk can use.
    #[error("kas URL {url:?}: {why}")]
    Url {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// TLS could not be set up (a bad CA file).
    #[error("TLS: {0}")]
    Tls(String),
}

/// A WebSocket used as a byte stream: writes become binary messages, reads
/// concatenate the binary messages received.
pub struct WsIo<S> {
    ws: WebSocketStream<S>,
    pending: Bytes,
}

impl<S> WsIo<S> {
    /// Wrap an open WebSocket.
    pub fn new(ws: WebSocketStream<S>) -> Self {
        WsIo {
            ws,
            pending: Bytes::new(),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for WsIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if !self.pending.is_empty() {
                let n = self.pending.len().min(buf.remaining());
                buf.put_slice(&self.pending[..n]);
                self.pending.advance(n);
                return Poll::Ready(Ok(()));
            }
            match ready!(Pin::new(&mut self.ws).poll_next(cx)) {
                Some(Ok(Message::Binary(b))) => self.pending = b,
                // The peer closed: end of stream.
                Some(Ok(Message::Close(_))) | None => return Poll::Ready(Ok(())),
                // Pings are answered by tungstenite; text and pongs carry nothing.
                Some(Ok(_)) => {}
                Some(Err(e)) => return Poll::Ready(Err(io::Error::other(e))),
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WsIo<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(Pin::new(&mut self.ws).poll_ready(cx)).map_err(io::Error::other)?;
        Pin::new(&mut self.ws)
            .start_send(Message::Binary(Bytes::copy_from_slice(buf)))
            .map_err(io::Error::other)?;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.ws)
            .poll_flush(cx)
            .map_err(io::Error::other)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.ws)
            .poll_close(cx)
            .map_err(io::Error::other)
    }
}

/// A connection accepted on the agent listener: plain h2c, or h2 inside a WebSocket.
pub enum AgentIo {
    /// gRPC over h2c.
    Plain(TcpStream),
    /// gRPC inside a WebSocket, its `:authority` headers made authorities
    /// ([`crate::ws_authority`]).
    Ws(Box<AuthorityFix<WsIo<TcpStream>>>),
}

impl Connected for AgentIo {
    type ConnectInfo = <TcpStream as Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        match self {
            AgentIo::Plain(s) => s.connect_info(),
            AgentIo::Ws(w) => w.get_ref().ws.get_ref().connect_info(),
        }
    }
}

impl AsyncRead for AgentIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            AgentIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            AgentIo::Ws(w) => Pin::new(&mut **w).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for AgentIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            AgentIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            AgentIo::Ws(w) => Pin::new(&mut **w).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            AgentIo::Plain(s) => Pin::new(s).poll_flush(cx),
            AgentIo::Ws(w) => Pin::new(&mut **w).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            AgentIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            AgentIo::Ws(w) => Pin::new(&mut **w).poll_shutdown(cx),
        }
    }
}

/// How long a new connection may take to show what it is (and finish a WebSocket
/// handshake).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accept agent connections on `listener`, h2c or WebSocket, as a stream for
/// `tonic`'s `serve_with_incoming`.
pub fn agent_incoming(
    listener: TcpListener,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<AgentIo>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let stream = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!(error = %e, "agent listener: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                // The server went away.
                _ = tx.closed() => return,
            };
            let _ = stream.set_nodelay(true);
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, classify(stream)).await {
                    Ok(Ok(io)) => {
                        let _ = tx.send(Ok(io)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, "agent connection refused"),
                    Err(_) => tracing::debug!("agent connection: handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

async fn classify(stream: TcpStream) -> io::Result<AgentIo> {
    let mut first = [0u8; 1];
    let n = stream.peek(&mut first).await?;
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "closed at once",
        ));
    }
    if first[0] == b'P' {
        return Ok(AgentIo::Plain(stream));
    }
    let ws = accept_ws_tunnel(stream).await?;
    Ok(AgentIo::Ws(Box::new(AuthorityFix::new(WsIo::new(ws)))))
}

/// Whether a `Sec-WebSocket-Protocol` header value offers `ws-tunnel`.
fn offers_ws_tunnel(value: &str) -> bool {
    value.split(',').any(|p| p.trim() == WS_TUNNEL_PROTOCOL)
}

/// Accept a WebSocket, selecting subprotocol `ws-tunnel`. A client that did not offer
/// it gets the WebSocket closed with 1002 as GitLab's `wstunnel.HttpHandler` closes
/// it, and an error here.
pub async fn accept_ws_tunnel<S>(stream: S) -> io::Result<WebSocketStream<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
    let mut offered = false;
    // tungstenite's callback type: its error is a whole HTTP response.
    #[allow(clippy::result_large_err)]
    let callback = |req: &Request, mut resp: Response| {
        offered = req
            .headers()
            .get_all(http::header::SEC_WEBSOCKET_PROTOCOL)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(offers_ws_tunnel);
        if offered {
            resp.headers_mut().insert(
                http::header::SEC_WEBSOCKET_PROTOCOL,
                http::HeaderValue::from_static(WS_TUNNEL_PROTOCOL),
            );
        }
        Ok(resp)
    };
    let mut ws = tokio_tungstenite::accept_hdr_async(stream, callback)
        .await
        .map_err(io::Error::other)?;
    if !offered {
        use tokio_tungstenite::tungstenite::protocol::CloseFrame;
        use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
        let reason = format!("Expecting {WS_TUNNEL_PROTOCOL:?} subprotocol, got \"\"");
        let _ = ws
            .close(Some(CloseFrame {
                code: CloseCode::Protocol,
                reason: reason.clone().into(),
            }))
            .await;
        return Err(io::Error::new(io::ErrorKind::InvalidData, reason));
    }
    Ok(ws)
}

/// How agentk dials kas, beyond the URL.
#[derive(Clone, Debug, Default)]
pub struct Dial {
    /// CA certificates (PEM) trusted for `grpcs://` and `wss://`, instead of the
    /// system's.
    pub ca_file: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scheme {
    Grpc,
    Grpcs,
    Ws,
    Wss,
}

/// A kas URL: its scheme, `host:port` and host.
fn parse(url: &str) -> Result<(Scheme, String, String), Error> {
    let bad = |why| Error::Url {
        url: url.to_owned(),
        why,
    };
    let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
    let scheme = match scheme {
        "grpc" | "http" => Scheme::Grpc,
        "grpcs" | "https" => Scheme::Grpcs,
        "ws" => Scheme::Ws,
        "wss" => Scheme::Wss,
        _ => return Err(bad("scheme must be grpc://, grpcs://, ws:// or wss://")),
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let uri: http::uri::Authority = authority.parse().map_err(|_| bad("not a valid host"))?;
    let port = uri.port_u16().unwrap_or(match scheme {
        Scheme::Grpc | Scheme::Ws => 80,
        Scheme::Grpcs | Scheme::Wss => 443,
    });
    let host = uri.host().trim_matches(|c| c == '[' || c == ']').to_owned();
    if host.is_empty() {
        return Err(bad("no host"));
    }
    Ok((scheme, format!("{}:{port}", uri.host()), host))
}

/// Check a kas URL without connecting.
pub fn kas_url_check(url: &str) -> Result<(), Error> {
    parse(url).map(|_| ())
}

/// Any byte stream to kas.
trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// A channel to kas at `url` (see the module docs), connected lazily and reconnected
/// by tonic when it breaks. `token` goes on the WebSocket handshake so the proxy can
/// route it. TLS (`grpcs://`, `wss://`) is OpenSSL's, verifying kas's certificate
/// and host name against the system's CAs or `dial.ca_file`.
pub fn kas_channel(url: &str, token: &str, dial: &Dial) -> Result<Channel, Error> {
    let (scheme, authority, host) = parse(url)?;
    let endpoint = Endpoint::from_shared(format!("http://{authority}"))
        .map_err(|_| Error::Url {
            url: url.to_owned(),
            why: "not a valid host:port",
        })?
        .connect_timeout(Duration::from_secs(10))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true);
    if scheme == Scheme::Grpc {
        return Ok(endpoint.connect_lazy());
    }
    let tls = match scheme {
        Scheme::Grpcs => Some(tls_connector(dial, b"\x02h2")?),
        Scheme::Wss => Some(tls_connector(dial, b"\x08http/1.1")?),
        Scheme::Grpc | Scheme::Ws => None,
    };
    let ws_url = url.to_owned();
    let bearer = format!("Bearer {token}");
    let connector = tower::service_fn(move |_: http::Uri| {
        let (ws_url, bearer, authority, host, tls) = (
            ws_url.clone(),
            bearer.clone(),
            authority.clone(),
            host.clone(),
            tls.clone(),
        );
        async move {
            let tcp = TcpStream::connect(&authority).await?;
            tcp.set_nodelay(true)?;
            let stream: Box<dyn Io> = match tls {
                Some(tls) => {
                    let ssl = tls
                        .configure()
                        .and_then(|c| c.into_ssl(&host))
                        .map_err(io::Error::other)?;
                    let mut stream =
                        tokio_openssl::SslStream::new(ssl, tcp).map_err(io::Error::other)?;
                    Pin::new(&mut stream)
                        .connect()
                        .await
                        .map_err(io::Error::other)?;
                    Box::new(stream)
                }
                None => Box::new(tcp),
            };
            let stream: Box<dyn Io> = match scheme {
                Scheme::Ws | Scheme::Wss => {
                    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
                    let mut request = ws_url.into_client_request().map_err(io::Error::other)?;
                    request.headers_mut().insert(
                        http::header::AUTHORIZATION,
                        bearer.parse().map_err(io::Error::other)?,
                    );
                    request.headers_mut().insert(
                        http::header::SEC_WEBSOCKET_PROTOCOL,
                        http::HeaderValue::from_static(WS_TUNNEL_PROTOCOL),
                    );
                    let (ws, _) = tokio_tungstenite::client_async(request, stream)
                        .await
                        .map_err(io::Error::other)?;
                    Box::new(WsIo::new(ws))
                }
                Scheme::Grpc | Scheme::Grpcs => stream,
            };
            Ok::<_, io::Error>(TokioIo::new(stream))
        }
    });
    Ok(endpoint.connect_with_connector_lazy(connector))
}

/// An OpenSSL client offering `alpn` (wire format), trusting `dial.ca_file` or the
/// system's CAs.
fn tls_connector(dial: &Dial, alpn: &[u8]) -> Result<openssl::ssl::SslConnector, Error> {
    let tls_error = |e: openssl::error::ErrorStack| Error::Tls(e.to_string());
    let mut b = openssl::ssl::SslConnector::builder(openssl::ssl::SslMethod::tls_client())
        .map_err(tls_error)?;
    if let Some(ca) = &dial.ca_file {
        b.set_ca_file(ca)
            .map_err(|e| Error::Tls(format!("ca_file {}: {e}", ca.display())))?;
    }
    b.set_alpn_protos(alpn).map_err(tls_error)?;
    Ok(b.build())
}
