//! Keeps the Grafana dashboards honest: the proxy's
//! (`proxy/dashboards/podgate-proxy.json`) and the one for kas and agentk
//! (`agent/dashboards/podgate-kas.json`). Each must parse, be importable (a
//! `DS_PROMETHEUS` input used by every panel and query), have unique panel ids and a
//! query on every panel, query only metrics its processes register, and chart every
//! one of them.
//!
//! The checks are generic; [`proxy`] and [`kas`] supply the dashboard, the metric
//! names read from the real exposition, and the list those names must equal, so a
//! metric added without a panel fails here.

use std::collections::{BTreeSet, HashSet};

use regex::Regex;
use serde_json::Value;

fn parse(text: &str) -> Value {
    serde_json::from_str(text).expect("the dashboard is valid JSON")
}

/// Every panel, rows included, with the panels of collapsed rows flattened in.
fn panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for panel in list.as_array().expect("`panels` is an array") {
            out.push(panel);
            if let Some(nested) = panel.get("panels") {
                walk(nested, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

fn is_row(panel: &Value) -> bool {
    panel["type"] == "row"
}

fn title(panel: &Value) -> &str {
    panel["title"].as_str().unwrap_or("<untitled>")
}

fn targets(panel: &Value) -> &[Value] {
    panel
        .get("targets")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn exprs(panel: &Value) -> impl Iterator<Item = &str> {
    targets(panel)
        .iter()
        .filter_map(|t| t.get("expr").and_then(Value::as_str))
}

/// The metric names a PromQL expression refers to, histogram suffixes removed.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let name = Regex::new(r"podgate_[a-z0-9_]+").expect("valid regex");
    name.find_iter(expr)
        .map(|m| {
            let n = m.as_str();
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .unwrap_or(n)
                .to_owned()
        })
        .collect()
}

/// The families in a text exposition whose names start with one of `prefixes`.
fn exposed(text: &str, prefixes: &[&str]) -> BTreeSet<String> {
    crate::common::metrics::families(text)
        .into_iter()
        .filter(|n| prefixes.iter().any(|p| n.starts_with(p)))
        .collect()
}

/// Identity, the `DS_PROMETHEUS` input, `__requires` for every panel type used, and
/// the template variables `vars`.
fn check_identity_and_import_metadata(d: &Value, uid: &str, name: &str, vars: &[&str]) {
    assert_eq!(d["uid"], uid);
    assert_eq!(d["title"], name);
    assert_eq!(d["schemaVersion"], 39);

    let inputs = d["__inputs"].as_array().expect("`__inputs` is an array");
    assert!(
        inputs
            .iter()
            .any(|i| i["name"] == "DS_PROMETHEUS" && i["pluginId"] == "prometheus"),
        "no DS_PROMETHEUS input: {inputs:?}"
    );

    let requires: HashSet<(&str, &str)> = d["__requires"]
        .as_array()
        .expect("`__requires` is an array")
        .iter()
        .filter_map(|r| Some((r["type"].as_str()?, r["id"].as_str()?)))
        .collect();
    assert!(requires.contains(&("grafana", "grafana")), "{requires:?}");
    assert!(
        requires.contains(&("datasource", "prometheus")),
        "{requires:?}"
    );
    for panel in panels(d).into_iter().filter(|p| !is_row(p)) {
        let kind = panel["type"].as_str().expect("panel type is a string");
        assert!(
            requires.contains(&("panel", kind)),
            "panel type {kind} (\"{}\") missing from __requires",
            title(panel)
        );
    }

    let templating = d["templating"]["list"].as_array().expect("templating list");
    for v in templating {
        assert_eq!(
            v["datasource"]["uid"], "${DS_PROMETHEUS}",
            "variable {} datasource",
            v["name"]
        );
    }
    let names: Vec<&str> = templating
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    for var in vars {
        assert!(names.contains(var), "no `{var}` variable: {names:?}");
    }
}

/// Unique ids, a title, a description and a place on the grid for every panel; the
/// `DS_PROMETHEUS` data source and a non-empty query on every non-row panel.
fn check_panels_are_well_formed(d: &Value) {
    let all = panels(d);
    assert!(!all.is_empty());

    let mut ids = HashSet::new();
    for panel in &all {
        let id = panel["id"].as_u64().expect("every panel has a numeric id");
        assert!(ids.insert(id), "duplicate panel id {id}");
        assert!(
            panel["title"].as_str().is_some_and(|t| !t.is_empty()),
            "panel {id} has no title"
        );
        assert!(
            panel["description"].as_str().is_some_and(|t| !t.is_empty()),
            "panel {id} has no description"
        );
        let grid = &panel["gridPos"];
        for key in ["h", "w", "x", "y"] {
            assert!(grid[key].is_u64(), "panel {id}: gridPos.{key} missing");
        }
        assert!(
            grid["x"].as_u64().unwrap_or(0) + grid["w"].as_u64().unwrap_or(0) <= 24,
            "panel {id} is wider than the grid"
        );
        if let Some(ds) = panel.get("datasource") {
            assert_eq!(ds["uid"], "${DS_PROMETHEUS}", "panel {id} datasource");
        }
        if is_row(panel) {
            continue;
        }
        assert_eq!(
            panel["datasource"]["uid"], "${DS_PROMETHEUS}",
            "panel {id} datasource"
        );
        let targets = targets(panel);
        assert!(!targets.is_empty(), "panel {id} has no targets");
        for t in targets {
            assert_eq!(
                t["datasource"]["uid"], "${DS_PROMETHEUS}",
                "panel {id} target datasource"
            );
            assert!(
                t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()),
                "panel {id} has a target without an expr"
            );
        }
    }
}

/// `registered` (read from the real exposition) equals `expected`; the panels and
/// template variables query only registered metrics, and the panels chart all of them.
fn check_metrics(d: &Value, registered: &BTreeSet<String>, expected: &[&str], who: &str) {
    let expected: BTreeSet<String> = expected.iter().map(|s| (*s).to_owned()).collect();
    assert_eq!(
        *registered, expected,
        "{who}'s metrics changed: update the dashboard and EXPECTED"
    );

    let mut used = BTreeSet::new();
    for panel in panels(d) {
        for expr in exprs(panel) {
            for name in metric_names(expr) {
                assert!(
                    registered.contains(&name),
                    "panel \"{}\" queries {name}, which {who} does not register",
                    title(panel)
                );
                used.insert(name);
            }
        }
    }
    let unused: Vec<_> = expected.difference(&used).collect();
    assert!(unused.is_empty(), "no panel charts {unused:?}");

    for v in d["templating"]["list"].as_array().into_iter().flatten() {
        let query = v["definition"].as_str().unwrap_or_default();
        for name in metric_names(query) {
            assert!(
                registered.contains(&name),
                "variable {} queries {name}, which {who} does not register",
                v["name"]
            );
        }
    }
}

#[test]
fn metric_name_extraction() {
    let names = metric_names(
        "histogram_quantile(0.99, sum by (le) (rate(podgate_proxy_request_duration_seconds_bucket[5m]))) \
         / podgate_proxy_decision_duration_seconds_count + podgate_proxy_requests_total",
    );
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "podgate_proxy_decision_duration_seconds",
            "podgate_proxy_request_duration_seconds",
            "podgate_proxy_requests_total",
        ]
    );
}

