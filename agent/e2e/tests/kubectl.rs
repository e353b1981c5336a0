//! The installed `kubectl` through podgate's proxy (its TLS listener,
//! `/-/kubernetes-agent/k8s-proxy/`) and kas (its Kubernetes API proxy, a personal
//! access token as GitLab's user access takes it) to podgate's agentk and on to a
//! kube-sim: `get`, `get -w` with a later `apply`, and the upgrades — `exec` (output
//! and exit code), `port-forward` (bytes both ways), `logs -f` (lines as the
//! container writes them).
//!
//! Also the shared helpers of `gitlab_wire::podgate_kubectl` (the same commands to
//! the GitLab-shaped agentk, which dials kas through the proxy too).

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use podgate_agentk::Agentk;
use podgate_kas::Kas;
use podgate_kas::k8s_proxy::K8sProxyConfig;
use podgate_loadtest::pod_sim::{AgentSpec, PodSim, PodSimConfig};
use podgate_testkit::fixtures::{AgentTokens, EXTERNAL_SECRET, kas_config, memory_registry};
use podgate_testkit::kube::KubeTestServer;
use podgate_testkit::workspaces::agentk_config;
use podgate_tokens::PodId;
use serde_json::json;

use crate::edge::{self, Edge, K8S_PROXY_PREFIX};

/// GitLab (a Pod simulator, agent 1 open to its project's members), podgate's kas
/// with its Kubernetes API proxy (prefix [`K8S_PROXY_PREFIX`]), podgate's proxy in
/// front of both, a kube-sim holding Pod `default/web-1` (container `c`, port 8080),
/// and a kubeconfig for kubectl as root with a `k8s_proxy` token for agent 1,
/// naming the proxy's TLS listener.
pub struct Stack {
    pub _sim: PodSim,
    pub kas: Kas,
    pub edge: Edge,
    pub kube: KubeTestServer,
    pub config: PathBuf,
    pub dir: tempfile::TempDir,
    /// root's personal access token (scope `k8s_proxy`).
    pub pat: String,
    /// Mints agent tokens for this kas.
    pub mint: Box<dyn Fn(Option<u64>) -> String + Send + Sync>,
}

pub async fn stack() -> Stack {
    let pod = PodId::new(1).unwrap();
    let mut sim_config = PodSimConfig::new(pod, "127.0.0.1:0".parse().unwrap());
    sim_config.kas_secret = Some(EXTERNAL_SECRET.to_vec());
    sim_config.agents = vec![AgentSpec::with_user_access(1, pod)];
    let sim = PodSim::start(sim_config).await.unwrap();
    let tokens = AgentTokens::new(1);
    let mut config = kas_config(tokens.keys(), Duration::from_secs(10));
    let mut k8s_proxy = K8sProxyConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        &format!("http://{}", sim.addr()),
    );
    k8s_proxy.url_prefix = K8S_PROXY_PREFIX.into();
    config.k8s_proxy = Some(k8s_proxy);
    let kas = Kas::start(config, memory_registry().await).await.unwrap();
    let kube = KubeTestServer::start(100).await.unwrap();
    kube.put(
        "pods",
        "default",
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-1", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "busybox", "ports": [{"containerPort": 8080}]}]},
            "status": {"phase": "Running"},
        }),
    );
    let pat = sim
        .create_personal_access_token("root", &["k8s_proxy"])
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pod = edge::Pod {
        gitlab: sim.addr(),
        kas: kas.agent_addr(),
        kas_k8s_proxy: kas
            .k8s_proxy_addr()
            .expect("the Kubernetes API proxy listens"),
        agent_key_pem: tokens.public_pem().to_owned(),
    };
    let edge = edge::start(&pod, dir.path()).await;
    let config = dir.path().join("kubeconfig");
    let server = format!(
        "https://{}{}",
        edge.tls_addr,
        K8S_PROXY_PREFIX.trim_end_matches('/')
    );
    std::fs::write(
        &config,
        podgate_kube_sim::kubeconfig_with(
            &server,
            Some(&format!("pat:1:{pat}")),
            Some(&edge.ca_pem),
        ),
    )
    .unwrap();
    Stack {
        _sim: sim,
        kas,
        edge,
        kube,
        config,
        dir,
        pat,
        mint: Box::new(move |agent| tokens.mint(agent)),
    }
}

