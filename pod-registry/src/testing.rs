//! Real Redis for tests: a `redis-server` and a 3-master Redis Cluster, each on
//! ephemeral ports in a temporary directory, stopped when dropped. Never port 6379.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Where [`free_port`] picks: below the kernel's ephemeral range (32768–60999 by
/// default), which every `bind(":0")` of the processes under test draws from, so a
/// port handed to a test is never also given to one of them in the moment between
/// its check here and its server's bind (`podgate up` binds a dozen listeners on
/// port 0; CI once lost a proxy port that way). Redis cluster bus ports are port +
/// 10000: still valid.
const PORTS: std::ops::Range<u16> = 15_000..32_000;

/// A free TCP port on 127.0.0.1 (bound once, then released for the server to take):
/// each call in a process a different one, from [`PORTS`], starting at an offset
/// of the process's own.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let span = u32::from(PORTS.end - PORTS.start);
    if NEXT.load(Ordering::Relaxed) == u32::MAX {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let start = (std::process::id().wrapping_mul(7_919) ^ nanos) % span;
        let _ = NEXT.compare_exchange(u32::MAX, start, Ordering::Relaxed, Ordering::Relaxed);
    }
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed) % span;
        let port = PORTS.start + n as u16;
        if port != 6379 && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {PORTS:?}");
}

/// One `redis-server` process.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    extra: Vec<String>,
    /// Lines of interest from the server's log ("ready", "cluster ok").
    events: Option<mpsc::Receiver<ServerEvent>>,
}

/// What the server's log announces.
#[derive(Debug, PartialEq, Eq)]
enum ServerEvent {
    Ready,
    ClusterOk,
}

impl RedisServer {
    /// Start a standalone server with no persistence on a free port.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Start with extra `redis-server` arguments (e.g. `--cluster-enabled yes`).
    pub fn start_with(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut s = RedisServer {
            port: free_port(),
            dir,
            child: None,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            events: None,
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        // The server runs under a guard shell that holds a pipe from this process:
        // when the pipe closes (drop, panic, or this process killed outright) the
        // guard kills the server. No server outlives its test.
        const GUARD: &str = r#"redis-server "$@" & pid=$!
trap 'kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
cat >/dev/null"#;
        let child = Command::new("sh")
            .arg("-c")
            .arg(GUARD)
            .arg("redis-server-guard")
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("sh and redis-server are installed (scripts/test.sh installs redis-server)");
        let mut child = child;
        // The server logs to stdout: watch it for the lines we wait on, and keep
        // draining it so the server never blocks on a full pipe.
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                let event = if line.contains("Ready to accept connections") {
                    Some(ServerEvent::Ready)
                } else if line.contains("Cluster state changed: ok") {
                    Some(ServerEvent::ClusterOk)
                } else {
                    None
                };
                if let Some(e) = event {
                    let _ = tx.send(e);
                }
            }
        });
        self.child = Some(child);
        self.events = Some(rx);
        self.wait_for(ServerEvent::Ready, Duration::from_secs(10));
    }

    /// Block until the server's log announces `event` (bounded by `timeout`).
    fn wait_for(&self, event: ServerEvent, timeout: Duration) {
        let rx = self.events.as_ref().expect("server started");
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(e) if e == event => return,
                Ok(_) => continue,
                Err(_) => panic!(
                    "redis-server on port {} (dir {}) did not report {event:?} within {timeout:?}",
                    self.port,
                    self.dir.path().display()
                ),
            }
        }
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's working directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kill the server (SIGKILL: no chance to save anything) and wait until it is gone.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            // Closing the guard's stdin makes it kill -9 the server and reap it.
            drop(c.stdin.take());
            let _ = c.wait();
        }
    }

    /// Start it again, empty, on the same port.
    pub fn restart_empty(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Run `redis-cli` against this server and return its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli is installed");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A 3-master Redis Cluster (no replicas), built with `redis-cli --cluster create`.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Start three cluster-enabled servers and join them; returns once every slot
    /// is served.
    pub fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli is installed");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_ok();
        cluster
    }

    /// Every node logs "Cluster state changed: ok" once it serves all slots.
    fn wait_ok(&self) {
        for n in &self.nodes {
            n.wait_for(ServerEvent::ClusterOk, Duration::from_secs(20));
        }
    }

    /// Seed URLs of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }
}

/// Poll `check` until it returns `Some`, or panic after `timeout`. For conditions
/// that only time brings about (a TTL running out), where no event can be awaited.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut tick = tokio::time::interval(Duration::from_millis(25));
    loop {
        tick.tick().await;
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
    }
}