/// The proxy's dashboard.
mod proxy {
    use std::collections::BTreeSet;

    use podgate_proxy::metrics::{METRICS, render};
    use serde_json::Value;

    /// The dashboard, embedded at compile time so the test needs no working directory.
    const DASHBOARD: &str = include_str!("../proxy/dashboards/podgate-proxy.json");

    /// Every metric the proxy defines in `metrics.rs`.
    const EXPECTED: [&str; 22] = [
        "podgate_proxy_requests_total",
        "podgate_proxy_request_duration_seconds",
        "podgate_proxy_decision_duration_seconds",
        "podgate_proxy_upstream_healthy",
        "podgate_proxy_health_check_failures_total",
        "podgate_proxy_upstream_connect_failures_total",
        "podgate_proxy_upstream_in_use",
        "podgate_proxy_upstream_queue",
        "podgate_proxy_upstream_queued_total",
        "podgate_classifier_cache_hits_total",
        "podgate_classifier_cache_misses_total",
        "podgate_proxy_fast_path_requests_total",
        "podgate_proxy_upgrade_connections_total",
        "podgate_proxy_edge_polls_held",
        "podgate_proxy_edge_polls_total",
        "podgate_proxy_edge_poll_redis_up",
        "podgate_proxy_edge_poll_redis_errors_total",
        "podgate_proxy_edge_poll_notifications_total",
        "podgate_proxy_kas_open",
        "podgate_proxy_path_rules_total",
        "podgate_proxy_topology_service_calls_total",
        "podgate_proxy_classify_cache_total",
    ];

