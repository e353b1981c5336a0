//! `podgate loadtest wake`: how long a runner waits for a job once it is queued,
//! while N runners' job requests are held: on GitLab's Job Router (`GetJob` held at
//! each Pod's kas) or on REST (`jobs/request` held at the proxy's edge).
//!
//! 1. N runners are registered through the proxy, round robin over the given
//!    registration tokens (one per Pod), runner `i` with the one tag `wake-<i>` and
//!    `run_untagged: false`: a job tagged `wake-<i>` is runner `i`'s alone, and
//!    queueing it ticks runner `i`'s queue key only (Rails' `tick_runner_queue` for
//!    the runners that can take a job).
//! 2. Every runner polls as gitlab-runner does, one request at a time: its first
//!    answer is empty with a ticket (`X-GitLab-Last-Update`, no ticket yet); the
//!    next request, sending it, is held until the key changes or the hold ends.
//!    Router calls share `connections` HTTP/2 connections (the proxy routes each
//!    call by its own token); REST polls have a connection each.
//! 3. Once the held gauges (`--held URL PREFIX`: kas's `podgate_kas_job_router_held`
//!    or the proxy's `podgate_proxy_edge_polls_held`) sum to 99 % of the runners
//!    (those whose hold just ended are held again a moment later), it takes
//!    samples one at a time: a runner not sampled before, a job tagged for it
//!    queued through its Pod's control API, and the time from just before that
//!    request to the runner's poll answered with the job.
//!
//! Nothing finishes the jobs: each sampled runner polls on, and is held again.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use podgate_agent::proto::gitlab::agent::job_router::rpc::GetJobRequest;
use podgate_agent::proto::gitlab::agent::job_router::rpc::job_router_client::JobRouterClient;
use serde_json::{Value, json};
use tokio::sync::{Mutex, oneshot};
use tonic::transport::Channel;

/// What stops the benchmark.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration problem, naming the field.
    #[error("wake configuration: {0}")]
    Config(String),
    /// A request that had to succeed did not (a registration, a job queued).
    #[error("{0}")]
    Request(String),
}

/// Where runners ask for jobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `GetJob` on the Job Router (h2c to the proxy).
    Router,
    /// `POST /api/v4/jobs/request`.
    Rest,
}

/// What to run.
#[derive(Clone, Debug)]
pub struct WakeConfig {
    /// The proxy, `http://host:port`.
    pub target: String,
    /// One registration token per Pod.
    pub registration_tokens: Vec<String>,
    /// Each Pod's simulator (`http://host:port`, its control API), in the same order.
    pub controls: Vec<String>,
    /// Runners, each with one poll held.
    pub runners: usize,
    /// HTTP/2 connections the router calls share.
    pub connections: usize,
    /// Jobs queued and timed.
    pub samples: usize,
    /// Metrics endpoints and the prefix of the held gauge's lines, summed.
    pub held: Vec<(String, String)>,
    /// Router or REST.
    pub mode: Mode,
}

/// The figures.
#[derive(Debug, serde::Serialize)]
pub struct WakeReport {
    /// `router` or `rest`.
    pub mode: &'static str,
    /// Runners registered and polling.
    pub runners: usize,
    /// Held polls when sampling started (the gauges' sum).
    pub held: u64,
    /// Jobs timed.
    pub samples: u64,
    /// Samples whose job did not come within 30 s.
    pub lost: u64,
    /// Queue to answer, milliseconds: the median,
    pub p50_ms: f64,
    /// the 90th percentile,
    pub p90_ms: f64,
    /// the 99th,
    pub p99_ms: f64,
    /// the longest.
    pub max_ms: f64,
    /// Polls answered over the whole run.
    pub polls: u64,
    /// Poll errors (each retried after 1 s).
    pub poll_errors: u64,
}

type Http = Client<HttpConnector, Full<Bytes>>;

/// One runner.
struct Runner {
    /// Its index: its tag is `wake-<n>`.
    n: usize,
    token: String,
    /// Its Pod's index.
    pod: usize,
    /// Told when the next job comes.
    waiter: Mutex<Option<oneshot::Sender<Instant>>>,
}

struct Counters {
    polls: AtomicU64,
    errors: AtomicU64,
}

