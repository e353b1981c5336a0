//! agentk: the agent that runs in a cluster and dials out to kas.
//!
//! - [`Agentk::start`] opens the configuration stream (`GetConfiguration`): while it
//!   is open, this replica is connected, and kas names it by the connection id it
//!   sent first. The stream ending (kas restarting, the network) means connecting
//!   again with back-off, as a new connection.
//! - For each connection, [`serve_tunnels`] keeps idle reverse tunnels at kas and
//!   answers the requests kas sends through them with [`KubeHandler`] (kube-rs).
//! - An observability listener serves `/metrics`, `/healthz` and `/readyz` (ready
//!   while connected to kas).
//!
//! kas is reached over h2c or WebSocket, with or without TLS
//! ([`crate::transport`]), directly or through the podgate proxy.

pub mod k8s_api;
pub mod kube;
pub mod metrics;
pub mod tunnels;
pub mod watch_graph;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::sync::watch;
use tonic::transport::Channel;

pub use self::kube::KubeHandler;
pub use self::metrics::AgentkMetrics;
pub use self::tunnels::{Handler, Responses, TunnelPool, serve_tunnels, unary};
use crate::proto::agent_configuration_service_client::AgentConfigurationServiceClient;
use crate::proto::{AgentMeta, GetConfigurationRequest};

