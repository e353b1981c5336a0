//! Sending a runner's requests: one attempt recorded in the report, and gitlab-runner's
//! retries around it (`network/retry_requester.go`).
//!
//! Every request of gitlab-runner's API client goes through its `retryRequester`:
//! 408, 429, 500, 502, 503, 504 and every status ≥ 512 are retried, up to 5 attempts
//! in all; before each retry it waits until `RateLimit-ResetTime` (RFC 1123), else
//! `Retry-After` seconds, else an exponential back-off (100 ms, factor 2, at most
//! 60 s, with jitter; `jpillora/backoff` v1.0.0). The back-off is new for each call.
//! A connection error is not retried: the call fails and the next feed tries again.
//! After the last attempt the caller gets the last answer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::Value;

use super::Shared;

/// The report's name for `POST /api/v4/jobs/request`.
pub(super) const JOBS_REQUEST: &str = "jobs_request";

/// Attempts per call, the first included (`defaultRateLimitMaxAttempts`).
pub(super) const MAX_ATTEMPTS: u32 = 5;

/// The response header carrying a runner's queue ticket (`network/client.go`).
pub(super) const LAST_UPDATE: &str = "x-gitlab-last-update";

/// One answer.
pub(super) struct Answer {
    pub(super) status: StatusCode,
    pub(super) headers: HeaderMap,
    pub(super) body: Bytes,
}

impl Answer {
    /// The body as JSON (`Null` when it is not).
    pub(super) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// A header's value, if present and text.
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Whether gitlab-runner retries this status (`shouldRetryRequest`).
pub(super) fn retriable(status: u16) -> bool {
    matches!(status, 408 | 429 | 500 | 502 | 503 | 504) || status >= 512
}

/// `jpillora/backoff` v1.0.0 as `retryRequester` configures it: attempt `k` (from 0)
/// waits `100 ms × 2^k`, jittered uniformly between 100 ms and that, capped at 60 s.
#[derive(Debug, Default)]
pub(super) struct Backoff {
    attempt: i32,
}

impl Backoff {
    const MIN: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(60);

    /// The next wait; `jitter` is a uniform draw in `[0, 1)`.
    pub(super) fn next(&mut self, jitter: f64) -> Duration {
        let min = Self::MIN.as_secs_f64();
        let nominal = min * 2f64.powi(self.attempt);
        self.attempt = self.attempt.saturating_add(1);
        let jittered = jitter * (nominal - min) + min;
        Duration::from_secs_f64(jittered.clamp(min, Self::MAX.as_secs_f64()))
    }
}

/// How long to wait before the next attempt (`calculateWaitTime`): until
/// `RateLimit-ResetTime`, else `Retry-After` seconds, else the back-off. A header that
/// does not parse, or names no time in the future, is passed over.
pub(super) fn wait_time(
    headers: &HeaderMap,
    now: SystemTime,
    backoff: &mut Backoff,
    jitter: f64,
) -> Duration {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(wait) = header("ratelimit-resettime").and_then(|v| until_reset(v, now)) {
        return wait;
    }
    if let Some(secs) = header("retry-after").and_then(|v| v.trim().parse::<i64>().ok())
        && secs > 0
    {
        return Duration::from_secs(secs.unsigned_abs());
    }
    backoff.next(jitter)
}

/// Time from `now` until an HTTP date (`Wed, 21 Oct 2015 07:28:00 GMT`, as Rails'
/// `Time#httpdate` writes `RateLimit-ResetTime`), if it lies ahead.
pub(super) fn until_reset(value: &str, now: SystemTime) -> Option<Duration> {
    httpdate::parse_http_date(value)
        .ok()?
        .duration_since(now)
        .ok()
}

/// An error and its sources, `: `-separated: hyper-util's "client error (SendRequest)"
/// says nothing until its source, e.g. "connection closed before message completed".
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// A uniform draw in `[0, 1)` for jitter (SplitMix64 over a shared counter: jitter
/// only has to differ between runners, not be unpredictable).
pub(super) fn jitter() -> f64 {
    static STATE: AtomicU64 = AtomicU64::new(0x853c_49e6_748f_ea9b);
    let mut z = STATE.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

impl Shared {
    /// One call as gitlab-runner's client makes it: attempts recorded under `endpoint`
    /// for runner `runner`, judged against `expected`, retried as `retryRequester`
    /// does. `make` builds each attempt's request. `None`: a connection error (not
    /// retried), or the end of the run cut the call.
    pub(super) async fn call(
        &self,
        runner: usize,
        endpoint: &'static str,
        expected: &[u16],
        make: impl Fn() -> Request<Full<Bytes>>,
    ) -> Option<Answer> {
        let mut backoff = Backoff::default();
        let mut attempts = 0;
        loop {
            let answer = self.attempt(runner, endpoint, expected, make()).await?;
            attempts += 1;
            if !retriable(answer.status.as_u16()) || attempts >= MAX_ATTEMPTS {
                return Some(answer);
            }
            self.counters.retries.fetch_add(1, Ordering::Relaxed);
            let wait = wait_time(&answer.headers, SystemTime::now(), &mut backoff, jitter());
            tokio::time::sleep(wait).await;
        }
    }

    /// One attempt; its latency and status are recorded under `endpoint`.
    async fn attempt(
        &self,
        runner: usize,
        endpoint: &'static str,
        expected: &[u16],
        req: Request<Full<Bytes>>,
    ) -> Option<Answer> {
        let started = Instant::now();
        let result = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| error_chain(&e))?;
            let (parts, body) = resp.into_parts();
            let body = body
                .collect()
                .await
                .map_err(|e| error_chain(&e))?
                .to_bytes();
            Ok(Answer {
                status: parts.status,
                headers: parts.headers,
                body,
            })
        }
        .await;
        // A request cut by the end of the run is not a result.
        if result.is_err() && self.stop.load(Ordering::SeqCst) {
            return None;
        }
        let micros = started.elapsed().as_micros().max(1) as u64;
        self.record(runner, endpoint, expected, micros, &result);
        result.ok()
    }

