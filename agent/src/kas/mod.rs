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
//! `GetPods` is routed as the seed says: through a reverse tunnel this kas holds,
//! else through the internal endpoint of the kas the registry names (re-routed if
//! that kas lost the agent), else waiting until the agent connects anywhere (woken by
//! the registry's event, never polling) or `max_wait` passes.

pub mod agent_auth;
pub mod config;
pub mod metrics;
pub mod presence;
pub mod tunnel;

use std::net::SocketAddr;
use std::sync::Arc;

use podgate_registry::{AgentConnection, KasInstance, Registry};
use podgate_tokens::{Classifier, KeySet};
use thiserror::Error;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

use self::metrics::{KasMetrics, Outcome};
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
}

/// A running kas. Dropping it stops its listeners.
pub struct Kas {
    external: SocketAddr,
    internal: SocketAddr,
    agent: SocketAddr,
    observability: Option<SocketAddr>,
    registry: Registry,
    tunnels: Arc<tunnel::Tunnels>,
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
        let api = Api {
            registry: registry.clone(),
            tunnels: tunnels.clone(),
            router: Router {
                me: advertised.clone(),
                internal_secret: config.internal_secret.clone(),
                channels: std::sync::Mutex::default(),
            },
            max_wait: config.max_wait,
            metrics: metrics.clone(),
        };
        let internal_api = Internal {
            tunnels: tunnels.clone(),
            registry: registry.clone(),
            me: advertised.clone(),
            max_wait: config.max_wait,
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
        let drained = vec![
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
        Ok(Kas {
            external,
            internal,
            agent,
            observability,
            registry,
            tunnels,
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

    /// This kas's metrics.
    pub fn metrics(&self) -> &KasMetrics {
        &self.metrics
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

const NO_TUNNELS: &str = "this kas holds no tunnel to the agent";

const NOT_CONNECTED: &str = "agent connection not found: is the agent up to date and connected?";

fn registry_error(metrics: &KasMetrics, op: &'static str, e: podgate_registry::Error) -> Status {
    metrics.registry_error(op);
    tracing::warn!(error = %e, op, "registry lookup failed");
    Status::unavailable("agent registry unavailable")
}

struct Api {
    registry: Registry,
    tunnels: Arc<tunnel::Tunnels>,
    router: Router,
    max_wait: std::time::Duration,
    metrics: Arc<KasMetrics>,
}

/// Records a routed request's duration when dropped: with its outcome, or as
/// cancelled when the caller went away first (the handler future is dropped).
struct RouteTimer<'a> {
    metrics: &'a KasMetrics,
    started: std::time::Instant,
    outcome: Outcome,
}

impl Drop for RouteTimer<'_> {
    fn drop(&mut self) {
        self.metrics
            .routed(self.outcome, self.started.elapsed().as_secs_f64());
    }
}

/// Counts a request as waiting for its agent while it lives; `counted` makes a
/// request that waits more than once count once in `routing_waits`.
struct Waiting<'a>(&'a KasMetrics);

impl<'a> Waiting<'a> {
    fn new(metrics: &'a KasMetrics, counted: &mut bool) -> Self {
        if !std::mem::replace(counted, true) {
            metrics.routing_waits.inc();
        }
        metrics.routing_waiting.inc();
        Waiting(metrics)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.routing_waiting.dec();
    }
}

/// kas → kas calls: to the internal listener of the kas the registry names, with a
/// short-lived internal token. The receiving kas only follows the instruction.
struct Router {
    me: String,
    internal_secret: Vec<u8>,
    channels: std::sync::Mutex<std::collections::HashMap<String, tonic::transport::Channel>>,
}

impl Router {
    fn channel(&self, kas: &str) -> Result<tonic::transport::Channel, Status> {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = channels.get(kas) {
            return Ok(c.clone());
        }
        let c = tonic::transport::Channel::from_shared(format!("http://{kas}"))
            .map_err(|_| Status::internal("a kas address in the registry is not a URI"))?
            .connect_lazy();
        channels.insert(kas.to_owned(), c.clone());
        Ok(c)
    }

    async fn get_pods(&self, kas: &str, req: GetPodsRequest) -> Result<GetPodsResponse, Status> {
        let token = auth::mint_internal(&self.internal_secret, 30)
            .map_err(|_| Status::internal("minting an internal token"))?;
        let mut request = Request::new(req);
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}")
                .parse()
                .map_err(|_| Status::internal("token is not a header value"))?,
        );
        crate::proto::kas_internal_client::KasInternalClient::new(self.channel(kas)?)
            .get_pods(request)
            .await
            .map(Response::into_inner)
    }
}

/// `GetPods` through a tunnel this kas holds to the agent: `None` when it holds none.
async fn get_pods_local(
    tunnels: &tunnel::Tunnels,
    req: &GetPodsRequest,
) -> Option<Result<GetPodsResponse, Status>> {
    use prost::Message as _;
    let result = tunnels
        .call(
            req.agent_id,
            req.connection_id,
            "GetPods",
            req.encode_to_vec(),
        )
        .await?;
    Some(result.and_then(|(connection_id, payload)| {
        let mut resp = GetPodsResponse::decode(payload.as_slice())
            .map_err(|_| Status::internal("agentk sent an undecodable GetPods response"))?;
        resp.connection_id = connection_id;
        Ok(resp)
    }))
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

    /// A local tunnel if this kas holds one; else the kas the registry names for the
    /// agent (re-routed when that kas lost it); else wait, woken by the registry's
    /// connect event, until the agent connects anywhere or `max_wait` passes.
    async fn get_pods(
        &self,
        request: Request<GetPodsRequest>,
    ) -> Result<Response<GetPodsResponse>, Status> {
        let mut timer = RouteTimer {
            metrics: &self.metrics,
            started: std::time::Instant::now(),
            outcome: Outcome::Cancelled,
        };
        let (result, outcome) = self.route_get_pods(request.into_inner()).await;
        timer.outcome = outcome;
        result.map(Response::new)
    }
}

impl Api {
    async fn route_get_pods(
        &self,
        req: GetPodsRequest,
    ) -> (Result<GetPodsResponse, Status>, Outcome) {
        let deadline = tokio::time::Instant::now() + self.max_wait;
        let mut events = self.registry.subscribe();
        let mut waited = false;
        loop {
            if let Some(r) = get_pods_local(&self.tunnels, &req).await {
                let outcome = if r.is_ok() {
                    Outcome::Local
                } else {
                    Outcome::Error
                };
                return (r, outcome);
            }
            let conns = match self.registry.connections_by_agent(req.agent_id).await {
                Ok(c) => c,
                Err(e) => {
                    self.metrics.registry_error("connections_by_agent");
                    tracing::warn!(error = %e, "registry lookup failed; waiting for an event");
                    Vec::new()
                }
            };
            let conns = if conns.is_empty() {
                // Connected nowhere: wait for the connect event (no polling).
                let _waiting = Waiting::new(&self.metrics, &mut waited);
                match self.registry.wait_for_agent(req.agent_id, deadline).await {
                    Ok(c) => c,
                    Err(_) => {
                        self.metrics.routing_timeouts.inc();
                        return (
                            Err(Status::deadline_exceeded(NOT_CONNECTED)),
                            Outcome::Timeout,
                        );
                    }
                }
            } else {
                conns
            };
            let mut held_here = false;
            for c in conns
                .iter()
                .filter(|c| req.connection_id == 0 || c.connection_id == req.connection_id)
            {
                if c.kas.0 == self.router.me {
                    held_here = true;
                    continue;
                }
                let instruction = GetPodsRequest {
                    connection_id: c.connection_id,
                    ..req.clone()
                };
                match self.router.get_pods(&c.kas.0, instruction).await {
                    Ok(resp) => return (Ok(resp), Outcome::Kas),
                    // That kas lost the agent (or is gone): try the next.
                    Err(e) if matches!(e.code(), tonic::Code::Unavailable) => {
                        self.metrics.reroutes.inc();
                        continue;
                    }
                    Err(e) => return (Err(e), Outcome::Error),
                }
            }
            // Nothing answered yet: wait for the next change (a tunnel here, or an
            // agent event anywhere), never past the deadline.
            let _waiting = Waiting::new(&self.metrics, &mut waited);
            tokio::select! {
                _ = self.tunnels.wait_idle(req.agent_id, req.connection_id, 1), if held_here => {}
                _ = events.recv() => {}
                _ = tokio::time::sleep_until(deadline) => {
                    self.metrics.routing_timeouts.inc();
                    return (Err(Status::deadline_exceeded(NOT_CONNECTED)), Outcome::Timeout);
                }
            }
        }
    }
}

struct Internal {
    tunnels: Arc<tunnel::Tunnels>,
    registry: Registry,
    me: String,
    max_wait: std::time::Duration,
}

#[tonic::async_trait]
impl KasInternal for Internal {
    type CallStream = std::pin::Pin<
        Box<dyn futures_util::Stream<Item = Result<crate::proto::TunnelMessage, Status>> + Send>,
    >;

