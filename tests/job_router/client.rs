//! The Job Router client: gitlab-runner's `router.Client` with `FF_USE_JOB_ROUTER` on,
//! written from `router/client.go`, `router/client_conn_factory.go` and
//! `router/token_creds.go` (gitlabhq/gitlab-runner, commit d79f3e7b).
//!
//! [`Client::request_job`] is `Client.RequestJob`: discovery (cached an hour, a "no
//! router" answer too), the breaker's gate, one `GetJob` on the one connection the
//! factory keeps, and every way back to REST `jobs/request` counted by reason
//! ([`Fallback`]). Answers:
//!
//! - OK: the job, or none when `job_response` is empty (healthy either way); the
//!   answer's `x-gitlab-last-update` becomes the next request's `last_update`;
//! - `UNIMPLEMENTED`: the router is off: drop the discovery, breaker success, REST;
//! - `UNAVAILABLE`, `DEADLINE_EXCEEDED`, `CANCELLED`: a breaker failure; REST if it
//!   tripped, else no job, healthy;
//! - any other code: breaker success, no job, unhealthy, no REST.
//!
//! Like grpc-go's `grpc.NewClient`, dialling is lazy: an unreachable router is an
//! `UNAVAILABLE` call, a breaker failure; only a URL the factory cannot dial (a bad
//! URL, an unknown scheme) is `dial_failed`.
//!
//! Differences from gitlab-runner's: one runner per client (Go passes the runner's
//! config to each call and shares the discovery between runners); no `grpcs`/`wss`
//! (no TLS); `grpc://` dials the one address, no DNS round robin; the outcome is a
//! value ([`Polled`]) rather than log lines and Prometheus counters; for `ws://` the
//! HTTP/2 `:authority` is the URL's `host:port`, where grpc-go (target
//! `passthrough:<url>`) sends the whole URL.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use http::Uri;
use serde_json::Value;
use tokio::time::{Duration, Instant};
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use super::breaker::Breaker;
use super::gitlab::{GitLab, JobAnswer, RunnerConfig, new_correlation_id};
use super::rpc::{self, GetJobRequest};
use super::wstunnel;

/// How long a discovery answer is used (`discoveryTTL`).
pub const DISCOVERY_TTL: Duration = Duration::from_secs(3600);
/// HTTP/2 pings, also without calls: "kas allows min 20 seconds, trying to stay below
/// 60 seconds (typical load-balancer timeout)".
pub const KEEPALIVE: Duration = Duration::from_secs(55);

/// Why a request went to REST `jobs/request` (`fallbackReason`; the label values of
/// `gitlab_runner_job_router_fallbacks_total` in comments).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fallback {
    /// `no_discovery`: discovery named no router.
    NoDiscovery,
    /// `breaker_open`: the breaker was open; the router was not asked.
    BreakerOpen,
    /// `dial_failed`: the router's URL could not be dialled.
    DialFailed,
    /// `breaker_tripped`: this call's failure tripped the breaker.
    BreakerTripped,
    /// `router_disabled`: the router answered `UNIMPLEMENTED`.
    RouterDisabled,
}

/// Which path answered a [`Client::request_job`].
#[derive(Debug)]
pub enum Via {
    /// `GetJob`, with its status (`Ok` or a code that does not fall back) and the
    /// correlation id (the answer's `x-request-id`, else the one sent).
    Router {
        code: Code,
        message: String,
        correlation_id: String,
    },
    /// REST `jobs/request`, for `reason`; its HTTP status (None: no answer).
    Rest {
        reason: Fallback,
        status: Option<u16>,
    },
}

/// What one `RequestJob` gave: gitlab-runner's `(*spec.Job, bool)` and how.
#[derive(Debug)]
pub struct Polled {
    /// The job payload (Rails' `201` body).
    pub job: Option<Value>,
    /// False marks the runner unhealthy.
    pub healthy: bool,
    pub via: Via,
}

