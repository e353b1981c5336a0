//! agentk's metrics, in a registry of its own (several agentk replicas can share a
//! process in tests).

use std::time::Duration;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// One agentk replica's metrics.
pub struct AgentkMetrics {
    registry: Registry,
    /// 1 while the configuration stream to kas is open.
    pub connected: IntGauge,
    /// Idle tunnels waiting at kas.
    pub tunnels_idle: IntGauge,
    /// Tunnels answering a request.
    pub tunnels_busy: IntGauge,
    connects: IntCounterVec,
    requests: IntCounterVec,
    durations: HistogramVec,
    /// The Graph API's watches.
    pub graph: GraphMetrics,
    /// The `remote_development` module (Workspaces).
    pub workspaces: WorkspacesMetrics,
}

/// The Graph API's watches in agentk (shared by every `WatchGraph` of a replica).
#[derive(Clone, Debug)]
pub struct GraphMetrics {
    /// `WatchGraph` requests being answered.
    pub requests: IntGauge,
    /// Kubernetes watches they run.
    pub informers: IntGauge,
    /// Objects their graphs hold.
    pub objects: IntGauge,
    /// Actions sent (`svx`, `dvx`, `sarc`, `darc`).
    pub actions: prometheus::IntCounter,
    warnings: IntCounterVec,
}

impl GraphMetrics {
    /// Count a warning sent, by its type (`INFORMER_SYNC_FAILED`, ...).
    pub fn warning(&self, t: &str) {
        self.warnings.with_label_values(&[t]).inc();
    }
}

/// The `remote_development` module's reconcile cycles (Workspaces).
#[derive(Clone, Debug)]
pub struct WorkspacesMetrics {
    cycles: IntCounterVec,
    durations: HistogramVec,
    /// Workspace agent infos sent to GitLab.
    pub sent: prometheus::IntCounter,
    /// Applies (or namespace operations) that ended with errors.
    pub apply_errors: prometheus::IntCounter,
    /// 1 while this replica holds the Lease and runs the module.
    pub leader: IntGauge,
}

impl WorkspacesMetrics {
    /// Count a reconcile cycle by update type (`full`, `partial`) and result (`ok`,
    /// `error`), with how long it took.
    pub fn cycle(&self, update_type: &str, ok: bool, took: Duration) {
        let result = if ok { "ok" } else { "error" };
        self.cycles.with_label_values(&[update_type, result]).inc();
        self.durations
            .with_label_values(&[update_type])
            .observe(took.as_secs_f64());
    }

    /// Cycles counted so far with this type and result (tests).
    pub fn cycles(&self, update_type: &str, result: &str) -> u64 {
        self.cycles.with_label_values(&[update_type, result]).get()
    }

    fn new() -> WorkspacesMetrics {
        let cycles = IntCounterVec::new(
            Opts::new(
                "podgate_agentk_workspaces_cycles_total",
                "Workspaces reconcile cycles, by update type and result",
            ),
            &["type", "result"],
        )
        .expect("valid metric");
        for t in ["full", "partial"] {
            for r in ["ok", "error"] {
                cycles.with_label_values(&[t, r]);
            }
        }
        let durations = HistogramVec::new(
            HistogramOpts::new(
                "podgate_agentk_workspaces_cycle_duration_seconds",
                "Time of a Workspaces reconcile cycle (request to GitLab and handling its answer), by update type",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ]),
            &["type"],
        )
        .expect("valid metric");
        WorkspacesMetrics {
            cycles,
            durations,
            sent: prometheus::IntCounter::new(
                "podgate_agentk_workspaces_sent_total",
                "Workspace agent infos sent to GitLab",
            )
            .expect("valid metric"),
            apply_errors: prometheus::IntCounter::new(
                "podgate_agentk_workspaces_apply_errors_total",
                "Workspace applies and namespace operations that ended with errors",
            )
            .expect("valid metric"),
            leader: IntGauge::new(
                "podgate_agentk_workspaces_leader",
                "1 while this replica leads and runs the Workspaces module",
            )
            .expect("valid metric"),
        }
    }

    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.cycles.clone()),
            Box::new(self.durations.clone()),
            Box::new(self.sent.clone()),
            Box::new(self.apply_errors.clone()),
            Box::new(self.leader.clone()),
        ]
    }
}

