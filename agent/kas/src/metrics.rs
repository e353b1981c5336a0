//! kas's metrics, in a registry of its own per instance (several kas instances can
//! share a process in tests), served with the process-wide registry (the presence
//! registry's backend metrics) on the observability listener.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// How a routed request ended (`outcome` label of the routing histogram).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Served through a tunnel this kas holds.
    Local,
    /// Served through another kas's internal endpoint.
    Kas,
    /// The agent did not connect before the deadline.
    Timeout,
    /// Any other failure (the agent answered an error, a kas failed).
    Error,
    /// The caller went away (or its deadline passed) first.
    Cancelled,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Local => "local",
            Outcome::Kas => "kas",
            Outcome::Timeout => "timeout",
            Outcome::Error => "error",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// At most one log line per listener this often for refused credentials.
pub const AUTH_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// One kas instance's metrics.
pub struct KasMetrics {
    registry: Registry,
    /// agentk replicas registered at this kas (by `Register`, or by an open
    /// configuration stream without `skip_register`).
    pub connected_agents: IntGauge,
    /// Idle reverse tunnels held.
    pub tunnels_idle: IntGauge,
    /// Tunnels carrying a request now.
    pub tunnels_busy: IntGauge,
    routing: HistogramVec,
    routing_children: [Histogram; 5],
    /// External requests that had to wait for their agent to connect.
    pub routing_waits: IntCounter,
    /// External requests waiting for their agent now.
    pub routing_waiting: IntGauge,
    /// External requests that gave up waiting (deadline passed).
    pub routing_timeouts: IntCounter,
    /// kas → kas calls answered `Unavailable` (that kas lost the agent): re-routed.
    pub reroutes: IntCounter,
    /// Reverse tunnels refused: the agent already held the most idle ones allowed.
    pub tunnels_refused: IntCounter,
    /// Reverse tunnels refused: they named a connection this kas does not hold.
    pub tunnels_misplaced: IntCounter,
    auth_failures: IntCounterVec,
    auth_logged: std::sync::Mutex<std::collections::HashMap<&'static str, std::time::Instant>>,
    routed_calls: IntCounterVec,
    registry_errors: IntCounterVec,
}

impl Default for KasMetrics {
    fn default() -> Self {
        KasMetrics::new()
    }
}

