//! The Kubernetes side of `podgate up`: a kube-sim cluster (generated objects, light
//! churn), Pod 1's kas with its Kubernetes API proxy (and the Pod's Job Router,
//! [`super::up_cells`]), and one agentk connected
//! through the podgate proxy. Users reach the cluster the way GitLab users do:
//! `kubectl` and the Graph API through the proxy's `/-/kubernetes-agent/k8s-proxy/`
//! with `Bearer pat:<agent id>:<personal access token>`, which the proxy routes by the
//! token's Pod and kas authorizes with the Pod simulator (GitLab's internal API).
//!
//! kube-sim's controllers run (Deployments get ReplicaSets, Pods and a moving
//! status; Services of available Deployments get backends): the Workspaces module
//! of agentk ([`super::up_workspaces`]) needs them. At start they roll every
//! generated Deployment out once with ReplicaSets of their own; the churn starts
//! once that settled, so users (and the Graph API) see a steady cluster. Both start
//! only once the proxy listens ([`KubeSide::run_controllers`]): the Service
//! backends take ports on `127.0.0.1`, which should not race the proxy's own.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use podgate_agentk::{Agentk, AgentkConfig};
use podgate_kas::k8s_proxy::K8sProxyConfig;
use podgate_kas::workspaces::WorkspacesConfig;
use podgate_kas::{Kas, KasConfig};
use podgate_kube_sim::{self as kube_sim, Churn, Controllers, KubeSim};
use podgate_loadtest::pod_sim::PodSim;
use podgate_registry::{Registry, RegistryConfig};
use podgate_tokens::{Algorithm, KeySet, MintRequest, PodId, TokenKind};
use serde_json::{Value, json};

/// Where users reach kas's Kubernetes API proxy on the podgate proxy.
pub(crate) const K8S_PROXY_PREFIX: &str = "/-/kubernetes-agent/k8s-proxy/";

/// The agent `podgate up` runs.
pub(crate) const AGENT_ID: i64 = 1;

/// agentk's namespace (GitLab's Helm chart default).
const AGENT_NAMESPACE: &str = "gitlab-agent";

/// kube-sim, kas and agentk; stopped when dropped.
pub(crate) struct KubeSide {
    /// kas's agent listener (Pod 1's `kas` pool).
    pub(crate) kas_agent: SocketAddr,
    /// kas's Kubernetes API proxy listener (Pod 1's `kas_k8s_proxy` pool).
    pub(crate) kas_k8s_proxy: SocketAddr,
    /// kas's Workspaces HTTP server (`https://<port>-<workspace>.<zone>/` traffic).
    pub(crate) kas_workspaces: SocketAddr,
    /// kube-sim's address.
    pub(crate) kube_sim: SocketAddr,
    /// Objects kube-sim started with.
    pub(crate) objects: usize,
    /// The public key (PEM) verifying agent tokens: the proxy needs it to route them.
    pub(crate) agent_key_pem: String,
    /// The agent configuration directory kas reads (Workspaces enabled).
    pub(crate) agent_config: super::up_workspaces::AgentConfigDir,
    /// Whether the controllers' first rollout settled before the churn started.
    pub(crate) settled: bool,
    /// kas's observability listener (`/metrics` behind [`KubeSide::metrics_token`],
    /// `/healthz`, `/readyz`).
    pub(crate) kas_observability: SocketAddr,
    /// The bearer token kas's `/metrics` requires.
    pub(crate) metrics_token: String,
    /// agentk's observability listener, once it runs.
    pub(crate) agentk_observability: Option<SocketAddr>,
    churn_rate: f64,
    keys: KeySet,
    sim: KubeSim,
    kube_task: tokio::task::JoinHandle<()>,
    _churn: Option<Churn>,
    _controllers: Option<Controllers>,
    kas: Option<Kas>,
    agentk: Option<Agentk>,
}

impl Drop for KubeSide {
    fn drop(&mut self) {
        self.agentk.take();
        self.kas.take();
        self.kube_task.abort();
    }
}

/// 32 random bytes: a kas secret.
pub(crate) fn secret() -> Vec<u8> {
    use rand::RngCore as _;
    let mut s = vec![0u8; 32];
    rand::thread_rng().fill_bytes(&mut s);
    s
}

/// How long `podgate up` waits for the controllers' first rollout.
const SETTLE_WAIT: Duration = Duration::from_secs(60);

