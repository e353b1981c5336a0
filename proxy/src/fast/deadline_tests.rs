//! The fast path's two long waits end on time ([`super::deadline`]), on paused
//! time over loopback sockets: the Pod's answer within the rule's read timeout
//! (pingora-proxy's 504 after it), and an idle keep-alive connection after
//! [`super::KEEPALIVE`].

use std::sync::Arc;
use std::time::Duration;

use pingora::apps::ServerApp;
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::server::configuration::ServerConf;
use podgate_tokens::{Classifier, KeySet};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use super::differential::{POD_ANSWER, gate};
use super::differential_tests::token;
use super::{FastPath, FastPathSettings, KEEPALIVE};

/// The `jobs-request` rule's read timeout (`rules/builtin.rs`).
const POLL_TIMEOUT: Duration = Duration::from_secs(150);

/// A Pod whose every connection reads requests and, if `answers`, answers each
/// read with [`POD_ANSWER`]; else never answers.
async fn pod(answers: bool) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while conn.read(&mut buf).await.is_ok_and(|n| n > 0) {
                    if answers && conn.write_all(POD_ANSWER).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A client connection served by a fast path in front of `pod`.
async fn client(pod: std::net::SocketAddr) -> TcpStream {
    let gate = gate(pod, Arc::new(Classifier::with_keys(KeySet::new()))).await;
    let conf = Arc::new(ServerConf::default());
    let proxy = pingora::proxy::http_proxy(&conf, gate.clone());
    let settings = FastPathSettings {
        enabled: true,
        ..FastPathSettings::default()
    };
    let fast = Arc::new(FastPath::new(gate, proxy, &conf, settings));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (server, _) = listener.accept().await.unwrap();
    tokio::spawn(async move {
        let (_keep, shutdown) = tokio::sync::watch::channel(false);
        let stream: pingora::protocols::Stream = Box::new(L4Stream::from(server));
        fast.process_new(stream, &shutdown).await;
    });
    client
}

fn runner_poll() -> Vec<u8> {
    let body = format!("{{\"token\":\"{}\"}}", token("glrt-", 1));
    format!(
        "POST /api/v4/jobs/request HTTP/1.1\r\nHost: gitlab\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Everything the proxy writes until it closes the connection.
async fn read_to_close(client: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let _ = client.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(start_paused = true)]
async fn a_pod_that_never_answers_gets_the_poll_a_504_at_the_rules_read_timeout() {
    let mut client = client(pod(false).await).await;
    let start = Instant::now();
    client.write_all(&runner_poll()).await.unwrap();
    let answer = read_to_close(&mut client).await;
    assert!(answer.starts_with("HTTP/1.1 504 "), "{answer}");
    assert_eq!(start.elapsed(), POLL_TIMEOUT, "{answer}");
}

#[tokio::test(start_paused = true)]
async fn an_idle_connection_is_closed_at_the_keep_alive_after_its_last_answer() {
    let mut client = client(pod(true).await).await;
    let mut buf = [0u8; 4096];
    for _ in 0..2 {
        // Each answered, then the paused clock moves on 50 s: the second request,
        // 50 s after the first's answer, is still served.
        client.write_all(&runner_poll()).await.unwrap();
        let n = client.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200 "));
        tokio::time::advance(Duration::from_secs(50)).await;
    }
    let idle = Instant::now() - Duration::from_secs(50);
    assert_eq!(client.read(&mut buf).await.unwrap(), 0, "closed");
    assert_eq!(idle.elapsed(), KEEPALIVE);
}
