//! `podgate loadtest runners`: a fleet of simulated GitLab Runners.
//!
//! Each simulated runner is one `gitlab-runner` process with one `[[runners]]` entry,
//! and schedules its requests as gitlab-runner does (read in gitlab-runner's
//! `commands/multi.go`, `commands/builds_helper.go`, `commands/health_helper.go`,
//! `network/retry_requester.go`, `network/gitlab.go`, `network/client.go` and
//! `common/consts.go`):
//!
//! - a *feeder* offers the runner to a worker every `check_interval` (default 3 s) and
//!   waits for a free one (gitlab-runner's unbuffered channel);
//! - `concurrent` workers (default 2); a worker takes a *request slot*
//!   (`request_concurrency`, default 1) or gives up at once, asks `jobs/request`, and
//!   on a job offers the runner again to an idle worker (if there is one) before it runs
//!   the job, so a runner that gets jobs asks again at once;
//! - 408, 429, 500, 502, 503, 504 and ≥ 512 are retried up to 5 attempts with
//!   exponential back-off (or as `RateLimit-ResetTime` / `Retry-After` say);
//! - three 403s in a row make the runner unhealthy: it is not fed for 60 minutes;
//! - the `X-GitLab-Last-Update` ticket is kept when a response carries one.
//!
//! A share of the runners ([`FleetConfig::job_router_share`]) have gitlab-runner's
//! `FF_USE_JOB_ROUTER` on: they ask kas's Job Router (`GetJob` over gRPC) for jobs
//! where discovery names one, and fall back to `jobs/request` as gitlab-runner does
//! (`router`).
//!
//! Runners register (tags and `run_untagged` from [`FleetConfig::tag_sets`]) and run
//! the jobs they get: running update, trace patches, an artifact upload, the final
//! update. A share of them are *old* runners that send their token in the body only
//! (JSON, multipart); the rest send `RUNNER-TOKEN` / `JOB-TOKEN` headers.
//!
//! The [`Report`] counts, per endpoint, statuses and HDR latency percentiles; a status
//! the protocol does not expect there is *unexpected*; a 403 naming another Pod is a
//! *misroute*. For `jobs/request` it tells held 204s (Workhorse, or the proxy at the
//! edge, ended a long poll) from
//! immediate ones (Rails answered a stale ticket), gives requests per runner per
//! minute, and sets the measured request rate beside the one the configuration
//! predicts.
//!
//! Layout: this file holds the configuration and [`run`]; `scheduler` the feeder,
//! workers and slots; `client` sending, recording and retries; `router` the Job
//! Router client; `job` running a job; `report` the report.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use thiserror::Error;

mod client;
mod job;
mod report;
mod router;
mod scheduler;

pub use report::{
    EndpointStats, EndpointSummary, Expected, Fallbacks, JobCounts, JobRouterCounts,
    JobsRequestCounts, RateSummary, Report, SchedulerCounts,
};

/// Fleet errors. A configuration error does not go away on retry.
#[derive(Debug, Error)]
pub enum Error {
    /// A configuration problem, naming the field.
    #[error("fleet configuration: {0}")]
    Config(String),
}

/// gitlab-runner's default `check_interval` (`CheckInterval` in `common/consts.go`).
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(3);

/// A runner's tags and whether it also runs untagged jobs (`tag_list`,
/// `run_untagged` at registration).
pub type TagSet = (Vec<String>, bool);

/// The default tag sets: `([], true)`, `(["docker"], true)`,
/// `(["docker","linux"], false)`, `(["gpu"], false)`, so every tag set the Pod
/// simulator gives its jobs by default has runners.
pub fn default_tag_sets() -> Vec<TagSet> {
    let tags = |t: &[&str]| t.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    vec![
        (tags(&[]), true),
        (tags(&["docker"]), true),
        (tags(&["docker", "linux"]), false),
        (tags(&["gpu"]), false),
    ]
}

/// Parses a tag set written `TAG[,TAG…][:untagged]`.
///
/// Without the suffix the runner runs untagged jobs only when it has no tags, as
/// `gitlab-runner register` decides `run_untagged` by default. So `docker,linux` runs
/// jobs tagged with a subset of `docker,linux` only; `docker:untagged` runs untagged
/// jobs too; `:untagged` (or an empty string) is a runner without tags.
pub fn parse_tag_set(s: &str) -> Result<TagSet, Error> {
    let (list, untagged) = match s.trim().rsplit_once(':') {
        Some((list, "untagged")) => (list, true),
        Some(_) => {
            return Err(Error::Config(format!(
                "tag set {s:?}: the only suffix is `:untagged`"
            )));
        }
        None => (s.trim(), false),
    };
    let tags: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect();
    let run_untagged = untagged || tags.is_empty();
    Ok((tags, run_untagged))
}

