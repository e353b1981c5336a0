//! Dialling the Graph API as glab does (gitlab-org/cli
//! `internal/commands/cluster/graph/graph.go` step 4 and `server.go` `handle`): the
//! URL is the Kubernetes API proxy's base with `graph` appended after a `/`; the
//! upgrade offers exactly the subprotocol `gitlab-agent-graph-api` and carries
//! `Authorization: Bearer pat:<agent>:<token>`; messages are read with a 4 MiB limit.
//! A refused upgrade is read whole (status, `Gitlab-Unauthorized`, the Kubernetes
//! `Status` body) so the user sees what kas said.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{self, Error as WsError};

/// The subprotocol the Graph API speaks (glab `server.go` `graphAPISubprotocolName`).
pub(crate) const SUBPROTOCOL: &str = "gitlab-agent-graph-api";
/// glab's read limit: "1MiB is Kubernetes max object size (that'd be the minimum)".
pub(crate) const MAX_MESSAGE: usize = 4 * 1024 * 1024;
/// How long to wait for a connection and its upgrade, and for the rest of a refusal's body.
const DIAL_TIMEOUT: Duration = Duration::from_secs(30);
const BODY_TIMEOUT: Duration = Duration::from_secs(5);
/// At most this much of a refusal's body is kept.
const MAX_BODY: usize = 64 * 1024;

/// Where to dial.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// `ws://…/graph` or `wss://…/graph`.
    pub(crate) url: String,
    /// `host:port` to connect to.
    authority: String,
    /// Host name for TLS (SNI and certificate check), without brackets.
    host: String,
    tls: bool,
}

impl Target {
    /// The Graph API URL for the Kubernetes API proxy base `base` (`http://`,
    /// `https://`, `ws://` or `wss://`): `graph` appended after a `/`, as glab does
    /// with `kas.externalK8sProxyUrl`.
    pub(crate) fn from_proxy_url(base: &str) -> Result<Target, String> {
        let (tls, rest) = if let Some(rest) = base.strip_prefix("http://") {
            (false, rest)
        } else if let Some(rest) = base.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = base.strip_prefix("ws://") {
            (false, rest)
        } else if let Some(rest) = base.strip_prefix("wss://") {
            (true, rest)
        } else {
            return Err(format!(
                "--url {base:?}: must start with http://, https://, ws:// or wss://"
            ));
        };
        let mut url = format!("{}://{rest}", if tls { "wss" } else { "ws" });
        if !url.ends_with('/') {
            url.push('/');
        }
        url.push_str("graph");
        let uri: http::Uri = url
            .parse()
            .map_err(|e| format!("--url {base:?}: not a valid URL: {e}"))?;
        let host = uri
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| format!("--url {base:?}: no host"))?;
        let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
        Ok(Target {
            authority: format!("{host}:{port}"),
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            url,
            tls,
        })
    }
}

/// Why the WebSocket could not be opened.
#[derive(Debug)]
pub(crate) enum DialError {
    /// The server answered the upgrade with something other than 101.
    Refused {
        /// The HTTP status.
        status: http::StatusCode,
        /// `Gitlab-Unauthorized: true` was present (kas refused the credentials).
        gitlab_unauthorized: bool,
        /// The response body (at most 64 KiB).
        body: Vec<u8>,
    },
    /// The server upgraded without agreeing to `gitlab-agent-graph-api`.
    Subprotocol(String),
    /// Connecting, TLS, or the handshake failed.
    Transport(String),
}

impl std::fmt::Display for DialError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DialError::Refused {
                status,
                gitlab_unauthorized,
                body,
            } => {
                write!(f, "the server refused the WebSocket upgrade: HTTP {status}")?;
                if let Some(message) = status_message(body) {
                    write!(f, ": {message}")?;
                } else if !body.is_empty() {
                    let text = String::from_utf8_lossy(body);
                    let text: String = text.trim().chars().take(2000).collect();
                    write!(f, ": {text}")?;
                }
                if *gitlab_unauthorized {
                    write!(
                        f,
                        " (Gitlab-Unauthorized: true: kas refused the credentials, not the cluster)"
                    )?;
                }
                Ok(())
            }
            DialError::Subprotocol(why) => write!(
                f,
                "the server did not accept the WebSocket subprotocol {SUBPROTOCOL}: {why}"
            ),
            DialError::Transport(why) => write!(f, "WebSocket dial: {why}"),
        }
    }
}

