//! GitLab's Job Router on kas's agent listener: runners call
//! `/gitlab.agent.job_router.rpc.JobRouter/GetJob` (h2c, `ws-tunnel` WebSocket or
//! TLS, as agentk dials) instead of polling `POST /api/v4/jobs/request`, and kas
//! answers from its Cell's Rails.
//!
//! What a runner sends and reads is gitlab-runner's `router/` package
//! (gitlab-org/gitlab-runner `router/client.go`, `router/token_creds.go`): metadata
//! `authorization: Bearer <runner token>`, `gitlab-agent-type: runner` and
//! `x-request-id`; `job_request` is the REST poll's JSON body. GitLab's own kas
//! module (`internal/module/job_router/`) is not public; where this module decides
//! what it does, it does what Workhorse and Rails do for the same poll:
//!
//! 1. the Cell's router off ([`JobRouterConfig::enabled`]): `UNIMPLEMENTED`, so the
//!    runner drops its discovery and polls REST (`handleRouterError`);
//! 2. a caller that is not a runner (`gitlab-agent-type`), no bearer token, a token
//!    podgate's classifier finds invalid, a `job_request` that is not JSON or names
//!    another token: refused at once (`UNAUTHENTICATED` / `INVALID_ARGUMENT`), Rails
//!    never asked;
//! 3. **the long poll is held here**, as Workhorse holds `jobs/request`
//!    (`workhorse/internal/builds/register.go`): a `last_update` that still equals
//!    the runner's queue key in the Cell's Redis waits on that key
//!    ([`podgate_registry::runner_queue::QueueWatch`], the watch the proxy's edge
//!    polls use), push-woken by Rails' `PUBLISH`. Rails is asked only when the key
//!    has changed (or differs already, or cannot be watched); a hold that ends
//!    answers empty with the same `last_update`, as Workhorse's 204. Holds last
//!    [`JobRouterConfig::hold`], shortened to end a second before the call's
//!    `grpc-timeout`; at most [`JobRouterConfig::max_held`] in all and
//!    [`JobRouterConfig::max_held_per_runner`] per runner, a call over either going
//!    to Rails at once (`limits.rs`);
//! 4. Rails' answer mapped as `rails.rs` says.
//!
//! A call whose client goes away is dropped by tonic: its waiter, its slot and the
//! Rails request in flight are released with it (counted `client_gone`).
//!
//! Metrics: `podgate_kas_job_router_calls_total{result}`,
//! `podgate_kas_job_router_holds_total{outcome}`, `podgate_kas_job_router_held`,
//! `podgate_kas_job_router_queue_redis_up`,
//! `podgate_kas_job_router_queue_redis_errors_total`,
//! `podgate_kas_job_router_notifications_total`. Logs name a runner by its token's
//! fingerprint only.

mod limits;
mod metrics;
mod rails;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use podgate_registry::runner_queue::{Outcome, QueueWatch, Stop};
use podgate_tokens::{Classification, Classifier, TokenKind};
use serde::Deserialize;
use tonic::{Request, Response, Status};

use crate::gitlab::GitlabClient;
use limits::Limits;
pub use metrics::JobRouterMetrics;
use metrics::{CallResult, HoldOutcome};
use podgate_agent::proto::gitlab::agent::job_router::rpc::job_router_server::JobRouter;
use podgate_agent::proto::gitlab::agent::job_router::rpc::{GetJobRequest, GetJobResponse};

/// [`JobRouterConfig::hold`] unless configured: Workhorse's long poll on GitLab.com
/// (`apiCiLongPollingDuration`, 50 s).
pub const DEFAULT_HOLD: Duration = Duration::from_secs(50);
/// [`JobRouterConfig::max_held`] unless configured.
pub const DEFAULT_MAX_HELD: usize = 50_000;
/// [`JobRouterConfig::max_held_per_runner`] unless configured (a runner's
/// `request_concurrency` is usually 1; a few more allow a restart's overlap).
pub const DEFAULT_MAX_HELD_PER_RUNNER: usize = 4;
/// A hold ends this long before the call's deadline, so Rails can still answer.
pub const DEADLINE_MARGIN: Duration = Duration::from_secs(1);

