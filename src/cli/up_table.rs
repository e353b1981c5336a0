//! `podgate up`'s live table: runner traffic per Pod as each simulated Pod counted it,
//! polls held inside each Pod (its Workhorse) and at the proxy's edge, requests per
//! token source and edge long-poll outcomes from the proxy's `/metrics`, misroutes.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use podgate_loadtest::pod_sim::{PodSim, sum_samples};

/// The simulator's `podsim_requests_total` endpoints that are not runner traffic: the
/// proxy's health probes, metrics scrapes, the control API and the current user.
const NOT_RUNNER_TRAFFIC: [&str; 4] = ["health", "metrics", "control", "user"];

/// Endpoint prefixes of GitLab's internal API for kas and agents (Kubernetes API
/// proxy authorization, agent configuration, Workspaces reconciliation): not runner
/// traffic either.
const AGENT_TRAFFIC: [&str; 3] = ["k8s_", "ws_", "agentw_"];

/// Runner requests a Pod answered (every endpoint but [`NOT_RUNNER_TRAFFIC`] and
/// [`AGENT_TRAFFIC`]), and of them `jobs/request` polls, from the simulator's own
/// `podsim_requests_total`.
fn runner_traffic(sim: &PodSim) -> (u64, u64) {
    let text = sim.metrics().render();
    let prefix = "podsim_requests_total{";
    let all = sum_samples(&text, prefix, |l| {
        label(l, "endpoint").is_some_and(|e| {
            !NOT_RUNNER_TRAFFIC.contains(&e) && !AGENT_TRAFFIC.iter().any(|p| e.starts_with(p))
        })
    });
    let polls = sum_samples(&text, prefix, |l| {
        label(l, "endpoint") == Some("jobs_request")
    });
    (all, polls)
}

/// Polls Pod `sim`'s Workhorse holds now (`podsim_workhorse_register_open`).
fn held_polls(sim: &PodSim) -> u64 {
    sum_samples(
        &sim.metrics().render(),
        "podsim_workhorse_register_open{",
        |l| label(l, "state") == Some("watching"),
    )
}

/// `source="…"` of a metric line.
fn label<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let start = line.find(&format!("{name}=\""))? + name.len() + 2;
    let len = line[start..].find('"')?;
    Some(&line[start..start + len])
}

/// The samples of a family (`prefix`: its name and `{`) summed by the value of label
/// `name`.
fn by_label(metrics: &str, prefix: &str, name: &str) -> BTreeMap<String, u64> {
    let mut sums = BTreeMap::new();
    for l in metrics.lines().filter(|l| l.starts_with(prefix)) {
        if let (Some(value), Some(n)) = (
            label(l, name),
            l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()),
        ) {
            *sums.entry(value.to_owned()).or_default() += n as u64;
        }
    }
    sums
}

/// The table, from the Pods' own counters and the proxy's `/metrics` text.
pub(crate) fn table(sims: &[PodSim], proxy_metrics: &str) -> String {
    let mut out = String::from(
        "  Pod  address              requests  jobs/request  held in Pod  held at edge  misroutes\n",
    );
    for s in sims {
        let (requests, polls) = runner_traffic(s);
        let pod = s.state().pod().to_string();
        let at_edge = sum_samples(proxy_metrics, "podgate_proxy_edge_polls_held{", |l| {
            label(l, "pod") == Some(pod.as_str())
        });
        let _ = writeln!(
            out,
            "  {:<4} {:<20} {:>8}  {:>12}  {:>11}  {:>12}  {:>9}",
            s.state().pod(),
            s.addr(),
            requests,
            polls,
            held_polls(s),
            at_edge,
            s.metrics().misrouted.get()
        );
    }
    let edge = by_label(proxy_metrics, "podgate_proxy_edge_polls_total{", "result");
    if !edge.is_empty() {
        let parts: Vec<String> = edge.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(out, "  edge long polls: {}", parts.join("   "));
    }
    let by_source = by_label(proxy_metrics, "podgate_proxy_requests_total{", "source");
    out.push_str("  token source          requests through the proxy\n");
    for (src, n) in by_source {
        let _ = writeln!(out, "  {src:<21} {n:>8}");
    }
    let misroutes: u64 = sims.iter().map(|s| s.metrics().misrouted.get()).sum();
    let _ = writeln!(out, "  misroutes: {misroutes}");
    out
}
