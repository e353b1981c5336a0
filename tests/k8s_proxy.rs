//! The installed `kubectl` through the whole path, as processes: `podgate proxy` →
//! the token's Pod's kas (`[k8s_proxy]`) → agentk → `podgate kube-sim`.
//!
//! - Pod 1 (the default Pod) and Pod 2 each have a `podgate pod-sim` as GitLab and
//!   their own kas; Pod 2 has two kas instances on one Redis, kas2a (the only one
//!   the proxy sends Pod 2's Kubernetes API traffic to) and kas2b.
//! - Agent 4's agentk is connected to kas2a (a local tunnel); agent 3's to kas2b, so
//!   its requests go kas2a → kas2b (`KasInternal.Call`).
//! - kubectl's kubeconfig names the proxy's `/-/kubernetes-agent/k8s-proxy/` URL and
//!   the token `pat:<agent id>:<personal access token of Pod 2>`: `get -A`, `get -w`
//!   (an event caused by a later `apply` arrives while the watch runs), `apply`,
//!   `delete`, `exec` (output and exit code), for both agents.
//! - Without credentials the default Pod's kas answers 401 with
//!   `Gitlab-Unauthorized: true`; an invalid token gets the same from the proxy; a
//!   Pod 2 token is never answered by Pod 1.

use crate::common;
use common::process::Procs;

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use base64::Engine as _;
use podgate_registry::testing::{RedisServer, free_port};
use podgate_testkit::fixtures::{AgentTokens, self_signed_cert};
use serde_json::{Value, json};

/// The k8s proxy prefix in GitLab's Omnibus layout; kas is configured with it.
const PREFIX: &str = "/-/kubernetes-agent/k8s-proxy/";

/// `podgate ARGS`: the first line of its output `pick` accepts (within a minute),
/// the rest drained.
fn start<T>(procs: &mut Procs, args: &[&str], name: &str, pick: impl Fn(&str) -> Option<T>) -> T {
    let (child, lines) = common::spawn_podgate(args);
    procs.0.push(child);
    common::first_line(&lines, Duration::from_secs(60), name, pick)
}

/// A blocking HTTP/1.0 request: status, headers (lower-case names), body.
fn http(addr: SocketAddr, head: &str, body: &str) -> (u16, Vec<(String, String)>, String) {
    use std::io::Read as _;
    let mut s = std::net::TcpStream::connect(addr).expect("connecting");
    write!(s, "{head}Content-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.get(9..12))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("an HTTP status line: {out:.300}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status, headers, body.to_owned())
}

fn post_json(addr: SocketAddr, path: &str, body: &Value) -> Value {
    let (status, _, text) = http(
        addr,
        &format!("POST {path} HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\n"),
        &body.to_string(),
    );
    assert_eq!(status, 201, "POST {path}: {text}");
    serde_json::from_str(&text).unwrap()
}

/// A Pod simulator as Pod `pod`'s GitLab (kas's internal API verified with the
/// secret in `dir/external`), with `agents` configured for user access: its address.
fn start_gitlab(procs: &mut Procs, dir: &Path, pod: u64, agents: &[u64]) -> SocketAddr {
    let pod_arg = pod.to_string();
    let secret = dir.join("external");
    let mut args = vec![
        "pod-sim",
        "--pod-id",
        &pod_arg,
        "--listen",
        "127.0.0.1:0",
        "--job-rate",
        "0",
        "--kas-secret-file",
        secret.to_str().unwrap(),
    ];
    let agent_args: Vec<String> = agents.iter().map(u64::to_string).collect();
    for a in &agent_args {
        args.extend(["--agent", a.as_str()]);
    }
    let prefix = format!("pod-sim: Pod {pod} listening on http://");
    start(procs, &args, "pod-sim", move |l| {
        l.strip_prefix(&prefix)?.parse::<SocketAddr>().ok()
    })
}

