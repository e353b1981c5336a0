//! Git smart HTTP for this Pod's repository, served by Git's own CGI,
//! `git http-backend`, spawned per request; request and response bodies are
//! streamed through it.
//!
//! Authentication as GitLab's `Repositories::GitHttpClientController`: HTTP Basic
//! with the user `gitlab-ci-token` and a running job's token of this Pod
//! (`Gitlab::Auth::CI_JOB_USER`); no or wrong credentials are 401 with
//! `WWW-Authenticate: Basic realm="GitLab"` and "HTTP Basic: Access denied" (real `git`
//! first asks without credentials, then retries with them); a job token of another
//! Pod is a misroute (403). Job tokens may not push (403).

use std::process::Stdio;

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use super::super::Shared;
use super::super::repo;
use super::super::state::{JobState, Owner};
use super::{Body, full, misrouted};

/// Which Git smart HTTP request this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Service {
    /// `GET <repo>.git/info/refs?service=…`.
    InfoRefs,
    /// `POST <repo>.git/git-upload-pack` (fetch, clone).
    UploadPack,
    /// `POST <repo>.git/git-receive-pack` (push).
    ReceivePack,
}

/// A Git request for `project` (its path, without `.git`).
pub(crate) struct GitRequest {
    service: Service,
    project: String,
    /// `PATH_INFO`: `/<project>.git/<rest>`.
    path_info: String,
}

/// Whether `path` is a Git smart HTTP request: its metric label and what to run.
pub(crate) fn route(path: &str, method: &Method) -> Option<(&'static str, GitRequest)> {
    let (repo, rest) = path.split_once(".git/")?;
    let (label, service) = match (method, rest) {
        (&Method::GET, "info/refs") => ("git_info_refs", Service::InfoRefs),
        (&Method::POST, "git-upload-pack") => ("git_upload_pack", Service::UploadPack),
        (&Method::POST, "git-receive-pack") => ("git_receive_pack", Service::ReceivePack),
        _ => return None,
    };
    Some((
        label,
        GitRequest {
            service,
            project: repo.trim_start_matches('/').to_owned(),
            path_info: path.to_owned(),
        },
    ))
}

fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// "HTTP Basic: Access denied" with GitLab's challenge.
fn challenge() -> Response<Body> {
    let mut r = text(StatusCode::UNAUTHORIZED, "HTTP Basic: Access denied\n");
    r.headers_mut().insert(
        http::header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"GitLab\""),
    );
    r
}

/// `Authorization: Basic <user:password>`, decoded.
fn basic(headers: &HeaderMap) -> Option<(String, String)> {
    let v = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, b64) = v.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .ok()?;
    let raw = String::from_utf8(raw).ok()?;
    let (user, pass) = raw.split_once(':')?;
    Some((user.to_owned(), pass.to_owned()))
}

impl GitRequest {
    pub(crate) async fn run(self, shared: &Shared, req: Request<Incoming>) -> Response<Body> {
        let Some((user, password)) = basic(req.headers()) else {
            return challenge();
        };
        if user != "gitlab-ci-token" {
            return challenge();
        }
        match shared.state.job_by_token(&password) {
            Owner::Misrouted(pod) => return misrouted(shared, pod),
            Owner::Unknown => return challenge(),
            Owner::Ours(job) => {
                if shared
                    .state
                    .job(job)
                    .is_none_or(|j| j.state != JobState::Running)
                {
                    return challenge();
                }
            }
        }
        if self.project != repo::project_path(shared.state.pod()) {
            return text(
                StatusCode::NOT_FOUND,
                "The project you were looking for could not be found.\n",
            );
        }
        let service_param = req
            .uri()
            .query()
            .unwrap_or("")
            .split('&')
            .find_map(|kv| kv.strip_prefix("service="))
            .unwrap_or("");
        if self.service == Service::ReceivePack
            || (self.service == Service::InfoRefs && service_param == "git-receive-pack")
        {
            return text(
                StatusCode::FORBIDDEN,
                "You are not allowed to push code to this project.\n",
            );
        }
        let Some(repo) = &shared.repo else {
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                "The repository could not be created (is git installed?).\n",
            );
        };
        match cgi(&repo.root, &self.path_info, req, &user).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "pod-sim: git http-backend failed");
                text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "git http-backend failed\n",
                )
            }
        }
    }
}

/// Run `git http-backend` for one request: the CGI environment from the request,
/// its body piped to the CGI's standard input, the CGI's headers (`Status:` among
/// them) turned into the response head and the rest streamed as its body.
async fn cgi(
    root: &std::path::Path,
    path_info: &str,
    req: Request<Incoming>,
    user: &str,
) -> std::io::Result<Response<Body>> {
    let (parts, mut body) = req.into_parts();
    let h = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let mut cmd = Command::new("git");
    cmd.arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("HOME", root)
        .env("GIT_PROJECT_ROOT", root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("GATEWAY_INTERFACE", "CGI/1.1")
        .env("SERVER_PROTOCOL", "HTTP/1.1")
        .env("REQUEST_METHOD", parts.method.as_str())
        .env("PATH_INFO", path_info)
        .env("QUERY_STRING", parts.uri.query().unwrap_or(""))
        .env("CONTENT_TYPE", h("content-type"))
        .env("REMOTE_USER", user)
        .env("REMOTE_ADDR", "127.0.0.1")
        .env("HTTP_GIT_PROTOCOL", h("git-protocol"))
        .env("HTTP_CONTENT_ENCODING", h("content-encoding"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let length = h("content-length");
    if !length.is_empty() {
        cmd.env("CONTENT_LENGTH", length);
    }
    let mut child = cmd.spawn()?;
    let mut stdin = child.stdin.take().expect("piped");
    let stdout = child.stdout.take().expect("piped");
    // Feed the request body while the response is read, so neither side blocks.
    tokio::spawn(async move {
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { break };
            if let Ok(data) = frame.into_data()
                && stdin.write_all(&data).await.is_err()
            {
                break;
            }
        }
        let _ = stdin.shutdown().await;
    });
    let mut out = BufReader::new(stdout);
    let mut status = StatusCode::OK;
    let mut headers = HeaderMap::new();
    loop {
        let mut line = String::new();
        if out.read_line(&mut line).await? == 0 {
            return Err(std::io::Error::other("CGI output ended inside its headers"));
        }
        let line = line.trim_end_matches(['\r', '\n']);
        if line.is_empty() {
            break;
        }
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            status = value
                .split_whitespace()
                .next()
                .and_then(|c| c.parse::<u16>().ok())
                .and_then(|c| StatusCode::from_u16(c).ok())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        } else if let (Ok(n), Ok(v)) = (
            http::HeaderName::from_bytes(name.trim().as_bytes()),
            HeaderValue::from_str(value),
        ) {
            headers.append(n, v);
        }
    }
    // Reap the CGI once its output is consumed.
    let stream = futures_util::stream::unfold(Some((out, child)), |state| async move {
        let (mut out, mut child) = state?;
        let mut buf = vec![0u8; 64 * 1024];
        match out.read(&mut buf).await {
            Ok(0) => {
                let _ = child.wait().await;
                None
            }
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Frame::data(Bytes::from(buf))), Some((out, child))))
            }
            Err(e) => Some((Err(e), None)),
        }
    });
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    *r.status_mut() = status;
    *r.headers_mut() = headers;
    Ok(r)
}
