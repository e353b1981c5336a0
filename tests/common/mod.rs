//! Shared by the proxy's end-to-end tests: recording stub Pods, the real `podgate
//! proxy` binary, and a raw HTTP/1.1 client that hides nothing; signals to child
//! processes ([`process`]) and Prometheus text read as samples ([`metrics`]).

pub mod metrics;
pub mod process;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use podgate_registry::testing::{eventually, free_port};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// What a stub Pod saw.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    /// Path and query, as on the request line.
    pub path: String,
    /// Lower-cased names; the last value of a repeated header.
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

/// A stub Pod upstream: records every request and answers `{"pod": N}`, except:
///
/// - the proxy's health checks (`user-agent: podgate-health-check`) are answered 200,
///   or 503 while [`Stub::set_healthy`] is false, and not recorded;
/// - a request with `x-test-long-poll: <secs>` is held like Workhorse holds
///   `jobs/request`: until [`Stub::queue_job`] (201 with a job) or `secs` pass (204);
/// - `upgrade: websocket` is answered 101 and then every byte is echoed.
#[derive(Clone)]
pub struct Stub {
    pub addr: SocketAddr,
    pub pod: u64,
    seen: Arc<Mutex<Vec<Seen>>>,
    healthy: Arc<AtomicBool>,
    jobs: Arc<Notify>,
}

impl Stub {
    pub async fn start(pod: u64) -> Stub {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stub = Stub {
            addr: listener.local_addr().unwrap(),
            pod,
            seen: Arc::default(),
            healthy: Arc::new(AtomicBool::new(true)),
            jobs: Arc::new(Notify::new()),
        };
        let s = stub.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let s = s.clone();
                tokio::spawn(async move {
                    let _ = s.serve(stream).await;
                });
            }
        });
        stub
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::SeqCst);
    }

    /// Wake one held long poll with a job (or the next one to arrive).
    pub fn queue_job(&self) {
        self.jobs.notify_one();
    }

    async fn serve(&self, stream: TcpStream) -> std::io::Result<()> {
        let mut r = BufReader::new(stream);
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).await? == 0 {
                return Ok(());
            }
            let mut parts = line.split_whitespace();
            let method = parts.next().unwrap_or("").to_owned();
            let path = parts.next().unwrap_or("").to_owned();
            let mut headers = HashMap::new();
            loop {
                let mut h = String::new();
                r.read_line(&mut h).await?;
                let h = h.trim_end();
                if h.is_empty() {
                    break;
                }
                if let Some((k, v)) = h.split_once(':') {
                    headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
                }
            }
            let body = read_body(&mut r, &headers).await?;
            if headers.get("user-agent").map(String::as_str) == Some("podgate-health-check") {
                let status = if self.healthy.load(Ordering::SeqCst) {
                    "200 OK"
                } else {
                    "503 Service Unavailable"
                };
                let resp = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
                r.get_mut().write_all(resp.as_bytes()).await?;
                continue;
            }
            let websocket = headers
                .get("upgrade")
                .is_some_and(|u| u.eq_ignore_ascii_case("websocket"));
            let hold = headers
                .get("x-test-long-poll")
                .and_then(|s| s.parse::<u64>().ok());
            self.seen.lock().unwrap().push(Seen {
                method,
                path,
                headers,
                body,
            });
            if websocket {
                r.get_mut()
                    .write_all(
                        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n",
                    )
                    .await?;
                let (mut rd, mut wr) = tokio::io::split(r);
                tokio::io::copy(&mut rd, &mut wr).await?;
                return Ok(());
            }
            let resp = match hold {
                Some(secs) => {
                    match tokio::time::timeout(Duration::from_secs(secs), self.jobs.notified())
                        .await
                    {
                        Ok(()) => {
                            let job = format!(r#"{{"id":1,"pod":{}}}"#, self.pod);
                            format!(
                                "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{job}",
                                job.len()
                            )
                        }
                        Err(_) => {
                            "HTTP/1.1 204 No Content\r\nx-gitlab-last-update: t1\r\n\r\n".to_owned()
                        }
                    }
                }
                None => {
                    let reply = format!("{{\"pod\":{}}}", self.pod);
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{reply}",
                        reply.len()
                    )
                }
            };
            r.get_mut().write_all(resp.as_bytes()).await?;
        }
    }
}

