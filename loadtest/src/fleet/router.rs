//! A runner with `FF_USE_JOB_ROUTER` on: it asks kas's Job Router for jobs over gRPC
//! and falls back to REST `jobs/request` as gitlab-runner does.
//!
//! Read in gitlab-runner at `d79f3e7b` (GitHub mirror `gitlabhq/gitlab-runner`):
//! - `router/client.go` `RequestJob`: discovery (cached an hour, a failed one too),
//!   the breaker's gate, the dial, `GetJob` with the REST body as `job_request`, and
//!   the fallbacks (`no_discovery`, `breaker_open`, `dial_failed`, `breaker_tripped`,
//!   `router_disabled`); `handleRouterError` sorts the gRPC codes;
//! - `network/gitlab.go` `GetRouterDiscovery` (through the retrying client, as every
//!   REST call: 200 names `server_url`, anything else is no router),
//!   `PrepareJobRequest` and `SetLastUpdate` (an empty value is ignored,
//!   `network/client.go` `setLastUpdateValue`);
//! - `router/client_conn_factory.go`: one connection at a time, kept while the URL
//!   and token are the same; `grpc.NewClient` does not connect, so a dial fails only
//!   on a URL it cannot use (an unknown scheme): a kas that does not answer shows as
//!   `UNAVAILABLE` calls, which the breaker counts;
//! - `router/token_creds.go`: `authorization: Bearer <token>` and `gitlab-agent-type:
//!   runner` on every call, beside `x-request-id`;
//! - `helpers/circuitbreaker/circuitbreaker.go`: [`Breaker`].
//!
//! Dialling is agentk's ([`podgate_agent::transport::kas_channel`]): h2c for
//! `grpc://`, gRPC in a WebSocket (`ws-tunnel`, the bearer token on the upgrade) for
//! `ws://`, and the same over TLS — as `router/client_conn_factory.go` dials. Unlike
//! gitlab-runner it pings every 30 s (agentk's interval) instead of 55 s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http::Method;
use podgate_agent::proto::gitlab::agent::job_router::rpc::GetJobRequest;
use podgate_agent::proto::gitlab::agent::job_router::rpc::job_router_client::JobRouterClient;
use podgate_agent::transport::{Dial, kas_channel};
use serde_json::Value;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::Shared;
use super::client::LAST_UPDATE;
use super::report::JobRouterCounts;
use super::scheduler::Runner;

/// How long a discovery answer (or its absence) is kept (`discoveryTTL`).
pub(super) const DISCOVERY_TTL: Duration = Duration::from_secs(60 * 60);

/// Failures in a row that may trip the breaker (`routerBreakerFailureThreshold`).
pub(super) const BREAKER_THRESHOLD: u32 = 3;

/// How long the breaker stays open before a trial call (`routerBreakerOpenTimeout`).
pub(super) const BREAKER_OPEN: Duration = Duration::from_secs(30);

/// How long failures must persist before they trip the breaker
/// (`routerBreakerFailureGrace`).
pub(super) const BREAKER_GRACE: Duration = Duration::from_secs(5);

/// `GetJob`'s deadline: longer than kas's 50 s hold of a call with nothing new.
pub(super) const GET_JOB_DEADLINE: Duration = Duration::from_secs(60);

/// The path of discovery (GitLab 18.7+).
const DISCOVERY_PATH: &str = "/api/v4/runners/router/discovery";

/// Why a call went to REST `jobs/request` instead (the `reason` label of
/// `gitlab_runner_job_router_fallbacks_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fallback {
    /// Discovery named no router (403, 501, an error), cached an hour.
    NoDiscovery,
    /// The breaker is open (or a trial call is under way).
    BreakerOpen,
    /// The router's URL could not be dialled.
    DialFailed,
    /// This call's failure tripped the breaker.
    BreakerTripped,
    /// The router answered `UNIMPLEMENTED`: it is off; discovery is dropped.
    RouterDisabled,
}

impl Fallback {
    /// gitlab-runner's `reason` label (`router/metrics.go`).
    pub(super) fn label(self) -> &'static str {
        match self {
            Fallback::NoDiscovery => "no_discovery",
            Fallback::BreakerOpen => "breaker_open",
            Fallback::DialFailed => "dial_failed",
            Fallback::BreakerTripped => "breaker_tripped",
            Fallback::RouterDisabled => "router_disabled",
        }
    }
}