impl Default for WorkspacesMetrics {
    /// Metrics in no registry (tests).
    fn default() -> Self {
        WorkspacesMetrics::new()
    }
}

impl Default for AgentkMetrics {
    fn default() -> Self {
        AgentkMetrics::new()
    }
}

impl AgentkMetrics {
    /// Fresh metrics in a registry of their own.
    pub fn new() -> AgentkMetrics {
        let registry = Registry::new();
        let connected = IntGauge::new(
            "podgate_agentk_connected",
            "1 while the configuration stream to kas is open",
        )
        .expect("valid metric");
        let tunnels = IntGaugeVec::new(
            Opts::new("podgate_agentk_tunnels", "Reverse tunnels to kas, by state"),
            &["state"],
        )
        .expect("valid metric");
        let connects = IntCounterVec::new(
            Opts::new(
                "podgate_agentk_connects_total",
                "Attempts to open the configuration stream, by result",
            ),
            &["result"],
        )
        .expect("valid metric");
        let requests = IntCounterVec::new(
            Opts::new(
                "podgate_agentk_requests_total",
                "Requests kas sent through tunnels, by method and gRPC code",
            ),
            &["method", "code"],
        )
        .expect("valid metric");
        let durations = HistogramVec::new(
            HistogramOpts::new(
                "podgate_agentk_request_duration_seconds",
                "Time to answer a tunnelled request, by method",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
            ]),
            &["method"],
        )
        .expect("valid metric");
        let gauge = |name: &str, help: &str| IntGauge::new(name, help).expect("valid metric");
        let graph = GraphMetrics {
            requests: gauge(
                "podgate_agentk_graph_requests",
                "Graph API watches (WatchGraph) being answered",
            ),
            informers: gauge(
                "podgate_agentk_graph_informers",
                "Kubernetes watches the Graph API watches run",
            ),
            objects: gauge(
                "podgate_agentk_graph_objects",
                "Objects the Graph API watches hold (evaluated results, not whole objects)",
            ),
            actions: prometheus::IntCounter::new(
                "podgate_agentk_graph_actions_total",
                "Graph actions sent to kas (svx, dvx, sarc, darc)",
            )
            .expect("valid metric"),
            warnings: IntCounterVec::new(
                Opts::new(
                    "podgate_agentk_graph_warnings_total",
                    "Graph API warnings sent, by type",
                ),
                &["type"],
            )
            .expect("valid metric"),
        };
        // Every warning type of the Graph API (`docs/graph-api.md` §8), at zero until
        // sent.
        for t in [
            "INFORMER_SYNC_FAILED",
            "DISCOVERY_FAILED",
            "NAMESPACE_LIST_FAILED",
            "OBJECT_PROCESSING_FAILED",
            "INTERNAL_ERROR",
        ] {
            graph.warnings.with_label_values(&[t]);
        }
        let workspaces = WorkspacesMetrics::new();
        for m in workspaces.collectors().into_iter().chain([
            Box::new(graph.requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(graph.informers.clone()),
            Box::new(graph.objects.clone()),
            Box::new(graph.actions.clone()),
            Box::new(graph.warnings.clone()),
            Box::new(connected.clone()),
            Box::new(tunnels.clone()),
            Box::new(connects.clone()),
            Box::new(requests.clone()),
            Box::new(durations.clone()),
        ]) {
            registry.register(m).expect("registers once");
        }
        AgentkMetrics {
            connected,
            tunnels_idle: tunnels.with_label_values(&["idle"]),
            tunnels_busy: tunnels.with_label_values(&["busy"]),
            connects,
            requests,
            durations,
            graph,
            workspaces,
            registry,
        }
    }

    /// Count an attempt to open the configuration stream (`ok`, `unauthenticated`,
    /// `unavailable`, ...).
    pub fn connect(&self, result: &str) {
        self.connects.with_label_values(&[result]).inc();
    }

    /// Count an answered request.
    pub fn answered(&self, method: &str, code: tonic::Code, took: Duration) {
        let code = format!("{code:?}");
        self.requests.with_label_values(&[method, &code]).inc();
        self.durations
            .with_label_values(&[method])
            .observe(took.as_secs_f64());
    }

    /// The metrics in the text format.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}