/// Run the benchmark.
pub async fn run(config: WakeConfig) -> Result<WakeReport, Error> {
    if config.registration_tokens.is_empty()
        || config.registration_tokens.len() != config.controls.len()
    {
        return Err(Error::Config(
            "controls: one control URL per registration token".into(),
        ));
    }
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let http: Http = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(usize::MAX)
        .build(connector);
    let runners = register(&http, &config).await?;
    eprintln!("wake: {} runners registered", runners.len());
    let counters = Arc::new(Counters {
        polls: AtomicU64::new(0),
        errors: AtomicU64::new(0),
    });
    let channels: Vec<Channel> = (0..config.connections.max(1))
        .map(|_| {
            Channel::from_shared(config.target.clone())
                .map(|e| e.connect_lazy())
                .map_err(|e| Error::Config(format!("target = {:?}: {e}", config.target)))
        })
        .collect::<Result<_, _>>()?;
    let mut tasks = Vec::new();
    for (i, r) in runners.iter().enumerate() {
        let (r, counters) = (r.clone(), counters.clone());
        tasks.push(match config.mode {
            Mode::Router => {
                let channel = channels[i % channels.len()].clone();
                tokio::spawn(poll_router(r, channel, counters))
            }
            Mode::Rest => tokio::spawn(poll_rest(r, http.clone(), config.target.clone(), counters)),
        });
    }
    // Held calls that end (a hold's timeout) are held again a moment later: 99 %
    // of the runners is "all" at any instant.
    let held = wait_held(
        &http,
        &config.held,
        (config.runners as u64 * 99).div_ceil(100),
    )
    .await;
    eprintln!("wake: {held} polls held; sampling");
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
    let mut lost = 0;
    for r in runners.iter().cycle().take(config.samples) {
        let (tx, rx) = oneshot::channel();
        *r.waiter.lock().await = Some(tx);
        let t0 = Instant::now();
        let tag = format!("wake-{}", r.n);
        queue_job(&http, &config.controls[r.pod], &tag).await?;
        match tokio::time::timeout(Duration::from_secs(30), rx).await {
            Ok(Ok(t1)) => {
                let _ = hist.record(t1.duration_since(t0).as_micros().max(1) as u64);
            }
            _ => lost += 1,
        }
    }
    for t in tasks {
        t.abort();
    }
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    Ok(WakeReport {
        mode: match config.mode {
            Mode::Router => "router",
            Mode::Rest => "rest",
        },
        runners: runners.len(),
        held,
        samples: hist.len(),
        lost,
        p50_ms: ms(0.5),
        p90_ms: ms(0.9),
        p99_ms: ms(0.99),
        max_ms: hist.max() as f64 / 1000.0,
        polls: counters.polls.load(Ordering::Relaxed),
        poll_errors: counters.errors.load(Ordering::Relaxed),
    })
}

/// Register the runners, 64 at a time.
async fn register(http: &Http, config: &WakeConfig) -> Result<Vec<Arc<Runner>>, Error> {
    use futures_util::StreamExt as _;
    let url = format!("{}/api/v4/runners", config.target);
    let results: Vec<Result<Arc<Runner>, Error>> = futures_util::stream::iter(0..config.runners)
        .map(|n| {
            let pod = n % config.registration_tokens.len();
            let body = json!({
                "token": config.registration_tokens[pod],
                "description": format!("wake-{n}"),
                "tag_list": format!("wake-{n}"),
                "run_untagged": false,
            });
            let url = url.clone();
            async move {
                let (status, _, body) = send(http, http::Method::POST, &url, &[], &body).await?;
                let token = match (status, body["token"].as_str()) {
                    (201, Some(t)) => t.to_owned(),
                    _ => {
                        return Err(Error::Request(format!(
                            "registering runner {n}: {status} {body}"
                        )));
                    }
                };
                Ok(Arc::new(Runner {
                    n,
                    token,
                    pod,
                    waiter: Mutex::new(None),
                }))
            }
        })
        .buffered(64)
        .collect()
        .await;
    results.into_iter().collect()
}

