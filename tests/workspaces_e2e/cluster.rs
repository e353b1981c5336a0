//! One simulated installation, every part a real process: kube-sim with its
//! controllers and RBAC enforced, the Pod simulator as GitLab, a [`Recorder`] between kas and GitLab,
//! kas (with the agent's configuration enabling `remote_development`) and agentk
//! replicas of agent 1, which elect a leader with a Lease.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use podgate_registry::testing::eventually;
use podgate_tokens::{Algorithm, MintRequest, PodId, TokenKind};
use serde_json::{Value, json};

use super::http::{Json, Kube};
use super::procs::Proc;
use super::recorder::Recorder;

/// How long a process may take to say it is up.
const UP: Duration = Duration::from_secs(60);

/// The agent every workspace runs on.
pub const AGENT: u64 = 1;

/// Where agentk replicas run (the Lease's namespace).
pub const AGENT_NAMESPACE: &str = "gitlab-agent";

/// Timings of the simulated cluster and of GitLab's reconcile settings.
pub struct Timings {
    /// kube-sim: a Pod's start (kept above the partial interval so `Starting` is
    /// reported at least once).
    pub pod_start: &'static str,
    /// kube-sim: a Pod's stop.
    pub pod_stop: &'static str,
    /// kube-sim: how long a deleted namespace stays Terminating.
    pub namespace_delete: &'static str,
    /// GitLab's `full_reconciliation_interval_seconds`.
    pub full: &'static str,
    /// GitLab's `partial_reconciliation_interval_seconds`.
    pub partial: &'static str,
}

/// The running installation; every process is killed when it is dropped.
pub struct Cluster {
    _dir: tempfile::TempDir,
    pub kube: Kube,
    pub gitlab: Json,
    pub recorder: Recorder,
    kas: Proc,
    kas_config: PathBuf,
    kas_agent_port: u16,
    token_file: PathBuf,
    kubeconfig: PathBuf,
    pub agentks: Vec<(String, Proc)>,
    _kube_proc: Proc,
    _pod_proc: Proc,
}

impl Cluster {
    /// Start everything and `replicas` agentk replicas.
    pub async fn start(t: Timings, replicas: usize) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_owned();
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let secret: [u8; 32] = rand::random();
        std::fs::write(d.join("kas-secret"), b64(&secret)).unwrap();
        std::fs::write(d.join("internal-secret"), b64(&rand::random::<[u8; 32]>())).unwrap();

        // The agent's token: a JWT routable to Pod 1, verified by kas and by GitLab
        // with the same public key.
        let key = podgate_tokens::keys::generate(Algorithm::EdDSA).unwrap();
        let keys = podgate_tokens::keys::keyset_from_generated("agents", &key).unwrap();
        std::fs::write(d.join("agents.pem"), key.public.clone().unwrap()).unwrap();
        let pod = PodId::new(1).unwrap();
        let mut req = MintRequest::new(TokenKind::Agent, pod, 3600);
        req.agent = Some(AGENT);
        req.project = Some(podgate_loadtest::pod_sim::kubernetes::project_id(pod));
        let token = podgate_tokens::mint(
            &req,
            keys.signing_key().unwrap(),
            podgate_tokens::unix_now(),
        )
        .unwrap();
        let token_file = d.join("agent-token");
        std::fs::write(&token_file, &token).unwrap();

        let admin_kubeconfig = d.join("admin.kubeconfig");
        let mut kube_proc = Proc::spawn(
            "kube-sim",
            &[
                "kube-sim",
                "--listen",
                "127.0.0.1:0",
                "--enforce-rbac",
                "--controllers",
                "on",
                "--kubeconfig-out",
                admin_kubeconfig.to_str().unwrap(),
                "--pod-start-delay",
                t.pod_start,
                "--pod-stop-delay",
                t.pod_stop,
                "--namespace-delete-delay",
                t.namespace_delete,
                // A crashing container's Deployment fails after 600 s × 0.01.
                "--progress-deadline-factor",
                "0.01",
            ],
        );
        kube_proc.line("Kubernetes API on", UP).await;
        // The test is the cluster's administrator; agentk is not.
        let kube = Kube::from_kubeconfig(&admin_kubeconfig).await;
        let kubeconfig = install_agentk_rbac(&kube, &admin_kubeconfig, &d).await;

        let mut pod_proc = Proc::spawn(
            "pod-sim",
            &[
                "pod-sim",
                "--pod-id",
                "1",
                "--listen",
                "127.0.0.1:0",
                "--job-rate",
                "0",
                "--kas-secret-file",
                d.join("kas-secret").to_str().unwrap(),
                "--agent",
                &AGENT.to_string(),
                "--key",
                d.join("agents.pem").to_str().unwrap(),
                "--workspaces-full-interval",
                t.full,
                "--workspaces-partial-interval",
                t.partial,
            ],
        );
        let gitlab_url = pod_proc.value_after("listening on", "on ", UP).await;
        let gitlab_addr: SocketAddr = gitlab_url.trim_start_matches("http://").parse().unwrap();
        pod_proc.line("workspaces on", UP).await;
        let recorder = Recorder::start(gitlab_addr).await;

