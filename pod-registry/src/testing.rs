//! Real Redis for tests: a `redis-server` and a 3-master Redis Cluster, each on
//! ephemeral ports in a temporary directory, stopped when dropped. Never port 6379.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Where [`free_port`] picks: below the kernel's ephemeral range (32768–60999 by
/// default), which every `bind(":0")` of the processes under test draws from, so a
/// port handed to a test is never also given to one of them in the moment between
/// its check here and its server's bind (`podgate up` alone binds a dozen listeners
/// on port 0, any of which could take a port picked from that range). Redis cluster
/// bus ports are port + 10000: still valid.
const PORTS: std::ops::Range<u16> = 15_000..32_000;

/// Where [`RedisServer`] picks a cluster node's port: its bus port (port + 10000)
/// then lies in 25,000–31,999, below the ephemeral range too. (From the whole of
/// [`PORTS`] a bus port could land on 32,768 or above, where any client socket of
/// the tests may already hold it: the node then aborts at start.)
const CLUSTER_PORTS: std::ops::Range<u16> = 15_000..22_000;

/// A port in [`CLUSTER_PORTS`] free now, with its bus port (+ 10000) free too.
fn free_cluster_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    pick_port(&NEXT, CLUSTER_PORTS, |port| {
        TcpListener::bind(("127.0.0.1", port)).is_ok()
            && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()
    })
}

/// The next port of `range` that passes `free`, counting on from `next` (which
/// starts at an offset of the process's own, so two test processes rarely try
/// the same ports at once).
fn pick_port(next: &AtomicU32, range: std::ops::Range<u16>, free: impl Fn(u16) -> bool) -> u16 {
    let span = u32::from(range.end - range.start);
    if next.load(Ordering::Relaxed) == u32::MAX {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let start = (std::process::id().wrapping_mul(7_919) ^ nanos) % span;
        let _ = next.compare_exchange(u32::MAX, start, Ordering::Relaxed, Ordering::Relaxed);
    }
    for _ in 0..span {
        let n = next.fetch_add(1, Ordering::Relaxed) % span;
        let port = range.start + n as u16;
        if free(port) {
            return port;
        }
    }
    panic!("no free port in {range:?}");
}

/// How many ports [`RedisServer::start_with`] tries before it gives up: another
/// process may bind a port between its check and the server's bind.
const START_ATTEMPTS: usize = 5;

/// A free TCP port on 127.0.0.1 (bound once, then released for the server to take):
/// each call in a process a different one, from `PORTS`, starting at an offset
/// of the process's own.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    pick_port(&NEXT, PORTS, |port| {
        port != 6379 && TcpListener::bind(("127.0.0.1", port)).is_ok()
    })
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
    /// The server gave up starting (its port or bus port was taken): the line.
    Aborted(String),
}

impl RedisServer {
    /// Start a standalone server with no persistence on a free port.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Start with extra `redis-server` arguments (e.g. `--cluster-enabled yes`).
    /// A server that cannot take its port (another process took it since it was
    /// found free) is started again on another, up to `START_ATTEMPTS` times.
    pub fn start_with(extra: &[&str]) -> Self {
        let cluster = extra.contains(&"--cluster-enabled");
        let pick = || {
            if cluster {
                free_cluster_port()
            } else {
                free_port()
            }
        };
        let dir = tempfile::tempdir().expect("temp dir");
        let mut s = RedisServer {
            port: pick(),
            dir,
            child: None,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            events: None,
        };
        let mut failures = Vec::new();
        while let Err(e) = s.spawn() {
            failures.push(e);
            s.kill();
            assert!(
                failures.len() < START_ATTEMPTS,
                "redis-server did not start: {failures:?}"
            );
            s.port = pick();
        }
        s
    }

    fn spawn(&mut self) -> Result<(), String> {
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
                } else if line.contains("aborting") || line.contains("Failed listening") {
                    Some(ServerEvent::Aborted(line))
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
        self.until(ServerEvent::Ready, Duration::from_secs(10))
    }

    /// Block until the server's log announces `event` (bounded by `timeout`).
    fn wait_for(&self, event: ServerEvent, timeout: Duration) {
        if let Err(e) = self.until(event, timeout) {
            panic!("{e}");
        }
    }

    /// Wait until the server's log announces `event`: an error if it aborts
    /// first or `timeout` passes.
    fn until(&self, event: ServerEvent, timeout: Duration) -> Result<(), String> {
        let rx = self.events.as_ref().expect("server started");
        let deadline = Instant::now() + timeout;
        let port = self.port;
        let dir = self.dir.path().display();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(e) if e == event => return Ok(()),
                Ok(ServerEvent::Aborted(line)) => {
                    return Err(format!("redis-server on port {port} (dir {dir}): {line}"));
                }
                Ok(_) => continue,
                Err(_) => {
                    return Err(format!(
                        "redis-server on port {port} (dir {dir}) did not report {event:?} within {timeout:?}"
                    ));
                }
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
        if let Err(e) = self.spawn() {
            panic!("{e}");
        }
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

/// Set runner `token`'s queue key to `value` and announce it, as Rails does
/// (`Gitlab::Workhorse.set_key_and_notify` with `overwrite: true`: `SET
/// runner:build_queue:<token> <value> EX 3600`, then `PUBLISH
/// workhorse:notifications:runner:build_queue:<token> <value>`), on the Redis at
/// `url`.
pub async fn set_runner_queue_key(url: &str, token: &str, value: &str) {
    use crate::runner_queue::{CHANNEL_PREFIX, KEY_PREFIX};
    let client = redis::Client::open(url).expect("a Redis URL");
    let mut c = client
        .get_multiplexed_async_connection()
        .await
        .expect("connecting to Redis");
    redis::pipe()
        .cmd("SET")
        .arg(format!("{KEY_PREFIX}{token}"))
        .arg(value)
        .arg("EX")
        .arg(3600)
        .ignore()
        .cmd("PUBLISH")
        .arg(format!("{CHANNEL_PREFIX}{KEY_PREFIX}{token}"))
        .arg(value)
        .ignore()
        .query_async::<()>(&mut c)
        .await
        .expect("SET and PUBLISH");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_ports_keep_their_bus_ports_below_the_ephemeral_range() {
        for _ in 0..50 {
            let port = free_cluster_port();
            assert!(CLUSTER_PORTS.contains(&port));
            assert!(port + 10_000 < 32_768, "{port}");
        }
    }

    /// A server whose port is taken says so (its own log line, not the 10 s
    /// timeout's message), which `start_with` takes as the cue for another port.
    #[test]
    fn a_taken_port_is_reported_from_the_servers_log() {
        let taken = TcpListener::bind(("127.0.0.1", free_port())).unwrap();
        let mut s = RedisServer {
            port: taken.local_addr().unwrap().port(),
            dir: tempfile::tempdir().unwrap(),
            child: None,
            extra: Vec::new(),
            events: None,
        };
        let e = s.spawn().unwrap_err();
        assert!(e.contains("Failed listening on port"), "{e}");
        s.kill();
        let ok = RedisServer::start();
        assert!(ok.cli(&["PING"]).contains("PONG"));
    }
}
