//! Running the proxy: admin endpoints and metrics, active health checks, TLS,
//! graceful shutdown and the zero-downtime binary upgrade (socket handoff).

use crate::common;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::metrics::value;
use common::process::{Signal, signal, terminate};
use common::{
    Stub, admin_get, jwt_minter, send, spawn_proxy, start_proxy, three_pods, v1, wait_accepting,
};
use podgate_registry::testing::eventually;
use tokio::net::TcpStream;

/// Stubs for Pods 1 (the default), 2 and 3.
async fn three_stubs() -> (Stub, Stub, Stub) {
    (
        Stub::start(1).await,
        Stub::start(2).await,
        Stub::start(3).await,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_and_metrics_report_what_happened() {
    let (legacy, pod2, pod3) = three_stubs().await;
    let dir = tempfile::tempdir().unwrap();
    let mint = jwt_minter(dir.path());
    let keys = format!("keys = [\"{}\"]", dir.path().display());
    let proxy = start_proxy(&three_pods(&legacy, &pod2, &pod3, &keys), dir).await;
    assert_eq!(admin_get(&proxy, "/healthz").await, (200, "ok\n".into()));
    let (status, body) = admin_get(&proxy, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("3 Pods"), "{body}");
    assert_eq!(admin_get(&proxy, "/nope").await.0, 404);
    // The admin endpoints are not on the proxy's own port.
    assert_eq!(
        send(proxy.port, "GET /metrics HTTP/1.1", b"").await.2,
        r#"{"pod":1}"#
    );

    let t2 = mint(podgate_tokens::TokenKind::Runner, 2);
    let body = format!(r#"{{"token":"{t2}"}}"#);
    for _ in 0..3 {
        let (status, _, _) = send(
            proxy.port,
            "POST /api/v4/jobs/request HTTP/1.1\r\ncontent-type: application/json",
            body.as_bytes(),
        )
        .await;
        assert_eq!(status, 200);
    }
    let bad = v1(2).replacen("glrt-", "glrt-X", 1);
    let (status, _, _) = send(
        proxy.port,
        &format!("POST /api/v4/jobs/request HTTP/1.1\r\nrunner-token: {bad}"),
        b"{}",
    )
    .await;
    assert_eq!(status, 401);

    let (status, text) = admin_get(&proxy, "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(
        value(
            &text,
            r#"podgate_proxy_requests_total{outcome="routable",pod="2",rule="jobs-request",source="json:token",status="200"}"#
        ),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            r#"podgate_proxy_requests_total{outcome="unauthorized",pod="0",rule="jobs-request",source="header:runner-token",status="401"}"#
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            r#"podgate_proxy_request_duration_seconds_count{rule="jobs-request",status_class="2xx"}"#
        ),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            r#"podgate_proxy_decision_duration_seconds_count{rule="jobs-request"}"#
        ),
        Some(4.0),
        "{text}"
    );
    // The same JWT three times: its signature checked once, then the cached verdict.
    assert_eq!(
        value(&text, "podgate_classifier_cache_hits_total"),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        value(&text, "podgate_classifier_cache_misses_total"),
        Some(1.0),
        "{text}"
    );
    // Transparent huge pages are off for podgate's processes (src/main.rs): the
    // kernel reports it per process.
    let status = std::fs::read_to_string(format!("/proc/{}/status", proxy.child.id())).unwrap();
    if let Some(line) = status.lines().find(|l| l.starts_with("THP_enabled:")) {
        assert_eq!(line.split_whitespace().nth(1), Some("0"), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_take_sick_upstreams_out_and_bring_them_back() {
    let legacy = Stub::start(1).await;
    let (a, b) = (Stub::start(2).await, Stub::start(22).await);
    let config = format!(
        r#"[health]
        interval_ms = 100
        timeout_ms = 100
        rise = 1
        fall = 1
        {}"#,
        common::topology(&[
            common::pod_entry(1, &[legacy.addr.to_string()], ""),
            common::pod_entry(2, &[a.addr.to_string(), b.addr.to_string()], ""),
        ])
    );
    let proxy = start_proxy(&config, tempfile::tempdir().unwrap()).await;
    let req = format!(
        "POST /api/v4/jobs/request HTTP/1.1\r\nrunner-token: {}",
        v1(2)
    );
    let gauge = |upstream: &Stub| {
        format!(
            r#"podgate_proxy_upstream_healthy{{pod="2",pool="web",upstream="{}"}}"#,
            upstream.addr
        )
    };
    let wait_gauge = |upstream: Stub, want: f64| {
        let name = gauge(&upstream);
        let proxy = &proxy;
        async move {
            eventually(Duration::from_secs(10), "the health gauge", || async {
                let (_, text) = admin_get(proxy, "/metrics").await;
                (value(&text, &name) == Some(want)).then_some(())
            })
            .await
        }
    };
    wait_gauge(b.clone(), 1.0).await;

    // b fails its check: all of Pod 2's traffic goes to a.
    b.set_healthy(false);
    wait_gauge(b.clone(), 0.0).await;
    for _ in 0..6 {
        assert_eq!(send(proxy.port, &req, b"{}").await.2, r#"{"pod":2}"#);
    }
    assert_eq!(a.seen().len(), 6);
    assert!(b.seen().is_empty(), "an unhealthy upstream got traffic");

    // Both fail: 503 with Retry-After, and nothing reaches another Pod.
    a.set_healthy(false);
    wait_gauge(a.clone(), 0.0).await;
    let (status, headers, body) = send(proxy.port, &req, b"{}").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("no_healthy_upstream"), "{body}");
    assert_eq!(headers.get("retry-after").map(String::as_str), Some("5"));
    assert!(legacy.seen().is_empty());

    // b recovers: it takes the traffic.
    b.set_healthy(true);
    wait_gauge(b.clone(), 1.0).await;
    assert_eq!(send(proxy.port, &req, b"{}").await.2, r#"{"pod":22}"#);
    assert_eq!(a.seen().len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tls_listener_routes_like_the_plaintext_one() {
    let (legacy, pod2, pod3) = three_stubs().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = podgate_testkit::fixtures::self_signed_cert(dir.path());
    let tls_port = podgate_registry::testing::free_port();
    let extra = format!(
        "[tls]\nlisten = \"127.0.0.1:{tls_port}\"\ncert = \"{}\"\nkey = \"{}\"\n",
        cert.display(),
        key.display()
    );
    // `[tls]` is a table: it must follow the top-level keys, so it goes last.
    let config = format!("{}\n{extra}", three_pods(&legacy, &pod2, &pod3, ""));
    let _proxy = start_proxy(&config, dir).await;
    wait_accepting(tls_port).await;

    let token = v1(2);
    let reply = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut connector = openssl::ssl::SslConnector::builder(openssl::ssl::SslMethod::tls())
            .unwrap();
        connector.set_ca_file(&cert).unwrap();
        let connector = connector.build();
        let tcp = std::net::TcpStream::connect(("127.0.0.1", tls_port)).unwrap();
        let mut tls = connector.connect("localhost", tcp).unwrap();
        let body = format!(r#"{{"token":"{token}"}}"#);
        write!(
            tls,
            "POST /api/v4/jobs/request HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut raw = Vec::new();
        let _ = tls.read_to_end(&mut raw);
        common::parse_reply(&raw)
    })
    .await
    .unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, br#"{"pod":2}"#);
    assert_eq!(pod2.seen().len(), 1);
}

/// SIGTERM: the listener closes at once, but a long poll already in flight is
/// answered within the grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_in_flight_requests_finish() {
    let (legacy, pod2, pod3) = three_stubs().await;
    let config = three_pods(&legacy, &pod2, &pod3, "grace_period_secs = 3");
    let mut proxy = start_proxy(&config, tempfile::tempdir().unwrap()).await;
    let port = proxy.port;
    let token = v1(2);
    let held = tokio::spawn(async move {
        send(
            port,
            &format!(
                "POST /api/v4/jobs/request HTTP/1.1\r\nrunner-token: {token}\r\nx-test-long-poll: 60"
            ),
            b"{}",
        )
        .await
    });
    eventually(
        Duration::from_secs(10),
        "Pod 2 to hold the poll",
        || async { (!pod2.seen().is_empty()).then_some(()) },
    )
    .await;
    terminate(proxy.child.id());
    eventually(Duration::from_secs(10), "the listener to close", || async {
        TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
            .then_some(())
    })
    .await;
    assert!(
        proxy.child.try_wait().unwrap().is_none(),
        "exited with a request in flight"
    );
    pod2.queue_job();
    let (status, _, body) = held.await.unwrap();
    assert_eq!((status, body.as_str()), (201, r#"{"id":1,"pod":2}"#));
    let mut child = std::mem::replace(&mut proxy.child, Command::new("true").spawn().unwrap());
    let exit = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(exit.success(), "{exit:?}");
}

/// `podgate proxy --upgrade` takes the listening socket over from the running proxy
/// (SIGQUIT hands it over): a client sending requests throughout sees no failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_upgrade_drops_no_request() {
    let (legacy, pod2, pod3) = three_stubs().await;
    let config = three_pods(&legacy, &pod2, &pod3, "grace_period_secs = 2");
    let mut old = start_proxy(&config, tempfile::tempdir().unwrap()).await;
    let port = old.port;

    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let client = tokio::spawn({
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        let req = format!(
            "POST /api/v4/jobs/request HTTP/1.1\r\nrunner-token: {}",
            v1(2)
        );
        async move {
            while !stop.load(Ordering::SeqCst) {
                match tokio::time::timeout(Duration::from_secs(10), send(port, &req, b"{}")).await {
                    Ok((200, _, body)) if body == r#"{"pod":2}"# => {
                        ok.fetch_add(1, Ordering::SeqCst)
                    }
                    _ => failed.fetch_add(1, Ordering::SeqCst),
                };
            }
        }
    });
    eventually(
        Duration::from_secs(10),
        "traffic through the old proxy",
        || async { (ok.load(Ordering::SeqCst) >= 20).then_some(()) },
    )
    .await;

    let mut new = spawn_proxy(&old.config, true);
    signal(old.child.id(), Signal::QUIT).unwrap();
    let mut old_child = std::mem::replace(&mut old.child, Command::new("true").spawn().unwrap());
    let exit = tokio::task::spawn_blocking(move || old_child.wait().unwrap())
        .await
        .unwrap();
    assert!(exit.success(), "old proxy: {exit:?}");
    // The old process is gone: whatever answers now is the new one.
    let served_by_old = ok.load(Ordering::SeqCst);
    eventually(
        Duration::from_secs(10),
        "traffic through the new proxy",
        || async { (ok.load(Ordering::SeqCst) >= served_by_old + 20).then_some(()) },
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    client.await.unwrap();
    assert!(
        new.try_wait().unwrap().is_none(),
        "the new proxy is running"
    );
    let _ = new.kill();
    let _ = new.wait();
    assert_eq!(
        failed.load(Ordering::SeqCst),
        0,
        "requests failed during the upgrade"
    );
    assert!(legacy.seen().is_empty());
}

/// Whether process `pid` has accepted the connection from `client_port` to its
/// `port`: the kernel gives the server side of a connection an inode
/// (`/proc/net/tcp`) when it is accepted, and the process then holds it.
fn accepted(pid: u32, port: u16, client_port: u16) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return false;
    };
    let port_of = |addr: &str| {
        addr.rsplit(':')
            .next()
            .and_then(|p| u16::from_str_radix(p, 16).ok())
    };
    let inode = table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 9 && port_of(f[1]) == Some(port) && port_of(f[2]) == Some(client_port))
            .then(|| f[9].to_owned())
    });
    let Some(inode) = inode.filter(|i| i != "0") else {
        return false;
    };
    let target = format!("socket:[{inode}]");
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
        fds.flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy() == target))
    })
}

