//! gRPC inside a WebSocket, as gitlab-runner dials a `ws://` router: written from
//! `router/internal/wstunnel/client.go` and `netconn.go`, and the `ws` case of
//! `router/client_conn_factory.go` (gitlabhq/gitlab-runner, commit d79f3e7b).
//!
//! The WebSocket is opened on the router's URL itself with subprotocol `ws-tunnel`
//! and the upgrade headers `Authorization: Bearer <runner token>` and `User-Agent`;
//! then every write of HTTP/2 bytes is one binary message, and reads run through the
//! binary messages received as one byte stream ([`WsConn`]). A received text message
//! is an error (and a close `1003`); a close `1000` or `1001`, or the end of the
//! stream, is end of file; messages over 10 MiB are refused ("matches kas limit").
//!
//! Differences from gitlab-runner's: no TLS (`wss`) and no HTTP proxy from the
//! environment; no write deadlines (tokio has none; hyper's own timers stand in);
//! tungstenite refuses an upgrade answer that names no subprotocol, where gorilla
//! accepts it.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use futures_util::{Sink, Stream};
use http::{HeaderValue, Uri};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// `tunnelWebSocketProtocol`: the subprotocol both ends name.
pub const SUBPROTOCOL: &str = "ws-tunnel";
/// `webSocketMaxMessageSize`.
pub const MAX_MESSAGE: usize = 10 * 1024 * 1024;

/// The WebSocket settings of both ends: messages (and frames) up to [`MAX_MESSAGE`].
pub fn config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE))
}

/// A WebSocket as a byte stream (`netConn`): binary messages in both directions.
pub struct WsConn<S> {
    ws: WebSocketStream<S>,
    /// What is left of the message being read.
    reading: Bytes,
    eof: bool,
}

impl<S> WsConn<S> {
    pub fn new(ws: WebSocketStream<S>) -> WsConn<S> {
        WsConn {
            ws,
            reading: Bytes::new(),
            eof: false,
        }
    }
}

fn broken(e: tungstenite::Error) -> io::Error {
    match e {
        tungstenite::Error::Io(e) => e,
        e => io::Error::other(e),
    }
}

impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> AsyncRead for WsConn<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        while this.reading.is_empty() {
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            match ready!(Pin::new(&mut this.ws).poll_next(cx)) {
                Some(Ok(Message::Binary(data))) => this.reading = data,
                // tungstenite answers pings itself.
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                Some(Ok(Message::Close(frame))) => {
                    // `IsUnexpectedCloseError(err, CloseNormalClosure, CloseGoingAway)`.
                    match frame.map(|f| f.code) {
                        None | Some(CloseCode::Normal | CloseCode::Away) => this.eof = true,
                        Some(code) => {
                            return Poll::Ready(Err(io::Error::new(
                                io::ErrorKind::ConnectionReset,
                                format!("websocket closed with {code}"),
                            )));
                        }
                    }
                }
                Some(Ok(other)) => {
                    // Go writes a close `CloseUnsupportedData` and fails the read.
                    let _ = Pin::new(&mut this.ws).start_send(Message::Close(Some(CloseFrame {
                        code: CloseCode::Unsupported,
                        reason: "unexpected frame type read (expected BinaryMessage)".into(),
                    })));
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("unexpected frame type read (expected BinaryMessage): {other:?}"),
                    )));
                }
                Some(Err(e)) => return Poll::Ready(Err(broken(e))),
                None => this.eof = true,
            }
        }
        let n = this.reading.len().min(buf.remaining());
        buf.put_slice(&this.reading[..n]);
        this.reading.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> AsyncWrite for WsConn<S> {
    /// One binary message per write, as Go's `Write`.
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let ws = &mut self.ws;
        ready!(Pin::new(&mut *ws).poll_ready(cx)).map_err(broken)?;
        Pin::new(&mut *ws)
            .start_send(Message::Binary(Bytes::copy_from_slice(buf)))
            .map_err(broken)?;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.ws).poll_flush(cx).map_err(broken)
    }

    /// A close `1000`, as Go's `Close`.
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match ready!(Pin::new(&mut self.ws).poll_close(cx)) {
            Ok(()) | Err(tungstenite::Error::ConnectionClosed) => Poll::Ready(Ok(())),
            Err(e) => Poll::Ready(Err(broken(e))),
        }
    }
}

/// The accepting side of the same tunnel (the fake kas in these tests serves gRPC on it).
impl<S> tonic::transport::server::Connected for WsConn<S> {
    type ConnectInfo = ();

    fn connect_info(&self) {}
}

/// `DialerForGRPC`: the WebSocket to `url`, as a byte stream.
pub async fn dial(
    url: &str,
    token: &str,
    user_agent: &str,
) -> Result<WsConn<MaybeTlsStream<TcpStream>>, tungstenite::Error> {
    let mut req = url.into_client_request()?;
    let header = |v: &str| {
        HeaderValue::from_str(v).map_err(|e| tungstenite::Error::HttpFormat(http::Error::from(e)))
    };
    let headers = req.headers_mut();
    headers.insert("sec-websocket-protocol", header(SUBPROTOCOL)?);
    headers.insert("authorization", header(&format!("Bearer {token}"))?);
    headers.insert("user-agent", header(user_agent)?);
    let (ws, _) = tokio_tungstenite::connect_async_with_config(req, Some(config()), true).await?;
    Ok(WsConn::new(ws))
}

/// The connector tonic dials with for a `ws://` router: every connection is a new
/// WebSocket to the router's URL, whatever URI tonic asks for (grpc-go's
/// `passthrough:` target hands the dialer the URL the same way).
#[derive(Clone, Debug)]
pub struct Connector {
    pub url: String,
    pub token: String,
    pub user_agent: String,
}

type Dialing = Pin<
    Box<
        dyn Future<Output = Result<TokioIo<WsConn<MaybeTlsStream<TcpStream>>>, tungstenite::Error>>
            + Send,
    >,
>;

impl tonic::codegen::Service<Uri> for Connector {
    type Response = TokioIo<WsConn<MaybeTlsStream<TcpStream>>>;
    type Error = tungstenite::Error;
    type Future = Dialing;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let c = self.clone();
        Box::pin(async move {
            dial(&c.url, &c.token, &c.user_agent)
                .await
                .map(TokioIo::new)
        })
    }
}