    /// EXPECTED is what `metrics.rs` declares: a metric added there and touched
    /// nowhere in [`registered`] would otherwise go unseen (five edge-poll metrics
    /// did, uncharted).
    #[test]
    fn expected_is_every_metric_metrics_rs_declares() {
        let source = include_str!("../proxy/src/metrics.rs");
        let declared: BTreeSet<&str> = regex::Regex::new(r#"\n\s*"(podgate_[a-z0-9_]+)","#)
            .unwrap()
            .captures_iter(source)
            .map(|c| c.get(1).unwrap().as_str())
            .collect();
        assert_eq!(declared, EXPECTED.into_iter().collect());
    }

    fn dashboard() -> Value {
        super::parse(DASHBOARD)
    }

    /// The `podgate_*` metric names the proxy registers, read from its own exposition.
    fn registered() -> BTreeSet<String> {
        // Vectors are rendered only once they have a child: touch one of each.
        let m = &*METRICS;
        m.requests
            .with_label_values(&["dashboard-test", "0", "200", "none", "routable"])
            .inc();
        m.duration
            .with_label_values(&["dashboard-test", "2xx"])
            .observe(0.001);
        m.decision
            .with_label_values(&["dashboard-test"])
            .observe(0.000_01);
        m.upstream_healthy
            .with_label_values(&["1", "web", "127.0.0.1:1"])
            .set(1);
        m.health_failures
            .with_label_values(&["1", "127.0.0.1:1"])
            .inc();
        m.connect_failures.with_label_values(&["1"]).inc();
        m.upstream_in_use.with_label_values(&["1"]).set(1);
        m.upstream_queue.with_label_values(&["1"]).set(0);
        m.upstream_queued
            .with_label_values(&["1", "admitted"])
            .inc();
        m.fast_path.with_label_values(&["served"]).inc();
        m.upgrade_connections.with_label_values(&["sent"]).inc();
        m.edge_polls_held.with_label_values(&["2"]).set(1);
        m.edge_polls.with_label_values(&["2", "timeout"]).inc();
        m.edge_poll_redis_up.with_label_values(&["2"]).set(1);
        m.edge_poll_redis_errors.with_label_values(&["2"]).inc();
        m.edge_poll_notifications.with_label_values(&["2"]).inc();
        m.kas_open.with_label_values(&["2", "runner"]).set(0);
        m.path_rules.with_label_values(&["claimed"]).inc();
        m.topology_calls.with_label_values(&["owner"]).inc();
        m.classify_cache.with_label_values(&["hit"]).inc();
        m.set_cache(1, 1);
        // `render` is the whole default registry. A running proxy also serves its
        // presence registry's `podgate_registry_*` families there (charted on the
        // kas dashboard): left out here.
        super::exposed(&render(), &["podgate_"])
            .into_iter()
            .filter(|n| !n.starts_with("podgate_registry_"))
            .collect()
    }

    #[test]
    fn identity_and_import_metadata() {
        super::check_identity_and_import_metadata(
            &dashboard(),
            "podgate-proxy",
            "podgate proxy",
            &["job", "rule", "pod"],
        );
    }

    #[test]
    fn panels_are_well_formed() {
        super::check_panels_are_well_formed(&dashboard());
    }

    #[test]
    fn queries_only_registered_metrics_and_charts_all_of_them() {
        super::check_metrics(&dashboard(), &registered(), &EXPECTED, "the proxy");
    }
}

/// The kas and agentk dashboard.
mod kas {
    use std::collections::BTreeSet;
    use std::sync::Arc;
    use std::time::Duration;

