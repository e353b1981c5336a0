//! kas's Workspaces HTTP server (`[workspaces]`): user traffic for
//! `https://<port>-<workspace name>.<dns zone>/…`, authorised by GitLab and sent
//! to the workspace through its agent's reverse tunnel.
//!
//! GitLab's kas (18.4+, gitlab-agent MRs 2628, 2686, 2771, 2654) serves this on
//! its own plain-HTTP listener (chart port 8160) behind a wildcard ingress; it
//! authenticates the browser with an OAuth flow against GitLab (the "GitLab
//! Workspaces" application of `agentw/server_config`), asks GitLab
//! `GET /api/v4/internal/agents/agentw/authorize_user_access?workspace_host=&user_id=`
//! and tunnels the request to *agentw*, an agent inside the workspace. podgate
//! keeps GitLab's contract with Rails and changes two things:
//!
//! - **Credentials**: `Authorization: Bearer <personal access token>`; the user is
//!   who GitLab's `GET /api/v4/user` says the token belongs to (a yes cached
//!   [`WorkspacesConfig::user_ttl`], a no [`WorkspacesConfig::negative_ttl`],
//!   keyed by the token's SHA-256, never the token; logs carry
//!   [`podgate_tokens::fingerprint()`]). GitLab's browser flow (307 to
//!   `/oauth/authorize`, the callback on the kas host, the transfer token and the
//!   host-only session cookie) is **not implemented**: a request without a
//!   bearer token is 401.
//! - **The last hop**: agentk's existing reverse tunnel, not agentw's. The agent
//!   is taken from the workspace's name, `workspace-<agent id>-<user id>-<random>`
//!   (Rails' `workspace_operations/create/workspace_attributes_builder.rb` names
//!   them so): Rails' authorize answer carries only `port` and `workspace_id`,
//!   and in GitLab the workspace's own agentw tunnel makes an agent id
//!   unnecessary. The call is `WorkspaceRequest`
//!   (`agent/proto/kubernetes_api.proto`) through [`AgentRouter`], answered by
//!   agentk's `workspace_traffic` from the workspace's Service.
//!
//! Answers kas gives itself (GitLab's own are not public; these are podgate's
//! choice), JSON `{"error": "<code>", "message": "…"}`:
//!
//! | when | status | `error` |
//! |---|---|---|
//! | no or malformed `Authorization: Bearer` | 401 (`WWW-Authenticate: Bearer`) | `UNAUTHORIZED` |
//! | GitLab does not know the token, or it cannot read the user | 401 | `UNAUTHORIZED` |
//! | Rails: `INVALID_HOST` | 400 | `INVALID_HOST` |
//! | Rails: `WORKSPACE_NOT_FOUND` / `PORT_NOT_FOUND` | 404 | the same |
//! | Rails: `NOT_AUTHORIZED` (not the owner) | 403 | `NOT_AUTHORIZED` |
//! | a WebSocket or other upgrade | 501 | `UPGRADE_NOT_SUPPORTED` |
//! | body over `max_request_body` | 413 | `REQUEST_TOO_LARGE` |
//! | agentk: no ready endpoint (stopped, starting, terminated) | 503 | `WORKSPACE_NOT_RUNNING`, `workspace <name> is not running` |
//! | the agent never connected within `max_wait` | 504 | `AGENT_NOT_CONNECTED` |
//! | GitLab unreachable or odd, the tunnel or the workspace failing | 502 | `BAD_GATEWAY` |
//!
//! Upgrades: `WorkspaceRequest` sends one request message down the tunnel and reads
//! a stream of messages up ([`crate::routing::AgentRouter::open`]), so bytes from the
//! client after the request cannot reach agentk; WebSockets (editors use them)
//! would need `WorkspaceRequest` to stream the client's bytes as request messages,
//! which the tunnel carries ([`crate::routing::AgentRouter::call`]) but this
//! module and agentk's handler do not do yet.
//!
//! Counted in `podgate_kas_workspace_requests_total{outcome}`.
//!
//! Layout: this module holds the configuration, the server and its request path;
//! `refusal.rs` the answers kas gives itself, `authorize.rs` GitLab's two questions
//! (who the token is, whether they may reach the host; cached), `forward.rs` the
//! request through the agent's tunnel, `request.rs` what is read off a request
//! (host, bearer token, upgrade, workspace name and agent); unit tests in
//! `workspaces/tests.rs`.

mod authorize;
mod forward;
mod refusal;
mod request;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use prometheus::IntCounterVec;
use tokio::net::TcpListener;

use self::authorize::Authorized;
use self::refusal::Refusal;
pub use self::request::{agent_of, workspace_name};
use self::request::{bearer, is_upgrade, request_host};
use super::gitlab::GitlabClient;
use super::routing::AgentRouter;
use crate::answer_cache::AnswerCache;
use crate::http_server::BoxBody;