/// What the client knows of the router (`disco` and `discoExpiresAt`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Discovery {
    /// Nothing cached: the next request asks GitLab.
    Unknown,
    /// GitLab named no router (cached like a router).
    NoRouter,
    /// The router's URL.
    Router(String),
}

#[derive(Debug)]
struct Cached {
    server_url: Option<String>,
    expires_at: Instant,
}

/// Options of the factory's connections (`NewClientConnFactory`'s user agent, and
/// the keepalive it always sets).
#[derive(Clone, Debug)]
pub struct Options {
    /// `User-Agent` of the WebSocket upgrade and of the gRPC calls.
    pub user_agent: String,
    /// HTTP/2 keepalive pings (gitlab-runner: [`KEEPALIVE`], also while idle). None
    /// in paused-time tests, where a pending ping timer would let tokio's clock jump.
    pub keepalive: Option<Duration>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            user_agent: "gitlab-runner 19.4.0 (main; go1.25; linux/amd64)".to_owned(),
            keepalive: Some(KEEPALIVE),
        }
    }
}

/// The URL a connection was made for, and the token its calls carry (`DialTarget`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct DialTarget {
    url: String,
    token: String,
}

/// A URL the factory cannot dial. Not retried: the same URL fails the same way.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// `url.Parse` failed.
    #[error("invalid kas address {url:?}")]
    Url {
        url: String,
        #[source]
        source: http::uri::InvalidUri,
    },
    /// Neither `grpc` nor `ws` (nor, in gitlab-runner, `grpcs` or `wss`).
    #[error("unsupported scheme in kas address: {0:?}")]
    Scheme(String),
    /// tonic refused the endpoint (a user agent it cannot send).
    #[error("gRPC endpoint for {url:?}")]
    Endpoint {
        url: String,
        #[source]
        source: tonic::transport::Error,
    },
}

/// `ClientConnFactory`: at most one connection, replaced when the URL or token
/// changes. Calls in flight keep their own clone of the old channel, which closes
/// with its last clone (Go's `connHolder` counts users to the same end).
#[derive(Debug, Default)]
struct Factory {
    current: Mutex<Option<(DialTarget, Channel)>>,
}

impl Factory {
    fn dial(&self, target: DialTarget, options: &Options) -> Result<Channel, DialError> {
        let mut current = self.current.lock().unwrap();
        if let Some((t, channel)) = current.as_ref()
            && *t == target
        {
            return Ok(channel.clone());
        }
        let channel = new_conn(&target, options)?;
        *current = Some((target, channel.clone()));
        Ok(channel)
    }
}

/// `newConn`: a lazy channel per scheme. `grpc://host[:80]` is h2c to `host:port`;
/// `ws://host[:80]/path` is HTTP/2 inside a WebSocket to the URL ([`wstunnel`]).
fn new_conn(target: &DialTarget, options: &Options) -> Result<Channel, DialError> {
    let uri: Uri = target.url.parse().map_err(|source| DialError::Url {
        url: target.url.clone(),
        source,
    })?;
    let scheme = uri.scheme_str().unwrap_or_default().to_owned();
    let Some(authority) = uri
        .authority()
        .filter(|_| matches!(&*scheme, "grpc" | "ws"))
    else {
        return Err(DialError::Scheme(scheme));
    };
    // `hostWithPort`: port 80 when the URL names none.
    let host_port = format!(
        "{}:{}",
        authority.host(),
        authority.port_u16().unwrap_or(80)
    );
    let endpoint_error = |source| DialError::Endpoint {
        url: target.url.clone(),
        source,
    };
    let mut endpoint = Endpoint::from_shared(format!("http://{host_port}"))
        .map_err(endpoint_error)?
        .user_agent(options.user_agent.clone())
        .map_err(endpoint_error)?;
    if let Some(interval) = options.keepalive {
        endpoint = endpoint
            .http2_keep_alive_interval(interval)
            .keep_alive_while_idle(true);
    }
    Ok(match &*scheme {
        "ws" => endpoint.connect_with_connector_lazy(wstunnel::Connector {
            url: target.url.clone(),
            token: target.token.clone(),
            user_agent: options.user_agent.clone(),
        }),
        _ => endpoint.connect_lazy(),
    })
}

