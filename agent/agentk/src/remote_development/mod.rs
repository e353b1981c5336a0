//! agentk's `remote_development` module: the Workspaces reconciliation loop between
//! the cluster and GitLab, through kas (GitLab's
//! `internal/module/remote_development/agent/` in gitlab-org/cluster-integration/gitlab-agent,
//! read in the mirror <https://github.com/pluralsh/kubernetes-agent>).
//!
//! Layout: [`ports`] (the traits the reconciler talks through), [`rails`] (GitLab
//! through kas), [`apply`] (server-side apply, inventories, prune, namespaces),
//! [`body`] (the request and response JSON), [`trackers`] (acknowledged versions,
//! termination progress, applier errors), [`reconciler`] (one cycle), [`worker`]
//! (full/partial scheduling, settings, leader gating); [`run`] puts them together
//! for one agentk replica.
//!
//! As GitLab's agentk, the module is a *leader module* (`factory.go`
//! `IsProducingLeaderModules`): replicas of one agent elect a leader with the Lease
//! `agent-<agent id>-lock` ([`crate::leader`]) and only the leader
//! reconciles. Election starts once the agent's configuration enables the module
//! (`remote_development.enabled: true`); the Lease is kept, and released on
//! shutdown, from then on.

pub mod apply;
pub mod body;
#[cfg(test)]
mod fakes;
pub mod ports;
pub mod rails;
pub mod reconciler;
pub mod trackers;
pub mod worker;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use self::ports::{Cluster, Rails};
use self::rails::KasRails;
use self::reconciler::KubeDeployments;
use self::worker::{ModuleConfig, RemoteDevelopmentConfig, Worker, supervise};
use crate::AgentConfig;
use crate::gitlab_access::ModuleClient;
use crate::leader::{Leader, LeaderConfig};
use crate::metrics::WorkspacesMetrics;

/// Where this replica's Lease lives, who it is, and the election's timings
/// (client-go's defaults: 15 s, 10 s, 2 s).
#[derive(Clone, Debug)]
pub struct LeaderOptions {
    /// The Lease's namespace (agentk: its Pod's namespace).
    pub namespace: String,
    /// This replica's `holderIdentity` (agentk: its Pod's name).
    pub identity: String,
    /// How long others wait before taking over an unrenewed Lease.
    pub lease_duration: Duration,
    /// How long the leader tries to renew before it stops leading.
    pub renew_deadline: Duration,
    /// Time between tries.
    pub retry_period: Duration,
}

impl Default for LeaderOptions {
    fn default() -> Self {
        LeaderOptions {
            namespace: "default".into(),
            identity: String::new(),
            lease_duration: crate::leader::DEFAULT_LEASE_DURATION,
            renew_deadline: crate::leader::DEFAULT_RENEW_DEADLINE,
            retry_period: crate::leader::DEFAULT_RETRY_PERIOD,
        }
    }
}

impl LeaderOptions {
    /// A replica in `namespace` named `pod_name`, client-go's timings. An empty
    /// namespace is `default`; an empty name a random one (`agentk-<hex>`), so
    /// replicas started outside a cluster still differ.
    pub fn for_replica(namespace: &str, pod_name: &str) -> LeaderOptions {
        let identity = if pod_name.trim().is_empty() {
            use rand::Rng as _;
            format!("agentk-{:016x}", rand::thread_rng().gen_range(0..u64::MAX))
        } else {
            pod_name.to_owned()
        };
        let namespace = if namespace.trim().is_empty() {
            "default".to_owned()
        } else {
            namespace.to_owned()
        };
        LeaderOptions {
            namespace,
            identity,
            ..LeaderOptions::default()
        }
    }

    /// Every problem at once, each naming its field (the election's own checks).
    pub fn validate(&self) -> Result<(), String> {
        self.for_agent(0).validate().map_err(|e| e.to_string())
    }

