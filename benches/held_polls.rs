//! Memory of held long polls: the proxy's RSS with N concurrent `jobs/request` long
//! polls, per poll, over its RSS when idle. Two kinds:
//!
//! - **forwarded** (default): the Pod holds every poll, so the proxy keeps the client
//!   connection and an upstream connection for each;
//! - **edge** (`--edge`): the Pod opts in to edge long polls (`runner_queue_redis`, a
//!   real `redis-server` holding every runner's queue key) and the proxy holds the
//!   polls itself, with no upstream connection: one client socket and a waiter each.
//!   The Pod must see none of them while they are held.
//!
//! Every poll carries its own runner token (a fleet's runners each have one), so the
//! classifier's cache grows with them as it would in production.
//!
//! ```text
//! ./scripts/measure-held-polls.sh             # 10,000 forwarded polls (raises the fd limit)
//! EDGE=1 ./scripts/measure-held-polls.sh      # as many edge-held polls as the fd limit allows
//! cargo bench --bench held_polls -- --polls 2000 [--edge] [--pingora]
//! # --pingora: `fast_path = false`, the polls through pingora-proxy (PINGORA=1 in the script)
//! # where the heap goes (glibc's malloc, so heaptrack sees it):
//! PODGATE_BENCH_PROXY_WRAPPER="heaptrack -o /tmp/held" \
//!   cargo bench --features system-alloc --bench held_polls -- --polls 2000 --edge
//! ```
//!
//! Under `cargo test --benches` it runs 200 polls of each kind as a smoke test. Every
//! held poll is answered 204 at the end and must reach its client (edge-held ones after
//! their queue key changes: forwarded to the Pod, which answers): memory is measured on
//! a run that loses nothing.

mod support;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use podgate_registry::testing::{RedisServer, eventually, free_port};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, watch};

/// Send `commands` to Redis pipelined and read one reply line each (they are all
/// simple replies: `+OK` or `:<receivers>`).
async fn redis_pipeline(port: u16, commands: &[Vec<&str>]) {
    let mut s = BufReader::new(TcpStream::connect(("127.0.0.1", port)).await.unwrap());
    for batch in commands.chunks(1000) {
        let mut out = Vec::new();
        for c in batch {
            out.extend_from_slice(format!("*{}\r\n", c.len()).as_bytes());
            for a in c {
                out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
            }
        }
        s.get_mut().write_all(&out).await.unwrap();
        let mut line = String::new();
        for _ in batch {
            line.clear();
            s.read_line(&mut line).await.unwrap();
            assert!(
                line.starts_with('+') || line.starts_with(':'),
                "redis answered {line:?}"
            );
        }
    }
}

/// A series (`name{labels}`) of the proxy's `/metrics`, 0 when absent.
async fn metric(admin: u16, series: &str) -> usize {
    let text = support::metrics_text(([127, 0, 0, 1], admin).into()).await;
    support::metrics::value_or_zero(&text, series) as usize
}

/// The proxy's `VmRSS`.
fn rss_kib(pid: u32) -> u64 {
    support::rss_kib(pid).0
}

/// Read one request (head, then a `content-length` body) from `s`.
async fn read_request(s: &mut TcpStream) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                let n = s.read(&mut chunk).await?;
                if n == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Ok(());
        }
    }
}

