//! The runner's REST side that the Job Router client leans on, written from
//! `network/gitlab.go` (gitlabhq/gitlab-runner, commit d79f3e7b): `GetRouterDiscovery`,
//! `PrepareJobRequest`, `RequestJob` and `SetLastUpdate`, with `X-GitLab-Last-Update`
//! kept as `network/client.go`'s `setLastUpdate` keeps it. Plain HTTP/1.1 over hyper's
//! client connection, one connection per request; no TLS, no proxy from the
//! environment (the tests talk to `http://127.0.0.1`).

use std::sync::Mutex;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;

/// An HTTP exchange that got no answer. Retrying may help for `Connect` and
/// `Exchange`, never for `Url`.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The URL is not `http://host:port/…`.
    #[error("not an http:// URL: {0:?}")]
    Url(String),
    /// No TCP connection.
    #[error("connecting to {addr}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// The connection broke before a whole answer came.
    #[error("{method} {url}")]
    Exchange {
        method: Method,
        url: String,
        #[source]
        source: hyper::Error,
    },
}

/// One HTTP answer, body read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    /// The body as JSON; panics naming the body when it is not (for tests' fixtures).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "{}: not JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// `isResponseApplicationJSON` (`network/client.go`): Go's `doJSON` decodes a
    /// body only under this media type, and fails the call otherwise.
    fn is_json(&self) -> bool {
        self.header("content-type")
            .and_then(|ct| ct.split(';').next())
            .is_some_and(|mt| mt.trim().eq_ignore_ascii_case("application/json"))
    }
}

