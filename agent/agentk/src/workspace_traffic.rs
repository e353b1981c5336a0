//! `WorkspaceRequest`: user traffic for a workspace, tunnelled by kas's Workspaces
//! HTTP server (`kas::workspaces`) once GitLab authorised it, answered here by
//! sending the HTTP request to the workspace's Service.
//!
//! GitLab 18.4+ carries this traffic over a tunnel opened by *agentw*, a small
//! agent started inside the workspace, which forwards to `localhost:<port>`.
//! podgate takes the path of GitLab's own agent-based spike (gitlab-agent MR 2284)
//! and of the older `gitlab-workspaces-proxy` (`pkg/k8s/client.go`): the workspace
//! is found by its Service, through agentk's existing reverse tunnel.
//!
//! 1. The Service: among the Services labelled `agent.gitlab.com/id=<this agent>`
//!    in every namespace, the one annotated `workspaces.gitlab.com/id: <workspace
//!    id>` (the proxy's informer keys on the same label and annotation; where it
//!    was found is remembered, [`ServiceCache`]), with a
//!    port whose `targetPort` (or, without one, `port`) is the requested port.
//!    None: `FAILED_PRECONDITION` (the workspace has no Service: terminated, or not
//!    created yet); a Service without the port: `NOT_FOUND`.
//! 2. Its `Endpoints` (same name): a ready address and the port of the same name.
//!    None: `FAILED_PRECONDITION` (stopped or not yet running), which kas answers
//!    as 503 "workspace … is not running".
//! 3. The request goes to `http://<address>:<port>` over HTTP/1.1 with the user's
//!    method, path, query and headers (hop-by-hop ones dropped, `Host` kept, so
//!    the editor sees its public host), and the answer streams back as
//!    `MakeRequest`'s does ([`super::k8s_api`]): a header, then body chunks. A
//!    refused or broken connection is `UNAVAILABLE`.

use std::time::Duration;

use futures_util::StreamExt as _;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::api::{Api, ListParams};
use prost::Message as _;
use tonic::Status;

use super::tunnels::Responses;
use podgate_agent::proto::kubernetes_api::{HttpRequest, WorkspaceRequest};

/// The label on every object of an agent's workspaces.
pub const AGENT_LABEL: &str = "agent.gitlab.com/id";
/// The annotation naming a workspace's id on its objects.
pub const WORKSPACE_ID_ANNOTATION: &str = "workspaces.gitlab.com/id";

/// How long dialling the workspace may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where each workspace's Service was last found ((agent, workspace id) →
/// (namespace, name)), so a request costs one `GET` of that Service rather than a
/// list of every workspace Service; a Service gone or changed is looked up again.
#[derive(Debug, Default)]
pub struct ServiceCache {
    found: std::sync::Mutex<std::collections::HashMap<(i64, i64), (String, String)>>,
}

impl ServiceCache {
    fn get(&self, key: (i64, i64)) -> Option<(String, String)> {
        self.lock().get(&key).cloned()
    }

    fn put(&self, key: (i64, i64), at: (String, String)) {
        let mut found = self.lock();
        if found.len() >= 100_000 {
            found.clear();
        }
        found.insert(key, at);
    }

