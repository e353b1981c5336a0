//! Every Pod's kas in `podgate up`, as every Cell has one, and GitLab's Job Router
//! on it: each Pod simulator answers `GET /api/v4/runners/router/discovery` with
//! the Job Router's URL on the proxy (`--job-router-scheme`: `grpc://` h2c, as
//! agentk's gRPC goes, or `ws://…/-/kubernetes-agent/`, `ws-tunnel`, as agentk's
//! WebSocket goes), and the proxy routes each runner's `GetJob` by its token to its
//! own Pod's kas, which holds the long poll on the Pod's runner queue keys.
//! `--job-router-off N` turns the router off on Pod N (discovery 501, `GetJob`
//! `UNIMPLEMENTED`), as a Cell whose `job_router` feature flag is off.
//!
//! Pod 1's kas with the Kubernetes side is [`super::up_graph`]'s; the others (and
//! Pod 1's with `--no-kube`) are started here: the Job Router only, each with its
//! own in-memory presence registry.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use podgate_kas::job_router::JobRouterConfig;
use podgate_kas::{Kas, KasConfig};
use podgate_loadtest::fleet::Progress;
use podgate_loadtest::pod_sim::PodSim;
use podgate_registry::{Pod, PodState, Registry, RegistryConfig};
use podgate_tokens::KeySet;

/// How runners reach the Job Router through the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Scheme {
    /// `grpc://<proxy>`: gRPC over h2c.
    Grpc,
    /// `ws://<proxy>/-/kubernetes-agent/`: gRPC inside a `ws-tunnel` WebSocket.
    Ws,
}

/// The Job Router's flags of `podgate up`.
#[derive(Debug, Args)]
pub(crate) struct JobRouterArgs {
    /// The URL form each Pod's discovery answers runners with.
    #[arg(long, value_enum, default_value = "grpc")]
    job_router_scheme: Scheme,
    /// Turn the Job Router off on this Pod (repeatable): its discovery answers 501
    /// and its kas `UNIMPLEMENTED`, so runners poll `jobs/request`.
    #[arg(long, value_name = "POD")]
    job_router_off: Vec<u64>,
}

impl JobRouterArgs {
    /// What Pod `pod`'s discovery names (`None`: off), runners reaching the proxy
    /// at `listen`.
    pub(crate) fn discovery_url(&self, pod: u64, listen: SocketAddr) -> Option<String> {
        (!self.job_router_off.contains(&pod)).then(|| match self.job_router_scheme {
            Scheme::Grpc => format!("grpc://{listen}"),
            Scheme::Ws => format!("ws://{listen}/-/kubernetes-agent/"),
        })
    }

    /// Pod `pod`'s kas Job Router, watching the runner queue keys in `queue_redis`.
    pub(crate) fn kas_config(&self, pod: u64, queue_redis: Option<&str>) -> JobRouterConfig {
        JobRouterConfig {
            enabled: !self.job_router_off.contains(&pod),
            runner_queue_redis: queue_redis.map(str::to_owned),
            ..JobRouterConfig::default()
        }
    }
}

/// A Pod's own kas (the Job Router only).
pub(crate) struct CellKas {
    kas: Option<Kas>,
    /// Its agent listener (the Pod's `kas` pool).
    pub(crate) agent: SocketAddr,
    /// Its observability listener (`/metrics` needs no token here: loopback).
    pub(crate) observability: SocketAddr,
}

impl CellKas {
    /// Its metrics (Prometheus text), read in process.
    pub(crate) fn metrics_text(&self) -> String {
        self.kas
            .as_ref()
            .map(|k| k.metrics().render())
            .unwrap_or_default()
    }

    /// Drain it.
    pub(crate) async fn shutdown(mut self) {
        if let Some(k) = self.kas.take() {
            let _ = k.shutdown_with_grace(Duration::from_secs(2)).await;
        }
    }
}

/// Start a kas for `sim` (its Rails) with `job_router`, on loopback ports.
pub(crate) async fn start_kas(
    sim: &PodSim,
    kas_secret: Vec<u8>,
    job_router: JobRouterConfig,
) -> anyhow::Result<CellKas> {
    let any: SocketAddr = "127.0.0.1:0".parse()?;
    let registry = Registry::connect(RegistryConfig::default())
        .await
        .context("a kas registry")?;
    let kas = Kas::start(
        KasConfig {
            external_listen: any,
            internal_listen: any,
            external_secret: kas_secret,
            internal_secret: super::up_graph::secret(),
            issuer: String::new(),
            agent_listen: any,
            agent_keys: KeySet::new(),
            advertise_internal: None,
            max_wait: Duration::from_secs(30),
            max_idle_tunnels_per_agent: podgate_kas::DEFAULT_MAX_IDLE_TUNNELS_PER_AGENT,
            observability_listen: Some(any),
            agent_info: None,
            metrics_token: None,
            k8s_proxy: None,
            gitlab_url: Some(format!("http://{}", sim.addr())),
            gitlab_external_url: None,
            agent_config: None,
            workspaces: None,
            job_router: Some(job_router),
        },
        registry,
    )
    .await
    .with_context(|| format!("starting Pod {}'s kas", sim.state().pod()))?;
    Ok(CellKas {
        agent: kas.agent_addr(),
        observability: kas
            .observability_addr()
            .context("kas's observability listener")?,
        kas: Some(kas),
    })
}

