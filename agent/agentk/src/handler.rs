//! What agentk does for kas, through kube-rs: `GetPods` lists the cluster's pods
//! (all namespaces, or one), page by page; `MakeRequest` (whose requests stream),
//! `WatchGraph` and `WorkspaceRequest` are answered by their modules. Methods are named in full, as
//! the tunnel's descriptor advertises them ([`podgate_agent::tunnel`]).

use k8s_openapi::api::core::v1::Pod as KubePod;
use kube::api::{Api, ListParams};
use prost::Message as _;
use tonic::Status;

use super::tunnels::{Call, Handler, Responses, unary};
use podgate_agent::proto::gitlab::agent::entity::KubernetesVersion;
use podgate_agent::proto::{GetPodsRequest, GetPodsResponse, Pod};
use podgate_agent::tunnel::{GET_PODS, MAKE_REQUEST, WATCH_GRAPH, WORKSPACE_REQUEST};

/// Pods asked per list call.
const PAGE: u32 = 500;

/// Answers tunnelled requests with the Kubernetes API.
#[derive(Clone)]
pub struct KubeHandler {
    client: kube::Client,
    graph: super::watch_graph::Settings,
    /// The configuration kas sent (this agent's id, for `WorkspaceRequest`), once
    /// [`KubeHandler::set_config`] gave it.
    services: std::sync::Arc<super::workspace_traffic::ServiceCache>,
    config: std::sync::Arc<
        std::sync::OnceLock<tokio::sync::watch::Receiver<Option<super::AgentConfig>>>,
    >,
}

impl KubeHandler {
    /// Use `client` for every request.
    pub fn new(client: kube::Client) -> KubeHandler {
        KubeHandler {
            client,
            graph: super::watch_graph::Settings::default(),
            services: Default::default(),
            config: Default::default(),
        }
    }

    /// Where this agent's configuration (its id) comes from: [`super::Agentk::config`].
    /// Set once; later calls are ignored.
    pub fn set_config(&self, config: tokio::sync::watch::Receiver<Option<super::AgentConfig>>) {
        let _ = self.config.set(config);
    }

    /// This agent's id, once kas sent its configuration.
    fn agent_id(&self) -> Option<i64> {
        self.config.get()?.borrow().as_ref().map(|c| c.agent_id)
    }

    /// Use `settings` for Graph API watches.
    pub fn with_graph_settings(mut self, settings: super::watch_graph::Settings) -> KubeHandler {
        self.graph = settings;
        self
    }

    /// The pods in `namespace` (all when empty).
    pub async fn pods(&self, namespace: &str) -> Result<Vec<Pod>, Status> {
        let api: Api<KubePod> = if namespace.is_empty() {
            Api::all(self.client.clone())
        } else {
            Api::namespaced(self.client.clone(), namespace)
        };
        let mut pods = Vec::new();
        let mut params = ListParams::default().limit(PAGE);
        loop {
            let list = api.list(&params).await.map_err(kube_status)?;
            pods.extend(list.items.into_iter().map(|p| Pod {
                namespace: p.metadata.namespace.unwrap_or_default(),
                name: p.metadata.name.unwrap_or_default(),
            }));
            match list.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(pods),
            }
        }
    }
}

/// A Kubernetes API failure as a gRPC status kas can pass on.
fn kube_status(e: kube::Error) -> Status {
    match &e {
        kube::Error::Api(s) => {
            let message = format!("kubernetes: {}", s.message);
            match s.code {
                401 => Status::unauthenticated(message),
                403 => Status::permission_denied(message),
                404 => Status::not_found(message),
                410 => Status::out_of_range(message),
                429 => Status::resource_exhausted(message),
                _ => Status::unavailable(message),
            }
        }
        _ => {
            tracing::warn!(error = %e, "kubernetes API unreachable");
            Status::unavailable("kubernetes API unreachable")
        }
    }
}

impl KubeHandler {
    /// The client every request uses.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }
}

impl Handler for KubeHandler {
    fn streams_requests(&self, method: &str) -> bool {
        method == MAKE_REQUEST
    }

    fn kubernetes_version(
        &self,
    ) -> futures_util::future::BoxFuture<'static, Option<KubernetesVersion>> {
        let client = self.client.clone();
        Box::pin(async move {
            match client.apiserver_version().await {
                Ok(v) => Some(KubernetesVersion {
                    major: v.major,
                    minor: v.minor,
                    git_version: v.git_version,
                    platform: v.platform,
                }),
                Err(e) => {
                    tracing::warn!(error = %e, "Failed to fetch Kubernetes version");
                    None
                }
            }
        })
    }

    fn call(&self, call: Call) -> Responses {
        if call.method == MAKE_REQUEST {
            return super::make_request::make_request(self.client.clone(), call.requests);
        }
        self.handle(call.method, Vec::new())
    }

    fn handle(&self, method: String, payload: Vec<u8>) -> Responses {
        match method.as_str() {
            WORKSPACE_REQUEST => super::workspace_traffic::workspace_request(
                self.client.clone(),
                self.services.clone(),
                self.agent_id(),
                payload,
            ),
            WATCH_GRAPH => {
                super::watch_graph::watch_graph(self.client.clone(), payload, self.graph.clone())
            }
            _ => {
                let this = self.clone();
                unary(async move {
                    match method.as_str() {
                        GET_PODS => {
                            let req = GetPodsRequest::decode(payload.as_slice()).map_err(|_| {
                                Status::invalid_argument("undecodable GetPods request")
                            })?;
                            let pods = this.pods(&req.namespace).await?;
                            Ok(GetPodsResponse {
                                pods,
                                connection_id: 0,
                            }
                            .encode_to_vec())
                        }
                        other => Err(Status::unimplemented(format!(
                            "agentk does not serve {other:?}"
                        ))),
                    }
                })
            }
        }
    }
}