/// A kas whose Kubernetes API proxy asks `gitlab`, on Redis `redis` (or its own
/// memory registry): (agent listener, k8s proxy listener).
fn start_kas(
    procs: &mut Procs,
    dir: &Path,
    name: &str,
    gitlab: SocketAddr,
    redis: Option<&str>,
) -> (SocketAddr, SocketAddr) {
    let (agent, k8s) = (free_port(), free_port());
    let config = dir.join(format!("{name}.toml"));
    let registry = redis.map_or(String::new(), |url| {
        format!("[registry]\nbackend = {{ kind = \"redis\", url = \"{url}\" }}\n")
    });
    std::fs::write(
        &config,
        format!(
            "agent_listen = \"127.0.0.1:{agent}\"\n\
             external_listen = \"127.0.0.1:{ext}\"\n\
             internal_listen = \"127.0.0.1:{int}\"\n\
             observability_listen = \"off\"\n\
             external_secret_file = \"{d}/external\"\n\
             internal_secret_file = \"{d}/internal\"\n\
             agent_keys = [\"{d}/agents.pem\"]\n\
             max_wait = \"30s\"\n\
             [k8s_proxy]\n\
             listen = \"127.0.0.1:{k8s}\"\n\
             url_prefix = \"{PREFIX}\"\n\
             gitlab_url = \"http://{gitlab}\"\n\
             {registry}",
            ext = free_port(),
            int = free_port(),
            d = dir.display(),
        ),
    )
    .unwrap();
    start(
        procs,
        &["kas", "--config", config.to_str().unwrap()],
        name,
        |l| l.starts_with("kas: agents on").then_some(()),
    );
    (
        SocketAddr::from(([127, 0, 0, 1], agent)),
        SocketAddr::from(([127, 0, 0, 1], k8s)),
    )
}

/// `podgate agentk` for `agent` against kas's agent listener; returns once connected.
fn start_agentk(
    procs: &mut Procs,
    dir: &Path,
    tokens: &AgentTokens,
    agent: u64,
    kas: SocketAddr,
    kubeconfig: &Path,
) {
    let token_file = dir.join(format!("agent-{agent}.token"));
    std::fs::write(&token_file, format!("{}\n", tokens.mint(Some(agent)))).unwrap();
    let pod_name = format!("agentk-{agent}");
    let observability = format!("127.0.0.1:{}", free_port());
    start(
        procs,
        &[
            "agentk",
            "--kas",
            &format!("grpc://{kas}"),
            "--token-file",
            token_file.to_str().unwrap(),
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--pod-name",
            &pod_name,
            "--pod-namespace",
            "gitlab-agent",
            "--observability-listen",
            &observability,
        ],
        &pod_name,
        |l| l.starts_with("agentk: connected as agent ").then_some(()),
    );
}

/// A kubeconfig for kubectl: the proxy's k8s proxy URL over TLS (client-go sends a
/// bearer token over TLS only), trusting `ca`, and a bearer token.
fn kubeconfig(dir: &Path, name: &str, tls_port: u16, ca: &Path, token: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\n\
             clusters:\n- name: gitlab\n  cluster:\n    server: https://127.0.0.1:{tls_port}{}\n    certificate-authority: {}\n\
             users:\n- name: agent\n  user:\n    token: \"{token}\"\n\
             contexts:\n- name: gitlab\n  context:\n    cluster: gitlab\n    user: agent\n\
             current-context: gitlab\n",
            PREFIX.trim_end_matches('/'),
            ca.display(),
        ),
    )
    .unwrap();
    path
}

