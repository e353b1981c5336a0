//! Acceptance: a runner nobody here wrote runs unchanged through `podgate up --no-fleet`
//! on each of the three Pods.
//!
//! The runner is gitlab-python-runner 14.3.20 from PyPI (`python -m GitlabPyRunner`),
//! installed with its pinned dependencies by `./scripts/test.sh` into a venv
//! (`scripts/lib/deps.sh`, `podgate_ensure_py_runner`). It registers with a form body,
//! polls, clones the job's repository with real `git` through the proxy (Basic
//! `gitlab-ci-token:<job token>`), runs the job's script, streams the trace, uploads
//! its artifacts, downloads a dependency's artifacts, reports success and unregisters.
//! It has no verify call, so a second PyPI client, gitlab-runner-api 1.0.4, verifies the
//! token the first one saved, also unchanged.
//!
//! Per Pod, two jobs are queued through the Pod's control API before the runner starts
//! (its poll loop sleeps 40 s when there is no job): `produce` writes random content
//! the test chose into `out/` and keeps it as artifacts; `consume` depends on it and
//! prints the checksum of the file it unpacked. The test then checks, through the
//! control API and the Pod's own metrics, what the Pod saw, and that the proxy counted
//! the same requests for that Pod.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use podgate_registry::testing::free_port;

use crate::common::metrics::{samples, select, value};
use crate::common::process::{Signal, signal};
use serde_json::{Value, json};

/// How long one runner invocation (register, one job, unregister) may take.
const RUNNER_DEADLINE: Duration = Duration::from_secs(120);

/// Where `./scripts/test.sh` puts the venv; `PODGATE_PY_RUNNER_VENV` overrides it.
fn venv() -> PathBuf {
    let venv = std::env::var_os("PODGATE_PY_RUNNER_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/py-runner-venv"));
    let python = venv.join("bin/python");
    assert!(
        python.is_file(),
        "the third-party runner is not installed: no {}.\n\
         Run ./scripts/test.sh (it installs it), or create the venv alone with\n  \
         bash -c '. scripts/lib/deps.sh && podgate_ensure_py_runner'\n\
         from the repository root, then run this test again.",
        python.display()
    );
    venv
}

/// Tokens out of anything this test prints (python's logs name them in full).
fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = ["glrt-", "glcbt-"]
        .iter()
        .filter_map(|p| rest.find(p).map(|i| (i, p.len())))
        .min()
        .map(|(i, len)| (i, i + len))
    {
        out.push_str(&rest[..i.1]);
        let tail = &rest[i.1..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || "._-".contains(c)))
            .unwrap_or(tail.len());
        out.push_str("[redacted]");
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// `podgate up --no-fleet`, stopped (SIGTERM) when dropped.
struct Up {
    child: Child,
    stdout: Arc<Mutex<String>>,
    proxy: String,
    admin: SocketAddr,
    pods: Vec<PodInfo>,
}

/// One Pod as `podgate up` printed it.
#[derive(Debug)]
struct PodInfo {
    id: u64,
    address: SocketAddr,
    registration_token: String,
}

impl Up {
    fn start() -> Up {
        let (listen, admin) = (free_port(), free_port());
        let mut child = Command::new(env!("CARGO_BIN_EXE_podgate"))
            // Runners only: no kube-sim, agentk or Workspaces to start first.
            .args(["up", "--no-fleet", "--no-kube", "--duration", "15m"])
            .args(["--listen", &format!("127.0.0.1:{listen}")])
            .args(["--admin", &format!("127.0.0.1:{admin}")])
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting podgate up");
        let stdout = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        {
            let reader = BufReader::new(child.stdout.take().expect("piped"));
            let stdout = stdout.clone();
            std::thread::spawn(move || {
                // Read to the end, so the live table never blocks `podgate up`.
                for line in reader.lines().map_while(Result::ok) {
                    stdout.lock().unwrap().push_str(&format!("{line}\n"));
                    let _ = tx.send(line);
                }
            });
        }
        let mut up = Up {
            child,
            stdout,
            proxy: format!("http://127.0.0.1:{listen}"),
            admin: format!("127.0.0.1:{admin}").parse().unwrap(),
            pods: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = rx.recv_timeout(left).unwrap_or_else(|_| {
                panic!(
                    "podgate up did not print `podgate up: ready` within 60 s:\n{}",
                    redact(&up.stdout.lock().unwrap())
                )
            });
            if line == "podgate up: ready" {
                break;
            }
            if let Some(pod) = parse_pod(&line) {
                up.pods.push(pod);
            }
        }
        assert_eq!(up.pods.len(), 3, "{}", redact(&up.stdout.lock().unwrap()));
        up
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = signal(self.child.id(), Signal::TERM);
        let _ = self.child.wait();
    }
}