/// A connection the proxy accepted before SIGTERM is served even when its request
/// comes after the listener closed (within the grace period): the fast path reads the
/// first request of every accepted connection, and answers it `Connection: close`.
/// A `jobs/request` for Pod 2 (the stubs answer `{"pod":2}`), head and body.
fn pod2_poll() -> String {
    format!(
        "POST /api/v4/jobs/request HTTP/1.1\r\nhost: gitlab.example.com\r\nrunner-token: {}\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{{}}",
        v1(2)
    )
}

/// SIGTERM the proxy, and wait until its listener refuses connections.
async fn terminate_and_wait_for_the_listener_to_close(proxy: &common::Proxy) {
    terminate(proxy.child.id());
    let port = proxy.port;
    eventually(Duration::from_secs(10), "the listener to close", || async {
        TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
            .then_some(())
    })
    .await;
}

/// Send [`pod2_poll`] on `conn` and read to the end: Pod 2's answer, saying
/// `Connection: close`.
async fn served_once_more_and_closed(conn: &mut TcpStream, what: &str) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    conn.write_all(pod2_poll().as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw)
        .await
        .unwrap_or_else(|e| panic!("{what} is answered, not reset: {e}"));
    let reply = common::parse_reply(&raw);
    assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&raw));
    assert_eq!(reply.body, br#"{"pod":2}"#);
    assert_eq!(
        reply.headers.get("connection").map(String::as_str),
        Some("close")
    );
}