    async fn call(
        &self,
        _request: Request<crate::proto::TunnelCallRequest>,
    ) -> Result<Response<Self::CallStream>, Status> {
        Err(Status::unimplemented("KasInternal.Call is being built"))
    }

    async fn get_pods(
        &self,
        request: Request<GetPodsRequest>,
    ) -> Result<Response<GetPodsResponse>, Status> {
        let req = request.into_inner();
        let deadline = tokio::time::Instant::now() + self.max_wait;
        loop {
            if let Some(r) = get_pods_local(&self.tunnels, &req).await {
                return r.map(Response::new);
            }
            // The replica may be ours with its tunnels busy or not open yet (they
            // follow its GetConfiguration stream): wait for one. A replica that is not
            // ours is answered at once, so the caller re-routes.
            let ours = self
                .registry
                .connections_by_agent(req.agent_id)
                .await
                .unwrap_or_default()
                .iter()
                .any(|c| {
                    c.kas.0 == self.me
                        && (req.connection_id == 0 || c.connection_id == req.connection_id)
                });
            if !ours {
                return Err(Status::unavailable(NO_TUNNELS));
            }
            tokio::select! {
                _ = self.tunnels.wait_idle(req.agent_id, req.connection_id, 1) => {}
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(Status::unavailable(NO_TUNNELS));
                }
            }
        }
    }
}
