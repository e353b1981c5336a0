//! One simulated runner: registration, then gitlab-runner's feeder, workers and slots.
//!
//! gitlab-runner `commands/multi.go`:
//! - `feedRunners` offers each `[[runners]]` entry to the workers, then sleeps
//!   `check_interval / len(runners)` (one entry here: `check_interval`). The offer is a
//!   send on an *unbuffered* channel: it waits until one of the `concurrent` workers is
//!   idle. `feedRunner` first skips an unhealthy runner.
//! - A worker (`processRunner`) takes a build slot (`limit`; none here), then a request
//!   slot (`acquireRequest` in `commands/builds_helper.go`: `request_concurrency`,
//!   default 1; when all are taken it returns without a request), asks `jobs/request`,
//!   marks the runner's health, and on a job sends the running update, releases the
//!   request slot and *requeues* the runner (`requeueRunner`: a non-blocking send that
//!   succeeds only if a worker is idle, unless `strict_check_interval`) before running
//!   the job in this worker.
//!
//! Here an idle worker is a free permit of the runner's worker semaphore: the feeder
//! waits for one (`acquire_owned`), a requeue takes one only if it is free
//! (`try_acquire_owned`). Workers run inside the runner's task, so ending that task
//! ends its requests.
//!
//! Health (`commands/health_helper.go`): three unhealthy answers in a row
//! (`DefaultUnhealthyRequestsLimit`) and the runner is not fed until 60 minutes
//! (`DefaultUnhealthyInterval`) have passed since its last healthy answer (or its
//! start); then its count of failures starts again from 0. Which
//! answers are unhealthy is `RequestJob`'s call in `network/gitlab.go`: only 403 (and
//! the client's own errors); 204, 409, 503, other statuses and connection errors are
//! healthy.
//!
//! A runner with the Job Router on (`super::router`) asks it first, in the same worker
//! turn and under the same request slot (`router/client.go` wraps `RequestJob`); a
//! job it gets is handled as a `jobs/request` 201.

use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use http::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use super::Shared;
use super::client::{JOBS_REQUEST, LAST_UPDATE};
use super::report::SchedulerCounts;

/// Unhealthy answers in a row that stop the feeding (`DefaultUnhealthyRequestsLimit`).
pub(super) const UNHEALTHY_REQUESTS_LIMIT: u32 = 3;

/// How long an unhealthy runner is left alone (`DefaultUnhealthyInterval`).
pub(super) const UNHEALTHY_INTERVAL: Duration = Duration::from_secs(60 * 60);

/// One runner's counts, kept for the per-runner rates.
#[derive(Debug, Default)]
pub(super) struct RunnerCounters {
    /// When the runner started (after its share of the start spread).
    pub(super) started: OnceLock<Instant>,
    /// `jobs/request` attempts.
    pub(super) requests: AtomicU64,
}

impl RunnerCounters {
    /// `jobs/request` attempts per minute from its start to `end` (`None`: it had not
    /// started).
    pub(super) fn per_minute(&self, end: Instant) -> Option<f64> {
        let minutes = end
            .checked_duration_since(*self.started.get()?)?
            .as_secs_f64()
            / 60.0;
        Some(self.requests.load(Ordering::Relaxed) as f64 / minutes.max(1e-9))
    }
}

/// Scheduling events over the fleet.
#[derive(Debug, Default)]
pub(super) struct Counters {
    feeds: AtomicU64,
    feeds_unhealthy: AtomicU64,
    request_slot_full: AtomicU64,
    requeues: AtomicU64,
    requeues_no_idle_worker: AtomicU64,
    pub(super) retries: AtomicU64,
    runners_unhealthy: AtomicU64,
    registration_failures: AtomicU64,
}