async fn exits_cleanly(mut proxy: common::Proxy) {
    let exit = tokio::task::spawn_blocking(move || proxy.child.wait().unwrap())
        .await
        .unwrap();
    assert!(exit.success(), "{exit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_accepted_before_sigterm_is_served_after_it() {
    let (legacy, pod2, pod3) = three_stubs().await;
    let config = three_pods(&legacy, &pod2, &pod3, "grace_period_secs = 2");
    let proxy = start_proxy(&config, tempfile::tempdir().unwrap()).await;
    let (port, pid) = (proxy.port, proxy.child.id());
    let mut conn = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let client_port = conn.local_addr().unwrap().port();
    eventually(Duration::from_secs(10), "the proxy to accept", || async {
        accepted(pid, port, client_port).then_some(())
    })
    .await;
    terminate_and_wait_for_the_listener_to_close(&proxy).await;
    served_once_more_and_closed(&mut conn, "the accepted connection").await;
    exits_cleanly(proxy).await;
}

/// Send [`pod2_poll`] on `conn` and read exactly its answer: Pod 2's, kept alive.
async fn served_and_kept_alive(conn: &mut TcpStream) {
    served_by_and_kept_alive(conn, &pod2_poll(), 2).await;
}

/// Send `request` on `conn` and read exactly its answer: Pod `pod`'s, kept alive.
async fn served_by_and_kept_alive(conn: &mut TcpStream, request: &str, pod: u8) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let reply = loop {
        let mut chunk = [0u8; 4096];
        let n = conn.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed after {raw:?}");
        raw.extend_from_slice(&chunk[..n]);
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let reply = common::parse_reply(&raw);
            let len: usize = reply.headers["content-length"].parse().unwrap();
            if raw.len() >= end + 4 + len {
                break reply;
            }
        }
    };
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, format!(r#"{{"pod":{pod}}}"#).as_bytes());
    assert_ne!(
        reply.headers.get("connection").map(String::as_str),
        Some("close")
    );
}

