//! `podgate up`: the whole routing path on one machine. Three simulated Pods, the
//! proxy in front of them, and a small runner fleet; a live table of runner requests
//! per Pod (as each Pod counted them), per token source, and misroutes. Ctrl-C stops
//! everything.
//!
//! At start it prints one `pod id=… address=… registration_token=… control_api=…` line
//! per Pod and then `podgate up: ready`, so a script (or a test) can register its own
//! runner (`--no-fleet`) and queue jobs through each Pod's control API.
//!
//! Every Pod has its kas, serving GitLab's Job Router to runners
//! ([`super::up_cells`]); each `pod` line names its metrics (`kas_metrics=…`).
//!
//! Unless `--no-kube`, Pod 1's kas also has its Kubernetes API proxy, and an
//! agentk watching a kube-sim cluster ([`super::up_graph`]); `podgate up` prints a
//! `graph url=… bearer=…` line for the Graph API and a `kubeconfig path=…` line with
//! which `kubectl` reaches that cluster through the proxy and kas.
//!
//! With the Kubernetes side, Workspaces run too ([`super::up_workspaces`]): agentk's
//! `remote_development` module reconciles Pod 1's workspaces with kube-sim; one is
//! created at start (`workspace id=… name=… namespace=… url=…`), the periodic table
//! lists every workspace with its desired and actual state, and a `try: podgate
//! workspaces --gitlab …` line tells how to create, stop and restart them.
//!
//! `--prometheus-config FILE` writes a Prometheus configuration for all of it, with
//! podgate's rules ([`super::up_prometheus`]).
//!
//! The proxy's admin listener serves the web console ([`super::up_console`]); the
//! `console url=…` line is the page to open.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use podgate_loadtest::fleet::{self, FleetConfig, Progress};
use podgate_loadtest::pod_sim::{PodSim, PodSimConfig};
use podgate_tokens::PodId;

