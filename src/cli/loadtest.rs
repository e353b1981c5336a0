//! `podgate loadtest runners`: a simulated runner fleet against a proxy or a Pod.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Args, Subcommand};
use podgate_loadtest::fleet::{self, FleetConfig, Progress, TagSet};

/// `podgate loadtest …`.
#[derive(Debug, Subcommand)]
pub(crate) enum LoadtestCommand {
    /// Simulated GitLab Runners: register, long-poll, run jobs.
    Runners(RunnersArgs),
    /// Constant-rate HTTP requests, latencies corrected for coordinated omission.
    Http(HttpArgs),
    /// Many agentk replicas connected to one kas, each holding its idle tunnels.
    Agents(super::loadtest_agents::AgentsArgs),
    /// The time from a job queued to its runner's held poll answered, with N
    /// runners held (Job Router `GetJob`, or REST `jobs/request`).
    Wake(WakeArgs),
    /// Helpers of the fault drills (`scripts/drills.sh`): the ledger check, a
    /// per-Pod probe, a topology owner, the RSS check.
    #[command(subcommand)]
    Drill(super::drill::DrillCommand),
}

/// Flags of `podgate loadtest http`.
#[derive(Debug, Args)]
pub(crate) struct HttpArgs {
    /// The URL, e.g. http://127.0.0.1:8080/api/v4/jobs/request.
    #[arg(long)]
    url: String,
    /// Requests per second.
    #[arg(long)]
    rate: f64,
    /// How long, e.g. 30s.
    #[arg(long, default_value = "30s", value_parser = super::parse_duration_secs)]
    duration: u64,
    /// HTTP method.
    #[arg(long, default_value = "GET")]
    method: http::Method,
    /// A header, `name: value` (repeatable).
    #[arg(long = "header")]
    headers: Vec<String>,
    /// The request body.
    #[arg(long, default_value = "")]
    body: String,
    /// Most requests in flight at once.
    #[arg(long, default_value_t = 4096)]
    max_in_flight: usize,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Flags of `podgate loadtest wake`.
#[derive(Debug, Args)]
pub(crate) struct WakeArgs {
    /// The proxy, e.g. http://127.0.0.1:8080.
    #[arg(long)]
    target: String,
    /// A Pod's registration token, then its simulator's URL (control API), e.g.
    /// `--pod glrt-… http://127.0.0.1:9001`; repeat for each Pod.
    #[arg(long, num_args = 2, value_names = ["TOKEN", "URL"], required = true)]
    pod: Vec<String>,
    /// Runners, each with a poll held.
    #[arg(long, default_value_t = 1000)]
    runners: usize,
    /// `router` (GitLab's Job Router) or `rest` (`jobs/request`).
    #[arg(long, value_parser = ["router", "rest"], default_value = "router")]
    mode: String,
    /// HTTP/2 connections the router calls share (default: one per 50 runners).
    #[arg(long)]
    connections: Option<usize>,
    /// Jobs queued and timed, one at a time.
    #[arg(long, default_value_t = 300)]
    samples: usize,
    /// A metrics URL and the line prefix of its held gauge, e.g.
    /// `--held http://127.0.0.1:8151/metrics 'podgate_kas_job_router_held '`;
    /// sampling starts once they sum to the runners (repeatable).
    #[arg(long, num_args = 2, value_names = ["URL", "PREFIX"])]
    held: Vec<String>,
}

fn wake(args: WakeArgs) -> anyhow::Result<ExitCode> {
    use podgate_loadtest::wake::{Mode, WakeConfig};
    let pairs = |v: &[String]| -> Vec<(String, String)> {
        v.chunks(2).map(|c| (c[0].clone(), c[1].clone())).collect()
    };
    let pods = pairs(&args.pod);
    let config = WakeConfig {
        target: args.target.trim_end_matches('/').to_owned(),
        registration_tokens: pods.iter().map(|(t, _)| t.clone()).collect(),
        controls: pods
            .iter()
            .map(|(_, u)| u.trim_end_matches('/').to_owned())
            .collect(),
        runners: args.runners,
        connections: args.connections.unwrap_or(args.runners.div_ceil(50)),
        samples: args.samples,
        held: pairs(&args.held),
        mode: if args.mode == "rest" {
            Mode::Rest
        } else {
            Mode::Router
        },
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let report = rt.block_on(podgate_loadtest::wake::run(config))?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(if report.lost == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Flags of `podgate loadtest runners`.
#[derive(Debug, Args)]
pub(crate) struct RunnersArgs {
    /// The proxy (or a Pod), e.g. http://127.0.0.1:8080.
    #[arg(long)]
    pub(crate) target: String,
    /// Registration tokens (one per Pod; runners are spread over them).
    #[arg(long = "registration-token", required = true)]
    pub(crate) registration_tokens: Vec<String>,
    /// How many runners.
    #[arg(long, default_value_t = 100)]
    pub(crate) runners: usize,
    /// How long, e.g. 60s or 5m.
    #[arg(long, default_value = "60s", value_parser = super::parse_duration_secs)]
    pub(crate) duration: u64,
    /// Share of old runners (token in the body only), 0 to 1.
    #[arg(long, default_value_t = 0.5)]
    pub(crate) old_share: f64,
    /// Artifact bytes uploaded per job (0: none).
    #[arg(long, default_value_t = 16 * 1024)]
    pub(crate) artifact_bytes: usize,
    /// Trace patches per job.
    #[arg(long, default_value_t = 3)]
    pub(crate) trace_patches: usize,
    /// How often each runner asks for a job when idle (gitlab-runner's
    /// `check_interval`), e.g. 3s. Runner starts are spread over the first one.
    #[arg(long, default_value = "3s", value_parser = super::parse_duration_secs)]
    pub(crate) check_interval: u64,
    /// Workers per runner: jobs run at once (gitlab-runner's `concurrent`).
    #[arg(long, default_value_t = 2)]
    pub(crate) concurrent: usize,
    /// `jobs/request` calls of one runner in flight at once (gitlab-runner's
    /// `request_concurrency`).
    #[arg(long, default_value_t = 1)]
    pub(crate) request_concurrency: usize,
    /// No immediate re-request after a job: ask only every `--check-interval`
    /// (gitlab-runner's `strict_check_interval`).
    #[arg(long)]
    pub(crate) strict_check_interval: bool,
    /// A tag set, `TAG[,TAG…][:untagged]` (repeatable; runners take them in turn on
    /// each Pod). Without `:untagged` a runner with tags runs tagged jobs only, as
    /// `gitlab-runner register` does: `docker,linux`, `docker:untagged`, `:untagged`
    /// (no tags). Default: `:untagged`, `docker:untagged`, `docker,linux`, `gpu`.
    #[arg(long = "tag-set", value_parser = parse_tag_set)]
    pub(crate) tag_sets: Vec<TagSet>,
    /// Jobs per second queued over all Pods, for the predicted `jobs/request` rate
    /// (default: the measured rate of jobs handed out).
    #[arg(long)]
    pub(crate) job_rate: Option<f64>,
    /// Share of the runners, 0 to 1, with gitlab-runner's `FF_USE_JOB_ROUTER` on: they
    /// ask the Job Router that `runners/router/discovery` names (`GetJob` over gRPC)
    /// and fall back to `jobs/request` as gitlab-runner does.
    #[arg(long, default_value_t = 0.0, value_parser = parse_share)]
    pub(crate) job_router_share: f64,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
}

/// A share of the runners: a number from 0 to 1 (clap names the flag in its error).
pub(crate) fn parse_share(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a share between 0 and 1")),
    }
}

fn parse_tag_set(s: &str) -> Result<TagSet, String> {
    fleet::parse_tag_set(s).map_err(|e| e.to_string())
}

impl RunnersArgs {
    pub(crate) fn config(&self) -> FleetConfig {
        let mut c = FleetConfig::new(
            self.target.clone(),
            self.registration_tokens.clone(),
            self.runners,
            Duration::from_secs(self.duration),
        );
        c.old_share = self.old_share;
        c.artifact_bytes = self.artifact_bytes;
        c.trace_patches = self.trace_patches;
        c.check_interval = Duration::from_secs(self.check_interval);
        c.concurrent = self.concurrent;
        c.request_concurrency = self.request_concurrency;
        c.strict_check_interval = self.strict_check_interval;
        if !self.tag_sets.is_empty() {
            c.tag_sets = self.tag_sets.clone();
        }
        c.job_rate = self.job_rate;
        c.job_router_share = self.job_router_share;
        c
    }
}

/// A one-line progress bar on stderr, redrawn every second until the task is dropped.
pub(crate) fn progress_bar(
    progress: Arc<Progress>,
    total: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let started = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            let done = started.elapsed().as_secs_f64() / total.as_secs_f64().max(1e-9);
            let filled = ((done.min(1.0)) * 30.0) as usize;
            eprint!(
                "\r[{}{}] {:>4.0} s  requests {:>8}  jobs {:>6}  misroutes {}  unexpected {}   ",
                "#".repeat(filled),
                ".".repeat(30 - filled),
                started.elapsed().as_secs_f64(),
                progress.requests.load(Ordering::Relaxed),
                progress.jobs.load(Ordering::Relaxed),
                progress.misroutes.load(Ordering::Relaxed),
                progress.unexpected.load(Ordering::Relaxed),
            );
        }
    })
}

