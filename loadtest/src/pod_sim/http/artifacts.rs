//! Artifacts: `POST /jobs/:id/artifacts` and `GET /jobs/:id/artifacts`
//! (`lib/api/ci/runner.rb`).
//!
//! Upload: the multipart body is parsed as Rack parses it (files streamed to disk and
//! hashed, never held in memory), so the token may be a `token` field anywhere in the
//! form, before or after the file part; it beats the query's `token`, and the
//! `JOB-TOKEN` header counts only without either. What is stored is the `file` part's
//! bytes, as Workhorse stores them; `requires :file` is 400 when there is none.
//!
//! Download (`authenticate_job_via_dependent_job!`, `Gitlab::Auth::AuthFinders
//! #find_user_from_job_token`): the token is `job_token`, else `token` (parameters),
//! else `JOB-TOKEN`, each only when not blank; it must be a running job's token of
//! this Pod (401 otherwise), and may belong to another job than the one downloaded.

use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::json;
use tokio::io::AsyncReadExt;

use super::super::Shared;
use super::super::params::{self, Params};
use super::super::state::{Artifact, JobState, Owner};
use super::{
    Body, Declare, authenticated_job, grape_error, header, job_id, message, misrouted, read, reply,
};

/// `Ci::JobArtifact.file_formats`.
const FORMATS: &[&str] = &["raw", "zip", "gzip"];

pub(crate) async fn upload(shared: &Shared, req: Request<Incoming>, id: &str) -> Response<Body> {
    let mut parsed = match read(shared, req).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    let declared = Declare {
        required: &["file"],
        strings: &["token", "expire_in", "artifact_type", "artifact_format"],
        hashes: &[],
    };
    if let Err(r) = declared.check_files(&parsed.params) {
        return r;
    }
    let file = parsed.uploads.take(parsed.params.get("file"));
    let Some(file) = file else {
        return grape_error(StatusCode::BAD_REQUEST, "file is invalid");
    };
    if let Some(f) = parsed
        .params
        .get("artifact_format")
        .and_then(|v| v.as_str())
        && !FORMATS.contains(&f)
    {
        return grape_error(
            StatusCode::BAD_REQUEST,
            "artifact_format does not have a valid value",
        );
    }
    let id = match authenticated_job(shared, &parsed, id) {
        Ok(id) => id,
        Err(r) => return r,
    };
    let path = params::multipart::artifact_path(shared.artifacts.path(), id);
    if let Err(e) = file.path.persist(&path) {
        return message(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string());
    }
    shared.metrics.artifact_bytes.inc_by(file.size);
    shared.state.set_artifact(
        id,
        Artifact {
            path,
            size: file.size,
            sha256: file.sha256,
            filename: if file.filename.is_empty() {
                "artifacts.zip".into()
            } else {
                file.filename
            },
        },
    );
    reply(StatusCode::CREATED, json!("201"))
}

impl Declare<'_> {
    /// [`Declare::check`] where `required` names file parameters (Grape's
    /// `WorkhorseFile` type: a hash, checked against the uploads afterwards).
    fn check_files(&self, params: &Params) -> Result<(), Response<Body>> {
        let mut errors = Vec::new();
        for key in self.required {
            match params.get(*key) {
                None => errors.push(format!("{key} is missing")),
                Some(v) if !v.is_object() => errors.push(format!("{key} is invalid")),
                Some(_) => {}
            }
        }
        for key in self.strings {
            if let Err(e) = params::string(params, key) {
                errors.push(e);
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(grape_error(StatusCode::BAD_REQUEST, &errors.join(", ")))
        }
    }
}

/// `find_user_from_job_token`: `params[:job_token].presence || params[:token].presence
/// || env['HTTP_JOB_TOKEN'].presence`.
fn download_token(params: &Params, headers: &http::HeaderMap) -> Option<String> {
    let present = |key: &str| {
        params::string(params, key)
            .ok()
            .and_then(|d| d.value().map(str::to_owned))
            .filter(|s| !s.trim().is_empty())
    };
    present("job_token")
        .or_else(|| present("token"))
        .or_else(|| header(headers, "job-token").filter(|s| !s.trim().is_empty()))
}

fn unauthorized() -> Response<Body> {
    message(StatusCode::UNAUTHORIZED, "401 Unauthorized")
}

/// Artifacts download: streamed from disk.
pub(crate) async fn download(shared: &Shared, req: Request<Incoming>, id: &str) -> Response<Body> {
    let parsed = match read(shared, req).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    let id = match job_id(id) {
        Ok(id) => id,
        Err(r) => return r,
    };
    let Some(token) = download_token(&parsed.params, &parsed.headers) else {
        return unauthorized();
    };
    match shared.state.job_by_token(&token) {
        Owner::Misrouted(pod) => return misrouted(shared, pod),
        Owner::Unknown => return unauthorized(),
        Owner::Ours(by) => {
            // `Ci::AuthJobFinder`: only a running job's token authenticates.
            if shared
                .state
                .job(by)
                .is_none_or(|j| j.state != JobState::Running)
            {
                return unauthorized();
            }
        }
    }
    let Some(job) = shared.state.job(id) else {
        return message(StatusCode::FORBIDDEN, "403 Forbidden");
    };
    let Some(artifact) = job.artifact else {
        return message(StatusCode::NOT_FOUND, "404 Not Found");
    };
    stream_file(&artifact).await
}

/// A stored artifact as a response: streamed, with its length, name and checksum.
pub(crate) async fn stream_file(artifact: &Artifact) -> Response<Body> {
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
                Some((Ok(Frame::data(bytes::Bytes::from(buf))), file))
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
    let quoted = artifact.filename.replace(['"', '\\', '\r', '\n'], "_");
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{quoted}\"")) {
        h.insert(http::header::CONTENT_DISPOSITION, v);
    }
    h.insert(
        "x-checksum-sha256",
        HeaderValue::from_str(&artifact.sha256).expect("hex"),
    );
    r
}