/// Start kube-sim (with `objects` generated objects; its controllers, then changes
/// at `churn` per second, start with [`KubeSide::run_controllers`]) and kas
/// (GitLab: `gitlab`, the Pod simulator whose kas secret is `kas_secret`, for the
/// Kubernetes API proxy, module requests and agent configurations). Browsers may
/// call kas's Kubernetes API proxy from `allowed_origins` (the web console's).
pub(crate) async fn start(
    objects: usize,
    churn: f64,
    gitlab: &PodSim,
    kas_secret: Vec<u8>,
    allowed_origins: Vec<String>,
    job_router: podgate_kas::job_router::JobRouterConfig,
) -> anyhow::Result<KubeSide> {
    let sim = KubeSim::new(10_000);
    let objects = sim.generate(objects, 1);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("binding kube-sim")?;
    let kube_addr = listener.local_addr()?;
    let served = sim.clone();
    let kube_task =
        tokio::spawn(async move { served.serve(listener, std::future::pending()).await });
    let agent_config = super::up_workspaces::AgentConfigDir::new(AGENT_ID)?;

    let key = podgate_tokens::keys::generate(Algorithm::EdDSA)
        .map_err(|e| anyhow::anyhow!("an agent key: {e}"))?;
    let keys = podgate_tokens::keys::keyset_from_generated("agents", &key)
        .map_err(|e| anyhow::anyhow!("the agent key set: {e}"))?;
    let any: SocketAddr = "127.0.0.1:0".parse()?;
    let registry = Registry::connect(RegistryConfig::default())
        .await
        .context("kas's registry")?;
    // Every kas endpoint is authenticated, `/metrics` too.
    let metrics_token = hex::encode(secret());
    let kas = Kas::start(
        KasConfig {
            external_listen: any,
            internal_listen: any,
            external_secret: kas_secret,
            internal_secret: secret(),
            issuer: "gitlab".into(),
            agent_listen: any,
            agent_keys: keys.clone(),
            advertise_internal: None,
            max_wait: Duration::from_secs(30),
            max_idle_tunnels_per_agent: podgate_kas::DEFAULT_MAX_IDLE_TUNNELS_PER_AGENT,
            observability_listen: Some(any),
            agent_info: None,
            metrics_token: Some(metrics_token.clone()),
            k8s_proxy: Some(K8sProxyConfig {
                // GitLab's Omnibus layout: the proxy on GitLab's host, the prefix
                // kept (kas `kubernetes_api.url_path_prefix`).
                url_prefix: K8S_PROXY_PREFIX.into(),
                allowed_origins,
                ..K8sProxyConfig::new(any, &format!("http://{}", gitlab.addr()))
            }),
            gitlab_url: Some(format!("http://{}", gitlab.addr())),
            gitlab_external_url: None,
            agent_config: Some(agent_config.source()),
            workspaces: Some(WorkspacesConfig::new(
                any,
                &format!("http://{}", gitlab.addr()),
            )),
            job_router: Some(job_router),
        },
        registry,
    )
    .await
    .context("starting kas")?;
    Ok(KubeSide {
        kas_observability: kas
            .observability_addr()
            .context("kas has no observability listener")?,
        metrics_token,
        agentk_observability: None,
        kas_agent: kas.agent_addr(),
        kas_k8s_proxy: kas
            .k8s_proxy_addr()
            .context("kas has no Kubernetes API proxy listener")?,
        kas_workspaces: kas
            .workspaces_addr()
            .context("kas has no Workspaces listener")?,
        kube_sim: kube_addr,
        objects,
        agent_key_pem: key
            .public
            .clone()
            .context("an Ed25519 key has a public key")?,
        agent_config,
        settled: false,
        churn_rate: churn,
        keys,
        sim,
        kube_task,
        _churn: None,
        _controllers: None,
        kas: Some(kas),
        agentk: None,
    })
}

