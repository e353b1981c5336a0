//! Dialling kas as GitLab's agentk does (`cmd/agentk/agentkapp/app.go`,
//! `internal/tool/wstunnel/client.go`): cleartext HTTP/2, or HTTP/2 inside a
//! WebSocket that asks for subprotocol `ws-tunnel` and carries the bytes in binary
//! messages (`websocket.NetConn(…, websocket.MessageBinary)`).
//!
//! One known difference: grpc-go dials a WebSocket kas as target `passthrough:ws://…`
//! and so sends `:authority` `ws://host:port`; `http::Uri` cannot hold that authority,
//! so this dialler sends `host:port`.
//! <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/tool/wstunnel/client.go>

use futures_util::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};
use tonic::transport::{Channel, Endpoint};

use super::agentk::Transport;
use super::proto::gitlab::agent::entity::AgentMeta;

/// The subprotocol GitLab's WebSocket tunnel asks for (`wstunnel/api.go`).
pub const WS_TUNNEL: &str = "ws-tunnel";

/// A lazily connecting channel to kas at `address` (`host:port`, for a WebSocket
/// optionally followed by a path, e.g. `host:port/-/kubernetes-agent/`), with GitLab
/// agentk's user agent `gitlab-agent/<version>/<commit>`.
pub fn dial(
    address: &str,
    transport: Transport,
    meta: &AgentMeta,
) -> Result<Channel, tonic::transport::Error> {
    let host = address.split('/').next().unwrap_or(address);
    let endpoint = Endpoint::from_shared(format!("http://{host}"))?
        .user_agent(format!("gitlab-agent/{}/{}", meta.version, meta.commit_id))?;
    Ok(match transport {
        Transport::H2c => endpoint.connect_lazy(),
        Transport::WebSocket => {
            let url = format!("ws://{address}");
            endpoint.connect_with_connector_lazy(tower::service_fn(move |_: http::Uri| {
                let url = url.clone();
                async move { ws_connect(&url).await.map(TokioIo::new) }
            }))
        }
    })
}

/// Opens the WebSocket and pipes it to one end of an in-memory duplex, whose other
/// end is returned for HTTP/2.
async fn ws_connect(url: &str) -> std::io::Result<tokio::io::DuplexStream> {
    let mut req = url.into_client_request().map_err(std::io::Error::other)?;
    req.headers_mut().insert(
        "sec-websocket-protocol",
        http::HeaderValue::from_static(WS_TUNNEL),
    );
    let (ws, resp) = tokio_tungstenite::connect_async(req)
        .await
        .map_err(std::io::Error::other)?;
    let chosen = resp
        .headers()
        .get("sec-websocket-protocol")
        .and_then(|v| v.to_str().ok());
    if chosen != Some(WS_TUNNEL) {
        // nhooyr.io/websocket fails the dial when the server selects another protocol.
        return Err(std::io::Error::other(format!(
            "kas selected subprotocol {chosen:?}, not {WS_TUNNEL}"
        )));
    }
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    tokio::spawn(pump(ws, theirs));
    Ok(ours)
}

/// Copies bytes between a WebSocket (binary messages) and `io` until either closes.
pub async fn pump<S>(ws: tokio_tungstenite::WebSocketStream<S>, io: tokio::io::DuplexStream)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut stream) = ws.split();
    let (mut read, mut write) = tokio::io::split(io);
    let up = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = read.read(&mut buf).await?;
            if n == 0 {
                let _ = sink.send(Message::Close(None)).await;
                return Ok::<_, std::io::Error>(());
            }
            sink.send(Message::Binary(buf[..n].to_vec().into()))
                .await
                .map_err(std::io::Error::other)?;
        }
    };
    let down = async {
        while let Some(msg) = stream.next().await {
            match msg.map_err(std::io::Error::other)? {
                Message::Binary(b) => write.write_all(&b).await?,
                Message::Close(_) => break,
                _ => {}
            }
        }
        write.shutdown().await
    };
    let _ = tokio::try_join!(up, down);
}

/// Accepts WebSockets on `listener` as GitLab's kas does (`wstunnel/server.go`):
/// subprotocol `ws-tunnel` selected when asked for, and a socket that did not ask
/// closed; each accepted socket's bytes come out of a duplex sent to `sink`.
pub async fn accept_ws(
    listener: tokio::net::TcpListener,
    sink: tokio::sync::mpsc::Sender<tokio::io::DuplexStream>,
) {
    use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            return;
        };
        let sink = sink.clone();
        tokio::spawn(async move {
            let mut chosen = false;
            // tungstenite's callback type fixes the large error variant.
            #[allow(clippy::result_large_err)]
            let callback = |req: &Request, mut resp: Response| {
                let asked = req
                    .headers()
                    .get_all("sec-websocket-protocol")
                    .iter()
                    .any(|v| {
                        v.to_str()
                            .is_ok_and(|v| v.split(',').any(|p| p.trim() == WS_TUNNEL))
                    });
                if asked {
                    resp.headers_mut().insert(
                        "sec-websocket-protocol",
                        http::HeaderValue::from_static(WS_TUNNEL),
                    );
                    chosen = true;
                }
                Ok(resp)
            };
            let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(tcp, callback).await else {
                return;
            };
            if !chosen {
                let _ = ws.close(None).await;
                return;
            }
            let (ours, theirs) = tokio::io::duplex(64 * 1024);
            tokio::spawn(pump(ws, theirs));
            let _ = sink.send(ours).await;
        });
    }
}
