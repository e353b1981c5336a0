//! The Job Router's metrics, registered in the kas instance's registry.

use podgate_registry::runner_queue::WatchMetrics;
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

/// How a `GetJob` call ended (`result` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CallResult {
    /// A job.
    Job,
    /// No job (held to the end, or Rails' 204).
    Empty,
    /// The router is off here.
    Unimplemented,
    /// Refused: not a runner, no or an invalid token, Rails' 401.
    Unauthenticated,
    /// Rails' 403.
    PermissionDenied,
    /// Rails did not answer, or answered 5xx.
    Unavailable,
    /// A `job_request` kas could not read, or Rails' 400/422.
    Invalid,
    /// Any other failure.
    Failed,
    /// The client went away first.
    ClientGone,
}

impl CallResult {
    const ALL: [CallResult; 9] = [
        CallResult::Job,
        CallResult::Empty,
        CallResult::Unimplemented,
        CallResult::Unauthenticated,
        CallResult::PermissionDenied,
        CallResult::Unavailable,
        CallResult::Invalid,
        CallResult::Failed,
        CallResult::ClientGone,
    ];

    fn label(self) -> &'static str {
        match self {
            CallResult::Job => "job",
            CallResult::Empty => "empty",
            CallResult::Unimplemented => "unimplemented",
            CallResult::Unauthenticated => "unauthenticated",
            CallResult::PermissionDenied => "permission_denied",
            CallResult::Unavailable => "unavailable",
            CallResult::Invalid => "invalid",
            CallResult::Failed => "failed",
            CallResult::ClientGone => "client_gone",
        }
    }

    pub(crate) fn from_code(code: tonic::Code) -> CallResult {
        match code {
            tonic::Code::Unauthenticated => CallResult::Unauthenticated,
            tonic::Code::PermissionDenied => CallResult::PermissionDenied,
            tonic::Code::Unavailable => CallResult::Unavailable,
            tonic::Code::InvalidArgument => CallResult::Invalid,
            _ => CallResult::Failed,
        }
    }
}

/// How a call's hold went (`outcome` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HoldOutcome {
    Timeout,
    Changed,
    NoChange,
    Stale,
    FailOpen,
    ClientGone,
    Shutdown,
    /// A limit was reached: asked Rails at once.
    OverLimit,
    /// No `last_update`, no watch, or no time left before the deadline: not held.
    Ineligible,
}

impl HoldOutcome {
    const ALL: [HoldOutcome; 9] = [
        HoldOutcome::Timeout,
        HoldOutcome::Changed,
        HoldOutcome::NoChange,
        HoldOutcome::Stale,
        HoldOutcome::FailOpen,
        HoldOutcome::ClientGone,
        HoldOutcome::Shutdown,
        HoldOutcome::OverLimit,
        HoldOutcome::Ineligible,
    ];

    fn label(self) -> &'static str {
        match self {
            HoldOutcome::Timeout => "timeout",
            HoldOutcome::Changed => "changed",
            HoldOutcome::NoChange => "no_change",
            HoldOutcome::Stale => "stale",
            HoldOutcome::FailOpen => "fail_open",
            HoldOutcome::ClientGone => "client_gone",
            HoldOutcome::Shutdown => "shutdown",
            HoldOutcome::OverLimit => "over_limit",
            HoldOutcome::Ineligible => "ineligible",
        }
    }
}

/// The Job Router's metrics.
#[derive(Clone)]
pub struct JobRouterMetrics {
    calls: [IntCounter; 9],
    holds: [IntCounter; 9],
    held: IntGauge,
    redis_up: IntGauge,
    redis_errors: IntCounter,
    notifications: IntCounter,
}

impl JobRouterMetrics {
    /// The families, registered in `registry` (a kas instance's).
    pub fn new(registry: &Registry) -> JobRouterMetrics {
        let calls = IntCounterVec::new(
            Opts::new(
                "podgate_kas_job_router_calls_total",
                "Job Router GetJob calls, by how they ended",
            ),
            &["result"],
        )
        .expect("valid metric");
        let holds = IntCounterVec::new(
            Opts::new(
                "podgate_kas_job_router_holds_total",
                "Job Router GetJob calls, by how their long poll went",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        let gauge = |name: &str, help: &str| IntGauge::new(name, help).expect("valid metric");
        let counter = |name: &str, help: &str| IntCounter::new(name, help).expect("valid metric");
        let m = JobRouterMetrics {
            calls: CallResult::ALL.map(|r| calls.with_label_values(&[r.label()])),
            holds: HoldOutcome::ALL.map(|o| holds.with_label_values(&[o.label()])),
            held: gauge(
                "podgate_kas_job_router_held",
                "Job Router GetJob calls held now, waiting on their runner's queue key",
            ),
            redis_up: gauge(
                "podgate_kas_job_router_queue_redis_up",
                "1 while the Cell's runner queue Redis is watched",
            ),
            redis_errors: counter(
                "podgate_kas_job_router_queue_redis_errors_total",
                "Failed connections, commands and pings to the Cell's runner queue Redis",
            ),
            notifications: counter(
                "podgate_kas_job_router_notifications_total",
                "Runner queue key changes received from the Cell's Redis",
            ),
        };
        for c in [
            Box::new(calls) as Box<dyn prometheus::core::Collector>,
            Box::new(holds),
            Box::new(m.held.clone()),
            Box::new(m.redis_up.clone()),
            Box::new(m.redis_errors.clone()),
            Box::new(m.notifications.clone()),
        ] {
            if let Err(e) = registry.register(c) {
                tracing::warn!(error = %e, "job router metrics registered twice");
            }
        }
        m
    }

    pub(crate) fn watch(&self) -> WatchMetrics {
        WatchMetrics {
            up: self.redis_up.clone(),
            errors: self.redis_errors.clone(),
            notifications: self.notifications.clone(),
            held: self.held.clone(),
        }
    }

    pub(crate) fn hold(&self, outcome: HoldOutcome) {
        self.holds[outcome as usize].inc();
    }

    /// A call begun: counted once, when it is finished or dropped.
    pub(crate) fn call(&self) -> Call<'_> {
        Call {
            metrics: self,
            result: CallResult::ClientGone,
            finished: false,
        }
    }

    /// Calls held now.
    pub fn held(&self) -> i64 {
        self.held.get()
    }

    #[cfg(test)]
    pub(crate) fn calls_of(&self, r: CallResult) -> u64 {
        self.calls[r as usize].get()
    }

    #[cfg(test)]
    pub(crate) fn holds_of(&self, o: HoldOutcome) -> u64 {
        self.holds[o as usize].get()
    }
}

/// One call in progress; its `result` is counted when it is finished, or
/// `client_gone` when it is dropped unfinished.
pub(crate) struct Call<'a> {
    metrics: &'a JobRouterMetrics,
    pub(crate) result: CallResult,
    finished: bool,
}

impl Call<'_> {
    pub(crate) fn finish(mut self) {
        self.finished = true;
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        let r = if self.finished {
            self.result
        } else {
            CallResult::ClientGone
        };
        self.metrics.calls[r as usize].inc();
    }
}
