//! Keeps the Grafana dashboard (`proxy/dashboards/podgate-proxy.json`) honest: it
//! must parse, be importable (a `DS_PROMETHEUS` input used by every panel and
//! query), have unique panel ids and a query on every panel, query only metrics the
//! proxy registers, and chart every one of them.

use std::collections::{BTreeSet, HashSet};

use podgate_proxy::metrics::{METRICS, render};
use regex::Regex;
use serde_json::Value;

/// The dashboard, embedded at compile time so the test needs no working directory.
const DASHBOARD: &str = include_str!("../dashboards/podgate-proxy.json");

/// Every metric the proxy defines in `metrics.rs`.
const EXPECTED: [&str; 8] = [
    "podgate_proxy_requests_total",
    "podgate_proxy_request_duration_seconds",
    "podgate_proxy_decision_duration_seconds",
    "podgate_proxy_upstream_healthy",
    "podgate_proxy_health_check_failures_total",
    "podgate_proxy_upstream_connect_failures_total",
    "podgate_classifier_cache_hits_total",
    "podgate_classifier_cache_misses_total",
];

fn dashboard() -> Value {
    serde_json::from_str(DASHBOARD).expect("the dashboard is valid JSON")
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
    let name = Regex::new(r"podgate_[a-z_]+").expect("valid regex");
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
    m.set_cache(1, 1);
    render()
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with("podgate_"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn identity_and_import_metadata() {
    let d = dashboard();
    assert_eq!(d["uid"], "podgate-proxy");
    assert_eq!(d["title"], "podgate proxy");
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
    for panel in panels(&d).into_iter().filter(|p| !is_row(p)) {
        let kind = panel["type"].as_str().expect("panel type is a string");
        assert!(
            requires.contains(&("panel", kind)),
            "panel type {kind} (\"{}\") missing from __requires",
            title(panel)
        );
    }

    let vars: Vec<&str> = d["templating"]["list"]
        .as_array()
        .expect("templating list")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    for name in ["job", "rule", "pod"] {
        assert!(vars.contains(&name), "no `{name}` variable: {vars:?}");
    }
}

#[test]
fn panels_are_well_formed() {
    let d = dashboard();
    let all = panels(&d);
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

#[test]
fn queries_only_registered_metrics_and_charts_all_of_them() {
    let registered = registered();
    let expected: BTreeSet<String> = EXPECTED.iter().map(|s| (*s).to_owned()).collect();
    assert_eq!(
        registered, expected,
        "the proxy's metrics changed: update the dashboard and EXPECTED"
    );

    let d = dashboard();
    let mut used = BTreeSet::new();
    for panel in panels(&d) {
        for expr in exprs(panel) {
            for name in metric_names(expr) {
                assert!(
                    registered.contains(&name),
                    "panel \"{}\" queries {name}, which the proxy does not register",
                    title(panel)
                );
                used.insert(name);
            }
        }
    }
    let unused: Vec<_> = expected.difference(&used).collect();
    assert!(unused.is_empty(), "no panel charts {unused:?}");
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