/// The fleet's runners' own metrics, as each gitlab-runner serves them on its
/// metrics listener, for the whole fleet with a `pod` label:
/// `gitlab_runner_job_router_fallbacks_total{pod,reason}` (`router/metrics.go`).
/// The console scrapes it as the source `runners`; served until dropped.
pub(crate) struct RunnerMetrics {
    pub(crate) addr: SocketAddr,
    report: Arc<FleetReport>,
    task: tokio::task::JoinHandle<()>,
}

impl RunnerMetrics {
    /// What the listener serves now.
    pub(crate) fn text(&self) -> String {
        podgate_agent::obs::Report::metrics(&*self.report)
    }
}

impl Drop for RunnerMetrics {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct FleetReport {
    progress: Arc<Progress>,
    /// The Pod of each registration token, by its index in the fleet's list.
    token_pods: Vec<u64>,
}

impl podgate_agent::obs::Report for FleetReport {
    fn metrics(&self) -> String {
        self.progress.job_router_fallbacks_metrics(|i| {
            self.token_pods
                .get(i)
                .map_or_else(|| "0".into(), u64::to_string)
        })
    }

    fn ready(&self) -> Result<(), String> {
        Ok(())
    }
}

/// Serve `progress`'s runner metrics on a loopback port.
pub(crate) async fn serve_runner_metrics(
    progress: Arc<Progress>,
    token_pods: Vec<u64>,
) -> anyhow::Result<RunnerMetrics> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("a listener for the fleet's metrics")?;
    let addr = listener.local_addr()?;
    let report = Arc::new(FleetReport {
        progress,
        token_pods,
    });
    let task = tokio::spawn(podgate_agent::obs::serve(listener, report.clone()));
    Ok(RunnerMetrics { addr, report, task })
}

/// The fleet's registration tokens (every Pod's instance token, then its projects'),
/// and the Pod of each.
pub(crate) fn fleet_tokens(sims: &[PodSim]) -> (Vec<String>, Vec<u64>) {
    sims.iter()
        .flat_map(|s| {
            let pod = s.state().pod().get();
            std::iter::once(s.state().registration_token().to_owned())
                .chain(
                    s.state()
                        .project_registration_tokens()
                        .into_iter()
                        .map(|(_, t)| t),
                )
                .map(move |t| (t, pod))
        })
        .unzip()
}

/// The live table's Job Router lines ([`super::up_table::job_router_table`]): every
/// Pod's kas (Pod 1's the Kubernetes side's, if it runs), the proxy's metrics, and
/// the fleet's fallbacks.
pub(crate) fn job_router_lines(
    kube: Option<&super::up_graph::KubeSide>,
    cells: &BTreeMap<u64, CellKas>,
    proxy_metrics: &str,
    runners: Option<&RunnerMetrics>,
) -> String {
    let mut kas: Vec<(u64, String)> = kube
        .map(|k| (1, k.kas_metrics_text()))
        .into_iter()
        .collect();
    kas.extend(cells.iter().map(|(pod, k)| (*pod, k.metrics_text())));
    kas.sort_by_key(|(pod, _)| *pod);
    super::up_table::job_router_table(
        &kas,
        proxy_metrics,
        &runners.map(RunnerMetrics::text).unwrap_or_default(),
    )
}

/// The topology the proxy routes on: each Pod's simulator as its web pool, its kas
/// (Pod 1's the Kubernetes side's, with its Kubernetes API proxy and Workspaces
/// pools, if it runs), and the Redis its runner queue keys are watched in.
pub(crate) fn topology(
    sims: &[PodSim],
    kube: Option<&super::up_graph::KubeSide>,
    cells: &BTreeMap<u64, CellKas>,
    edge_redis: Option<&str>,
) -> Vec<Pod> {
    sims.iter()
        .map(|s| {
            let id = s.state().pod();
            let pod1_kube = kube.filter(|_| id.get() == 1);
            let kas = match (cells.get(&id.get()), pod1_kube) {
                (Some(k), _) => vec![k.agent.to_string()],
                (None, Some(k)) => vec![k.kas_agent.to_string()],
                _ => Vec::new(),
            };
            Pod {
                id,
                name: format!("pod-{id}"),
                web: vec![s.addr().to_string()],
                kas,
                kas_k8s_proxy: pod1_kube
                    .map(|k| vec![k.kas_k8s_proxy.to_string()])
                    .unwrap_or_default(),
                kas_workspaces: pod1_kube
                    .map(|k| vec![k.kas_workspaces.to_string()])
                    .unwrap_or_default(),
                state: PodState::Active,
                labels: BTreeMap::new(),
                session_prefix: None,
                runner_queue_redis: edge_redis.map(str::to_owned),
                // The Topology Service's address of the Pod's Cell (`up_topology`).
                cell_address: Some(s.addr().to_string()),
            }
        })
        .collect()
}