/// The `[workspaces]` listener's configuration (`kas.toml`, see [`super::config`]).
#[derive(Clone, Debug)]
pub struct WorkspacesConfig {
    /// Where to listen (plain HTTP/1.1).
    pub listen: SocketAddr,
    /// GitLab's base URL (`http://host:port`): `/api/v4/user` and the internal
    /// `agentw/authorize_user_access`.
    pub gitlab_url: String,
    /// How long a token's user, and GitLab's yes to a (user, host), are cached.
    pub user_ttl: Duration,
    /// How long GitLab's no to a token is cached.
    pub negative_ttl: Duration,
    /// How long one GitLab call may take.
    pub timeout: Duration,
    /// Largest request body forwarded (bytes); 413 above.
    pub max_request_body: usize,
}

impl WorkspacesConfig {
    /// Defaults (30 s / 5 s caches, 5 s GitLab calls, 16 MiB bodies) on `listen`,
    /// asking GitLab at `gitlab_url`.
    pub fn new(listen: SocketAddr, gitlab_url: &str) -> WorkspacesConfig {
        WorkspacesConfig {
            listen,
            gitlab_url: gitlab_url.to_owned(),
            user_ttl: Duration::from_secs(30),
            negative_ttl: Duration::from_secs(5),
            timeout: Duration::from_secs(5),
            max_request_body: 16 << 20,
        }
    }
}

/// What the listener's requests share.
pub struct WorkspacesServer {
    config: WorkspacesConfig,
    gitlab: GitlabClient,
    router: Arc<AgentRouter>,
    /// SHA-256 of a token → its user id, or the refusal; a yes for
    /// [`WorkspacesConfig::user_ttl`], a no for [`WorkspacesConfig::negative_ttl`].
    users: AnswerCache<i64, Refusal>,
    /// (user id, host) → Rails' yes, or its refusal; the same TTLs.
    verdicts: AnswerCache<Authorized, Refusal, (i64, String)>,
    requests: IntCounterVec,
    server: HeaderValue,
    via: HeaderValue,
}

impl WorkspacesServer {
    /// The server for `config`, signing GitLab internal API calls with `secret`
    /// (the GitLab ↔ kas secret), tunnelling through `router`; `registry` gets its
    /// metrics.
    pub fn new(
        config: WorkspacesConfig,
        secret: Vec<u8>,
        router: Arc<AgentRouter>,
        registry: &prometheus::Registry,
    ) -> WorkspacesServer {
        let requests = IntCounterVec::new(
            prometheus::Opts::new(
                "podgate_kas_workspace_requests_total",
                "Requests of the Workspaces HTTP server, by outcome.",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        let _ = registry.register(Box::new(requests.clone()));
        let name = format!("podgate-kas/{}", env!("CARGO_PKG_VERSION"));
        WorkspacesServer {
            gitlab: GitlabClient::new(&config.gitlab_url, secret),
            router,
            users: AnswerCache::new(config.user_ttl, config.negative_ttl),
            verdicts: AnswerCache::new(config.user_ttl, config.negative_ttl),
            requests,
            server: HeaderValue::from_str(&name).expect("a valid header value"),
            via: HeaderValue::from_str(&format!("gRPC/1.0 {name}")).expect("a valid header value"),
            config,
        }
    }

    /// Answer one request.
    pub(crate) async fn handle(&self, req: Request<Incoming>) -> Response<BoxBody> {
        match self.serve(req).await {
            Ok(r) => {
                self.requests.with_label_values(&["forwarded"]).inc();
                r
            }
            Err(e) => {
                self.requests.with_label_values(&[e.outcome]).inc();
                e.into_response(&self.server)
            }
        }
    }

    async fn serve(&self, req: Request<Incoming>) -> Result<Response<BoxBody>, Refusal> {
        let host = request_host(&req).unwrap_or_default();
        let token = bearer(req.headers()).ok_or_else(|| {
            Refusal::unauthorized(
                "credentials required: Authorization: Bearer <personal access token> \
                 (the OAuth browser sign-in is not supported)",
            )
        })?;
        let user_id = self.user(&token).await?;
        let ok = self.authorize(user_id, &host).await?;
        let name = workspace_name(&host).unwrap_or_default();
        if is_upgrade(req.headers()) {
            return Err(Refusal::new(
                StatusCode::NOT_IMPLEMENTED,
                "UPGRADE_NOT_SUPPORTED",
                "connection upgrades (WebSocket) are not carried through the agent's tunnel",
            )
            .counted("upgrade_refused"));
        }
        let Some(agent_id) = agent_of(&name) else {
            return Err(Refusal::bad_gateway(format!(
                "workspace {name}: its agent cannot be told from its name"
            )));
        };
        tracing::debug!(agent_id, workspace = %name, port = ok.port, user_id, "workspace request");
        self.forward(req, agent_id, &name, ok).await
    }
}

/// Serve `server` on `listener` until `draining` turns true, as the Kubernetes API
/// proxy's listener is served.
pub async fn serve(
    listener: TcpListener,
    server: Arc<WorkspacesServer>,
    draining: tokio::sync::watch::Receiver<bool>,
) {
    let handle: crate::http_server::Handle = Arc::new(move |req| {
        let server = server.clone();
        Box::pin(async move { server.handle(req).await })
    });
    crate::http_server::serve(listener, handle, draining, "workspaces").await;
}
