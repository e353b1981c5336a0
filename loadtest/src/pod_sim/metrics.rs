//! The simulator's Prometheus metrics ([`SimMetrics`], a registry per Pod) and
//! [`sum_samples`], which reads them back. The `jobs/request` ones follow
//! Workhorse's (`gitlab_workhorse_builds_register_handler_requests{status}` and
//! `…_open{state}`, `workhorse/internal/builds/register.go`) and Rails' events
//! (`Gitlab::Metrics.add_event`, `lib/api/ci/runner.rb`).

use podgate_tokens::PodId;
use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use super::{WorkspaceStore, workspaces};

/// The simulator's metrics, in a registry of its own (several Pods share a process
/// in `podgate up`).
pub struct SimMetrics {
    registry: Registry,
    /// `misrouted_requests_total`: tokens that belong to another Pod.
    pub misrouted: IntCounter,
    /// `podsim_requests_total{endpoint,status}`.
    pub requests: IntCounterVec,
    /// `podsim_jobs_queued`.
    pub queued: IntGauge,
    /// `podsim_generator_skipped_total`: generator ticks skipped at `max_pending`.
    pub generator_skipped: IntCounter,
    /// `podsim_artifact_bytes_total`: artifact bytes received.
    pub artifact_bytes: IntCounter,
    /// `podsim_workspaces{desired_state,actual_state}`: workspaces by state.
    pub workspaces: IntGaugeVec,
    /// `podsim_workspace_info{workspace,namespace,desired_state,actual_state}`: 1
    /// per live workspace, with its states (what the web console lists; the
    /// `kube_pod_info` pattern: one series per object, its facts as labels).
    pub workspace_info: IntGaugeVec,
    /// `podsim_workspace_reconciles_total{update_type,status}`: reconcile requests
    /// answered (`update_type` `full`, `partial` or `invalid`).
    pub workspace_reconciles: IntCounterVec,
    /// `podsim_workhorse_register_requests_total{status}`: how Workhorse's
    /// `jobs/request` handler ended ([`WORKHORSE_STATUSES`]).
    pub workhorse_requests: IntCounterVec,
    /// `podsim_workhorse_register_open{state}`: `jobs/request` requests in Workhorse
    /// now, `reading` the body, `proxying` to Rails or `watching` the runner's key
    /// (held polls).
    pub workhorse_open: IntGaugeVec,
    /// `podsim_rails_job_request_total{event}`: Rails' answers to `jobs/request`
    /// ([`RAILS_EVENTS`]).
    pub rails_job_requests: IntCounterVec,
    /// `podsim_runner_queue_ticks_total`: runner queue keys ticked.
    pub runner_queue_ticks: IntCounter,
    /// `podsim_redis_errors_total`: failed or dropped writes to the Redis mirror.
    pub redis_errors: IntCounter,
}

/// Workhorse's `jobs/request` statuses (`registerHandlerRequests` labels).
pub const WORKHORSE_STATUSES: [&str; 8] = [
    "body-read-error",
    "body-parse-error",
    "missing-values",
    "watch-error",
    "already-changed",
    "seen-change",
    "timeout",
    "no-change",
];

/// Workhorse's `jobs/request` states (`registerHandlerOpen` labels).
pub const WORKHORSE_STATES: [&str; 3] = ["reading", "proxying", "watching"];

/// Rails' `jobs/request` events (`inactive`: a paused runner, answered before any
/// event in Rails).
pub const RAILS_EVENTS: [&str; 5] = [
    "build_found",
    "build_not_found",
    "build_not_found_cached",
    "build_invalid",
    "inactive",
];

