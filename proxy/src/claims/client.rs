//! A client of the Topology Service's REST classify (`POST /v1/classify`), as GitLab's
//! HTTP Router calls it: the path's claim chain as proto3 JSON, the owning Cell's
//! `proxy.address` back, `404` for a claim no Cell holds.

use std::pin::Pin;

use openssl::ssl::SslConnector;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;

use super::PathClaim;

/// Why a classification got no answer (the request then falls through to the
/// token rules).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The service could not be reached or broke the connection.
    #[error("topology service at {addr}: {source}")]
    Io {
        /// Its address, `host:port`.
        addr: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// It answered with a status other than 200 or 404.
    #[error("topology service answered {status}: {body}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// The start of its body.
        body: String,
    },
    /// Its answer was not a classification.
    #[error("topology service answered something else: {0}")]
    Malformed(String),
}

/// The request body for `claim`: a route asks for the route, then the redirect
/// route of the same path (GitLab's router expands a route lookup so).
pub fn body(claim: &PathClaim) -> String {
    let json = |s: &str| serde_json::Value::from(s).to_string();
    match claim {
        PathClaim::Route(r) => {
            format!(
                "{{\"claims\":[{{\"route\":{0}}},{{\"redirectRoute\":{0}}}]}}",
                json(r)
            )
        }
        PathClaim::Organization(o) => {
            format!("{{\"claims\":[{{\"organizationPath\":{}}}]}}", json(o))
        }
    }
}

/// TLS to the service: the connector (the CA, the client certificate) and the
/// name its certificate must carry.
pub struct Tls {
    /// The connector.
    pub connector: SslConnector,
    /// The server's name (a DNS name or an IP address).
    pub server_name: String,
}

/// Classifies `claim` at `addr` (`host:port`, a DNS name resolved at each call,
/// or an IP address; over `tls` when given): `Ok(Some(address))` of the owning
/// Cell, `Ok(None)` when no Cell holds it. The caller bounds the time.
pub async fn classify(
    addr: &str,
    tls: Option<&Tls>,
    claim: &PathClaim,
) -> Result<Option<String>, Error> {
    let io = |source| Error::Io {
        addr: addr.to_owned(),
        source,
    };
    let tcp = TcpStream::connect(addr).await.map_err(io)?;
    tcp.set_nodelay(true).map_err(io)?;
    match tls {
        None => exchange(addr, tcp, claim).await,
        Some(t) => {
            let ssl = t
                .connector
                .configure()
                .and_then(|c| c.into_ssl(&t.server_name))
                .map_err(|e| io(std::io::Error::other(e)))?;
            let mut s = tokio_openssl::SslStream::new(ssl, tcp)
                .map_err(|e| io(std::io::Error::other(e)))?;
            Pin::new(&mut s)
                .connect()
                .await
                .map_err(|e| io(std::io::Error::other(e)))?;
            exchange(addr, s, claim).await
        }
    }
}

/// One request and its response on `s`.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    addr: &str,
    mut s: S,
    claim: &PathClaim,
) -> Result<Option<String>, Error> {
    let io = |source| Error::Io {
        addr: addr.to_owned(),
        source,
    };
    let body = body(claim);
    let head = format!(
        "POST /v1/classify HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         accept: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.map_err(io)?;
    s.write_all(body.as_bytes()).await.map_err(io)?;
    let mut raw = Vec::with_capacity(512);
    // An answer is a few hundred bytes; more is not a classification.
    (&mut s)
        .take(64 * 1024)
        .read_to_end(&mut raw)
        .await
        .map_err(io)?;
    let (status, body) = response(&raw)?;
    match status {
        200 => {
            let v: serde_json::Value =
                serde_json::from_slice(body).map_err(|e| Error::Malformed(e.to_string()))?;
            let address = v["proxy"]["address"]
                .as_str()
                .filter(|a| !a.is_empty() && v["action"] == "PROXY")
                .ok_or_else(|| Error::Malformed(v.to_string()))?;
            Ok(Some(address.to_owned()))
        }
        404 => Ok(None),
        _ => Err(Error::Status {
            status,
            body: String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
        }),
    }
}

/// The status and body of a whole HTTP/1.1 response read to its close.
fn response(raw: &[u8]) -> Result<(u16, &[u8]), Error> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut r = httparse::Response::new(&mut headers);
    let n = match r.parse(raw) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => return Err(Error::Malformed("an incomplete HTTP response".into())),
    };
    let status = r.code.unwrap_or(0);
    let chunked = r.headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("transfer-encoding")
            && String::from_utf8_lossy(h.value)
                .to_ascii_lowercase()
                .contains("chunked")
    });
    let body = &raw[n..];
    if chunked {
        // An answer this small comes in one chunk: its data, between the size
        // line and the trailing CRLF.
        let line = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| Error::Malformed("a chunked body without a size".into()))?;
        let size = usize::from_str_radix(
            std::str::from_utf8(&body[..line])
                .unwrap_or("")
                .split(';')
                .next()
                .unwrap_or("")
                .trim(),
            16,
        )
        .map_err(|_| Error::Malformed("a chunk size".into()))?;
        let data = body
            .get(line + 2..line + 2 + size)
            .ok_or_else(|| Error::Malformed("a short chunk".into()))?;
        return Ok((status, data));
    }
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_the_routers_claim_chains() {
        assert_eq!(
            body(&PathClaim::Route("gitlab-org".into())),
            r#"{"claims":[{"route":"gitlab-org"},{"redirectRoute":"gitlab-org"}]}"#
        );
        assert_eq!(
            body(&PathClaim::Organization("a\"b".into())),
            r#"{"claims":[{"organizationPath":"a\"b"}]}"#
        );
    }

    #[test]
    fn responses_plain_and_chunked() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(response(plain).unwrap(), (200, &b"{}"[..]));
        let chunked =
            b"HTTP/1.1 404 Not Found\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
        assert_eq!(response(chunked).unwrap(), (404, &b"abc"[..]));
        assert!(response(b"HTTP/1.1 200").is_err());
    }
}
