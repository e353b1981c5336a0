//! Mutual TLS on the service's listener, and who a caller is by its certificate.
//!
//! GitLab's Topology Service knows three kinds of caller, each with its own client
//! certificate: a Cell (its Rails, gitlab-shell, mail room), the HTTP Router, and an
//! administrator. How GitLab encodes the role in the certificate was not available
//! to us; podgate reads it from the certificate's subject:
//!
//! - `OU=cell` and `CN=cell-<id>`: the Cell `<id>`;
//! - `OU=router`: the HTTP Router;
//! - `OU=admin`: an administrator.
//!
//! A client certificate not signed by `client_ca`, or none, fails the handshake; a
//! valid one without a known role is unauthenticated (every method refuses it).

use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};

use openssl::nid::Nid;
use openssl::ssl::{Ssl, SslAcceptor, SslFiletype, SslMethod, SslVerifyMode};
use openssl::x509::X509Ref;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_openssl::SslStream;

use crate::access::Caller;

/// `[tls]`: the listener's certificate and the CA its callers' certificates are
/// signed by.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// The server certificate (PEM, the chain after it).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The CA that signs callers' certificates (PEM).
    pub client_ca: PathBuf,
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("tls.{field} ({path}): {source}")]
pub struct Error {
    field: &'static str,
    path: String,
    #[source]
    source: openssl::error::ErrorStack,
}

/// The acceptor for `config`: TLS 1.2 or later, a client certificate required.
pub fn acceptor(config: &TlsConfig) -> Result<SslAcceptor, Error> {
    let err = |field, path: &PathBuf| {
        let path = path.display().to_string();
        move |source| Error {
            field,
            path,
            source,
        }
    };
    let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())
        .map_err(err("cert", &config.cert))?;
    b.set_certificate_chain_file(&config.cert)
        .map_err(err("cert", &config.cert))?;
    b.set_private_key_file(&config.key, SslFiletype::PEM)
        .map_err(err("key", &config.key))?;
    b.check_private_key().map_err(err("key", &config.key))?;
    b.set_ca_file(&config.client_ca)
        .map_err(err("client_ca", &config.client_ca))?;
    b.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
    // gRPC wants h2 by ALPN; HTTP/1.1 for the REST mapping.
    b.set_alpn_select_callback(|_, offered| {
        openssl::ssl::select_next_proto(b"\x02h2\x08http/1.1", offered)
            .ok_or(openssl::ssl::AlpnError::NOACK)
    });
    Ok(b.build())
}

/// The caller a client certificate names (see the module docs).
pub fn caller_of(cert: &X509Ref) -> Option<Caller> {
    let entry = |nid| {
        cert.subject_name()
            .entries_by_nid(nid)
            .next()
            .and_then(|e| std::str::from_utf8(e.data().as_slice()).ok())
            .map(str::to_owned)
    };
    match entry(Nid::ORGANIZATIONALUNITNAME)?.as_str() {
        "router" => Some(Caller::Router),
        "admin" => Some(Caller::Admin),
        "cell" => entry(Nid::COMMONNAME)?
            .strip_prefix("cell-")?
            .parse()
            .ok()
            .filter(|id: &i64| *id > 0)
            .map(Caller::Cell),
        _ => None,
    }
}

/// A caller's TLS connection: the stream, and who it is.
pub struct Conn {
    stream: SslStream<TcpStream>,
    caller: Option<Caller>,
}

impl Conn {
    /// Completes the handshake on `tcp`.
    pub async fn accept(acceptor: &SslAcceptor, tcp: TcpStream) -> std::io::Result<Self> {
        let ssl = Ssl::new(acceptor.context()).map_err(std::io::Error::other)?;
        let mut stream = SslStream::new(ssl, tcp).map_err(std::io::Error::other)?;
        Pin::new(&mut stream)
            .accept()
            .await
            .map_err(std::io::Error::other)?;
        let caller = stream.ssl().peer_certificate().and_then(|c| caller_of(&c));
        Ok(Conn { stream, caller })
    }
}

/// What tonic puts in each request's extensions for a TLS connection.
#[derive(Clone, Copy, Debug)]
pub struct CallerInfo(pub Option<Caller>);

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = CallerInfo;
    fn connect_info(&self) -> CallerInfo {
        CallerInfo(self.caller)
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
