//! What a fleet run measured: per endpoint statuses and latencies, the `jobs/request`
//! answers by kind, requests per runner per minute, the predicted request rate beside
//! the measured one, the scheduler's counts, and the Job Router's calls and fallbacks.

mod job_router;

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::{Value, json};

/// One endpoint's results.
#[derive(Clone, Debug)]
pub struct EndpointStats {
    /// Latency in microseconds.
    pub latency: Histogram<u64>,
    /// Responses by status (0: transport error).
    pub statuses: BTreeMap<u16, u64>,
    /// Responses with a status the protocol does not expect here.
    pub unexpected: u64,
    /// Transport errors (status 0) by what the client saw, e.g. "connection closed
    /// before message completed" (a POST written to a connection the server closed).
    pub transport_errors: BTreeMap<String, u64>,
}

impl Default for EndpointStats {
    fn default() -> Self {
        EndpointStats {
            latency: Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds"),
            statuses: BTreeMap::new(),
            unexpected: 0,
            transport_errors: BTreeMap::new(),
        }
    }
}

/// `jobs/request` answers by kind (every attempt, retries included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct JobsRequestCounts {
    /// 201: a job.
    pub created: u64,
    /// 204 without `X-GitLab-Last-Update` (Workhorse held the long poll and ended
    /// it: a change seen, or the poll timed out), or with the very ticket the runner
    /// sent (the proxy held it at the edge until the hold ended).
    pub no_content_held: u64,
    /// 204 with a new `X-GitLab-Last-Update`: Rails answered at once (the runner's
    /// ticket was stale or missing).
    pub no_content_immediate: u64,
    /// 409: a conflict (another runner took the job).
    pub conflict: u64,
    /// Any other status, and connection errors.
    pub other: u64,
}

impl JobsRequestCounts {
    /// Counts one answer; `held`: a 204 that brought no new ticket.
    pub(super) fn count(&mut self, status: u16, held: bool) {
        let slot = match status {
            201 => &mut self.created,
            204 if held => &mut self.no_content_held,
            204 => &mut self.no_content_immediate,
            409 => &mut self.conflict,
            _ => &mut self.other,
        };
        *slot += 1;
    }

    /// All answers.
    pub fn total(&self) -> u64 {
        self.created + self.no_content_held + self.no_content_immediate + self.conflict + self.other
    }
}

/// What became of the jobs the runners of one registration token (one Pod) got.
/// Jobs still running when the run ended are `received - not_run - done - failed`
/// ([`JobCounts::in_flight`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct JobCounts {
    /// `jobs/request` answers with a job (201).
    pub received: u64,
    /// Not run: no id or token in the payload, or the running update got 403/404.
    pub not_run: u64,
    /// Finished: the final update answered 200.
    pub done: u64,
    /// Run, but the final update never answered 200 (an error, 403, retries spent).
    pub failed: u64,
}

impl JobCounts {
    /// Jobs still running when the run ended (cut by its end).
    pub fn in_flight(&self) -> u64 {
        self.received
            .saturating_sub(self.not_run + self.done + self.failed)
    }
}

pub use job_router::{Fallbacks, JobRouterCounts};

/// Scheduling events over the fleet (gitlab-runner's `commands/multi.go` terms).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SchedulerCounts {
    /// Runners handed to an idle worker by their feeder.
    pub feeds: u64,
    /// Feeds skipped because the runner was unhealthy.
    pub feeds_unhealthy: u64,
    /// Worker turns that made no request: `request_concurrency` requests in flight.
    pub request_slot_full: u64,
    /// Immediate re-requests after a job (an idle worker was free).
    pub requeues: u64,
    /// Jobs after which no worker was idle for a re-request.
    pub requeues_no_idle_worker: u64,
    /// Attempts retried (429, 5xx, …).
    pub retries: u64,
    /// Times a runner became unhealthy (three 403s in a row).
    pub runners_unhealthy: u64,
    /// Registration attempts that did not give a token.
    pub registration_failures: u64,
}