    use podgate_agentk::AgentkMetrics;
    use podgate_kas::agent_auth::{AgentAuth, AgentInfoConfig};
    use podgate_kas::metrics::{KasMetrics, Outcome};
    use podgate_registry::testing::{RedisServer, free_port};
    use podgate_registry::{
        AgentConnection, AgentEvent, BackendConfig, MemoryBackend, Pod, Registry, RegistryConfig,
        Topology,
    };
    use podgate_tokens::{Classifier, KeySet, PodId};
    use serde_json::Value;

    /// The dashboard, embedded at compile time so the test needs no working directory.
    const DASHBOARD: &str = include_str!("../agent/dashboards/podgate-kas.json");

    /// Every metric kas, the presence registry it serves beside them and agentk
    /// define (in [`SOURCES`]).
    const EXPECTED: [&str; 47] = [
        "podgate_kas_connected_agents",
        "podgate_kas_tunnels",
        "podgate_kas_routing_duration_seconds",
        "podgate_kas_routing_waits_total",
        "podgate_kas_routing_waiting",
        "podgate_kas_routing_timeouts_total",
        "podgate_kas_reroutes_total",
        "podgate_kas_routed_total",
        "podgate_kas_registry_errors_total",
        "podgate_kas_agent_info_lookups_total",
        "podgate_kas_auth_failures_total",
        "podgate_kas_tunnels_refused_total",
        "podgate_kas_tunnels_misplaced_total",
        "podgate_kas_agent_config_posts_total",
        "podgate_kas_agent_config_rejected_total",
        "podgate_kas_module_requests_total",
        "podgate_kas_k8s_proxy_gitlab_lookups_total",
        "podgate_kas_workspace_requests_total",
        "podgate_kas_job_router_calls_total",
        "podgate_kas_job_router_holds_total",
        "podgate_kas_job_router_held",
        "podgate_kas_job_router_queue_redis_up",
        "podgate_kas_job_router_queue_redis_errors_total",
        "podgate_kas_job_router_notifications_total",
        "podgate_registry_backend_up",
        "podgate_registry_backend_errors_total",
        "podgate_registry_corrupt_values_total",
        "podgate_registry_owned_connections",
        "podgate_registry_refresh_duration_seconds",
        "podgate_registry_gc_removed_total",
        "podgate_registry_topology_version",
        "podgate_registry_events_total",
        "podgate_agentk_connected",
        "podgate_agentk_tunnels",
        "podgate_agentk_graph_requests",
        "podgate_agentk_graph_informers",
        "podgate_agentk_graph_objects",
        "podgate_agentk_graph_actions_total",
        "podgate_agentk_graph_warnings_total",
        "podgate_agentk_connects_total",
        "podgate_agentk_requests_total",
        "podgate_agentk_request_duration_seconds",
        "podgate_agentk_workspaces_cycles_total",
        "podgate_agentk_workspaces_apply_errors_total",
        "podgate_agentk_workspaces_sent_total",
        "podgate_agentk_workspaces_leader",
        "podgate_agentk_workspaces_cycle_duration_seconds",
    ];