    fn for_agent(&self, agent_id: i64) -> LeaderConfig {
        LeaderConfig {
            lease_duration: self.lease_duration,
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
            ..LeaderConfig::for_agent(&self.namespace, agent_id, &self.identity)
        }
    }
}

/// The module for one agentk replica: follow the agent configuration, elect a
/// leader once the module is enabled, reconcile while leading (with GitLab through
/// `rails`, changing `cluster`, watching Deployments with `client`).
/// Returns when the configuration sender is gone, or after `shutdown` resolves
/// (the Lease released first, so another replica takes over at once).
pub async fn run<R: Rails, C: Cluster>(
    client: kube::Client,
    rails: Arc<R>,
    cluster: Arc<C>,
    mut config: watch::Receiver<Option<AgentConfig>>,
    leader: LeaderOptions,
    metrics: WorkspacesMetrics,
    shutdown: impl Future<Output = ()>,
) {
    let (module_tx, module_rx) = watch::channel(None);
    // The agent configuration, as this module sees it.
    let follow = async move {
        loop {
            let seen = config.borrow_and_update().clone().map(module_config);
            module_tx.send_if_modified(|c| {
                if *c == seen {
                    false
                } else {
                    *c = seen;
                    true
                }
            });
            if config.changed().await.is_err() {
                return;
            }
        }
    };
    // The election, once started; released at shutdown.
    let elected: std::sync::Mutex<Option<Leader>> = std::sync::Mutex::default();
    let reconcile = async {
        // Elect only once the module is wanted: the Lease names the agent.
        let mut first = module_rx.clone();
        let agent_id = match first
            .wait_for(|c| c.as_ref().is_some_and(|c| c.remote_development.enabled))
            .await
        {
            Ok(c) => c.as_ref().map(|c| c.agent_id).unwrap_or_default(),
            Err(_) => return,
        };
        let leader = Leader::start(client.clone(), leader.for_agent(agent_id));
        let leading = leader.is_leader();
        *elected.lock().unwrap_or_else(|e| e.into_inner()) = Some(leader);
        supervise(module_rx, leading, metrics.clone(), |cfg| {
            let source = KubeDeployments {
                client: client.clone(),
                agent_id: cfg.agent_id,
            };
            Worker::new(rails.clone(), cluster.clone(), source, metrics.clone()).run()
        })
        .await;
    };
    tokio::select! {
        _ = futures_util::future::join(follow, reconcile) => {}
        () = shutdown => {}
    }
    // The worker is stopped (its future dropped) before the Lease is given up.
    let leader = elected.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(leader) = leader {
        leader.release().await;
    }
}

/// The module running for an agentk replica ([`spawn`]). Dropping it stops the
/// module without giving the Lease up (another replica takes over after the lease
/// duration); [`ModuleHandle::shutdown`] gives it up first.
pub struct ModuleHandle {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// [`run`] in a task, with a [`KubeCluster`](apply::KubeCluster) on `client`.
pub fn spawn(
    client: kube::Client,
    module_client: ModuleClient,
    config: watch::Receiver<Option<AgentConfig>>,
    leader: LeaderOptions,
    metrics: WorkspacesMetrics,
) -> ModuleHandle {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let cluster = Arc::new(apply::KubeCluster::new(client.clone()));
    let task = tokio::spawn(run(
        client,
        Arc::new(KasRails::new(module_client)),
        cluster,
        config,
        leader,
        metrics,
        async move {
            let _ = stopped.await;
        },
    ));
    ModuleHandle {
        stop: Some(stop),
        task: Some(task),
    }
}

impl ModuleHandle {
    /// Stop the module: the worker first, then the Lease is released.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for ModuleHandle {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

fn module_config(c: AgentConfig) -> ModuleConfig {
    let remote_development = RemoteDevelopmentConfig::from_configuration(&c.configuration);
    ModuleConfig {
        agent_id: c.agent_id,
        remote_development,
    }
}