/// What a runner's turn at the router came to.
#[derive(Debug)]
pub(super) enum Routed {
    /// Ask REST `jobs/request` instead, for this reason.
    Fallback(Fallback),
    /// A job, handled as a REST 201's body.
    Job(Value),
    /// No job this turn; whether the runner stays healthy (`markHealth`).
    NoJob {
        /// False for an error the router answered (not an availability one).
        healthy: bool,
    },
}

/// The breaker's states (`circuitbreaker.State`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Closed,
    Open,
    HalfOpen,
}

/// gitlab-runner's circuit breaker (`helpers/circuitbreaker/circuitbreaker.go`):
/// [`BREAKER_THRESHOLD`] failures in a row, the first at least [`BREAKER_GRACE`]
/// before the last, open it for [`BREAKER_OPEN`]; then one trial call goes through,
/// whose success closes it and whose failure opens it again.
#[derive(Debug)]
pub(super) struct Breaker {
    state: State,
    failures: u32,
    first_failure_at: Instant,
    opened_at: Instant,
}

impl Breaker {
    /// A closed breaker.
    pub(super) fn new(now: Instant) -> Self {
        Breaker {
            state: State::Closed,
            failures: 0,
            first_failure_at: now,
            opened_at: now,
        }
    }

    /// `Allow`: whether a call may go to the router. An open breaker past its
    /// timeout turns half-open and lets this one call through as the trial.
    pub(super) fn allow(&mut self, now: Instant) -> bool {
        match self.state {
            State::Open if now.saturating_duration_since(self.opened_at) >= BREAKER_OPEN => {
                self.state = State::HalfOpen;
                true
            }
            State::Open | State::HalfOpen => false,
            State::Closed => true,
        }
    }

    /// `RecordSuccess`: closed again; true when a trial call recovered it.
    pub(super) fn record_success(&mut self) -> bool {
        let recovered = self.state == State::HalfOpen;
        self.failures = 0;
        self.state = State::Closed;
        recovered
    }

    /// `RecordFailure`: true when this failure opened the breaker.
    pub(super) fn record_failure(&mut self, now: Instant) -> bool {
        match self.state {
            State::HalfOpen => {
                self.open(now);
                true
            }
            State::Open => false,
            State::Closed => {
                if self.failures == 0 {
                    self.first_failure_at = now;
                }
                self.failures += 1;
                let persisted = now.saturating_duration_since(self.first_failure_at);
                if self.failures >= BREAKER_THRESHOLD && persisted >= BREAKER_GRACE {
                    self.open(now);
                    return true;
                }
                false
            }
        }
    }

    fn open(&mut self, now: Instant) {
        self.state = State::Open;
        self.opened_at = now;
    }
}

/// A connection to the router, kept while URL and token are the same.
struct Conn {
    url: String,
    token: String,
    channel: Channel,
}

/// One runner's Job Router client (`router.Client`: one per runner process).
pub(super) struct RouterClient {
    /// The cached discovery: the router's URL (`None`: none) and when it expires.
    /// Held across the discovery request, as `getRouterDiscovery` holds its mutex.
    discovery: tokio::sync::Mutex<Option<(Option<String>, Instant)>>,
    breaker: std::sync::Mutex<Breaker>,
    conn: std::sync::Mutex<Option<Conn>>,
    /// Numbers `x-request-id`s.
    calls: AtomicU64,
}

impl RouterClient {
    /// A client with nothing discovered yet.
    pub(super) fn new() -> Self {
        RouterClient {
            discovery: tokio::sync::Mutex::new(None),
            breaker: std::sync::Mutex::new(Breaker::new(Instant::now())),
            conn: std::sync::Mutex::new(None),
            calls: AtomicU64::new(0),
        }
    }

    /// `RequestJob` up to the fallback: discovery, the breaker's gate, the dial and
    /// `GetJob`. A [`Routed::Fallback`] is counted here; the caller then asks REST.
    pub(super) async fn request_job(&self, shared: &Shared, runner: &Runner) -> Routed {
        let routed = self.route(shared, runner).await;
        if let Routed::Fallback(reason) = routed {
            shared.count_fallback(runner.n, reason);
        }
        routed
    }