    /// Where kas, agentk and the presence registry declare their metrics.
    const SOURCES: [&str; 9] = [
        include_str!("../agent/kas/src/metrics.rs"),
        include_str!("../agent/kas/src/agent_auth.rs"),
        include_str!("../agent/kas/src/agent_config/mod.rs"),
        include_str!("../agent/kas/src/gitlab_access/mod.rs"),
        include_str!("../agent/kas/src/k8s_proxy/auth/mod.rs"),
        include_str!("../agent/kas/src/workspaces/mod.rs"),
        include_str!("../agent/kas/src/job_router/metrics.rs"),
        include_str!("../agent/agentk/src/metrics.rs"),
        include_str!("../pod-registry/src/metrics.rs"),
    ];

    /// Declared by crate-private parts of kas that register them when kas starts
    /// (its agent configurations, GitLab access, Kubernetes API proxy and Workspaces
    /// servers), not reachable from here: their exposition by a running kas is
    /// checked by `tests/prometheus.rs`, whose Prometheus queries every panel.
    const DECLARED_PRIVATELY: [&str; 5] = [
        "podgate_kas_agent_config_posts_total",
        "podgate_kas_agent_config_rejected_total",
        "podgate_kas_module_requests_total",
        "podgate_kas_k8s_proxy_gitlab_lookups_total",
        "podgate_kas_workspace_requests_total",
    ];

    /// EXPECTED is what the sources declare (the proxy's test does the same): six
    /// metrics went uncharted without it.
    #[test]
    fn expected_is_every_metric_the_sources_declare() {
        // Every quoted metric name: declarations (and tests that name them).
        let re = regex::Regex::new(r#""(podgate_[a-z0-9_]+)""#).unwrap();
        let declared: BTreeSet<&str> = SOURCES
            .iter()
            .flat_map(|s| re.captures_iter(s).map(|c| c.get(1).unwrap().as_str()))
            .collect();
        assert_eq!(declared, EXPECTED.into_iter().collect());
    }

    /// kas's exposition is its own registry plus the process-wide one, which in this
    /// test binary also holds the proxy's metrics: keep only these families.
    const PREFIXES: [&str; 3] = ["podgate_kas_", "podgate_registry_", "podgate_agentk_"];

    fn dashboard() -> Value {
        super::parse(DASHBOARD)
    }

    /// The metric names kas and agentk register, read from their own expositions.
    /// Vectors are rendered only once they have a child, and the presence registry's
    /// families only once the code that owns them ran: touch every one.
    async fn registered() -> BTreeSet<String> {
        let kas = KasMetrics::new();
        for outcome in [
            Outcome::Local,
            Outcome::Kas,
            Outcome::Timeout,
            Outcome::Error,
            Outcome::Cancelled,
        ] {
            kas.routed("GetPods", outcome, 0.001);
        }
        kas.registry_error("dashboard-test");
        kas.auth_failure(
            "external",
            podgate_agent::auth::Refusal::Signature,
            &tonic::metadata::MetadataMap::new(),
        );
        agent_info_lookup(&kas).await;
        podgate_kas::job_router::JobRouterMetrics::new(kas.registry());
        // Each registry has its own metrics (a kas serves its registry's).
        let mut families = touch_memory_registry().await;
        families.extend(touch_redis_registry().await);

        let agentk = AgentkMetrics::new();
        agentk.connect("ok");
        agentk.answered("GetPods", tonic::Code::Ok, Duration::from_millis(1));
        agentk
            .workspaces
            .cycle("partial", true, Duration::from_millis(1));

        let mut names = super::exposed(&kas.render(), &PREFIXES);
        names.extend(super::exposed(&agentk.render(), &PREFIXES));
        let mut text = Vec::new();
        prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &families, &mut text)
            .expect("encodes");
        names.extend(super::exposed(
            &String::from_utf8(text).expect("utf-8"),
            &PREFIXES,
        ));
        names
    }

