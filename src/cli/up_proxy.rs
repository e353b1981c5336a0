//! The proxy child of `podgate up`: started as `podgate proxy --config …`, waited
//! for until its `/readyz` answers 200, stopped (SIGTERM) when dropped; and the
//! small HTTP GET `podgate up` reads its admin listener with.

use std::net::SocketAddr;
use std::process::{Child, Command};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The proxy child; stopped (SIGTERM, then killed) on drop.
pub(crate) struct ProxyChild(pub(crate) Child);

impl Drop for ProxyChild {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

/// `GET path` on `addr`: the status code and the body.
pub(crate) async fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: podgate\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.ok()?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// Waits until the proxy's `/readyz` on `admin` answers 200 (a 503 means it serves but
/// has no usable default Pod yet); fails at once when `exited` reports the proxy gone,
/// or after `timeout`.
pub(crate) async fn wait_ready(
    admin: SocketAddr,
    timeout: Duration,
    mut exited: impl FnMut() -> anyhow::Result<Option<std::process::ExitStatus>>,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(status) = exited()? {
            anyhow::bail!("the proxy exited at start ({status})");
        }
        let last = get(admin, "/readyz").await;
        if matches!(last, Some((200, _))) {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the proxy is not ready after {timeout:?} (http://{admin}/readyz: {})",
            match last {
                Some((status, body)) => format!("{status} {}", body.trim()),
                None => "no answer".into(),
            }
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// An admin stub: `/readyz` answers 503 to the first `not_ready` requests, then 200.
    async fn admin_stub(not_ready: usize) -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served = Arc::new(AtomicUsize::new(0));
        let count = served.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let n = count.fetch_add(1, Ordering::SeqCst);
                let (status, body) = if n < not_ready {
                    ("503 Service Unavailable", "not ready: no default Pod\n")
                } else {
                    ("200 OK", "ready\n")
                };
                let _ = s
                    .write_all(
                        format!(
                            "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            }
        });
        (addr, served)
    }

    #[tokio::test]
    async fn ready_only_once_readyz_answers_200() {
        let (addr, served) = admin_stub(3).await;
        wait_ready(addr, Duration::from_secs(30), || Ok(None))
            .await
            .unwrap();
        assert_eq!(served.load(Ordering::SeqCst), 4, "three 503s, then 200");
    }

    #[tokio::test]
    async fn a_503_is_not_ready() {
        let (addr, _) = admin_stub(usize::MAX).await;
        let err = wait_ready(addr, Duration::from_millis(300), || Ok(None))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("503 not ready: no default Pod"), "{err}");
    }
}