/// `kubectl --kubeconfig config ARGS`: exit success, stdout, stderr.
fn kubectl(config: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(config)
        .args(["--request-timeout", "60s"])
        .args(args)
        .output()
        .expect("running kubectl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn kubectl_ok(config: &Path, args: &[&str]) -> String {
    let (ok, out, err) = kubectl(config, args);
    assert!(ok, "kubectl {args:?}: {err}{out}");
    out
}

/// A running `kubectl get -w`, its output read line by line as it comes.
struct Watch {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Watch {
    fn start(config: &Path, args: &[&str]) -> Watch {
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(config)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("running kubectl get -w");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Watch { child, lines }
    }

    /// The next line; fails the test if none comes within a minute.
    fn next(&self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(60))
            .expect("kubectl get -w printed a line")
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn configmap(name: &str, value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: default\ndata:\n  key: {value}\n"
    )
}

#[test]
fn kubectl_works_through_the_proxy_kas_and_agentk_locally_and_kas_to_kas() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    std::fs::write(d.join("external"), b64(&[7u8; 32])).unwrap();
    std::fs::write(d.join("internal"), b64(&[9u8; 32])).unwrap();
    let tokens = AgentTokens::new(2);
    std::fs::write(d.join("agents.pem"), tokens.public_pem()).unwrap();
    let mut procs = Procs(Vec::new());

    // The cluster.
    let seed = d.join("seed.yaml");
    std::fs::write(
        &seed,
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ops\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata:\n  name: web-1\n  namespace: default\n\
         spec:\n  containers:\n  - name: c\n    image: busybox\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata:\n  name: db-1\n  namespace: ops\n\
         spec:\n  containers:\n  - name: c\n    image: postgres\n---\n"
            .to_owned()
            + &configmap("first", "one"),
    )
    .unwrap();
    let cluster_config = d.join("cluster.kubeconfig");
    start(
        &mut procs,
        &[
            "kube-sim",
            "--listen",
            "127.0.0.1:0",
            "--seed",
            seed.to_str().unwrap(),
            "--kubeconfig-out",
            cluster_config.to_str().unwrap(),
        ],
        "kube-sim",
        |l| l.starts_with("kube-sim: Kubernetes API on ").then_some(()),
    );

    // GitLab for Pod 1 (the default Pod) and Pod 2 (agents 3 and 4).
    let gitlab1 = start_gitlab(&mut procs, d, 1, &[]);
    let gitlab2 = start_gitlab(&mut procs, d, 2, &[3, 4]);
    let pat = post_json(
        gitlab2,
        "/-/podsim/personal_access_tokens",
        &json!({"username": "root", "scopes": ["k8s_proxy", "read_api"]}),
    )["token"]
        .as_str()
        .unwrap()
        .to_owned();

    // kas: Pod 1's own; Pod 2's two on Redis.
    let (kas1_agents, kas1_k8s) = start_kas(&mut procs, d, "kas1", gitlab1, None);
    let (kas2a_agents, kas2a_k8s) = start_kas(&mut procs, d, "kas2a", gitlab2, Some(&redis.url()));
    let (kas2b_agents, _) = start_kas(&mut procs, d, "kas2b", gitlab2, Some(&redis.url()));
    start_agentk(&mut procs, d, &tokens, 4, kas2a_agents, &cluster_config);
    start_agentk(&mut procs, d, &tokens, 3, kas2b_agents, &cluster_config);

    // The proxy (cleartext and TLS): Pod 2's Kubernetes API traffic to kas2a only.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let proxy_dir = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed_cert(d);
    let tls_port = free_port();
    let proxy = rt.block_on(common::start_proxy(
        &format!(
            r#"[tls]
            listen = "127.0.0.1:{tls_port}"
            cert = "{cert}"
            key = "{key}"
            [topology]
            default_pod = 1
            [[topology.pods]]
            id = 1
            name = "legacy"
            web = ["{gitlab1}"]
            kas = ["{kas1_agents}"]
            kas_k8s_proxy = ["{kas1_k8s}"]
            [[topology.pods]]
            id = 2
            name = "pod-2"
            web = ["{gitlab2}"]
            kas = ["{kas2a_agents}"]
            kas_k8s_proxy = ["{kas2a_k8s}"]
            "#,
            cert = cert.display(),
            key = key.display(),
        ),
        proxy_dir,
    ));
    rt.block_on(common::wait_accepting(tls_port));
    let proxy_addr = SocketAddr::from(([127, 0, 0, 1], proxy.port));

    for (agent, how) in [(4, "local tunnel on kas2a"), (3, "kas2a -> kas2b")] {
        let config = kubeconfig(
            d,
            &format!("agent-{agent}"),
            tls_port,
            &cert,
            &format!("pat:{agent}:{pat}"),
        );

        // get -A
        let pods: Value =
            serde_json::from_str(&kubectl_ok(&config, &["get", "pods", "-A", "-o", "json"]))
                .unwrap();
        let mut names: Vec<String> = pods["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                format!(
                    "{}/{}",
                    p["metadata"]["namespace"].as_str().unwrap(),
                    p["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect();
        names.sort();
        assert_eq!(names, ["default/web-1", "ops/db-1"], "{how}");

        // exec: through the proxy's upgrade and MakeRequest's UpgradeData, the
        // command's output, and a failing command's exit code.
        let exec = ["exec", "-n", "default", "web-1", "--"];
        let out = kubectl_ok(&config, &[&exec[..], &["echo", "hello from exec"]].concat());
        assert_eq!(out.trim(), "hello from exec", "{how}");
        let (ok, out, err) = kubectl(
            &config,
            &[&exec[..], &["sh", "-c", "echo bye; exit 3"]].concat(),
        );
        assert!(!ok && out.trim() == "bye", "{how}: {out}{err}");
        assert!(err.contains("exit code 3"), "{how}: {err}");

        // get -w sees an object a later apply creates.
        let name = format!("applied-{agent}");
        let watch = Watch::start(
            &config,
            &[
                "get",
                "configmaps",
                "-n",
                "default",
                "--watch",
                "-o",
                "name",
            ],
        );
        // The initial list comes first; the watch resumes from its resourceVersion,
        // so anything applied after it is seen.
        assert_eq!(watch.next(), "configmap/first", "{how}");
        let file = d.join(format!("{name}.yaml"));
        std::fs::write(&file, configmap(&name, "v1")).unwrap();
        let out = kubectl_ok(&config, &["apply", "-f", file.to_str().unwrap()]);
        assert!(
            out.contains(&format!("configmap/{name} created")),
            "{how}: {out}"
        );
        assert_eq!(watch.next(), format!("configmap/{name}"), "{how}");
        // apply again with a change: configured, and the watch sees the update.
        std::fs::write(&file, configmap(&name, "v2")).unwrap();
        let out = kubectl_ok(&config, &["apply", "-f", file.to_str().unwrap()]);
        assert!(
            out.contains(&format!("configmap/{name} configured")),
            "{how}: {out}"
        );
        assert_eq!(watch.next(), format!("configmap/{name}"), "{how}");
        let got = kubectl_ok(
            &config,
            &[
                "get",
                "configmap",
                &name,
                "-n",
                "default",
                "-o",
                "jsonpath={.data.key}",
            ],
        );
        assert_eq!(got, "v2", "{how}");

        // delete, and it is gone.
        let out = kubectl_ok(&config, &["delete", "configmap", &name, "-n", "default"]);
        assert!(
            out.contains(&format!("configmap \"{name}\" deleted")),
            "{how}: {out}"
        );
        assert_eq!(
            watch.next(),
            format!("configmap/{name}"),
            "{how}: the delete event"
        );
        let (ok, _, err) = kubectl(&config, &["get", "configmap", &name, "-n", "default"]);
        assert!(!ok && err.contains("NotFound"), "{how}: {err}");
        drop(watch);
    }

    // No credentials: the default Pod's kas refuses, marked as kas's refusal.
    let get = |auth: &str| {
        http(
            proxy_addr,
            &format!("GET {PREFIX}api/v1/pods HTTP/1.0\r\nHost: gitlab.example.com\r\n{auth}"),
            "",
        )
    };
    let unauthorized = |(status, headers, body): &(u16, Vec<(String, String)>, String),
                        what: &str| {
        assert_eq!(*status, 401, "{what}: {body}");
        assert!(
            headers
                .iter()
                .any(|(k, v)| k == "gitlab-unauthorized" && v == "true"),
            "{what}: {headers:?}"
        );
        let status: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("{what}: {body}"));
        assert_eq!(status["kind"], "Status", "{what}");
        assert_eq!(status["code"], 401, "{what}");
    };
    unauthorized(&get(""), "no credentials");
    // An invalid token (its checksum broken): the proxy answers as kas does.
    let mut broken = pat.clone();
    let last = broken.pop().unwrap();
    broken.push(if last == 'a' { 'b' } else { 'a' });
    unauthorized(
        &get(&format!("Authorization: Bearer pat:3:{broken}\r\n")),
        "an invalid token",
    );
    // Malformed kas credentials carry no token: the default Pod's kas refuses them.
    unauthorized(
        &get("Authorization: Bearer pat:x:\r\n"),
        "malformed credentials",
    );
    // Pod 2's token on Pod 1's kas would be refused: reaching agent 3 at all shows
    // the proxy sent it to Pod 2 (above); kas1 never saw a Pod 2 token.
    let (status, _, body) = http(
        kas1_k8s,
        &format!(
            "GET {PREFIX}api/v1/pods HTTP/1.0\r\nHost: x\r\nAuthorization: Bearer pat:3:{pat}\r\n"
        ),
        "",
    );
    assert_eq!(
        status, 401,
        "Pod 1's GitLab does not know Pod 2's token: {body}"
    );
    drop(proxy);
    drop(procs);
}