async fn read_body(
    r: &mut BufReader<TcpStream>,
    headers: &HashMap<String, String>,
) -> std::io::Result<Vec<u8>> {
    let mut body = Vec::new();
    if let Some(n) = headers
        .get("content-length")
        .and_then(|v| v.parse::<usize>().ok())
    {
        body.resize(n, 0);
        r.read_exact(&mut body).await?;
    } else if headers
        .get("transfer-encoding")
        .is_some_and(|v| v.contains("chunked"))
    {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).await?;
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk).await?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    }
    Ok(body)
}

/// The proxy process; killed on drop.
pub struct Proxy {
    pub child: Child,
    pub port: u16,
    pub admin: u16,
    pub config: std::path::PathBuf,
    pub dir: tempfile::TempDir,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Write `listen`, `admin_listen` (free ports), `grace_period_secs = 0` unless
/// `config_body` sets it, and `config_body` to `proxy.toml` in `dir`, start `podgate
/// proxy`, and return once it accepts connections.
pub async fn start_proxy(config_body: &str, dir: tempfile::TempDir) -> Proxy {
    let (port, admin, path) = write_config(config_body, &dir);
    let child = spawn_proxy(&path, false);
    accepting(child, port, admin, path, dir).await
}

/// `proxy.toml` in `dir` for [`start_proxy`]: (port, admin port, path).
fn write_config(config_body: &str, dir: &tempfile::TempDir) -> (u16, u16, std::path::PathBuf) {
    let (port, admin) = (free_port(), free_port());
    let grace = if config_body.contains("grace_period_secs") {
        ""
    } else {
        "grace_period_secs = 0\n"
    };
    let config = format!(
        "listen = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin}\"\n{grace}upgrade_sock = \"{sock}\"\n{config_body}",
        sock = dir.path().join("upgrade.sock").display()
    );
    let path = dir.path().join("proxy.toml");
    std::fs::write(&path, config).unwrap();
    (port, admin, path)
}

/// The proxy `child` runs, once it accepts on `port` and `admin`.
async fn accepting(
    child: Child,
    port: u16,
    admin: u16,
    config: std::path::PathBuf,
    dir: tempfile::TempDir,
) -> Proxy {
    let proxy = Proxy {
        child,
        port,
        admin,
        config,
        dir,
    };
    // The admin listener is its own pingora service, bound on its own thread: the
    // proxy port accepting says nothing about it.
    wait_accepting(port).await;
    wait_accepting(admin).await;
    proxy
}

/// `podgate proxy --config path [--upgrade]`.
pub fn spawn_proxy(path: &std::path::Path, upgrade: bool) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_podgate"));
    cmd.args(["proxy", "--config", path.to_str().unwrap()]);
    if upgrade {
        cmd.arg("--upgrade");
    }
    // PODGATE_TEST_LOG=debug shows the proxy's log while debugging a test.
    let log = std::env::var("PODGATE_TEST_LOG").ok();
    if let Some(filter) = &log {
        cmd.env("PODGATE_LOG", filter);
    }
    cmd.stdout(Stdio::null())
        .stderr(if log.is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .spawn()
        .unwrap()
}

/// Until something accepts on `port` (a child binding its port sends no event we
/// could await).
pub async fn wait_accepting(port: u16) {
    eventually(
        Duration::from_secs(20),
        "the proxy to accept connections",
        || async {
            TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()
                .map(|_| ())
        },
    )
    .await;
}

/// A parsed response.
pub struct Reply {
    pub status: u16,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

/// Parse a whole HTTP/1.1 response (after `connection: close`), skipping interim
/// `100 Continue` responses as HTTP clients do.
pub fn parse_reply(raw: &[u8]) -> Reply {
    let mut raw = raw;
    loop {
        let end = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a complete response head");
        let head = String::from_utf8_lossy(&raw[..end]).into_owned();
        let rest = &raw[end + 4..];
        let mut lines = head.lines();
        let status: u16 = lines
            .next()
            .unwrap()
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        if status == 100 {
            raw = rest;
            continue;
        }
        let headers: HashMap<String, String> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let body = if headers
            .get("transfer-encoding")
            .is_some_and(|v| v.contains("chunked"))
        {
            // Not a whole chunked body (the connection broke): what came, as it came.
            podgate_testkit::http::dechunk(rest).unwrap_or_else(|| rest.to_vec())
        } else {
            rest.to_vec()
        };
        return Reply {
            status,
            headers,
            body,
        };
    }
}

/// Send one request (`head` without the final CRLF; `host`, `connection: close` and
/// `content-length` are added) and read the whole reply.
pub async fn request(port: u16, head: &str, body: &[u8]) -> Reply {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let req = format!(
        "{head}\r\nhost: gitlab.example.com\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    parse_reply(&raw)
}

/// [`request`], with the body as text: (status, headers, body).
pub async fn send(port: u16, head: &str, body: &[u8]) -> (u16, HashMap<String, String>, String) {
    let r = request(port, head, body).await;
    (
        r.status,
        r.headers,
        String::from_utf8_lossy(&r.body).into_owned(),
    )
}

/// Send a chunked request body in 1 MiB chunks; returns (status, body). Each chunk
/// goes out with its framing in one write, the first together with the head, as
/// buffered HTTP clients (Go's `net/http`, the runner's) send them.
pub async fn send_chunked(port: u16, head: &str, body: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut out = format!(
        "{head}\r\nhost: gitlab.example.com\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    for chunk in body.chunks(1 << 20) {
        out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        out.extend_from_slice(chunk);
        out.extend_from_slice(b"\r\n");
        s.write_all(&out).await.unwrap();
        out.clear();
    }
    s.write_all(b"0\r\n\r\n").await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let r = parse_reply(&raw);
    (r.status, String::from_utf8_lossy(&r.body).into_owned())
}

/// A GitLab v1 token with this prefix routable to `cell`.
pub fn gitlab_token(prefix: &str, cell: u64) -> String {
    let keys = podgate_tokens::gitlab::RoutingKeys {
        cell: Some(cell),
        organization: Some(1),
        ..Default::default()
    };
    podgate_tokens::gitlab::encode(prefix, &keys, &podgate_tokens::gitlab::random_bytes()).unwrap()
}

/// A `glrt-` runner token routable to `cell`.
pub fn v1(cell: u64) -> String {
    gitlab_token("glrt-", cell)
}

/// An Ed25519 key pair: the public key written as `k1.pem` into `dir` (for the proxy's
/// `keys`), and a function minting JWTs of `kind` for a Pod.
pub fn jwt_minter(
    dir: &std::path::Path,
) -> impl Fn(podgate_tokens::TokenKind, u64) -> String + use<> {
    let key = podgate_tokens::keys::generate(podgate_tokens::Algorithm::EdDSA).unwrap();
    std::fs::write(dir.join("k1.pem"), key.public.as_ref().unwrap()).unwrap();
    let signer = podgate_tokens::keys::keyset_from_generated("k1", &key).unwrap();
    move |kind, pod| {
        podgate_tokens::mint(
            &podgate_tokens::MintRequest::new(kind, podgate_tokens::PodId::new(pod).unwrap(), 600),
            signer.signing_key().unwrap(),
            podgate_tokens::unix_now(),
        )
        .unwrap()
    }
}

/// A 3-Pod inline topology (legacy Pod 1) over these stubs, after `extra` lines.
pub fn three_pods(legacy: &Stub, pod2: &Stub, pod3: &Stub, extra: &str) -> String {
    let web = |s: &Stub| vec![s.addr.to_string()];
    format!(
        "{extra}\n{}",
        topology(&[
            pod_entry(1, &web(legacy), ""),
            pod_entry(2, &web(pod2), ""),
            pod_entry(3, &web(pod3), ""),
        ])
    )
}

/// An inline topology, Pod 1 the default: `[topology]` and `pods` ([`pod_entry`]).
/// Top-level keys and other tables go before it.
pub fn topology(pods: &[String]) -> String {
    format!("[topology]\ndefault_pod = 1\n{}", pods.concat())
}

/// One `[[topology.pods]]` entry: Pod `id` (named `legacy` when it is Pod 1, else
/// `pod-<id>`), its `web` upstreams, and `extra` TOML lines (`kas = [...]`, `state =
/// "draining"`).
pub fn pod_entry(id: u64, web: &[String], extra: &str) -> String {
    let name = if id == 1 {
        "legacy".to_owned()
    } else {
        format!("pod-{id}")
    };
    format!("[[topology.pods]]\nid = {id}\nname = \"{name}\"\nweb = {web:?}\n{extra}\n")
}

/// GET a path on the admin listener: (status, body).
pub async fn admin_get(proxy: &Proxy, path: &str) -> (u16, String) {
    let (status, _, body) = send(proxy.admin, &format!("GET {path} HTTP/1.1"), b"").await;
    (status, body)
}

/// [`start_proxy`], keeping the proxy's log (its stderr, at the default level or
/// `PODGATE_TEST_LOG`'s) in `proxy.log` in `dir`; read it with [`proxy_log`].
pub async fn start_proxy_logged(config_body: &str, dir: tempfile::TempDir) -> Proxy {
    let (port, admin, path) = write_config(config_body, &dir);
    let log = std::fs::File::create(dir.path().join("proxy.log")).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_podgate"));
    cmd.args(["proxy", "--config", path.to_str().unwrap()]);
    if let Ok(filter) = std::env::var("PODGATE_TEST_LOG") {
        cmd.env("PODGATE_LOG", filter);
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();
    accepting(child, port, admin, path, dir).await
}

/// What a proxy started with [`start_proxy_logged`] has logged so far.
pub fn proxy_log(proxy: &Proxy) -> String {
    std::fs::read_to_string(proxy.dir.path().join("proxy.log")).unwrap_or_default()
}

/// A child process, killed when dropped.
pub struct Running(pub Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `podgate up ARGS` until it prints `podgate up: ready` (within `timeout`): the
/// process (killed when dropped) and everything it printed by then. Its output
/// is read to the end, so it never blocks on a full pipe.
pub fn podgate_up(args: &[String], timeout: Duration) -> (Running, String) {
    let (up, rx) = spawn_up(args);
    let up = Running(up);
    let mut printed = String::new();
    loop {
        let line = rx
            .recv_timeout(timeout)
            .unwrap_or_else(|_| panic!("podgate up never got ready:\n{printed}"));
        printed.push_str(&line);
        printed.push('\n');
        if line.contains("podgate up: ready") {
            return (up, printed);
        }
    }
}

/// `podgate up ARGS`, as [`spawn_podgate`] but with no stderr: its children (the
/// proxy, redis-server) outlive it by a moment when it is killed, and must not hold
/// the test's output open.
pub fn spawn_up<S: AsRef<std::ffi::OsStr>>(
    args: impl IntoIterator<Item = S>,
) -> (Child, std::sync::mpsc::Receiver<String>) {
    let args = args.into_iter().map(|a| a.as_ref().to_owned());
    spawn(std::iter::once("up".into()).chain(args), Stdio::null())
}

/// `podgate ARGS` logging errors only (`PODGATE_LOG=error`, on the test's stderr),
/// its stdout read line by line to the end on a thread of its own (so it never
/// blocks on a full pipe, however long the test stops listening): the process and
/// its lines.
pub fn spawn_podgate<S: AsRef<std::ffi::OsStr>>(
    args: impl IntoIterator<Item = S>,
) -> (Child, std::sync::mpsc::Receiver<String>) {
    spawn(args, Stdio::inherit())
}

fn spawn<S: AsRef<std::ffi::OsStr>>(
    args: impl IntoIterator<Item = S>,
    stderr: Stdio,
) -> (Child, std::sync::mpsc::Receiver<String>) {
    use std::io::BufRead as _;
    let mut child = Command::new(env!("CARGO_BIN_EXE_podgate"))
        .args(args)
        .env("PODGATE_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    (child, rx)
}

/// The first of `lines` that `pick` accepts, within `within`; panics naming `what`
/// when none comes.
pub fn first_line<T>(
    lines: &std::sync::mpsc::Receiver<String>,
    within: Duration,
    what: &str,
    pick: impl Fn(&str) -> Option<T>,
) -> T {
    let deadline = std::time::Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = lines
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("{what}: not ready after {within:?}"));
        if let Some(v) = pick(&line) {
            return v;
        }
    }
}
