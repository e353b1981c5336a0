//! Memory of held long polls: the proxy's RSS with N concurrent `jobs/request` long
//! polls held by the Pod, per connection, over its RSS when idle.
//!
//! ```text
//! ./scripts/measure-held-polls.sh             # 10,000 polls (raises the fd limit)
//! cargo bench --bench held_polls -- --polls 2000
//! ```
//!
//! Under `cargo test --benches` it runs 200 polls as a smoke test. Every held poll is
//! answered 204 at the end and must reach its client: memory is measured on a run
//! that loses nothing.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore, watch};

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
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
    held: Arc<AtomicUsize>,
    all_held: Arc<Notify>,
    want: usize,
    release: watch::Receiver<bool>,
) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (held, all_held, mut release) = (held.clone(), all_held.clone(), release.clone());
            tokio::spawn(async move {
                while read_request(&mut s).await.is_ok() {
                    if held.fetch_add(1, Ordering::SeqCst) + 1 == want {
                        all_held.notify_one();
                    }
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

/// The proxy process, killed however the bench ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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
    // The proxy's `read_buffer_bytes` (its default when not given).
    let read_buffer = args
        .iter()
        .position(|a| a == "--read-buffer")
        .and_then(|i| args.get(i + 1))
        .map(|v| format!("read_buffer_bytes = {v}\n"))
        .unwrap_or_default();

    let held = Arc::new(AtomicUsize::new(0));
    let all_held = Arc::new(Notify::new());
    let (release_tx, release_rx) = watch::channel(false);
    // Warm-up requests are held too: count them in.
    const WARMUP: usize = 50;
    let pod = holding_pod(held.clone(), all_held.clone(), WARMUP + polls, release_rx).await;

    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = dir.path().join("proxy.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\nadmin_listen = \"off\"\n{read_buffer}threads = 1\ngrace_period_secs = 0\n\
             [health]\nenabled = false\n\
             [topology]\ndefault_pod = 1\n[[topology.pods]]\nid = 1\nname = \"pod-1\"\nweb = [\"{pod}\"]\n"
        ),
    )
    .unwrap();
    let proxy = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_podgate"))
            .args(["proxy", "--config", config.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let pid = proxy.0.id();
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        assert!(Instant::now() < deadline, "the proxy did not start");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let token = {
        let keys = podgate_tokens::gitlab::RoutingKeys {
            cell: Some(1),
            organization: Some(1),
            ..Default::default()
        };
        podgate_tokens::gitlab::encode("glrt-", &keys, &podgate_tokens::gitlab::random_bytes())
            .unwrap()
    };
    let body = format!(
        r#"{{"token":"{token}","system_id":"s_0123456789ab","last_update":"t0","info":{{"name":"gitlab-runner","version":"17.6.0","executor":"docker","features":{{"variables":true,"artifacts":true,"cache":true}}}}}}"#
    );
    let request = Arc::new(format!(
        "POST /api/v4/jobs/request HTTP/1.1\r\nhost: gitlab.example.com\r\nuser-agent: gitlab-runner 17.6.0\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    ));

    let answered = Arc::new(AtomicUsize::new(0));
    let start_poll = |n: usize| {
        let (request, answered) = (request.clone(), answered.clone());
        // Connect in bounded waves so the listen backlog never overflows.
        let gate = Arc::new(Semaphore::new(256));
        (0..n)
            .map(|_| {
                let (request, answered, gate) = (request.clone(), answered.clone(), gate.clone());
                tokio::spawn(async move {
                    let permit = gate.acquire_owned().await.unwrap();
                    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
                    s.write_all(request.as_bytes()).await.unwrap();
                    drop(permit);
                    let mut buf = [0u8; 256];
                    let n = s.read(&mut buf).await.unwrap();
                    if buf[..n].starts_with(b"HTTP/1.1 204") {
                        answered.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect::<Vec<_>>()
    };

    // Warm up (runtime, allocator arenas, classifier cache), then the idle baseline.
    let warm = start_poll(WARMUP);
    let deadline = Instant::now() + Duration::from_secs(30);
    while held.load(Ordering::SeqCst) < WARMUP {
        assert!(
            Instant::now() < deadline,
            "warm-up polls did not reach the Pod"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let idle = rss_kib(pid);

    let started = Instant::now();
    let tasks = start_poll(polls);
    tokio::time::timeout(Duration::from_secs(120), all_held.notified())
        .await
        .expect("every poll reaches the Pod within 120 s");
    let reached = started.elapsed();
    let loaded = rss_kib(pid);
    release_tx.send(true).unwrap();
    for t in warm.into_iter().chain(tasks) {
        t.await.unwrap();
    }
    drop(proxy);

    assert_eq!(
        answered.load(Ordering::SeqCst),
        WARMUP + polls,
        "every held poll was answered 204 through the proxy"
    );
    let per = (loaded.saturating_sub(idle)) as f64 * 1024.0 / polls as f64;
    println!("held long polls through podgate (1 worker thread)");
    println!("  polls held           {polls}");
    println!("  all held after       {:.2} s", reached.as_secs_f64());
    println!("  proxy RSS idle       {idle} KiB");
    println!("  proxy RSS held       {loaded} KiB");
    println!(
        "  per held connection  {:.0} bytes ({:.1} KiB; goal <= 10 KiB)",
        per,
        per / 1024.0
    );
    println!("  answered 204         {}", answered.load(Ordering::SeqCst));
}
