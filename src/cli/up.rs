//! `podgate up`: the whole routing path on one machine. Three simulated Pods, the
//! proxy in front of them, and a small runner fleet; a live table of runner requests
//! per Pod (as each Pod counted them), per token source, and misroutes. Ctrl-C stops
//! everything.
//!
//! At start it prints one `pod id=… address=… registration_token=… control_api=…` line
//! per Pod and then `podgate up: ready`, so a script (or a test) can register its own
//! runner (`--no-fleet`) and queue jobs through each Pod's control API.
//!
//! Unless `--no-kube`, Pod 1 also has a kas (with its Kubernetes API proxy) and an
//! agentk watching a kube-sim cluster ([`super::up_graph`]); `podgate up` prints a
//! `graph url=… bearer=…` line for the Graph API and a `kubeconfig path=…` line with
//! which `kubectl` reaches that cluster through the proxy and kas.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use podgate_loadtest::fleet::{self, FleetConfig, Progress};
use podgate_loadtest::pod_sim::{PodSim, PodSimConfig, sum_samples};
use podgate_registry::{BackendConfig, Pod, PodState, Registry, RegistryConfig};
use podgate_tokens::PodId;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Flags of `podgate up`.
#[derive(Debug, Args)]
pub(crate) struct UpArgs {
    /// Where the proxy listens.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The proxy's TLS listener (a self-signed certificate): `kubectl` sends its
    /// bearer token only over TLS.
    #[arg(long, default_value = "127.0.0.1:8443")]
    tls_listen: SocketAddr,
    /// The proxy's admin listener (/metrics, /healthz).
    #[arg(long, default_value = "127.0.0.1:9191")]
    admin: SocketAddr,
    /// Keep the topology in this Redis instead of in memory.
    #[arg(long)]
    redis: Option<String>,
    /// No runner fleet: point your own runner at the proxy.
    #[arg(long)]
    no_fleet: bool,
    /// Runners in the fleet (half old, half new).
    #[arg(long, default_value_t = 30)]
    runners: usize,
    /// Jobs queued per second on each Pod (default: 5 with the fleet; 0 with
    /// `--no-fleet`, where jobs are queued through each Pod's control API).
    #[arg(long)]
    job_rate: Option<f64>,
    /// Stop after this long (default: at Ctrl-C), e.g. 60s.
    #[arg(long, value_parser = super::parse_duration_secs)]
    duration: Option<u64>,
    /// Write the fleet's report as JSON to this file at the end.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// No kas, agentk and kube-sim.
    #[arg(long)]
    no_kube: bool,
    /// Objects in the simulated cluster.
    #[arg(long, default_value_t = 3000)]
    kube_objects: usize,
    /// Changes per second in the simulated cluster (0: none).
    #[arg(long, default_value_t = 2.0)]
    kube_churn: f64,
}

/// The proxy child; stopped (SIGTERM, then killed) on drop.
struct ProxyChild(Child);

impl Drop for ProxyChild {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

/// `GET path` on `addr`: the status code and the body.
async fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
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

/// The simulator's `podsim_requests_total` endpoints that are not runner traffic: the
/// proxy's health probes, metrics scrapes and the control API.
const NOT_RUNNER_TRAFFIC: [&str; 3] = ["health", "metrics", "control"];

/// Runner requests a Pod answered (every endpoint but [`NOT_RUNNER_TRAFFIC`]), and of
/// them `jobs/request` polls, from the simulator's own `podsim_requests_total`.
fn runner_traffic(sim: &PodSim) -> (u64, u64) {
    let text = sim.metrics().render();
    let prefix = "podsim_requests_total{";
    let all = sum_samples(&text, prefix, |l| {
        label(l, "endpoint").is_some_and(|e| !NOT_RUNNER_TRAFFIC.contains(&e))
    });
    let polls = sum_samples(&text, prefix, |l| {
        label(l, "endpoint") == Some("jobs_request")
    });
    (all, polls)
}

/// `source="…"` of a metric line.
fn label<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let start = line.find(&format!("{name}=\""))? + name.len() + 2;
    let len = line[start..].find('"')?;
    Some(&line[start..start + len])
}

fn table(sims: &[PodSim], proxy_metrics: &str) -> String {
    let mut out = String::from("  Pod  address              requests  jobs/request  misroutes\n");
    for s in sims {
        let (requests, polls) = runner_traffic(s);
        let _ = writeln!(
            out,
            "  {:<4} {:<20} {:>8}  {:>12}  {:>9}",
            s.state().pod(),
            s.addr(),
            requests,
            polls,
            s.metrics().misrouted.get()
        );
    }
    let mut by_source: BTreeMap<String, u64> = BTreeMap::new();
    for l in proxy_metrics
        .lines()
        .filter(|l| l.starts_with("podgate_proxy_requests_total{"))
    {
        if let (Some(src), Some(n)) = (
            label(l, "source"),
            l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()),
        ) {
            *by_source.entry(src.to_owned()).or_default() += n as u64;
        }
    }
    out.push_str("  token source          requests through the proxy\n");
    for (src, n) in by_source {
        let _ = writeln!(out, "  {src:<21} {n:>8}");
    }
    let misroutes: u64 = sims.iter().map(|s| s.metrics().misrouted.get()).sum();
    let _ = writeln!(out, "  misroutes: {misroutes}");
    out
}

