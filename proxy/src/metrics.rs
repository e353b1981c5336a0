//! The proxy's Prometheus metrics, registered once in the process's default registry
//! (where pingora's own metrics live too) and served by [`crate::admin`].
//!
//! Label sets are bounded: rules come from the configuration, Pods from the topology,
//! statuses and outcomes from fixed lists. Tokens never appear in a label.

use std::sync::LazyLock;

use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
};

/// Latency buckets from 50 µs to 10 min: decisions take microseconds, long polls minutes.
const BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// Decision buckets: 1 µs to 50 ms (a body read from a slow client is the long tail).
const DECISION_BUCKETS: &[f64] = &[
    0.000001, 0.0000025, 0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001,
    0.005, 0.05,
];

/// Every metric of the proxy.
pub struct Metrics {
    /// `podgate_proxy_requests_total{rule,pod,status,source,outcome}`.
    pub requests: IntCounterVec,
    /// `podgate_proxy_request_duration_seconds{rule,status_class}`: first byte in to
    /// last byte out.
    pub duration: HistogramVec,
    /// `podgate_proxy_decision_duration_seconds{rule}`: rule match, token search,
    /// classification and decision (including reading a JSON body).
    pub decision: HistogramVec,
    /// `podgate_proxy_upstream_healthy{pod,pool,upstream}`: 1 healthy, 0 not.
    pub upstream_healthy: IntGaugeVec,
    /// `podgate_proxy_health_check_failures_total{pod,upstream}`.
    pub health_failures: IntCounterVec,
    /// `podgate_proxy_upstream_connect_failures_total{pod}`.
    pub connect_failures: IntCounterVec,
    /// `podgate_classifier_cache_hits_total`, mirrored from the classifier at scrape.
    pub cache_hits: IntCounter,
    /// `podgate_classifier_cache_misses_total`, mirrored from the classifier at scrape.
    pub cache_misses: IntCounter,
    /// `podgate_proxy_edge_polls_held{pod}`: `jobs/request` polls held at the edge
    /// now, with no upstream connection ([`crate::edge_poll`]).
    pub edge_polls_held: IntGaugeVec,
    /// `podgate_proxy_kas_open{pod,client}`: requests open now to a Pod's kas pool
    /// (a gRPC call, or a WebSocket for its whole life), by who holds them:
    /// `runner` (a runner token: GitLab's Job Router, `GetJob`) or `agent`.
    pub kas_open: IntGaugeVec,
    /// `podgate_proxy_edge_polls_total{pod,result}`: opted-in Pods' polls by how
    /// they ended (`timeout`, `changed`, `no_change`, `stale`, `fail_open`,
    /// `ineligible`, `client_gone`).
    pub edge_polls: IntCounterVec,
    /// `podgate_proxy_edge_poll_redis_up{pod}`: 1 while the Pod's runner queue
    /// Redis is watched (polls may be held), 0 while they are forwarded.
    pub edge_poll_redis_up: IntGaugeVec,
    /// `podgate_proxy_edge_poll_redis_errors_total{pod}`: failed connections,
    /// commands and lost subscriptions to a Pod's runner queue Redis.
    pub edge_poll_redis_errors: IntCounterVec,
    /// `podgate_proxy_edge_poll_notifications_total{pod}`: runner queue key changes
    /// received from a Pod's Redis (Workhorse's `workhorse:notifications:` channel),
    /// each delivered to the polls held on that key.
    pub edge_poll_notifications: IntCounterVec,
    /// `podgate_proxy_fast_path_requests_total{result}`: HTTP/1 requests the fast
    /// path ([`crate::fast`]) served (`served`), or handed to pingora-proxy, by why
    /// (`tls`, `head`, `framing`, `rule`, `body`, `upgrade`, …).
    pub fast_path: IntCounterVec,
    /// `podgate_proxy_path_rules_total{outcome}`: requests whose path named a claim,
    /// by what came of it (`claimed`, `unclaimed`, `unavailable`, `unknown_cell`).
    pub path_rules: IntCounterVec,
    /// `podgate_proxy_topology_service_calls_total{result}`: classify calls to the
    /// Topology Service (`owner`, `unclaimed`, `error`, `deadline`; `skipped` while
    /// quiet after a failure).
    pub topology_calls: IntCounterVec,
    /// `podgate_proxy_classify_cache_total{event}`: path rules' cache (`hit`,
    /// `negative_hit`, `miss`, `expired`; `stale`: an expired owner kept while the
    /// Topology Service gives no answer).
    pub classify_cache: IntCounterVec,
    /// Idle client connections handed over at a binary upgrade (`crate::handover`).
    pub upgrade_connections: IntCounterVec,
    /// `podgate_proxy_upstream_in_use{pod}`: requests in flight to the Pod's web
    /// upstreams under `upstreams.max_connections_per_address`.
    pub upstream_in_use: IntGaugeVec,
    /// `podgate_proxy_upstream_queue{pod}`: requests waiting now under that bound.
    pub upstream_queue: IntGaugeVec,
    /// `podgate_proxy_upstream_queued_total{pod,result}`: requests that found their
    /// address at that bound and waited: `admitted` or `timed_out` (503).
    pub upstream_queued: IntCounterVec,
}

