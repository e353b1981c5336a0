//! kas: four listeners, each on its own address.
//!
//! - *agent*: agentk's configuration stream ([`presence`]: each open stream is a
//!   registered connection) and reverse tunnels ([`tunnel`]), over h2c or WebSocket
//!   ([`crate::transport`]); agents authenticated by [`agent_auth`].
//! - *external*: GitLab's `KasApi`, with GitLab's JWT ([`crate::auth`]).
//! - *internal*: `KasInternal` for other kas instances, with their own secret.
//! - *observability*: `/metrics` ([`metrics`]), `/healthz`, `/readyz`.
//!
//! Connected agents are answered from the presence registry (`pod-registry`).
//! Calls to agents (`GetPods`, and the Kubernetes API proxy's `MakeRequest` and
//! `WatchGraph`) are routed as the seed says, by one loop ([`routing::AgentRouter`]):
//! through a reverse tunnel this kas holds, else through the internal endpoint of the
//! kas the registry names (re-routed if that kas lost the agent), else waiting until
//! the agent connects anywhere (woken by the registry's event, never polling) or
//! `max_wait` passes.

pub mod agent_auth;
pub mod config;
pub mod gitlab;
pub mod k8s_proxy;
pub mod metrics;
pub mod presence;
pub mod routing;
pub mod tunnel;

use std::net::SocketAddr;
use std::sync::Arc;

use podgate_registry::{AgentConnection, KasInstance, Registry};
use podgate_tokens::{Classifier, KeySet};
use thiserror::Error;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

use self::metrics::KasMetrics;
use self::routing::AgentRouter;
use crate::auth::{self, JwtAuth};
use crate::proto::agent_configuration_service_server::AgentConfigurationServiceServer;
use crate::proto::kas_api_server::{KasApi, KasApiServer};
use crate::proto::kas_internal_server::{KasInternal, KasInternalServer};
use crate::proto::reverse_tunnel_server::ReverseTunnelServer;
use crate::proto::{
    ConnectedAgentInfo, ConnectedAgentsByIdRequest, ConnectedAgentsByIdResponse,
    ConnectedAgentsForProjectRequest, ConnectedAgentsForProjectResponse, GetPodsRequest,
    GetPodsResponse, KasAddress,
};