/// Mean and percentiles of a per-runner figure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct RateSummary {
    /// Mean over runners.
    pub mean: f64,
    /// Median runner.
    pub p50: f64,
    /// 99th percentile runner.
    pub p99: f64,
}

impl RateSummary {
    /// Over `values` (nearest-rank percentiles); zeros when empty.
    pub fn of(values: &[f64]) -> Self {
        if values.is_empty() {
            return RateSummary::default();
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let at = |q: f64| {
            let rank = (q * sorted.len() as f64).ceil() as usize;
            sorted[rank.clamp(1, sorted.len()) - 1]
        };
        RateSummary {
            mean: sorted.iter().sum::<f64>() / sorted.len() as f64,
            p50: at(0.5),
            p99: at(0.99),
        }
    }
}

/// The `jobs/request` rate the configuration predicts, beside the measured one.
///
/// Each runner's feeder asks once per `check_interval`, and each job handed out brings
/// one immediate re-request: `runners / check_interval + jobs per second`. It holds
/// while polls end within a `check_interval`; polls held longer make fewer requests
/// (the feeds that find the request slot taken make none), so a ratio well below 1
/// with many held 204s is long polling at work, and a ratio above 1 is a storm.
#[derive(Clone, Debug, Serialize)]
pub struct Expected {
    /// Runners.
    pub runners: usize,
    /// `check_interval` in seconds.
    pub check_interval_secs: f64,
    /// `runners / check_interval`, requests per second.
    pub polling_per_second: f64,
    /// Jobs per second.
    pub job_rate: f64,
    /// Where `job_rate` comes from: `configured` or `measured` (201s per second).
    pub job_rate_source: &'static str,
    /// The prediction, requests per second.
    pub expected_per_second: f64,
    /// The prediction per runner per minute.
    pub expected_per_runner_per_minute: f64,
    /// Measured `jobs/request` attempts per second.
    pub measured_per_second: f64,
    /// measured / expected.
    pub ratio: f64,
}

/// What a run measured.
#[derive(Debug, Default)]
pub struct Report {
    /// By endpoint name.
    pub endpoints: BTreeMap<&'static str, EndpointStats>,
    /// 403s naming another Pod.
    pub misroutes: u64,
    /// Jobs run to success.
    pub jobs_done: u64,
    /// What became of the jobs, per registration token (in the order given: one per
    /// Pod).
    pub jobs_by_pod: Vec<JobCounts>,
    /// Wall time.
    pub elapsed: Duration,
    /// `jobs/request` answers by kind.
    pub jobs_request: JobsRequestCounts,
    /// `jobs/request` attempts per minute of each runner that started, from its start.
    pub runner_requests_per_minute: Vec<f64>,
    /// Scheduling events.
    pub scheduler: SchedulerCounts,
    /// Runners configured.
    pub runners: usize,
    /// Their `check_interval`.
    pub check_interval: Duration,
    /// Their `concurrent`.
    pub concurrent: usize,
    /// Their `request_concurrency`.
    pub request_concurrency: usize,
    /// The job rate given for the prediction (`None`: measured).
    pub job_rate: Option<f64>,
    /// Share of the runners with `FF_USE_JOB_ROUTER` on.
    pub job_router_share: f64,
    /// The Job Router's calls and fallbacks, per registration token (one per Pod).
    pub job_router_by_pod: Vec<JobRouterCounts>,
}

/// A serialisable summary of one endpoint.
#[derive(Debug, Serialize)]
pub struct EndpointSummary {
    /// Endpoint.
    pub endpoint: String,
    /// Requests.
    pub requests: u64,
    /// Requests per second.
    pub per_second: f64,
    /// Percentiles in milliseconds.
    pub p50_ms: f64,
    /// 90th.
    pub p90_ms: f64,
    /// 99th.
    pub p99_ms: f64,
    /// 99.9th.
    pub p999_ms: f64,
    /// Max.
    pub max_ms: f64,
    /// By status.
    pub statuses: BTreeMap<u16, u64>,
    /// Unexpected statuses.
    pub unexpected: u64,
    /// Transport errors by kind (the status 0 count, told apart).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub transport_errors: BTreeMap<String, u64>,
}

impl Report {
    fn secs(&self) -> f64 {
        self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Every endpoint's summary.
    pub fn summaries(&self) -> Vec<EndpointSummary> {
        let secs = self.secs();
        let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        self.endpoints
            .iter()
            .map(|(name, s)| EndpointSummary {
                endpoint: (*name).to_owned(),
                requests: s.latency.len(),
                per_second: s.latency.len() as f64 / secs,
                p50_ms: ms(&s.latency, 0.5),
                p90_ms: ms(&s.latency, 0.9),
                p99_ms: ms(&s.latency, 0.99),
                p999_ms: ms(&s.latency, 0.999),
                max_ms: s.latency.max() as f64 / 1000.0,
                statuses: s.statuses.clone(),
                unexpected: s.unexpected,
                transport_errors: s.transport_errors.clone(),
            })
            .collect()
    }

    /// Unexpected statuses over all endpoints.
    pub fn unexpected(&self) -> u64 {
        self.endpoints.values().map(|s| s.unexpected).sum()
    }

    /// `jobs/request` attempts per runner per minute, over the runners.
    pub fn per_runner_per_minute(&self) -> RateSummary {
        RateSummary::of(&self.runner_requests_per_minute)
    }

    /// The predicted `jobs/request` rate beside the measured one.
    pub fn expected(&self) -> Expected {
        let secs = self.secs();
        let ci = self.check_interval.as_secs_f64();
        let polling = if ci > 0.0 {
            self.runners as f64 / ci
        } else {
            0.0
        };
        let (job_rate, source) = match self.job_rate {
            Some(r) => (r, "configured"),
            None => (self.jobs_request.created as f64 / secs, "measured"),
        };
        let expected = polling + job_rate;
        let measured = self.jobs_request.total() as f64 / secs;
        Expected {
            runners: self.runners,
            check_interval_secs: ci,
            polling_per_second: polling,
            job_rate,
            job_rate_source: source,
            expected_per_second: expected,
            expected_per_runner_per_minute: expected * 60.0 / self.runners.max(1) as f64,
            measured_per_second: measured,
            ratio: if expected > 0.0 {
                measured / expected
            } else {
                0.0
            },
        }
    }

    /// The report as JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "elapsed_secs": self.elapsed.as_secs_f64(),
            "misroutes": self.misroutes,
            "unexpected": self.unexpected(),
            "jobs_done": self.jobs_done,
            "jobs_by_pod": self.jobs_by_pod.iter().map(|c| json!({
                "received": c.received,
                "not_run": c.not_run,
                "done": c.done,
                "failed": c.failed,
                "in_flight": c.in_flight(),
            })).collect::<Vec<_>>(),
            "endpoints": self.summaries(),
            "config": {
                "runners": self.runners,
                "check_interval_secs": self.check_interval.as_secs_f64(),
                "concurrent": self.concurrent,
                "request_concurrency": self.request_concurrency,
                "job_rate": self.job_rate,
                "job_router_share": self.job_router_share,
            },
            "job_router_by_pod": self.job_router_by_pod,
            "jobs_request": self.jobs_request,
            "jobs_request_per_runner_per_minute": self.per_runner_per_minute(),
            "expected": self.expected(),
            "scheduler": self.scheduler,
        })
    }

    /// The report as a table.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:<24} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}  statuses\n",
            "endpoint", "requests", "req/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms"
        );
        for s in self.summaries() {
            let statuses: Vec<String> =
                s.statuses.iter().map(|(k, v)| format!("{k}:{v}")).collect();
            out.push_str(&format!(
                "{:<24} {:>9} {:>9.1} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}  {}\n",
                s.endpoint,
                s.requests,
                s.per_second,
                s.p50_ms,
                s.p90_ms,
                s.p99_ms,
                s.p999_ms,
                s.max_ms,
                statuses.join(" ")
            ));
        }
        let j = &self.jobs_request;
        out.push_str(&format!(
            "jobs_request answers: 201 {}   204 held {}   204 immediate {}   409 {}   other {}\n",
            j.created, j.no_content_held, j.no_content_immediate, j.conflict, j.other
        ));
        let r = self.per_runner_per_minute();
        let e = self.expected();
        out.push_str(&format!(
            "jobs_request per runner per minute: mean {:.2}   p50 {:.2}   p99 {:.2}   (expected {:.2})\n",
            r.mean, r.p50, r.p99, e.expected_per_runner_per_minute
        ));
        out.push_str(&format!(
            "jobs_request rate: measured {:.1}/s   expected {:.1}/s = {} runners / {:.1} s + {:.1} jobs/s ({})   ratio {:.2}\n",
            e.measured_per_second,
            e.expected_per_second,
            e.runners,
            e.check_interval_secs,
            e.job_rate,
            e.job_rate_source,
            e.ratio
        ));
        if self.job_router_share > 0.0 {
            out.push_str(&self.job_router_table());
        }
        let c = &self.scheduler;
        out.push_str(&format!(
            "scheduler: feeds {}   skipped unhealthy {}   request slot full {}   requeues {} (no idle worker {})   retries {}   became unhealthy {}   registration failures {}\n",
            c.feeds,
            c.feeds_unhealthy,
            c.request_slot_full,
            c.requeues,
            c.requeues_no_idle_worker,
            c.retries,
            c.runners_unhealthy,
            c.registration_failures
        ));
        out.push_str(&format!(
            "jobs done: {}   misroutes: {}   unexpected statuses: {}   elapsed: {:.1} s\n",
            self.jobs_done,
            self.misroutes,
            self.unexpected(),
            self.elapsed.as_secs_f64()
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_counted_by_kind() {
        let mut c = JobsRequestCounts::default();
        for (status, held) in [
            (201, true),
            (204, true),
            (204, false),
            (204, false),
            (409, false),
            (503, true),
            (0, true),
        ] {
            c.count(status, held);
        }
        assert_eq!(
            c,
            JobsRequestCounts {
                created: 1,
                no_content_held: 1,
                no_content_immediate: 2,
                conflict: 1,
                other: 2
            }
        );
        assert_eq!(c.total(), 7);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = RateSummary::of(&v);
        assert_eq!((s.mean, s.p50, s.p99), (50.5, 50.0, 99.0));
        assert_eq!(RateSummary::of(&[]), RateSummary::default());
        assert_eq!(RateSummary::of(&[7.0]).p99, 7.0);
    }

    #[test]
    fn expected_rate_is_polling_plus_jobs() {
        let mut r = Report {
            elapsed: Duration::from_secs(10),
            runners: 30,
            check_interval: Duration::from_secs(3),
            ..Report::default()
        };
        r.jobs_request.created = 50; // 5 jobs/s measured
        r.jobs_request.no_content_held = 100;
        let e = r.expected();
        assert_eq!(e.job_rate_source, "measured");
        assert!((e.expected_per_second - 15.0).abs() < 1e-9, "{e:?}");
        assert!((e.measured_per_second - 15.0).abs() < 1e-9, "{e:?}");
        assert!((e.ratio - 1.0).abs() < 1e-9);
        r.job_rate = Some(20.0);
        let e = r.expected();
        assert_eq!(e.job_rate_source, "configured");
        assert!((e.expected_per_second - 30.0).abs() < 1e-9);
        assert!((e.ratio - 0.5).abs() < 1e-9);
        assert!((e.expected_per_runner_per_minute - 60.0).abs() < 1e-9);
        let table = r.table();
        assert!(table.contains("ratio 0.50"), "{table}");
        assert_eq!(r.to_json()["expected"]["expected_per_second"], 30.0);
    }
}