impl Metrics {
    fn new(registry: &Registry) -> prometheus::Result<Self> {
        let m = Metrics {
            requests: IntCounterVec::new(
                Opts::new(
                    "podgate_proxy_requests_total",
                    "Requests by rule, Pod (0: none), status, token source and outcome.",
                ),
                &["rule", "pod", "status", "source", "outcome"],
            )?,
            duration: HistogramVec::new(
                HistogramOpts::new(
                    "podgate_proxy_request_duration_seconds",
                    "Time from request start to the end of the response.",
                )
                .buckets(BUCKETS.to_vec()),
                &["rule", "status_class"],
            )?,
            decision: HistogramVec::new(
                HistogramOpts::new(
                    "podgate_proxy_decision_duration_seconds",
                    "Time to decide where a request goes (rule, token, classification).",
                )
                .buckets(DECISION_BUCKETS.to_vec()),
                &["rule"],
            )?,
            upstream_healthy: IntGaugeVec::new(
                Opts::new(
                    "podgate_proxy_upstream_healthy",
                    "1 when the upstream passes its active health check.",
                ),
                &["pod", "pool", "upstream"],
            )?,
            health_failures: IntCounterVec::new(
                Opts::new(
                    "podgate_proxy_health_check_failures_total",
                    "Failed active health checks.",
                ),
                &["pod", "upstream"],
            )?,
            connect_failures: IntCounterVec::new(
                Opts::new(
                    "podgate_proxy_upstream_connect_failures_total",
                    "Connections to an upstream that failed (then retried on the same Pod).",
                ),
                &["pod"],
            )?,
            cache_hits: IntCounter::new(
                "podgate_classifier_cache_hits_total",
                "Token verdicts answered from the classifier cache.",
            )?,
            cache_misses: IntCounter::new(
                "podgate_classifier_cache_misses_total",
                "Token verdicts computed (signature checked or token decoded).",
            )?,
            edge_polls_held: IntGaugeVec::new(
                Opts::new(
                    "podgate_proxy_edge_polls_held",
                    "jobs/request polls held at the edge now (no upstream connection).",
                ),
                &["pod"],
            )?,
            kas_open: IntGaugeVec::new(
                Opts::new(
                    "podgate_proxy_kas_open",
                    "Requests open now to a Pod's kas (gRPC calls, WebSockets), by client: runner (Job Router) or agent.",
                ),
                &["pod", "client"],
            )?,
            edge_polls: IntCounterVec::new(
                Opts::new(
                    "podgate_proxy_edge_polls_total",
                    "jobs/request polls of Pods that opt in to edge holds, by result.",
                ),
                &["pod", "result"],
            )?,
            edge_poll_redis_up: IntGaugeVec::new(
                Opts::new(
                    "podgate_proxy_edge_poll_redis_up",
                    "1 while the Pod's runner queue Redis is watched; 0: its polls are forwarded.",
                ),
                &["pod"],
            )?,
            edge_poll_redis_errors: IntCounterVec::new(
                Opts::new(
                    "podgate_proxy_edge_poll_redis_errors_total",
                    "Failed connections, commands and lost subscriptions to a Pod's runner queue Redis.",
                ),
                &["pod"],
            )?,
            edge_poll_notifications: IntCounterVec::new(
                Opts::new(
                    "podgate_proxy_edge_poll_notifications_total",
                    "Runner queue key changes received from a Pod's Redis and delivered to held polls.",
                ),
                &["pod"],
            )?,
            path_rules: IntCounterVec::new(
                Opts::new(
                    "podgate_proxy_path_rules_total",
                    "Requests whose path named a claim (a top-level namespace, an organization), by outcome.",
                ),
                &["outcome"],
            )?,
            topology_calls: IntCounterVec::new(
                Opts::new(
                    "podgate_proxy_topology_service_calls_total",
                    "Classify calls to the Topology Service by path rules, by result.",
                ),
                &["result"],
            )?,
            classify_cache: IntCounterVec::new(
                Opts::new(
                    "podgate_proxy_classify_cache_total",
                    "Path rules' cache of claim owners, by event.",
                ),
                &["event"],
            )?,
            fast_path: IntCounterVec::new(
                Opts::new(
                    "podgate_proxy_fast_path_requests_total",
                    "HTTP/1 requests served by the fast path, or handed to pingora-proxy (by reason).",
                ),
                &["result"],
            )?,
            upgrade_connections: IntCounterVec::new(
                Opts::new(
                    "podgate_proxy_upgrade_connections_total",
                    "Idle client connections handed to the new process at a binary upgrade: sent, send_failed (kept here), received.",
                ),
                &["result"],
            )?,
            upstream_in_use: IntGaugeVec::new(
                Opts::new(
                    "podgate_proxy_upstream_in_use",
                    "Requests in flight to the Pod's web upstreams, each on its own connection (bounded per address by upstreams.max_connections_per_address).",
                ),
                &["pod"],
            )?,
            upstream_queue: IntGaugeVec::new(
                Opts::new(
                    "podgate_proxy_upstream_queue",
                    "Requests waiting now for a slot under upstreams.max_connections_per_address.",
                ),
                &["pod"],
            )?,
            upstream_queued: IntCounterVec::new(
                Opts::new(
                    "podgate_proxy_upstream_queued_total",
                    "Requests that found their upstream address at upstreams.max_connections_per_address and waited: admitted, or timed_out (answered 503).",
                ),
                &["pod", "result"],
            )?,
        };
        registry.register(Box::new(m.requests.clone()))?;
        registry.register(Box::new(m.duration.clone()))?;
        registry.register(Box::new(m.decision.clone()))?;
        registry.register(Box::new(m.upstream_healthy.clone()))?;
        registry.register(Box::new(m.health_failures.clone()))?;
        registry.register(Box::new(m.connect_failures.clone()))?;
        registry.register(Box::new(m.upstream_in_use.clone()))?;
        registry.register(Box::new(m.upstream_queue.clone()))?;
        registry.register(Box::new(m.upstream_queued.clone()))?;
        registry.register(Box::new(m.cache_hits.clone()))?;
        registry.register(Box::new(m.cache_misses.clone()))?;
        registry.register(Box::new(m.edge_polls_held.clone()))?;
        registry.register(Box::new(m.edge_polls.clone()))?;
        registry.register(Box::new(m.kas_open.clone()))?;
        registry.register(Box::new(m.edge_poll_redis_up.clone()))?;
        registry.register(Box::new(m.edge_poll_redis_errors.clone()))?;
        registry.register(Box::new(m.edge_poll_notifications.clone()))?;
        registry.register(Box::new(m.fast_path.clone()))?;
        registry.register(Box::new(m.path_rules.clone()))?;
        registry.register(Box::new(m.topology_calls.clone()))?;
        registry.register(Box::new(m.classify_cache.clone()))?;
        registry.register(Box::new(m.upgrade_connections.clone()))?;
        Ok(m)
    }