/// `pod id=2 address=http://127.0.0.1:4321 registration_token=glrt-… control_api=…`.
fn parse_pod(line: &str) -> Option<PodInfo> {
    let fields: BTreeMap<&str, &str> = line
        .trim()
        .strip_prefix("pod ")?
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .collect();
    let address = fields
        .get("address")?
        .strip_prefix("http://")?
        .parse()
        .ok()?;
    assert_eq!(
        fields.get("control_api").copied(),
        Some(format!("http://{address}/-/podsim/jobs").as_str()),
        "{line}"
    );
    Some(PodInfo {
        id: fields.get("id")?.parse().ok()?,
        address,
        registration_token: fields.get("registration_token")?.to_string(),
    })
}

/// One HTTP/1.1 exchange (`Connection: close`): the status and the body.
fn http(addr: SocketAddr, method: &str, path: &str, json: Option<&Value>) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let body = json.map(|j| j.to_string()).unwrap_or_default();
    let mut head = format!("{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n");
    if json.is_some() {
        head.push_str("content-type: application/json\r\n");
    }
    head.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no response head from {addr}{path}"));
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line from {addr}{path}: {head}"));
    let mut body = raw[split + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        body = podgate_testkit::http::dechunk(&body).expect("a whole chunked body");
    }
    (status, body)
}

fn get_json(addr: SocketAddr, path: &str) -> Value {
    let (status, body) = http(addr, "GET", path, None);
    assert_eq!(
        status,
        200,
        "GET {path}: {}",
        String::from_utf8_lossy(&body)
    );
    serde_json::from_slice(&body).unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

fn get_text(addr: SocketAddr, path: &str) -> String {
    let (status, body) = http(addr, "GET", path, None);
    assert_eq!(status, 200, "GET {addr}{path}");
    String::from_utf8(body).unwrap()
}

/// Queue a job through the Pod's control API: its id.
fn queue_job(pod: &PodInfo, job: Value) -> u64 {
    let (status, body) = http(pod.address, "POST", "/-/podsim/jobs", Some(&job));
    let text = String::from_utf8_lossy(&body);
    assert!(
        status == 200 || status == 201,
        "queueing {job}: {status} {text}"
    );
    let v: Value = serde_json::from_slice(&body).unwrap();
    v["id"]
        .as_u64()
        .unwrap_or_else(|| panic!("no id in {text}"))
}

/// SHA-256 in hex, by coreutils (the jobs use the same tool).
fn sha256_hex(data: &[u8]) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sha256sum");
    child.stdin.take().unwrap().write_all(data).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_owned()
}

/// Random hex from the kernel.
fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .unwrap();
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// The Python runner's tools in `dir`, with a deadline per call.
struct Python {
    python: PathBuf,
    dir: PathBuf,
}

impl Python {
    fn run(&self, what: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(&self.python);
        cmd.args(args)
            .current_dir(&self.dir)
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env("no_proxy", "127.0.0.1,localhost")
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap_or_else(|e| panic!("{what}: {e}"));
        let pid = child.id();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        match rx.recv_timeout(RUNNER_DEADLINE) {
            Ok(out) => out.unwrap_or_else(|e| panic!("{what}: {e}")),
            Err(_) => {
                let _ = signal(pid, Signal::KILL);
                panic!("{what}: still running after {RUNNER_DEADLINE:?}");
            }
        }
    }

    /// Like [`Python::run`], and the exit status must be 0.
    fn ok(&self, what: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
        let out = self.run(what, args, env);
        assert!(
            out.status.success(),
            "{what} failed ({}):\n{}",
            out.status,
            show(&out)
        );
        out
    }
}

