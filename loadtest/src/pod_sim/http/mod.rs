//! The Pod's HTTP/1.1 surface (hyper): routing, replies, and the authentication
//! helpers every endpoint shares. One module per endpoint family:
//! [`runners`] (registration and friends), [`workhorse`] (Workhorse's
//! `jobs/request` long poll), [`jobs`] (Rails' `jobs/request`, `PUT jobs/:id`, the
//! job payload), [`trace`], [`artifacts`], [`git`] (smart HTTP through
//! `git http-backend`), [`kubernetes`] (what kas asks for its Kubernetes API proxy),
//! [`workspaces`] (the Workspaces internal API kas calls for agentk) and [`control`]
//! (`/-/podsim/…`, for tests and `podgate up`); `accept` is the accept loop (back-off
//! on errors).
//!
//! Paths are cleaned as Workhorse cleans them before Rails sees them
//! (`CleanURIPath`: `//` squeezed, `.` and `..` resolved), and Grape's optional
//! trailing `/` and `.json` suffix are accepted.

// Helpers return the response to send as their error; it is sent at once, so its size
// does not travel far.
#![allow(clippy::result_large_err)]

mod accept;
mod agentw;
mod artifacts;
mod control;
mod git;
mod jobs;
mod kubernetes;
pub(super) mod pages;
mod runners;
mod trace;
mod users;
mod workhorse;
mod workspaces;

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::Shared;
use super::params::{self, Declared, Params, Parsed};
use super::state::{JobState, Owner};

pub(crate) type Body = BoxBody<Bytes, std::io::Error>;

/// Largest body read into memory (JSON, forms, trace patches); 413 above.
const MAX_BODY: usize = 4 << 20;

pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    // Out of descriptors and the like: back off instead of spinning (`accept.rs`).
    accept::accept_loop(
        || listener.accept(),
        |(stream, _)| {
            let shared = shared.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let shared = shared.clone();
                    async move { Ok::<_, Infallible>(handle(&shared, req).await) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        },
    )
    .await
}

pub(crate) fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|e| match e {}).boxed()
}

