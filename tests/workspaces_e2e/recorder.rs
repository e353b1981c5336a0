//! A recording HTTP proxy between kas and the Pod simulator: it forwards every
//! request to GitLab (the simulator) and keeps, for each `remote_development`
//! reconcile, the request body agentk sent and GitLab's answer, exactly as they went
//! over the wire. It can also stand for a failing GitLab: while [`Recorder::fail`] is
//! set, reconciles are answered with that status and never reach the simulator.
//!
//! It shares no code with kas or agentk: it reads what they send as any HTTP server
//! would.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use tokio::sync::watch;

/// The path agentk's reconciles reach GitLab at.
pub const RECONCILE: &str = "/api/v4/internal/kubernetes/modules/remote_development/reconcile";

/// One reconcile as it went over the wire.
#[derive(Clone, Debug)]
pub struct Exchange {
    /// The request body, parsed.
    pub request: Value,
    /// The status answered.
    pub status: u16,
    /// The answer's body, parsed (`Null` when not JSON).
    pub response: Value,
    /// Request headers (lower-case names).
    pub headers: Vec<(String, String)>,
    /// In which order the request arrived (0 for the first): the log is in the order
    /// of the answers, and a request sent before an event can be answered after it.
    pub arrival: usize,
}

impl Exchange {
    /// `"full"` or `"partial"`.
    pub fn update_type(&self) -> &str {
        self.request["update_type"].as_str().unwrap_or("")
    }

    /// The names of the workspaces the agent reported.
    pub fn reported(&self) -> Vec<String> {
        names(&self.request["workspace_agent_infos"])
    }

    /// The names of the workspaces GitLab returned.
    pub fn returned(&self) -> Vec<String> {
        names(&self.response["workspace_rails_infos"])
    }

    /// The agent info for workspace `name`, if reported.
    pub fn info(&self, name: &str) -> Option<&Value> {
        self.request["workspace_agent_infos"]
            .as_array()?
            .iter()
            .find(|i| i["name"] == name)
    }
}

fn names(list: &Value) -> Vec<String> {
    list.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| i["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[derive(Default)]
struct Inner {
    log: Vec<Exchange>,
    fail: Option<u16>,
    /// Reconcile requests arrived so far.
    arrived: usize,
}

/// The recorder; cheap to clone.
#[derive(Clone)]
pub struct Recorder {
    /// Where kas should find GitLab.
    pub addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
    count: watch::Sender<usize>,
}

type Body = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;

impl Recorder {
    /// Listen on a free port and forward to `gitlab`.
    pub async fn start(gitlab: SocketAddr) -> Recorder {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let recorder = Recorder {
            addr: listener.local_addr().unwrap(),
            inner: Arc::default(),
            count: watch::channel(0).0,
        };
        let client: Client<HttpConnector, Body> =
            Client::builder(TokioExecutor::new()).build_http();
        let r = recorder.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (r, client) = (r.clone(), client.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let (r, client) = (r.clone(), client.clone());
                        async move { Ok::<_, Infallible>(r.handle(req, gitlab, client).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        recorder
    }

    async fn handle(
        &self,
        req: hyper::Request<Incoming>,
        gitlab: SocketAddr,
        client: Client<HttpConnector, Body>,
    ) -> hyper::Response<Body> {
        let reconcile = req.uri().path() == RECONCILE;
        let (mut parts, body) = req.into_parts();
        let body = match body.collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => return status_only(400, Bytes::new()),
        };
        let headers: Vec<(String, String)> = parts
            .headers
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
            .collect();
        let (fail, arrival) = {
            let mut inner = self.inner.lock().unwrap();
            let arrival = inner.arrived;
            if reconcile {
                inner.arrived += 1;
            }
            (inner.fail, arrival)
        };
        let (status, answer) = match fail {
            Some(code) if reconcile => (
                code,
                Bytes::from_static(br#"{"message":"500 Internal Server Error"}"#),
            ),
            _ => {
                let pq = parts
                    .uri
                    .path_and_query()
                    .map_or("/", |p| p.as_str())
                    .to_owned();
                parts.uri = format!("http://{gitlab}{pq}").parse().unwrap();
                let upstream = hyper::Request::from_parts(
                    parts,
                    Full::new(body.clone()).map_err(|e| match e {}).boxed(),
                );
                match client.request(upstream).await {
                    Ok(resp) => {
                        let status = resp.status().as_u16();
                        match resp.into_body().collect().await {
                            Ok(b) => (status, b.to_bytes()),
                            Err(_) => (502, Bytes::new()),
                        }
                    }
                    Err(_) => (502, Bytes::new()),
                }
            }
        };
        if reconcile {
            let exchange = Exchange {
                request: serde_json::from_slice(&body).unwrap_or(Value::Null),
                status,
                response: serde_json::from_slice(&answer).unwrap_or(Value::Null),
                headers,
                arrival,
            };
            let n = {
                let mut inner = self.inner.lock().unwrap();
                inner.log.push(exchange);
                inner.log.len()
            };
            self.count.send_replace(n);
        }
        status_only(status, answer)
    }

    /// Answer reconciles with `status` (`None`: forward them again).
    pub fn fail(&self, status: Option<u16>) {
        self.inner.lock().unwrap().fail = status;
    }

    /// Every reconcile so far.
    pub fn log(&self) -> Vec<Exchange> {
        self.inner.lock().unwrap().log.clone()
    }

    /// How many reconcile requests have arrived so far (answered or not).
    pub fn arrivals(&self) -> usize {
        self.inner.lock().unwrap().arrived
    }

    /// How many reconciles so far.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap().log.len()
    }

    /// Wait for the first reconcile after the `from`-th one that satisfies `check`,
    /// for at most `within`; panics naming `what` otherwise.
    pub async fn next_after(
        &self,
        from: usize,
        within: std::time::Duration,
        what: &str,
        mut check: impl FnMut(&Exchange) -> bool,
    ) -> (usize, Exchange) {
        let mut rx = self.count.subscribe();
        let mut seen = from;
        let found = tokio::time::timeout(within, async {
            loop {
                let log = self.log();
                for (i, e) in log.iter().enumerate().skip(seen) {
                    if check(e) {
                        return (i + 1, e.clone());
                    }
                }
                seen = log.len();
                if rx.changed().await.is_err() {
                    panic!("the recorder stopped");
                }
            }
        })
        .await;
        match found {
            Ok(found) => found,
            Err(_) => panic!(
                "no reconcile {what} within {within:?}; the last ones: {:#?}",
                self.log()
                    .iter()
                    .rev()
                    .take(3)
                    .map(|e| (&e.request, e.status))
                    .collect::<Vec<_>>()
            ),
        }
    }
}

fn status_only(status: u16, body: Bytes) -> hyper::Response<Body> {
    let mut r = hyper::Response::new(Full::new(body).map_err(|e| match e {}).boxed());
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}
