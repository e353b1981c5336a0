//! kas's Kubernetes API proxy: the `[k8s_proxy]` listener (HTTP/1.1, upgrades on,
//! so `/graph` WebSockets work) through which `kubectl` and the Graph API reach an
//! agent's cluster, as GitLab's kas serves it
//! (`internal/module/kubernetes_api/server/proxy.go` in pluralsh/kubernetes-agent at
//! `1fc64e68^`, the 2023 GitLab kas; docs/graph-api.md §2):
//!
//! 1. `Origin`, when present, must be one of `allowed_origins`, else 403 with an
//!    empty body; an allowed one is echoed with `Access-Control-Allow-Credentials:
//!    true` and `Vary: Origin`. `OPTIONS` is a CORS preflight: 200, the methods,
//!    the requested headers, `Access-Control-Max-Age: 86400`.
//! 2. The path must start with `url_prefix`, else 400 "Bad request: URL does not
//!    start with expected prefix".
//! 3. Credentials (`creds`) and GitLab's verdict on them (`auth`, cached): an
//!    agent id and, when GitLab says access is as a user (or the CI job's
//!    `ci_access` says so), an impersonation.
//! 4. The path after the prefix (the prefix's last `/` kept) is `/graph`: the Graph
//!    API (`graph_ws`). Anything else is a `MakeRequest` to the agent through
//!    [`AgentRouter`] in GitLab's HTTP-over-gRPC framing (`make_request`):
//!    credentials stripped (`Authorization`, `Cookie`, `Gitlab-Agent-Id`,
//!    `X-Csrf-Token`, and the `gitlab-agent-id`, `gitlab-csrf-token` query
//!    parameters), `Via` added, the body and the response streamed as they come,
//!    and an upgrade (`kubectl exec`, `attach`, `port-forward`) carried both ways
//!    once agentk answers 101.
//!
//! Every error kas answers itself is a Kubernetes `Status` (`status`); a 401 also
//! carries `Gitlab-Unauthorized: true`. Tokens are never logged, only their
//! fingerprints. Header names used here are those of `internal/tool/httpz/tools.go`;
//! the agent id travels to the routing layer as the call's agent id (GitLab's kas puts
//! it in the `kas-hop-routing-agent-id` metadata, `internal/module/modserver/api.go`).

mod auth;
mod creds;
pub(crate) mod graph_ws;
mod make_request;
mod status;

pub use auth::{
    AccessAs, AllowedAgent, AllowedAgentsForJob, AuthorizeProxyUserResponse, AuthorizedAgent,
    CiAccessAs, CiConfiguration, CiImpersonate, Environment, ExtraKeyVal, IdOnly, JobProject,
    RoleAccess, User, UserAccess,
};

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio::net::TcpListener;

use self::status::ErrResp;
use super::routing::AgentRouter;
use crate::http_server::{BoxBody, empty_body};

/// The `[k8s_proxy]` listener's configuration (`kas.toml`, see [`super::config`]).
#[derive(Clone, Debug)]
pub struct K8sProxyConfig {
    /// Where to listen.
    pub listen: SocketAddr,
    /// The URL path prefix, ending with `/` (default `/k8s-proxy/`).
    pub url_prefix: String,
    /// Origins browsers may call from (`scheme://host[:port]`).
    pub allowed_origins: Vec<String>,
    /// GitLab's base URL (`http://host:port`) for `authorize_proxy_user` and
    /// `job/allowed_agents`.
    pub gitlab_url: String,
    /// How long GitLab's yes is cached (kas: 1 min).
    pub positive_ttl: Duration,
    /// How long GitLab's 401/403/404 is cached (kas: 10 s).
    pub negative_ttl: Duration,
    /// How long one GitLab call may take.
    pub timeout: Duration,
    /// Largest request body forwarded (bytes); 413 above.
    pub max_request_body: usize,
}

impl K8sProxyConfig {
    /// Defaults (prefix `/k8s-proxy/`, TTLs 1 min / 10 s, 5 s GitLab calls, 16 MiB
    /// bodies, no allowed origins) listening on `listen`, asking GitLab at
    /// `gitlab_url`.
    pub fn new(listen: SocketAddr, gitlab_url: &str) -> K8sProxyConfig {
        K8sProxyConfig {
            listen,
            url_prefix: "/k8s-proxy/".into(),
            allowed_origins: Vec::new(),
            gitlab_url: gitlab_url.to_owned(),
            positive_ttl: Duration::from_secs(60),
            negative_ttl: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            max_request_body: 16 << 20,
        }
    }
}

/// What the listener's requests share.
pub struct K8sProxy {
    config: K8sProxyConfig,
    auth: auth::Authenticator,
    router: Arc<AgentRouter>,
    /// `Server` on kas's own answers (kas: `gitlab-kas/<version>/<commit>`).
    server: HeaderValue,
    /// What kas appends to `Via` (kas: `gRPC/1.0 <server name>`).
    via: HeaderValue,
}

