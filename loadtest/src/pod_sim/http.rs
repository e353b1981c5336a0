//! The runner API over HTTP/1.1 (hyper). One function per endpoint; each returns the
//! response and the endpoint's metric label.

// Helpers return the response to send as their error; it is sent at once, so its size
// does not travel far.
#![allow(clippy::result_large_err)]

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sha2::Digest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::Shared;
use super::state::{Artifact, JobState, Owner, Pick, Trace, Update};

type Body = BoxBody<Bytes, std::io::Error>;

/// Largest JSON body read (Workhorse's limit for `jobs/request` is 32 KiB).
const MAX_JSON: usize = 64 * 1024;
/// Largest trace patch accepted.
const MAX_TRACE: usize = 4 << 20;

pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
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
    }
}

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|e| match e {}).boxed()
}

fn reply(status: StatusCode, body: Value) -> Response<Body> {
    let mut r = Response::new(full(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn empty(status: StatusCode) -> Response<Body> {
    let mut r = Response::new(full(Bytes::new()));
    *r.status_mut() = status;
    r
}

fn message(status: StatusCode, m: &str) -> Response<Body> {
    reply(status, json!({ "message": m }))
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

async fn route(shared: &Shared, req: Request<Incoming>) -> (&'static str, Response<Body>) {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let Some(rest) = path.strip_prefix("/api/v4/") else {
        return match path.as_str() {
            "/metrics" => ("metrics", {
                let mut r = Response::new(full(shared.metrics.render()));
                r.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; version=0.0.4"),
                );
                r
            }),
            "/-/readiness" | "/-/health" | "/-/liveness" => {
                ("health", reply(StatusCode::OK, json!({"status": "ok"})))
            }
            _ => ("other", message(StatusCode::NOT_FOUND, "404 Not Found")),
        };
    };
    let parts: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
    match (&method, parts.as_slice()) {
        (&Method::POST, ["runners"]) => ("runners", register(shared, req).await),
        (&Method::POST, ["runners", "verify"]) => ("runners_verify", verify(shared, req).await),
        (&Method::DELETE, ["runners"]) => ("runners_delete", unregister(shared, req).await),
        (&Method::DELETE, ["runners", "managers"]) => {
            ("runners_managers_delete", managers(shared, req).await)
        }
        (&Method::POST, ["runners", "reset_authentication_token"]) => {
            ("runners_reset_token", reset(shared, req).await)
        }
        (&Method::POST, ["jobs", "request"]) => ("jobs_request", request_job(shared, req).await),
        (&Method::PUT, ["jobs", id]) => (
            "jobs_update",
            with_id(id, |id| update(shared, req, id)).await,
        ),
        (&Method::PATCH, ["jobs", id, "trace"]) => {
            ("jobs_trace", with_id(id, |id| trace(shared, req, id)).await)
        }
        (&Method::POST, ["jobs", id, "artifacts"]) => (
            "jobs_artifacts_upload",
            with_id(id, |id| upload(shared, req, id)).await,
        ),
        (&Method::GET, ["jobs", id, "artifacts"]) => (
            "jobs_artifacts_download",
            with_id(id, |id| download(shared, req, id)).await,
        ),
        _ => ("other", message(StatusCode::NOT_FOUND, "404 Not Found")),
    }
}

async fn with_id<F, Fut>(id: &str, f: F) -> Response<Body>
where
    F: FnOnce(u64) -> Fut,
    Fut: std::future::Future<Output = Response<Body>>,
{
    match id.parse() {
        Ok(id) => f(id).await,
        Err(_) => message(StatusCode::NOT_FOUND, "404 Job Not Found"),
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

fn query<'a>(uri: &'a http::Uri, name: &str) -> Option<&'a str> {
    uri.query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then_some(v)
    })
}

/// Read a JSON body (bounded). `Err` is the response to send.
async fn json_body(req: Request<Incoming>) -> Result<(HeaderMap, Value), Response<Body>> {
    let (parts, body) = req.into_parts();
    let bytes = Limited::new(body, MAX_JSON)
        .collect()
        .await
        .map_err(|_| {
            message(
                StatusCode::PAYLOAD_TOO_LARGE,
                "413 Request Entity Too Large",
            )
        })?
        .to_bytes();
    if bytes.is_empty() {
        return Ok((parts.headers, json!({})));
    }
    let v = serde_json::from_slice(&bytes)
        .map_err(|_| message(StatusCode::BAD_REQUEST, "400 Bad request - invalid JSON"))?;
    Ok((parts.headers, v))
}

