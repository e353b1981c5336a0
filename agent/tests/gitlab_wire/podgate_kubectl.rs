//! The installed `kubectl` through podgate's kas (its Kubernetes API proxy, a
//! personal access token as GitLab's user access takes it) to the GitLab-shaped
//! agentk and on to a kube-sim: `get`, `get -w` (an event caused by a later `apply`
//! arrives while the watch runs), `apply`, and the upgrades — `exec` (a command's
//! output comes back), `port-forward` (bytes both ways) and `logs -f`.
//!
//! Enabled by `mod podgate_kubectl;` in `mod.rs` once podgate's kas speaks GitLab's
//! wire and kube-sim serves `exec`, `port-forward` and `logs -f`. The upgrade test
//! assumes kube-sim's container runs `echo` as a shell would, logs what
//! `/podgate/log` lines it is given, and echoes what reaches its port 8080.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use podgate_kas::Kas;
use podgate_kas::k8s_proxy::K8sProxyConfig;
use podgate_loadtest::pod_sim::{AgentSpec, PodSim, PodSimConfig};
use podgate_testkit::fixtures::{EXTERNAL_SECRET, agent_tokens, kas_config, memory_registry};
use podgate_testkit::kube::KubeTestServer;
use podgate_tokens::PodId;
use serde_json::json;

use super::agentk::{self, Config, Event};

/// GitLab (a Pod simulator), podgate's kas with its Kubernetes API proxy, a kube-sim,
/// the GitLab-shaped agentk of agent 1 between them, and a kubeconfig for kubectl.
struct Stack {
    _sim: PodSim,
    _kas: Kas,
    kube: KubeTestServer,
    _agent: agentk::Agentk,
    config: PathBuf,
    dir: tempfile::TempDir,
}

async fn stack() -> Stack {
    let pod = PodId::new(1).unwrap();
    let mut sim_config = PodSimConfig::new(pod, "127.0.0.1:0".parse().unwrap());
    sim_config.kas_secret = Some(EXTERNAL_SECRET.to_vec());
    sim_config.agents = vec![AgentSpec::with_user_access(1, pod)];
    let sim = PodSim::start(sim_config).await.unwrap();
    let (keys, mint) = agent_tokens();
    let mut config = kas_config(keys, Duration::from_secs(10));
    config.k8s_proxy = Some(K8sProxyConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        &format!("http://{}", sim.addr()),
    ));
    let kas = Kas::start(config, memory_registry().await).await.unwrap();
    let kube = KubeTestServer::start(100).await.unwrap();
    kube.put(
        "pods",
        "default",
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-1", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            "status": {"phase": "Running"},
        }),
    );
    let mut cfg = Config::new(&kas.agent_addr().to_string(), &mint(Some(1)), &kube.url());
    cfg.tunnels = 4;
    let mut agent = agentk::start(cfg).unwrap();
    let registered = agent.wait_for(|e| matches!(e, Event::Registered).then_some(()));
    tokio::time::timeout(Duration::from_secs(30), registered)
        .await
        .expect("the GitLab agentk registered with kas");

    let pat = sim
        .create_personal_access_token("root", &["k8s_proxy"])
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("kubeconfig");
    let server = format!(
        "http://{}/k8s-proxy",
        kas.k8s_proxy_addr().expect("the proxy listens")
    );
    std::fs::write(
        &config,
        podgate_kube_sim::kubeconfig_with(&server, Some(&format!("pat:1:{pat}")), None),
    )
    .unwrap();
    Stack {
        _sim: sim,
        _kas: kas,
        kube,
        _agent: agent,
        config,
        dir,
    }
}

/// `kubectl --kubeconfig config ARGS`, run off the runtime's threads: its stdout, or
/// a panic with its stderr.
async fn kubectl(config: &Path, args: &[&str]) -> String {
    let mut cmd = tokio::process::Command::new("kubectl");
    cmd.arg("--kubeconfig")
        .arg(config)
        .args(args)
        .arg("--request-timeout=30s");
    let out = cmd.output().await.expect("running kubectl");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A long-running kubectl whose output lines arrive on a channel.
struct Running {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Running {
    fn start(config: &Path, args: &[&str]) -> Running {
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
    async fn next(&self) -> String {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_watch_and_apply_through_podgate_kas_to_a_gitlab_agentk() {
    let s = stack().await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_exec_port_forward_and_logs_through_podgate_kas_to_a_gitlab_agentk() {
    let s = stack().await;
    let out = kubectl(
        &s.config,
        &[
            "exec",
            "-n",
            "default",
            "web-1",
            "--",
            "echo",
            "hello from exec",
        ],
    )
    .await;
    assert_eq!(out.trim(), "hello from exec");

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
        conn.write_all(b"ping").unwrap();
        let mut buf = [0u8; 4];
        conn.read_exact(&mut buf).unwrap();
        buf
    })
    .await
    .unwrap();
    assert_eq!(&echoed, b"ping");

    let logs = Running::start(&s.config, &["logs", "-f", "-n", "default", "web-1"]);
    kubectl(
        &s.config,
        &[
            "exec",
            "-n",
            "default",
            "web-1",
            "--",
            "sh",
            "-c",
            "echo line-1 >> /podgate/log",
        ],
    )
    .await;
    loop {
        if logs.next().await.contains("line-1") {
            break;
        }
    }
}