impl Counters {
    /// The counts now.
    pub(super) fn snapshot(&self) -> SchedulerCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SchedulerCounts {
            feeds: get(&self.feeds),
            feeds_unhealthy: get(&self.feeds_unhealthy),
            request_slot_full: get(&self.request_slot_full),
            requeues: get(&self.requeues),
            requeues_no_idle_worker: get(&self.requeues_no_idle_worker),
            retries: get(&self.retries),
            runners_unhealthy: get(&self.runners_unhealthy),
            registration_failures: get(&self.registration_failures),
        }
    }
}

/// `healthData` of `commands/health_helper.go`.
#[derive(Debug)]
pub(super) struct Health {
    failures: u32,
    last_check: Instant,
}

impl Health {
    /// A healthy runner, checked at `now`.
    pub(super) fn new(now: Instant) -> Self {
        Health {
            failures: 0,
            last_check: now,
        }
    }

    /// `isHealthy`: fewer than the limit of failures, or the unhealthy interval has
    /// passed since the last check (then the count starts again).
    pub(super) fn is_healthy(&mut self, now: Instant) -> bool {
        if self.failures < UNHEALTHY_REQUESTS_LIMIT {
            return true;
        }
        if now.saturating_duration_since(self.last_check) > UNHEALTHY_INTERVAL {
            self.failures = 0;
            self.last_check = now;
            return true;
        }
        false
    }

    /// `markHealth`; true when this answer made the runner unhealthy.
    pub(super) fn mark(&mut self, healthy: bool, now: Instant) -> bool {
        if healthy {
            self.failures = 0;
            self.last_check = now;
            return false;
        }
        self.failures += 1;
        self.failures == UNHEALTHY_REQUESTS_LIMIT
    }
}

/// Whether `RequestJob` (`network/gitlab.go`) calls this answer healthy: all but 403
/// (status 0 is a connection error, which is healthy).
pub(super) fn healthy_answer(status: u16) -> bool {
    status != 403
}

/// A registered runner's state, shared by its feeder and workers.
pub(super) struct Runner {
    pub(super) n: usize,
    pub(super) old: bool,
    pub(super) token: String,
    pub(super) system_id: String,
    /// The ticket sent back as `last_update` (`network/client.go` `setLastUpdate`).
    last_update: Mutex<String>,
    health: Mutex<Health>,
    /// Idle workers (`concurrent`).
    workers: Arc<Semaphore>,
    /// Free request slots (`request_concurrency`).
    requests: Arc<Semaphore>,
    /// The Job Router client, when `FF_USE_JOB_ROUTER` is on.
    router: Option<super::router::RouterClient>,
}

impl Runner {
    /// `setLastUpdate`: keep the header's value only when it is present and non-empty
    /// (a 204 written by Workhorse has none; the old ticket stays).
    pub(super) fn set_last_update(&self, value: Option<&str>) {
        if let Some(v) = value.filter(|v| !v.is_empty()) {
            *self.last_update.lock().expect("last_update lock") = v.to_owned();
        }
    }

    fn last_update(&self) -> String {
        self.last_update.lock().expect("last_update lock").clone()
    }
}

/// gitlab-runner's `info` block.
pub(super) fn info() -> Value {
    json!({"name": "gitlab-runner", "version": "17.6.0", "revision": "podgate", "platform": "linux", "architecture": "amd64", "executor": "docker", "shell": "bash", "features": {"variables": true, "artifacts": true, "cache": true, "trace_checksum": true, "trace_size": true}})
}