/// Wait (at most `timeout`) until every Deployment in `sim` is rolled out: as many
/// replicas, updated replicas and available replicas as it asks for. Whether it
/// happened in time.
async fn settle(sim: &KubeSim, timeout: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let rolled_out = sim
            .objects()
            .iter()
            .filter(|o| o.group == "apps" && o.resource == "deployments")
            .all(|o| {
                let d = o.value();
                let n = |v: &Value| v.as_i64().unwrap_or(0);
                let want = d["spec"]["replicas"].as_i64().unwrap_or(1);
                let status = &d["status"];
                n(&status["replicas"]) == want
                    && n(&status["updatedReplicas"]) == want
                    && n(&status["availableReplicas"]) == want
            });
        if rolled_out {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        // The store has no "all rolled out" event: look every 100 ms.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl KubeSide {
    /// Its kas's metrics (Prometheus text), read in process.
    pub(crate) fn kas_metrics_text(&self) -> String {
        self.kas
            .as_ref()
            .map(|k| k.metrics().render())
            .unwrap_or_default()
    }

    /// Start kube-sim's controllers, wait (a bounded time) until their first
    /// rollout settled ([`KubeSide::settled`] tells whether it did), then start the
    /// churn.
    pub(crate) async fn run_controllers(&mut self) {
        self._controllers = Some(self.sim.start_controllers());
        self.settled = settle(&self.sim, SETTLE_WAIT).await;
        self._churn = (self.churn_rate > 0.0).then(|| self.sim.start_churn(self.churn_rate, 1));
    }

    /// Stop agentk first (its Workspaces module ends its cycle and gives the Lease
    /// up), then kas and kube-sim.
    pub(crate) async fn shutdown(mut self) {
        if let Some(agentk) = self.agentk.take() {
            agentk.shutdown().await;
        }
    }

    /// Start agentk for [`AGENT_ID`] (a token routable to `pod`, registered with
    /// GitLab, `gitlab`, as the agent's token), dialling kas through the proxy at
    /// `proxy`, with a kubeconfig for kube-sim written into `dir`, in its namespace
    /// `gitlab-agent`; wait until it is connected.
    pub(crate) async fn connect_agent(
        &mut self,
        proxy: SocketAddr,
        pod: PodId,
        gitlab: &PodSim,
        dir: &Path,
    ) -> anyhow::Result<()> {
        let mut req = MintRequest::new(TokenKind::Agent, pod, 365 * 24 * 3600);
        req.agent = Some(AGENT_ID as u64);
        req.project = Some(podgate_loadtest::pod_sim::kubernetes::project_id(pod));
        let signing = self.keys.signing_key().context("the agent signing key")?;
        let token = podgate_tokens::mint(&req, signing, podgate_tokens::unix_now())
            .context("minting the agent token")?;
        // GitLab keeps agent tokens (`cluster_agent_tokens`): the module requests
        // kas makes for agentk carry it, and GitLab names the agent by it.
        gitlab
            .kube()
            .add_agent_token(token.clone(), AGENT_ID)
            .map_err(|e| anyhow::anyhow!("registering the agent token with GitLab: {e}"))?;
        // agentk's own namespace (the Workspaces leader Lease lives there).
        if self.sim.get("namespaces", "", AGENT_NAMESPACE).is_none() {
            self.sim.put(
                "namespaces",
                "",
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": AGENT_NAMESPACE}}),
            );
        }
        let kubeconfig = dir.join("agentk-kubeconfig");
        std::fs::write(
            &kubeconfig,
            kube_sim::kubeconfig(&format!("http://{}", self.kube_sim)),
        )?;
        let agentk = Agentk::start(AgentkConfig {
            kas_url: format!("grpc://{proxy}"),
            token,
            pod_namespace: AGENT_NAMESPACE.into(),
            pod_name: "agentk-up".into(),
            idle_tunnels: 4,
            max_busy_tunnels: 500,
            observability_listen: Some("127.0.0.1:0".parse()?),
            kubeconfig: Some(kubeconfig),
            ca_file: None,
            graph_sync_timeout: Duration::from_secs(30),
        })
        .await
        .context("starting agentk")?;
        tokio::time::timeout(Duration::from_secs(30), agentk.connected())
            .await
            .context("agentk did not connect to kas through the proxy in 30 s")?;
        self.agentk_observability = agentk.observability_addr();
        self.agentk = Some(agentk);
        Ok(())
    }
}

/// A self-signed P-256 certificate for `localhost` and `127.0.0.1` (its own CA):
/// `(tls.crt, tls.key)` written into `dir`. client-go sends a bearer token only over
/// TLS, so `kubectl` needs the proxy's TLS listener.
pub(crate) fn self_signed_cert(dir: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
    let (cert, key) = podgate_kube_sim::self_signed()?;
    let (cert_path, key_path) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&cert_path, cert.to_pem()?)?;
    std::fs::write(&key_path, key.private_key_to_pem_pkcs8()?)?;
    Ok((cert_path, key_path))
}

/// A kubeconfig for `kubectl`: the proxy's Kubernetes API proxy URL (HTTPS, trusting
/// `ca`) and the bearer value `pat:<agent>:<token>`. Written into `dir`; its path.
pub(crate) fn user_kubeconfig(
    dir: &Path,
    server: &str,
    ca: &Path,
    bearer: &str,
) -> anyhow::Result<PathBuf> {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: podgate\n  cluster:\n    server: {server}\n    \
         certificate-authority: {}\n\
         users:\n- name: podgate\n  user:\n    token: \"{bearer}\"\ncontexts:\n- name: podgate\n  context:\n    \
         cluster: podgate\n    user: podgate\n    namespace: default\ncurrent-context: podgate\n",
        ca.display()
    );
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}