fn show(out: &Output) -> String {
    redact(&format!(
        "--- stdout\n{}\n--- stderr\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// gitlab-runner-api's `Runner` checks its token (`POST /api/v4/runners/verify`) when it
/// is loaded; the token comes from the environment so it is not on a command line.
const VERIFY: &str = "import json, os, gitlab_runner_api as g\n\
g.Runner.loads(json.dumps([1, os.environ['URL'], 0, os.environ['RUNNER_TOKEN'], {'info': {}}]))\n";

/// `podsim_requests_total{endpoint,status}` of one Pod.
fn pod_requests(metrics: &str) -> BTreeMap<(String, u16), u64> {
    let mut out = BTreeMap::new();
    for s in select(&samples(metrics), "podsim_requests_total") {
        let (Some(endpoint), Some(status)) = (
            s.label("endpoint"),
            s.label("status").and_then(|s| s.parse().ok()),
        ) else {
            continue;
        };
        *out.entry((endpoint.to_owned(), status)).or_default() += s.value as u64;
    }
    out
}

fn sample(metrics: &str, name: &str) -> f64 {
    value(metrics, name).unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
}

/// Endpoints that are not runner traffic (`podgate up` leaves them out too).
const NOT_RUNNER_TRAFFIC: [&str; 3] = ["health", "metrics", "control"];

/// What Pod 1's kas asks its GitLab directly, not through the proxy: the Kubernetes
/// API proxy's, Workspaces' and agentw's internal API (`podgate up` runs them).
fn from_kas(endpoint: &str) -> bool {
    ["k8s_", "ws_", "agentw_"]
        .iter()
        .any(|p| endpoint.starts_with(p))
        || endpoint == "user"
}

fn runner_traffic(requests: &BTreeMap<(String, u16), u64>) -> u64 {
    requests
        .iter()
        .filter(|((e, _), _)| !NOT_RUNNER_TRAFFIC.contains(&e.as_str()) && !from_kas(e))
        .map(|(_, n)| n)
        .sum()
}

/// Requests the proxy forwarded to each Pod's GitLab, by its
/// `podgate_proxy_requests_total` (the `kas-*` rules' requests went to the Pod's kas:
/// agentk's module calls, which kas passes on to GitLab directly).
fn proxy_requests_by_pod(metrics: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for s in select(&samples(metrics), "podgate_proxy_requests_total")
        .filter(|s| !s.label("rule").is_some_and(|r| r.starts_with("kas")))
    {
        if let Some(pod) = s.label("pod") {
            *out.entry(pod.to_owned()).or_default() += s.value as u64;
        }
    }
    out
}

/// Everything one Pod is checked on, after its runner ran.
fn run_on_pod(up: &Up, venv: &Path, pod: &PodInfo) {
    let dir = tempfile::tempdir().unwrap();
    let py = Python {
        python: venv.join("bin/python"),
        dir: dir.path().to_owned(),
    };
    let content = random_hex(2048);
    let content_sha = sha256_hex(content.as_bytes());

    // Queued before the runner starts: it sleeps 40 s after an empty poll. Tagged
    // `x`: the runner registers with `--tag x` and `run_untagged: false`, so GitLab
    // (and the Pod) give it only jobs with that tag.
    let produce = queue_job(
        pod,
        json!({
            "name": "produce",
            "stage": "build",
            "image": null,
            "script": [
                "mkdir -p out",
                format!("printf '%s' '{content}' > out/data.txt"),
                "sha256sum out/data.txt",
                "echo \"commit $(git rev-parse HEAD)\"",
            ],
            "artifacts": ["out/"],
            "dependencies": [],
            "tags": ["x"],
        }),
    );
    let consume = queue_job(
        pod,
        json!({
            "name": "consume",
            "stage": "test",
            "image": null,
            "script": [
                "sha256sum out/data.txt",
                "echo \"commit $(git rev-parse HEAD)\"",
            ],
            "artifacts": [],
            "dependencies": [produce],
            "tags": ["x"],
        }),
    );

    // Register (form body), through the proxy.
    let desc = format!("podgate-acceptance-pod-{}", pod.id);
    py.ok(
        "gitlab-python-runner --register",
        &[
            "-m",
            "GitlabPyRunner",
            "--register",
            &up.proxy,
            "--regtoken",
            &pod.registration_token,
            "--desc",
            &desc,
            "--tag",
            "x",
        ],
        &[],
    );
    let config = std::fs::read_to_string(dir.path().join("gitlab-runner.yml"))
        .expect("the runner saved gitlab-runner.yml");
    let token = config
        .lines()
        .find_map(|l| l.trim().strip_prefix("token:"))
        .map(|t| t.trim().trim_matches(['\'', '"']).to_owned())
        .expect("a token in gitlab-runner.yml");
    assert!(
        token.starts_with("glrt-"),
        "not a runner token: {}",
        redact(&token)
    );

    // Verify, with the second client.
    let verify_env = [("URL", up.proxy.as_str()), ("RUNNER_TOKEN", token.as_str())];
    py.ok("gitlab-runner-api verify", &["-c", VERIFY], &verify_env);

    // Two jobs, one `--once` run each.
    for job in ["produce", "consume"] {
        py.ok(
            &format!("gitlab-python-runner --start --once ({job})"),
            &[
                "-m",
                "GitlabPyRunner",
                "--start",
                "gitlab-runner.yml",
                "--once",
            ],
            &[],
        );
    }

    let job1 = get_json(pod.address, &format!("/-/podsim/jobs/{produce}"));
    let job2 = get_json(pod.address, &format!("/-/podsim/jobs/{consume}"));
    let trace1 = job1["trace"].as_str().unwrap_or_default().to_owned();
    let trace2 = job2["trace"].as_str().unwrap_or_default().to_owned();
    let context = format!(
        "Pod {}\n--- produce\n{}\n--- consume\n{}",
        pod.id,
        redact(&job1.to_string()),
        redact(&job2.to_string())
    );
    assert_eq!(job1["state"], "success", "{context}");
    assert_eq!(job2["state"], "success", "{context}");

    // The clone: each job checked out the commit the Pod's repository serves.
    let sha = job1["sha"]
        .as_str()
        .unwrap_or_else(|| panic!("no sha: {context}"));
    assert_eq!(sha.len(), 40, "{context}");
    for trace in [&trace1, &trace2] {
        assert!(trace.contains("Cloning into"), "no clone: {context}");
        assert!(
            trace.contains(&format!("commit {sha}")),
            "not at {sha}: {context}"
        );
    }

    // The artifact: job 1 made it, the Pod stored the file part, job 2 downloaded and
    // unpacked the same bytes (zipfile checks each member's CRC-32).
    let line = format!("{content_sha}  out/data.txt");
    assert!(trace1.contains(&line), "produce: {context}");
    assert!(
        trace2.contains("Fetching artifacts from"),
        "consume fetched nothing: {context}"
    );
    assert!(
        trace2.contains(&line),
        "consume unpacked something else: {context}"
    );
    let artifact = &job1["artifact"];
    let (status, stored) = http(
        pod.address,
        "GET",
        &format!("/-/podsim/jobs/{produce}/artifact"),
        None,
    );
    assert_eq!(status, 200, "{context}");
    assert_eq!(
        artifact["size"].as_u64(),
        Some(stored.len() as u64),
        "{context}"
    );
    assert_eq!(
        artifact["sha256"].as_str(),
        Some(sha256_hex(&stored).as_str()),
        "{context}"
    );
    assert_eq!(artifact["filename"], "artifacts.zip", "{context}");
    assert!(
        stored.starts_with(b"PK\x03\x04"),
        "not the zip the runner sent: {context}"
    );
    // gitlab-python-runner stores members uncompressed: the file is in the zip as is.
    assert!(
        stored
            .windows(content.len())
            .any(|w| w == content.as_bytes()),
        "the stored zip does not hold out/data.txt: {context}"
    );
    assert!(job2["artifact"].is_null(), "{context}");

    // Unregister (a form body on DELETE), then the token no longer verifies.
    py.ok(
        "gitlab-python-runner --unregister",
        &["-m", "GitlabPyRunner", "--unregister"],
        &[],
    );
    let out = py.run(
        "gitlab-runner-api verify after unregister",
        &["-c", VERIFY],
        &verify_env,
    );
    assert!(
        !out.status.success(),
        "verify passed after unregister:\n{}",
        show(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("AuthException"),
        "{}",
        show(&out)
    );

    // What this Pod saw: every runner call, each answered as GitLab answers it.
    let metrics = get_text(pod.address, "/metrics");
    assert_eq!(
        sample(&metrics, "misrouted_requests_total"),
        0.0,
        "Pod {}:\n{metrics}",
        pod.id
    );
    let requests = pod_requests(&metrics);
    let n = |endpoint: &str, status: u16| {
        requests
            .get(&(endpoint.to_owned(), status))
            .copied()
            .unwrap_or(0)
    };
    let pod_ctx = format!("Pod {}: {requests:?}", pod.id);
    assert_eq!(n("runners", 201), 1, "{pod_ctx}");
    assert_eq!(n("runners_verify", 200), 1, "{pod_ctx}");
    assert_eq!(n("runners_verify", 403), 1, "{pod_ctx}");
    assert_eq!(n("jobs_request", 201), 2, "{pod_ctx}");
    assert_eq!(n("jobs_update", 200), 2, "{pod_ctx}");
    assert!(n("jobs_trace", 202) >= 2, "{pod_ctx}");
    assert_eq!(n("jobs_artifacts_upload", 201), 1, "{pod_ctx}");
    assert_eq!(n("jobs_artifacts_download", 200), 1, "{pod_ctx}");
    assert_eq!(n("runners_delete", 204), 1, "{pod_ctx}");
    // Both clones' smart HTTP reached this Pod with the job token.
    let git_ok: u64 = requests
        .iter()
        .filter(|((e, s), _)| e.starts_with("git") && *s == 200)
        .map(|(_, n)| n)
        .sum();
    assert!(
        git_ok >= 4,
        "two clones (info/refs + upload-pack each): {pod_ctx}"
    );
    for ((endpoint, status), count) in &requests {
        let expected = *status < 400
            || (endpoint == "runners_verify" && *status == 403)
            // git asks without credentials first; GitLab answers 401 + WWW-Authenticate
            // (the proxy sends a request with no token to the default Pod).
            || (endpoint.starts_with("git") && *status == 401);
        assert!(
            expected,
            "Pod {} answered {count} x {status} on {endpoint}: {pod_ctx}",
            pod.id
        );
    }
}

#[test]
fn gitlab_python_runner_runs_unchanged_through_podgate_up_on_every_pod() {
    let venv = venv();
    let up = Up::start();
    for pod in &up.pods {
        run_on_pod(&up, &venv, pod);
    }

    // Registration and unregister were routed by the form body's token.
    let proxy = get_text(up.admin, "/metrics");
    for pod in &up.pods {
        for status in ["201", "204"] {
            let selector = format!(
                r#"podgate_proxy_requests_total{{rule="runners",source="form:token",pod="{}",status="{status}"}}"#,
                pod.id
            );
            let routed = select(&samples(&proxy), &selector).any(|s| s.value == 1.0);
            assert!(
                routed,
                "no form-routed {status} to Pod {}:\n{proxy}",
                pod.id
            );
        }
    }

    // The proxy forwarded to each Pod exactly what that Pod counted as runner traffic
    // (health probes, metrics and the control API do not go through it).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let proxy = proxy_requests_by_pod(&get_text(up.admin, "/metrics"));
        let pods: BTreeMap<String, u64> = up
            .pods
            .iter()
            .map(|p| {
                let metrics = get_text(p.address, "/metrics");
                assert_eq!(
                    sample(&metrics, "misrouted_requests_total"),
                    0.0,
                    "Pod {}",
                    p.id
                );
                (p.id.to_string(), runner_traffic(&pod_requests(&metrics)))
            })
            .collect();
        let forwarded: BTreeMap<String, u64> = proxy
            .into_iter()
            .filter(|(pod, _)| pods.contains_key(pod))
            .collect();
        if forwarded == pods {
            break;
        }
        // The proxy counts a request when it has logged it, just after the answer.
        assert!(
            Instant::now() < deadline,
            "proxy forwarded per Pod {forwarded:?}, Pods counted {pods:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
