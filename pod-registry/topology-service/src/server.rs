//! One listener for everything: gRPC over h2c (the Topology Service's services and
//! gRPC health) and the REST mapping over HTTP/1.1, as GitLab's Topology Service
//! answers both on one port.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::service::Routes;

use crate::access::Caller;
use crate::cells::Cells;
use crate::claims::Store;
use crate::claims::memory::Memory;
use crate::claims::redis::{RedisClaims, Target};
use crate::config::Config;
use crate::grpc::{CellService, ClaimService, Classify, Health, TopologyService};
use crate::proto::gitlab::cells::topology_service::cell_service_server::CellServiceServer;
use crate::proto::gitlab::cells::topology_service::claims::v1::claim_service_server::ClaimServiceServer;
use crate::proto::gitlab::cells::topology_service::classify_service_server::ClassifyServiceServer;
use crate::proto::grpc::health::v1::health_server::HealthServer;
use podgate_registry::BackendConfig;

/// Why the service stopped or could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The listen address could not be bound.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The listener's address could not be read.
    #[error("the listener's address: {0}")]
    LocalAddr(#[source] std::io::Error),
    /// Serving failed.
    #[error("serving: {0}")]
    Serve(#[from] tonic::transport::Error),
    /// The claims store could not be opened.
    #[error("opening the claims store: {0}")]
    Claims(#[from] crate::claims::Error),
    /// TLS could not be set up.
    #[error("{0}")]
    Tls(#[from] crate::tls::Error),
}

/// Largest request message: Rails' client allows 10 MiB
/// (`grpc.max_receive_message_length` in
/// `lib/gitlab/topology_service_client/base_service.rb`), and a `BeginUpdate` of a
/// large batch comes near.
const MAX_MESSAGE: usize = 10 * 1024 * 1024;

/// A bound, not yet serving, Topology Service.
pub struct Bound {
    listener: TcpListener,
    service: Arc<TopologyService>,
    tls: Option<openssl::ssl::SslAcceptor>,
}

impl Bound {
    /// Binds `config.listen`. Without TLS, every caller is an administrator.
    pub async fn bind(config: &Config) -> Result<Self, Error> {
        let tls = config.tls.as_ref().map(crate::tls::acceptor).transpose()?;
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| Error::Bind {
                addr: config.listen,
                source,
            })?;
        let claims = match &config.claims.backend {
            BackendConfig::Memory => Store::Memory(Memory::new()),
            BackendConfig::Redis { url } => Store::Redis(
                RedisClaims::connect(&Target::Standalone(url.clone()), &config.claims.key_prefix)
                    .await?,
            ),
            BackendConfig::RedisCluster { nodes } => Store::Redis(
                RedisClaims::connect(&Target::Cluster(nodes.clone()), &config.claims.key_prefix)
                    .await?,
            ),
        };
        let anonymous = if tls.is_some() {
            None
        } else {
            Some(Caller::Admin)
        };
        Ok(Bound {
            listener,
            service: TopologyService::new(Cells::new(&config.cells), claims, anonymous),
            tls,
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> Result<SocketAddr, Error> {
        self.listener.local_addr().map_err(Error::LocalAddr)
    }

    /// The service's state (its Cells and claims).
    pub fn service(&self) -> Arc<TopologyService> {
        self.service.clone()
    }

    /// Serves until `shutdown` completes.
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), Error> {
        let s = self.service;
        let routes = Routes::new(
            ClassifyServiceServer::new(Classify(s.clone())).max_decoding_message_size(MAX_MESSAGE),
        )
        .add_service(CellServiceServer::new(CellService(s.clone())))
        .add_service(
            ClaimServiceServer::new(ClaimService(s.clone())).max_decoding_message_size(MAX_MESSAGE),
        )
        .add_service(HealthServer::new(Health))
        .into_axum_router()
        .merge(crate::rest::router(s));
        let server = tonic::transport::Server::builder()
            .accept_http1(true)
            .add_routes(Routes::from(routes));
        match self.tls {
            None => {
                server
                    .serve_with_incoming_shutdown(TcpListenerStream::new(self.listener), shutdown)
                    .await?;
            }
            Some(acceptor) => {
                server
                    .serve_with_incoming_shutdown(handshakes(self.listener, acceptor), shutdown)
                    .await?;
            }
        }
        Ok(())
    }
}

/// TLS connections from `listener`, each handshake on a task of its own (a slow or
/// silent client holds up no other); failed handshakes are logged and dropped.
fn handshakes(
    listener: TcpListener,
    acceptor: openssl::ssl::SslAcceptor,
) -> impl futures_util::Stream<Item = std::io::Result<crate::tls::Conn>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let acceptor = Arc::new(acceptor);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection");
                    continue;
                }
            };
            if tx.is_closed() {
                return;
            }
            let (tx, acceptor) = (tx.clone(), acceptor.clone());
            tokio::spawn(async move {
                let handshake = tokio::time::timeout(
                    std::time::Duration::from_secs(10),
                    crate::tls::Conn::accept(&acceptor, tcp),
                )
                .await;
                match handshake {
                    Ok(Ok(conn)) => {
                        let _ = tx.send(Ok(conn)).await;
                    }
                    Ok(Err(e)) => tracing::info!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::info!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
