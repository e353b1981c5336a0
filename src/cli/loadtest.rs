//! `podgate loadtest runners`: a simulated runner fleet against a proxy or a Pod.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Args, Subcommand};
use podgate_loadtest::fleet::{self, FleetConfig, Progress};

/// `podgate loadtest …`.
#[derive(Debug, Subcommand)]
pub(crate) enum LoadtestCommand {
    /// Simulated GitLab Runners: register, long-poll, run jobs.
    Runners(RunnersArgs),
    /// Constant-rate HTTP requests, latencies corrected for coordinated omission.
    Http(HttpArgs),
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
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
}

impl RunnersArgs {
    pub(crate) fn config(&self) -> FleetConfig {
        FleetConfig {
            target: self.target.clone(),
            registration_tokens: self.registration_tokens.clone(),
            runners: self.runners,
            duration: Duration::from_secs(self.duration),
            old_share: self.old_share,
            artifact_bytes: self.artifact_bytes,
            trace_patches: self.trace_patches,
        }
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
