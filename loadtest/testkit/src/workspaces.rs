//! The Workspaces stack of tests, in one process: kube-sim with its controllers,
//! the Pod simulator as GitLab (the kas secret, the agent-token keys, agent 7 with
//! user access), a kas asking it (`[gitlab]`, agent configuration files, the
//! Workspaces listener) and a real agentk whose agent configuration enables
//! `remote_development`. [`WorkspacesStack::builder`] starts it; the smaller
//! pieces ([`pod_sim_config`], [`gitlab_kas_config`], [`agentk_config`]) serve tests
//! that build only part of it. They panic on failure: a fixture that cannot be set
//! up is a failed test.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use podgate_loadtest::pod_sim::workspaces::{ActualState, DesiredState, Workspace, WorkspaceSpec};
use podgate_loadtest::pod_sim::{AgentSpec, PodSim, PodSimConfig};

use crate::fixtures::{AgentTokens, EXTERNAL_SECRET, kas_config, memory_registry};
use crate::kube::KubeTestServer;
use podgate_agentk::{Agentk, AgentkConfig};
use podgate_kas::agent_config::AgentConfigSource;
use podgate_kas::workspaces::WorkspacesConfig;
use podgate_kas::{Kas, KasConfig};
use podgate_kube_sim::Controllers;

/// Every step of a Workspaces test is bounded: a hang is a failure.
pub const STEP: Duration = Duration::from_secs(30);

/// The agent whose workspaces the stack runs.
pub const AGENT: i64 = 7;

/// The DNS zone of the agent's `remote_development` configuration.
pub const ZONE: &str = "workspaces.example.dev";