    /// Bring the mirrored classifier counters up to `hits`/`misses` (monotonic).
    pub fn set_cache(&self, hits: u64, misses: u64) {
        self.cache_hits
            .inc_by(hits.saturating_sub(self.cache_hits.get()));
        self.cache_misses
            .inc_by(misses.saturating_sub(self.cache_misses.get()));
    }
}

/// The process's metrics.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    Metrics::new(prometheus::default_registry()).expect("metric names are unique and valid")
});

/// Everything in the default registry, in the Prometheus text format.
pub fn render() -> String {
    use prometheus::Encoder;
    let mut out = Vec::new();
    let families = prometheus::gather();
    // Encoding into a Vec cannot fail for well-formed families.
    let _ = prometheus::TextEncoder::new().encode(&families, &mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// The status classes, in `status_class_index` order.
const CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "none"];

/// Index into the status classes (`1xx` … `5xx`, then `none` for 0, no response).
pub fn status_class_index(status: u16) -> usize {
    match status / 100 {
        1..=5 => usize::from(status / 100) - 1,
        _ => 5,
    }
}

/// One rule's histogram children, resolved once so the request path does no label
/// hashing for them.
pub struct RuleHistograms {
    /// `podgate_proxy_decision_duration_seconds{rule}`.
    pub decision: prometheus::Histogram,
    /// `podgate_proxy_request_duration_seconds{rule,status_class}`, by class index.
    pub duration: [prometheus::Histogram; 6],
}

impl RuleHistograms {
    /// The children for rule `rule`.
    pub fn new(rule: &str) -> Self {
        RuleHistograms {
            decision: METRICS.decision.with_label_values(&[rule]),
            duration: CLASSES.map(|c| METRICS.duration.with_label_values(&[rule, c])),
        }
    }
}

/// Count one finished request in `podgate_proxy_requests_total` under `labels`
/// (rule, pod, status, source, outcome). Each thread keeps the children it counted
/// last: a request like the one before it compares five short strings instead of
/// hashing them and taking the vector's lock. The vector's children are never
/// removed, so a kept one is always the one exported.
pub fn count_request(labels: [&str; 5]) {
    /// Label sets kept per thread (a proxy thread sees few: rules × Pods ×
    /// outcomes actually seen).
    const KEPT: usize = 32;
    thread_local! {
        static RECENT: std::cell::RefCell<Vec<([String; 5], IntCounter)>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }
    RECENT.with_borrow_mut(|recent| {
        if let Some((_, counter)) = recent.iter().find(|(kept, _)| *kept == labels) {
            counter.inc();
            return;
        }
        let counter = METRICS.requests.with_label_values(&labels);
        counter.inc();
        if recent.len() == KEPT {
            recent.remove(0);
        }
        recent.push((labels.map(str::to_owned), counter));
    });
}

/// `2xx`, `4xx`, … for a status (0, no response: `none`).
pub fn status_class(status: u16) -> &'static str {
    CLASSES[status_class_index(status)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_register_and_render() {
        METRICS
            .requests
            .with_label_values(&["metrics-test", "2", "200", "json:token", "routable"])
            .inc();
        let text = render();
        assert!(
            text.contains(r#"podgate_proxy_requests_total{outcome="routable",pod="2",rule="metrics-test",source="json:token",status="200"} 1"#),
            "{text}"
        );
        assert!(
            text.contains("podgate_classifier_cache_hits_total"),
            "{text}"
        );
        // The classifier's counts become counters: they only grow. On a registry of
        // its own, as tests beside this one render the process's.
        let own = Metrics::new(&prometheus::Registry::new()).unwrap();
        own.set_cache(5, 2);
        own.set_cache(7, 2);
        own.set_cache(6, 1);
        assert_eq!((own.cache_hits.get(), own.cache_misses.get()), (7, 2));
        METRICS.edge_polls_held.with_label_values(&["9"]).set(2);
        METRICS
            .edge_polls
            .with_label_values(&["9", "timeout"])
            .inc();
        METRICS.edge_poll_redis_up.with_label_values(&["9"]).set(1);
        METRICS
            .edge_poll_redis_errors
            .with_label_values(&["9"])
            .inc();
        let text = render();
        for sample in [
            r#"podgate_proxy_edge_polls_held{pod="9"} 2"#,
            r#"podgate_proxy_edge_polls_total{pod="9",result="timeout"} 1"#,
            r#"podgate_proxy_edge_poll_redis_up{pod="9"} 1"#,
            r#"podgate_proxy_edge_poll_redis_errors_total{pod="9"} 1"#,
        ] {
            assert!(text.contains(sample), "{sample}: {text}");
        }
        // Counted through the thread's kept child, and through a new one.
        for _ in 0..3 {
            count_request(["metrics-test", "2", "200", "json:token", "routable"]);
        }
        count_request(["metrics-test", "2", "404", "json:token", "routable"]);
        let count = |status| {
            METRICS
                .requests
                .with_label_values(&["metrics-test", "2", status, "json:token", "routable"])
                .get()
        };
        assert_eq!((count("200"), count("404")), (4, 1));
        assert_eq!(status_class(503), "5xx");
        assert_eq!(status_class(0), "none");
    }
}
