//! A small GitLab for the fleet tests: a real HTTP/1.1 server on an ephemeral port
//! that registers runners, answers `jobs/request` as each test scripts it, accepts job
//! updates, trace patches and artifacts, and records what it received and when.
//! Tests wait for recorded events (never sleep to synchronise).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use podgate_loadtest::fleet::{self, FleetConfig, Progress, Report};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};

/// What the server was sent, in order.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    /// `register`, `request`, `update`, `trace` or `artifacts`.
    pub(crate) kind: &'static str,
    /// The runner token (the registration token for `register`; the job token for
    /// job calls).
    pub(crate) token: String,
    /// When it arrived.
    pub(crate) at: Instant,
    /// The JSON body (`Null` when not JSON).
    pub(crate) body: Value,
    /// Whether a `RUNNER-TOKEN` / `JOB-TOKEN` header came along.
    pub(crate) token_header: bool,
    /// The status answered (`None` while in flight).
    pub(crate) status: Option<u16>,
}

/// A `jobs/request` the script answers.
#[derive(Clone, Debug)]
pub(crate) struct Call {
    /// Its index among all `jobs/request` calls (from 0).
    pub(crate) n: usize,
    /// Its index among this runner's calls (from 0).
    pub(crate) nth_for_runner: usize,
    /// The runner token.
    pub(crate) token: String,
    /// The body's `last_update`.
    pub(crate) last_update: String,
}

/// An answer.
#[derive(Clone, Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Value,
    /// Held this long before answering (a long poll).
    pub(crate) hold: Duration,
}

impl Reply {
    /// `status`, no body; 0 drops the connection without an answer.
    pub(crate) fn status(status: u16) -> Self {
        Reply {
            status,
            headers: Vec::new(),
            body: Value::Null,
            hold: Duration::ZERO,
        }
    }
    /// Rails' 204: no job, the runner's current ticket in `X-GitLab-Last-Update`.
    pub(crate) fn immediate(ticket: &str) -> Self {
        Reply::status(204).header("X-GitLab-Last-Update", ticket)
    }
    /// Workhorse's 204: a long poll ended, no header.
    pub(crate) fn held() -> Self {
        Reply::status(204)
    }
    /// A job.
    pub(crate) fn job(id: u64) -> Self {
        Reply {
            body: json!({"id": id, "token": format!("job-token-{id}")}),
            ..Reply::status(201)
        }
    }
    pub(crate) fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
    pub(crate) fn hold(mut self, d: Duration) -> Self {
        self.hold = d;
        self
    }
}

type Script = Arc<dyn Fn(&Call) -> Reply + Send + Sync>;

#[derive(Default)]
pub(crate) struct Log {
    pub(crate) seen: Vec<Seen>,
    /// `jobs/request` calls in flight now, and at most, per runner token.
    pub(crate) in_flight: HashMap<String, usize>,
    pub(crate) max_in_flight: HashMap<String, usize>,
    /// Registered runners: token → registration body.
    pub(crate) runners: HashMap<String, Value>,
    /// `jobs/request` calls per runner token.
    pub(crate) calls: HashMap<String, usize>,
}

impl Log {
    pub(crate) fn of(&self, kind: &str) -> Vec<&Seen> {
        self.seen.iter().filter(|s| s.kind == kind).collect()
    }
    pub(crate) fn count(&self, kind: &str) -> usize {
        self.seen.iter().filter(|s| s.kind == kind).count()
    }
    /// Answered calls of `kind` with `status`.
    pub(crate) fn answered(&self, kind: &str, status: u16) -> usize {
        self.seen
            .iter()
            .filter(|s| s.kind == kind && s.status == Some(status))
            .count()
    }
}

/// The server.
#[derive(Clone)]
pub(crate) struct GitLab {
    pub(crate) addr: SocketAddr,
    log: Arc<Mutex<Log>>,
    changed: Arc<watch::Sender<u64>>,
    script: Script,
}

/// Decrements a runner's in-flight count when its call ends (answered or cut).
struct InFlight {
    log: Arc<Mutex<Log>>,
    token: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut log = self.log.lock().unwrap();
        if let Some(n) = log.in_flight.get_mut(&self.token) {
            *n -= 1;
        }
    }
}

