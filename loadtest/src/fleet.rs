//! `podgate loadtest runners`: a fleet of simulated GitLab Runners. Each registers,
//! long-polls `jobs/request`, and runs the jobs it gets (running update, trace
//! patches, an artifact upload, the final update), as a real runner does. A share of
//! them are *old* runners that send their token in the body only (JSON, multipart);
//! the rest send `RUNNER-TOKEN` / `JOB-TOKEN` headers.
//!
//! The report counts, per endpoint, statuses and HDR latency percentiles; a status the
//! protocol does not expect there is *unexpected*; a 403 naming another Pod is a
//! *misroute*.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use serde_json::{Value, json};
use thiserror::Error;
use tokio::sync::Mutex;

/// Fleet errors.
#[derive(Debug, Error)]
pub enum Error {
    /// A configuration problem, naming the field.
    #[error("fleet configuration: {0}")]
    Config(String),
}

/// A fleet run.
#[derive(Clone, Debug)]
pub struct FleetConfig {
    /// The proxy (or a Pod), e.g. `http://127.0.0.1:8080`.
    pub target: String,
    /// Registration tokens; runner `i` registers with `tokens[i % len]`.
    pub registration_tokens: Vec<String>,
    /// How many runners.
    pub runners: usize,
    /// How long to run.
    pub duration: Duration,
    /// Share of old runners (token in the body only), 0..=1.
    pub old_share: f64,
    /// Bytes of artifact each job uploads (0: none).
    pub artifact_bytes: usize,
    /// Trace patches per job.
    pub trace_patches: usize,
}

impl FleetConfig {
    /// Every problem, each naming its field.
    pub fn validate(&self) -> Result<(), Error> {
        let mut bad = Vec::new();
        if !self.target.starts_with("http://") {
            bad.push(format!("target = {:?}: an http:// URL", self.target));
        }
        if self.registration_tokens.is_empty() {
            bad.push("registration_tokens: at least one".into());
        }
        if self.runners == 0 {
            bad.push("runners: at least 1".into());
        }
        if !(0.0..=1.0).contains(&self.old_share) {
            bad.push(format!("old_share = {}: between 0 and 1", self.old_share));
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(Error::Config(bad.join("; ")))
        }
    }
}

/// One endpoint's results.
#[derive(Clone, Debug)]
pub struct EndpointStats {
    /// Latency in microseconds.
    pub latency: Histogram<u64>,
    /// Responses by status (0: transport error).
    pub statuses: BTreeMap<u16, u64>,
    /// Responses with a status the protocol does not expect here.
    pub unexpected: u64,
}

impl Default for EndpointStats {
    fn default() -> Self {
        EndpointStats {
            latency: Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds"),
            statuses: BTreeMap::new(),
            unexpected: 0,
        }
    }
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
    /// Wall time.
    pub elapsed: Duration,
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
}

impl Report {
    /// Every endpoint's summary.
    pub fn summaries(&self) -> Vec<EndpointSummary> {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
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
            })
            .collect()
    }

    /// Unexpected statuses over all endpoints.
    pub fn unexpected(&self) -> u64 {
        self.endpoints.values().map(|s| s.unexpected).sum()
    }

    /// The report as JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "elapsed_secs": self.elapsed.as_secs_f64(),
            "misroutes": self.misroutes,
            "unexpected": self.unexpected(),
            "jobs_done": self.jobs_done,
            "endpoints": self.summaries(),
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

/// Live counters, readable while the fleet runs.
#[derive(Debug, Default)]
pub struct Progress {
    /// Requests answered.
    pub requests: AtomicU64,
    /// Jobs run to success.
    pub jobs: AtomicU64,
    /// Misroutes seen.
    pub misroutes: AtomicU64,
    /// Unexpected statuses seen.
    pub unexpected: AtomicU64,
}

struct Shared {
    client: Client<HttpConnector, Full<Bytes>>,
    target: String,
    report: Mutex<Report>,
    progress: Arc<Progress>,
    stop: AtomicBool,
    config: FleetConfig,
}