/// The `message` of a Kubernetes `Status` body, if `body` is one.
fn status_message(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    if v.get("kind")?.as_str()? != "Status" {
        return None;
    }
    Some(v.get("message")?.as_str()?.to_owned())
}

/// Any byte stream to the server.
pub(crate) trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// The stream the WebSocket runs on, shared so that after a refused upgrade (which
/// consumes the handshake's stream) the rest of the response body can still be read.
pub(crate) struct Shared(Arc<Mutex<Box<dyn Io>>>);

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Box<dyn Io>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl AsyncRead for Shared {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut **self.lock()).poll_read(cx, buf)
    }
}

impl AsyncWrite for Shared {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut **self.lock()).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut **self.lock()).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut **self.lock()).poll_shutdown(cx)
    }
}

/// An open Graph API WebSocket.
pub(crate) type Socket = WebSocketStream<Shared>;

/// Connect to `target` and upgrade with `authorization` (the whole header value).
pub(crate) async fn connect(target: &Target, authorization: &str) -> Result<Socket, DialError> {
    match tokio::time::timeout(DIAL_TIMEOUT, connect_inner(target, authorization)).await {
        Ok(r) => r,
        Err(_) => Err(DialError::Transport(format!(
            "no upgrade from {} within {} s",
            target.authority,
            DIAL_TIMEOUT.as_secs()
        ))),
    }
}

async fn connect_inner(target: &Target, authorization: &str) -> Result<Socket, DialError> {
    let transport = |e: &dyn std::fmt::Display| DialError::Transport(e.to_string());
    let tcp = TcpStream::connect(&target.authority)
        .await
        .map_err(|e| DialError::Transport(format!("connecting to {}: {e}", target.authority)))?;
    tcp.set_nodelay(true).map_err(|e| transport(&e))?;
    let stream: Box<dyn Io> = if target.tls {
        Box::new(tls(tcp, &target.host).await?)
    } else {
        Box::new(tcp)
    };
    let shared = Arc::new(Mutex::new(stream));

    let mut request = target
        .url
        .as_str()
        .into_client_request()
        .map_err(|e| transport(&e))?;
    let headers = request.headers_mut();
    headers.insert(
        http::header::AUTHORIZATION,
        // The value holds the token: never echo it in the error.
        http::HeaderValue::from_str(authorization).map_err(|_| {
            DialError::Transport("the token contains characters a header cannot carry".into())
        })?,
    );
    headers.insert(
        http::header::SEC_WEBSOCKET_PROTOCOL,
        http::HeaderValue::from_static(SUBPROTOCOL),
    );
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE));
    match tokio_tungstenite::client_async_with_config(
        request,
        Shared(Arc::clone(&shared)),
        Some(config),
    )
    .await
    {
        Ok((ws, _)) => Ok(ws),
        Err(WsError::Http(resp)) => {
            let gitlab_unauthorized = resp
                .headers()
                .get("gitlab-unauthorized")
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
            let mut body = resp.body().clone().unwrap_or_default();
            let mut rest = Shared(shared);
            let _ = tokio::time::timeout(
                BODY_TIMEOUT,
                read_rest_of_body(&mut rest, resp.headers(), &mut body),
            )
            .await;
            if is_chunked(resp.headers()) {
                body = dechunk(&body).unwrap_or(body);
            }
            body.truncate(MAX_BODY);
            Err(DialError::Refused {
                status: resp.status(),
                gitlab_unauthorized,
                body,
            })
        }
        Err(WsError::Protocol(
            tungstenite::error::ProtocolError::SecWebSocketSubProtocolError(e),
        )) => Err(DialError::Subprotocol(e.to_string())),
        Err(e) => Err(transport(&e)),
    }
}