        // kas: GitLab through the recorder, the agent's configuration from a
        // directory (what GitLab's kas reads from the agent's project).
        std::fs::create_dir(d.join("agents")).unwrap();
        std::fs::write(
            d.join("agents").join(format!("{AGENT}.yaml")),
            "remote_development:\n  enabled: true\n  dns_zone: workspaces.test\n",
        )
        .unwrap();
        // Every listener on port 0 (a port picked beforehand could be taken by one
        // of kube-sim's workspace backends before kas binds it); a restart reuses the
        // agent port kas got, which agentk dials.
        let kas_config = d.join("kas.toml");
        std::fs::write(
            &kas_config,
            format!(
                "agent_listen = \"127.0.0.1:0\"\n\
                 external_listen = \"127.0.0.1:0\"\ninternal_listen = \"127.0.0.1:0\"\n\
                 observability_listen = \"127.0.0.1:0\"\n\
                 external_secret_file = \"{d}/kas-secret\"\ninternal_secret_file = \"{d}/internal-secret\"\n\
                 agent_keys = [\"{d}/agents.pem\"]\n\
                 [gitlab]\nurl = \"http://{}\"\n\
                 [agent_configuration]\ndir = \"{d}/agents\"\npoll = \"1s\"\n",
                recorder.addr,
                d = d.display(),
            ),
        )
        .unwrap();
        let mut kas = start_kas(&kas_config).await;
        let kas_agent: SocketAddr = kas
            .value_after("kas: agents on", "agents on ", UP)
            .await
            .parse()
            .unwrap();
        let text = std::fs::read_to_string(&kas_config).unwrap();
        std::fs::write(
            &kas_config,
            text.replace(
                "agent_listen = \"127.0.0.1:0\"",
                &format!("agent_listen = \"{kas_agent}\""),
            ),
        )
        .unwrap();
        let kas_agent_port = kas_agent.port();

        let mut cluster = Cluster {
            _dir: dir,
            kube,
            gitlab: Json::new(gitlab_addr),
            recorder,
            kas,
            kas_config,
            kas_agent_port,
            token_file,
            kubeconfig,
            agentks: Vec::new(),
            _kube_proc: kube_proc,
            _pod_proc: pod_proc,
        };
        for i in 0..replicas {
            cluster.start_agentk(&format!("agentk-{i}"));
        }
        cluster
    }

    /// Start an agentk replica named `name` (its Pod name and Lease identity).
    pub fn start_agentk(&mut self, name: &str) {
        let proc = Proc::spawn(
            name,
            &[
                "agentk",
                "--kas",
                &format!("grpc://127.0.0.1:{}", self.kas_agent_port),
                "--token-file",
                self.token_file.to_str().unwrap(),
                "--kubeconfig",
                self.kubeconfig.to_str().unwrap(),
                "--observability-listen",
                "off",
                "--pod-namespace",
                AGENT_NAMESPACE,
                "--pod-name",
                name,
                "--leader-lease-duration",
                "3",
                "--leader-renew-deadline",
                "2",
                "--leader-retry-period",
                "0.5",
            ],
        );
        self.agentks.push((name.to_owned(), proc));
    }

    /// SIGKILL the replica `name`.
    pub async fn kill_agentk(&mut self, name: &str) {
        let (_, proc) = self
            .agentks
            .iter_mut()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no agentk {name}"));
        proc.kill().await;
    }

    /// Stop kas (SIGTERM, as a rolling restart does) and start it again on the same
    /// ports.
    pub async fn restart_kas(&mut self) {
        self.kas.terminate().await;
        self.kas = start_kas(&self.kas_config).await;
    }

    /// The holder of agent 1's Lease (`""`: none), from the API server.
    pub async fn lease_holder(&self) -> String {
        let (status, lease) = self
            .kube
            .get(&format!(
                "/apis/coordination.k8s.io/v1/namespaces/{AGENT_NAMESPACE}/leases/agent-{AGENT}-lock"
            ))
            .await;
        if status != 200 {
            return String::new();
        }
        lease["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Until some replica holds the Lease: its name.
    pub async fn leader(&self, within: Duration) -> String {
        eventually(within, "an agentk replica to hold the Lease", || async {
            let h = self.lease_holder().await;
            (!h.is_empty()).then_some(h)
        })
        .await
    }

    /// Create a workspace for user 1 with `spec` (image, ports): its view.
    pub async fn create(&self, spec: Value) -> Value {
        let mut body = json!({"agent_id": AGENT, "user_id": 1});
        body.as_object_mut()
            .unwrap()
            .extend(spec.as_object().unwrap().clone());
        let (status, view) = self
            .gitlab
            .call("POST", "/-/podsim/workspaces", Some(body))
            .await;
        assert_eq!(status, 201, "creating a workspace: {view}");
        view
    }

    /// Set workspace `id`'s desired state, as the user does in GitLab.
    pub async fn desire(&self, id: u64, state: &str) {
        let (status, view) = self
            .gitlab
            .call(
                "PATCH",
                &format!("/-/podsim/workspaces/{id}"),
                Some(json!({ "desired_state": state })),
            )
            .await;
        assert_eq!(status, 200, "setting workspace {id} to {state}: {view}");
    }

    /// Workspace `id` as GitLab has it.
    pub async fn workspace(&self, id: u64) -> Value {
        let (status, view) = self.gitlab.get(&format!("/-/podsim/workspaces/{id}")).await;
        assert_eq!(status, 200, "workspace {id}: {view}");
        view
    }

    /// Every workspace as GitLab has it.
    pub async fn workspaces(&self) -> Vec<Value> {
        let (status, list) = self.gitlab.get("/-/podsim/workspaces").await;
        assert_eq!(status, 200, "{list}");
        list["workspaces"].as_array().cloned().unwrap_or_default()
    }

    /// Until GitLab has workspace `id` in `actual` state.
    pub async fn until_actual(&self, id: u64, actual: &str, within: Duration) -> Value {
        eventually(
            within,
            &format!("workspace {id} to be {actual}"),
            || async {
                let w = self.workspace(id).await;
                (w["actual_state"] == actual).then_some(w)
            },
        )
        .await
    }

    /// The Deployments agent 1's workspaces run, by name.
    pub async fn deployments(&self) -> Vec<String> {
        let (status, list) = self
            .kube
            .get(&format!(
                "/apis/apps/v1/deployments?labelSelector=agent.gitlab.com%2Fid%3D{AGENT}"
            ))
            .await;
        assert_eq!(status, 200, "{list}");
        let mut names: Vec<String> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["metadata"]["name"].as_str().unwrap().to_owned())
            .collect();
        names.sort();
        names
    }

    /// Whether namespace `name` exists.
    pub async fn namespace_exists(&self, name: &str) -> bool {
        self.kube.get(&format!("/api/v1/namespaces/{name}")).await.0 == 200
    }
}