    fn forget(&self, key: (i64, i64)) {
        self.lock().remove(&key);
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<(i64, i64), (String, String)>> {
        self.found.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Answer one tunnelled `WorkspaceRequest` for agent `agent_id` (`None`: agentk
/// has no configuration from kas yet), Services found through `cache`.
pub fn workspace_request(
    client: kube::Client,
    cache: std::sync::Arc<ServiceCache>,
    agent_id: Option<i64>,
    payload: Vec<u8>,
) -> Responses {
    Box::pin(
        futures_util::stream::once(async move {
            let req = WorkspaceRequest::decode(payload.as_slice())
                .map_err(|_| Status::invalid_argument("undecodable WorkspaceRequest"))?;
            let agent_id = agent_id
                .ok_or_else(|| Status::unavailable("agentk has no configuration from kas yet"))?;
            let target = resolve(&client, &cache, agent_id, &req).await?;
            let http = req
                .request
                .ok_or_else(|| Status::invalid_argument("WorkspaceRequest without a request"))?;
            let response = send(target, http).await?;
            Ok(super::k8s_api::respond(response))
        })
        .flat_map(|r: Result<Responses, Status>| match r {
            Ok(parts) => parts,
            Err(e) => Box::pin(futures_util::stream::once(async move { Err(e) })),
        }),
    )
}

/// Whether Service port `p` serves `port`: its `targetPort` when it is a number,
/// else its `port`.
fn serves(p: &k8s_openapi::api::core::v1::ServicePort, port: u32) -> bool {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    match &p.target_port {
        Some(IntOrString::Int(t)) => u32::try_from(*t).ok() == Some(port),
        Some(IntOrString::String(s)) => s.parse::<u32>().ok() == Some(port),
        None => u32::try_from(p.port).ok() == Some(port),
    }
}

/// Whether `svc` is agent `agent_id`'s Service of workspace `id`.
fn is_workspace_service(svc: &Service, agent_id: i64, id: &str) -> bool {
    let m = &svc.metadata;
    m.annotations
        .as_ref()
        .and_then(|a| a.get(WORKSPACE_ID_ANNOTATION))
        .is_some_and(|v| v == id)
        && m.labels
            .as_ref()
            .and_then(|l| l.get(AGENT_LABEL))
            .is_some_and(|v| *v == agent_id.to_string())
}

/// Agent `agent_id`'s Service of the workspace: where the cache says, else by a
/// list of the agent's Services.
async fn find_service(
    client: &kube::Client,
    cache: &ServiceCache,
    agent_id: i64,
    workspace_id: i64,
) -> Result<Option<Service>, Status> {
    let id = workspace_id.to_string();
    let key = (agent_id, workspace_id);
    if let Some((ns, name)) = cache.get(key) {
        let api: Api<Service> = Api::namespaced(client.clone(), &ns);
        match api.get_opt(&name).await.map_err(kube_error)? {
            Some(svc) if is_workspace_service(&svc, agent_id, &id) => return Ok(Some(svc)),
            _ => cache.forget(key),
        }
    }
    let services: Api<Service> = Api::all(client.clone());
    let list = services
        .list(&ListParams::default().labels(&format!("{AGENT_LABEL}={agent_id}")))
        .await
        .map_err(kube_error)?;
    let found = list
        .items
        .into_iter()
        .find(|s| is_workspace_service(s, agent_id, &id));
    if let Some(svc) = &found {
        cache.put(
            key,
            (
                svc.metadata.namespace.clone().unwrap_or_default(),
                svc.metadata.name.clone().unwrap_or_default(),
            ),
        );
    }
    Ok(found)
}

/// The `ip:port` to send the request to.
async fn resolve(
    client: &kube::Client,
    cache: &ServiceCache,
    agent_id: i64,
    req: &WorkspaceRequest,
) -> Result<std::net::SocketAddr, Status> {
    let name = &req.workspace_name;
    let not_running = || {
        Status::failed_precondition(format!(
            "workspace {name} is not running (no ready endpoint for port {})",
            req.port
        ))
    };
    let Some(svc) = find_service(client, cache, agent_id, req.workspace_id).await? else {
        return Err(Status::failed_precondition(format!(
            "workspace {name} is not running (it has no Service)"
        )));
    };
    let namespace = svc.metadata.namespace.clone().unwrap_or_default();
    let svc_name = svc.metadata.name.clone().unwrap_or_default();
    let Some(svc_port) = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .and_then(|ps| ps.iter().find(|p| serves(p, req.port)))
        .cloned()
    else {
        return Err(Status::not_found(format!(
            "workspace {name}: Service {namespace}/{svc_name} has no port {}",
            req.port
        )));
    };
    let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), &namespace);
    let Some(ep) = endpoints.get_opt(&svc_name).await.map_err(kube_error)? else {
        return Err(not_running());
    };
    for subset in ep.subsets.into_iter().flatten() {
        let Some(ip) = subset
            .addresses
            .as_ref()
            .and_then(|a| a.first())
            .map(|a| a.ip.clone())
        else {
            continue;
        };
        let ports = subset.ports.unwrap_or_default();
        let port = ports
            .iter()
            .find(|p| p.name == svc_port.name)
            .or_else(|| (ports.len() == 1).then(|| &ports[0]));
        if let Some(p) = port
            && let (Ok(ip), Ok(port)) = (ip.parse::<std::net::IpAddr>(), u16::try_from(p.port))
        {
            return Ok(std::net::SocketAddr::new(ip, port));
        }
    }
    Err(not_running())
}

/// A Kubernetes API failure while looking the workspace up.
fn kube_error(e: kube::Error) -> Status {
    tracing::warn!(error = %e, "workspace lookup failed");
    Status::unavailable(format!("kubernetes API: {e}"))
}

/// Send `req` to `addr` over HTTP/1.1; the response, its body streaming.
async fn send(
    addr: std::net::SocketAddr,
    req: HttpRequest,
) -> Result<http::Response<hyper::body::Incoming>, Status> {
    let unavailable = |what: &str, e: &dyn std::fmt::Display| {
        tracing::debug!(%addr, error = %e, "{what}");
        Status::unavailable(format!("{what} {addr}: {e}"))
    };
    let (method, uri, mut headers) = super::k8s_api::request_head(&req)?;
    headers.remove(http::header::CONTENT_LENGTH);
    if !headers.contains_key(http::header::HOST) {
        let host = http::HeaderValue::from_str(&addr.to_string())
            .map_err(|e| unavailable("an address that is no Host", &e))?;
        headers.insert(http::header::HOST, host);
    }
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| unavailable("timed out connecting to the workspace at", &"5 s"))?
        .map_err(|e| unavailable("connecting to the workspace at", &e))?;
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| unavailable("HTTP handshake with the workspace at", &e))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "workspace connection ended");
        }
    });
    let mut request = http::Request::new(http_body_util::Full::new(bytes::Bytes::from(req.body)));
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    sender
        .send_request(request)
        .await
        .map_err(|e| unavailable("the workspace did not answer at", &e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ServicePort;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    #[test]
    fn a_port_is_served_by_its_target_port_else_its_port() {
        let p = |port, target| ServicePort {
            port,
            target_port: target,
            ..Default::default()
        };
        assert!(serves(&p(80, Some(IntOrString::Int(60001))), 60001));
        assert!(!serves(&p(60001, Some(IntOrString::Int(8080))), 60001));
        assert!(serves(&p(60001, None), 60001));
        assert!(serves(
            &p(1, Some(IntOrString::String("3000".into()))),
            3000
        ));
        assert!(!serves(&p(1, Some(IntOrString::String("http".into()))), 1));
    }
}