pub(crate) fn reply(status: StatusCode, body: Value) -> Response<Body> {
    let mut r = Response::new(full(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

pub(crate) fn empty(status: StatusCode) -> Response<Body> {
    let mut r = Response::new(full(Bytes::new()));
    *r.status_mut() = status;
    r
}

/// GitLab's `error!` / `render_api_error!` shape: `{"message": …}`.
pub(crate) fn message(status: StatusCode, m: &str) -> Response<Body> {
    reply(status, json!({ "message": m }))
}

/// Grape's validation and parsing errors: `{"error": …}`.
pub(crate) fn grape_error(status: StatusCode, e: &str) -> Response<Body> {
    reply(status, json!({ "error": e }))
}

pub(crate) fn forbidden() -> Response<Body> {
    message(StatusCode::FORBIDDEN, "403 Forbidden")
}

fn not_found() -> Response<Body> {
    message(StatusCode::NOT_FOUND, "404 Not Found")
}

async fn handle(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let (endpoint, resp) = route(shared, req).await;
    shared
        .metrics
        .requests
        .with_label_values(&[endpoint, resp.status().as_str()])
        .inc();
    resp
}

/// Workhorse's `CleanURIPath`: squeeze `//`, resolve `.` and `..`.
fn clean_path(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    format!("/{}", out.join("/"))
}

async fn route(shared: &Shared, req: Request<Incoming>) -> (&'static str, Response<Body>) {
    let path = clean_path(req.uri().path());
    if path == "/metrics" {
        let mut r = Response::new(full(shared.metrics.render()));
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        );
        return ("metrics", r);
    }
    if matches!(path.as_str(), "/-/readiness" | "/-/health" | "/-/liveness") {
        return ("health", reply(StatusCode::OK, json!({"status": "ok"})));
    }
    if let Some(rest) = path.strip_prefix("/-/podsim") {
        return ("control", control::route(shared, req, rest).await);
    }
    if let Some((endpoint, resp)) = git::route(&path, req.method()) {
        return (endpoint, resp.run(shared, req).await);
    }
    let Some(rest) = path.strip_prefix("/api/v4/") else {
        if let Some(page) = pages::route(shared, &path) {
            return page;
        }
        return ("other", not_found());
    };
    // Grape routes accept a `.json` format suffix.
    let rest = rest.strip_suffix(".json").unwrap_or(rest);
    let parts: Vec<&str> = rest.split('/').collect();
    let method = req.method().clone();
    use http::Method as M;
    match (&method, parts.as_slice()) {
        (&M::POST, ["runners"]) => ("runners", runners::register(shared, req).await),
        (&M::POST, ["runners", "verify"]) => ("runners_verify", runners::verify(shared, req).await),
        (&M::DELETE, ["runners"]) => ("runners_delete", runners::unregister(shared, req).await),
        (&M::DELETE, ["runners", "managers"]) => (
            "runners_managers_delete",
            runners::managers(shared, req).await,
        ),
        (&M::GET, ["runners", "router", "discovery"]) => {
            ("runners_router_discovery", runners::discovery(shared, &req))
        }
        (&M::POST, ["runners", "reset_authentication_token"]) => {
            ("runners_reset_token", runners::reset(shared, req).await)
        }
        (&M::POST, ["jobs", "request"]) => ("jobs_request", workhorse::register(shared, req).await),
        (&M::PUT, ["jobs", id]) => ("jobs_update", jobs::update(shared, req, id).await),
        (&M::PATCH, ["jobs", id, "trace"]) => ("jobs_trace", trace::patch(shared, req, id).await),
        (&M::POST, ["jobs", id, "artifacts"]) => (
            "jobs_artifacts_upload",
            artifacts::upload(shared, req, id).await,
        ),
        (&M::GET, ["jobs", id, "artifacts"]) => (
            "jobs_artifacts_download",
            artifacts::download(shared, req, id).await,
        ),
        (&M::POST, ["internal", "kubernetes", "authorize_proxy_user"]) => (
            "k8s_authorize_proxy_user",
            kubernetes::authorize_proxy_user(shared, req).await,
        ),
        (
            &M::POST,
            [
                "internal",
                "kubernetes",
                "modules",
                "remote_development",
                "reconcile",
            ],
        ) => ("ws_reconcile", workspaces::reconcile(shared, req).await),
        (
            &M::GET,
            [
                "internal",
                "kubernetes",
                "modules",
                "remote_development",
                "prerequisites",
            ],
        ) => (
            "ws_prerequisites",
            workspaces::prerequisites(shared, req).await,
        ),
        (&M::POST, ["internal", "kubernetes", "agent_configuration"]) => (
            "k8s_agent_configuration",
            workspaces::agent_configuration(shared, req).await,
        ),
        (&M::GET, ["internal", "agents", "agentw", "server_config"]) => {
            ("agentw_server_config", agentw::server_config(shared, &req))
        }
        (&M::GET, ["internal", "agents", "agentw", "authorize_user_access"]) => (
            "agentw_authorize_user_access",
            agentw::authorize_user_access(shared, &req),
        ),
        (&M::GET, ["user"]) => ("user", users::current_user(shared, &req)),
        (&M::GET, ["job", "allowed_agents"]) => (
            "k8s_allowed_agents",
            kubernetes::allowed_agents(shared, req).await,
        ),
        _ => ("other", not_found()),
    }
}

/// Read the request's parameters (Grape/Rack rules); `Err` is the response to send.
pub(crate) async fn read<B>(shared: &Shared, req: Request<B>) -> Result<Parsed, Response<Body>>
where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let limits = params::Limits {
        max_body: MAX_BODY,
        max_file: shared.config.max_artifact_bytes,
        upload_dir: shared.artifacts.path(),
    };
    params::read(req, &limits).await.map_err(param_error)
}

pub(crate) fn param_error(e: params::Error) -> Response<Body> {
    match e {
        params::Error::BadRequest(m) => grape_error(StatusCode::BAD_REQUEST, &m),
        e @ params::Error::UnsupportedMediaType(_) => {
            grape_error(StatusCode::UNSUPPORTED_MEDIA_TYPE, &e.to_string())
        }
        params::Error::TooLarge => message(
            StatusCode::PAYLOAD_TOO_LARGE,
            "413 Request Entity Too Large",
        ),
        params::Error::Io(e) => message(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// Read the parameters and check them against a Grape `params` block; `Err` is the
/// response to send.
pub(crate) async fn read_declared(
    shared: &Shared,
    req: Request<Incoming>,
    declared: &Declare<'_>,
) -> Result<Parsed, Response<Body>> {
    let parsed = read(shared, req).await?;
    declared.check(&parsed.params)?;
    Ok(parsed)
}

/// A Grape `params` block: `requires` and `optional` parameters of `type: String`,
/// and `type: Hash` ones; 400 naming every failure, as Grape does.
pub(crate) struct Declare<'a> {
    pub required: &'a [&'a str],
    pub strings: &'a [&'a str],
    pub hashes: &'a [&'a str],
}

