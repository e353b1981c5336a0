//! `GitlabAccess.MakeRequest` on the agent listener: agentk modules' HTTP requests to
//! GitLab's internal module API, carried over one gRPC stream each (GitLab's
//! `internal/module/gitlab_access/server/server.go`,
//! <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/module/gitlab_access/server/server.go>, piped as
//! `internal/tool/grpctool/inbound_grpc_to_outbound_http.go` does, and sent as
//! `internal/gitlab/api/module_request.go` sends it).
//!
//! - The caller is authenticated by its agent token ([`AgentAuth`]); every refusal is
//!   `Unauthenticated`. Without a GitLab URL (`[gitlab] url`) the call is
//!   `FailedPrecondition`.
//! - The messages are GitLab's `grpctool.HttpRequest` / `HttpResponse`. The first
//!   is the header: method, path, query, headers, and in `extra` a
//!   `google.protobuf.Any` holding `gitlab_access.rpc.HeaderExtra{module_name}`,
//!   unpacked as GitLab's server does (`header.Extra.UnmarshalTo`; another type URL
//!   is `InvalidArgument` naming both types, [`podgate_agent::any`]).
//!   `InvalidArgument` too when the module name or method is empty, the path is
//!   not `/…`, or it has `.`/`..` segments (the last one is podgate's: the path must
//!   stay under the module's prefix). A request asking for a connection upgrade
//!   (`Upgrade`, or `Connection: upgrade`) is refused with `InvalidArgument`
//!   ("connection upgrade is not supported"; GitLab's words).
//! - kas sends `METHOD {gitlab}/api/v4/internal/kubernetes/modules/<PathEscape(module)><url_path>?<query>`,
//!   the path written as Go's `url.URL.String()` writes it (so an escaped module
//!   name is escaped again, as GitLab's kas does), the query as `url.Values.Encode`
//!   (keys sorted). Headers: the caller's, minus hop-by-hop ones, `Host` and
//!   `Content-Length` (the body is streamed, chunked, as Go's client streams a
//!   pipe); plus `Gitlab-Kas-Api-Request` (kas's JWT) and `Authorization: Bearer
//!   <agent token>`, as GitLab 16.5's kas sends them (`internal/gitlab/client.go`,
//!   `internal/gitlab/do_options.go` `WithAgentToken`). Newer Rails also reads the
//!   token from `Gitlab-Agentk-Api-Request`; podgate's GitLab stand-ins accept both.
//! - The body goes to GitLab as it arrives; GitLab's status, headers (hop-by-hop ones
//!   dropped) and body come back unchanged, streamed in chunks of 32 KiB, then a
//!   trailer.
//! - GitLab unreachable (or the connection breaking) is `Unavailable`; a caller that
//!   breaks protocol (data before the header, after the trailer, or for a request
//!   announced without a body) gets `InvalidArgument` / `Internal` and GitLab's
//!   request is aborted, never completed with a truncated body.
//!
//! Metric: `podgate_kas_module_requests_total{module,status}` — `status` is GitLab's
//! status class (`2xx` … `5xx`) or, when GitLab gave no answer, the gRPC code kas
//! ended the call with (`unavailable`, `invalid_argument`, …). `module` is the module
//! name when it is one of GitLab's agent modules, else `other` (agents choose the
//! name; the label set stays bounded).
//!
//! Layout: the service in this module; `outbound.rs` the HTTP request built from
//! the header message; `forward.rs` the request sent, the caller's body pumped in
//! and GitLab's answer streamed back; `url.rs` Go's `net/url` escaping; unit tests
//! in `gitlab_access/tests.rs`.

mod forward;
mod outbound;
#[cfg(test)]
mod tests;
pub(crate) mod url;

use std::pin::Pin;
use std::sync::Arc;

use futures_util::Stream;
use tonic::{Code, Status, Streaming};

use self::forward::forward;
use self::outbound::Outbound;
use super::agent_auth::AgentAuth;
use super::gitlab::GitlabClient;
use podgate_agent::proto::gitlab::agent::grpctool::{HttpRequest, HttpResponse, http_request};
use podgate_agent::proto::gitlab_access::HeaderExtra;
use podgate_agent::proto::gitlab_access::gitlab_access_server::GitlabAccess;

/// Where module requests go below GitLab's base URL (GitLab's
/// `ModuleRequestApiPath`).
pub const MODULE_REQUEST_API_PATH: &str = "/api/v4/internal/kubernetes/modules/";

/// The protobuf full name of the message in `Header.extra`.
pub const HEADER_EXTRA: &str = "gitlab.agent.gitlab_access.rpc.HeaderExtra";