/// Wait (bounded by [`STEP`]) until `check` holds. The Pod simulator's store has
/// no change notification, so it is looked at every 20 ms.
pub async fn until(what: &str, mut check: impl FnMut() -> bool) {
    tokio::time::timeout(STEP, async {
        while !check() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: not in time"));
}

/// Pod `pod`'s simulator config on a free loopback port: the test kas secret,
/// agent JWTs verified with `tokens`' keys, `agents` with user access.
pub fn pod_sim_config(pod: u64, agents: &[i64], tokens: &AgentTokens) -> PodSimConfig {
    let pod = podgate_tokens::PodId::new(pod).expect("a valid Pod id");
    let mut config = PodSimConfig::new(pod, SocketAddr::from(([127, 0, 0, 1], 0)));
    config.kas_secret = Some(EXTERNAL_SECRET.to_vec());
    config.keys = tokens.keys();
    config.agents = agents
        .iter()
        .map(|a| AgentSpec::with_user_access(*a, pod))
        .collect();
    config
}

/// A loopback kas ([`kas_config`]) asking GitLab at `gitlab` and, when `agent_configs`
/// is given, serving the agent configuration files of that directory (looked at
/// every 50 ms).
pub fn gitlab_kas_config(
    tokens: &AgentTokens,
    gitlab: &str,
    agent_configs: Option<&Path>,
    max_wait: Duration,
) -> KasConfig {
    KasConfig {
        gitlab_url: Some(gitlab.to_owned()),
        gitlab_external_url: None,
        agent_config: agent_configs.map(|dir| AgentConfigSource {
            dir: dir.to_owned(),
            poll: Duration::from_millis(50),
        }),
        ..kas_config(tokens.keys(), max_wait)
    }
}

/// `config` with a Workspaces listener on a free loopback port, asking the GitLab
/// of its `gitlab_url`.
pub fn with_workspaces(config: KasConfig) -> KasConfig {
    let gitlab = config.gitlab_url.clone().expect("a GitLab URL");
    KasConfig {
        workspaces: Some(WorkspacesConfig::new(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            &gitlab,
        )),
        ..config
    }
}

/// Start a kas with `config` on a fresh in-memory registry.
pub async fn start_kas(config: KasConfig) -> Kas {
    Kas::start(config, memory_registry().await)
        .await
        .expect("kas starts")
}

/// agentk replica `agentk-0` in namespace `default` connecting to `kas` with
/// `token`, its cluster the one of `kubeconfig` (none: no cluster).
pub fn agentk_config(kas: &Kas, token: String, kubeconfig: Option<PathBuf>) -> AgentkConfig {
    AgentkConfig {
        kas_url: format!("grpc://{}", kas.agent_addr()),
        token,
        pod_namespace: "default".into(),
        pod_name: "agentk-0".into(),
        idle_tunnels: 2,
        max_busy_tunnels: 10,
        observability_listen: None,
        kubeconfig,
        ca_file: None,
        graph_sync_timeout: Duration::from_secs(30),
    }
}

/// How to start a [`WorkspacesStack`].
#[derive(Clone, Debug)]
pub struct WorkspacesStackBuilder {
    pod: u64,
    max_wait: Duration,
    workspaces_listener: bool,
    rbac: Option<Vec<serde_json::Value>>,
}

/// The namespace agentk runs in (its Lease's) when the stack enforces RBAC: the one
/// `deploy/agentk` installs into.
pub const AGENTK_NAMESPACE: &str = "gitlab-agent";

/// The ServiceAccount agentk runs as when the stack enforces RBAC.
pub const AGENTK_SERVICE_ACCOUNT: &str = "podgate-agentk";

/// The token of [`AGENTK_SERVICE_ACCOUNT`] when the stack enforces RBAC.
pub const AGENTK_TOKEN: &str = "podgate-agentk-service-account-token";

impl WorkspacesStackBuilder {
    /// The Pod of the simulator and of the agent tokens (default 1).
    pub fn pod(mut self, pod: u64) -> Self {
        self.pod = pod;
        self
    }

    /// kas's `max_wait` (default 5 s).
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// Enforce RBAC in kube-sim with these objects stored first (ServiceAccounts,
    /// Roles, ClusterRoles and their bindings: `deploy/agentk` rendered), and run
    /// agentk in [`AGENTK_NAMESPACE`] as [`AGENTK_SERVICE_ACCOUNT`], whose token
    /// Secret ([`AGENTK_TOKEN`]) the stack adds. kube-sim's audit then keeps
    /// every request (up to a million). Default: no RBAC, agentk in
    /// `default`.
    pub fn rbac(mut self, objects: Vec<serde_json::Value>) -> Self {
        self.rbac = Some(objects);
        self
    }

    /// Whether kas has its Workspaces listener (default yes).
    pub fn workspaces_listener(mut self, on: bool) -> Self {
        self.workspaces_listener = on;
        self
    }

    /// Start everything; returns once agentk is connected and kas has told GitLab
    /// that agent [`AGENT`]'s workspaces are enabled.
    pub async fn start(self) -> WorkspacesStack {
        let kube = KubeTestServer::start(10_000)
            .await
            .expect("kube-sim starts");
        let controllers = kube.sim().start_controllers();
        let tokens = AgentTokens::new(self.pod);
        let mut sim_config = pod_sim_config(self.pod, &[AGENT], &tokens);
        sim_config
            .workspaces
            .settings
            .partial_reconciliation_interval_seconds = 1;
        let sim = PodSim::start(sim_config)
            .await
            .expect("the Pod simulator starts");

        let dir = tempfile::tempdir().expect("a temporary directory");
        std::fs::write(
            dir.path().join(format!("{AGENT}.yaml")),
            format!("remote_development:\n  enabled: true\n  dns_zone: {ZONE}\n"),
        )
        .expect("writing the agent configuration");
        let kubeconfig = dir.path().join("kubeconfig");
        let kubeconfig_text = match &self.rbac {
            Some(objects) => {
                install_agentk_rbac(&kube, objects);
                podgate_kube_sim::kubeconfig_with(&kube.url(), Some(AGENTK_TOKEN), None)
            }
            None => kube.kubeconfig(),
        };
        std::fs::write(&kubeconfig, kubeconfig_text).expect("writing the kubeconfig");
        let mut config = gitlab_kas_config(
            &tokens,
            &format!("http://{}", sim.addr()),
            Some(dir.path()),
            self.max_wait,
        );
        if self.workspaces_listener {
            config = with_workspaces(config);
        }
        let kas = start_kas(config).await;
        let mut agentk_config =
            agentk_config(&kas, tokens.mint(Some(AGENT as u64)), Some(kubeconfig));
        if self.rbac.is_some() {
            agentk_config.pod_namespace = AGENTK_NAMESPACE.into();
        }
        let agentk = Agentk::start(agentk_config).await.expect("agentk starts");
        tokio::time::timeout(STEP, agentk.connected())
            .await
            .expect("agentk connects in time");
        // kas told GitLab the agent's workspaces configuration.
        until("the agent's workspaces config at GitLab", || {
            sim.workspaces()
                .agent_config(AGENT)
                .is_some_and(|c| c.enabled)
        })
        .await;
        WorkspacesStack {
            kube,
            _controllers: controllers,
            tokens,
            sim,
            kas,
            agentk,
            _dir: dir,
        }
    }
}

/// What an operator installs before agentk runs: its namespace
/// ([`AGENTK_NAMESPACE`]), `objects` (`deploy/agentk`'s ServiceAccount and RBAC,
/// rendered), and the ServiceAccount's token Secret ([`AGENTK_TOKEN`]; kube-sim
/// has no token controller). Then kube-sim's audit keeps every request (tests of
/// the RBAC read them all) and RBAC is enforced.
pub fn install_agentk_rbac(kube: &KubeTestServer, objects: &[serde_json::Value]) {
    use base64::Engine as _;
    use serde_json::json;
    let mut docs = vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": AGENTK_NAMESPACE}}),
    ];
    docs.extend(objects.iter().cloned());
    docs.push(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "podgate-agentk-token", "namespace": AGENTK_NAMESPACE,
                     "annotations": {"kubernetes.io/service-account.name": AGENTK_SERVICE_ACCOUNT}},
        "type": "kubernetes.io/service-account-token",
        "data": {"token": base64::engine::general_purpose::STANDARD.encode(AGENTK_TOKEN)},
    }));
    let text: Vec<String> = docs.iter().map(serde_json::Value::to_string).collect();
    kube.sim()
        .load_seed(&text.join("\n---\n"))
        .expect("agentk's ServiceAccount and RBAC");
    kube.sim().set_audit_limit(1_000_000);
    kube.sim().enforce_rbac(true);
}

