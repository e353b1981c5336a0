//! `podgate up`'s live table: runner traffic per Pod as each simulated Pod counted it,
//! polls held inside each Pod (its Workhorse) and at the proxy's edge, requests per
//! token source, edge long-poll and path rule outcomes from the proxy's `/metrics`,
//! misroutes, and the pages of each Pod's namespaces it served (path-routed).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use podgate_loadtest::pod_sim::{PodSim, sum_samples};

/// The simulator's `podsim_requests_total` endpoints that are not runner traffic: the
/// proxy's health probes, metrics scrapes, the control API, the current user, and
/// the pages of the Pod's namespaces ([`PAGES`]).
const NOT_RUNNER_TRAFFIC: [&str; 6] = [
    "health",
    "metrics",
    "control",
    "user",
    "namespace_page",
    "organization_page",
];

/// The endpoints of the Pod's group and organization pages: requests the proxy's
/// path rules brought.
const PAGES: [&str; 2] = ["namespace_page", "organization_page"];

/// Pages of the Pod's namespaces it answered (path-routed requests).
fn pages(sim: &PodSim) -> u64 {
    sum_samples(&sim.metrics().render(), "podsim_requests_total{", |l| {
        label(l, "endpoint").is_some_and(|e| PAGES.contains(&e))
    })
}

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
        "  Pod  address              requests  jobs/request  held in Pod  held at edge  misroutes  by path\n",
    );
    for s in sims {
        let (requests, polls) = runner_traffic(s);
        let pod = s.state().pod().to_string();
        let at_edge = sum_samples(proxy_metrics, "podgate_proxy_edge_polls_held{", |l| {
            label(l, "pod") == Some(pod.as_str())
        });
        let _ = writeln!(
            out,
            "  {:<4} {:<20} {:>8}  {:>12}  {:>11}  {:>12}  {:>9}  {:>7}",
            s.state().pod(),
            s.addr(),
            requests,
            polls,
            held_polls(s),
            at_edge,
            s.metrics().misrouted.get(),
            pages(s)
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
    let paths = by_label(proxy_metrics, "podgate_proxy_path_rules_total{", "outcome");
    if !paths.is_empty() {
        let parts: Vec<String> = paths.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(out, "  path rules: {}", parts.join("   "));
    }
    let misroutes: u64 = sims.iter().map(|s| s.metrics().misrouted.get()).sum();
    let _ = writeln!(out, "  misroutes: {misroutes}");
    out
}

/// The Job Router's lines, one per Pod with a kas: from that kas's own metrics
/// (`kas`: Pod id and its `/metrics` text) its `GetJob` calls, those held now, those
/// woken by a queue change, those answered empty; the proxy's runner requests open
/// to it (`podgate_proxy_kas_open{client="runner"}`); and from the runners'
/// `gitlab_runner_job_router_fallbacks_total{pod}` (`fallbacks`) their fallbacks to
/// `jobs/request`. Empty when no kas has the Job Router.
pub(crate) fn job_router_table(
    kas: &[(u64, String)],
    proxy_metrics: &str,
    fallbacks: &str,
) -> String {
    if !kas
        .iter()
        .any(|(_, m)| m.contains("podgate_kas_job_router_calls_total"))
    {
        return String::new();
    }
    let mut out = String::from(
        "  job router  Pod  GetJob calls  held now  woken  answered empty  jobs  open at proxy  fallbacks\n",
    );
    for (pod, m) in kas {
        let calls = |result: Option<&str>| {
            sum_samples(m, "podgate_kas_job_router_calls_total{", |l| {
                result.is_none_or(|r| label(l, "result") == Some(r))
            })
        };
        let pod_label = pod.to_string();
        let at_pod = |l: &str| label(l, "pod") == Some(pod_label.as_str());
        let _ = writeln!(
            out,
            "              {:<4} {:>12}  {:>8}  {:>5}  {:>14}  {:>4}  {:>13}  {:>9}",
            pod,
            calls(None),
            sum_samples(m, "podgate_kas_job_router_held ", |_| true),
            sum_samples(m, "podgate_kas_job_router_holds_total{", |l| {
                label(l, "outcome") == Some("changed")
            }),
            calls(Some("empty")),
            calls(Some("job")),
            sum_samples(proxy_metrics, "podgate_proxy_kas_open{", |l| {
                at_pod(l) && label(l, "client") == Some("runner")
            }),
            sum_samples(
                fallbacks,
                "gitlab_runner_job_router_fallbacks_total{",
                at_pod
            ),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::job_router_table;

    #[test]
    fn job_router_lines_per_pod_from_kas_proxy_and_runners() {
        let kas2 = "podgate_kas_job_router_calls_total{result=\"empty\"} 4\n\
                    podgate_kas_job_router_calls_total{result=\"job\"} 3\n\
                    podgate_kas_job_router_calls_total{result=\"unavailable\"} 1\n\
                    podgate_kas_job_router_held 7\n\
                    podgate_kas_job_router_holds_total{outcome=\"changed\"} 2\n\
                    podgate_kas_job_router_holds_total{outcome=\"timeout\"} 4\n";
        let proxy = "podgate_proxy_kas_open{client=\"runner\",pod=\"2\"} 7\n\
                     podgate_proxy_kas_open{client=\"agent\",pod=\"2\"} 1\n\
                     podgate_proxy_kas_open{client=\"runner\",pod=\"3\"} 5\n";
        let fallbacks = "gitlab_runner_job_router_fallbacks_total{pod=\"2\",reason=\"no_discovery\"} 1\n\
                         gitlab_runner_job_router_fallbacks_total{pod=\"2\",reason=\"router_disabled\"} 2\n\
                         gitlab_runner_job_router_fallbacks_total{pod=\"3\",reason=\"no_discovery\"} 9\n";
        let t = job_router_table(&[(2, kas2.into())], proxy, fallbacks);
        let row: Vec<&str> = t.lines().nth(1).unwrap().split_whitespace().collect();
        // Pod, calls, held, woken, empty, jobs, open, fallbacks.
        assert_eq!(row, ["2", "8", "7", "2", "4", "3", "7", "3"], "{t}");
        assert_eq!(
            job_router_table(&[(2, "other 1\n".into())], proxy, fallbacks),
            ""
        );
    }
}