/// `isRouterFailure`: the router is unreachable, which counts toward the breaker.
fn is_router_failure(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled
    )
}

/// `router.Client` for one runner.
#[derive(Debug)]
pub struct Client {
    gitlab: GitLab,
    options: Options,
    factory: Factory,
    breaker: Breaker,
    discovery: Mutex<Option<Cached>>,
    fallbacks: Mutex<BTreeMap<Fallback, u64>>,
    get_job_calls: AtomicU64,
}

impl Client {
    /// A client for the runner `config` describes, with gitlab-runner's options.
    pub fn new(config: RunnerConfig) -> Client {
        Client::with_options(config, Options::default())
    }

    pub fn with_options(config: RunnerConfig, options: Options) -> Client {
        Client {
            gitlab: GitLab::new(config),
            options,
            factory: Factory::default(),
            breaker: Breaker::default(),
            discovery: Mutex::new(None),
            fallbacks: Mutex::new(BTreeMap::new()),
            get_job_calls: AtomicU64::new(0),
        }
    }

    /// Caches `server_url` as if discovery had just answered it (for the next hour).
    pub fn set_discovery(&self, server_url: &str) {
        *self.discovery.lock().unwrap() = Some(Cached {
            server_url: Some(server_url.to_owned()),
            expires_at: Instant::now() + DISCOVERY_TTL,
        });
    }

    /// What is cached of discovery now.
    pub fn discovery(&self) -> Discovery {
        match &*self.discovery.lock().unwrap() {
            Some(c) if c.expires_at > Instant::now() => match &c.server_url {
                Some(url) => Discovery::Router(url.clone()),
                None => Discovery::NoRouter,
            },
            _ => Discovery::Unknown,
        }
    }

    /// REST fallbacks so far, by reason.
    pub fn fallbacks(&self) -> BTreeMap<Fallback, u64> {
        self.fallbacks.lock().unwrap().clone()
    }

    /// `GetJob` calls made so far (answered or not).
    pub fn get_job_calls(&self) -> u64 {
        self.get_job_calls.load(Ordering::SeqCst)
    }

    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    /// The runner's REST client (its config and last update).
    pub fn gitlab(&self) -> &GitLab {
        &self.gitlab
    }

    /// `RequestJob`: one poll for a job, through the router when there is one.
    pub async fn request_job(&self) -> Polled {
        // Discovery before the breaker's gate, so that "no router" cannot strand a
        // half-open trial; every path past `allow` records an outcome or aborts.
        let Some(server_url) = self.router_discovery().await else {
            return self.fallback(Fallback::NoDiscovery).await;
        };
        if !self.breaker.allow() {
            return self.fallback(Fallback::BreakerOpen).await;
        }
        let job_request = self.gitlab.prepare_job_request().to_string().into_bytes();
        let target = DialTarget {
            url: server_url,
            token: self.gitlab.config.token.clone(),
        };
        let channel = match self.factory.dial(target, &self.options) {
            Ok(c) => c,
            Err(_) => {
                self.breaker.record_failure();
                return self.fallback(Fallback::DialFailed).await;
            }
        };
        let correlation_id = new_correlation_id();
        let request = match self.request(job_request, &correlation_id) {
            Ok(r) => r,
            // A token that cannot be a header value never reaches the router (Go's
            // `json.Marshal` failure): Abort, no job, unhealthy.
            Err(status) => {
                self.breaker.abort();
                return Polled {
                    job: None,
                    healthy: false,
                    via: Via::Router {
                        code: status.code(),
                        message: status.message().to_owned(),
                        correlation_id,
                    },
                };
            }
        };
        self.get_job_calls.fetch_add(1, Ordering::SeqCst);
        match rpc::get_job(channel, request).await {
            Ok(answer) => {
                self.breaker.record_success();
                let md = answer.metadata();
                if let Some(lu) = md.get("x-gitlab-last-update").and_then(|v| v.to_str().ok()) {
                    self.gitlab.set_last_update(lu);
                }
                let correlation_id = md
                    .get("x-request-id")
                    .and_then(|v| v.to_str().ok())
                    .map_or(correlation_id, str::to_owned);
                let job = answer.into_inner().job_response;
                // `parseJobResponse`: empty is no job; bad JSON is no job, unhealthy.
                let (job, healthy) = if job.is_empty() {
                    (None, true)
                } else {
                    match serde_json::from_slice(&job) {
                        Ok(j) => (Some(j), true),
                        Err(_) => (None, false),
                    }
                };
                Polled {
                    job,
                    healthy,
                    via: Via::Router {
                        code: Code::Ok,
                        message: String::new(),
                        correlation_id,
                    },
                }
            }
            Err(status) => self.router_error(status, correlation_id).await,
        }
    }