/// A fleet run.
#[derive(Clone, Debug)]
pub struct FleetConfig {
    /// The proxy (or a Pod), e.g. `http://127.0.0.1:8080`.
    pub target: String,
    /// Registration tokens; runner `n` registers with `tokens[n % len]`.
    pub registration_tokens: Vec<String>,
    /// How many runners.
    pub runners: usize,
    /// How long to run.
    pub duration: Duration,
    /// Share of old runners (token in the body only), 0..=1.
    pub old_share: f64,
    /// Bytes of artifact each job uploads (0: none).
    pub artifact_bytes: usize,
    /// Trace patches per job.
    pub trace_patches: usize,
    /// How often each runner's feeder offers it to a worker (gitlab-runner's
    /// `check_interval`; default 3 s). Runner starts are spread over the first one.
    pub check_interval: Duration,
    /// Workers per runner process: jobs run (and requests made) at once (gitlab-runner's
    /// `concurrent`; default 2).
    pub concurrent: usize,
    /// `jobs/request` calls of one runner in flight at once (gitlab-runner's
    /// `request_concurrency`; default 1).
    pub request_concurrency: usize,
    /// Tag sets; runner `n` takes `tag_sets[(n / registration_tokens.len()) % len]`, so
    /// every Pod gets every tag set. Default [`default_tag_sets`].
    pub tag_sets: Vec<TagSet>,
    /// No immediate re-request after a job (gitlab-runner's `strict_check_interval`;
    /// default false).
    pub strict_check_interval: bool,
    /// Jobs per second queued over all Pods, for the predicted `jobs/request` rate
    /// (`None`: the measured rate of jobs handed out).
    pub job_rate: Option<f64>,
    /// Share of the runners, 0..=1, with gitlab-runner's `FF_USE_JOB_ROUTER` on: they
    /// ask the Job Router that `runners/router/discovery` names and fall back to
    /// `jobs/request` (default 0: none). They are the last runners, so the old ones
    /// (the first [`old_share`](Self::old_share)) are taken last.
    pub job_router_share: f64,
}

impl FleetConfig {
    /// A fleet with every other field at its default: half old runners, 16 KiB
    /// artifacts, 3 trace patches, gitlab-runner's scheduling defaults and
    /// [`default_tag_sets`].
    pub fn new(
        target: impl Into<String>,
        registration_tokens: Vec<String>,
        runners: usize,
        duration: Duration,
    ) -> Self {
        FleetConfig {
            target: target.into(),
            registration_tokens,
            runners,
            duration,
            old_share: 0.5,
            artifact_bytes: 16 * 1024,
            trace_patches: 3,
            check_interval: DEFAULT_CHECK_INTERVAL,
            concurrent: 2,
            request_concurrency: 1,
            tag_sets: default_tag_sets(),
            strict_check_interval: false,
            job_rate: None,
            job_router_share: 0.0,
        }
    }

    /// Every problem, each naming its field.
    pub fn validate(&self) -> Result<(), Error> {
        let mut bad = Vec::new();
        if !self.target.starts_with("http://") {
            bad.push(format!("target = {:?}: an http:// URL", self.target));
        }
        if self.registration_tokens.is_empty() {
            bad.push("registration_tokens: at least one".into());
        }
        if self.runners == 0 {
            bad.push("runners: at least 1".into());
        }
        if !(0.0..=1.0).contains(&self.old_share) {
            bad.push(format!("old_share = {}: between 0 and 1", self.old_share));
        }
        if !(0.0..=1.0).contains(&self.job_router_share) {
            bad.push(format!(
                "job_router_share = {}: between 0 and 1",
                self.job_router_share
            ));
        }
        if self.check_interval.is_zero() {
            bad.push("check_interval: more than 0".into());
        }
        if self.concurrent == 0 {
            bad.push("concurrent: at least 1".into());
        }
        if self.request_concurrency == 0 {
            bad.push("request_concurrency: at least 1".into());
        }
        if self.tag_sets.is_empty() {
            bad.push("tag_sets: at least one (([], true) is a runner without tags)".into());
        }
        for (i, (tags, run_untagged)) in self.tag_sets.iter().enumerate() {
            // GitLab refuses it: "Tags list can not be empty when runner is not allowed
            // to pick untagged jobs" (app/models/ci/runner.rb).
            if tags.is_empty() && !run_untagged {
                bad.push(format!(
                    "tag_sets[{i}]: no tags and run_untagged = false runs nothing"
                ));
            }
            if let Some(t) = tags.iter().find(|t| t.is_empty() || t.contains(',')) {
                bad.push(format!("tag_sets[{i}]: tag {t:?} is empty or has a comma"));
            }
        }
        if let Some(rate) = self.job_rate
            && !(rate.is_finite() && rate >= 0.0)
        {
            bad.push(format!("job_rate = {rate}: a rate of 0 or more"));
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(Error::Config(bad.join("; ")))
        }
    }

