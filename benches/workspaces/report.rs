//! The workspaces bench's figures, printed as lines and written as JSON.

use serde_json::{Value, json};

use crate::relay::Exchange;

/// What one run measured.
pub struct Figures {
    pub workspaces: usize,
    /// GitLab's settings, seconds.
    pub partial_interval_s: u64,
    pub full_interval_s: u64,
    /// kube-sim's objects once every workspace is `Running`.
    pub kube_objects: usize,
    pub run_s: f64,
    /// From agentk's start to its first full reconcile request.
    pub first_request_s: f64,
    /// agentk's first full cycle (GitLab's answer and every apply).
    pub initial_full_s: f64,
    /// From agentk's start until every workspace is `Running`.
    pub all_running_s: f64,
    pub cpu_converged_s: f64,
    /// (`VmRSS`, `VmHWM`) once every workspace is `Running`.
    pub rss_converged_kib: (u64, u64),
    pub initial_full: Exchange,
    pub steady_full_s: f64,
    pub steady_full: Exchange,
    /// Mean idle partial cycle in agentk.
    pub partial_ms: f64,
    /// agentk's CPU per partial interval while idle.
    pub cpu_per_interval_ms: f64,
    pub idle_cycles: usize,
    /// Partials in the idle window that carried something.
    pub not_idle: usize,
    /// The idle partials' mean exchange.
    pub idle_partial: Exchange,
    pub rss_idle_kib: (u64, u64),
    /// Stop → `Stopped` per stopped workspace, sorted.
    pub stop_latencies_s: Vec<f64>,
}

impl Figures {
    /// p50, p95 and max of stop → `Stopped`.
    fn stops(&self) -> (f64, f64, f64) {
        let l = &self.stop_latencies_s;
        (
            percentile(l, 0.5),
            percentile(l, 0.95),
            l.last().copied().unwrap_or(0.0),
        )
    }

    pub fn print(&self) {
        let mib = |(rss, hwm): (u64, u64)| (rss / 1024, hwm / 1024);
        println!(
            "workspaces bench: {} workspaces on one agent (GitLab settings: partial every {} s, full every {} s); \
             kube-sim objects at convergence {}; run {:.0} s",
            self.workspaces,
            self.partial_interval_s,
            self.full_interval_s,
            self.kube_objects,
            self.run_s
        );
        let (rss, peak) = mib(self.rss_converged_kib);
        println!(
            "  initial full   first request {:.2} s after agentk started; cycle {:.2} s (agentk: GitLab's answer and every apply); all Running after {:.1} s; agentk CPU {:.2} s, RSS {rss} MiB (peak {peak} MiB)",
            self.first_request_s, self.initial_full_s, self.all_running_s, self.cpu_converged_s,
        );
        println!("{}", wire_line("initial full", &self.initial_full));
        println!("  steady full    cycle {:.2} s", self.steady_full_s);
        println!("{}", wire_line("steady full", &self.steady_full));
        println!(
            "  idle partial   cycle {:.1} ms (agentk), agentk CPU {:.1} ms per {} s interval over {} cycles{}",
            self.partial_ms,
            self.cpu_per_interval_ms,
            self.partial_interval_s,
            self.idle_cycles,
            if self.not_idle > 0 {
                format!(" ({} of them not idle)", self.not_idle)
            } else {
                String::new()
            }
        );
        println!("{}", wire_line("idle partial", &self.idle_partial));
        let (rss, peak) = mib(self.rss_idle_kib);
        println!("  agentk RSS at steady state {rss} MiB (peak {peak} MiB)");
        let (p50, p95, max) = self.stops();
        println!(
            "  stop → Stopped over {} workspaces: p50 {p50:.2} s, p95 {p95:.2} s, max {max:.2} s",
            self.stop_latencies_s.len()
        );
    }

    pub fn json(&self) -> Value {
        let (p50, p95, max) = self.stops();
        json!({
            "workspaces": self.workspaces, "partial_interval_s": self.partial_interval_s,
            "full_interval_s": self.full_interval_s, "kube_objects": self.kube_objects,
            "initial_full": {"first_request_s": self.first_request_s, "cycle_s": self.initial_full_s,
                "all_running_s": self.all_running_s, "agentk_cpu_s": self.cpu_converged_s,
                "wire": wire(&self.initial_full)},
            "steady_full": {"cycle_s": self.steady_full_s, "wire": wire(&self.steady_full)},
            "idle_partial": {"cycle_ms": self.partial_ms, "agentk_cpu_ms_per_interval": self.cpu_per_interval_ms,
                "cycles": self.idle_cycles, "not_idle": self.not_idle, "wire_mean": wire(&self.idle_partial)},
            "agentk_rss_kib": {"converged": self.rss_converged_kib.0, "steady": self.rss_idle_kib.0,
                "peak": self.rss_idle_kib.1},
            "stop_to_stopped_s": {"n": self.stop_latencies_s.len(), "p50": p50, "p95": p95, "max": max},
        })
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[(((sorted.len() - 1) as f64) * p).round() as usize]
}

fn kib(bytes: usize) -> f64 {
    (bytes as f64 / 102.4).round() / 10.0
}

fn wire(e: &Exchange) -> Value {
    json!({
        "request_body": e.request_body, "request_headers": e.request_head,
        "response_body": e.response_body, "response_headers": e.response_head,
        "infos_sent": e.infos_sent, "infos_back": e.infos_back,
        "gitlab_ms": e.gitlab.as_secs_f64() * 1e3, "status": e.status,
    })
}

fn wire_line(what: &str, e: &Exchange) -> String {
    format!(
        "  {what:<14} request {} KiB body + {} B headers ({} infos); response {} KiB body + {} B headers ({} workspaces); GitLab answered in {:.1} ms",
        kib(e.request_body),
        e.request_head,
        e.infos_sent,
        kib(e.response_body),
        e.response_head,
        e.infos_back,
        e.gitlab.as_secs_f64() * 1e3
    )
}