/// `kubectl --kubeconfig config ARGS`: its exit code, stdout and stderr.
pub async fn kubectl_run(config: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(config)
        .arg("--request-timeout=30s")
        .args(args)
        .output()
        .await
        .expect("running kubectl");
    (
        out.status.code(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `kubectl --kubeconfig config ARGS`: its stdout, or a panic with its stderr.
pub async fn kubectl(config: &Path, args: &[&str]) -> String {
    let (code, out, err) = kubectl_run(config, args).await;
    assert_eq!(code, Some(0), "kubectl {args:?}: {err}");
    out
}

/// A long-running kubectl whose output lines arrive on a channel.
pub struct Running {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Running {
    pub fn start(config: &Path, args: &[&str]) -> Running {
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(config)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("running kubectl");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Running { child, lines }
    }

    /// The next line (within 30 s).
    pub async fn next(&self) -> String {
        let lines = &self.lines;
        tokio::task::block_in_place(|| {
            lines
                .recv_timeout(Duration::from_secs(30))
                .expect("kubectl printed a line")
        })
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `get`, `get -w` seeing a later `apply`, and the `apply` itself.
pub async fn get_watch_and_apply(s: &Stack) {
    let pods = kubectl(&s.config, &["get", "pods", "-n", "default", "-o", "name"]).await;
    assert_eq!(pods.trim(), "pod/web-1");
    let watch = Running::start(
        &s.config,
        &["get", "configmaps", "-n", "default", "-w", "-o", "name"],
    );
    let manifest = s.dir.path().join("cm.yaml");
    std::fs::write(&manifest, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-kubectl\n  namespace: default\ndata:\n  k: v\n").unwrap();
    let applied = kubectl(&s.config, &["apply", "-f", manifest.to_str().unwrap()]).await;
    assert!(applied.contains("configmap/from-kubectl"), "{applied}");
    loop {
        if watch.next().await == "configmap/from-kubectl" {
            break;
        }
    }
    assert_eq!(
        s.kube.get("configmaps", "default", "from-kubectl").unwrap()["data"]["k"],
        "v"
    );
}

/// `exec` (output, and a failing command's exit code), `port-forward` (bytes both
/// ways) and `logs -f` (lines as the container writes them).
pub async fn exec_port_forward_and_logs(s: &Stack) {
    let exec = ["exec", "-n", "default", "web-1", "--"];
    let out = kubectl(
        &s.config,
        &[&exec[..], &["echo", "hello from exec"]].concat(),
    )
    .await;
    assert_eq!(out.trim(), "hello from exec");
    let (code, out, _) = kubectl_run(
        &s.config,
        &[&exec[..], &["sh", "-c", "echo bye; exit 3"]].concat(),
    )
    .await;
    assert_eq!((code, out.trim()), (Some(3), "bye"));

    let forward = Running::start(
        &s.config,
        &["port-forward", "-n", "default", "pod/web-1", ":8080"],
    );
    let line = forward.next().await; // "Forwarding from 127.0.0.1:NNNNN -> 8080"
    let port: u16 = line
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("a local port in {line:?}"));
    let echoed = tokio::task::spawn_blocking(move || {
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut got = Vec::new();
        for msg in [&b"ping"[..], b"second message"] {
            conn.write_all(msg).unwrap();
            let mut buf = vec![0u8; msg.len()];
            conn.read_exact(&mut buf).unwrap();
            got.push(buf);
        }
        got
    })
    .await
    .unwrap();
    assert_eq!(echoed, [b"ping".to_vec(), b"second message".to_vec()]);

    let logs = Running::start(&s.config, &["logs", "-f", "-n", "default", "web-1"]);
    s.kube
        .sim()
        .container_log("default", "web-1", "c", "line-1");
    assert_eq!(logs.next().await, "line-1");
    s.kube
        .sim()
        .container_log("default", "web-1", "c", "line-2");
    assert_eq!(logs.next().await, "line-2");
}

/// podgate's agentk for agent 1 on `s`'s kas and kube-sim.
async fn podgate_agentk(s: &Stack) -> Agentk {
    let kubeconfig = s.dir.path().join("agentk-kubeconfig");
    std::fs::write(&kubeconfig, s.kube.kubeconfig()).unwrap();
    let agentk = Agentk::start(agentk_config(&s.kas, (s.mint)(Some(1)), Some(kubeconfig)))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(30), agentk.connected())
        .await
        .expect("agentk connected to kas");
    agentk
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_watch_and_apply_through_the_proxy_and_kas_to_podgate_agentk() {
    let s = stack().await;
    let _agentk = podgate_agentk(&s).await;
    get_watch_and_apply(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_exec_port_forward_and_logs_through_the_proxy_and_kas_to_podgate_agentk() {
    let s = stack().await;
    let _agentk = podgate_agentk(&s).await;
    exec_port_forward_and_logs(&s).await;
}