    /// Counts a `jobs/request` 204: *held* when it carries no `X-GitLab-Last-Update`
    /// (Workhorse ended the long poll) or carries back the ticket the runner sent
    /// (the poll was held — at the edge, or by Rails' cache — and nothing changed);
    /// *immediate* when it brings a new ticket (the runner's was stale).
    pub(super) fn count_poll_204(&self, sent: &str, answer: &Answer) {
        let held = match answer.header(LAST_UPDATE) {
            None => true,
            Some(ticket) => !sent.is_empty() && ticket == sent,
        };
        self.report
            .lock()
            .expect("report lock")
            .jobs_request
            .count(204, held);
    }

    /// Counts one attempt in the report and the live progress.
    fn record(
        &self,
        runner: usize,
        endpoint: &'static str,
        expected: &[u16],
        micros: u64,
        result: &Result<Answer, String>,
    ) {
        let answer = result.as_ref().ok();
        let status = answer.map_or(0, |a| a.status.as_u16());
        let misroute = status == 403
            && answer.is_some_and(|a| String::from_utf8_lossy(&a.body).contains("another Pod"));
        let unexpected = !expected.contains(&status);
        {
            let mut report = self.report.lock().expect("report lock");
            let s = report.endpoints.entry(endpoint).or_default();
            let _ = s.latency.record(micros);
            *s.statuses.entry(status).or_default() += 1;
            if let Err(e) = result {
                *s.transport_errors.entry(e.clone()).or_default() += 1;
            }
            if unexpected {
                s.unexpected += 1;
            }
            if misroute {
                report.misroutes += 1;
            }
            // A 204 is told held or immediate by the ticket the runner sent
            // ([`Shared::count_poll_204`]).
            if endpoint == JOBS_REQUEST && status != 204 {
                report.jobs_request.count(status, false);
            }
        }
        if endpoint == JOBS_REQUEST {
            self.runners[runner]
                .requests
                .fetch_add(1, Ordering::Relaxed);
        }
        self.progress.requests.fetch_add(1, Ordering::Relaxed);
        if misroute {
            self.progress.misroutes.fetch_add(1, Ordering::Relaxed);
        }
        if unexpected {
            self.progress.unexpected.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(endpoint, status, "unexpected status");
        }
    }

    /// A request to the target with gitlab-runner's `User-Agent`.
    pub(super) fn request(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Request<Full<Bytes>> {
        let mut b = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.target))
            .header("user-agent", "gitlab-runner 17.6.0 (podgate-loadtest)");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(Full::new(body)).expect("valid request")
    }

    /// A JSON request.
    pub(super) fn json_request(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: &Value,
    ) -> Request<Full<Bytes>> {
        let mut h = vec![("content-type", "application/json")];
        h.extend_from_slice(headers);
        self.request(method, path, &h, Bytes::from(body.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn retried_statuses_are_retry_requesters() {
        for s in [408, 429, 500, 502, 503, 504, 512, 599] {
            assert!(retriable(s), "{s}");
        }
        for s in [200, 201, 204, 400, 401, 403, 404, 409, 501, 505, 511] {
            assert!(!retriable(s), "{s}");
        }
    }

    #[test]
    fn backoff_doubles_from_100ms_within_its_jitter_and_caps_at_60s() {
        let mut top = Backoff::default();
        let waits: Vec<Duration> = (0..12).map(|_| top.next(0.999_999)).collect();
        assert_eq!(waits[0], Duration::from_millis(100));
        assert!((waits[3].as_secs_f64() - 0.8).abs() < 0.001, "{waits:?}");
        assert_eq!(waits[11], Duration::from_secs(60));
        let mut bottom = Backoff::default();
        assert!((0..12).all(|_| bottom.next(0.0) == Duration::from_millis(100)));
    }

    #[test]
    fn reset_time_then_retry_after_then_backoff() {
        let now = UNIX_EPOCH + Duration::from_secs(1_445_412_470); // 07:27:50 GMT
        let mut h = HeaderMap::new();
        h.insert("retry-after", "7".parse().unwrap());
        h.insert(
            "ratelimit-resettime",
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        let mut b = Backoff::default();
        assert_eq!(wait_time(&h, now, &mut b, 0.5), Duration::from_secs(10));
        // A reset time in the past is passed over.
        let later = now + Duration::from_secs(60);
        assert_eq!(wait_time(&h, later, &mut b, 0.5), Duration::from_secs(7));
        h.insert("retry-after", "soon".parse().unwrap());
        assert_eq!(
            wait_time(&h, later, &mut b, 0.5),
            Duration::from_millis(100)
        );
    }

    #[test]
    fn http_dates_ahead_are_waited_for() {
        let now = UNIX_EPOCH + Duration::from_secs(1_445_412_470);
        assert_eq!(
            until_reset("Wed, 21 Oct 2015 07:28:00 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(until_reset("Thu, 01 Jan 1970 00:00:00 GMT", now), None);
        assert_eq!(until_reset("2015-10-21T07:28:00Z", now), None);
    }

    #[test]
    fn jitter_is_in_range_and_varies() {
        let draws: Vec<f64> = (0..1000).map(|_| jitter()).collect();
        assert!(draws.iter().all(|d| (0.0..1.0).contains(d)));
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((0.4..0.6).contains(&mean), "{mean}");
    }
}