/// agentk errors (start-up).
#[derive(Debug, Error)]
pub enum Error {
    /// The configuration is unusable; every problem names its field.
    #[error("invalid agentk configuration: {}", .0.join("; "))]
    Invalid(Vec<String>),
    /// The kas URL is unusable.
    #[error(transparent)]
    Transport(#[from] crate::transport::Error),
    /// No Kubernetes configuration could be found or used.
    #[error("kubernetes configuration: {0}")]
    Kube(String),
    /// The observability listener could not bind.
    #[error("binding the observability listener {addr}: {source}")]
    Bind {
        /// Its address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// An agentk replica's configuration.
#[derive(Clone, Debug)]
pub struct AgentkConfig {
    /// kas's agent listener: `grpc://host:port` or `ws://host:port/path`.
    pub kas_url: String,
    /// The agent token.
    pub token: String,
    /// Where this replica runs (reported to kas; `POD_NAMESPACE` in a cluster).
    pub pod_namespace: String,
    /// This replica's pod (`POD_NAME` in a cluster).
    pub pod_name: String,
    /// Idle tunnels kept at kas (at least 2).
    pub idle_tunnels: usize,
    /// Most requests answered at once.
    pub max_busy_tunnels: usize,
    /// The observability listener, if any.
    pub observability_listen: Option<SocketAddr>,
    /// A kubeconfig file; `None`: in-cluster configuration, else `$KUBECONFIG` or
    /// `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// CA certificates (PEM) trusted for `grpcs://` and `wss://` kas URLs, instead of
    /// the system's.
    pub ca_file: Option<PathBuf>,
    /// Graph API watches: how long a watch may take to list before the client gets
    /// `INFORMER_SYNC_FAILED` (default 30 s, the seed's figure).
    pub graph_sync_timeout: Duration,
}

impl AgentkConfig {
    /// Every problem at once, each naming its field.
    pub fn validate(&self) -> Result<(), Error> {
        let mut bad = Vec::new();
        if let Err(e) = crate::transport::kas_url_check(&self.kas_url) {
            bad.push(format!("kas: {e}"));
        }
        let token = self.token.trim();
        if token.is_empty() {
            bad.push("token: empty".into());
        } else if token.parse::<http::HeaderValue>().is_err() {
            bad.push("token: not usable in a header (control characters?)".into());
        }
        if self.idle_tunnels < 2 {
            bad.push(format!("idle_tunnels = {}: at least 2", self.idle_tunnels));
        }
        if let Some(ca) = &self.ca_file
            && !ca.is_file()
        {
            bad.push(format!("ca_file = {}: not a readable file", ca.display()));
        }
        if self.graph_sync_timeout.is_zero() {
            bad.push("graph_sync_timeout: must be more than 0".into());
        }
        if self.max_busy_tunnels < 1 {
            bad.push("max_busy_tunnels: at least 1".into());
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(Error::Invalid(bad))
        }
    }
}

/// Where the replica stands, for `/readyz` and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Status {
    /// The connection id kas gave, while connected.
    pub connection_id: Option<i64>,
    /// The agent kas took this replica for.
    pub agent_id: i64,
    /// Attempts to connect so far.
    pub attempts: u64,
    /// Why the last attempt failed, if it did.
    pub last_error: Option<tonic::Code>,
}

/// A running agentk. Dropping it disconnects.
pub struct Agentk {
    status: watch::Receiver<Status>,
    observability: Option<SocketAddr>,
    metrics: Arc<AgentkMetrics>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Agentk {
    /// Load the Kubernetes configuration, bind the observability listener, and start
    /// connecting to kas.
    pub async fn start(config: AgentkConfig) -> Result<Agentk, Error> {
        config.validate()?;
        let kube_config = match &config.kubeconfig {
            Some(path) => {
                let kc = ::kube::config::Kubeconfig::read_from(path)
                    .map_err(|e| Error::Kube(format!("{}: {e}", path.display())))?;
                ::kube::Config::from_custom_kubeconfig(kc, &Default::default())
                    .await
                    .map_err(|e| Error::Kube(format!("{}: {e}", path.display())))?
            }
            None => ::kube::Config::infer()
                .await
                .map_err(|e| Error::Kube(e.to_string()))?,
        };
        let client =
            ::kube::Client::try_from(kube_config).map_err(|e| Error::Kube(e.to_string()))?;
        let metrics = Arc::new(AgentkMetrics::new());
        let handler = Arc::new(KubeHandler::new(client).with_graph_settings(
            watch_graph::Settings {
                sync_timeout: config.graph_sync_timeout,
                metrics: Some(metrics.graph.clone()),
                ..Default::default()
            },
        ));
        Agentk::start_with_metrics(config, handler, metrics).await
    }

    /// [`Agentk::start`] with another request handler (tests, benchmarks).
    pub async fn start_with<H: Handler>(
        config: AgentkConfig,
        handler: Arc<H>,
    ) -> Result<Agentk, Error> {
        Agentk::start_with_metrics(config, handler, Arc::new(AgentkMetrics::new())).await
    }

    async fn start_with_metrics<H: Handler>(
        config: AgentkConfig,
        handler: Arc<H>,
        metrics: Arc<AgentkMetrics>,
    ) -> Result<Agentk, Error> {
        config.validate()?;
        let token = config.token.trim().to_owned();
        let dial = crate::transport::Dial {
            ca_file: config.ca_file.clone(),
        };
        let channel = crate::transport::kas_channel(&config.kas_url, &token, &dial)?;
        let (status_tx, status) = watch::channel(Status::default());
        let mut tasks = Vec::new();
        let mut observability = None;
        if let Some(addr) = config.observability_listen {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| Error::Bind { addr, source })?;
            observability = listener.local_addr().ok();
            let report = Arc::new(Report {
                metrics: metrics.clone(),
                status: status.clone(),
            });
            tasks.push(tokio::spawn(crate::obs::serve(listener, report)));
        }
        let pool = TunnelPool {
            idle: config.idle_tunnels,
            max_busy: config.max_busy_tunnels,
            metrics: metrics.clone(),
        };
        tasks.push(tokio::spawn(run(
            channel, token, config, pool, handler, status_tx,
        )));
        Ok(Agentk {
            status,
            observability,
            metrics,
            tasks,
        })
    }

    /// Where the replica stands now.
    pub fn status(&self) -> Status {
        *self.status.borrow()
    }

    /// Wait until connected to kas; the connection's status.
    pub async fn connected(&self) -> Status {
        self.wait_for(|s| s.connection_id.is_some()).await
    }

    /// Wait until the status satisfies `check`; that status.
    pub async fn wait_for(&self, check: impl FnMut(&Status) -> bool) -> Status {
        let mut rx = self.status.clone();
        match rx.wait_for(check).await {
            Ok(s) => *s,
            Err(_) => Status::default(),
        }
    }

    /// The observability listener's address, if any.
    pub fn observability_addr(&self) -> Option<SocketAddr> {
        self.observability
    }

    /// This replica's metrics.
    pub fn metrics(&self) -> &AgentkMetrics {
        &self.metrics
    }
}

impl Drop for Agentk {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

struct Report {
    metrics: Arc<AgentkMetrics>,
    status: watch::Receiver<Status>,
}

impl crate::obs::Report for Report {
    fn metrics(&self) -> String {
        self.metrics.render()
    }

    fn ready(&self) -> Result<(), String> {
        match self.status.borrow().connection_id {
            Some(_) => Ok(()),
            None => Err("not connected to kas".into()),
        }
    }
}

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

const RECONNECT_START: Duration = Duration::from_millis(250);
const RECONNECT_MAX: Duration = Duration::from_secs(20);

/// Connect, serve tunnels while connected, reconnect with back-off; forever.
async fn run<H: Handler>(
    channel: Channel,
    token: String,
    config: AgentkConfig,
    pool: TunnelPool,
    handler: Arc<H>,
    status: watch::Sender<Status>,
) {
    let mut backoff = RECONNECT_START;
    let mut attempts = 0;
    loop {
        attempts += 1;
        match connect(&channel, &token, &config).await {
            Ok((first, mut stream)) => {
                pool.metrics.connect("ok");
                pool.metrics.connected.set(1);
                backoff = RECONNECT_START;
                tracing::info!(
                    agent_id = first.agent_id,
                    connection_id = first.connection_id,
                    "connected to kas"
                );
                let _ = status.send(Status {
                    connection_id: Some(first.connection_id),
                    agent_id: first.agent_id,
                    attempts,
                    last_error: None,
                });
                // Aborted when this connection ends, and when agentk stops (this task
                // aborted mid-await drops the guard).
                let tunnels = AbortOnDrop(tokio::spawn(serve_tunnels(
                    channel.clone(),
                    token.clone(),
                    first.connection_id,
                    pool.clone(),
                    handler.clone(),
                )));
                // Later messages would carry configuration changes; the stream's end
                // is this connection's end.
                let ended = loop {
                    match stream.message().await {
                        Ok(Some(_update)) => continue,
                        Ok(None) => break "kas ended the stream".to_owned(),
                        Err(e) => break e.message().to_owned(),
                    }
                };
                drop(tunnels);
                pool.metrics.connected.set(0);
                let _ = status.send(Status {
                    attempts,
                    ..Status::default()
                });
                tracing::warn!(reason = %ended, "disconnected from kas; reconnecting");
            }
            Err(e) => {
                let result = match e.code() {
                    tonic::Code::Unauthenticated => "unauthenticated",
                    tonic::Code::Unavailable => "unavailable",
                    _ => "error",
                };
                pool.metrics.connect(result);
                let _ = status.send(Status {
                    attempts,
                    last_error: Some(e.code()),
                    ..Status::default()
                });
                if e.code() == tonic::Code::Unauthenticated {
                    tracing::error!(
                        token = %podgate_tokens::fingerprint(&token),
                        "kas refused the agent token"
                    );
                } else {
                    tracing::warn!(error = %e.message(), "cannot reach kas; retrying");
                }
            }
        }
        tokio::time::sleep(jitter(backoff)).await;
        backoff = (backoff * 2).min(RECONNECT_MAX);
    }
}

/// Between 75% and 100% of `d`, so replicas that lost kas together do not come
/// back together.
fn jitter(d: Duration) -> Duration {
    use rand::Rng as _;
    d.mul_f64(rand::thread_rng().gen_range(0.75..=1.0))
}

async fn connect(
    channel: &Channel,
    token: &str,
    config: &AgentkConfig,
) -> Result<
    (
        crate::proto::AgentConfiguration,
        tonic::Streaming<crate::proto::AgentConfiguration>,
    ),
    tonic::Status,
> {
    let mut request = tonic::Request::new(GetConfigurationRequest {
        agent_meta: Some(AgentMeta {
            version: env!("CARGO_PKG_VERSION").into(),
            commit: String::new(),
            pod_namespace: config.pod_namespace.clone(),
            pod_name: config.pod_name.clone(),
        }),
    });
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}")
            .parse()
            .map_err(|_| tonic::Status::internal("token is not a header value"))?,
    );
    let mut stream = AgentConfigurationServiceClient::new(channel.clone())
        .get_configuration(request)
        .await?
        .into_inner();
    match stream.message().await? {
        Some(first) => Ok((first, stream)),
        None => Err(tonic::Status::unavailable(
            "kas ended the configuration stream at once",
        )),
    }
}