/// The Job Router on one kas (`[job_router]` in `kas.toml`).
#[derive(Clone, Debug)]
pub struct JobRouterConfig {
    /// Whether this Cell routes jobs through kas; off: `UNIMPLEMENTED`, and runners
    /// poll REST.
    pub enabled: bool,
    /// The Cell's Redis holding its runners' queue keys (`redis://…`, `unix://…`);
    /// none: every call goes to Rails, as with Workhorse's long polling off.
    pub runner_queue_redis: Option<String>,
    /// Longest a call is held.
    pub hold: Duration,
    /// Calls held at once, in all.
    pub max_held: usize,
    /// Calls held at once per runner token.
    pub max_held_per_runner: usize,
}

impl Default for JobRouterConfig {
    fn default() -> Self {
        JobRouterConfig {
            enabled: true,
            runner_queue_redis: None,
            hold: DEFAULT_HOLD,
            max_held: DEFAULT_MAX_HELD,
            max_held_per_runner: DEFAULT_MAX_HELD_PER_RUNNER,
        }
    }
}

/// What kas reads of a `job_request`; the bytes go to Rails as they came.
#[derive(Deserialize)]
struct JobRequest {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    last_update: Option<String>,
}

/// The `JobRouter` service.
pub struct JobRouterService {
    config: Option<JobRouterConfig>,
    gitlab: Option<Arc<GitlabClient>>,
    classifier: Arc<Classifier>,
    watch: Option<QueueWatch>,
    limits: Arc<Limits>,
    metrics: JobRouterMetrics,
}

impl JobRouterService {
    /// The service for `config` (`None`: the router is off here), asking Rails at
    /// `gitlab` and classifying tokens with `classifier`. Starts the queue watch
    /// (on the current runtime) when `runner_queue_redis` is set.
    pub fn new(
        config: Option<JobRouterConfig>,
        gitlab: Option<Arc<GitlabClient>>,
        classifier: Arc<Classifier>,
        metrics: JobRouterMetrics,
    ) -> JobRouterService {
        let config = config.filter(|c| c.enabled && gitlab.is_some());
        let watch = config
            .as_ref()
            .and_then(|c| c.runner_queue_redis.as_deref())
            .map(|url| QueueWatch::start("kas", url, metrics.watch()));
        let limits = config.as_ref().map_or_else(
            || Limits::new(0, 0),
            |c| Limits::new(c.max_held, c.max_held_per_runner),
        );
        JobRouterService {
            config,
            gitlab,
            classifier,
            watch,
            limits,
            metrics,
        }
    }

    /// Answer every held call now (kas is shutting down) and hold no more.
    pub fn shutdown(&self) {
        if let Some(w) = &self.watch {
            w.stop(Stop::Shutdown);
        }
    }

    /// Whether the queue watch is live (`None`: no watch configured).
    pub fn queue_watch_up(&self) -> Option<bool> {
        self.watch.as_ref().map(QueueWatch::is_up)
    }

