//! The stack every Graph API test runs against, started in one place
//! ([`start_stack`]) so it can follow the pieces as they change:
//!
//! - kube-sim in this process (`podgate_testkit::kube`), so tests can write
//!   to it, deny a resource and read every object back;
//! - `podgate pod-sim` as GitLab (its internal API answers kas's
//!   `authorize_proxy_user`; its control API issues the personal access token);
//! - `podgate kas` with a `[k8s_proxy]` listener (memory registry: one kas);
//! - `podgate agentk` for agent [`AGENT_ID`], watching the kube-sim.
//!
//! The tests reach `/graph` on kas's proxy listener directly with
//! `Authorization: Bearer pat:<agent id>:<token>`.
//!
//! [`Stack::cluster`] reads the model's input: discovery over the kube-sim's HTTP
//! API, and every object it holds (`KubeSim::objects`).

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use podgate_registry::testing::free_port;
use podgate_testkit::fixtures::AgentTokens;
use podgate_testkit::kube::KubeTestServer;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::model::{ApiResource, Object};

/// The agent the tests watch through.
pub const AGENT_ID: u64 = 7;

/// The URL prefix of kas's Kubernetes API proxy (the default).
pub const PREFIX: &str = "/k8s-proxy/";

/// Children killed when the test ends, however it ends.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A running stack.
pub struct Stack {
    /// The cluster (in-process: write, delete, deny and read it directly).
    pub kube: KubeTestServer,
    /// `ws://127.0.0.1:<port>/k8s-proxy/graph`.
    pub graph_url: String,
    /// kas's proxy listener.
    pub proxy_addr: SocketAddr,
    /// The value after `Bearer `: `pat:<agent id>:<token>`.
    pub bearer: String,
    _procs: Procs,
    _dir: tempfile::TempDir,
}

impl Stack {
    /// The path of `/graph` on the proxy listener.
    pub fn graph_path(&self) -> String {
        format!("{PREFIX}graph")
    }

    /// Discovery (over the kube-sim's HTTP API) and every object it holds now
    /// (`KubeSim::objects`).
    pub async fn cluster(&self) -> (Vec<ApiResource>, Vec<Object>) {
        let discovery = discovery(&self.kube.url()).await;
        let objects = self
            .kube
            .sim()
            .objects()
            .into_iter()
            .map(|o| Object {
                group: o.group.to_owned(),
                resource: o.resource.to_owned(),
                namespace: o.namespace.clone(),
                name: o.name.clone(),
                value: o.value(),
            })
            .collect();
        (discovery, objects)
    }

    /// Create or replace `object` (its kind decides the resource).
    pub fn apply(&self, object: Value) {
        let text = object.to_string();
        self.kube
            .sim()
            .load_seed(&text)
            .unwrap_or_else(|e| panic!("kube-sim refused {text}: {e}"));
    }
}