    async fn route(&self, shared: &Shared, runner: &Runner) -> Routed {
        let Some(url) = self.discover(shared, runner).await else {
            return Routed::Fallback(Fallback::NoDiscovery);
        };
        if !self.breaker().allow(Instant::now()) {
            return Routed::Fallback(Fallback::BreakerOpen);
        }
        let channel = match self.dial(&url, &runner.token) {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(runner = runner.n, url, error = %e, "job router dial failed");
                self.breaker().record_failure(Instant::now());
                return Routed::Fallback(Fallback::DialFailed);
            }
        };
        let (_, body) = super::scheduler::job_request_body(runner);
        let result = self.get_job(channel, runner, body.to_string()).await;
        if result.is_err() && shared.stop.load(Ordering::SeqCst) {
            // Cut by the end of the run: not a result.
            return Routed::NoJob { healthy: true };
        }
        shared.progress.requests.fetch_add(1, Ordering::Relaxed);
        match result {
            Ok((job, last_update)) => {
                self.breaker().record_success();
                runner.set_last_update(last_update.as_deref());
                self.answered(shared, runner, &job)
            }
            Err(status) => self.failed(shared, runner, &status).await,
        }
    }

    /// `parseJobResponse`: an empty answer is no job (healthy); a job that is not
    /// JSON is no job (unhealthy).
    fn answered(&self, shared: &Shared, runner: &Runner, job: &[u8]) -> Routed {
        if job.is_empty() {
            shared.count_router(runner.n, |c| {
                c.get_job += 1;
                c.empty += 1;
            });
            return Routed::NoJob { healthy: true };
        }
        match serde_json::from_slice::<Value>(job) {
            Ok(job) => {
                shared.count_router(runner.n, |c| {
                    c.get_job += 1;
                    c.jobs += 1;
                });
                Routed::Job(job)
            }
            Err(_) => {
                shared.count_router(runner.n, |c| {
                    c.get_job += 1;
                    c.error("INVALID_JOB_JSON");
                });
                Routed::NoJob { healthy: false }
            }
        }
    }

    /// `handleRouterError`: `UNIMPLEMENTED` drops discovery and falls back;
    /// availability failures count toward the breaker (falling back when one trips
    /// it); any other code is a failed request (the runner is unhealthy).
    async fn failed(&self, shared: &Shared, runner: &Runner, status: &Status) -> Routed {
        let code = status.code();
        shared.count_router(runner.n, |c| {
            c.get_job += 1;
            c.error(&format!("{code:?}"));
        });
        tracing::debug!(
            runner = runner.n,
            ?code,
            message = status.message(),
            "GetJob failed"
        );
        match code {
            Code::Unimplemented => {
                self.breaker().record_success();
                self.forget_discovery().await;
                Routed::Fallback(Fallback::RouterDisabled)
            }
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => {
                if self.breaker().record_failure(Instant::now()) {
                    Routed::Fallback(Fallback::BreakerTripped)
                } else {
                    Routed::NoJob { healthy: true }
                }
            }
            _ => {
                self.breaker().record_success();
                Routed::NoJob { healthy: false }
            }
        }
    }

    fn breaker(&self) -> std::sync::MutexGuard<'_, Breaker> {
        self.breaker.lock().expect("breaker lock")
    }

    /// `getRouterDiscovery`: the cached URL, or ask `runners/router/discovery` (a
    /// failed discovery is cached as long as a good one).
    async fn discover(&self, shared: &Shared, runner: &Runner) -> Option<String> {
        let mut cache = self.discovery.lock().await;
        if let Some((url, expires)) = &*cache
            && *expires > Instant::now()
        {
            return url.clone();
        }
        let header = [("runner-token", runner.token.as_str())];
        let answer = shared
            .call(
                runner.n,
                "runners_router_discovery",
                &[200, 403, 501],
                || shared.request(Method::GET, DISCOVERY_PATH, &header, bytes::Bytes::new()),
            )
            .await;
        let url = answer
            .filter(|a| a.status.as_u16() == 200)
            .and_then(|a| a.json()["server_url"].as_str().map(str::to_owned));
        *cache = Some((url.clone(), Instant::now() + DISCOVERY_TTL));
        url
    }

    /// `invalidateRouterDiscovery`.
    async fn forget_discovery(&self) {
        *self.discovery.lock().await = None;
    }

    /// `ClientConnFactory.Dial`: the kept connection while URL and token are the
    /// same, else a new one (which connects on its first call).
    fn dial(&self, url: &str, token: &str) -> Result<Channel, podgate_agent::transport::Error> {
        let mut conn = self.conn.lock().expect("conn lock");
        if let Some(c) = &*conn
            && c.url == url
            && c.token == token
        {
            return Ok(c.channel.clone());
        }
        // `newConn` knows these schemes only; agentk's dialler also takes http(s).
        let scheme = url.split_once("://").map_or("", |(s, _)| s);
        if !matches!(scheme, "grpc" | "grpcs" | "ws" | "wss") {
            return Err(podgate_agent::transport::Error::Url {
                url: url.to_owned(),
                why: "unsupported scheme in kas address",
            });
        }
        let channel = kas_channel(url, token, &Dial::default())?;
        *conn = Some(Conn {
            url: url.to_owned(),
            token: token.to_owned(),
            channel: channel.clone(),
        });
        Ok(channel)
    }

    /// One `GetJob` with the runner's metadata and [`GET_JOB_DEADLINE`]: the job
    /// bytes (empty: none) and `x-gitlab-last-update`.
    async fn get_job(
        &self,
        channel: Channel,
        runner: &Runner,
        job_request: String,
    ) -> Result<(Vec<u8>, Option<String>), Status> {
        let mut request = tonic::Request::new(GetJobRequest {
            job_request: job_request.into_bytes(),
        });
        request.set_timeout(GET_JOB_DEADLINE);
        let seq = self.calls.fetch_add(1, Ordering::Relaxed);
        let metadata = request.metadata_mut();
        let bearer = format!("Bearer {}", runner.token);
        let request_id = format!("fleet-{:06}-{seq:08}", runner.n);
        for (key, value) in [
            ("authorization", bearer.as_str()),
            ("gitlab-agent-type", "runner"),
            ("x-request-id", request_id.as_str()),
        ] {
            let value = value
                .parse()
                .map_err(|_| Status::invalid_argument(format!("metadata {key}")))?;
            metadata.insert(key, value);
        }
        let mut client = JobRouterClient::new(channel);
        let response = tokio::time::timeout(GET_JOB_DEADLINE, client.get_job(request))
            .await
            .map_err(|_| Status::deadline_exceeded("GetJob deadline"))??;
        let last_update = response
            .metadata()
            .get(LAST_UPDATE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        Ok((response.into_inner().job_response, last_update))
    }
}