impl SimMetrics {
    pub(super) fn new(pod: PodId) -> Self {
        let registry =
            Registry::new_custom(None, Some([("pod".to_owned(), pod.to_string())].into()))
                .expect("valid registry labels");
        let misrouted = IntCounter::new(
            "misrouted_requests_total",
            "Requests whose token belongs to another Pod (answered 403).",
        )
        .expect("valid metric");
        let requests = IntCounterVec::new(
            Opts::new("podsim_requests_total", "Requests by endpoint and status."),
            &["endpoint", "status"],
        )
        .expect("valid metric");
        let queued = IntGauge::new("podsim_jobs_queued", "Jobs waiting for a runner.")
            .expect("valid metric");
        let generator_skipped = IntCounter::new(
            "podsim_generator_skipped_total",
            "Job generator ticks skipped because max_pending jobs were waiting.",
        )
        .expect("valid metric");
        let artifact_bytes =
            IntCounter::new("podsim_artifact_bytes_total", "Artifact bytes received.")
                .expect("valid metric");
        let workspaces = IntGaugeVec::new(
            Opts::new(
                "podsim_workspaces",
                "Workspaces by desired and actual state.",
            ),
            &["desired_state", "actual_state"],
        )
        .expect("valid metric");
        let workspace_info = IntGaugeVec::new(
            Opts::new(
                "podsim_workspace_info",
                "1 per workspace not yet terminated, with its desired and actual state.",
            ),
            &["workspace", "namespace", "desired_state", "actual_state"],
        )
        .expect("valid metric");
        let workspace_reconciles = IntCounterVec::new(
            Opts::new(
                "podsim_workspace_reconciles_total",
                "Workspace reconcile requests by update type and status.",
            ),
            &["update_type", "status"],
        )
        .expect("valid metric");
        let workhorse_requests = IntCounterVec::new(
            Opts::new(
                "podsim_workhorse_register_requests_total",
                "jobs/request requests by how Workhorse's register handler ended them.",
            ),
            &["status"],
        )
        .expect("valid metric");
        let workhorse_open = IntGaugeVec::new(
            Opts::new(
                "podsim_workhorse_register_open",
                "jobs/request requests open in Workhorse now, by state.",
            ),
            &["state"],
        )
        .expect("valid metric");
        let rails_job_requests = IntCounterVec::new(
            Opts::new(
                "podsim_rails_job_request_total",
                "jobs/request requests Rails answered, by event.",
            ),
            &["event"],
        )
        .expect("valid metric");
        let runner_queue_ticks = IntCounter::new(
            "podsim_runner_queue_ticks_total",
            "Runner queue keys ticked (tick_runner_queue).",
        )
        .expect("valid metric");
        let redis_errors = IntCounter::new(
            "podsim_redis_errors_total",
            "Failed or dropped writes to the Redis mirror of the runner queue keys.",
        )
        .expect("valid metric");
        for s in WORKHORSE_STATUSES {
            workhorse_requests.with_label_values(&[s]);
        }
        for s in WORKHORSE_STATES {
            workhorse_open.with_label_values(&[s]);
        }
        for e in RAILS_EVENTS {
            rails_job_requests.with_label_values(&[e]);
        }
        for m in [
            Box::new(misrouted.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(workhorse_requests.clone()),
            Box::new(workhorse_open.clone()),
            Box::new(rails_job_requests.clone()),
            Box::new(runner_queue_ticks.clone()),
            Box::new(redis_errors.clone()),
            Box::new(requests.clone()),
            Box::new(queued.clone()),
            Box::new(generator_skipped.clone()),
            Box::new(artifact_bytes.clone()),
            Box::new(workspaces.clone()),
            Box::new(workspace_info.clone()),
            Box::new(workspace_reconciles.clone()),
        ] {
            registry.register(m).expect("unique metric names");
        }
        SimMetrics {
            registry,
            misrouted,
            requests,
            queued,
            generator_skipped,
            artifact_bytes,
            workspaces,
            workspace_info,
            workspace_reconciles,
            workhorse_requests,
            workhorse_open,
            rails_job_requests,
            runner_queue_ticks,
            redis_errors,
        }
    }

    /// Held `jobs/request` polls now (`podsim_workhorse_register_open{state="watching"}`).
    pub fn held_polls(&self) -> i64 {
        self.workhorse_open.with_label_values(&["watching"]).get()
    }

    /// Set `podsim_workspaces` from `store` (every state pair, zeros included) and
    /// `podsim_workspace_info` (the workspaces not yet terminated).
    pub fn refresh_workspaces(&self, store: &WorkspaceStore) {
        self.workspace_info.reset();
        for w in store.list() {
            if w.actual_state != workspaces::ActualState::Terminated {
                self.workspace_info
                    .with_label_values(&[
                        w.name.as_str(),
                        w.namespace.as_str(),
                        w.desired_state.as_str(),
                        w.actual_state.as_str(),
                    ])
                    .set(1);
            }
        }
        use workspaces::{ActualState, DesiredState};
        let counts = store.counts();
        for d in DesiredState::ALL {
            for a in ActualState::ALL {
                let n = counts.get(&(d.as_str(), a.as_str())).copied().unwrap_or(0);
                self.workspaces
                    .with_label_values(&[d.as_str(), a.as_str()])
                    .set(n);
            }
        }
    }

    /// Requests answered, all endpoints and statuses.
    pub fn requests_total(&self) -> u64 {
        sum_samples(&self.render(), "podsim_requests_total{", |_| true)
    }

    /// The Prometheus text format.
    pub fn render(&self) -> String {
        use prometheus::Encoder;
        let mut out = Vec::new();
        let _ = prometheus::TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

/// The sum of the samples in Prometheus `text` whose line starts with `prefix` (a
/// metric name and `{`) and whose labels satisfy `keep`.
pub fn sum_samples(text: &str, prefix: &str, keep: impl Fn(&str) -> bool) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(prefix) && keep(l))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}