/// One JSON request: status, `X-GitLab-Last-Update`, body (`null` when empty).
async fn send(
    http: &Http,
    method: http::Method,
    url: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> Result<(u16, Option<String>, Value), Error> {
    let failed = |e: &dyn std::fmt::Display| Error::Request(format!("{url}: {e}"));
    let mut req = http::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|e| failed(&e))?;
    let resp = http.request(req).await.map_err(|e| failed(&e))?;
    let status = resp.status().as_u16();
    let last_update = resp
        .headers()
        .get("x-gitlab-last-update")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| failed(&e))?
        .to_bytes();
    let value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or(Value::Null)
    };
    Ok((status, last_update, value))
}

/// What a runner sends for a job (gitlab-runner's `JobRequest`, the part Rails
/// reads here).
fn job_request(r: &Runner, last_update: &str) -> Value {
    json!({
        "token": r.token,
        "last_update": last_update,
        "info": {"name": "podgate-wake", "version": "18.7.0", "features": {"refspecs": true}},
    })
}

/// A job came: tell the sampler, if it waits for one.
async fn got_job(r: &Runner) {
    let now = Instant::now();
    if let Some(tx) = r.waiter.lock().await.take() {
        let _ = tx.send(now);
    }
}

/// Runner `r` on the Job Router, until aborted.
async fn poll_router(r: Arc<Runner>, channel: Channel, counters: Arc<Counters>) {
    let mut client = JobRouterClient::new(channel);
    let bearer: tonic::metadata::MetadataValue<_> = match format!("Bearer {}", r.token).parse() {
        Ok(v) => v,
        Err(_) => return,
    };
    let mut last_update = String::new();
    loop {
        let mut req = tonic::Request::new(GetJobRequest {
            job_request: job_request(&r, &last_update).to_string().into_bytes(),
        });
        req.set_timeout(Duration::from_secs(60));
        req.metadata_mut().insert("authorization", bearer.clone());
        req.metadata_mut().insert(
            "gitlab-agent-type",
            tonic::metadata::MetadataValue::from_static("runner"),
        );
        match client.get_job(req).await {
            Ok(resp) => {
                counters.polls.fetch_add(1, Ordering::Relaxed);
                if let Some(v) = resp
                    .metadata()
                    .get("x-gitlab-last-update")
                    .and_then(|v| v.to_str().ok())
                    && !v.is_empty()
                {
                    last_update = v.to_owned();
                }
                if !resp.into_inner().job_response.is_empty() {
                    got_job(&r).await;
                }
            }
            Err(_) => {
                counters.errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Runner `r` on REST `jobs/request`, until aborted.
async fn poll_rest(r: Arc<Runner>, http: Http, target: String, counters: Arc<Counters>) {
    let url = format!("{target}/api/v4/jobs/request");
    let mut last_update = String::new();
    loop {
        let body = job_request(&r, &last_update);
        match send(
            &http,
            http::Method::POST,
            &url,
            &[("runner-token", &r.token)],
            &body,
        )
        .await
        {
            Ok((status, ticket, _)) if status == 201 || status == 204 => {
                counters.polls.fetch_add(1, Ordering::Relaxed);
                if let Some(t) = ticket.filter(|t| !t.is_empty()) {
                    last_update = t;
                }
                if status == 201 {
                    got_job(&r).await;
                }
            }
            _ => {
                counters.errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Until the held gauges sum to `want` (at most 5 minutes): their last sum.
async fn wait_held(http: &Http, held: &[(String, String)], want: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let mut sum = 0;
        for (url, prefix) in held {
            if let Some(text) = get_text(http, url).await {
                sum += text
                    .lines()
                    .filter(|l| l.starts_with(prefix.as_str()))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum::<f64>() as u64;
            }
        }
        if sum >= want || Instant::now() > deadline {
            return sum;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn get_text(http: &Http, url: &str) -> Option<String> {
    let req = http::Request::get(url).body(Full::new(Bytes::new())).ok()?;
    let resp = http.request(req).await.ok()?;
    let bytes = resp.into_body().collect().await.ok()?.to_bytes();
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// Queue a job tagged `tag` on the Pod whose simulator is `control`.
async fn queue_job(http: &Http, control: &str, tag: &str) -> Result<(), Error> {
    let url = format!("{control}/-/podsim/jobs");
    let (status, _, body) =
        send(http, http::Method::POST, &url, &[], &json!({"tags": [tag]})).await?;
    if status != 201 {
        return Err(Error::Request(format!("queueing a job: {status} {body}")));
    }
    Ok(())
}