/// What an operator does before agentk runs: `kubectl apply` the ServiceAccount
/// and RBAC of `deploy/agentk` (everything `kubectl kustomize` renders but its
/// Deployment, which runs here as processes) in agentk's namespace, and the
/// ServiceAccount's token Secret (kube-sim has no token controller: the test
/// fills it in). Returns agentk's kubeconfig: the admin's, with that token.
async fn install_agentk_rbac(kube: &Kube, admin: &Path, dir: &Path) -> PathBuf {
    let (status, ns) = kube
        .call(
            "POST",
            "/api/v1/namespaces",
            Some(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": AGENT_NAMESPACE}})),
        )
        .await;
    assert_eq!(status, 201, "{ns}");
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/agentk");
    let out = std::process::Command::new("kubectl")
        .args(["kustomize", base.to_str().unwrap()])
        .output()
        .expect("kubectl is installed");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered = String::from_utf8(out.stdout).unwrap();
    let wanted: Vec<&str> = rendered
        .split("\n---\n")
        .filter(|doc| !doc.lines().any(|l| l == "kind: Deployment"))
        .collect();
    assert!(wanted.len() >= 5, "{rendered}");
    let file = dir.join("agentk-rbac.yaml");
    std::fs::write(&file, wanted.join("\n---\n")).unwrap();
    let out = std::process::Command::new("kubectl")
        .args([
            "--kubeconfig",
            admin.to_str().unwrap(),
            "apply",
            "-f",
            file.to_str().unwrap(),
        ])
        .output()
        .expect("kubectl is installed");
    assert!(
        out.status.success(),
        "kubectl apply: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let token = format!("agentk-{:032x}", rand::random::<u128>());
    let (status, secret) = kube
        .call(
            "POST",
            &format!("/api/v1/namespaces/{AGENT_NAMESPACE}/secrets"),
            Some(json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "podgate-agentk-token",
                             "annotations": {"kubernetes.io/service-account.name": "podgate-agentk"}},
                "type": "kubernetes.io/service-account-token",
                "data": {"token": base64::engine::general_purpose::STANDARD.encode(&token)},
            })),
        )
        .await;
    assert_eq!(status, 201, "{secret}");
    let admin_config = std::fs::read_to_string(admin).unwrap();
    let admin_token = admin_config
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .unwrap_or_else(|| panic!("no token in {admin_config}"));
    let path = dir.join("agentk.kubeconfig");
    std::fs::write(&path, admin_config.replace(admin_token, &token)).unwrap();
    path
}

async fn start_kas(config: &std::path::Path) -> Proc {
    let mut kas = Proc::spawn("kas", &["kas", "--config", config.to_str().unwrap()]);
    kas.line("kas: agents on", UP).await;
    kas
}