/// Runner `n` until the run stops: wait for its share of the start spread, register,
/// then feed workers.
pub(super) async fn runner(shared: Arc<Shared>, n: usize, run_started: Instant) {
    let config = &shared.config;
    let offset = config
        .check_interval
        .mul_f64(n as f64 / config.runners as f64);
    tokio::time::sleep_until((run_started + offset).into()).await;
    let _ = shared.runners[n].started.set(Instant::now());
    let Some(token) = register(&shared, n).await else {
        return;
    };
    let runner = Arc::new(Runner {
        n,
        old: config.is_old(n),
        token,
        system_id: format!("s_{n:012x}"),
        last_update: Mutex::new(String::new()),
        health: Mutex::new(Health::new(Instant::now())),
        workers: Arc::new(Semaphore::new(config.concurrent)),
        requests: Arc::new(Semaphore::new(config.request_concurrency)),
        router: config
            .uses_job_router(n)
            .then(super::router::RouterClient::new),
    });
    // Each permit that arrives here is an idle worker the runner was handed to.
    let (tx, mut rx) = mpsc::unbounded_channel::<OwnedSemaphorePermit>();
    let mut feeder = pin!(feed(&shared, &runner, tx.clone()));
    let mut workers = FuturesUnordered::new();
    loop {
        tokio::select! {
            () = &mut feeder => return,
            Some(worker) = rx.recv() => {
                workers.push(process(&shared, &runner, worker, tx.clone()));
            }
            Some(()) = workers.next(), if !workers.is_empty() => {}
        }
    }
}

/// Registers runner `n` (retrying every `check_interval` until it works or the run
/// ends), with its tag set; the runner's token.
async fn register(shared: &Shared, n: usize) -> Option<String> {
    let config = &shared.config;
    let old = config.is_old(n);
    let registration = config.registration_token(n);
    let (tags, run_untagged) = config.tag_set(n);
    // gitlab-runner sends `tag_list` comma-separated and leaves it out when empty
    // (`RegisterRunnerParameters` in `common/network.go`).
    let mut body = json!({
        "token": registration,
        "description": format!("fleet-{n}"),
        "run_untagged": run_untagged,
        "locked": false,
        "paused": false,
        "info": info(),
    });
    if !tags.is_empty() {
        body["tag_list"] = Value::from(tags.join(","));
    }
    let header = [("runner-token", registration)];
    let headers: &[(&str, &str)] = if old { &[] } else { &header };
    loop {
        let answer = shared
            .call(n, "runners", &[201], || {
                shared.json_request(Method::POST, "/api/v4/runners", headers, &body)
            })
            .await;
        if let Some(a) = answer
            && a.status.as_u16() == 201
            && let Some(t) = a.json()["token"].as_str()
        {
            return Some(t.to_owned());
        }
        shared
            .counters
            .registration_failures
            .fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(config.check_interval).await;
    }
}

