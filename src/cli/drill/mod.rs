//! `podgate loadtest drill …`: the small helpers `scripts/drills.sh` runs while it
//! breaks things, so the script parses no HTTP and does no arithmetic on logs:
//!
//! - `ledger-check`: every Pod's job ledger (`GET /-/podsim/ledger`) against the
//!   runner fleet's JSON report (`ledger.rs`);
//! - `probe` and `probe-stats`: one request at a time per Pod through the proxy,
//!   each logged with its time and status, and the figures of a time window
//!   (`probe.rs`);
//! - `topology-owner`: writes the Pod topology into Redis and writes it again when
//!   Redis lost it, as whatever owns the topology in production would;
//! - `rss-check`: whether each process's resident memory stayed flat over a soak;
//! - `get-pods`: GitLab's `GetPods` for an agent on one kas, timed (`kas.rs`);
//! - `claim`, `path-probe` and `path-probe-stats`: a Pod's claims at the Topology
//!   Service, and requests the proxy places by them, logged and figured
//!   (`paths.rs`).

mod kas;
mod ledger;
mod paths;
mod probe;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use podgate_registry::{BackendConfig, Pod, PodState, Registry, RegistryConfig};
use podgate_tokens::PodId;

/// `podgate loadtest drill …`.
#[derive(Debug, Subcommand)]
pub(crate) enum DrillCommand {
    /// Check the Pods' job ledgers against the fleet's report: every job the fleet
    /// got finished exactly once, on the Pod that issued it; no misroute.
    LedgerCheck(ledger::LedgerCheckArgs),
    /// Register one runner per Pod through the proxy, then `POST runners/verify`
    /// for each in turn, logging `unix_ms pod status retry_after` per request,
    /// until SIGTERM.
    Probe(probe::ProbeArgs),
    /// Figures of a probe log over a time window (JSON).
    ProbeStats(probe::ProbeStatsArgs),
    /// Keep the Pod topology in Redis: write it, and write it again whenever Redis
    /// holds none (restarted empty), until SIGTERM.
    TopologyOwner(TopologyOwnerArgs),
    /// Whether every process's RSS stayed flat: mean of the first quarter of the
    /// samples against the last (`unix_ms name rss_kb` lines).
    RssCheck(RssCheckArgs),
    /// GitLab's `GetPods` for an agent on one kas, timed (one JSON line).
    GetPods(kas::GetPodsArgs),
    /// Make a Pod's claims at the Topology Service, as its Rails does.
    Claim(paths::ClaimArgs),
    /// GET each Pod's group and organization pages, and a namespace never named
    /// before, through the proxy in turn, logging `unix_ms kind want got status
    /// micros` per request, until SIGTERM.
    PathProbe(paths::PathProbeArgs),
    /// Figures of a path probe's log over a time window, per kind (JSON).
    PathProbeStats(paths::PathProbeStatsArgs),
}

pub(crate) fn run(cmd: DrillCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        DrillCommand::RssCheck(args) => rss_check(&args),
        DrillCommand::ProbeStats(args) => probe::stats(&args),
        DrillCommand::PathProbeStats(args) => paths::stats(&args),
        cmd => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            rt.block_on(async move {
                match cmd {
                    DrillCommand::LedgerCheck(args) => ledger::check(args).await,
                    DrillCommand::Probe(args) => probe::run(args).await,
                    DrillCommand::TopologyOwner(args) => topology_owner(args).await,
                    DrillCommand::GetPods(args) => kas::get_pods(args).await,
                    DrillCommand::Claim(args) => paths::claim(args).await,
                    DrillCommand::PathProbe(args) => paths::probe(args).await,
                    DrillCommand::RssCheck(_)
                    | DrillCommand::ProbeStats(_)
                    | DrillCommand::PathProbeStats(_) => unreachable!(),
                }
            })
        }
    }
}

/// Flags of `drill topology-owner`.
#[derive(Debug, Args)]
pub(crate) struct TopologyOwnerArgs {
    /// The registry's Redis.
    #[arg(long)]
    redis: String,
    /// A Pod, `ID=HOST:PORT` (its web upstream); the first is the default Pod.
    #[arg(long = "pod", value_parser = parse_pod, required = true)]
    pods: Vec<(PodId, String)>,
    /// A kas agent listener of a Pod, `ID=HOST:PORT` (repeatable).
    #[arg(long = "kas", value_parser = parse_pod)]
    kas: Vec<(PodId, String)>,
    /// The Redis the Pods keep their runner queue keys in (the proxy holds long
    /// polls at the edge on it).
    #[arg(long)]
    queue_redis: Option<String>,
    /// How often to look.
    #[arg(long, default_value = "500ms", value_parser = parse_millis)]
    every: Duration,
    /// Each Pod's Cell is known to the Topology Service by the Pod's web address
    /// (its `cell_address`), as `podgate up` names them.
    #[arg(long)]
    cell_addresses: bool,
}

fn parse_pod(s: &str) -> Result<(PodId, String), String> {
    let (id, web) = s.split_once('=').ok_or("expected ID=HOST:PORT")?;
    let id = id.parse::<PodId>().map_err(|e| format!("{id:?}: {e}"))?;
    Ok((id, web.to_owned()))
}

fn parse_millis(s: &str) -> Result<Duration, String> {
    match s.strip_suffix("ms") {
        Some(ms) => ms
            .parse()
            .map(Duration::from_millis)
            .map_err(|_| format!("{s:?}: e.g. 500ms or 2s")),
        None => super::parse_duration_secs(s).map(Duration::from_secs),
    }
}

