//! `podgate loadtest http`: constant-rate (open-loop) HTTP load. Request `n` is due at
//! `start + n / rate` whether or not earlier ones have been answered, and its latency
//! is measured from that due time, not from when it was actually sent: a stalled
//! server shows as the queueing its clients really see (no coordinated omission), which
//! a closed-loop tool like `wrk` hides.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hdrhistogram::Histogram;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::fleet::Error;

/// An open-loop run.
#[derive(Clone, Debug)]
pub struct OpenLoopConfig {
    /// The full URL, e.g. `http://127.0.0.1:8080/api/v4/jobs/request`.
    pub url: String,
    /// Method.
    pub method: Method,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
    /// Body sent with every request.
    pub body: Bytes,
    /// Requests per second.
    pub rate: f64,
    /// How long.
    pub duration: Duration,
    /// Most requests in flight; beyond it, due requests wait (and that wait counts).
    pub max_in_flight: usize,
}

impl OpenLoopConfig {
    /// Every problem, each naming its field.
    pub fn validate(&self) -> Result<(), Error> {
        let mut bad = Vec::new();
        if !self.url.starts_with("http://") {
            bad.push(format!("url = {:?}: an http:// URL", self.url));
        }
        if !(self.rate.is_finite() && self.rate > 0.0) {
            bad.push(format!("rate = {}: positive", self.rate));
        }
        if self.max_in_flight == 0 {
            bad.push("max_in_flight: at least 1".into());
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(Error::Config(bad.join("; ")))
        }
    }
}

/// What an open-loop run measured.
#[derive(Debug)]
pub struct OpenLoopReport {
    /// Corrected latency (from the due time), microseconds.
    pub latency: Histogram<u64>,
    /// Responses by status (0: transport error).
    pub statuses: BTreeMap<u16, u64>,
    /// Requests sent.
    pub sent: u64,
    /// Wall time.
    pub elapsed: Duration,
}

impl OpenLoopReport {
    /// The report as JSON (milliseconds).
    pub fn to_json(&self) -> Value {
        let ms = |q: f64| self.latency.value_at_quantile(q) as f64 / 1000.0;
        json!({
            "sent": self.sent,
            "achieved_rate": self.sent as f64 / self.elapsed.as_secs_f64().max(1e-9),
            "p50_ms": ms(0.5), "p90_ms": ms(0.9), "p99_ms": ms(0.99), "p999_ms": ms(0.999),
            "max_ms": self.latency.max() as f64 / 1000.0,
            "statuses": self.statuses,
        })
    }

    /// The report as a table.
    pub fn table(&self) -> String {
        let v = self.to_json();
        format!(
            "sent {} in {:.1} s ({:.1} req/s)\nlatency (corrected for coordinated omission): p50 {} ms  p90 {} ms  p99 {} ms  p99.9 {} ms  max {} ms\nstatuses {}\n",
            self.sent,
            self.elapsed.as_secs_f64(),
            v["achieved_rate"].as_f64().unwrap_or(0.0),
            v["p50_ms"],
            v["p90_ms"],
            v["p99_ms"],
            v["p999_ms"],
            v["max_ms"],
            v["statuses"]
        )
    }
}

/// Run at `config.rate` for `config.duration`.
pub async fn run(config: OpenLoopConfig) -> Result<OpenLoopReport, Error> {
    config.validate()?;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(config.max_in_flight)
        .build(connector);
    let report = Arc::new(Mutex::new(OpenLoopReport {
        latency: Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds"),
        statuses: BTreeMap::new(),
        sent: 0,
        elapsed: Duration::ZERO,
    }));
    let gate = Arc::new(tokio::sync::Semaphore::new(config.max_in_flight));
    let interval = Duration::from_secs_f64(1.0 / config.rate);
    let start = Instant::now();
    let total = (config.rate * config.duration.as_secs_f64()).round() as u64;
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..total {
        let due = start + interval.mul_f64(n as f64);
        tokio::time::sleep_until(due).await;
        let permit = gate.clone().acquire_owned().await.expect("never closed");
        let mut b = Request::builder()
            .method(config.method.clone())
            .uri(&config.url);
        for (k, v) in &config.headers {
            b = b.header(k, v);
        }
        let req = b
            .body(Full::new(config.body.clone()))
            .map_err(|e| Error::Config(format!("request: {e}")))?;
        let (client, report) = (client.clone(), report.clone());
        tasks.spawn(async move {
            let status = match client.request(req).await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let _ = resp.into_body().collect().await;
                    status
                }
                Err(_) => 0,
            };
            let micros = due.elapsed().as_micros().max(1) as u64;
            drop(permit);
            let mut r = report.lock().await;
            let _ = r.latency.record(micros);
            *r.statuses.entry(status).or_default() += 1;
            r.sent += 1;
        });
        // Reap finished tasks as we go so the set stays small.
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    let mut report = Arc::try_unwrap(report)
        .map_err(|_| Error::Config("report still shared".into()))?
        .into_inner();
    report.elapsed = start.elapsed();
    Ok(report)
}
