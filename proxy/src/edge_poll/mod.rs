//! Long polls held at the edge: `jobs/request` polls of a Pod that opts in
//! (`runner_queue_redis` on its [`Pod`](podgate_registry::Pod)) wait **in the proxy**,
//! with no upstream connection, exactly as the Pod's Workhorse would hold them.
//!
//! The watch and the hold itself are the registry's
//! [`QueueWatch`], which kas's Job
//! Router holds its `GetJob` calls on too. Here, per poll:
//!
//! 1. eligible like Workhorse ([`RunnerRequest::read`]: JSON, ≤ 32 KiB, non-empty
//!    `token` and `last_update`), else forwarded (`ineligible`);
//! 2. [`QueueWatch::hold`] on the
//!    Pod's watch, then by its outcome:
//!    - no live watch, a failed `GET`, Redis gone during the hold: forwarded
//!      (`fail_open`), never stuck;
//!    - the key differs from `last_update` (or is missing): forwarded at once
//!      (`stale`, Workhorse's `already-changed`: Rails answers);
//!    - a notification with another value: **forwarded** at once (`changed`). Here
//!      the edge departs from Workhorse, which answers `seen-change` with a 204 and
//!      lets the runner ask again: the forwarded poll reaches the Pod's Workhorse
//!      with the old `last_update`, which sees `already-changed` and passes it to
//!      Rails, so the runner gets its job one round trip sooner;
//!    - a notification with the same value: 204 at once (`no_change`, as Workhorse);
//!    - the hold (`edge_poll_hold_secs`, GitLab.com's `apiCiLongPollingDuration`,
//!      50 s) ends: the proxy answers **204** itself, with
//!      `X-GitLab-Last-Update: <last_update>` and `Gitlab-Ci-Builds-Polling: yes`
//!      (`timeout`);
//!    - the client goes away: its waiter is released (`client_gone`);
//!    - the proxy shuts down: 204 at once (Workhorse's `kw.shutdown`, counted as
//!      `no_change`).
//!
//! [`EdgePolls`] keeps one watch per opted-in Pod, following the topology as the
//! upstream pools do ([`EdgePollsService`]). Metrics: `podgate_proxy_edge_polls_held`,
//! `podgate_proxy_edge_polls_total{result}`, `podgate_proxy_edge_poll_redis_up`,
//! `podgate_proxy_edge_poll_redis_errors_total`,
//! `podgate_proxy_edge_poll_notifications_total`, all per Pod. Logs name a runner by
//! its token's fingerprint only.

pub mod request;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::ServiceReadyNotifier;
use pingora::services::background::BackgroundService;
use podgate_registry::Topology;
use podgate_registry::runner_queue::{Outcome, QueueWatch, Stop, WatchMetrics};
use podgate_tokens::PodId;
use prometheus::{IntCounter, IntGauge};
use tokio::sync::watch;

use crate::metrics::METRICS;
use crate::server::RegistryHandle;
pub use podgate_registry::runner_queue::{CHANNEL_PREFIX, KEY_PREFIX};
pub use request::RunnerRequest;

/// `edge_poll_hold_secs` by default: GitLab.com's `apiCiLongPollingDuration`.
pub const DEFAULT_HOLD_SECS: u64 = 50;

/// How one poll ended, as counted in `podgate_proxy_edge_polls_total{result}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollResult {
    /// Held until the hold ended: 204 from the proxy.
    Timeout,
    /// Woken by a new value: forwarded.
    Changed,
    /// A notification with the same value, or shutdown: 204 from the proxy.
    NoChange,
    /// The key already differed: forwarded at once.
    Stale,
    /// No live watch, a failed `GET`, or the connection broke during the hold:
    /// forwarded.
    FailOpen,
    /// Not a poll Workhorse would hold: forwarded.
    Ineligible,
    /// The client went away during the hold.
    ClientGone,
}

impl PollResult {
    /// Every result, in label order.
    pub const ALL: [PollResult; 7] = [
        PollResult::Timeout,
        PollResult::Changed,
        PollResult::NoChange,
        PollResult::Stale,
        PollResult::FailOpen,
        PollResult::Ineligible,
        PollResult::ClientGone,
    ];

