//! Path rules' configuration and cache, against a Topology Service stand-in.

use super::*;

fn config(address: &str) -> TopologyServiceConfig {
    toml::from_str(&format!("address = {address:?}")).unwrap()
}

#[test]
fn the_address_is_a_host_and_a_port() {
    for good in [
        "127.0.0.1:9096",
        "topology-service.gitlab.svc:443",
        "[::1]:9096",
    ] {
        assert!(config(good).problems().is_empty(), "{good}");
    }
    for bad in ["topology-service", "ts:0", ":9096", "ts:http", ""] {
        let problems = config(bad).problems();
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("topology_service.address")),
            "{bad}: {problems:?}"
        );
    }
    assert_eq!(host("[::1]:9096"), "::1");
    assert_eq!(host("ts.example:443"), "ts.example");
}

/// A Topology Service that answers its first call with Cell `cell-2`'s
/// address, then accepts and never answers (hung).
async fn answers_once_then_hangs() -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut hung = Vec::new();
        let mut first = true;
        while let Ok((mut s, _)) = listener.accept().await {
            if !first {
                hung.push(s);
                continue;
            }
            first = false;
            // The whole request (closing with some of it unread would reset
            // the connection under the answer).
            let mut buf = vec![0u8; 4096];
            let mut seen = Vec::new();
            loop {
                let n = s.read(&mut buf).await.unwrap();
                seen.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&seen).to_ascii_lowercase();
                let Some(end) = text.find("\r\n\r\n") else {
                    continue;
                };
                let length: usize = text
                    .split("content-length:")
                    .nth(1)
                    .and_then(|v| v.lines().next())
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if seen.len() >= end + 4 + length {
                    break;
                }
            }
            let body = r#"{"action":"PROXY","proxy":{"address":"cell-2:443"}}"#;
            let reply = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            s.write_all(reply.as_bytes()).await.unwrap();
        }
    });
    addr
}

/// With the service hung, every request for a claim whose owner is known
/// gets that owner: the one that made the call and those that waited on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_waiting_on_a_failed_call_get_the_stale_owner() {
    let addr = answers_once_then_hangs().await;
    let mut config = config(&addr.to_string());
    config.cache_ttl_secs = 0;
    config.deadline_ms = 100;
    config.retry_after_ms = 60_000;
    let router = Arc::new(PathRouter::new(config).unwrap());
    let claim = PathClaim::Route("gitlab-org".into());
    let cell = Owner::Cell("cell-2:443".into());
    assert_eq!(router.owner(&claim).await, cell);
    // Past its cache time (0 s): one call, which hangs; the rest wait on it.
    let asks: Vec<_> = (0..16)
        .map(|_| {
            let (router, claim) = (router.clone(), claim.clone());
            tokio::spawn(async move { router.owner(&claim).await })
        })
        .collect();
    for ask in asks {
        assert_eq!(ask.await.unwrap(), cell);
    }
    assert_eq!(router.owner(&claim).await, cell, "and after");
}
