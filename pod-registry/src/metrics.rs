//! Registry telemetry: Prometheus metrics (default registry) and the backend health
//! state that logs once per change, never once per call.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, register_histogram,
    register_int_counter, register_int_counter_vec, register_int_gauge,
};

use crate::error::{Error, Result};

pub(crate) static BACKEND_UP: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!(
        "podgate_registry_backend_up",
        "1 while the registry backend (Redis) answers, 0 while it does not"
    )
    .expect("metric registers once")
});

pub(crate) static BACKEND_ERRORS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "podgate_registry_backend_errors_total",
            "Registry backend calls that failed, by operation"
        ),
        &["op"]
    )
    .expect("metric registers once")
});

pub(crate) static CORRUPT_VALUES: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "podgate_registry_corrupt_values_total",
        "Stored values that could not be decoded and were skipped"
    )
    .expect("metric registers once")
});

pub(crate) static OWNED_CONNECTIONS: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!(
        "podgate_registry_owned_connections",
        "Agent connections this process has registered and keeps refreshed"
    )
    .expect("metric registers once")
});

pub(crate) static REFRESH_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    register_histogram!(
        HistogramOpts::new(
            "podgate_registry_refresh_duration_seconds",
            "Time to refresh everything this process owns"
        )
        .buckets(vec![
            0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0
        ])
    )
    .expect("metric registers once")
});

pub(crate) static GC_REMOVED: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "podgate_registry_gc_removed_total",
        "Expired registry entries removed by garbage collection"
    )
    .expect("metric registers once")
});

pub(crate) static TOPOLOGY_VERSION: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!(
        "podgate_registry_topology_version",
        "Version of the topology snapshot in use"
    )
    .expect("metric registers once")
});

pub(crate) static EVENTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "podgate_registry_events_total",
            "Presence events received, by type"
        ),
        &["type"]
    )
    .expect("metric registers once")
});

/// Whether the backend answers, with logging on changes only.
#[derive(Debug)]
pub struct Health {
    up: AtomicBool,
    corrupt_logged: AtomicBool,
}

impl Default for Health {
    fn default() -> Self {
        BACKEND_UP.set(1);
        Health {
            up: AtomicBool::new(true),
            corrupt_logged: AtomicBool::new(false),
        }
    }
}

impl Health {
    /// Whether the last backend call succeeded.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Record a backend call's outcome: count errors, log state changes.
    pub(crate) fn record<T>(&self, op: &'static str, res: &Result<T>) {
        match res {
            Ok(_) => {
                if !self.up.swap(true, Ordering::AcqRel) {
                    BACKEND_UP.set(1);
                    tracing::info!(op, "registry backend reachable again");
                }
            }
            Err(Error::Backend { source, .. }) => {
                BACKEND_ERRORS.with_label_values(&[op]).inc();
                if self.up.swap(false, Ordering::AcqRel) {
                    BACKEND_UP.set(0);
                    tracing::warn!(
                        op,
                        error = %source,
                        "registry backend unreachable; keeping the last good state and retrying with back-off"
                    );
                }
            }
            Err(_) => {}
        }
    }

    /// Count an undecodable value; log the first one only.
    pub(crate) fn corrupt(&self, key: &str, reason: &str) {
        CORRUPT_VALUES.inc();
        if !self.corrupt_logged.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                key,
                reason,
                "skipping an undecodable registry value (further ones are only counted)"
            );
        }
    }
}