/// The running stack. Dropping it stops everything; [`WorkspacesStack::shutdown`]
/// stops agentk first, as a replica going away does.
pub struct WorkspacesStack {
    /// The cluster (its controllers run while the stack lives).
    pub kube: KubeTestServer,
    _controllers: Controllers,
    /// The agent-token key (Pod [`WorkspacesStackBuilder::pod`]).
    pub tokens: AgentTokens,
    /// GitLab.
    pub sim: PodSim,
    /// kas.
    pub kas: Kas,
    /// agentk for agent [`AGENT`].
    pub agentk: Agentk,
    _dir: tempfile::TempDir,
}

impl WorkspacesStack {
    /// Pod 1, kas `max_wait` 5 s, with the Workspaces listener.
    pub fn builder() -> WorkspacesStackBuilder {
        WorkspacesStackBuilder {
            pod: 1,
            max_wait: Duration::from_secs(5),
            workspaces_listener: true,
            rbac: None,
        }
    }

    /// kas's Workspaces listener.
    pub fn workspaces_addr(&self) -> SocketAddr {
        self.kas.workspaces_addr().expect("the Workspaces listener")
    }

    /// Workspace `id`'s actual state at GitLab.
    pub fn actual_state(&self, id: u64) -> ActualState {
        self.sim
            .workspaces()
            .get(id)
            .expect("the workspace")
            .actual_state
    }

    /// Create a workspace of agent [`AGENT`] for user 1 with `spec`, and wait until
    /// it is `Running`.
    pub async fn running_workspace(&self, spec: WorkspaceSpec) -> Workspace {
        let ws = self
            .sim
            .create_workspace(AGENT, 1, spec)
            .expect("creating a workspace");
        until("Running", || {
            self.actual_state(ws.id) == ActualState::Running
        })
        .await;
        ws
    }

    /// Set workspace `id`'s desired state and wait until its actual state is
    /// `actual`.
    pub async fn set_state(&self, id: u64, desired: DesiredState, actual: ActualState) {
        self.sim
            .set_workspace_desired_state(id, desired)
            .expect("setting the desired state");
        until(&format!("{actual:?}"), || self.actual_state(id) == actual).await;
    }

    /// Stop agentk (its Lease given up), then the rest.
    pub async fn shutdown(self) {
        let WorkspacesStack { agentk, .. } = self;
        agentk.shutdown().await;
    }
}

/// `GET path` over HTTP/1.0 to `addr` with `host` and `extra` header lines (each
/// ending `\r\n`): the status (0 when there is none) and the body.
pub async fn get_host(addr: SocketAddr, path: &str, host: &str, extra: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connecting");
    let head = format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n{extra}\r\n");
    s.write_all(head.as_bytes())
        .await
        .expect("writing the request");
    let mut out = Vec::new();
    tokio::time::timeout(STEP, s.read_to_end(&mut out))
        .await
        .expect("an answer in time")
        .expect("reading the answer");
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, body.to_owned())
}

/// The `error` of kas's JSON answer (empty when there is none).
pub fn error(body: &str) -> String {
    let v: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|_| panic!("JSON: {body}"));
    v["error"].as_str().unwrap_or_default().to_owned()
}

/// Assert that `answer` (status, body) is kas's JSON refusal: `status` with
/// `error` `code`.
#[track_caller]
pub fn assert_refused(answer: &(u16, String), status: u16, code: &str) {
    let (got, body) = answer;
    assert_eq!((*got, error(body).as_str()), (status, code), "{body}");
}

/// Assert that `answer` is the kube-sim backend of workspace `ws` on `port`
/// answering a request whose request line starts with `request`.
#[track_caller]
pub fn assert_backend(answer: &(u16, String), ws: &Workspace, port: u32, request: &str) {
    let (status, body) = answer;
    assert_eq!(*status, 200, "port {port}: {body}");
    assert!(
        body.contains(&format!("deployment {}/{}", ws.namespace, ws.name))
            && body.contains(&format!("port {port}"))
            && body.contains(request),
        "port {port}: {body}"
    );
}

/// Assert that `answer` is kas's 503 for workspace `ws`, which is not running.
#[track_caller]
pub fn assert_not_running(answer: &(u16, String), ws: &Workspace) {
    let (status, body) = answer;
    assert_eq!(*status, 503, "{body}");
    let v: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
    assert_eq!(v["error"], "WORKSPACE_NOT_RUNNING");
    assert_eq!(
        v["message"],
        format!("workspace {} is not running", ws.name)
    );
}
