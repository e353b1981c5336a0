//! A running kas: its listeners bound and served, its observability report, its
//! shutdown (drain the external and internal servers, then stop the rest).

use std::net::SocketAddr;
use std::sync::Arc;

use podgate_registry::{KasInstance, Registry};
use podgate_tokens::Classifier;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::service::Routes;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Status};

use super::api::Api;
use super::internal::Internal;
use super::metrics::KasMetrics;
use super::routing::{self, AgentRouter};
use super::{
    Error, KasConfig, agent_auth, agent_config, configuration, external, gitlab, gitlab_access,
    job_router, k8s_proxy, notifications, presence, tracker, tunnel, workspaces,
};
use podgate_agent::auth::JwtAuth;
use podgate_agent::gzip_server;
use podgate_agent::proto::gitlab::agent::agent_configuration::rpc::agent_configuration_server::AgentConfigurationServer;
use podgate_agent::proto::gitlab::agent::agent_registrar::rpc::agent_registrar_server::AgentRegistrarServer;
use podgate_agent::proto::gitlab::agent::agent_tracker::rpc::agent_tracker_server::AgentTrackerServer;
use podgate_agent::proto::gitlab::agent::job_router::rpc::job_router_server::JobRouterServer;
use podgate_agent::proto::gitlab::agent::notifications::rpc::notifications_server::NotificationsServer;
use podgate_agent::proto::gitlab::agent::reverse_tunnel::rpc::reverse_tunnel_server::ReverseTunnelServer;
use podgate_agent::proto::gitlab_access::gitlab_access_server::GitlabAccessServer;
use podgate_agent::proto::kas_api_server::KasApiServer;
use podgate_agent::proto::kas_internal_server::KasInternalServer;