    /// One opaque-token lookup, so `podgate_kas_agent_info_lookups_total` gets a
    /// child: "GitLab" is a closed port, so the result is `error`.
    async fn agent_info_lookup(kas: &KasMetrics) {
        let auth = AgentAuth::new(
            Arc::new(Classifier::with_keys(KeySet::new())),
            Some(AgentInfoConfig {
                url: format!("http://127.0.0.1:{}", free_port()),
                secret: vec![7; 32],
                positive_ttl: Duration::from_secs(300),
                negative_ttl: Duration::from_secs(60),
                timeout: Duration::from_secs(5),
            }),
            kas.registry(),
        );
        let mut metadata = tonic::metadata::MetadataMap::new();
        metadata.insert(
            "authorization",
            "Bearer glagent-dashboard-0123456789abcdefgh"
                .parse()
                .expect("valid metadata"),
        );
        let refused = auth
            .authenticate(&metadata)
            .await
            .expect_err("GitLab is not there");
        assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    }

    /// An in-memory registry through a topology change, one agent connection's life,
    /// a refresh and a GC.
    async fn touch_memory_registry() -> Vec<prometheus::proto::MetricFamily> {
        let registry = Registry::with_memory(
            MemoryBackend::new(Topology::default()),
            RegistryConfig::default(),
        )
        .await
        .expect("a memory registry");
        let pod = PodId::new(1).expect("a Pod id");
        registry
            .put_pod(Pod::new(pod, "pod-1", "127.0.0.1:1"))
            .await
            .expect("topology change");
        let mut events = registry.subscribe();
        registry
            .register_agent(AgentConnection {
                agent_id: 7,
                connection_id: 1,
                project_id: 70,
                version: String::new(),
                commit: String::new(),
                pod_namespace: String::new(),
                pod_name: String::new(),
                kubernetes_version: None,
                connected_at_ms: 0,
                kas: "grpc://127.0.0.1:1".into(),
            })
            .await
            .expect("register");
        // The event is counted before it is passed on: once heard, it is in
        // `podgate_registry_events_total`.
        tokio::time::timeout(Duration::from_secs(5), async {
            while !matches!(events.recv().await, Ok(AgentEvent::Connected { .. })) {}
        })
        .await
        .expect("the connect event arrives");
        registry.refresh().await.expect("refresh");
        registry.unregister_agent(7, 1).await.expect("unregister");
        registry.gc().await.expect("gc");
        registry.shutdown().await.expect("shutdown");
        registry.metrics().gather()
    }

    /// `podgate_registry_corrupt_values_total` and `..._backend_errors_total` only
    /// move on the Redis backend: read an undecodable value, then call a dead server.
    async fn touch_redis_registry() -> Vec<prometheus::proto::MetricFamily> {
        let mut redis = tokio::task::spawn_blocking(RedisServer::start)
            .await
            .expect("redis-server starts");
        let registry = Registry::connect(RegistryConfig {
            backend: BackendConfig::Redis { url: redis.url() },
            ..RegistryConfig::default()
        })
        .await
        .expect("a Redis registry");
        redis.cli(&["HSET", "podgate:{kas}:instances", "bad", "not json"]);
        let instances = registry.kas_instances().await.expect("Redis answers");
        assert!(instances.is_empty(), "{instances:?}");
        redis.kill();
        registry.kas_instances().await.expect_err("Redis is gone");
        registry.metrics().gather()
    }

    #[test]
    fn identity_and_import_metadata() {
        super::check_identity_and_import_metadata(
            &dashboard(),
            "podgate-kas",
            "podgate kas and agentk",
            &["job", "instance", "agentk_job"],
        );
    }

    #[test]
    fn panels_are_well_formed() {
        super::check_panels_are_well_formed(&dashboard());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queries_only_registered_metrics_and_charts_all_of_them() {
        let mut registered = registered().await;
        for name in DECLARED_PRIVATELY {
            assert!(
                registered.insert(name.to_owned()),
                "{name} is reachable now"
            );
        }
        super::check_metrics(&dashboard(), &registered, &EXPECTED, "kas or agentk");
    }
}