/// `method url` with `headers` and an optional JSON body, over a connection of its own.
pub async fn exchange(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    json: Option<&Value>,
) -> Result<Reply, HttpError> {
    let uri: Uri = url.parse().map_err(|_| HttpError::Url(url.to_owned()))?;
    let (Some("http"), Some(authority)) = (uri.scheme_str(), uri.authority().cloned()) else {
        return Err(HttpError::Url(url.to_owned()));
    };
    let addr = format!(
        "{}:{}",
        authority.host(),
        authority.port_u16().unwrap_or(80)
    );
    let tcp = TcpStream::connect(&addr)
        .await
        .map_err(|source| HttpError::Connect { addr, source })?;
    let failed = |source| HttpError::Exchange {
        method: method.clone(),
        url: url.to_owned(),
        source,
    };
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(failed)?;
    tokio::spawn(conn);
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut req = Request::builder()
        .method(method.clone())
        .uri(path)
        .header(http::header::HOST, authority.as_str());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let body = match json {
        Some(j) => {
            req = req.header(http::header::CONTENT_TYPE, "application/json");
            Bytes::from(j.to_string())
        }
        None => Bytes::new(),
    };
    let req = req
        .body(Full::new(body))
        .map_err(|_| HttpError::Url(url.to_owned()))?;
    let resp = send.send_request(req).await.map_err(failed)?;
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.map_err(failed)?.to_bytes();
    Ok(Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

/// What gitlab-runner's `common.RunnerConfig` holds that these calls need: one runner.
#[derive(Clone, Debug)]
pub struct RunnerConfig {
    /// GitLab's URL (here the podgate proxy), `http://host:port`.
    pub url: String,
    /// The runner authentication token (`glrt-…`).
    pub token: String,
    /// The runner manager's id (`s_` and 12 hex digits, as gitlab-runner makes one
    /// from the machine id).
    pub system_id: String,
}

impl RunnerConfig {
    /// A runner of `url` with `token` and a random system id.
    pub fn new(url: &str, token: &str) -> RunnerConfig {
        RunnerConfig {
            url: url.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
            system_id: format!("s_{:012x}", rand::random::<u64>() >> 16),
        }
    }

    fn api(&self, path: &str) -> String {
        format!("{}/api/v4/{path}", self.url)
    }
}

/// gitlab-runner's `NewCorrelationID`: a UUID without its dashes (32 hex digits).
pub fn new_correlation_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// What `POST /api/v4/jobs/request` answered.
#[derive(Debug)]
pub enum JobAnswer {
    /// 201: the job payload.
    Job(Value),
    /// No job; `healthy` as `RequestJob`'s second result (false only for 403).
    /// `status` is None when no answer came.
    None {
        healthy: bool,
        status: Option<StatusCode>,
    },
}

/// The runner's GitLab client (`network.GitLabClient`) for one runner: it remembers
/// the last `X-GitLab-Last-Update` it saw, as Go's per-credentials `client` does.
#[derive(Debug)]
pub struct GitLab {
    pub config: RunnerConfig,
    last_update: Mutex<Option<String>>,
}

impl GitLab {
    pub fn new(config: RunnerConfig) -> GitLab {
        GitLab {
            config,
            last_update: Mutex::new(None),
        }
    }

    /// The queue version to echo as `last_update`, if any was seen.
    pub fn last_update(&self) -> Option<String> {
        self.last_update.lock().unwrap().clone()
    }

    /// `SetLastUpdate` / `setLastUpdateValue`: an empty value is ignored.
    pub fn set_last_update(&self, value: &str) {
        if !value.is_empty() {
            *self.last_update.lock().unwrap() = Some(value.to_owned());
        }
    }

    /// `GetRouterDiscovery`: `GET runners/router/discovery` with `Runner-Token`; the
    /// router's `server_url` on 200, None on anything else (403: bad token, 501: no
    /// router configured or enabled).
    pub async fn router_discovery(&self) -> Option<String> {
        let correlation_id = new_correlation_id();
        let reply = exchange(
            Method::GET,
            &self.config.api("runners/router/discovery"),
            &[
                ("runner-token", &self.config.token),
                ("x-request-id", &correlation_id),
            ],
            None,
        )
        .await
        .ok()?;
        self.remember_last_update(&reply);
        if reply.status != StatusCode::OK || !reply.is_json() {
            return None;
        }
        let body: Value = serde_json::from_slice(&reply.body).ok()?;
        body["server_url"].as_str().map(str::to_owned)
    }

    /// `PrepareJobRequest`: the body of `jobs/request`, and of GetJob's `job_request`.
    /// `info` is what `getRunnerInfo` sends for the shell executor on Linux: the
    /// features `getFeatures` and the shell executor turn on (the bash shell's own are
    /// left out); no `session` (no session server).
    pub fn prepare_job_request(&self) -> Value {
        let mut features = serde_json::Map::new();
        for f in FEATURES {
            features.insert((*f).to_owned(), json!(ON.contains(f)));
        }
        let mut req = json!({
            "info": {
                "name": "gitlab-runner",
                "version": "19.4.0",
                "revision": "d79f3e7b",
                "platform": "linux",
                "architecture": "amd64",
                "executor": "shell",
                "shell": "bash",
                "features": features,
                "config": {},
            },
            "token": self.config.token,
            "system_id": self.config.system_id,
        });
        // `last_update,omitempty`.
        if let Some(lu) = self.last_update() {
            req["last_update"] = json!(lu);
        }
        req
    }

    /// `RequestJob`: `POST jobs/request` with the prepared body (and `Runner-Token`).
    pub async fn request_job(&self) -> JobAnswer {
        let body = self.prepare_job_request();
        let correlation_id = new_correlation_id();
        let reply = match exchange(
            Method::POST,
            &self.config.api("jobs/request"),
            &[
                ("runner-token", &self.config.token),
                ("x-request-id", &correlation_id),
            ],
            Some(&body),
        )
        .await
        {
            Ok(r) => r,
            // Go: `doJSON` fails with -1, which `RequestJob`'s default case answers
            // "failed", healthy.
            Err(_) => {
                return JobAnswer::None {
                    healthy: true,
                    status: None,
                };
            }
        };
        self.remember_last_update(&reply);
        // Go's `RequestJob`: 201 a job (a body that does not decode is `doJSON`'s -1,
        // "failed", healthy), 403 "forbidden" marks the runner unhealthy; 204, 503 and
        // every other status leave it healthy.
        let status = Some(reply.status);
        match reply.status {
            StatusCode::CREATED => match serde_json::from_slice(&reply.body) {
                Ok(job) if reply.is_json() => JobAnswer::Job(job),
                _ => JobAnswer::None {
                    healthy: true,
                    status,
                },
            },
            StatusCode::FORBIDDEN => JobAnswer::None {
                healthy: false,
                status,
            },
            _ => JobAnswer::None {
                healthy: true,
                status,
            },
        }
    }

    /// `client.setLastUpdate`, on every answer.
    fn remember_last_update(&self, reply: &Reply) {
        if let Some(lu) = reply.header("x-gitlab-last-update") {
            self.set_last_update(lu);
        }
    }
}

/// `common.FeaturesInfo`'s JSON names, all sent (no `omitempty`).
const FEATURES: &[&str] = &[
    "variables",
    "image",
    "services",
    "artifacts",
    "cache",
    "fallback_cache_keys",
    "shared",
    "upload_multiple_artifacts",
    "upload_raw_artifacts",
    "session",
    "terminal",
    "refspecs",
    "masking",
    "proxy",
    "raw_variables",
    "artifacts_exclude",
    "multi_build_steps",
    "trace_reset",
    "trace_checksum",
    "trace_size",
    "vault_secrets",
    "cancelable",
    "return_exit_code",
    "service_variables",
    "service_multiple_aliases",
    "image_executor_opts",
    "service_executor_opts",
    "cancel_gracefully",
    "native_steps_integration",
    "two_phase_job_commit",
    "job_inputs",
];

/// Those `network.getFeatures` and the shell executor (`executors/shell/shell.go`)
/// turn on.
const ON: &[&str] = &[
    "trace_reset",
    "trace_checksum",
    "trace_size",
    "cancelable",
    "cancel_gracefully",
    "two_phase_job_commit",
    "job_inputs",
    "variables",
    "shared",
    "session",
    "terminal",
    "native_steps_integration",
];