/// A Pod that holds every request until `release`, then answers 204 like Workhorse
/// when no job arrived.
async fn holding_pod(
    held: Arc<watch::Sender<usize>>,
    release: watch::Receiver<bool>,
) -> std::net::SocketAddr {
    // The proxy opens a connection per poll, in bursts: the deepest backlog the
    // kernel allows (`net.core.somaxconn`), so that no connection attempt is dropped
    // while this loop catches up (with tokio's 1,024, some runs lost SYNs twice and
    // the proxy's 2 s connect timeout failed their polls).
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(([127, 0, 0, 1], 0).into()).unwrap();
    let listener = socket.listen(65_535).unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (held, mut release) = (held.clone(), release.clone());
            tokio::spawn(async move {
                while read_request(&mut s).await.is_ok() {
                    held.send_modify(|n| *n += 1);
                    let _ = release.wait_for(|r| *r).await;
                    let resp = b"HTTP/1.1 204 No Content\r\nx-gitlab-last-update: t1\r\n\r\n";
                    if s.write_all(resp).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// The proxy process, killed however the bench ends. Under a wrapper the proxy
/// itself (`podgate`, the wrapper's child) is asked to stop with SIGTERM, so the
/// wrapper can write its output, and the wrapper is waited for.
struct KillOnDrop {
    child: std::process::Child,
    wrapped: bool,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let id = self.child.id();
        let podgate = podgate_pid(id);
        if self.wrapped && podgate != id {
            support::terminate(podgate);
        } else {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// The `podgate` process under `pid`: `pid` itself, or a wrapper's child of that name.
fn podgate_pid(pid: u32) -> u32 {
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    children
        .split_whitespace()
        .filter_map(|c| c.parse::<u32>().ok())
        .find(|c| {
            std::fs::read_to_string(format!("/proc/{c}/comm")).is_ok_and(|n| n.trim() == "podgate")
        })
        .unwrap_or(pid)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bench = args.iter().any(|a| a == "--bench");
    let polls: usize = args
        .iter()
        .position(|a| a == "--polls")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(if bench { 10_000 } else { 200 });
    // The proxy's `read_buffer_bytes` (its default when not given); `--pingora`:
    // `fast_path = false`, every poll through pingora-proxy.
    let mut read_buffer = args
        .iter()
        .position(|a| a == "--read-buffer")
        .and_then(|i| args.get(i + 1))
        .map(|v| format!("read_buffer_bytes = {v}\n"))
        .unwrap_or_default();
    if args.iter().any(|a| a == "--pingora") {
        read_buffer.push_str("fast_path = false\n");
    }

    if bench {
        run(polls, args.iter().any(|a| a == "--edge"), &read_buffer).await;
    } else {
        run(polls, false, &read_buffer).await;
        run(polls, true, &read_buffer).await;
    }
}

/// Hold `polls` long polls (forwarded to the Pod, or at the `edge`) and print the
/// proxy's memory per poll.
async fn run(polls: usize, edge: bool, read_buffer: &str) {
    // Requests the Pod has received, and polls answered 204 at the client.
    let held = Arc::new(watch::Sender::new(0usize));
    let answered = Arc::new(watch::Sender::new(0usize));
    let (release_tx, release_rx) = watch::channel(false);
    // Warm-up requests are held too: count them in.
    const WARMUP: usize = 50;
    let total = WARMUP + polls;
    let pod = holding_pod(held.clone(), release_rx).await;

    // One runner token per poll, routed to Pod 1.
    let tokens: Vec<String> = (0..total)
        .map(|_| {
            let keys = podgate_tokens::gitlab::RoutingKeys {
                cell: Some(1),
                organization: Some(1),
                ..Default::default()
            };
            podgate_tokens::gitlab::encode("glrt-", &keys, &podgate_tokens::gitlab::random_bytes())
                .unwrap()
        })
        .collect();
    let key = |t: &str| format!("runner:build_queue:{t}");
    // Edge holds: every runner's queue key holds the ticket its poll sends.
    let redis = edge.then(RedisServer::start);
    if let Some(redis) = &redis {
        let keys: Vec<String> = tokens.iter().map(|t| key(t)).collect();
        let sets: Vec<Vec<&str>> = keys.iter().map(|k| vec!["SET", k, "t0"]).collect();
        redis_pipeline(redis.port(), &sets).await;
    }

    let dir = tempfile::tempdir().unwrap();
    let (port, admin) = (free_port(), free_port());
    let (admin_listen, edge_config, pod_redis) = match &redis {
        Some(r) => (
            format!("127.0.0.1:{admin}"),
            "edge_poll_hold_secs = 300\n".to_owned(),
            format!("runner_queue_redis = \"{}\"\n", r.url()),
        ),
        None => ("off".to_owned(), String::new(), String::new()),
    };
    let config = dir.path().join("proxy.toml");
    // Every forwarded poll is one request in flight to the one Pod address, held
    // there: past `max_connections_per_address` (1024 by default) the rest would
    // queue and get a 503, and this measures the polls' memory, not that bound.
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\nadmin_listen = \"{admin_listen}\"\n{read_buffer}{edge_config}threads = 1\ngrace_period_secs = 0\n\
             [health]\nenabled = false\n[upstreams]\nmax_connections_per_address = 0\n\
             [topology]\ndefault_pod = 1\n[[topology.pods]]\nid = 1\nname = \"pod-1\"\nweb = [\"{pod}\"]\n{pod_redis}"
        ),
    )
    .unwrap();
    // `PODGATE_BENCH_PROXY_WRAPPER="heaptrack -o /tmp/held"`: the proxy runs under
    // that command (with `--features system-alloc`, so heaptrack sees its allocations).
    let wrapper: Vec<String> = std::env::var("PODGATE_BENCH_PROXY_WRAPPER")
        .map(|w| w.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default();
    let mut cmd = match wrapper.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(env!("CARGO_BIN_EXE_podgate"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_podgate")),
    };
    let proxy = KillOnDrop {
        child: cmd
            .args(["proxy", "--config", config.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
        wrapped: !wrapper.is_empty(),
    };
    // Another process: polled (`eventually`), there is no event to await.
    eventually(Duration::from_secs(30), "the proxy starts", || async {
        TcpStream::connect(("127.0.0.1", port)).await.ok().map(drop)
    })
    .await;
    let pid = podgate_pid(proxy.child.id());
    if edge {
        // Until its watch on the Pod's Redis is up, polls would be forwarded.
        eventually(Duration::from_secs(30), "the edge watch is up", || async {
            (metric(admin, r#"podgate_proxy_edge_poll_redis_up{pod="1"}"#).await == 1).then_some(())
        })
        .await;
    }

    let start_poll = |range: std::ops::Range<usize>| {
        let answered = answered.clone();
        // Connect in bounded waves so the listen backlog never overflows.
        let gate = Arc::new(Semaphore::new(256));
        range
            .map(|i| {
                let body = format!(
                    r#"{{"token":"{}","system_id":"s_0123456789ab","last_update":"t0","info":{{"name":"gitlab-runner","version":"17.6.0","executor":"docker","features":{{"variables":true,"artifacts":true,"cache":true}}}}}}"#,
                    tokens[i]
                );
                let request = format!(
                    "POST /api/v4/jobs/request HTTP/1.1\r\nhost: gitlab.example.com\r\nuser-agent: gitlab-runner 17.6.0\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let (answered, gate) = (answered.clone(), gate.clone());
                tokio::spawn(async move {
                    let permit = gate.acquire_owned().await.unwrap();
                    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
                    s.write_all(request.as_bytes()).await.unwrap();
                    drop(permit);
                    let mut buf = [0u8; 256];
                    let n = s.read(&mut buf).await.unwrap();
                    if buf[..n].starts_with(b"HTTP/1.1 204") {
                        answered.send_modify(|n| *n += 1);
                    }
                })
            })
            .collect::<Vec<_>>()
    };
    // Until `want` polls are held: the Pod's count of requests (an event here), or
    // the proxy's gauge (another process: all there is to read).
    let all_held = |want: usize, within: Duration| {
        let mut pod = held.subscribe();
        async move {
            if edge {
                eventually(within, "the polls are held at the edge", || async {
                    (metric(admin, r#"podgate_proxy_edge_polls_held{pod="1"}"#).await >= want)
                        .then_some(())
                })
                .await;
            } else {
                tokio::time::timeout(within, pod.wait_for(|n| *n >= want))
                    .await
                    .expect("the polls reach the Pod")
                    .unwrap();
            }
        }
    };

    // Warm up (runtime, allocator arenas, classifier cache), then the idle baseline.
    let warm = start_poll(0..WARMUP);
    all_held(WARMUP, Duration::from_secs(30)).await;
    let idle = rss_kib(pid);

    let started = Instant::now();
    let tasks = start_poll(WARMUP..total);
    all_held(total, Duration::from_secs(120)).await;
    let reached = started.elapsed();
    let loaded = rss_kib(pid);
    if edge {
        assert_eq!(*held.borrow(), 0, "the Pod sees no poll held at the edge");
    }

    // Release: the Pod answers at once; edge-held polls are woken by a new value on
    // their queue key (forwarded to the Pod), in waves the fd limit allows.
    release_tx.send(true).unwrap();
    if let Some(redis) = &redis {
        let channels: Vec<String> = tokens
            .iter()
            .map(|t| format!("workhorse:notifications:{}", key(t)))
            .collect();
        for wave in channels.chunks(500) {
            let before = *answered.borrow();
            let publishes: Vec<Vec<&str>> = wave.iter().map(|c| vec!["PUBLISH", c, "t1"]).collect();
            redis_pipeline(redis.port(), &publishes).await;
            tokio::time::timeout(
                Duration::from_secs(60),
                answered.subscribe().wait_for(|n| *n >= before + wave.len()),
            )
            .await
            .expect("a woken wave is answered")
            .unwrap();
        }
    }
    for t in warm.into_iter().chain(tasks) {
        t.await.unwrap();
    }
    drop(proxy);

    assert_eq!(
        *answered.borrow(),
        total,
        "every held poll was answered 204 through the proxy"
    );
    if edge {
        assert_eq!(
            *held.borrow(),
            total,
            "every woken poll was forwarded to the Pod"
        );
    }
    let per = (loaded.saturating_sub(idle)) as f64 * 1024.0 / polls as f64;
    let (kind, goal) = if edge {
        ("held at the edge (no upstream connection)", 8)
    } else {
        ("forwarded (held by the Pod)", 20)
    };
    println!("long polls {kind}, through podgate (1 worker thread)");
    println!("  polls held           {polls}");
    println!("  all held after       {:.2} s", reached.as_secs_f64());
    println!("  proxy RSS idle       {idle} KiB");
    println!("  proxy RSS held       {loaded} KiB");
    println!(
        "  per held poll        {:.0} bytes ({:.1} KiB; goal <= {goal} KiB)",
        per,
        per / 1024.0
    );
    println!(
        "  100,000 polls        {:.0} MiB over idle (extrapolated linearly)",
        per * 100_000.0 / (1024.0 * 1024.0)
    );
    println!("  answered 204         {}", *answered.borrow());
}