/// Response body chunks sent to agentk (GitLab's 32 KiB buffers).
const CHUNK: usize = 32 << 10;

/// Modules counted under their own name in the metric.
const KNOWN_MODULES: [&str; 6] = [
    "remote_development",
    "agent_configuration",
    "gitops",
    "flux",
    "starboard_vulnerability",
    "google_profiler",
];

/// What kas calls itself towards GitLab (GitLab's kas: `gitlab-kas/<version>`).
const USER_AGENT: &str = concat!("podgate-kas/", env!("CARGO_PKG_VERSION"));

/// The `GitlabAccess` service.
pub(crate) struct GitlabAccessService {
    auth: Arc<AgentAuth>,
    gitlab: Option<Arc<GitlabClient>>,
    requests: prometheus::IntCounterVec,
}

impl GitlabAccessService {
    /// Authenticate callers with `auth`; forward to `gitlab` (none: every call is
    /// `FailedPrecondition`); count requests in `registry`.
    pub(crate) fn new(
        auth: Arc<AgentAuth>,
        gitlab: Option<Arc<GitlabClient>>,
        registry: &prometheus::Registry,
    ) -> GitlabAccessService {
        let requests = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "podgate_kas_module_requests_total",
                "agentk modules' requests to GitLab (GitlabAccess.MakeRequest), by module and \
                 GitLab's status class, or the gRPC code when GitLab gave no answer",
            ),
            &["module", "status"],
        )
        .expect("valid metric");
        let _ = registry.register(Box::new(requests.clone()));
        GitlabAccessService {
            auth,
            gitlab,
            requests,
        }
    }
}

/// The response stream of one `MakeRequest`.
pub type MakeRequestStream = Pin<Box<dyn Stream<Item = Result<HttpResponse, Status>> + Send>>;

#[tonic::async_trait]
impl GitlabAccess for GitlabAccessService {
    type MakeRequestStream = MakeRequestStream;

    async fn make_request(
        &self,
        request: tonic::Request<Streaming<HttpRequest>>,
    ) -> Result<tonic::Response<MakeRequestStream>, Status> {
        let identity = self.auth.authenticate(request.metadata()).await?;
        let token = podgate_agent::auth::bearer(request.metadata())
            .ok_or_else(|| Status::unauthenticated("unauthenticated"))?
            .to_owned();
        let mut module = "other";
        let result = async {
            let gitlab = self.gitlab.clone().ok_or_else(|| {
                Status::failed_precondition("kas has no GitLab URL configured ([gitlab] url)")
            })?;
            let mut inbound = request.into_inner();
            let header = match inbound.message().await? {
                Some(HttpRequest {
                    message: Some(http_request::Message::Header(h)),
                }) => h,
                _ => {
                    return Err(Status::invalid_argument(
                        "the first message must be the request header",
                    ));
                }
            };
            let module_name = podgate_agent::any::unpack::<HeaderExtra>(
                &header.extra.clone().unwrap_or_default(),
                HEADER_EXTRA,
            )
            .map_err(|e| Status::invalid_argument(format!("Header.extra: {e}")))?
            .module_name;
            if let Some(known) = KNOWN_MODULES.iter().find(|m| **m == module_name) {
                module = known;
            }
            let outbound = Outbound::from_header(header, &module_name, &token)?;
            tracing::debug!(
                agent_id = identity.agent_id,
                module = %module_name,
                method = %outbound.method,
                path = %outbound.path_and_query,
                "module request"
            );
            forward(gitlab, outbound, inbound).await
        }
        .await;
        match result {
            Ok((status, stream)) => {
                let class = match status {
                    100..=199 => "1xx",
                    200..=299 => "2xx",
                    300..=399 => "3xx",
                    400..=499 => "4xx",
                    _ => "5xx",
                };
                self.requests.with_label_values(&[module, class]).inc();
                Ok(tonic::Response::new(stream))
            }
            Err(e) => {
                self.requests
                    .with_label_values(&[module, code_label(e.code())])
                    .inc();
                Err(e)
            }
        }
    }
}

/// A gRPC code as a metric label (`invalid_argument`).
fn code_label(code: Code) -> &'static str {
    match code {
        Code::InvalidArgument => "invalid_argument",
        Code::FailedPrecondition => "failed_precondition",
        Code::Unavailable => "unavailable",
        Code::Unauthenticated => "unauthenticated",
        Code::Cancelled => "cancelled",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::Internal => "internal",
        _ => "error",
    }
}
