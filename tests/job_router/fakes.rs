//! In-process stand-ins for the client's own tests, as `router/client_test.go`
//! (gitlabhq/gitlab-runner, d79f3e7b) builds them: a GitLab answering discovery and
//! `jobs/request` ([`FakeGitLab`]) and a router answering `GetJob` over h2c or
//! inside a WebSocket ([`FakeRouter`]), each recording what it was sent.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::StreamExt as _;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::handshake::server::{
    ErrorResponse, Request as WsRequest, Response as WsResponse,
};
use tonic::Code;
use tonic::codegen::{BoxFuture, Service};

use super::rpc::{GET_JOB, GetJobRequest, GetJobResponse};
use super::wstunnel::{self, SUBPROTOCOL, WsConn};

/// GitLab's two runner endpoints the client calls: discovery answers the router URL
/// set (200) or 501; `jobs/request` answers 201 `{"id": N, "source": "rest"}`.
#[derive(Clone, Default)]
pub struct FakeGitLab {
    pub url: String,
    router: Arc<Mutex<Option<String>>>,
    pub discovery_calls: Arc<AtomicU64>,
    pub rest_calls: Arc<AtomicU64>,
}

impl FakeGitLab {
    pub async fn start(router: Option<String>) -> FakeGitLab {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let fake = FakeGitLab {
            url: format!("http://{}", listener.local_addr().unwrap()),
            router: Arc::new(Mutex::new(router)),
            ..FakeGitLab::default()
        };
        let f = fake.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let f = f.clone();
                let svc = hyper::service::service_fn(move |req| {
                    let f = f.clone();
                    async move { Ok::<_, Infallible>(f.answer(req)) }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc),
                );
            }
        });
        fake
    }

    /// What discovery answers from now on.
    pub fn set_router(&self, router: Option<String>) {
        *self.router.lock().unwrap() = router;
    }

    fn answer<B>(&self, req: Request<B>) -> Response<Full<Bytes>> {
        let json_reply = |status, body: Value| {
            Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body.to_string())))
                .unwrap()
        };
        match req.uri().path() {
            "/api/v4/runners/router/discovery" => {
                self.discovery_calls.fetch_add(1, Ordering::SeqCst);
                match self.router.lock().unwrap().clone() {
                    Some(url) => json_reply(StatusCode::OK, json!({ "server_url": url })),
                    None => json_reply(
                        StatusCode::NOT_IMPLEMENTED,
                        json!({ "message": "501 Not Implemented" }),
                    ),
                }
            }
            "/api/v4/jobs/request" => {
                let n = self.rest_calls.fetch_add(1, Ordering::SeqCst) + 1;
                json_reply(StatusCode::CREATED, json!({ "id": n, "source": "rest" }))
            }
            _ => json_reply(StatusCode::NOT_FOUND, json!({ "message": "404 Not Found" })),
        }
    }
}

/// One `GetJob` as the router saw it: its metadata (lower-case names) and body.
#[derive(Clone, Debug)]
pub struct Seen {
    pub metadata: HashMap<String, String>,
    pub job_request: Value,
}

#[derive(Default)]
struct RouterState {
    /// `Code::Ok`: answer [`RouterState::job`]; else fail with this code.
    code: Mutex<Option<Code>>,
    job: Mutex<Option<Value>>,
    last_update: Mutex<Option<String>>,
    /// Answer every call with this HTTP status and a JSON body, as a plain HTTP
    /// server (or an edge refusing it) would.
    http_refusal: Mutex<Option<StatusCode>>,
    seen: Mutex<Vec<Seen>>,
    upgrades: Mutex<Vec<HashMap<String, String>>>,
}

/// A router serving `GetJob` on `addr`: h2c, or inside a `ws-tunnel` WebSocket.
#[derive(Clone)]
pub struct FakeRouter {
    pub addr: SocketAddr,
    state: Arc<RouterState>,
}

impl FakeRouter {
    /// gRPC over h2c: its URL is `grpc://addr`.
    pub async fn grpc() -> FakeRouter {
        let (listener, router) = FakeRouter::bind().await;
        let svc = router.clone();
        let incoming = tonic::codegen::tokio_stream::wrappers::TcpListenerStream::new(listener);
        tokio::spawn(tonic::transport::Server::builder().serve_with_incoming(svc, incoming));
        router
    }