/// The feeder (`feedRunners` + `feedRunner`): every `check_interval`, a healthy runner
/// waits for an idle worker and hands itself over.
async fn feed(
    shared: &Shared,
    runner: &Runner,
    to_workers: mpsc::UnboundedSender<OwnedSemaphorePermit>,
) {
    loop {
        let healthy = runner
            .health
            .lock()
            .expect("health lock")
            .is_healthy(Instant::now());
        if healthy {
            let worker = runner
                .workers
                .clone()
                .acquire_owned()
                .await
                .expect("the semaphore is never closed");
            shared.counters.feeds.fetch_add(1, Ordering::Relaxed);
            if to_workers.send(worker).is_err() {
                return;
            }
        } else {
            shared
                .counters
                .feeds_unhealthy
                .fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(shared.config.check_interval).await;
    }
}

/// One worker's turn with the runner (`processRunner`), holding `_worker` throughout.
async fn process(
    shared: &Shared,
    runner: &Runner,
    _worker: OwnedSemaphorePermit,
    requeue: mpsc::UnboundedSender<OwnedSemaphorePermit>,
) {
    let Ok(request_slot) = runner.requests.clone().try_acquire_owned() else {
        shared
            .counters
            .request_slot_full
            .fetch_add(1, Ordering::Relaxed);
        return;
    };
    let (healthy, job) = poll(shared, runner).await;
    let now_unhealthy = runner
        .health
        .lock()
        .expect("health lock")
        .mark(healthy, Instant::now());
    if now_unhealthy {
        shared
            .counters
            .runners_unhealthy
            .fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            runner = runner.n,
            "runner unhealthy: not fed for 60 minutes"
        );
    }
    let job = match job {
        Some(payload) => {
            shared.count_job(runner.n, |c| c.received += 1);
            let job = super::job::start(shared, runner, payload).await;
            if job.is_none() {
                shared.count_job(runner.n, |c| c.not_run += 1);
            }
            job
        }
        None => None,
    };
    // `requestJob` covers the running update; the slot is released after it.
    drop(request_slot);
    let Some(job) = job else {
        return;
    };
    if !shared.config.strict_check_interval {
        let requeued = runner
            .workers
            .clone()
            .try_acquire_owned()
            .is_ok_and(|worker| requeue.send(worker).is_ok());
        let counter = if requeued {
            &shared.counters.requeues
        } else {
            &shared.counters.requeues_no_idle_worker
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
    super::job::finish(shared, runner, job).await;
}

/// One request for a job: through the Job Router when the runner has it on (and it
/// does not fall back), else `jobs/request`. Whether the answer is healthy, and the
/// job's payload if one came.
async fn poll(shared: &Shared, runner: &Runner) -> (bool, Option<Value>) {
    use super::router::Routed;
    if let Some(router) = &runner.router {
        match router.request_job(shared, runner).await {
            Routed::Job(payload) => return (true, Some(payload)),
            Routed::NoJob { healthy } => return (healthy, None),
            Routed::Fallback(_) => {}
        }
    }
    let answer = request_job(shared, runner).await;
    let status = answer.as_ref().map_or(0, |a| a.status.as_u16());
    let job = answer.filter(|_| status == 201).map(|a| a.json());
    (healthy_answer(status), job)
}

/// `PrepareJobRequest` (`network/gitlab.go`): the ticket sent and the body of
/// `jobs/request`, which is also the Job Router's `job_request`.
pub(super) fn job_request_body(runner: &Runner) -> (String, Value) {
    let sent = runner.last_update();
    let body = json!({
        "token": runner.token,
        "system_id": runner.system_id,
        "last_update": sent,
        "info": info(),
    });
    (sent, body)
}

/// `POST jobs/request` with the runner's ticket; the ticket is updated from the answer.
async fn request_job(shared: &Shared, runner: &Runner) -> Option<super::client::Answer> {
    let (sent, body) = job_request_body(runner);
    let header = [("runner-token", runner.token.as_str())];
    let headers: &[(&str, &str)] = if runner.old { &[] } else { &header };
    let answer = shared
        .call(runner.n, JOBS_REQUEST, &[201, 204, 409], || {
            shared.json_request(Method::POST, "/api/v4/jobs/request", headers, &body)
        })
        .await?;
    if answer.status == StatusCode::NO_CONTENT {
        shared.count_poll_204(&sent, &answer);
    }
    runner.set_last_update(answer.header(LAST_UPDATE));
    Some(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_unhealthy_answers_stop_feeding_for_an_hour() {
        let t0 = Instant::now();
        let mut h = Health::new(t0);
        assert!(!h.mark(false, t0));
        assert!(!h.mark(false, t0));
        assert!(h.is_healthy(t0), "two failures are not enough");
        assert!(h.mark(false, t0), "the third makes it unhealthy");
        assert!(!h.is_healthy(t0 + Duration::from_secs(59 * 60)));
        assert!(!h.is_healthy(t0 + UNHEALTHY_INTERVAL));
        // Past the interval the check is forced, and the count starts again.
        assert!(h.is_healthy(t0 + UNHEALTHY_INTERVAL + Duration::from_secs(1)));
        assert!(h.is_healthy(t0 + UNHEALTHY_INTERVAL + Duration::from_secs(2)));
    }

    #[test]
    fn a_healthy_answer_resets_the_count() {
        let t0 = Instant::now();
        let mut h = Health::new(t0);
        h.mark(false, t0);
        h.mark(false, t0);
        h.mark(true, t0);
        h.mark(false, t0);
        h.mark(false, t0);
        assert!(h.is_healthy(t0));
    }

    #[test]
    fn only_403_is_unhealthy() {
        assert!(!healthy_answer(403));
        for s in [0, 201, 204, 409, 429, 500, 503, 401] {
            assert!(healthy_answer(s), "{s}");
        }
    }
}