struct Answer {
    status: StatusCode,
    headers: http::HeaderMap,
    body: Bytes,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

impl Shared {
    /// Send; record latency and status under `endpoint`, judged against `expected`.
    async fn send(
        &self,
        endpoint: &'static str,
        expected: &[u16],
        req: Request<Full<Bytes>>,
    ) -> Option<Answer> {
        let started = Instant::now();
        let result = async {
            let resp = self.client.request(req).await.ok()?;
            let (parts, body) = resp.into_parts();
            let body = body.collect().await.ok()?.to_bytes();
            Some(Answer {
                status: parts.status,
                headers: parts.headers,
                body,
            })
        }
        .await;
        let micros = started.elapsed().as_micros().max(1) as u64;
        let status = result.as_ref().map_or(0, |a| a.status.as_u16());
        let misroute = status == 403
            && result
                .as_ref()
                .is_some_and(|a| String::from_utf8_lossy(&a.body).contains("another Pod"));
        // A request cut by the end of the run is not a result.
        if status == 0 && self.stop.load(Ordering::SeqCst) {
            return None;
        }
        let unexpected = !expected.contains(&status);
        {
            let mut report = self.report.lock().await;
            let s = report.endpoints.entry(endpoint).or_default();
            let _ = s.latency.record(micros);
            *s.statuses.entry(status).or_default() += 1;
            if unexpected {
                s.unexpected += 1;
            }
            if misroute {
                report.misroutes += 1;
            }
        }
        self.progress.requests.fetch_add(1, Ordering::Relaxed);
        if misroute {
            self.progress.misroutes.fetch_add(1, Ordering::Relaxed);
        }
        if unexpected {
            self.progress.unexpected.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(endpoint, status, "unexpected status");
        }
        result
    }