    async fn get_job(
        &self,
        request: Request<GetJobRequest>,
        call: &mut metrics::Call<'_>,
    ) -> Result<Response<GetJobResponse>, Status> {
        let (Some(config), Some(gitlab)) = (&self.config, &self.gitlab) else {
            call.result = CallResult::Unimplemented;
            return Err(Status::unimplemented(
                "the Job Router is not enabled on this GitLab instance",
            ));
        };
        let md = request.metadata();
        let text = |name: &str| md.get(name).and_then(|v| v.to_str().ok());
        if text("gitlab-agent-type") != Some("runner") {
            call.result = CallResult::Unauthenticated;
            return Err(Status::unauthenticated(
                "GetJob is for runners (gitlab-agent-type: runner)",
            ));
        }
        let Some(token) = text("authorization")
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, t)| t.trim())
            .filter(|t| !t.is_empty())
        else {
            call.result = CallResult::Unauthenticated;
            return Err(Status::unauthenticated(
                "no runner token (authorization: Bearer <token>)",
            ));
        };
        if let Classification::Invalid { reason } = self
            .classifier
            .classify(token)
            .require_kind(&[TokenKind::Runner])
        {
            call.result = CallResult::Unauthenticated;
            return Err(Status::unauthenticated(format!(
                "invalid runner token: {reason}"
            )));
        }
        let token = token.to_owned();
        let request_id = text("x-request-id").unwrap_or_default().to_owned();
        let user_agent = text("user-agent").map(str::to_owned);
        let hold = hold_for(config.hold, text("grpc-timeout"));
        let bytes = request.into_inner().job_request;
        let parsed: JobRequest = match serde_json::from_slice(&bytes) {
            Ok(p) => p,
            Err(e) => {
                call.result = CallResult::Invalid;
                return Err(Status::invalid_argument(format!(
                    "job_request is not the JSON of a job request: {e}"
                )));
            }
        };
        if parsed.token.as_deref() != Some(token.as_str()) {
            call.result = CallResult::Unauthenticated;
            return Err(Status::unauthenticated(
                "job_request's token is not the caller's runner token",
            ));
        }
        let last_update = parsed.last_update.filter(|l| !l.is_empty());
        if let (Some(watch), Some(lu)) = (&self.watch, &last_update) {
            if hold.is_zero() {
                self.metrics.hold(HoldOutcome::Ineligible);
            } else if let Some(_slot) = self.limits.acquire(&token) {
                let outcome = watch.hold(&token, lu, hold, std::future::pending()).await;
                self.metrics.hold(outcome.into());
                if matches!(
                    outcome,
                    Outcome::Timeout | Outcome::NoChange | Outcome::Shutdown
                ) {
                    call.result = CallResult::Empty;
                    return Ok(rails::empty(lu, &request_id));
                }
            } else {
                self.metrics.hold(HoldOutcome::OverLimit);
            }
        } else {
            self.metrics.hold(HoldOutcome::Ineligible);
        }
        // Boxed: a held call's future is as large as its largest await, and Rails'
        // request (an HTTP client's) is larger than the hold; held calls are what
        // kas keeps by the thousand.
        let ask = Box::pin(rails::ask(
            gitlab,
            bytes,
            &token,
            &request_id,
            user_agent.as_deref(),
        ));
        let answer = match ask.await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(
                    runner = %podgate_tokens::fingerprint(&token),
                    error = %e,
                    "job router: GitLab did not answer a job request"
                );
                call.result = CallResult::Unavailable;
                return Err(Status::unavailable(format!("GitLab did not answer: {e}")));
            }
        };
        let (answered, response) = rails::answer(answer, &request_id);
        call.result = match (&answered, &response) {
            (rails::Answered::Job, _) => CallResult::Job,
            (rails::Answered::Empty, _) => CallResult::Empty,
            (_, Err(s)) => CallResult::from_code(s.code()),
            (_, Ok(_)) => CallResult::Empty,
        };
        response
    }
}

#[tonic::async_trait]
impl JobRouter for JobRouterService {
    async fn get_job(
        &self,
        request: Request<GetJobRequest>,
    ) -> Result<Response<GetJobResponse>, Status> {
        // Counted when it ends, or as `client_gone` when tonic drops it first.
        let mut call = self.metrics.call();
        let r = JobRouterService::get_job(self, request, &mut call).await;
        call.finish();
        r
    }
}

/// How long a call may be held: `hold`, or less so that it ends [`DEADLINE_MARGIN`]
/// before the call's deadline (gRPC's `grpc-timeout` header, as the client sent
/// it). Zero: do not hold.
fn hold_for(hold: Duration, grpc_timeout: Option<&str>) -> Duration {
    match grpc_timeout.and_then(parse_grpc_timeout) {
        Some(deadline) => hold.min(deadline.saturating_sub(DEADLINE_MARGIN)),
        None => hold,
    }
}

/// gRPC's `grpc-timeout` (`TimeoutValue TimeoutUnit`: up to 8 digits, then `H`,
/// `M`, `S`, `m`, `u` or `n`; gRPC's PROTOCOL-HTTP2.md).
fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

impl From<Outcome> for HoldOutcome {
    fn from(o: Outcome) -> Self {
        match o {
            Outcome::Timeout => HoldOutcome::Timeout,
            Outcome::Changed => HoldOutcome::Changed,
            Outcome::NoChange => HoldOutcome::NoChange,
            Outcome::Stale => HoldOutcome::Stale,
            Outcome::FailOpen => HoldOutcome::FailOpen,
            Outcome::ClientGone => HoldOutcome::ClientGone,
            Outcome::Shutdown => HoldOutcome::Shutdown,
        }
    }
}
