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
        for m in [
            Box::new(connected.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(tunnels.clone()),
            Box::new(connects.clone()),
            Box::new(requests.clone()),
            Box::new(durations.clone()),
        ] {
            registry.register(m).expect("registers once");
        }
        AgentkMetrics {
            connected,
            tunnels_idle: tunnels.with_label_values(&["idle"]),
            tunnels_busy: tunnels.with_label_values(&["busy"]),
            connects,
            requests,
            durations,
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