impl K8sProxy {
    /// The proxy for `config`, signing GitLab internal API calls with `secret` (the
    /// GitLab ↔ kas secret), sending calls through `router`; `registry` gets its
    /// metrics.
    pub fn new(
        config: K8sProxyConfig,
        secret: Vec<u8>,
        router: Arc<AgentRouter>,
        registry: &prometheus::Registry,
    ) -> K8sProxy {
        let auth = auth::Authenticator::new(
            &config.gitlab_url,
            secret,
            config.positive_ttl,
            config.negative_ttl,
            config.timeout,
            registry,
        );
        let name = format!("podgate-kas/{}", env!("CARGO_PKG_VERSION"));
        K8sProxy {
            server: HeaderValue::from_str(&name).expect("a valid header value"),
            via: HeaderValue::from_str(&format!("gRPC/1.0 {name}")).expect("a valid header value"),
            auth,
            router,
            config,
        }
    }

    /// Answer one request.
    pub(crate) async fn handle(&self, req: Request<Incoming>) -> Response<BoxBody> {
        let origin = req.headers().get(http::header::ORIGIN).cloned();
        if let Some(o) = &origin
            && !self
                .config
                .allowed_origins
                .iter()
                .any(|a| a.as_bytes() == o.as_bytes())
        {
            tracing::debug!(origin = ?o, "k8s proxy: Origin not allowed");
            let mut r = Response::new(empty_body());
            *r.status_mut() = StatusCode::FORBIDDEN;
            return r;
        }
        let mut resp = if req.method() == Method::OPTIONS {
            self.preflight(&req)
        } else {
            match self.proxy(req).await {
                Ok(r) => r,
                Err(e) => self.error(e),
            }
        };
        if let Some(o) = origin {
            let h = resp.headers_mut();
            h.insert(http::header::ACCESS_CONTROL_ALLOW_ORIGIN, o);
            h.insert(
                http::header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            );
            h.append(http::header::VARY, HeaderValue::from_static("Origin"));
        }
        resp
    }

    /// A CORS preflight (kas answers it before any other check).
    fn preflight(&self, req: &Request<Incoming>) -> Response<BoxBody> {
        let mut r = Response::new(empty_body());
        let h = r.headers_mut();
        for v in req
            .headers()
            .get_all(http::header::ACCESS_CONTROL_REQUEST_HEADERS)
        {
            h.append(http::header::ACCESS_CONTROL_ALLOW_HEADERS, v.clone());
        }
        h.insert(
            http::header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static(
                "GET, HEAD, POST, PUT, DELETE, CONNECT, OPTIONS, TRACE, PATCH",
            ),
        );
        h.insert(
            http::header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("86400"),
        );
        h.insert(http::header::SERVER, self.server.clone());
        r
    }

    fn error(&self, e: ErrResp) -> Response<BoxBody> {
        let mut r = e.into_response();
        r.headers_mut()
            .insert(http::header::SERVER, self.server.clone());
        r
    }

    async fn proxy(&self, req: Request<Incoming>) -> Result<Response<BoxBody>, ErrResp> {
        let prefix = self.config.url_prefix.as_str();
        if !req.uri().path().starts_with(prefix) {
            return Err(ErrResp::new(
                StatusCode::BAD_REQUEST,
                "Bad request: URL does not start with expected prefix",
            ));
        }
        let query = req.uri().query().unwrap_or("");
        let (agent_id, creds) = creds::extract(req.headers(), query).map_err(|why| {
            tracing::debug!(reason = %why, "k8s proxy: unauthorized");
            ErrResp::with_cause(StatusCode::UNAUTHORIZED, "Unauthorized", why)
        })?;
        let identity = self.auth.identify(agent_id, &creds).await.inspect_err(|e| {
            tracing::debug!(agent_id, credentials = ?creds, code = %e.code, "k8s proxy: refused");
        })?;
        // The prefix ends with `/`; keep it (kas: `Path[len(prefix)-1:]`).
        let rest = &req.uri().path()[prefix.len() - 1..];
        if rest == "/graph" {
            let ctx = graph_ws::GraphContext {
                agent_id: identity.agent_id,
                impersonation: identity.impersonation,
                router: self.router.clone(),
            };
            return Ok(graph_ws::handle(req, ctx));
        }
        make_request::make_request(self, req, identity).await
    }
}

/// A `Status` answer with `code` and `msg` (after `GitLab Agent Server: `); a 401
/// carries `Gitlab-Unauthorized: true`.
pub(crate) fn status_response(code: StatusCode, msg: &str) -> Response<BoxBody> {
    ErrResp::new(code, msg).into_response()
}

/// Serve `proxy` on `listener` until `draining` turns true; then stop accepting, let
/// requests in flight finish (idle connections close at once), and return when every
/// connection has ended. Upgraded connections (`/graph`, `MakeRequest` upgrades) live
/// on in their own tasks.
pub async fn serve(
    listener: TcpListener,
    proxy: Arc<K8sProxy>,
    draining: tokio::sync::watch::Receiver<bool>,
) {
    let handle: crate::http_server::Handle = Arc::new(move |req| {
        let proxy = proxy.clone();
        Box::pin(async move { proxy.handle(req).await })
    });
    crate::http_server::serve(listener, handle, draining, "k8s proxy").await;
}