/// A kept-alive connection idle when SIGTERM comes is not closed under the client:
/// its next request, sent during the grace period, is served with `Connection:
/// close` (a runner's next poll on its connection; `scripts/drills.sh` R5 lost one to
/// the close). pingora's own loop, and the fast path before, closed it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_kept_alive_connection_is_served_once_more_after_sigterm() {
    let (legacy, pod2, pod3) = three_stubs().await;
    let config = three_pods(&legacy, &pod2, &pod3, "grace_period_secs = 3");
    let proxy = start_proxy(&config, tempfile::tempdir().unwrap()).await;
    let mut conn = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
    served_and_kept_alive(&mut conn).await;

    // Idle now. SIGTERM, and the listener closes…
    terminate_and_wait_for_the_listener_to_close(&proxy).await;
    assert!(
        std::fs::metadata(format!("/proc/{}", proxy.child.id())).is_ok(),
        "still in its grace period"
    );
    // …but the idle connection's next request is served, and told to close.
    served_once_more_and_closed(&mut conn, "the idle connection").await;
    exits_cleanly(proxy).await;
}

/// At a binary upgrade a kept-alive connection idle through the old process's whole
/// grace period is handed to the new process, not closed with the old one
/// (`podgate_proxy::handover`): its next request, sent after the old process has
/// exited, is served, and told to close. Reset with the old process, it would cost
/// a runner the request it sends next (in R5 of `scripts/drills.sh`, a trace
/// update). So is one whose last request pingora-proxy served (not a runner
/// endpoint): pingora's own loop would keep such a connection and close it, idle,
/// the moment shutdown began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_outlives_the_old_process_at_an_upgrade() {
    let (legacy, pod2, pod3) = three_stubs().await;
    let config = three_pods(&legacy, &pod2, &pod3, "grace_period_secs = 1");
    let mut old = start_proxy(&config, tempfile::tempdir().unwrap()).await;
    let mut conn = TcpStream::connect(("127.0.0.1", old.port)).await.unwrap();
    served_and_kept_alive(&mut conn).await;
    let mut via_pingora = TcpStream::connect(("127.0.0.1", old.port)).await.unwrap();
    served_by_and_kept_alive(
        &mut via_pingora,
        "GET /explore HTTP/1.1\r\nhost: gitlab.example.com\r\n\r\n",
        1,
    )
    .await;

    let mut new = spawn_proxy(&old.config, true);
    signal(old.child.id(), Signal::QUIT).unwrap();
    let mut old_child = std::mem::replace(&mut old.child, Command::new("true").spawn().unwrap());
    let exit = tokio::task::spawn_blocking(move || old_child.wait().unwrap())
        .await
        .unwrap();
    assert!(exit.success(), "old proxy: {exit:?}");

    served_once_more_and_closed(&mut conn, "the idle connection").await;
    served_once_more_and_closed(&mut via_pingora, "the connection pingora-proxy served").await;
    let (_, metrics) = admin_get(&old, "/metrics").await;
    assert_eq!(
        value(
            &metrics,
            r#"podgate_proxy_upgrade_connections_total{result="received"}"#
        ),
        Some(2.0),
        "{metrics}"
    );
    let _ = new.kill();
    let _ = new.wait();
}