    /// gRPC inside WebSockets: its URL is `ws://addr/-/kubernetes-agent/`. Each
    /// upgrade's headers are recorded; it must name the `ws-tunnel` subprotocol.
    pub async fn ws() -> FakeRouter {
        let (listener, router) = FakeRouter::bind().await;
        let state = router.state.clone();
        let incoming = futures_util::stream::unfold(listener, move |listener| {
            let state = state.clone();
            async move {
                loop {
                    let (tcp, _) = listener.accept().await.ok()?;
                    let state = state.clone();
                    // tungstenite's `Callback` signature: its error is a whole response.
                    #[allow(clippy::result_large_err)]
                    let callback = move |req: &WsRequest, mut resp: WsResponse| {
                        let headers: HashMap<String, String> = req
                            .headers()
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned()))
                            .collect();
                        let tunnel = headers
                            .get("sec-websocket-protocol")
                            .is_some_and(|p| p.split(',').any(|p| p.trim() == SUBPROTOCOL));
                        state.upgrades.lock().unwrap().push(headers);
                        if !tunnel {
                            let mut refused = ErrorResponse::new(Some("no ws-tunnel".into()));
                            *refused.status_mut() = StatusCode::BAD_REQUEST;
                            return Err(refused);
                        }
                        resp.headers_mut().insert(
                            "sec-websocket-protocol",
                            http::HeaderValue::from_static(SUBPROTOCOL),
                        );
                        Ok(resp)
                    };
                    let accepted = tokio_tungstenite::accept_hdr_async_with_config(
                        tcp,
                        callback,
                        Some(wstunnel::config()),
                    )
                    .await;
                    if let Ok(ws) = accepted {
                        return Some((Ok::<_, Infallible>(WsConn::new(ws)), listener));
                    }
                }
            }
        })
        .boxed();
        tokio::spawn(
            tonic::transport::Server::builder().serve_with_incoming(router.clone(), incoming),
        );
        router
    }

    async fn bind() -> (TcpListener, FakeRouter) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let router = FakeRouter {
            addr: listener.local_addr().unwrap(),
            state: Arc::default(),
        };
        (listener, router)
    }

    /// Answer OK with `job` (None: an empty `job_response`).
    pub fn answer_job(&self, job: Option<Value>) {
        *self.state.code.lock().unwrap() = None;
        *self.state.job.lock().unwrap() = job;
    }

    /// Fail every call with `code`.
    pub fn fail_with(&self, code: Code) {
        *self.state.code.lock().unwrap() = Some(code);
    }

    /// Answer every call with a plain HTTP `status` and a JSON body, not gRPC.
    pub fn refuse_with_http(&self, status: StatusCode) {
        *self.state.http_refusal.lock().unwrap() = Some(status);
    }

    /// Send `x-gitlab-last-update: value` with every OK answer.
    pub fn last_update(&self, value: &str) {
        *self.state.last_update.lock().unwrap() = Some(value.to_owned());
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    /// The WebSocket upgrades' headers (lower-case names).
    pub fn upgrades(&self) -> Vec<HashMap<String, String>> {
        self.state.upgrades.lock().unwrap().clone()
    }

    fn get_job(
        &self,
        req: tonic::Request<GetJobRequest>,
    ) -> Result<tonic::Response<GetJobResponse>, tonic::Status> {
        let metadata = req
            .metadata()
            .clone()
            .into_headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned()))
            .collect();
        let job_request = serde_json::from_slice(&req.get_ref().job_request).unwrap_or(Value::Null);
        self.state.seen.lock().unwrap().push(Seen {
            metadata,
            job_request,
        });
        if let Some(code) = *self.state.code.lock().unwrap() {
            return Err(tonic::Status::new(code, "fake router"));
        }
        let job_response = self
            .state
            .job
            .lock()
            .unwrap()
            .as_ref()
            .map(|j| j.to_string().into_bytes())
            .unwrap_or_default();
        let mut resp = tonic::Response::new(GetJobResponse { job_response });
        resp.metadata_mut()
            .insert("x-request-id", "from-router".parse().unwrap());
        if let Some(lu) = &*self.state.last_update.lock().unwrap() {
            resp.metadata_mut()
                .insert("x-gitlab-last-update", lu.parse().unwrap());
        }
        Ok(resp)
    }
}

/// The unary handler tonic's server calls (what generated code would write).
struct GetJob(FakeRouter);

impl tonic::server::UnaryService<GetJobRequest> for GetJob {
    type Response = GetJobResponse;
    type Future = BoxFuture<tonic::Response<GetJobResponse>, tonic::Status>;

    fn call(&mut self, req: tonic::Request<GetJobRequest>) -> Self::Future {
        let answer = self.0.get_job(req);
        Box::pin(async move { answer })
    }
}

impl Service<Request<tonic::body::Body>> for FakeRouter {
    type Response = Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<tonic::body::Body>) -> Self::Future {
        let router = self.clone();
        let refusal = *self.state.http_refusal.lock().unwrap();
        Box::pin(async move {
            if let Some(status) = refusal {
                let body = json!({ "message": status.to_string() }).to_string();
                return Ok(Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(tonic::body::Body::new(Full::new(Bytes::from(body))))
                    .unwrap());
            }
            if req.uri().path() != GET_JOB {
                return Ok(tonic::Status::unimplemented("").into_http());
            }
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
            Ok(grpc.unary(GetJob(router), req).await)
        })
    }
}
