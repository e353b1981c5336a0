//! A running agentk: started (with the Workspaces module when the cluster is real),
//! its status and configuration watched, stopped.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;
use tonic::transport::Channel;

use super::connection::{Watches, run};
use super::{
    AgentConfig, AgentkConfig, AgentkMetrics, Error, Handler, KubeHandler, ModuleClient, Status,
    TunnelPool, remote_development, watch_graph,
};

/// A running agentk. Dropping it disconnects.
pub struct Agentk {
    status: watch::Receiver<Status>,
    config: watch::Receiver<Option<AgentConfig>>,
    channel: Channel,
    token: String,
    observability: Option<SocketAddr>,
    metrics: Arc<AgentkMetrics>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The Workspaces module (only with a real cluster: [`Agentk::start`]).
    workspaces: Option<remote_development::ModuleHandle>,
}

impl Agentk {
    /// Load the Kubernetes configuration, bind the observability listener, and start
    /// connecting to kas. The Workspaces module runs when the agent configuration
    /// enables it, electing its leader with client-go's timings.
    pub async fn start(config: AgentkConfig) -> Result<Agentk, Error> {
        let leader =
            remote_development::LeaderOptions::for_replica(&config.pod_namespace, &config.pod_name);
        Agentk::start_with_leader(config, leader).await
    }

    /// [`Agentk::start`] with the Workspaces module's leader election as given.
    pub async fn start_with_leader(
        config: AgentkConfig,
        leader: remote_development::LeaderOptions,
    ) -> Result<Agentk, Error> {
        config.validate()?;
        leader
            .validate()
            .map_err(|e| Error::Invalid(vec![format!("leader: {e}")]))?;
        let kube_config = match &config.kubeconfig {
            Some(path) => {
                let kube = |e: ::kube::config::KubeconfigError| Error::Kube {
                    what: path.display().to_string(),
                    source: Box::new(e),
                };
                let kc = ::kube::config::Kubeconfig::read_from(path).map_err(kube)?;
                ::kube::Config::from_custom_kubeconfig(kc, &Default::default())
                    .await
                    .map_err(kube)?
            }
            None => ::kube::Config::infer().await.map_err(|e| Error::Kube {
                what: "in-cluster, or the default kubeconfig".into(),
                source: Box::new(e),
            })?,
        };
        let client = ::kube::Client::try_from(kube_config).map_err(|e| Error::Kube {
            what: "its client".into(),
            source: Box::new(e),
        })?;
        let metrics = Arc::new(AgentkMetrics::new());
        let handler = Arc::new(KubeHandler::new(client.clone()).with_graph_settings(
            watch_graph::Settings {
                sync_timeout: config.graph_sync_timeout,
                metrics: Some(metrics.graph.clone()),
                ..Default::default()
            },
        ));
        let mut agentk = Agentk::start_with_metrics(config, handler.clone(), metrics).await?;
        handler.set_config(agentk.config());
        agentk.workspaces = Some(remote_development::spawn(
            client,
            agentk.module_client(),
            agentk.config(),
            leader,
            agentk.metrics.workspaces.clone(),
        ));
        Ok(agentk)
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
        let dial = podgate_agent::transport::Dial {
            ca_file: config.ca_file.clone(),
        };
        let channel = podgate_agent::transport::kas_channel(&config.kas_url, &token, &dial)?;
        let (status_tx, status) = watch::channel(Status::default());
        let (config_tx, config_rx) = watch::channel(None);
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
            tasks.push(tokio::spawn(podgate_agent::obs::serve(listener, report)));
        }
        let pool = TunnelPool {
            idle: config.idle_tunnels,
            max_busy: config.max_busy_tunnels,
            metrics: metrics.clone(),
        };
        tasks.push(tokio::spawn(run(
            channel.clone(),
            token.clone(),
            config,
            pool,
            handler,
            Watches {
                status: status_tx,
                config: config_tx,
            },
        )));
        Ok(Agentk {
            status,
            config: config_rx,
            channel,
            token,
            observability,
            metrics,
            tasks,
            workspaces: None,
        })
    }

    /// Stop: the Workspaces module first (its Lease given up, so another replica
    /// takes over at once), then the rest, as dropping does.
    pub async fn shutdown(mut self) {
        if let Some(workspaces) = self.workspaces.take() {
            workspaces.shutdown().await;
        }
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

    /// The agent's latest configuration (`None` until the first configuration
    /// message). It changes with each new commit kas sends; a reconnect resumes
    /// from the commit this replica has, so it changes only if the configuration
    /// did. Kept while disconnected.
    pub fn config(&self) -> watch::Receiver<Option<AgentConfig>> {
        self.config.clone()
    }

    /// The channel to kas's agent listener (shared by every call of this replica).
    pub fn kas_channel(&self) -> Channel {
        self.channel.clone()
    }

    /// The agent token this replica authenticates with.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// A client for GitLab's module API through kas, as this agent.
    pub fn module_client(&self) -> ModuleClient {
        ModuleClient::new(self.channel.clone(), self.token.clone())
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

impl podgate_agent::obs::Report for Report {
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