impl KasMetrics {
    /// A fresh set of metrics in a registry of their own.
    pub fn new() -> KasMetrics {
        let registry = Registry::new();
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("valid metric");
            registry
                .register(Box::new(g.clone()))
                .expect("registers once");
            g
        };
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("valid metric");
            registry
                .register(Box::new(c.clone()))
                .expect("registers once");
            c
        };
        let connected_agents = gauge(
            "podgate_kas_connected_agents",
            "agentk replicas registered at this kas (by Register, or by an open configuration stream)",
        );
        let tunnels = IntGaugeVec::new(
            Opts::new("podgate_kas_tunnels", "Reverse tunnels held, by state"),
            &["state"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(tunnels.clone()))
            .expect("registers once");
        let routing = HistogramVec::new(
            HistogramOpts::new(
                "podgate_kas_routing_duration_seconds",
                "External requests to agents, from arrival to answer, by outcome",
            )
            .buckets(vec![
                0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0, 60.0,
            ]),
            &["outcome"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(routing.clone()))
            .expect("registers once");
        let routing_children = [
            Outcome::Local,
            Outcome::Kas,
            Outcome::Timeout,
            Outcome::Error,
            Outcome::Cancelled,
        ]
        .map(|o| routing.with_label_values(&[o.label()]));
        let routed_calls = IntCounterVec::new(
            Opts::new(
                "podgate_kas_routed_total",
                "Calls routed to agents, by tunnelled method and outcome",
            ),
            &["method", "outcome"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(routed_calls.clone()))
            .expect("registers once");
        let registry_errors = IntCounterVec::new(
            Opts::new(
                "podgate_kas_registry_errors_total",
                "Presence registry (Redis) calls by kas that failed, by operation",
            ),
            &["op"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(registry_errors.clone()))
            .expect("registers once");
        let auth_failures = IntCounterVec::new(
            Opts::new(
                "podgate_kas_auth_failures_total",
                "Requests refused for their credentials, by listener (agent, external, internal, k8s_proxy, workspaces, observability) and reason",
            ),
            &["listener", "reason"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(auth_failures.clone()))
            .expect("registers once");
        KasMetrics {
            connected_agents,
            tunnels_idle: tunnels.with_label_values(&["idle"]),
            tunnels_busy: tunnels.with_label_values(&["busy"]),
            routing,
            routing_children,
            routing_waits: counter(
                "podgate_kas_routing_waits_total",
                "External requests that waited for their agent to connect",
            ),
            routing_waiting: gauge(
                "podgate_kas_routing_waiting",
                "External requests waiting for their agent to connect now",
            ),
            routing_timeouts: counter(
                "podgate_kas_routing_timeouts_total",
                "External requests whose agent did not connect before the deadline",
            ),
            reroutes: counter(
                "podgate_kas_reroutes_total",
                "kas -> kas calls answered Unavailable (that kas lost the agent) and re-routed",
            ),
            tunnels_refused: counter(
                "podgate_kas_tunnels_refused_total",
                "Reverse tunnels refused because the agent held the most idle tunnels allowed",
            ),
            tunnels_misplaced: counter(
                "podgate_kas_tunnels_misplaced_total",
                "Reverse tunnels refused because they named an agent connection this kas does not hold",
            ),
            auth_failures,
            auth_logged: std::sync::Mutex::default(),
            routed_calls,
            registry_errors,
            registry,
        }
    }

    /// Record one routed call of `method` (a tunnelled method name, from code: the
    /// label set stays small).
    pub fn routed(&self, method: &str, outcome: Outcome, seconds: f64) {
        self.routed_calls
            .with_label_values(&[method, outcome.label()])
            .inc();
        let i = match outcome {
            Outcome::Local => 0,
            Outcome::Kas => 1,
            Outcome::Timeout => 2,
            Outcome::Error => 3,
            Outcome::Cancelled => 4,
        };
        self.routing_children[i].observe(seconds);
    }

    /// Count a request refused for its credentials on `listener`, and log it with
    /// the token's fingerprint (never the token): the first refusal, then at most one
    /// line per listener every [`AUTH_LOG_EVERY`] (the count has them all), so a
    /// mismatched secret is seen without flooding the log.
    pub fn auth_failure(
        &self,
        listener: &'static str,
        reason: podgate_agent::auth::Refusal,
        metadata: &tonic::metadata::MetadataMap,
    ) {
        self.auth_failures
            .with_label_values(&[listener, reason.label()])
            .inc();
        let now = std::time::Instant::now();
        let mut last = self.auth_logged.lock().unwrap_or_else(|e| e.into_inner());
        if last
            .get(listener)
            .is_some_and(|t| now.duration_since(*t) < AUTH_LOG_EVERY)
        {
            return;
        }
        last.insert(listener, now);
        drop(last);
        let token = podgate_agent::auth::bearer(metadata)
            .map(podgate_tokens::fingerprint)
            .unwrap_or_else(|| "none".into());
        tracing::warn!(
            listener,
            reason = reason.label(),
            token = %token,
            total = self.auth_failures(listener),
            "refused a request's credentials (is the shared secret the same on both sides?)"
        );
    }

    /// Requests refused for their credentials on `listener`, all reasons.
    pub fn auth_failures(&self, listener: &str) -> u64 {
        self.registry
            .gather()
            .iter()
            .filter(|f| f.name() == "podgate_kas_auth_failures_total")
            .flat_map(|f| f.get_metric().to_vec())
            .filter(|m| {
                m.get_label()
                    .iter()
                    .any(|l| l.name() == "listener" && l.value() == listener)
            })
            .map(|m| m.get_counter().get_value() as u64)
            .sum()
    }

    /// Count a failed registry call.
    pub fn registry_error(&self, op: &'static str) {
        self.registry_errors.with_label_values(&[op]).inc();
    }

    /// This instance's own registry (for components that add metrics to it).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The routing histogram (for tests and benchmarks).
    pub fn routing(&self) -> &HistogramVec {
        &self.routing
    }

    /// This instance's metrics and the process-wide ones, in the text format.
    pub fn render(&self) -> String {
        let mut families = self.registry.gather();
        families.extend(prometheus::gather());
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for well-formed families.
        let _ = TextEncoder::new().encode(&families, &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}