use super::http_client::get;
use super::up_proxy::{ProxyChild, ProxyFiles, ProxySettings, wait_ready};
use super::up_redis::QueueRedis;
use super::up_table::table;

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
    /// Do not hold `jobs/request` long polls at the proxy: every poll goes to its
    /// Pod's Workhorse (by default the proxy watches the Pods' runner queue keys in
    /// `--redis`, else in a private redis-server, and holds polls itself).
    #[arg(long)]
    no_edge_polls: bool,
    /// No runner fleet: point your own runner at the proxy.
    #[arg(long)]
    no_fleet: bool,
    /// Runners in the fleet (half old, half new). 36 or more give every Pod
    /// instance and project runners of every tag set.
    #[arg(long, default_value_t = 36)]
    runners: usize,
    /// Jobs queued per second on each Pod (default: 5 with the fleet; 0 with
    /// `--no-fleet`, where jobs are queued through each Pod's control API).
    #[arg(long)]
    job_rate: Option<f64>,
    /// How often each simulated runner asks for a job when idle (gitlab-runner's
    /// `check_interval`), e.g. 3s.
    #[arg(long, default_value = "3s", value_parser = super::parse_duration_secs)]
    check_interval: u64,
    /// Jobs each simulated runner runs at once (gitlab-runner's `concurrent`): a
    /// runner asks again at once after getting a job while one of these is free.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..))]
    concurrent: u64,
    /// How long each Pod's Workhorse holds a `jobs/request` with nothing new for the
    /// runner (`apiCiLongPollingDuration`; GitLab.com: 50s).
    #[arg(long, default_value = "50s", value_parser = super::parse_duration_secs)]
    long_poll: u64,
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
    /// Seconds between the partial Workspaces reconciliations GitLab asks agentk
    /// for (GitLab's default 10; full ones every hour).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    workspaces_partial_interval: u64,
    #[command(flatten)]
    job_router: super::up_cells::JobRouterArgs,
    /// Share of the fleet's runners, 0 to 1, with gitlab-runner's `FF_USE_JOB_ROUTER`
    /// on: they ask their Pod's Job Router (the kas discovery names) for jobs over
    /// gRPC and fall back to `jobs/request` as gitlab-runner does.
    #[arg(long, default_value_t = 0.0, value_parser = super::loadtest::parse_share)]
    job_router_share: f64,
    /// Write a Prometheus configuration scraping every process here (podgate's
    /// alert and recording rules beside it) to this file, for `prometheus
    /// --config.file <FILE>`.
    #[arg(long)]
    prometheus_config: Option<std::path::PathBuf>,
    /// Its scrape and rule evaluation interval, e.g. 5s.
    #[arg(long, default_value = "5s", value_parser = super::parse_duration_secs)]
    prometheus_interval: u64,
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
    // The Pods' runner queue keys, which the proxy watches to hold long polls at
    // the edge.
    let queue_redis = match (&args.redis, args.no_edge_polls) {
        (Some(url), _) => Some(QueueRedis::external(url)),
        (None, false) => QueueRedis::private()?,
        (None, true) => None,
    };
    let edge_redis = queue_redis
        .as_ref()
        .filter(|_| !args.no_edge_polls)
        .map(|q| q.url.clone());
    let mut sims = Vec::new();
    let job_rate = args
        .job_rate
        .unwrap_or(if args.no_fleet { 0.0 } else { 5.0 });
    for id in 1..=3u64 {
        let mut c = PodSimConfig::new(PodId::new(id).expect("non-zero"), "127.0.0.1:0".parse()?);
        c.job_rate = job_rate;
        c.long_poll = Duration::from_secs(args.long_poll);
        // Runner queue keys are written where Workhorse (and the proxy) watch them.
        c.redis = queue_redis.as_ref().map(|q| q.url.clone());
        // Job payloads (`repo_url`, `CI_SERVER_URL`) name the proxy, so runners clone
        // through it like every other request.
        c.external_url = Some(format!("http://{}", args.listen));
        c.job_router_url = args.job_router.discovery_url(id, args.listen);
        if id == 1 && !args.no_kube {
            c.kas_secret = Some(kas_secret.clone());
            c.agents = vec![podgate_loadtest::pod_sim::AgentSpec::with_user_access(
                super::up_graph::AGENT_ID,
                c.pod_id,
            )];
            c.workspaces
                .settings
                .partial_reconciliation_interval_seconds = args.workspaces_partial_interval;
        }
        sims.push(PodSim::start(c).await?);
    }
    let mut kube = if args.no_kube {
        None
    } else {
        Some(
            super::up_graph::start(
                args.kube_objects,
                args.kube_churn,
                &sims[0],
                kas_secret.clone(),
                vec![super::up_console::origin(args.admin)],
                args.job_router
                    .kas_config(1, queue_redis.as_ref().map(|q| q.url.as_str())),
            )
            .await?,
        )
    };
    // Every other Pod's kas (Pod 1's too without the Kubernetes side).
    let mut cell_kas = BTreeMap::new();
    for s in &sims {
        let pod = s.state().pod().get();
        if pod == 1 && kube.is_some() {
            continue;
        }
        let config = args
            .job_router
            .kas_config(pod, queue_redis.as_ref().map(|q| q.url.as_str()));
        let kas = super::up_cells::start_kas(s, kas_secret.clone(), config).await?;
        cell_kas.insert(pod, kas);
    }
    let pods = super::up_cells::topology(&sims, kube.as_ref(), &cell_kas, edge_redis.as_deref());
    let topology_service = super::up_topology::start(&sims, args.redis.as_deref()).await?;

    // Instance and project runners on every Pod: each Pod's instance registration
    // token, then its projects' tokens.
    let (tokens, token_pods) = super::up_cells::fleet_tokens(&sims);
    let progress = Arc::new(Progress::default());
    let runner_metrics = if args.no_fleet {
        None
    } else {
        Some(super::up_cells::serve_runner_metrics(progress.clone(), token_pods).await?)
    };
    let ProxyFiles { dir, path, ca } = super::up_proxy::write_config(
        &ProxySettings {
            listen: args.listen,
            admin: args.admin,
            tls_listen: args.tls_listen,
            long_poll: args.long_poll,
            redis: args.redis.as_deref(),
            cell_kas: cell_kas
                .iter()
                .map(|(pod, k)| (*pod, k.observability))
                .collect(),
            runner_metrics: runner_metrics.as_ref().map(|m| m.addr),
            topology_service,
        },
        &pods,
        &sims,
        kube.as_ref(),
    )
    .await?;
    let exe = std::env::current_exe().context("finding the podgate binary")?;
    let mut proxy = ProxyChild(
        super::up_proxy::dies_with_parent(&mut Command::new(exe))
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
        "  console url={}",
        super::up_console::url(args.admin, args.listen, kube.as_ref().map(|_| &sims[0]))?
    ));
    say(&format!(
        "  topology   {}",
        args.redis.as_deref().unwrap_or("in memory")
    ));
    say(&format!(
        "  topology_service address={topology_service} (gRPC and POST /v1/classify; path rules: /{}/… /o/{}/… and so on per Pod)",
        podgate_loadtest::pod_sim::namespace(sims[0].state().pod()),
        podgate_loadtest::pod_sim::organization(sims[0].state().pod()),
    ));
    say(&match (&queue_redis, &edge_redis) {
        (Some(q), Some(_)) => format!(
            "  queues     runner queue keys in {}{}; jobs/request long polls held at the proxy",
            q.url,
            if q.is_private() { " (a private redis-server)" } else { "" }
        ),
        (Some(q), None) => format!(
            "  queues     runner queue keys in {}; long polls held by each Pod's Workhorse (--no-edge-polls)",
            q.url
        ),
        (None, _) if args.no_edge_polls => {
            "  queues     long polls held by each Pod's Workhorse (--no-edge-polls)".to_owned()
        }
        (None, _) => "  queues     redis-server is not installed: long polls held by each Pod's Workhorse, not at the proxy".to_owned(),
    });
    for s in &sims {
        let pod = s.state().pod().get();
        let kas_metrics = match (cell_kas.get(&pod), &kube) {
            (Some(k), _) => format!("http://{}/metrics", k.observability),
            (None, Some(k)) => format!("http://{}/metrics", k.kas_observability),
            (None, None) => "-".into(),
        };
        say(&format!(
            "  pod id={pod} address=http://{} registration_token={} control_api=http://{}/-/podsim/jobs kas_metrics={kas_metrics} job_router={}",
            s.addr(),
            s.state().registration_token(),
            s.addr(),
            args.job_router
                .discovery_url(pod, args.listen)
                .unwrap_or_else(|| "off".into()),
        ));
    }
    say(&format!(
        "  register a runner: gitlab-runner register --url http://{} --token <a registration token>",
        args.listen
    ));
    if let Some(k) = kube.as_mut() {
        k.run_controllers().await;
        k.connect_agent(args.listen, sims[0].state().pod(), &sims[0], dir.path())
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
        if !k.settled {
            say("  note: kube-sim's Deployments were still rolling out when the churn started");
        }
        say(&format!(
            "  metrics    kas http://{}/metrics (bearer token: --prometheus-config writes it to a file), agentk {}",
            k.kas_observability,
            k.agentk_observability
                .map_or("-".to_owned(), |a| format!("http://{a}/metrics"))
        ));
        let ws = super::up_workspaces::first_workspace(&sims[0], super::up_graph::AGENT_ID).await?;
        for line in super::up_workspaces::start_lines(
            &sims[0],
            &k.agent_config,
            &ws,
            args.listen,
            &pat_file,
        ) {
            say(&line);
        }
    }

    if let Some(path) = &args.prometheus_config {
        let targets = super::up_prometheus::Targets {
            proxy_admin: args.admin,
            kas: kube
                .as_ref()
                .map(|k| (k.kas_observability, k.metrics_token.clone())),
            cell_kas: cell_kas.values().map(|k| k.observability).collect(),
            agentk: kube.as_ref().and_then(|k| k.agentk_observability),
            pods: sims.iter().map(|s| s.addr()).collect(),
        };
        super::up_prometheus::write(
            path,
            &targets,
            Duration::from_secs(args.prometheus_interval),
        )?;
        say(&format!(
            "  prometheus config={} (prometheus --config.file {})",
            path.display(),
            path.display()
        ));
    }

    let duration = Duration::from_secs(args.duration.unwrap_or(365 * 24 * 3600));
    let stop = async {
        tokio::select! {
            _ = super::shutdown_signal() => {}
            _ = tokio::time::sleep(duration) => {}
        }
    };
    let fleet = (!args.no_fleet).then(|| {
        let mut config = FleetConfig::new(
            format!("http://{}", args.listen),
            tokens,
            args.runners,
            duration,
        );
        config.check_interval = Duration::from_secs(args.check_interval);
        config.concurrent = args.concurrent as usize;
        config.job_rate = Some(job_rate * sims.len() as f64);
        config.job_router_share = args.job_router_share;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(fleet::run(config, progress.clone(), async move {
            let _ = rx.await;
        }));
        (tx, handle)
    });
    // With the fleet, people browsing the Pods' group and organization pages too:
    // the path rules' traffic.
    let _browsing = fleet.is_some().then(|| {
        let pods = sims.iter().map(|s| s.state().pod()).collect();
        podgate_agent::task::AbortOnDrop::spawn(super::up_topology::browse(args.listen, pods))
    });
    if fleet.is_some() {
        say(&format!(
            "  fleet      {} runners (half old: token in the body only; instance and project runners, 4 tag sets), check_interval {}s, concurrent {}, jobs/request expected ~{:.0}/s (runners / check_interval + {:.0} jobs/s)",
            args.runners,
            args.check_interval,
            args.concurrent,
            args.runners as f64 / args.check_interval.max(1) as f64 + job_rate * sims.len() as f64,
            job_rate * sims.len() as f64,
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
                say(&format!("\n{}", tables(&sims, &kube, &cell_kas, &metrics, runner_metrics.as_ref())));
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
    say(&format!(
        "\nfinal\n{}",
        tables(&sims, &kube, &cell_kas, &metrics, runner_metrics.as_ref())
    ));
    let misroutes: u64 = sims.iter().map(|s| s.metrics().misrouted.get()).sum();
    if misroutes > 0 {
        code = ExitCode::from(1);
    }
    if let Some(k) = kube {
        k.shutdown().await;
    }
    for (_, k) in cell_kas {
        k.shutdown().await;
    }
    Ok(code)
}

/// The live tables: runner traffic per Pod, the Job Router per Pod, workspaces.
fn tables(
    sims: &[PodSim],
    kube: &Option<super::up_graph::KubeSide>,
    cell_kas: &BTreeMap<u64, super::up_cells::CellKas>,
    proxy_metrics: &str,
    runners: Option<&super::up_cells::RunnerMetrics>,
) -> String {
    format!(
        "{}{}{}",
        table(sims, proxy_metrics),
        super::up_cells::job_router_lines(kube.as_ref(), cell_kas, proxy_metrics, runners),
        workspaces_table(sims, kube)
    )
}

/// Pod 1's workspaces (with the Kubernetes side), as a table; else nothing.
fn workspaces_table(sims: &[PodSim], kube: &Option<super::up_graph::KubeSide>) -> String {
    match (kube, sims.first()) {
        (Some(_), Some(sim)) => super::up_workspaces::table(sim),
        _ => String::new(),
    }
}

/// Print a line; a closed stdout (`podgate up | head`) does not stop `podgate up`.
fn say(text: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}").and_then(|()| out.flush());
}