    fn request(
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

    fn json_request(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Value,
    ) -> Request<Full<Bytes>> {
        let mut h = vec![("content-type", "application/json")];
        h.extend_from_slice(headers);
        self.request(method, path, &h, Bytes::from(body.to_string()))
    }
}

/// One simulated runner, until the run stops.
async fn runner(shared: Arc<Shared>, n: usize) {
    let old = (n as f64) < shared.config.old_share * shared.config.runners as f64;
    let registration =
        &shared.config.registration_tokens[n % shared.config.registration_tokens.len()];
    let system_id = format!("s_{n:012x}");
    let info = json!({"name": "gitlab-runner", "version": "17.6.0", "revision": "podgate", "platform": "linux", "architecture": "amd64", "executor": "docker", "shell": "bash", "features": {"variables": true, "artifacts": true, "cache": true, "trace_checksum": true, "trace_size": true}});
    // Register (retrying until it works or the run ends).
    let token = loop {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let body = json!({"token": registration, "description": format!("fleet-{n}"), "tag_list": "", "run_untagged": true, "locked": false, "info": info});
        let headers: &[(&str, &str)] = if old {
            &[]
        } else {
            &[("runner-token", registration)]
        };
        let req = shared.json_request(Method::POST, "/api/v4/runners", headers, body);
        if let Some(a) = shared.send("runners", &[201], req).await
            && a.status == StatusCode::CREATED
            && let Some(t) = a.json()["token"].as_str()
        {
            break t.to_owned();
        }
    };
    let mut last_update = String::new();
    while !shared.stop.load(Ordering::SeqCst) {
        let body = json!({"token": token, "system_id": system_id, "last_update": last_update, "info": info});
        let headers: &[(&str, &str)] = if old {
            &[]
        } else {
            &[("runner-token", &token)]
        };
        let req = shared.json_request(Method::POST, "/api/v4/jobs/request", headers, body);
        let Some(a) = shared.send("jobs_request", &[201, 204, 409], req).await else {
            continue;
        };
        match a.status.as_u16() {
            201 => run_job(&shared, old, a.json()).await,
            204 => {
                if let Some(t) = a
                    .headers
                    .get("x-gitlab-last-update")
                    .and_then(|v| v.to_str().ok())
                {
                    last_update = t.to_owned();
                }
            }
            _ => {}
        }
    }
}

async fn run_job(shared: &Shared, old: bool, job: Value) {
    let (Some(id), Some(token)) = (job["id"].as_u64(), job["token"].as_str()) else {
        return;
    };
    let path = format!("/api/v4/jobs/{id}");
    let job_header = [("job-token", token)];
    let headers: &[(&str, &str)] = if old { &[] } else { &job_header };
    let req = shared.json_request(
        Method::PUT,
        &path,
        headers,
        json!({"token": token, "state": "running"}),
    );
    shared.send("jobs_update", &[200], req).await;
    let mut sent = 0usize;
    for i in 0..shared.config.trace_patches {
        let chunk = format!("\x1b[32m$ step {i} of job {id}\x1b[0m\nsimulated output line {i}\n");
        let range = format!("{sent}-{}", sent + chunk.len() - 1);
        let req = shared.request(
            Method::PATCH,
            &format!("{path}/trace"),
            &[
                ("job-token", token),
                ("content-range", &range),
                ("content-type", "text/plain"),
            ],
            Bytes::from(chunk.clone()),
        );
        if shared
            .send("jobs_trace", &[202], req)
            .await
            .is_some_and(|a| a.status == StatusCode::ACCEPTED)
        {
            sent += chunk.len();
        }
    }
    if shared.config.artifact_bytes > 0 {
        let boundary = format!("fleet-{id}");
        let mut form = Vec::with_capacity(shared.config.artifact_bytes + 512);
        if old {
            form.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"token\"\r\n\r\n{token}\r\n").as_bytes());
        }
        form.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"artifacts.zip\"\r\nContent-Type: application/zip\r\n\r\n").as_bytes());
        form.extend((0..shared.config.artifact_bytes).map(|i| (i % 251) as u8));
        form.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let ct = format!("multipart/form-data; boundary={boundary}");
        let mut h = vec![("content-type", ct.as_str())];
        if !old {
            h.push(("job-token", token));
        }
        let req = shared.request(
            Method::POST,
            &format!("{path}/artifacts?artifact_format=zip&artifact_type=archive"),
            &h,
            Bytes::from(form),
        );
        shared.send("jobs_artifacts_upload", &[201], req).await;
    }
    // Final update; 202 means "not finished yet": send it again, as the runner does.
    for _ in 0..5 {
        let body = json!({"token": token, "state": "success", "exit_code": 0, "output": {"checksum": "crc32:0", "bytesize": sent}});
        let req = shared.json_request(Method::PUT, &path, headers, body);
        match shared.send("jobs_update", &[200, 202], req).await {
            Some(a) if a.status == StatusCode::OK => {
                shared.progress.jobs.fetch_add(1, Ordering::Relaxed);
                shared.report.lock().await.jobs_done += 1;
                return;
            }
            Some(a) if a.status == StatusCode::ACCEPTED => continue,
            _ => return,
        }
    }
}

/// Run the fleet until `config.duration` passes (or `cancel` resolves).
pub async fn run(
    config: FleetConfig,
    progress: Arc<Progress>,
    cancel: impl std::future::Future<Output = ()>,
) -> Result<Report, Error> {
    config.validate()?;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(config.runners * 2)
        .build(connector);
    let shared = Arc::new(Shared {
        client,
        target: config.target.trim_end_matches('/').to_owned(),
        report: Mutex::default(),
        progress,
        stop: AtomicBool::new(false),
        config: config.clone(),
    });
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..config.runners {
        tasks.spawn(runner(shared.clone(), n));
    }
    tokio::select! {
        _ = tokio::time::sleep(config.duration) => {}
        _ = cancel => {}
    }
    shared.stop.store(true, Ordering::SeqCst);
    // Long polls in flight would hold the end for up to a minute: cut them.
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    let mut report = std::mem::take(&mut *shared.report.lock().await);
    report.elapsed = started.elapsed();
    Ok(report)
}
