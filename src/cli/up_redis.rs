//! The Redis `podgate up` gives its Pods for their runner queue keys (GitLab's
//! `runner:build_queue:<token>` keys and Workhorse's notification channel), which the
//! proxy watches to hold `jobs/request` long polls at the edge: the one `--redis`
//! names, else a private `redis-server` on a unix socket in a temporary directory
//! (no port to collide with), stopped with `podgate up`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;

/// Where the Pods' runner queue keys live.
pub(crate) struct QueueRedis {
    /// `redis://…` or `redis+unix:///…`.
    pub(crate) url: String,
    /// The private server, if `podgate up` started one.
    server: Option<Child>,
    /// Its directory (socket), removed when dropped.
    _dir: Option<tempfile::TempDir>,
}

impl QueueRedis {
    /// The Redis `--redis` names.
    pub(crate) fn external(url: &str) -> QueueRedis {
        QueueRedis {
            url: url.to_owned(),
            server: None,
            _dir: None,
        }
    }

    /// A private `redis-server` on a unix socket; `Ok(None)` when `redis-server` is
    /// not installed (edge long polls are then off).
    pub(crate) fn private() -> anyhow::Result<Option<QueueRedis>> {
        let dir = tempfile::Builder::new()
            .prefix("podgate-up-redis-")
            .tempdir()
            .context("a directory for the private redis-server")?;
        let socket = dir.path().join("redis.sock");
        let child = super::up_proxy::dies_with_parent(&mut Command::new("redis-server"))
            .args(["--port", "0", "--save", "", "--appendonly", "no"])
            .arg("--unixsocket")
            .arg(&socket)
            .args(["--unixsocketperm", "700"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).context("starting redis-server"),
        };
        wait_for_socket(&socket, &mut child, Duration::from_secs(10))?;
        Ok(Some(QueueRedis {
            url: format!("redis+unix://{}", socket.display()),
            server: Some(child),
            _dir: Some(dir),
        }))
    }

    /// Whether `podgate up` started this server.
    pub(crate) fn is_private(&self) -> bool {
        self.server.is_some()
    }
}

impl Drop for QueueRedis {
    fn drop(&mut self) {
        if let Some(c) = self.server.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// redis-server creates its socket once it accepts connections.
fn wait_for_socket(socket: &Path, child: &mut Child, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        if socket.exists() {
            return Ok(());
        }
        if let Some(status) = child.try_wait().context("watching redis-server")? {
            anyhow::bail!("redis-server exited at start ({status})");
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            anyhow::bail!(
                "redis-server did not create {} within {within:?}",
                PathBuf::from(socket).display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