/// A running kas. Dropping it stops its listeners.
pub struct Kas {
    external: SocketAddr,
    internal: SocketAddr,
    agent: SocketAddr,
    observability: Option<SocketAddr>,
    k8s_proxy: Option<SocketAddr>,
    workspaces: Option<SocketAddr>,
    registry: Registry,
    tunnels: Arc<tunnel::Tunnels>,
    router: Arc<AgentRouter>,
    metrics: Arc<KasMetrics>,
    job_router: Arc<job_router::JobRouterService>,
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
        let external_auth = JwtAuth::external(&config.external_secret, &config.issuer)?;
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
        let ws = match &config.workspaces {
            Some(w) => Some(bind("workspaces listener", w.listen).await?),
            None => None,
        };
        let workspaces_addr = ws.as_ref().and_then(|l| l.local_addr().ok());
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
        // The presence registry's metrics are this kas's: two kas in one process
        // (tests, `podgate up`) each serve their own registry's.
        if let Err(e) = registry.register_metrics(metrics.registry()) {
            tracing::warn!(error = %e, "the registry's metrics are already served by another kas");
        }
        let classifier = Arc::new(Classifier::with_keys(config.agent_keys.clone()));
        let gitlab = config.gitlab_url.as_deref().map(|url| {
            Arc::new(gitlab::GitlabClient::new(
                url,
                config.external_secret.clone(),
            ))
        });
        let job_router = Arc::new(job_router::JobRouterService::new(
            config.job_router.clone(),
            gitlab.clone(),
            classifier.clone(),
            job_router::JobRouterMetrics::new(metrics.registry()),
        ));
        let agent_auth = Arc::new(
            agent_auth::AgentAuth::new(classifier, config.agent_info.clone(), metrics.registry())
                .counted_in(metrics.clone()),
        );
        let tunnels = Arc::new(tunnel::Tunnels::new(
            metrics.clone(),
            config.max_idle_tunnels_per_agent,
        ));
        let (draining, draining_rx) = tokio::sync::watch::channel(false);
        let presence = Arc::new(presence::Presence {
            draining: draining_rx.clone(),
            registry: registry.clone(),
            auth: agent_auth.clone(),
            tunnels: tunnels.clone(),
            metrics: metrics.clone(),
            kas: advertised.as_str().into(),
            ttl: presence::REGISTRATION_TTL,
            expiring: Default::default(),
        });
        let configs = Arc::new(agent_config::AgentConfigs::new(
            config.agent_config.clone(),
            gitlab.clone(),
            metrics.registry(),
        ));
        let configuration = configuration::ConfigurationService {
            presence: presence.clone(),
            configs: configs.clone(),
            gitlab_external_url: config.gitlab_external_url.clone().unwrap_or_default(),
        };
        let gitlab_access =
            gitlab_access::GitlabAccessService::new(agent_auth.clone(), gitlab, metrics.registry());
        let tunnel_service = tunnel::TunnelService {
            tunnels: tunnels.clone(),
            auth: agent_auth,
            registry: registry.clone(),
            me: advertised.clone(),
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
        let int_metrics = metrics.clone();
        let ext_auth = external::ExternalAuth::new(external_auth, metrics.clone());
        let tracker = tracker::Tracker {
            registry: registry.clone(),
            metrics: metrics.clone(),
        };
        let ext_routes = external::routes(
            Routes::new(InterceptedService::new(
                gzip_server!(KasApiServer::new(api)),
                ext_auth.clone(),
            ))
            .add_service(InterceptedService::new(
                gzip_server!(AgentTrackerServer::new(tracker)),
                ext_auth.clone(),
            ))
            .add_service(InterceptedService::new(
                gzip_server!(NotificationsServer::new(
                    notifications::NotificationsService(registry.clone())
                )),
                ext_auth.clone(),
            )),
            ext_auth,
        );
        let int_service =
            KasInternalServer::with_interceptor(internal_api, move |req: Request<()>| {
                if let Err(why) = internal_auth.verify(req.metadata()) {
                    int_metrics.auth_failure("internal", why, req.metadata());
                    return Err(Status::unauthenticated("unauthenticated"));
                }
                Ok(req)
            });
        let (ext_drain, int_drain) = (draining_rx.clone(), draining_rx);
        // Subscribed before any listener serves: no push published after start is
        // missed.
        let pushes = tokio::spawn(notifications::relay(registry.kas_events(), configs));
        let mut drained = vec![
            tokio::spawn(async move {
                if let Err(e) = tonic::transport::Server::builder()
                    .add_routes(ext_routes)
                    .serve_with_incoming_shutdown(nodelay(ext), drain_signal(ext_drain))
                    .await
                {
                    tracing::error!(error = %e, "kas external listener stopped");
                }
            }),
            tokio::spawn(async move {
                if let Err(e) = tonic::transport::Server::builder()
                    .add_service(int_service)
                    .serve_with_incoming_shutdown(nodelay(int), drain_signal(int_drain))
                    .await
                {
                    tracing::error!(error = %e, "kas internal listener stopped");
                }
            }),
        ];
        let agent_job_router = job_router.clone();
        let mut tasks = vec![
            pushes,
            tokio::spawn(async move {
                if let Err(e) = tonic::transport::Server::builder()
                    .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
                    .http2_keepalive_timeout(Some(std::time::Duration::from_secs(10)))
                    .add_service(gzip_server!(AgentConfigurationServer::new(configuration)))
                    .add_service(gzip_server!(AgentRegistrarServer::new(
                        presence::Registrar(presence)
                    )))
                    .add_service(gzip_server!(ReverseTunnelServer::new(tunnel_service)))
                    .add_service(gzip_server!(GitlabAccessServer::new(gitlab_access)))
                    .add_service(gzip_server!(JobRouterServer::from_arc(agent_job_router)))
                    .serve_with_incoming(podgate_agent::transport::agent_incoming(agt))
                    .await
                {
                    tracing::error!(error = %e, "kas agent listener stopped");
                }
            }),
        ];
        if let Some(obs) = obs {
            let report = Arc::new(Report {
                metrics: metrics.clone(),
                registry: registry.clone(),
                metrics_token: config.metrics_token.clone(),
            });
            tasks.push(tokio::spawn(podgate_agent::obs::serve(obs, report)));
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
        if let (Some(listener), Some(c)) = (ws, &config.workspaces) {
            let server = workspaces::WorkspacesServer::new(
                c.clone(),
                config.external_secret.clone(),
                router.clone(),
                metrics.registry(),
            );
            drained.push(tokio::spawn(workspaces::serve(
                listener,
                Arc::new(server),
                draining.subscribe(),
            )));
        }
        Ok(Kas {
            external,
            internal,
            agent,
            observability,
            k8s_proxy: k8s_proxy_addr,
            workspaces: workspaces_addr,
            registry,
            tunnels,
            router,
            metrics,
            job_router,
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

    /// This kas's Job Router.
    pub fn job_router(&self) -> &job_router::JobRouterService {
        &self.job_router
    }

    /// This kas's metrics.
    pub fn metrics(&self) -> &KasMetrics {
        &self.metrics
    }

    /// The Kubernetes API proxy listener's address, if it has one.
    pub fn k8s_proxy_addr(&self) -> Option<SocketAddr> {
        self.k8s_proxy
    }

    /// The Workspaces HTTP server's address, if it has one.
    pub fn workspaces_addr(&self) -> Option<SocketAddr> {
        self.workspaces
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
    /// 1. remove this kas and its agents from the registry, so no kas routes here
    ///    any more, and refuse new agent connections;
    /// 2. stop accepting GitLab and kas requests and let those in flight finish
    ///    (through this kas's tunnels, which stay up meanwhile), for up to `grace`;
    /// 3. close everything.
    pub async fn shutdown_with_grace(mut self, grace: std::time::Duration) -> Result<(), Error> {
        let _ = self.draining.send(true);
        // Held `GetJob` calls answer now (empty, their ticket unchanged).
        self.job_router.shutdown();
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

impl podgate_agent::obs::Report for Report {
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

/// The connections `listener` accepts, with Nagle's algorithm off (`TCP_NODELAY`, as
/// Go sets it on every TCP connection): gRPC's small frames (a `Call`'s header,
/// message and trailer) are sent at once, not held for the peer's delayed ACK
/// (about 40 ms a round on Linux). tonic's own `tcp_nodelay` applies only to the
/// listeners it binds itself.
fn nodelay(
    listener: tokio::net::TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt as _;
    TcpListenerStream::new(listener).map(|accepted| {
        accepted.inspect(|s| {
            let _ = s.set_nodelay(true);
        })
    })
}