/// kas errors (start-up).
#[derive(Debug, Error)]
pub enum Error {
    /// A secret is unusable.
    #[error(transparent)]
    Auth(#[from] auth::Error),
    /// The presence registry refused.
    #[error("registry: {0}")]
    Registry(#[source] podgate_registry::Error),
    /// A listener could not bind.
    #[error("binding {what} {addr}: {source}")]
    Bind {
        /// Which listener.
        what: &'static str,
        /// Its address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// A kas instance's configuration.
#[derive(Clone, Debug)]
pub struct KasConfig {
    /// GitLab-facing listener.
    pub external_listen: SocketAddr,
    /// kas-facing listener.
    pub internal_listen: SocketAddr,
    /// The GitLab ↔ kas shared secret (≥ 32 bytes).
    pub external_secret: Vec<u8>,
    /// The kas ↔ kas secret (≥ 32 bytes).
    pub internal_secret: Vec<u8>,
    /// The issuer GitLab puts in its tokens (`gitlab`).
    pub issuer: String,
    /// agentk-facing listener.
    pub agent_listen: SocketAddr,
    /// Keys that verify agent tokens (JWT routable tokens).
    pub agent_keys: KeySet,
    /// The address other kas instances use to reach this one's internal listener
    /// (default: the internal listener's bound address).
    pub advertise_internal: Option<String>,
    /// Longest a GitLab request waits for its agent to connect anywhere.
    pub max_wait: std::time::Duration,
    /// The observability listener (`/metrics`, `/healthz`, `/readyz`), if any.
    pub observability_listen: Option<SocketAddr>,
    /// GitLab's `agent_info` endpoint for opaque agent tokens, if any.
    pub agent_info: Option<agent_auth::AgentInfoConfig>,
    /// The bearer token `/metrics` requires, if any.
    pub metrics_token: Option<String>,
    /// The Kubernetes API proxy listener (`[k8s_proxy]`), if any.
    pub k8s_proxy: Option<k8s_proxy::K8sProxyConfig>,
}

/// A running kas. Dropping it stops its listeners.
pub struct Kas {
    external: SocketAddr,
    internal: SocketAddr,
    agent: SocketAddr,
    observability: Option<SocketAddr>,
    k8s_proxy: Option<SocketAddr>,
    registry: Registry,
    tunnels: Arc<tunnel::Tunnels>,
    router: Arc<AgentRouter>,
    metrics: Arc<KasMetrics>,
    draining: tokio::sync::watch::Sender<bool>,
    /// The external and internal servers: drained at shutdown.
    drained: Vec<tokio::task::JoinHandle<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Resolves once `draining` turns true (or its sender is gone).
async fn drain_signal(mut draining: tokio::sync::watch::Receiver<bool>) {
    let _ = draining.wait_for(|d| *d).await;
}

impl Kas {
    /// Bind both listeners and serve.
    pub async fn start(config: KasConfig, registry: Registry) -> Result<Kas, Error> {
        let external_auth = Arc::new(JwtAuth::external(&config.external_secret, &config.issuer)?);
        let internal_auth = Arc::new(JwtAuth::internal(&config.internal_secret)?);
        let bind = |what, addr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| Error::Bind { what, addr, source })
        };
        let ext = bind("external listener", config.external_listen).await?;
        let int = bind("internal listener", config.internal_listen).await?;
        let agt = bind("agent listener", config.agent_listen).await?;
        let obs = match config.observability_listen {
            Some(addr) => Some(bind("observability listener", addr).await?),
            None => None,
        };
        let observability = obs.as_ref().and_then(|l| l.local_addr().ok());
        let k8s = match &config.k8s_proxy {
            Some(p) => Some(bind("k8s proxy listener", p.listen).await?),
            None => None,
        };
        let k8s_proxy_addr = k8s.as_ref().and_then(|l| l.local_addr().ok());
        let agent = agt.local_addr().map_err(|source| Error::Bind {
            what: "agent listener",
            addr: config.agent_listen,
            source,
        })?;
        let (external, internal) = (
            ext.local_addr().map_err(|source| Error::Bind {
                what: "external listener",
                addr: config.external_listen,
                source,
            })?,
            int.local_addr().map_err(|source| Error::Bind {
                what: "internal listener",
                addr: config.internal_listen,
                source,
            })?,
        );
        let advertised = config
            .advertise_internal
            .clone()
            .unwrap_or_else(|| internal.to_string());
        registry
            .register_kas(KasInstance {
                address: advertised.as_str().into(),
                version: env!("CARGO_PKG_VERSION").into(),
                commit: String::new(),
                pod_id: None,
                started_at_ms: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64),
            })
            .await
            .map_err(Error::Registry)?;
        let metrics = Arc::new(KasMetrics::new());
        let classifier = Arc::new(Classifier::with_keys(config.agent_keys.clone()));
        let agent_auth = Arc::new(agent_auth::AgentAuth::new(
            classifier,
            config.agent_info.clone(),
            metrics.registry(),
        ));
        let tunnels = Arc::new(tunnel::Tunnels::new(metrics.clone()));
        let (draining, draining_rx) = tokio::sync::watch::channel(false);
        let presence = presence::Presence {
            draining: draining_rx.clone(),
            registry: registry.clone(),
            auth: agent_auth.clone(),
            tunnels: tunnels.clone(),
            metrics: metrics.clone(),
            kas: advertised.as_str().into(),
        };
        let tunnel_service = tunnel::TunnelService {
            tunnels: tunnels.clone(),
            auth: agent_auth,
        };
        let router = Arc::new(AgentRouter::new(
            advertised.clone(),
            tunnels.clone(),
            registry.clone(),
            config.internal_secret.clone(),
            config.max_wait,
            metrics.clone(),
        ));
        let api = Api {
            registry: registry.clone(),
            router: router.clone(),
            metrics: metrics.clone(),
        };
        let internal_api = Internal {
            follower: routing::Follower {
                tunnels: tunnels.clone(),
                registry: registry.clone(),
                me: advertised.clone(),
                max_wait: config.max_wait,
            },
        };
        let ext_service = KasApiServer::with_interceptor(api, move |req: Request<()>| {
            external_auth.check(req.metadata())?;
            Ok(req)
        });
        let int_service =
            KasInternalServer::with_interceptor(internal_api, move |req: Request<()>| {
                internal_auth.check(req.metadata())?;
                Ok(req)
            });
        let (ext_drain, int_drain) = (draining_rx.clone(), draining_rx);
        let mut drained = vec![
            tokio::spawn(async move {
                if let Err(e) = tonic::transport::Server::builder()
                    .add_service(ext_service)
                    .serve_with_incoming_shutdown(
                        TcpListenerStream::new(ext),
                        drain_signal(ext_drain),
                    )
                    .await
                {
                    tracing::error!(error = %e, "kas external listener stopped");
                }
            }),
            tokio::spawn(async move {
                if let Err(e) = tonic::transport::Server::builder()
                    .add_service(int_service)
                    .serve_with_incoming_shutdown(
                        TcpListenerStream::new(int),
                        drain_signal(int_drain),
                    )
                    .await
                {
                    tracing::error!(error = %e, "kas internal listener stopped");
                }
            }),
        ];
        let mut tasks = vec![tokio::spawn(async move {
            if let Err(e) = tonic::transport::Server::builder()
                .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
                .http2_keepalive_timeout(Some(std::time::Duration::from_secs(10)))
                .add_service(AgentConfigurationServiceServer::new(presence))
                .add_service(ReverseTunnelServer::new(tunnel_service))
                .serve_with_incoming(crate::transport::agent_incoming(agt))
                .await
            {
                tracing::error!(error = %e, "kas agent listener stopped");
            }
        })];
        if let Some(obs) = obs {
            let report = Arc::new(Report {
                metrics: metrics.clone(),
                registry: registry.clone(),
                metrics_token: config.metrics_token.clone(),
            });
            tasks.push(tokio::spawn(crate::obs::serve(obs, report)));
        }
        if let (Some(listener), Some(c)) = (k8s, &config.k8s_proxy) {
            let proxy = k8s_proxy::K8sProxy::new(
                c.clone(),
                config.external_secret.clone(),
                router.clone(),
                metrics.registry(),
            );
            drained.push(tokio::spawn(k8s_proxy::serve(
                listener,
                Arc::new(proxy),
                draining.subscribe(),
            )));
        }
        Ok(Kas {
            external,
            internal,
            agent,
            observability,
            k8s_proxy: k8s_proxy_addr,
            registry,
            tunnels,
            router,
            metrics,
            draining,
            drained,
            tasks,
        })
    }

    /// The agent listener's address.
    pub fn agent_addr(&self) -> SocketAddr {
        self.agent
    }

    /// This kas's tunnels.
    pub fn tunnels(&self) -> &tunnel::Tunnels {
        &self.tunnels
    }

    /// This kas's router: sends tunnelled calls to agents wherever they are
    /// connected (the Kubernetes API proxy and the Graph API use it).
    pub fn router(&self) -> Arc<AgentRouter> {
        self.router.clone()
    }

    /// This kas's metrics.
    pub fn metrics(&self) -> &KasMetrics {
        &self.metrics
    }

    /// The Kubernetes API proxy listener's address, if it has one.
    pub fn k8s_proxy_addr(&self) -> Option<SocketAddr> {
        self.k8s_proxy
    }

    /// The observability listener's address, if it has one.
    pub fn observability_addr(&self) -> Option<SocketAddr> {
        self.observability
    }

    /// [`Kas::shutdown_with_grace`] with 10 s for requests in flight.
    pub async fn shutdown(self) -> Result<(), Error> {
        self.shutdown_with_grace(std::time::Duration::from_secs(10))
            .await
    }

    /// Stop without dropping requests:
    /// 1. remove this kas and its agents from the registry (the seed's cleanup), so
    ///    no kas routes here any more, and refuse new agent connections;
    /// 2. stop accepting GitLab and kas requests and let those in flight finish
    ///    (through this kas's tunnels, which stay up meanwhile), for up to `grace`;
    /// 3. close everything.
    pub async fn shutdown_with_grace(mut self, grace: std::time::Duration) -> Result<(), Error> {
        let _ = self.draining.send(true);
        let cleanup = self.registry.shutdown().await.map_err(Error::Registry);
        let drained = std::mem::take(&mut self.drained);
        if tokio::time::timeout(grace, futures_util::future::join_all(drained))
            .await
            .is_err()
        {
            tracing::warn!(
                ?grace,
                "requests still in flight after the grace period; closing"
            );
        }
        cleanup
    }

    /// The external listener's address.
    pub fn external_addr(&self) -> SocketAddr {
        self.external
    }

    /// The internal listener's address.
    pub fn internal_addr(&self) -> SocketAddr {
        self.internal
    }
}

impl Drop for Kas {
    fn drop(&mut self) {
        for t in self.tasks.iter().chain(&self.drained) {
            t.abort();
        }
    }
}

/// What kas's observability listener reports.
struct Report {
    metrics: Arc<KasMetrics>,
    registry: Registry,
    metrics_token: Option<String>,
}

impl crate::obs::Report for Report {
    fn metrics(&self) -> String {
        self.metrics.render()
    }

    /// Ready while the presence registry answers: without it kas can neither
    /// register agents nor route to other kas instances.
    fn ready(&self) -> Result<(), String> {
        if self.registry.backend_up() {
            Ok(())
        } else {
            Err("the presence registry (Redis) does not answer".into())
        }
    }

    fn metrics_token(&self) -> Option<&str> {
        self.metrics_token.as_deref()
    }
}

/// `ip:port` (or a host name) into the seed's `KasAddress`.
fn kas_address(addr: &str) -> KasAddress {
    match addr.rsplit_once(':') {
        Some((ip, port)) => KasAddress {
            ip: ip.trim_matches(|c| c == '[' || c == ']').to_owned(),
            port: port.parse().unwrap_or(0),
        },
        None => KasAddress {
            ip: addr.to_owned(),
            port: 0,
        },
    }
}

fn info(c: AgentConnection) -> ConnectedAgentInfo {
    ConnectedAgentInfo {
        id: c.agent_id,
        connection_id: c.connection_id,
        version: c.version,
        commit: c.commit,
        pod_namespace: c.pod_namespace,
        pod_name: c.pod_name,
        connected_at_ms: i64::try_from(c.connected_at_ms).unwrap_or(i64::MAX),
        kas_address: Some(kas_address(&c.kas.0)),
        project_id: c.project_id,
    }
}

fn registry_error(metrics: &KasMetrics, op: &'static str, e: podgate_registry::Error) -> Status {
    metrics.registry_error(op);
    tracing::warn!(error = %e, op, "registry lookup failed");
    Status::unavailable("agent registry unavailable")
}

struct Api {
    registry: Registry,
    router: Arc<AgentRouter>,
    metrics: Arc<KasMetrics>,
}

/// A `GetPods` answer from agentk, with the replica that answered.
fn get_pods_response(connection_id: i64, payload: &[u8]) -> Result<GetPodsResponse, Status> {
    use prost::Message as _;
    let mut resp = GetPodsResponse::decode(payload)
        .map_err(|_| Status::internal("agentk sent an undecodable GetPods response"))?;
    resp.connection_id = connection_id;
    Ok(resp)
}

#[tonic::async_trait]
impl KasApi for Api {
    async fn connected_agents_for_project(
        &self,
        request: Request<ConnectedAgentsForProjectRequest>,
    ) -> Result<Response<ConnectedAgentsForProjectResponse>, Status> {
        let project = request.into_inner().project_id;
        let agents = self
            .registry
            .connections_by_project(project)
            .await
            .map_err(|e| registry_error(&self.metrics, "connections_by_project", e))?;
        Ok(Response::new(ConnectedAgentsForProjectResponse {
            agents: agents.into_iter().map(info).collect(),
        }))
    }

    async fn connected_agents_by_id(
        &self,
        request: Request<ConnectedAgentsByIdRequest>,
    ) -> Result<Response<ConnectedAgentsByIdResponse>, Status> {
        let agent = request.into_inner().agent_id;
        let agents = self
            .registry
            .connections_by_agent(agent)
            .await
            .map_err(|e| registry_error(&self.metrics, "connections_by_agent", e))?;
        Ok(Response::new(ConnectedAgentsByIdResponse {
            agents: agents.into_iter().map(info).collect(),
        }))
    }

    /// Routed by [`AgentRouter`]: a local tunnel, else the kas the registry names,
    /// else wait for the agent to connect.
    async fn get_pods(
        &self,
        request: Request<GetPodsRequest>,
    ) -> Result<Response<GetPodsResponse>, Status> {
        use prost::Message as _;
        let req = request.into_inner();
        let routed = self
            .router
            .open(
                req.agent_id,
                req.connection_id,
                "GetPods",
                req.encode_to_vec(),
            )
            .await?;
        let connection_id = routed.connection_id();
        let payload = routed.unary().await?;
        get_pods_response(connection_id, &payload).map(Response::new)
    }
}

/// `KasInternal`: calls routed here by another kas, for a replica this kas holds.
struct Internal {
    follower: routing::Follower,
}

#[tonic::async_trait]
impl KasInternal for Internal {
    type CallStream = routing::CallStream;

    async fn call(
        &self,
        request: Request<crate::proto::TunnelCallRequest>,
    ) -> Result<Response<Self::CallStream>, Status> {
        let wait = self.follower.wait(request.metadata());
        self.follower
            .call(request.into_inner(), wait)
            .await
            .map(Response::new)
    }

    /// The unary form older kas instances route `GetPods` with.
    async fn get_pods(
        &self,
        request: Request<GetPodsRequest>,
    ) -> Result<Response<GetPodsResponse>, Status> {
        use prost::Message as _;
        let wait = self.follower.wait(request.metadata());
        let req = request.into_inner();
        let mut response = self
            .follower
            .open(
                req.agent_id,
                req.connection_id,
                "GetPods",
                req.encode_to_vec(),
                wait,
            )
            .await?;
        let connection_id = response.connection_id();
        let payload = response
            .message()
            .await?
            .ok_or_else(|| Status::internal("agentk sent no response message"))?;
        if response.message().await?.is_some() {
            return Err(Status::internal(
                "agentk sent more than one response message",
            ));
        }
        get_pods_response(connection_id, &payload).map(Response::new)
    }
}
