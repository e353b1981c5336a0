//! The external listener (Rails → kas): one authentication for every service on it,
//! and an `UNIMPLEMENTED` answer naming whatever of GitLab's kas API podgate does not
//! serve.
//!
//! - [`ExternalAuth`] is the interceptor every service on this listener is wrapped
//!   in: Rails' JWT as [`podgate_agent::auth::JwtAuth::external`] checks it, every
//!   refusal the same bare `Unauthenticated` (the reason goes to the metrics).
//! - `routes` puts the services together with gzip accepted (and sent when asked)
//!   and the `fallback`: any other path is authenticated the same way, then
//!   answered `Unimplemented` with a message naming the method, and saying so when
//!   it is one of GitLab's (16.5's API server registers `AgentTracker`,
//!   `ConfigurationProject` and `Notifications`,
//!   `internal/module/*/server/factory.go`; newer Rails also calls the services in
//!   [`GITLAB_UNSERVED`]).
//!
//! A new service on this listener: `InterceptedService::new(gzip_server!(XServer::new(x)),
//! auth.clone())`, added to the `routes` call in `lifecycle.rs`.

use std::convert::Infallible;
use std::sync::Arc;

use tonic::service::Routes;
use tonic::{Request, Status};

use super::metrics::KasMetrics;
use podgate_agent::auth::JwtAuth;

/// GitLab kas API services (or single methods, `service/method`) Rails may call that
/// podgate kas does not serve, with why. Their calls are `Unimplemented` with a
/// message naming the method.
pub const GITLAB_UNSERVED: &[(&str, &str)] = &[
    (
        "gitlab.agent.configuration_project.rpc.ConfigurationProject",
        "listing agent configuration files needs Gitaly",
    ),
    (
        "gitlab.agent.server_info.rpc.ServerInfo",
        "newer than GitLab 16.5's kas API",
    ),
    (
        "gitlab.agent.auto_flow.rpc.AutoFlow",
        "newer than GitLab 16.5's kas API",
    ),
    (
        "gitlab.agent.managed_resources.rpc.Provisioner",
        "newer than GitLab 16.5's kas API",
    ),
    (
        "gitlab.agent.agent_tracker.rpc.AgentTracker/GetConnectedAgentsByAgentIDs",
        "newer than GitLab 16.5's kas API",
    ),
];

/// The external listener's authentication, as a tonic interceptor.
#[derive(Clone)]
pub struct ExternalAuth {
    auth: Arc<JwtAuth>,
    metrics: Arc<KasMetrics>,
}

impl ExternalAuth {
    /// Check with `auth`; count refusals in `metrics`.
    pub(crate) fn new(auth: JwtAuth, metrics: Arc<KasMetrics>) -> ExternalAuth {
        ExternalAuth {
            auth: Arc::new(auth),
            metrics,
        }
    }

    fn check(&self, metadata: &tonic::metadata::MetadataMap) -> Result<(), Status> {
        self.auth.verify(metadata).map_err(|why| {
            self.metrics.auth_failure("external", why, metadata);
            Status::unauthenticated("unauthenticated")
        })
    }
}

impl tonic::service::Interceptor for ExternalAuth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        self.check(req.metadata())?;
        Ok(req)
    }
}

/// The answer to a call of `path` no service on the listener serves.
pub fn unserved(path: &str) -> Status {
    let method = path.trim_start_matches('/');
    let service = method.split('/').next().unwrap_or_default();
    match GITLAB_UNSERVED
        .iter()
        .find(|(s, _)| *s == service || *s == method)
    {
        Some((_, why)) => Status::unimplemented(format!(
            "{method}: GitLab kas API that podgate kas does not serve ({why})"
        )),
        None => Status::unimplemented(format!("{method}: no such method on kas's API")),
    }
}

/// `routes` with the [`fallback`] for every other path.
pub(crate) fn routes(mut routes: Routes, auth: ExternalAuth) -> Routes {
    let mut router = std::mem::take(routes.axum_router_mut());
    // Single methods of a service that is served: routed before the service's own
    // catch-all (whose unknown methods get tonic's bare `Unimplemented`).
    for (method, _) in GITLAB_UNSERVED.iter().filter(|(m, _)| m.contains('/')) {
        router = router.route_service(&format!("/{method}"), fallback(auth.clone()));
    }
    *routes.axum_router_mut() = router.fallback_service(fallback(auth));
    routes
}

/// Authenticate, then [`unserved`].
fn fallback<B: Send + 'static>(
    auth: ExternalAuth,
) -> impl tower::Service<
    http::Request<B>,
    Response = http::Response<tonic::body::Body>,
    Error = Infallible,
    Future = impl Send + 'static,
> + Clone
+ Send
+ Sync
+ 'static {
    tower::service_fn(move |req: http::Request<B>| {
        let metadata = tonic::metadata::MetadataMap::from_headers(req.headers().clone());
        let status = match auth.check(&metadata) {
            Ok(()) => unserved(req.uri().path()),
            Err(refused) => refused,
        };
        std::future::ready(Ok::<_, Infallible>(status.into_http()))
    })
}