    /// The `result` label.
    pub const fn as_str(self) -> &'static str {
        match self {
            PollResult::Timeout => "timeout",
            PollResult::Changed => "changed",
            PollResult::NoChange => "no_change",
            PollResult::Stale => "stale",
            PollResult::FailOpen => "fail_open",
            PollResult::Ineligible => "ineligible",
            PollResult::ClientGone => "client_gone",
        }
    }
}

/// What to do with a poll.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Forward it to the Pod.
    Forward(PollResult),
    /// Answer 204 with `X-GitLab-Last-Update: <last_update>`.
    NoContent(PollResult, String),
    /// The client went away: nothing to answer.
    ClientGone,
}

/// One Pod's metric children, looked up once.
#[derive(Clone)]
pub(crate) struct PodMetrics {
    held: IntGauge,
    up: IntGauge,
    errors: IntCounter,
    notifications: IntCounter,
    results: [IntCounter; 7],
}

impl PodMetrics {
    fn new(pod: PodId) -> Self {
        let pod = pod.to_string();
        PodMetrics {
            held: METRICS.edge_polls_held.with_label_values(&[pod.as_str()]),
            up: METRICS
                .edge_poll_redis_up
                .with_label_values(&[pod.as_str()]),
            errors: METRICS
                .edge_poll_redis_errors
                .with_label_values(&[pod.as_str()]),
            notifications: METRICS
                .edge_poll_notifications
                .with_label_values(&[pod.as_str()]),
            results: PollResult::ALL.map(|r| {
                METRICS
                    .edge_polls
                    .with_label_values(&[pod.as_str(), r.as_str()])
            }),
        }
    }

    fn count(&self, r: PollResult) {
        self.results[r as usize].inc();
    }

    /// The children the Pod's watch keeps itself.
    fn watch(&self) -> WatchMetrics {
        WatchMetrics {
            up: self.up.clone(),
            errors: self.errors.clone(),
            notifications: self.notifications.clone(),
            held: self.held.clone(),
        }
    }

    fn forget(pod: PodId) {
        let pod = pod.to_string();
        let _ = METRICS
            .edge_poll_redis_up
            .remove_label_values(&[pod.as_str()]);
        let _ = METRICS.edge_polls_held.remove_label_values(&[pod.as_str()]);
    }
}

/// Every opted-in Pod's watch.
pub struct EdgePolls {
    hold: Duration,
    watchers: ArcSwap<HashMap<PodId, Arc<PodWatch>>>,
    shutting_down: AtomicBool,
}

/// One opted-in Pod's watch and metrics.
struct PodWatch {
    watch: QueueWatch,
    metrics: PodMetrics,
}

/// One opted-in Pod, for one poll.
pub struct PodPolls {
    hold: Duration,
    watcher: Arc<PodWatch>,
}

impl EdgePolls {
    /// No Pod watched yet; polls are held up to `hold` ([`EdgePolls::apply`] starts
    /// the watches).
    pub fn new(hold: Duration) -> Self {
        EdgePolls {
            hold,
            watchers: ArcSwap::default(),
            shutting_down: AtomicBool::new(false),
        }
    }

    /// The opted-in Pod `pod` (`None`: its polls are not touched at all).
    pub fn pod(&self, pod: PodId) -> Option<PodPolls> {
        if self.shutting_down.load(Ordering::Relaxed) {
            return None;
        }
        self.watchers.load().get(&pod).map(|w| PodPolls {
            hold: self.hold,
            watcher: w.clone(),
        })
    }

    /// Watch the Pods of `topology` that set `runner_queue_redis`: a Pod whose URL is
    /// unchanged keeps its watch; a new or changed one gets a new watch (spawned on
    /// the current runtime); a Pod gone, or no longer opted in, stops its watch and
    /// its held polls are forwarded.
    pub fn apply(&self, topology: &Topology) {
        if self.shutting_down.load(Ordering::Relaxed) {
            return;
        }
        let old = self.watchers.load_full();
        let mut next = HashMap::new();
        for pod in topology.pods.values() {
            let Some(url) = &pod.runner_queue_redis else {
                continue;
            };
            let w = match old.get(&pod.id) {
                Some(w) if w.watch.url() == url => w.clone(),
                _ => {
                    let metrics = PodMetrics::new(pod.id);
                    let watch = QueueWatch::start(pod.id.to_string(), url, metrics.watch());
                    Arc::new(PodWatch { watch, metrics })
                }
            };
            next.insert(pod.id, w);
        }
        self.watchers.store(Arc::new(next.clone()));
        // Requests in flight may still hold a replaced watch: stop it explicitly so
        // its held polls are forwarded now.
        for (id, w) in old.iter() {
            match next.get(id) {
                Some(n) if Arc::ptr_eq(n, w) => {}
                Some(_) => w.watch.stop(Stop::Replaced),
                None => {
                    w.watch.stop(Stop::Replaced);
                    PodMetrics::forget(*id);
                }
            }
        }
    }