impl Declare<'_> {
    pub(crate) fn check(&self, params: &Params) -> Result<(), Response<Body>> {
        let mut errors = Vec::new();
        for key in self.required {
            if !params.contains_key(*key) {
                errors.push(format!("{key} is missing"));
            }
        }
        for key in self.required.iter().chain(self.strings) {
            if let Err(e) = params::string(params, key) {
                errors.push(e);
            }
        }
        for key in self.hashes {
            if params
                .get(*key)
                .is_some_and(|v| !v.is_object() && !v.is_null())
            {
                errors.push(format!("{key} is invalid"));
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(grape_error(StatusCode::BAD_REQUEST, &errors.join(", ")))
        }
    }
}

/// `requires :id, type: Integer`: the job id of the path (400 "id is invalid").
pub(crate) fn job_id(id: &str) -> Result<u64, Response<Body>> {
    id.parse()
        .map_err(|_| grape_error(StatusCode::BAD_REQUEST, "id is invalid"))
}

/// A request header as Rack's env holds it: repeated headers joined by `, `.
pub(crate) fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    let values: Vec<&str> = headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    (!values.is_empty()).then(|| values.join(", "))
}

/// The token a runner endpoint authenticates: `params[:token]`, nothing else
/// (`API::Ci::Helpers::Runner#current_runner`, `lib/api/ci/helpers/runner.rb`).
pub(crate) fn runner_token(params: &Params) -> String {
    match params::string(params, "token") {
        Ok(Declared::Value(s)) => s,
        _ => String::new(),
    }
}

/// The token a job endpoint authenticates: `(params[:token] || env['HTTP_JOB_TOKEN']).to_s`
/// (`API::Ci::Helpers::Runner#job_token`): a present `token` parameter wins even when
/// empty; the header only counts when there is none.
pub(crate) fn job_token(params: &Params, headers: &HeaderMap) -> String {
    match params::string(params, "token") {
        Ok(Declared::Value(s)) => s,
        _ => header(headers, "job-token").unwrap_or_default(),
    }
}

/// 403 for a token of another Pod, counted as a misroute.
pub(crate) fn misrouted(shared: &Shared, pod: podgate_tokens::PodId) -> Response<Body> {
    shared.metrics.misrouted.inc();
    tracing::warn!(
        this_pod = %shared.state.pod(),
        token_pod = %pod,
        "misrouted request: the token belongs to another Pod"
    );
    message(
        StatusCode::FORBIDDEN,
        "403 Forbidden - token of another Pod",
    )
}

/// `authenticate_runner!`: the runner a request authenticates as (its
/// `contacted_at` updated: `current_runner.heartbeat`), or the response to send.
pub(crate) fn authenticate_runner(shared: &Shared, token: &str) -> Result<u64, Response<Body>> {
    match shared.state.runner(token) {
        Owner::Ours(id) => {
            shared.state.heartbeat(id);
            Ok(id)
        }
        Owner::Misrouted(pod) => Err(misrouted(shared, pod)),
        Owner::Unknown => Err(forbidden()),
    }
}

pub(crate) fn job_status(state: JobState) -> HeaderValue {
    HeaderValue::from_static(state.as_str())
}

/// The path's job id, authenticated by the request's job token
/// ([`job_id`], [`job_token`], [`authenticate_job`]).
pub(crate) fn authenticated_job(
    shared: &Shared,
    parsed: &Parsed,
    id: &str,
) -> Result<u64, Response<Body>> {
    let id = job_id(id)?;
    authenticate_job(shared, &job_token(&parsed.params, &parsed.headers), id)?;
    Ok(id)
}

/// `authenticate_job!` (`lib/api/ci/helpers/runner.rb`): job `id` must exist, `token`
/// must be its token, and it must be running; every failure is 403 (with `Job-Status`
/// when the job is not running), never 404, so a runner stops the job. A token of
/// another Pod is a misroute.
pub(crate) fn authenticate_job(
    shared: &Shared,
    token: &str,
    id: u64,
) -> Result<(), Response<Body>> {
    match shared.state.job_by_token(token) {
        Owner::Misrouted(pod) => return Err(misrouted(shared, pod)),
        Owner::Ours(j) if j == id => {}
        _ => return Err(forbidden()),
    }
    match shared.state.job(id) {
        Some(job) if job.state == JobState::Running => Ok(()),
        Some(job) => {
            let mut r = message(
                StatusCode::FORBIDDEN,
                "403 Forbidden - Job is not processing on runner",
            );
            r.headers_mut().insert("job-status", job_status(job.state));
            Err(r)
        }
        None => Err(forbidden()),
    }
}