fn is_chunked(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::TRANSFER_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
}

/// Read what the handshake did not of a refusal's body: up to `Content-Length`, to
/// the end of a chunked body, or to the end of the connection.
async fn read_rest_of_body(
    stream: &mut Shared,
    headers: &http::HeaderMap,
    body: &mut Vec<u8>,
) -> io::Result<()> {
    let length: Option<usize> = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok());
    let chunked = is_chunked(headers);
    let mut buf = [0u8; 8192];
    loop {
        let done = match length {
            Some(n) => body.len() >= n,
            None if chunked => dechunk(body).is_some(),
            None => false,
        };
        if done || body.len() >= MAX_BODY {
            return Ok(());
        }
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        body.extend_from_slice(&buf[..n]);
    }
}

/// A complete chunked body, decoded; `None` while incomplete or malformed.
fn dechunk(mut raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = raw.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&raw[..line_end]).ok()?;
        let size_text = size_text.split(';').next()?.trim();
        let size = usize::from_str_radix(size_text, 16).ok()?;
        raw = &raw[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        if raw.len() < size + 2 {
            return None;
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

/// TLS (OpenSSL, the system's CAs, host name checked) for `wss://`.
async fn tls(tcp: TcpStream, host: &str) -> Result<tokio_openssl::SslStream<TcpStream>, DialError> {
    let tls_error = |e: &dyn std::fmt::Display| DialError::Transport(format!("TLS: {e}"));
    let mut builder = openssl::ssl::SslConnector::builder(openssl::ssl::SslMethod::tls_client())
        .map_err(|e| tls_error(&e))?;
    builder
        .set_alpn_protos(b"\x08http/1.1")
        .map_err(|e| tls_error(&e))?;
    let ssl = builder
        .build()
        .configure()
        .and_then(|c| c.into_ssl(host))
        .map_err(|e| tls_error(&e))?;
    let mut stream = tokio_openssl::SslStream::new(ssl, tcp).map_err(|e| tls_error(&e))?;
    Pin::new(&mut stream)
        .connect()
        .await
        .map_err(|e| tls_error(&e))?;
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_as_glab_builds_it() {
        let t =
            Target::from_proxy_url("http://127.0.0.1:8080/-/kubernetes-agent/k8s-proxy/").unwrap();
        assert_eq!(
            t.url,
            "ws://127.0.0.1:8080/-/kubernetes-agent/k8s-proxy/graph"
        );
        assert_eq!(t.authority, "127.0.0.1:8080");
        let t = Target::from_proxy_url("https://kas.example.com/k8s-proxy").unwrap();
        assert_eq!(t.url, "wss://kas.example.com/k8s-proxy/graph");
        assert_eq!(t.authority, "kas.example.com:443");
        assert!(t.tls);
        let t = Target::from_proxy_url("ws://[::1]:9/").unwrap();
        assert_eq!(t.url, "ws://[::1]:9/graph");
        assert_eq!(t.host, "::1");
        assert!(Target::from_proxy_url("ftp://x/").is_err());
        assert!(Target::from_proxy_url("http:///x").is_err());
    }

    #[test]
    fn chunked_bodies() {
        assert_eq!(
            dechunk(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").unwrap(),
            b"abcde"
        );
        assert!(dechunk(b"3\r\nabc\r\n2\r\nd").is_none());
    }

    #[test]
    fn refusal_names_the_status_message() {
        let e = DialError::Refused {
            status: http::StatusCode::UNAUTHORIZED,
            gitlab_unauthorized: true,
            body: br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"GitLab Agent Server: Unauthorized","reason":"Unauthorized","code":401}"#.to_vec(),
        };
        let s = e.to_string();
        assert!(
            s.contains("HTTP 401 Unauthorized: GitLab Agent Server: Unauthorized"),
            "{s}"
        );
        assert!(s.contains("Gitlab-Unauthorized: true"), "{s}");
    }
}