pub(crate) fn run(args: UpArgs) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(up(args))
}

async fn up(args: UpArgs) -> anyhow::Result<ExitCode> {
    let kas_secret = super::up_graph::secret();
    let mut sims = Vec::new();
    for id in 1..=3u64 {
        let mut c = PodSimConfig::new(PodId::new(id).expect("non-zero"), "127.0.0.1:0".parse()?);
        c.job_rate = args
            .job_rate
            .unwrap_or(if args.no_fleet { 0.0 } else { 5.0 });
        c.long_poll = Duration::from_secs(20);
        // Job payloads (`repo_url`, `CI_SERVER_URL`) name the proxy, so runners clone
        // through it like every other request.
        c.external_url = Some(format!("http://{}", args.listen));
        if id == 1 && !args.no_kube {
            c.kas_secret = Some(kas_secret.clone());
            c.agents = vec![podgate_loadtest::pod_sim::AgentSpec::with_user_access(
                super::up_graph::AGENT_ID,
                c.pod_id,
            )];
        }
        sims.push(PodSim::start(c).await?);
    }
    let mut kube = if args.no_kube {
        None
    } else {
        Some(
            super::up_graph::start(args.kube_objects, args.kube_churn, &sims[0], kas_secret)
                .await?,
        )
    };
    let pods: Vec<Pod> = sims
        .iter()
        .map(|s| Pod {
            id: s.state().pod(),
            name: format!("pod-{}", s.state().pod()),
            web: vec![s.addr().to_string()],
            kas: kube
                .as_ref()
                .filter(|_| s.state().pod().get() == 1)
                .map(|k| vec![k.kas_agent.to_string()])
                .unwrap_or_default(),
            kas_k8s_proxy: kube
                .as_ref()
                .filter(|_| s.state().pod().get() == 1)
                .map(|k| vec![k.kas_k8s_proxy.to_string()])
                .unwrap_or_default(),
            state: PodState::Active,
            labels: BTreeMap::new(),
            session_prefix: None,
        })
        .collect();

    let dir = tempfile::tempdir().context("a directory for the proxy's configuration")?;
    let mut config = format!(
        "listen = \"{}\"\nadmin_listen = \"{}\"\ngrace_period_secs = 1\nupgrade_sock = \"{}\"\n",
        args.listen,
        args.admin,
        dir.path().join("upgrade.sock").display()
    );
    let mut ca = None;
    if let Some(k) = &kube {
        // Agent tokens are JWTs: the proxy verifies them to route agentk to Pod 1.
        let pem = dir.path().join("agents.pem");
        std::fs::write(&pem, &k.agent_key_pem)?;
        config.push_str(&format!("keys = [\"{}\"]\n", pem.display()));
        let (cert, key) = super::up_graph::self_signed_cert(dir.path())?;
        config.push_str(&format!(
            "[tls]\nlisten = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n",
            args.tls_listen,
            cert.display(),
            key.display()
        ));
        ca = Some(cert);
    }
    match &args.redis {
        Some(url) => {
            let registry = Registry::connect(RegistryConfig {
                backend: BackendConfig::Redis { url: url.clone() },
                ..RegistryConfig::default()
            })
            .await
            .with_context(|| format!("connecting to {url}"))?;
            for p in &pods {
                registry.put_pod(p.clone()).await?;
            }
            registry.set_default_pod(Some(pods[0].id)).await?;
            config.push_str(&format!(
                "[registry]\nbackend = {{ kind = \"redis\", url = \"{url}\" }}\n"
            ));
        }
        None => {
            config.push_str("[topology]\ndefault_pod = 1\n");
            for p in &pods {
                config.push_str(&format!(
                    "[[topology.pods]]\nid = {}\nname = \"{}\"\nweb = [\"{}\"]\nkas = {:?}\nkas_k8s_proxy = {:?}\n",
                    p.id, p.name, p.web[0], p.kas, p.kas_k8s_proxy
                ));
            }
        }
    }
    let path = dir.path().join("proxy.toml");
    std::fs::write(&path, &config)?;
    let exe = std::env::current_exe().context("finding the podgate binary")?;
    let mut proxy = ProxyChild(
        Command::new(exe)
            .args(["proxy", "--config"])
            .arg(&path)
            .stdout(Stdio::null())
            .spawn()
            .context("starting the proxy")?,
    );
    wait_ready(args.admin, Duration::from_secs(30), || {
        proxy.0.try_wait().context("watching the proxy")
    })
    .await
    .with_context(|| format!("starting the proxy on {}", args.listen))?;

    say("podgate up");
    say(&format!(
        "  proxy      http://{}   (admin http://{}/metrics)",
        args.listen, args.admin
    ));
    say(&format!(
        "  topology   {}",
        args.redis.as_deref().unwrap_or("in memory")
    ));
    for s in &sims {
        say(&format!(
            "  pod id={} address=http://{} registration_token={} control_api=http://{}/-/podsim/jobs",
            s.state().pod(),
            s.addr(),
            s.state().registration_token(),
            s.addr()
        ));
    }
    say(&format!(
        "  register a runner: gitlab-runner register --url http://{} --token <a registration token>",
        args.listen
    ));
    if let Some(k) = kube.as_mut() {
        k.connect_agent(args.listen, sims[0].state().pod(), dir.path())
            .await?;
        let pat = sims[0]
            .create_personal_access_token("root", &["k8s_proxy", "read_api"])
            .context("a personal access token for the Graph API")?;
        let bearer = format!("pat:{}:{pat}", super::up_graph::AGENT_ID);
        let base = format!(
            "http://{}{}",
            args.listen,
            super::up_graph::K8S_PROXY_PREFIX
        );
        let tls_base = format!(
            "https://{}{}",
            args.tls_listen,
            super::up_graph::K8S_PROXY_PREFIX
        );
        let ca = ca.as_deref().context("the proxy's certificate")?;
        let kubeconfig = super::up_graph::user_kubeconfig(dir.path(), &tls_base, ca, &bearer)?;
        say(&format!(
            "  kube       kube-sim http://{} ({} objects), kas {} (k8s proxy {}), agentk agent {} connected",
            k.kube_sim,
            k.objects,
            k.kas_agent,
            k.kas_k8s_proxy,
            super::up_graph::AGENT_ID
        ));
        say(&format!(
            "  graph url=ws://{}{}graph bearer={bearer}",
            args.listen,
            super::up_graph::K8S_PROXY_PREFIX
        ));
        say(&format!("  kubeconfig path={}", kubeconfig.display()));
        let pat_file = dir.path().join("pat");
        std::fs::write(&pat_file, &pat)?;
        say(&format!(
            "  try: kubectl --kubeconfig {} get pods -A; podgate graph --url {base} -a {} --token-file {}",
            kubeconfig.display(),
            super::up_graph::AGENT_ID,
            pat_file.display()
        ));
    }

    let duration = Duration::from_secs(args.duration.unwrap_or(365 * 24 * 3600));
    let stop = async {
        tokio::select! {
            _ = super::shutdown_signal() => {}
            _ = tokio::time::sleep(duration) => {}
        }
    };
    let progress = Arc::new(Progress::default());
    let fleet = (!args.no_fleet).then(|| {
        let config = FleetConfig {
            target: format!("http://{}", args.listen),
            registration_tokens: sims
                .iter()
                .map(|s| s.state().registration_token().to_owned())
                .collect(),
            runners: args.runners,
            duration,
            old_share: 0.5,
            artifact_bytes: 16 * 1024,
            trace_patches: 3,
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(fleet::run(config, progress.clone(), async move {
            let _ = rx.await;
        }));
        (tx, handle)
    });
    if fleet.is_some() {
        say(&format!(
            "  fleet      {} runners (half old: token in the body only)",
            args.runners
        ));
    }
    say("podgate up: ready");
    let mut tick = tokio::time::interval(Duration::from_secs(3));
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick() => {
                let metrics = get(args.admin, "/metrics").await.unwrap_or_default().1;
                say(&format!("\n{}", table(&sims, &metrics)));
            }
        }
    }
    let mut code = ExitCode::SUCCESS;
    if let Some((tx, handle)) = fleet {
        let _ = tx.send(());
        let report = handle.await.context("the fleet task")??;
        say(&format!("\nrunner fleet report\n{}", report.table()));
        if let Some(path) = &args.json {
            std::fs::write(path, serde_json::to_string_pretty(&report.to_json())?)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        if report.misroutes > 0 || report.unexpected() > 0 {
            code = ExitCode::from(1);
        }
    }
    let metrics = get(args.admin, "/metrics").await.unwrap_or_default().1;
    say(&format!("\nfinal\n{}", table(&sims, &metrics)));
    let misroutes: u64 = sims.iter().map(|s| s.metrics().misrouted.get()).sum();
    if misroutes > 0 {
        code = ExitCode::from(1);
    }
    Ok(code)
}

/// Print a line; a closed stdout (`podgate up | head`) does not stop `podgate up`.
fn say(text: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}").and_then(|()| out.flush());
}

/// Waits until the proxy's `/readyz` on `admin` answers 200 (a 503 means it serves but
/// has no usable default Pod yet); fails at once when `exited` reports the proxy gone,
/// or after `timeout`.
async fn wait_ready(
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