    /// Runner `n`'s registration token.
    fn registration_token(&self, n: usize) -> &str {
        &self.registration_tokens[n % self.registration_tokens.len()]
    }

    /// Runner `n`'s tag set.
    fn tag_set(&self, n: usize) -> &TagSet {
        &self.tag_sets[(n / self.registration_tokens.len()) % self.tag_sets.len()]
    }

    /// Whether runner `n` is old (token in the body only).
    fn is_old(&self, n: usize) -> bool {
        (n as f64) < self.old_share * self.runners as f64
    }

    /// Whether runner `n` uses the Job Router: the last `job_router_share` of them.
    fn uses_job_router(&self, n: usize) -> bool {
        ((self.runners - 1 - n) as f64) < self.job_router_share * self.runners as f64
    }
}

/// Live counters, readable while the fleet runs.
#[derive(Debug, Default)]
pub struct Progress {
    /// Requests answered.
    pub requests: AtomicU64,
    /// Jobs run to success.
    pub jobs: AtomicU64,
    /// Misroutes seen.
    pub misroutes: AtomicU64,
    /// Unexpected statuses seen.
    pub unexpected: AtomicU64,
    /// Job Router fallbacks to REST so far, by registration token (its index in
    /// [`FleetConfig::registration_tokens`]) and reason.
    job_router_fallbacks: std::sync::Mutex<std::collections::BTreeMap<(usize, &'static str), u64>>,
}

impl Progress {
    /// The fallbacks as gitlab-runner exposes them
    /// (`gitlab_runner_job_router_fallbacks_total{reason}`, `router/metrics.go`),
    /// here for a whole fleet: a `pod` label from `pod_of(registration token index)`.
    pub fn job_router_fallbacks_metrics(&self, pod_of: impl Fn(usize) -> String) -> String {
        let counts = self.job_router_fallbacks.lock().expect("progress lock");
        let mut by_pod = std::collections::BTreeMap::<(String, &str), u64>::new();
        for (&(token, reason), &n) in counts.iter() {
            *by_pod.entry((pod_of(token), reason)).or_default() += n;
        }
        let mut out = String::from(
            "# HELP gitlab_runner_job_router_fallbacks_total Total number of job requests that fell back from the job router to direct GitLab polling, partitioned by reason.\n\
             # TYPE gitlab_runner_job_router_fallbacks_total counter\n",
        );
        for ((pod, reason), n) in by_pod {
            out.push_str(&format!(
                "gitlab_runner_job_router_fallbacks_total{{pod=\"{pod}\",reason=\"{reason}\"}} {n}\n"
            ));
        }
        out
    }

    fn count_fallback(&self, token: usize, reason: &'static str) {
        *self
            .job_router_fallbacks
            .lock()
            .expect("progress lock")
            .entry((token, reason))
            .or_default() += 1;
    }
}

/// What every runner shares: the HTTP client, the report being filled, the stop flag.
struct Shared {
    client: Client<HttpConnector, Full<Bytes>>,
    target: String,
    report: std::sync::Mutex<Report>,
    progress: Arc<Progress>,
    stop: AtomicBool,
    config: FleetConfig,
    /// Per runner: when it started and its `jobs/request` attempts.
    runners: Vec<scheduler::RunnerCounters>,
    counters: scheduler::Counters,
}

impl Shared {
    /// Count a job event of runner `n` under its registration token (its Pod).
    fn count_job(&self, n: usize, count: impl FnOnce(&mut JobCounts)) {
        let pod = n % self.config.registration_tokens.len();
        let mut report = self.report.lock().expect("report lock");
        if report.jobs_by_pod.len() <= pod {
            report.jobs_by_pod.resize(pod + 1, JobCounts::default());
        }
        count(&mut report.jobs_by_pod[pod]);
    }

    /// Count a Job Router event of runner `n` under its registration token (its Pod).
    /// Count a fallback of runner `n` to REST, in the report and the progress.
    fn count_fallback(&self, n: usize, reason: router::Fallback) {
        let token = n % self.config.registration_tokens.len();
        self.progress.count_fallback(token, reason.label());
        self.count_router(n, |c| c.fallbacks.count(reason));
    }