    /// The call with the runner's metadata (`tokenCredentials`: `authorization`,
    /// `gitlab-agent-type`) and the correlation id.
    fn request(
        &self,
        job_request: Vec<u8>,
        correlation_id: &str,
    ) -> Result<tonic::Request<GetJobRequest>, Status> {
        let mut request = tonic::Request::new(GetJobRequest { job_request });
        let bearer = MetadataValue::try_from(format!("Bearer {}", self.gitlab.config.token))
            .map_err(|_| Status::invalid_argument("the runner token is not a header value"))?;
        let md = request.metadata_mut();
        md.insert("authorization", bearer);
        md.insert("gitlab-agent-type", MetadataValue::from_static("runner"));
        md.insert(
            "x-request-id",
            MetadataValue::try_from(correlation_id).expect("hex digits"),
        );
        Ok(request)
    }

    /// `handleRouterError`: the breaker's outcome, then REST or no job.
    async fn router_error(&self, status: Status, correlation_id: String) -> Polled {
        let code = status.code();
        let no_job = |healthy| Polled {
            job: None,
            healthy,
            via: Via::Router {
                code,
                message: status.message().to_owned(),
                correlation_id,
            },
        };
        if code == Code::Unimplemented {
            self.breaker.record_success();
            *self.discovery.lock().unwrap() = None;
            return self.fallback(Fallback::RouterDisabled).await;
        }
        if is_router_failure(code) {
            if self.breaker.record_failure() {
                return self.fallback(Fallback::BreakerTripped).await;
            }
            return no_job(true);
        }
        // The router answered: it is reachable, whatever the call's fate.
        self.breaker.record_success();
        no_job(false)
    }

    /// `getRouterDiscovery`: the cached answer, or GitLab's, cached an hour.
    async fn router_discovery(&self) -> Option<String> {
        if let Some(c) = &*self.discovery.lock().unwrap()
            && c.expires_at > Instant::now()
        {
            return c.server_url.clone();
        }
        // Go holds its mutex across the request; one runner per client here, so
        // two discoveries at once cost only a second request.
        let server_url = self.gitlab.router_discovery().await;
        *self.discovery.lock().unwrap() = Some(Cached {
            server_url: server_url.clone(),
            expires_at: Instant::now() + DISCOVERY_TTL,
        });
        server_url
    }

    /// `fallback`: counted, then REST `jobs/request`.
    async fn fallback(&self, reason: Fallback) -> Polled {
        *self.fallbacks.lock().unwrap().entry(reason).or_default() += 1;
        let (job, healthy, status) = match self.gitlab.request_job().await {
            JobAnswer::Job(job) => (Some(job), true, Some(201)),
            JobAnswer::None { healthy, status } => (None, healthy, status.map(|s| s.as_u16())),
        };
        Polled {
            job,
            healthy,
            via: Via::Rest { reason, status },
        }
    }
}
