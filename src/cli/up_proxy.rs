//! The proxy child of `podgate up`: its configuration ([`write_config`]), started
//! as `podgate proxy --config …`, waited for until its `/readyz` answers 200,
//! stopped (SIGTERM) when dropped.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

use anyhow::Context as _;
use podgate_loadtest::pod_sim::PodSim;
use podgate_registry::{BackendConfig, Pod, Registry, RegistryConfig};

use super::up_graph::KubeSide;

/// What the proxy's configuration says besides the topology.
pub(crate) struct ProxySettings<'a> {
    pub(crate) listen: SocketAddr,
    pub(crate) admin: SocketAddr,
    pub(crate) tls_listen: SocketAddr,
    /// Seconds a Pod's Workhorse holds a long poll (and so the edge).
    pub(crate) long_poll: u64,
    /// The topology's Redis, else inline.
    pub(crate) redis: Option<&'a str>,
    /// Each Pod's own kas's observability listener (not Pod 1's with the
    /// Kubernetes side: that is `kube`'s), for the console.
    pub(crate) cell_kas: Vec<(u64, SocketAddr)>,
    /// The fleet's runner metrics, for the console.
    pub(crate) runner_metrics: Option<SocketAddr>,
    /// The Topology Service path rules ask.
    pub(crate) topology_service: SocketAddr,
}

/// The proxy's files: its directory (removed when dropped), `proxy.toml` in it,
/// and with the Kubernetes side the TLS listener's certificate.
pub(crate) struct ProxyFiles {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) path: PathBuf,
    pub(crate) ca: Option<PathBuf>,
}

/// Write the proxy's configuration for `pods` (in Redis too, with `s.redis`): its
/// listeners, agent keys, TLS and workspace hosts with the Kubernetes side, and
/// the console with every Pod and kas as sources.
pub(crate) async fn write_config(
    s: &ProxySettings<'_>,
    pods: &[Pod],
    sims: &[PodSim],
    kube: Option<&KubeSide>,
) -> anyhow::Result<ProxyFiles> {
    let dir = tempfile::tempdir().context("a directory for the proxy's configuration")?;
    let mut config = format!(
        "listen = \"{}\"\nadmin_listen = \"{}\"\ngrace_period_secs = 1\nupgrade_sock = \"{}\"\nedge_poll_hold_secs = {}\n",
        s.listen,
        s.admin,
        dir.path().join("upgrade.sock").display(),
        // As long as each Pod's Workhorse would hold it (the proxy allows 300 s).
        s.long_poll.min(300)
    );
    let mut ca = None;
    if let Some(k) = kube {
        // Agent tokens are JWTs: the proxy verifies them to route agentk to Pod 1.
        let pem = dir.path().join("agents.pem");
        std::fs::write(&pem, &k.agent_key_pem)?;
        config.push_str(&format!("keys = [\"{}\"]\n", pem.display()));
        let (cert, key) = super::up_graph::self_signed_cert(dir.path())?;
        config.push_str(&format!(
            "[tls]\nlisten = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n",
            s.tls_listen,
            cert.display(),
            key.display()
        ));
        // Workspace hosts go to the kas Workspaces server of the Pod their
        // owner's personal access token names.
        config.push_str(&format!(
            "[workspaces]\nhost_suffix = \".{}\"\n",
            super::up_workspaces::DNS_ZONE
        ));
        ca = Some(cert);
    }
    config.push_str(&format!(
        "[topology_service]\naddress = \"{}\"\n",
        s.topology_service
    ));
    config.push_str(&super::up_console::config_section(
        sims,
        kube,
        &s.cell_kas,
        s.runner_metrics,
        dir.path(),
    )?);
    match s.redis {
        Some(url) => {
            let registry = Registry::connect(RegistryConfig {
                backend: BackendConfig::Redis {
                    url: url.to_owned(),
                },
                ..RegistryConfig::default()
            })
            .await
            .with_context(|| format!("connecting to {url}"))?;
            for p in pods {
                registry.put_pod(p.clone()).await?;
            }
            registry.set_default_pod(Some(pods[0].id)).await?;
            config.push_str(&format!(
                "[registry]\nbackend = {{ kind = \"redis\", url = \"{url}\" }}\n"
            ));
        }
        None => {
            config.push_str("[topology]\ndefault_pod = 1\n");
            for p in pods {
                config.push_str(&format!(
                    "[[topology.pods]]\nid = {}\nname = \"{}\"\nweb = [\"{}\"]\nkas = {:?}\nkas_k8s_proxy = {:?}\nkas_workspaces = {:?}\n",
                    p.id, p.name, p.web[0], p.kas, p.kas_k8s_proxy, p.kas_workspaces
                ));
                if let Some(url) = &p.runner_queue_redis {
                    config.push_str(&format!("runner_queue_redis = {url:?}\n"));
                }
                if let Some(address) = &p.cell_address {
                    config.push_str(&format!("cell_address = {address:?}\n"));
                }
            }
        }
    }
    let path = dir.path().join("proxy.toml");
    std::fs::write(&path, &config)?;
    Ok(ProxyFiles { dir, path, ca })
}

/// Make the process `cmd` starts get SIGTERM when this one dies, however it dies
/// (`PR_SET_PDEATHSIG`): `podgate up`'s children (the proxy, the private
/// redis-server) never outlive it, even when it is SIGKILLed. The signal follows
/// the *thread* that spawns: spawn from `podgate up`'s main thread, which lives
/// as long as the process.
pub(crate) fn dies_with_parent(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt as _;
    let parent = rustix::process::getpid();
    // SAFETY: between fork and exec the closure only makes two system calls; it
    // allocates nothing (its errors are OS error codes) and takes no lock.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))?;
            // The parent may have died before the call above: then nobody signals.
            if rustix::process::getppid() != Some(parent) {
                return Err(rustix::io::Errno::CHILD.into());
            }
            Ok(())
        })
    }
}

/// The proxy child; stopped (SIGTERM, then killed) on drop.
pub(crate) struct ProxyChild(pub(crate) Child);

impl Drop for ProxyChild {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.0),
            rustix::process::Signal::TERM,
        );
        let _ = self.0.wait();
    }
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
        let last = super::http_client::get(admin, "/readyz").await;
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

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

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