fn http(args: HttpArgs) -> anyhow::Result<ExitCode> {
    let headers = args
        .headers
        .iter()
        .map(|h| {
            h.split_once(':')
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .with_context(|| format!("--header {h:?}: expected `name: value`"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let config = podgate_loadtest::open_loop::OpenLoopConfig {
        url: args.url,
        method: args.method,
        headers,
        body: args.body.into(),
        rate: args.rate,
        duration: Duration::from_secs(args.duration),
        max_in_flight: args.max_in_flight,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let report = rt.block_on(podgate_loadtest::open_loop::run(config))?;
    print!("{}", report.table());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report.to_json())?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn run(cmd: LoadtestCommand) -> anyhow::Result<ExitCode> {
    let args = match cmd {
        LoadtestCommand::Runners(args) => args,
        LoadtestCommand::Http(args) => return http(args),
        LoadtestCommand::Agents(args) => return super::loadtest_agents::run(args),
        LoadtestCommand::Wake(args) => return wake(args),
        LoadtestCommand::Drill(cmd) => return super::drill::run(cmd),
    };
    let config = args.config();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let progress = Arc::new(Progress::default());
        let bar = progress_bar(progress.clone(), config.duration);
        let cancel = super::shutdown_signal();
        let report = fleet::run(config, progress, cancel).await?;
        bar.abort();
        eprintln!();
        print!("{}", report.table());
        if let Some(path) = &args.json {
            std::fs::write(path, serde_json::to_string_pretty(&report.to_json())?)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(if report.misroutes == 0 && report.unexpected() == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        })
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        runners: RunnersArgs,
    }

    fn config(args: &[&str]) -> Result<FleetConfig, clap::Error> {
        let base = [
            "podgate",
            "--target",
            "http://127.0.0.1:1",
            "--registration-token",
            "r",
        ];
        Cli::try_parse_from(base.iter().chain(args)).map(|c| c.runners.config())
    }

    #[test]
    fn scheduling_flags_reach_the_fleet_config() {
        let c = config(&[
            "--check-interval",
            "5s",
            "--concurrent",
            "4",
            "--request-concurrency",
            "2",
            "--strict-check-interval",
            "--tag-set",
            "docker,linux",
            "--tag-set",
            "gpu:untagged",
            "--tag-set",
            ":untagged",
            "--job-rate",
            "100",
            "--job-router-share",
            "0.25",
        ])
        .unwrap();
        assert_eq!(c.check_interval, Duration::from_secs(5));
        assert_eq!((c.concurrent, c.request_concurrency), (4, 2));
        assert!(c.strict_check_interval);
        let s = |v: &[&str]| v.iter().map(|t| (*t).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            c.tag_sets,
            vec![
                (s(&["docker", "linux"]), false),
                (s(&["gpu"]), true),
                (s(&[]), true)
            ]
        );
        assert_eq!(c.job_rate, Some(100.0));
        assert_eq!(c.job_router_share, 0.25);
        c.validate().unwrap();
    }

    #[test]
    fn defaults_are_gitlab_runners() {
        let c = config(&[]).unwrap();
        assert_eq!(c.check_interval, fleet::DEFAULT_CHECK_INTERVAL);
        assert_eq!((c.concurrent, c.request_concurrency), (2, 1));
        assert_eq!(c.tag_sets, fleet::default_tag_sets());
        assert_eq!(c.job_rate, None);
        assert_eq!(c.job_router_share, 0.0);
        assert!(config(&["--tag-set", "docker:sometimes"]).is_err());
        for bad in ["2", "-0.1", "NaN", "half"] {
            let flag = format!("--job-router-share={bad}");
            let e = config(&[&flag]).unwrap_err().to_string();
            assert!(e.contains("--job-router-share"), "{e}");
        }
    }
}
