//! Registry telemetry: Prometheus metrics, one set per [`Registry`](crate::Registry)
//! (two registries in one process, say a kas and a proxy in a test, each keep their
//! own gauges), and the backend health state that logs once per change, never once
//! per call.
//!
//! Each registry's metrics live in a private `prometheus::Registry`; the process that
//! owns the registry exposes them with
//! [`Registry::register_metrics`](crate::Registry::register_metrics) into the
//! Prometheus registry its `/metrics` endpoint serves.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts};

use crate::error::{Error, Result};

/// One registry's metrics.
#[derive(Clone)]
pub struct RegistryMetrics {
    pub(crate) backend_up: IntGauge,
    pub(crate) backend_errors: IntCounterVec,
    pub(crate) corrupt_values: IntCounter,
    pub(crate) owned_connections: IntGauge,
    pub(crate) refresh_seconds: Histogram,
    pub(crate) gc_removed: IntCounter,
    pub(crate) topology_version: IntGauge,
    pub(crate) events: IntCounterVec,
}

impl std::fmt::Debug for RegistryMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryMetrics")
            .field("backend_up", &self.backend_up.get())
            .field("owned_connections", &self.owned_connections.get())
            .field("topology_version", &self.topology_version.get())
            .finish_non_exhaustive()
    }
}

impl Default for RegistryMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl RegistryMetrics {
    /// A fresh set, registered nowhere yet.
    pub fn new() -> RegistryMetrics {
        // The names and help texts are constants: building them cannot fail.
        let counter_vec = |name: &str, help: &str, label: &str| {
            IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid metric")
        };
        let metrics = RegistryMetrics {
            backend_up: IntGauge::new(
                "podgate_registry_backend_up",
                "1 while the registry backend (Redis) answers, 0 while it does not",
            )
            .expect("valid metric"),
            backend_errors: counter_vec(
                "podgate_registry_backend_errors_total",
                "Registry backend calls that failed, by operation",
                "op",
            ),
            corrupt_values: IntCounter::new(
                "podgate_registry_corrupt_values_total",
                "Stored values that could not be decoded and were skipped",
            )
            .expect("valid metric"),
            owned_connections: IntGauge::new(
                "podgate_registry_owned_connections",
                "Agent connections this process has registered and keeps refreshed",
            )
            .expect("valid metric"),
            refresh_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "podgate_registry_refresh_duration_seconds",
                    "Time to refresh everything this process owns",
                )
                .buckets(vec![
                    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                ]),
            )
            .expect("valid metric"),
            gc_removed: IntCounter::new(
                "podgate_registry_gc_removed_total",
                "Expired registry entries removed by garbage collection",
            )
            .expect("valid metric"),
            topology_version: IntGauge::new(
                "podgate_registry_topology_version",
                "Version of the topology snapshot in use",
            )
            .expect("valid metric"),
            events: counter_vec(
                "podgate_registry_events_total",
                "Presence events received, by type",
                "type",
            ),
        };
        metrics.backend_up.set(1);
        metrics
    }

    /// Register every metric of this set in `into`. Fails if `into` already has
    /// metrics of these names (another registry's).
    pub fn register(&self, into: &prometheus::Registry) -> prometheus::Result<()> {
        into.register(Box::new(self.backend_up.clone()))?;
        into.register(Box::new(self.backend_errors.clone()))?;
        into.register(Box::new(self.corrupt_values.clone()))?;
        into.register(Box::new(self.owned_connections.clone()))?;
        into.register(Box::new(self.refresh_seconds.clone()))?;
        into.register(Box::new(self.gc_removed.clone()))?;
        into.register(Box::new(self.topology_version.clone()))?;
        into.register(Box::new(self.events.clone()))?;
        Ok(())
    }

    /// These metrics alone, as Prometheus families (for tests and tools).
    pub fn gather(&self) -> Vec<prometheus::proto::MetricFamily> {
        let r = prometheus::Registry::new();
        // A fresh registry holds no names yet: registering cannot collide.
        let _ = self.register(&r);
        r.gather()
    }

    /// Registry backend calls that failed, all operations.
    pub fn backend_errors_total(&self) -> u64 {
        self.gather()
            .iter()
            .filter(|f| f.name() == "podgate_registry_backend_errors_total")
            .flat_map(|f| f.get_metric().iter().map(|m| m.get_counter().get_value()))
            .sum::<f64>() as u64
    }

    /// Connections this registry owns, as its gauge says.
    pub fn owned_connections(&self) -> i64 {
        self.owned_connections.get()
    }
}

/// Whether the backend answers, with logging on changes only.
#[derive(Debug)]
pub struct Health {
    up: AtomicBool,
    corrupt_logged: AtomicBool,
    metrics: Arc<RegistryMetrics>,
}

impl Health {
    /// Up, reporting into `metrics`.
    pub(crate) fn new(metrics: Arc<RegistryMetrics>) -> Health {
        metrics.backend_up.set(1);
        Health {
            up: AtomicBool::new(true),
            corrupt_logged: AtomicBool::new(false),
            metrics,
        }
    }

    /// The metrics this health reports into.
    pub(crate) fn metrics(&self) -> &RegistryMetrics {
        &self.metrics
    }

    /// Whether the last backend call succeeded.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Record a backend call's outcome: count errors, log state changes.
    pub(crate) fn record<T>(&self, op: &'static str, res: &Result<T>) {
        match res {
            Ok(_) => {
                if !self.up.swap(true, Ordering::AcqRel) {
                    self.metrics.backend_up.set(1);
                    tracing::info!(op, "registry backend reachable again");
                }
            }
            Err(Error::Backend { source, .. }) => {
                self.metrics.backend_errors.with_label_values(&[op]).inc();
                if self.up.swap(false, Ordering::AcqRel) {
                    self.metrics.backend_up.set(0);
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
        self.metrics.corrupt_values.inc();
        if !self.corrupt_logged.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                key,
                reason,
                "skipping an undecodable registry value (further ones are only counted)"
            );
        }
    }
}