impl GitLab {
    /// Starts a server whose `jobs/request` answers come from `script`.
    pub(crate) async fn start(script: impl Fn(&Call) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gitlab = GitLab {
            addr: listener.local_addr().unwrap(),
            log: Arc::default(),
            changed: Arc::new(watch::channel(0).0),
            script: Arc::new(script),
        };
        let server = gitlab.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let server = server.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let server = server.clone();
                        async move {
                            // Status 0: drop the connection without an answer.
                            let resp = server.handle(req).await;
                            if resp.status() == StatusCode::IM_A_TEAPOT
                                && resp.headers().contains_key("x-drop")
                            {
                                return Err(std::io::Error::other("dropped"));
                            }
                            Ok(resp)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        gitlab
    }

    pub(crate) fn target(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A fleet configuration against this server.
    pub(crate) fn config(
        &self,
        tokens: &[&str],
        runners: usize,
        duration: Duration,
    ) -> FleetConfig {
        let mut c = FleetConfig::new(
            self.target(),
            tokens.iter().map(|t| (*t).to_owned()).collect(),
            runners,
            duration,
        );
        c.artifact_bytes = 64;
        c.trace_patches = 1;
        c
    }

    /// Reads the log.
    pub(crate) fn log<T>(&self, f: impl FnOnce(&Log) -> T) -> T {
        f(&self.log.lock().unwrap())
    }

    /// Waits until `cond` holds of the log (at most 60 s, then panics).
    pub(crate) async fn wait_until(&self, what: &str, cond: impl Fn(&Log) -> bool) {
        let mut rx = self.changed.subscribe();
        let wait = async {
            loop {
                if self.log(&cond) {
                    return;
                }
                rx.changed().await.unwrap();
            }
        };
        if tokio::time::timeout(Duration::from_secs(60), wait)
            .await
            .is_err()
        {
            panic!(
                "timed out waiting for {what}: {:#?}",
                self.log(|l| l.seen.clone())
            );
        }
    }

    fn push(&self, seen: Seen) -> usize {
        let i = {
            let mut log = self.log.lock().unwrap();
            log.seen.push(seen);
            log.seen.len() - 1
        };
        self.changed.send_modify(|v| *v += 1);
        i
    }

    fn answer(&self, i: usize, status: u16) {
        self.log.lock().unwrap().seen[i].status = Some(status);
        self.changed.send_modify(|v| *v += 1);
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let (parts, body) = req.into_parts();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let path = parts.uri.path().to_owned();
        let has = |h: &str| parts.headers.contains_key(h);
        let body_token = json["token"].as_str().unwrap_or_default().to_owned();
        let job_token = parts
            .headers
            .get("job-token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let seen = |kind, token: String, token_header| Seen {
            kind,
            token,
            at: Instant::now(),
            body: json.clone(),
            token_header,
            status: None,
        };
        let reply = match (parts.method.as_str(), path.as_str()) {
            ("POST", "/api/v4/runners") => {
                let i = self.push(seen("register", body_token.clone(), has("runner-token")));
                let token = {
                    let mut log = self.log.lock().unwrap();
                    let token = format!("glrt-fleet-{}", log.runners.len());
                    log.runners.insert(token.clone(), json.clone());
                    token
                };
                self.answer(i, 201);
                Reply {
                    body: json!({"id": 1, "token": token}),
                    ..Reply::status(201)
                }
            }
            ("POST", "/api/v4/jobs/request") => {
                let call = {
                    let mut log = self.log.lock().unwrap();
                    let n = log.count("request");
                    let mine = log.calls.entry(body_token.clone()).or_default();
                    let nth_for_runner = *mine;
                    *mine += 1;
                    let now = log.in_flight.entry(body_token.clone()).or_default();
                    *now += 1;
                    let now = *now;
                    let max = log.max_in_flight.entry(body_token.clone()).or_default();
                    *max = (*max).max(now);
                    Call {
                        n,
                        nth_for_runner,
                        token: body_token.clone(),
                        last_update: json["last_update"].as_str().unwrap_or_default().to_owned(),
                    }
                };
                let _in_flight = InFlight {
                    log: self.log.clone(),
                    token: body_token.clone(),
                };
                let i = self.push(seen("request", body_token.clone(), has("runner-token")));
                let reply = (self.script)(&call);
                if !reply.hold.is_zero() {
                    tokio::time::sleep(reply.hold).await;
                }
                drop(_in_flight);
                self.answer(i, reply.status);
                reply
            }
            (method, p) if p.starts_with("/api/v4/jobs/") => {
                let token = job_token.clone().unwrap_or(body_token.clone());
                let (kind, status) = match method {
                    "PUT" => ("update", 200),
                    "PATCH" => ("trace", 202),
                    _ => ("artifacts", 201),
                };
                let i = self.push(seen(kind, token, job_token.is_some()));
                self.answer(i, status);
                Reply::status(status)
            }
            _ => Reply::status(404),
        };
        if reply.status == 0 {
            return Response::builder()
                .status(StatusCode::IM_A_TEAPOT)
                .header("x-drop", "1")
                .body(Full::default())
                .unwrap();
        }
        let mut resp = Response::builder().status(StatusCode::from_u16(reply.status).unwrap());
        for (k, v) in &reply.headers {
            resp = resp.header(k, v);
        }
        let body = if reply.body.is_null() {
            Bytes::new()
        } else {
            resp = resp.header("content-type", "application/json");
            Bytes::from(reply.body.to_string())
        };
        resp.body(Full::new(body)).unwrap()
    }
}

/// A fleet running in the background until `stop`.
pub(crate) struct Running {
    cancel: Option<oneshot::Sender<()>>,
    handle: tokio::task::JoinHandle<Result<Report, fleet::Error>>,
}

impl Running {
    pub(crate) fn start(config: FleetConfig) -> Self {
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(fleet::run(config, Arc::new(Progress::default()), async {
            let _ = rx.await;
        }));
        Running {
            cancel: Some(tx),
            handle,
        }
    }

    /// Ends the run now; its report.
    pub(crate) async fn stop(mut self) -> Report {
        let _ = self.cancel.take().unwrap().send(());
        self.handle.await.unwrap().unwrap()
    }

    /// Waits for the run's own end (its duration); its report.
    pub(crate) async fn finish(mut self) -> Report {
        let cancel = self.cancel.take();
        let report = self.handle.await.unwrap().unwrap();
        drop(cancel);
        report
    }
}