/// Start a line reader on `child`'s stdout; the first line for which `pick` gives
/// `Some`, within a minute. The rest is drained so the child never blocks.
fn wait_line<T: Send + 'static>(
    child: &mut Child,
    name: &str,
    pick: impl Fn(&str) -> Option<T> + Send + 'static,
) -> T {
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if !sent && let Some(v) = pick(&line) {
                let _ = tx.send(v);
                sent = true;
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{name}: not ready after 60 s"))
}

/// Start the stack over a kube-sim holding `objects` (any served kinds; namespaced
/// ones without a namespace go to `default`) and, with `generate = Some((n, seed))`,
/// a generated cluster of at least `n` objects; list and watch of each `(group,
/// resource)` in `deny` are forbidden.
pub async fn start_stack(
    objects: &[Value],
    generate: Option<(usize, u64)>,
    deny: &[(&str, &str)],
) -> Stack {
    let kube = KubeTestServer::start(100_000).await.expect("kube-sim");
    if let Some((n, seed)) = generate {
        kube.sim().generate(n, seed);
    }
    if !objects.is_empty() {
        let docs: Vec<String> = objects.iter().map(Value::to_string).collect();
        kube.sim()
            .load_seed(&docs.join("\n---\n"))
            .expect("loading the test's objects");
    }
    for (group, resource) in deny {
        kube.sim().deny(group, resource);
    }

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    std::fs::write(d.join("external"), b64(&[7u8; 32])).unwrap();
    std::fs::write(d.join("internal"), b64(&[9u8; 32])).unwrap();
    let tokens = AgentTokens::new(1);
    std::fs::write(d.join("agents.pem"), tokens.public_pem()).unwrap();
    let kubeconfig = d.join("kubeconfig");
    std::fs::write(&kubeconfig, kube.kubeconfig()).unwrap();
    let mut procs = Procs(Vec::new());

    // GitLab: the Pod simulator's internal API.
    let (gitlab, pat) = start_gitlab(&mut procs, d);

    // kas with the Kubernetes API proxy.
    let (agent_port, proxy_port) = (free_port(), free_port());
    let config = d.join("kas.toml");
    std::fs::write(
        &config,
        format!(
            "agent_listen = \"127.0.0.1:{agent_port}\"\n\
             external_listen = \"127.0.0.1:{ext}\"\n\
             internal_listen = \"127.0.0.1:{int}\"\n\
             observability_listen = \"off\"\n\
             external_secret_file = \"{d}/external\"\n\
             internal_secret_file = \"{d}/internal\"\n\
             agent_keys = [\"{d}/agents.pem\"]\n\
             max_wait = \"30s\"\n\
             [k8s_proxy]\n\
             listen = \"127.0.0.1:{proxy_port}\"\n\
             url_prefix = \"{PREFIX}\"\n\
             gitlab_url = \"{gitlab}\"\n",
            ext = free_port(),
            int = free_port(),
            d = d.display(),
        ),
    )
    .unwrap();
    let mut kas = Command::new(env!("CARGO_BIN_EXE_podgate"))
        .args(["kas", "--config", config.to_str().unwrap()])
        .env("PODGATE_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let first = wait_line(&mut kas, "kas", |l| Some(l.to_owned()));
    procs.0.push(kas);
    assert!(first.starts_with("kas: agents on"), "kas: {first}");

    // agentk for the agent.
    let token_file = d.join("agent.token");
    std::fs::write(&token_file, format!("{}\n", tokens.mint(Some(AGENT_ID)))).unwrap();
    let mut agentk = Command::new(env!("CARGO_BIN_EXE_podgate"))
        .env("PODGATE_LOG", "error")
        .args(["agentk", "--kas", &format!("grpc://127.0.0.1:{agent_port}")])
        .args(["--token-file", token_file.to_str().unwrap()])
        .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
        .args([
            "--observability-listen",
            &format!("127.0.0.1:{}", free_port()),
        ])
        .args([
            "--pod-name",
            "agentk-graph",
            "--pod-namespace",
            "gitlab-agent",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    wait_line(&mut agentk, "agentk", |l| {
        l.starts_with("agentk: connected as agent ").then_some(())
    });
    procs.0.push(agentk);

    let proxy_addr = SocketAddr::from(([127, 0, 0, 1], proxy_port));
    Stack {
        kube,
        graph_url: format!("ws://{proxy_addr}{PREFIX}graph"),
        proxy_addr,
        bearer: format!("pat:{AGENT_ID}:{pat}"),
        _procs: procs,
        _dir: dir,
    }
}

/// Start `podgate pod-sim` as GitLab (it checks kas's JWTs with the GitLab ↔ kas
/// secret in `dir/external`), configure agent [`AGENT_ID`] for user access (as the
/// agent) from the Pod's project, and have it issue a personal access token of its
/// owner `root` (scopes `k8s_proxy`, `read_api`): its base URL and the token.
fn start_gitlab(procs: &mut Procs, dir: &Path) -> (String, String) {
    let mut sim = Command::new(env!("CARGO_BIN_EXE_podgate"))
        .args(["pod-sim", "--pod-id", "1", "--listen", "127.0.0.1:0"])
        .args(["--job-rate", "0"])
        .arg("--kas-secret-file")
        .arg(dir.join("external"))
        .env("PODGATE_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let url = wait_line(&mut sim, "pod-sim", |l| {
        l.strip_prefix("pod-sim: Pod 1 listening on ")
            .map(str::to_owned)
    });
    procs.0.push(sim);
    let addr: SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let (status, body) = http_post_json(
        addr,
        "/-/podsim/agents",
        &json!({"id": AGENT_ID, "user_access": {"access_as": {"agent": {}},
                "projects": [{"id": "group/project-1"}]}}),
    );
    assert_eq!(status, 201, "pod-sim agent: {body}");
    let (status, body) = http_post_json(
        addr,
        "/-/podsim/personal_access_tokens",
        &json!({"username": "root", "scopes": ["k8s_proxy", "read_api"]}),
    );
    assert_eq!(status, 201, "pod-sim PAT: {body}");
    let body: Value = serde_json::from_str(&body).expect("a JSON PAT answer");
    let token = body["token"].as_str().expect("token").to_owned();
    (url, token)
}

/// A blocking `POST path` with a JSON body: status and body.
fn http_post_json(addr: SocketAddr, path: &str, body: &Value) -> (u16, String) {
    use std::io::{Read as _, Write as _};
    let body = body.to_string();
    let mut s = std::net::TcpStream::connect(addr).expect("connecting");
    write!(
        s,
        "POST {path} HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    split_response(&out)
}

fn split_response(out: &str) -> (u16, String) {
    let status = out
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("an HTTP status line: {out:.200}"));
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (status, body)
}

/// `GET path` as HTTP/1.0 (so the body is never chunked): the JSON body.
async fn get_json(base: &str, path: &str) -> Value {
    let (status, body) = get(base, path).await;
    assert_eq!(status, 200, "GET {path}: {body:.300}");
    body
}

/// `GET path` as HTTP/1.0: the status and the JSON body (null if not JSON).
async fn get(base: &str, path: &str) -> (u16, Value) {
    let addr: SocketAddr = base.trim_start_matches("http://").parse().unwrap();
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connecting");
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let (status, body) = split_response(&String::from_utf8_lossy(&out));
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// Every group version's resources (subresources included), read from the
/// kube-sim at `base` over its HTTP API as any client reads them.
pub async fn discovery(base: &str) -> Vec<ApiResource> {
    let mut gvs: Vec<(String, String, String)> = Vec::new(); // (group, version, path)
    for v in get_json(base, "/api").await["versions"].as_array().unwrap() {
        let v = v.as_str().unwrap();
        gvs.push((String::new(), v.into(), format!("/api/{v}")));
    }
    for g in get_json(base, "/apis").await["groups"].as_array().unwrap() {
        for v in g["versions"].as_array().unwrap() {
            gvs.push((
                g["name"].as_str().unwrap().into(),
                v["version"].as_str().unwrap().into(),
                format!("/apis/{}", v["groupVersion"].as_str().unwrap()),
            ));
        }
    }
    let mut discovery = Vec::new();
    for (group, version, path) in gvs {
        let list = get_json(base, &path).await;
        for r in list["resources"].as_array().unwrap() {
            discovery.push(ApiResource {
                group: group.clone(),
                version: version.clone(),
                resource: r["name"].as_str().unwrap().into(),
                kind: r["kind"].as_str().unwrap_or("").into(),
                namespaced: r["namespaced"] == true,
                verbs: r["verbs"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect(),
            });
        }
    }
    discovery
}