    /// Stop every watch: held polls are answered 204 now, new ones are forwarded.
    pub fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::Relaxed);
        let old = self.watchers.swap(Arc::default());
        for w in old.values() {
            w.watch.stop(Stop::Shutdown);
        }
    }

    /// Follow `topologies` until `shutdown`, then [`EdgePolls::shutdown`].
    pub async fn run(
        &self,
        mut topologies: watch::Receiver<Arc<Topology>>,
        mut shutdown: ShutdownWatch,
    ) {
        let first = topologies.borrow_and_update().clone();
        self.apply(&first);
        loop {
            tokio::select! {
                r = shutdown.changed() => {
                    if r.is_err() || *shutdown.borrow() {
                        break;
                    }
                }
                r = topologies.changed() => {
                    if r.is_err() {
                        break;
                    }
                    let t = topologies.borrow_and_update().clone();
                    self.apply(&t);
                }
            }
        }
        self.shutdown();
    }
}

impl PodPolls {
    /// Decide one `jobs/request` poll of this Pod (`request`: what
    /// [`RunnerRequest::read`] found, `None` when Workhorse would not watch it),
    /// holding it if its ticket is current. `client_gone` completes when the client
    /// closes its connection. Counts the result.
    pub async fn hold<F: Future<Output = ()>>(
        &self,
        request: Option<RunnerRequest>,
        client_gone: F,
    ) -> Verdict {
        let verdict = match request {
            None => Verdict::Forward(PollResult::Ineligible),
            Some(r) => {
                let outcome = self
                    .watcher
                    .watch
                    .hold(&r.token, &r.last_update, self.hold, client_gone)
                    .await;
                match outcome {
                    Outcome::Timeout => Verdict::NoContent(PollResult::Timeout, r.last_update),
                    Outcome::NoChange | Outcome::Shutdown => {
                        Verdict::NoContent(PollResult::NoChange, r.last_update)
                    }
                    Outcome::Changed => Verdict::Forward(PollResult::Changed),
                    Outcome::Stale => Verdict::Forward(PollResult::Stale),
                    Outcome::FailOpen => Verdict::Forward(PollResult::FailOpen),
                    Outcome::ClientGone => Verdict::ClientGone,
                }
            }
        };
        let metrics = &self.watcher.metrics;
        match &verdict {
            Verdict::Forward(r) | Verdict::NoContent(r, _) => metrics.count(*r),
            Verdict::ClientGone => metrics.count(PollResult::ClientGone),
        }
        verdict
    }
}

/// [`EdgePolls::run`] as a pingora background service, on the registry that
/// `server`'s registry service opens. Its watches live on this service's runtime.
pub struct EdgePollsService {
    polls: Arc<EdgePolls>,
    registry: RegistryHandle,
}

impl EdgePollsService {
    /// Follow `registry`'s topology (once it is open) with `polls`.
    pub fn new(polls: Arc<EdgePolls>, registry: RegistryHandle) -> Self {
        EdgePollsService { polls, registry }
    }
}

#[async_trait]
impl BackgroundService for EdgePollsService {
    async fn start_with_ready_notifier(
        &self,
        shutdown: ShutdownWatch,
        ready: ServiceReadyNotifier,
    ) {
        let registry = self.registry.wait().await;
        // Ready at once: a Pod whose watch is not up yet has its polls forwarded.
        ready.notify_ready();
        self.polls.run(registry.watch_topology(), shutdown).await;
    }
}

#[cfg(test)]
mod tests;