/// A time window of a probe log (`--from`, `--to`: Unix milliseconds).
#[derive(Clone, Copy, Debug, Args)]
pub(crate) struct Window {
    /// The window's start, Unix milliseconds (times in the answer are from it).
    #[arg(long, default_value_t = 0)]
    from: u128,
    /// The window's end, Unix milliseconds.
    #[arg(long)]
    to: Option<u128>,
}

impl Window {
    /// Whether `t` (Unix milliseconds) is in the window.
    fn holds(&self, t: u128) -> bool {
        t >= self.from && self.to.is_none_or(|to| t <= to)
    }
}

fn unix_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

async fn topology_owner(args: TopologyOwnerArgs) -> anyhow::Result<ExitCode> {
    let pods: Vec<Pod> = args
        .pods
        .iter()
        .map(|(id, web)| Pod {
            id: *id,
            name: format!("pod-{id}"),
            web: vec![web.clone()],
            kas: args
                .kas
                .iter()
                .filter(|(pod, _)| pod == id)
                .map(|(_, addr)| addr.clone())
                .collect(),
            kas_k8s_proxy: Vec::new(),
            kas_workspaces: Vec::new(),
            state: PodState::Active,
            labels: BTreeMap::new(),
            session_prefix: None,
            runner_queue_redis: args.queue_redis.clone(),
            cell_address: args.cell_addresses.then(|| web.clone()),
        })
        .collect();
    let config = RegistryConfig {
        backend: BackendConfig::Redis {
            url: args.redis.clone(),
        },
        connect_timeout: Duration::from_millis(500),
        response_timeout: Duration::from_millis(500),
        ..RegistryConfig::default()
    };
    let stop = super::shutdown_signal();
    tokio::pin!(stop);
    let mut down_logged = false;
    loop {
        // A new client each time: a registry keeps its last good topology when Redis
        // comes back empty, and what is wanted here is what Redis holds now.
        match ensure_topology(&config, &pods).await {
            Ok(true) => {
                println!(
                    "{} topology-owner: wrote the topology ({} Pods)",
                    unix_ms(),
                    pods.len()
                );
                down_logged = false;
            }
            Ok(false) => down_logged = false,
            Err(e) if !down_logged => {
                println!("{} topology-owner: Redis unavailable: {e:#}", unix_ms());
                down_logged = true;
            }
            Err(_) => {}
        }
        tokio::select! {
            _ = &mut stop => return Ok(ExitCode::SUCCESS),
            _ = tokio::time::sleep(args.every) => {}
        }
    }
}

/// Write `pods` (the first the default) unless Redis holds them already; whether it
/// wrote.
async fn ensure_topology(config: &RegistryConfig, pods: &[Pod]) -> anyhow::Result<bool> {
    let registry = tokio::time::timeout(Duration::from_secs(2), Registry::connect(config.clone()))
        .await
        .context("connecting")??;
    let current = registry.reload_topology().await?;
    let complete = pods
        .iter()
        .all(|p| current.pods.get(&p.id).map(|x| x.as_ref()) == Some(p))
        && current.default_pod == Some(pods[0].id);
    if complete {
        return Ok(false);
    }
    for p in pods {
        registry.put_pod(p.clone()).await?;
    }
    registry.set_default_pod(Some(pods[0].id)).await?;
    Ok(true)
}

/// Flags of `drill rss-check`.
#[derive(Debug, Args)]
pub(crate) struct RssCheckArgs {
    /// The samples: `unix_ms name rss_kb` per line.
    #[arg(long)]
    samples: PathBuf,
    /// Largest growth allowed, percent of the first quarter's mean.
    #[arg(long, default_value_t = 20.0)]
    max_growth_pct: f64,
    /// Growth below this many KiB passes whatever its percentage (allocator noise
    /// of small processes).
    #[arg(long, default_value_t = 8192)]
    min_growth_kb: u64,
}

fn rss_check(args: &RssCheckArgs) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&args.samples)
        .with_context(|| format!("reading {}", args.samples.display()))?;
    let mut by_name: BTreeMap<&str, Vec<(u128, u64)>> = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if let [t, name, kb] = f[..]
            && let (Ok(t), Ok(kb)) = (t.parse(), kb.parse())
        {
            by_name.entry(name).or_default().push((t, kb));
        }
    }
    anyhow::ensure!(
        !by_name.is_empty(),
        "no samples in {}",
        args.samples.display()
    );
    let mut ok = true;
    println!(
        "{:<12} {:>8} {:>14} {:>14} {:>9}",
        "process", "samples", "first_q_kb", "last_q_kb", "growth"
    );
    for (name, mut samples) in by_name {
        samples.sort_unstable();
        let q = (samples.len() / 4).max(1);
        let mean = |s: &[(u128, u64)]| s.iter().map(|x| x.1 as f64).sum::<f64>() / s.len() as f64;
        let (first, last) = (mean(&samples[..q]), mean(&samples[samples.len() - q..]));
        let growth = (last - first) / first.max(1.0) * 100.0;
        let flat = samples.len() >= 4
            && (growth <= args.max_growth_pct || last - first < args.min_growth_kb as f64);
        ok &= flat;
        println!(
            "{name:<12} {:>8} {first:>14.0} {last:>14.0} {growth:>8.1}%{}",
            samples.len(),
            if flat { "" } else { "  NOT FLAT" }
        );
    }
    println!("rss check: {}", if ok { "ok" } else { "FAILED" });
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