impl JobRouterCounts {
    /// Counts a failed `GetJob` under its code.
    fn error(&mut self, code: &str) {
        self.errors += 1;
        *self.errors_by_code.entry(code.to_owned()).or_default() += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_failures_over_five_seconds_trip_the_breaker_for_thirty() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut b = Breaker::new(t0);
        assert!(b.allow(t0));
        assert!(!b.record_failure(t0));
        assert!(!b.record_failure(t0 + s(1)));
        // Three failures, but within the grace: a burst, not an outage.
        assert!(!b.record_failure(t0 + s(2)));
        assert!(b.allow(t0 + s(2)));
        assert!(b.record_failure(t0 + s(5)), "persisted 5 s: tripped");
        assert!(!b.allow(t0 + s(34)));
        // Past the open timeout one trial goes through, and no other.
        assert!(b.allow(t0 + s(35)));
        assert!(!b.allow(t0 + s(35)));
        // The trial fails: open again for another 30 s.
        assert!(b.record_failure(t0 + s(36)));
        assert!(!b.allow(t0 + s(65)));
        assert!(b.allow(t0 + s(66)));
        assert!(b.record_success(), "the trial recovered it");
        assert!(b.allow(t0 + s(66)));
    }

    #[test]
    fn a_success_resets_the_count() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut b = Breaker::new(t0);
        b.record_failure(t0);
        b.record_failure(t0 + s(1));
        assert!(!b.record_success());
        assert!(!b.record_failure(t0 + s(6)));
        assert!(!b.record_failure(t0 + s(7)));
        assert!(
            !b.record_failure(t0 + s(8)),
            "the grace counts from t0 + 6 s"
        );
        assert!(b.record_failure(t0 + s(11)));
    }
}