/// The runner token: `RUNNER-TOKEN`, else the body's `token`.
fn runner_token<'a>(headers: &'a HeaderMap, body: &'a Value) -> &'a str {
    header(headers, "runner-token")
        .or_else(|| body.get("token").and_then(Value::as_str))
        .unwrap_or("")
}

/// 403 for a token of another Pod, counted as a misroute.
fn misrouted(shared: &Shared, pod: podgate_tokens::PodId) -> Response<Body> {
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

fn forbidden() -> Response<Body> {
    message(StatusCode::FORBIDDEN, "403 Forbidden")
}

/// The runner a request authenticates as, or the response to send.
fn authenticate_runner(shared: &Shared, token: &str) -> Result<u64, Response<Body>> {
    match shared.state.runner(token) {
        Owner::Ours(id) => Ok(id),
        Owner::Misrouted(pod) => Err(misrouted(shared, pod)),
        Owner::Unknown => Err(forbidden()),
    }
}

fn expires_at() -> Value {
    Value::Null
}

async fn register(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let (headers, body) = match json_body(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    match shared
        .state
        .check_registration(runner_token(&headers, &body))
    {
        Owner::Ours(()) => {}
        Owner::Misrouted(pod) => return misrouted(shared, pod),
        Owner::Unknown => return forbidden(),
    }
    match shared.state.register() {
        Ok((id, token)) => reply(
            StatusCode::CREATED,
            json!({ "id": id, "token": token, "token_expires_at": expires_at() }),
        ),
        Err(e) => message(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

async fn verify(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let (headers, body) = match json_body(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let token = runner_token(&headers, &body);
    match authenticate_runner(shared, token) {
        Ok(id) => reply(
            StatusCode::OK,
            json!({ "id": id, "token": token, "token_expires_at": expires_at() }),
        ),
        Err(r) => r,
    }
}

async fn unregister(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let (headers, body) = match json_body(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let token = runner_token(&headers, &body);
    match authenticate_runner(shared, token) {
        Ok(_) => {
            shared.state.unregister(token);
            empty(StatusCode::NO_CONTENT)
        }
        Err(r) => r,
    }
}

async fn managers(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let (headers, body) = match json_body(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    if body.get("system_id").and_then(Value::as_str).is_none() {
        return message(
            StatusCode::BAD_REQUEST,
            "400 Bad request - system_id is missing",
        );
    }
    match authenticate_runner(shared, runner_token(&headers, &body)) {
        Ok(_) => empty(StatusCode::NO_CONTENT),
        Err(r) => r,
    }
}

async fn reset(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let (headers, body) = match json_body(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let token = runner_token(&headers, &body);
    if let Err(r) = authenticate_runner(shared, token) {
        return r;
    }
    match shared.state.reset_token(token) {
        Ok(Some(new)) => reply(
            StatusCode::CREATED,
            json!({ "token": new, "token_expires_at": expires_at() }),
        ),
        Ok(None) => forbidden(),
        Err(e) => message(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// `jobs/request`: a job at once if one is queued; else hold until the queue ticket
/// moves or the long poll ends (204 with the ticket), as Workhorse does. A runner
/// whose `last_update` is stale is answered at once.
async fn request_job(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let (headers, body) = match json_body(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let runner = match authenticate_runner(shared, runner_token(&headers, &body)) {
        Ok(id) => id,
        Err(r) => return r,
    };
    let last_update = body
        .get("last_update")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut ticket = shared.state.watch_ticket();
    let current = *ticket.borrow_and_update();
    let mut waited = last_update != current.to_string();
    let deadline = tokio::time::Instant::now() + shared.config.long_poll;
    loop {
        match shared.state.pick(runner) {
            Pick::Job(job) => {
                shared.metrics.queued.set(shared.state.queued() as i64);
                return reply(StatusCode::CREATED, job_json(shared, &job));
            }
            Pick::Conflict => {
                return message(StatusCode::CONFLICT, "409 Conflict");
            }
            Pick::Empty if waited => {
                let mut r = empty(StatusCode::NO_CONTENT);
                r.headers_mut().insert(
                    "x-gitlab-last-update",
                    HeaderValue::from(shared.state.ticket()),
                );
                return r;
            }
            Pick::Empty => {
                // Hold until a job is queued or the poll ends.
                waited = !matches!(
                    tokio::time::timeout_at(deadline, ticket.changed()).await,
                    Ok(Ok(()))
                ) || tokio::time::Instant::now() >= deadline;
            }
        }
    }
}

fn job_json(shared: &Shared, job: &super::state::Job) -> Value {
    let deps: Vec<Value> = shared
        .state
        .dependencies(job.id)
        .into_iter()
        .map(|d| {
            json!({
                "id": d.id,
                "name": format!("build-{}", d.id),
                "token": d.token,
                "artifacts_file": d.artifact.as_ref().map(|a| json!({
                    "filename": "artifacts.zip",
                    "size": a.size,
                })),
            })
        })
        .collect();
    json!({
        "id": job.id,
        "token": job.token,
        "allow_git_fetch": true,
        "job_info": {
            "id": job.id,
            "name": format!("build-{}", job.id),
            "stage": "test",
            "project_id": 1000 + shared.state.pod().get(),
            "project_name": "simulated",
            "time_in_queue_seconds": 0.1,
            "project_jobs_running_on_instance_runners_count": "+Inf",
        },
        "git_info": {
            "repo_url": format!("https://gitlab-ci-token:{}@pod-{}.example.com/group/simulated.git", job.token, shared.state.pod()),
            "ref": "main",
            "sha": "9f3b1c2a4e5d6f708192a3b4c5d6e7f809a1b2c3",
            "before_sha": "0000000000000000000000000000000000000000",
            "ref_type": "branch",
            "refspecs": ["+refs/heads/main:refs/remotes/origin/main"],
            "depth": 20,
        },
        "runner_info": { "timeout": 3600, "runner_session_url": null },
        "variables": [
            { "key": "CI_JOB_ID", "value": job.id.to_string(), "public": true, "masked": false },
            { "key": "CI_JOB_TOKEN", "value": job.token, "public": false, "masked": true },
            { "key": "CI_POD_ID", "value": shared.state.pod().to_string(), "public": true, "masked": false },
        ],
        "steps": [{
            "name": "script",
            "script": ["echo simulated job", "make test"],
            "timeout": 3600,
            "when": "on_success",
            "allow_failure": false,
        }],
        "image": { "name": "alpine:3.20", "entrypoint": null, "ports": [] },
        "services": [],
        "artifacts": [{
            "name": "artifacts",
            "untracked": false,
            "paths": ["out/"],
            "when": "on_success",
            "artifact_type": "archive",
            "artifact_format": "zip",
            "expire_in": "1 day",
        }],
        "cache": [],
        "credentials": [],
        "dependencies": deps,
        "features": { "trace_sections": true, "failure_reasons": ["script_failure"] },
    })
}

/// The job a job-token request names, checked against the path's job id (`same`
/// false for artifact downloads: dependencies' tokens may fetch other jobs).
fn authenticate_job(
    shared: &Shared,
    token: &str,
    id: u64,
    same: bool,
) -> Result<(), Response<Body>> {
    match shared.state.job_by_token(token) {
        Owner::Ours(job) if !same || job == id => Ok(()),
        Owner::Ours(_) => Err(forbidden()),
        Owner::Misrouted(pod) => Err(misrouted(shared, pod)),
        Owner::Unknown => Err(forbidden()),
    }
}

fn job_status(state: JobState) -> HeaderValue {
    HeaderValue::from_static(state.as_str())
}

async fn update(shared: &Shared, req: Request<Incoming>, id: u64) -> Response<Body> {
    let (headers, body) = match json_body(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let token = header(&headers, "job-token")
        .or_else(|| body.get("token").and_then(Value::as_str))
        .unwrap_or("");
    if shared.state.job(id).is_none() {
        return message(StatusCode::NOT_FOUND, "404 Not Found");
    }
    if let Err(r) = authenticate_job(shared, token, id, true) {
        return r;
    }
    let state = match body.get("state").and_then(Value::as_str) {
        Some("running") | None => JobState::Running,
        Some("success") => JobState::Success,
        Some("failed") => JobState::Failed,
        Some(_) => {
            return message(
                StatusCode::BAD_REQUEST,
                "400 Bad request - state is invalid",
            );
        }
    };
    let size = body.pointer("/output/bytesize").and_then(Value::as_u64);
    match shared.state.update(id, state, size) {
        Update::Ok => {
            let mut r = reply(StatusCode::OK, json!({}));
            r.headers_mut().insert("job-status", job_status(state));
            r
        }
        Update::Accepted => {
            let mut r = reply(StatusCode::ACCEPTED, json!({}));
            r.headers_mut()
                .insert("job-status", job_status(JobState::Running));
            r.headers_mut().insert(
                "x-gitlab-trace-update-interval",
                HeaderValue::from_static("1"),
            );
            r
        }
        Update::Forbidden(s) => {
            let mut r = forbidden();
            r.headers_mut().insert("job-status", job_status(s));
            r
        }
        Update::NotFound => message(StatusCode::NOT_FOUND, "404 Not Found"),
    }
}

/// `Content-Range: <start>-<end>` (inclusive, no unit, as the runner sends it).
fn content_range(headers: &HeaderMap) -> Option<(u64, u64)> {
    let v = header(headers, "content-range")?;
    let v = v.strip_prefix("bytes ").unwrap_or(v);
    let (a, b) = v.split_once('-')?;
    let (a, b) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
    (a <= b).then_some((a, b))
}

async fn trace(shared: &Shared, req: Request<Incoming>, id: u64) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let token = header(&parts.headers, "job-token")
        .or_else(|| query(&parts.uri, "job_token"))
        .or_else(|| query(&parts.uri, "token"))
        .unwrap_or("");
    if shared.state.job(id).is_none() {
        return message(StatusCode::NOT_FOUND, "404 Not Found");
    }
    if let Err(r) = authenticate_job(shared, token, id, true) {
        return r;
    }
    let Some((start, end)) = content_range(&parts.headers) else {
        return message(
            StatusCode::BAD_REQUEST,
            "400 Bad request - Content-Range missing",
        );
    };
    let data = match Limited::new(body, MAX_TRACE).collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => {
            return message(
                StatusCode::PAYLOAD_TOO_LARGE,
                "413 Request Entity Too Large",
            );
        }
    };
    if end - start + 1 != data.len() as u64 {
        return message(
            StatusCode::BAD_REQUEST,
            "400 Bad request - Content-Range does not match the body",
        );
    }
    let range = |len: u64| HeaderValue::from_str(&format!("0-{len}")).expect("ascii");
    match shared.state.append_trace(id, start, &data) {
        Trace::Ok(len) => {
            let mut r = empty(StatusCode::ACCEPTED);
            let h = r.headers_mut();
            h.insert("range", range(len));
            h.insert("job-status", job_status(JobState::Running));
            h.insert(
                "x-gitlab-trace-update-interval",
                HeaderValue::from_static("3"),
            );
            r
        }
        Trace::RangeMismatch(len) => {
            let mut r = empty(StatusCode::RANGE_NOT_SATISFIABLE);
            r.headers_mut().insert("range", range(len));
            r
        }
        Trace::Forbidden(s) => {
            let mut r = forbidden();
            r.headers_mut().insert("job-status", job_status(s));
            r
        }
        Trace::NotFound => message(StatusCode::NOT_FOUND, "404 Not Found"),
    }
}

/// The `token` field of a multipart body, if it is whole in `prefix`.
fn multipart_token(prefix: &[u8], boundary: &str) -> Option<String> {
    let text = String::from_utf8_lossy(prefix);
    let delimiter = format!("--{boundary}");
    text.split(&delimiter).find_map(|part| {
        let (head, value) = part.split_once("\r\n\r\n")?;
        let named = head.lines().any(|l| {
            l.to_ascii_lowercase().starts_with("content-disposition")
                && (l.contains("name=\"token\"") || l.contains("name=token"))
        });
        named.then(|| value.trim_end_matches("\r\n").to_owned())
    })
}

fn boundary(headers: &HeaderMap) -> Option<String> {
    let ct = header(headers, "content-type")?;
    if !ct.to_ascii_lowercase().starts_with("multipart/form-data") {
        return None;
    }
    ct.split(';').find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        k.eq_ignore_ascii_case("boundary")
            .then(|| v.trim_matches('"').to_owned())
    })
}

/// Artifacts upload: streamed to a file and hashed as it arrives. The token is
/// `JOB-TOKEN`, the query, or (older runners) the multipart field before the file.
async fn upload(shared: &Shared, req: Request<Incoming>, id: u64) -> Response<Body> {
    let (parts, mut body) = req.into_parts();
    if shared.state.job(id).is_none() {
        return message(StatusCode::NOT_FOUND, "404 Not Found");
    }
    let Some(boundary) = boundary(&parts.headers) else {
        return message(StatusCode::BAD_REQUEST, "400 Bad request - file is missing");
    };
    let mut token = header(&parts.headers, "job-token")
        .or_else(|| query(&parts.uri, "job_token"))
        .or_else(|| query(&parts.uri, "token"))
        .map(str::to_owned);
    if let Some(t) = &token
        && let Err(r) = authenticate_job(shared, t, id, true)
    {
        return r;
    }
    let path = shared.artifacts.path().join(format!("job-{id}.upload"));
    let mut file = match tokio::fs::File::create(&path).await {
        Ok(f) => f,
        Err(e) => return message(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    let mut hasher = sha2::Sha256::new();
    let mut size = 0u64;
    let mut prefix = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return message(
                StatusCode::BAD_REQUEST,
                "400 Bad request - upload interrupted",
            );
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        size += data.len() as u64;
        if size > shared.config.max_artifact_bytes {
            return message(
                StatusCode::PAYLOAD_TOO_LARGE,
                "413 Request Entity Too Large",
            );
        }
        if token.is_none() && prefix.len() < 64 * 1024 {
            prefix.extend_from_slice(&data[..data.len().min(64 * 1024 - prefix.len())]);
            if let Some(t) = multipart_token(&prefix, &boundary) {
                if let Err(r) = authenticate_job(shared, &t, id, true) {
                    return r;
                }
                token = Some(t);
            }
        }
        hasher.update(&data);
        if file.write_all(&data).await.is_err() {
            return message(
                StatusCode::INTERNAL_SERVER_ERROR,
                "500 storing the artifact",
            );
        }
    }
    if token.is_none() {
        return forbidden();
    }
    let _ = file.flush().await;
    shared.metrics.artifact_bytes.inc_by(size);
    let sha256 = hex(&hasher.finalize());
    shared.state.set_artifact(
        id,
        Artifact {
            path,
            size,
            sha256: sha256.clone(),
        },
    );
    reply(
        StatusCode::CREATED,
        json!({ "size": size, "sha256": sha256 }),
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Artifacts download: streamed from disk. Any job token of this Pod may fetch (a
/// dependency's token fetches the jobs it depends on).
async fn download(shared: &Shared, req: Request<Incoming>, id: u64) -> Response<Body> {
    let (parts, _) = req.into_parts();
    let token = header(&parts.headers, "job-token")
        .or_else(|| query(&parts.uri, "token"))
        .or_else(|| query(&parts.uri, "job_token"))
        .unwrap_or("");
    if let Err(r) = authenticate_job(shared, token, id, false) {
        return r;
    }
    let Some(artifact) = shared.state.job(id).and_then(|j| j.artifact) else {
        return message(StatusCode::NOT_FOUND, "404 Not Found");
    };
    let file = match tokio::fs::File::open(&artifact.path).await {
        Ok(f) => f,
        Err(_) => return message(StatusCode::NOT_FOUND, "404 Not Found"),
    };
    let stream = futures_util::stream::unfold(file, |mut file| async move {
        let mut buf = vec![0u8; 64 * 1024];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Frame::data(Bytes::from(buf))), file))
            }
            Err(e) => Some((Err(e), file)),
        }
    });
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    let h = r.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(
        http::header::CONTENT_LENGTH,
        HeaderValue::from(artifact.size),
    );
    h.insert(
        "x-checksum-sha256",
        HeaderValue::from_str(&artifact.sha256).expect("hex"),
    );
    r
}
