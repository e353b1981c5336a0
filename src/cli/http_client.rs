//! The HTTP/1.1 requests the commands make themselves (`podgate up` reading the
//! proxy's admin listener, the drills' probe and ledger check, `podgate
//! workspaces`): hyper's client, one connection per request, so each request sees
//! the server as it is now (a listener handed over, a Pod restarted).

pub(crate) use http::Method;
use http::{HeaderMap, HeaderValue, Request, StatusCode, header};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

/// The largest response body read.
pub(crate) const MAX_BODY: usize = 64 << 20;

/// Why a request got no response.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// No connection; the server may not be up yet.
    #[error("{0}")]
    Connect(#[source] std::io::Error),
    /// The exchange failed: a reset, a malformed response.
    #[error("{0}")]
    Http(#[source] hyper::Error),
    /// The body broke off, or was over [`MAX_BODY`].
    #[error("reading the body: {0}")]
    Body(String),
}

/// A response, its body read whole.
#[derive(Debug)]
pub(crate) struct Response {
    pub(crate) status: StatusCode,
    /// The status line's reason phrase (the canonical one when the server sent that).
    pub(crate) reason: String,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Response {
    /// The body as text (lossy).
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Send `request` (its URI a path; `host` as given) to `addr` on a new connection.
pub(crate) async fn send(
    addr: impl tokio::net::ToSocketAddrs,
    request: Request<Full<Bytes>>,
) -> Result<Response, Error> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(Error::Connect)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(Error::Http)?;
    // Drives the connection until the response is read (dropped with the task).
    let conn = tokio::spawn(conn);
    let response = sender.send_request(request).await.map_err(Error::Http)?;
    let (parts, body) = response.into_parts();
    let body = Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map_err(|e| Error::Body(e.to_string()))?
        .to_bytes();
    conn.abort();
    let reason = parts
        .extensions
        .get::<hyper::ext::ReasonPhrase>()
        .map(|r| String::from_utf8_lossy(r.as_bytes()).into_owned())
        .or_else(|| parts.status.canonical_reason().map(str::to_owned))
        .unwrap_or_default();
    Ok(Response {
        status: parts.status,
        reason,
        headers: parts.headers,
        body,
    })
}

/// A request for `send`: `method path` with `host`, `connection: close`, and `body`
/// as JSON when there is one.
pub(crate) fn request(
    method: Method,
    host: &str,
    path: &str,
    json: Option<String>,
) -> Request<Full<Bytes>> {
    let mut r = Request::builder()
        .method(method)
        .uri(path)
        .header(header::CONNECTION, "close");
    if let Ok(host) = HeaderValue::from_str(host) {
        r = r.header(header::HOST, host);
    }
    if json.is_some() {
        r = r.header(header::CONTENT_TYPE, "application/json");
    }
    r.body(Full::new(Bytes::from(json.unwrap_or_default())))
        .expect("a path and plain header values make a valid request")
}

/// `GET path` on `addr`: the status code and the body, `None` when no response came.
pub(crate) async fn get(addr: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    let r = send(addr, request(Method::GET, &addr.to_string(), path, None))
        .await
        .ok()?;
    Some((r.status.as_u16(), r.text()))
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// A server that answers every connection with `raw` once it has read the head.
    async fn answering(raw: &'static [u8]) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = s.write_all(raw).await;
            }
        });
        addr
    }

    #[tokio::test]
    async fn reads_chunked_bodies_and_reasons() {
        let addr = answering(
            b"HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\nretry-after: 3\r\n\r\n3\r\n{\"a\r\n4;x=y\r\n\":1}\r\n0\r\n\r\n",
        )
        .await;
        let r = send(addr, request(Method::POST, "x", "/p", Some("{}".into())))
            .await
            .unwrap();
        assert_eq!((r.status.as_u16(), r.reason.as_str()), (400, "Bad Request"));
        assert_eq!(r.text(), r#"{"a":1}"#);
        assert_eq!(r.headers["retry-after"], "3");
        let addr = answering(b"HTTP/1.1 418 Short And Stout\r\ncontent-length: 0\r\n\r\n").await;
        let r = send(addr, request(Method::GET, "x", "/", None))
            .await
            .unwrap();
        assert_eq!(r.reason, "Short And Stout");
    }

    #[tokio::test]
    async fn a_body_cut_short_is_an_error() {
        let addr = answering(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n{}").await;
        assert!(matches!(
            send(addr, request(Method::GET, "x", "/", None)).await,
            Err(Error::Body(_))
        ));
        assert_eq!(get(addr, "/").await, None);
    }
}