    fn count_router(&self, n: usize, count: impl FnOnce(&mut JobRouterCounts)) {
        let pod = n % self.config.registration_tokens.len();
        let mut report = self.report.lock().expect("report lock");
        if report.job_router_by_pod.len() <= pod {
            report
                .job_router_by_pod
                .resize(pod + 1, JobRouterCounts::default());
        }
        count(&mut report.job_router_by_pod[pod]);
    }
}

/// Run the fleet until `config.duration` passes (or `cancel` resolves).
pub async fn run(
    config: FleetConfig,
    progress: Arc<Progress>,
    cancel: impl std::future::Future<Output = ()>,
) -> Result<Report, Error> {
    config.validate()?;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let per_runner = config.concurrent + config.request_concurrency;
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(config.runners.saturating_mul(per_runner))
        .build(connector);
    let shared = Arc::new(Shared {
        client,
        target: config.target.trim_end_matches('/').to_owned(),
        report: std::sync::Mutex::default(),
        progress,
        stop: AtomicBool::new(false),
        runners: (0..config.runners)
            .map(|_| scheduler::RunnerCounters::default())
            .collect(),
        counters: scheduler::Counters::default(),
        config: config.clone(),
    });
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..config.runners {
        tasks.spawn(scheduler::runner(shared.clone(), n, started));
    }
    tokio::select! {
        _ = tokio::time::sleep(config.duration) => {}
        _ = cancel => {}
    }
    shared.stop.store(true, Ordering::SeqCst);
    // Long polls in flight would hold the end for up to a minute: cut them. Each
    // runner's workers live inside its task, so aborting it ends them too.
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    let ended = Instant::now();
    let mut report = std::mem::take(&mut *shared.report.lock().expect("report lock"));
    report
        .jobs_by_pod
        .resize(config.registration_tokens.len(), JobCounts::default());
    report.elapsed = ended - started;
    report.runners = config.runners;
    report.check_interval = config.check_interval;
    report.concurrent = config.concurrent;
    report.request_concurrency = config.request_concurrency;
    report.job_rate = config.job_rate;
    report.job_router_share = config.job_router_share;
    if config.job_router_share > 0.0 {
        report
            .job_router_by_pod
            .resize(config.registration_tokens.len(), JobRouterCounts::default());
    }
    report.scheduler = shared.counters.snapshot();
    report.runner_requests_per_minute = shared
        .runners
        .iter()
        .filter_map(|r| r.per_minute(ended))
        .collect();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_sets_parse_as_documented() {
        let s = |v: &[&str]| v.iter().map(|t| (*t).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            parse_tag_set("docker,linux").unwrap(),
            (s(&["docker", "linux"]), false)
        );
        assert_eq!(
            parse_tag_set("docker:untagged").unwrap(),
            (s(&["docker"]), true)
        );
        assert_eq!(parse_tag_set(":untagged").unwrap(), (s(&[]), true));
        assert_eq!(parse_tag_set("").unwrap(), (s(&[]), true));
        assert!(parse_tag_set("docker:tagged").is_err());
    }

    #[test]
    fn validate_names_every_bad_field() {
        let mut c = FleetConfig::new("http://127.0.0.1:1", vec!["t".into()], 1, Duration::ZERO);
        assert!(c.validate().is_ok());
        c.check_interval = Duration::ZERO;
        c.concurrent = 0;
        c.request_concurrency = 0;
        c.tag_sets = vec![(vec![], false)];
        c.job_rate = Some(-1.0);
        c.job_router_share = 1.5;
        let e = c.validate().unwrap_err().to_string();
        for field in [
            "job_router_share",
            "check_interval",
            "concurrent",
            "request_concurrency",
            "tag_sets[0]",
            "job_rate",
        ] {
            assert!(e.contains(field), "{field} not named: {e}");
        }
    }

    #[test]
    fn runners_spread_over_tokens_then_tag_sets() {
        let c = FleetConfig::new(
            "http://127.0.0.1:1",
            vec!["a".into(), "b".into(), "c".into()],
            12,
            Duration::ZERO,
        );
        // Every Pod (token) gets every tag set.
        for token in 0..3 {
            let sets: Vec<_> = (0..12)
                .filter(|n| n % 3 == token)
                .map(|n| c.tag_set(n).clone())
                .collect();
            assert_eq!(sets, default_tag_sets());
        }
    }

    #[test]
    fn job_router_runners_are_the_last_ones() {
        let mut c = FleetConfig::new("http://127.0.0.1:1", vec!["a".into()], 10, Duration::ZERO);
        assert!((0..10).all(|n| !c.uses_job_router(n)));
        c.job_router_share = 0.3;
        let on: Vec<usize> = (0..10).filter(|&n| c.uses_job_router(n)).collect();
        assert_eq!(on, [7, 8, 9]);
        c.job_router_share = 1.0;
        assert!((0..10).all(|n| c.uses_job_router(n)));
    }
}
