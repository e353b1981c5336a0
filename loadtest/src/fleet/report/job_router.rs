//! The Job Router's part of the report: `GetJob` calls and their answers, and the
//! fallbacks to REST `jobs/request`, per registration token (one per Pod).

use std::collections::BTreeMap;

use serde::Serialize;

use super::Report;

/// Calls that went to REST `jobs/request` instead of the Job Router, by reason (the
/// `reason` label of gitlab-runner's `gitlab_runner_job_router_fallbacks_total`,
/// `router/metrics.go`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Fallbacks {
    /// Discovery named no router (403, 501, an error; cached an hour).
    pub no_discovery: u64,
    /// The breaker was open.
    pub breaker_open: u64,
    /// The router's URL could not be dialled (a scheme the runner does not know).
    pub dial_failed: u64,
    /// The call's failure tripped the breaker.
    pub breaker_tripped: u64,
    /// The router answered `UNIMPLEMENTED` (off): discovery dropped.
    pub router_disabled: u64,
}

impl Fallbacks {
    /// Counts one fallback.
    pub(in crate::fleet) fn count(&mut self, reason: crate::fleet::router::Fallback) {
        use crate::fleet::router::Fallback as F;
        let slot = match reason {
            F::NoDiscovery => &mut self.no_discovery,
            F::BreakerOpen => &mut self.breaker_open,
            F::DialFailed => &mut self.dial_failed,
            F::BreakerTripped => &mut self.breaker_tripped,
            F::RouterDisabled => &mut self.router_disabled,
        };
        *slot += 1;
    }

    /// All fallbacks.
    pub fn total(&self) -> u64 {
        self.no_discovery
            + self.breaker_open
            + self.dial_failed
            + self.breaker_tripped
            + self.router_disabled
    }
}

/// The Job Router as the runners of one registration token (one Pod) saw it.
/// `get_job = jobs + empty + errors`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct JobRouterCounts {
    /// `GetJob` calls answered (or failed).
    pub get_job: u64,
    /// Jobs got through `GetJob` (each also counted in [`super::JobCounts::received`]).
    pub jobs: u64,
    /// Empty answers: no job.
    pub empty: u64,
    /// Calls that failed: a gRPC error, or a job that was not JSON.
    pub errors: u64,
    /// The errors by gRPC code (`Unavailable`, `Unimplemented`, …).
    pub errors_by_code: BTreeMap<String, u64>,
    /// Calls that went to REST `jobs/request` instead, by reason.
    pub fallbacks: Fallbacks,
}

impl Report {
    /// The Job Router's lines of the table: one per Pod.
    pub(super) fn job_router_table(&self) -> String {
        let mut out = format!(
            "job router ({:.0}% of runners): per registration token (Pod): GetJob calls, jobs, empty answers, errors; fallbacks to jobs/request by reason\n",
            self.job_router_share * 100.0
        );
        for (pod, c) in self.job_router_by_pod.iter().enumerate() {
            let f = &c.fallbacks;
            let codes: Vec<String> = c
                .errors_by_code
                .iter()
                .map(|(k, v)| format!("{k}:{v}"))
                .collect();
            out.push_str(&format!(
                "  token #{pod}: GetJob {}   jobs {}   empty {}   errors {}{}   fallbacks no_discovery {}   breaker_open {}   dial_failed {}   breaker_tripped {}   router_disabled {}\n",
                c.get_job,
                c.jobs,
                c.empty,
                c.errors,
                if codes.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", codes.join(" "))
                },
                f.no_discovery,
                f.breaker_open,
                f.dial_failed,
                f.breaker_tripped,
                f.router_disabled
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_router_lines_only_with_router_runners() {
        let mut r = Report::default();
        assert!(!r.table().contains("job router"));
        r.job_router_share = 0.25;
        let mut c = JobRouterCounts {
            get_job: 5,
            jobs: 2,
            empty: 2,
            ..JobRouterCounts::default()
        };
        c.errors = 1;
        c.errors_by_code.insert("Unavailable".into(), 1);
        c.fallbacks
            .count(crate::fleet::router::Fallback::NoDiscovery);
        c.fallbacks
            .count(crate::fleet::router::Fallback::BreakerOpen);
        r.job_router_by_pod = vec![c];
        let table = r.table();
        assert!(table.contains("job router (25% of runners)"), "{table}");
        assert!(
            table.contains("token #0: GetJob 5   jobs 2   empty 2   errors 1 (Unavailable:1)"),
            "{table}"
        );
        assert!(table.contains("no_discovery 1   breaker_open 1"), "{table}");
        let json = r.to_json();
        assert_eq!(json["job_router_by_pod"][0]["fallbacks"]["breaker_open"], 1);
        assert_eq!(
            json["job_router_by_pod"][0]["errors_by_code"]["Unavailable"],
            1
        );
        assert_eq!(r.job_router_by_pod[0].fallbacks.total(), 2);
    }
}
