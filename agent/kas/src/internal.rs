//! `KasInternal`: calls another kas routed here, for an agent replica this kas
//! holds a tunnel to.

use tonic::{Request, Response, Status, Streaming};

use super::api::get_pods_response;
use super::routing::{self, Routed};
use podgate_agent::proto::kas_internal_server::KasInternal;
use podgate_agent::proto::{GetPodsRequest, GetPodsResponse};

/// `KasInternal`: calls routed here by another kas, for a replica this kas holds.
pub(super) struct Internal {
    /// Serves calls for the replicas this kas holds.
    pub(super) follower: routing::Follower,
}

#[tonic::async_trait]
impl KasInternal for Internal {
    type CallStream = routing::CallStream;

    async fn call(
        &self,
        request: Request<Streaming<podgate_agent::proto::CallRequest>>,
    ) -> Result<Response<Self::CallStream>, Status> {
        let wait = self.follower.wait(request.metadata());
        self.follower
            .call(request.into_inner(), wait)
            .await
            .map(Response::new)
    }

    /// The unary form older kas instances route `GetPods` with.
    async fn get_pods(
        &self,
        request: Request<GetPodsRequest>,
    ) -> Result<Response<GetPodsResponse>, Status> {
        use prost::Message as _;
        let wait = self.follower.wait(request.metadata());
        let req = request.into_inner();
        let call = self
            .follower
            .open(
                req.agent_id,
                req.connection_id,
                podgate_agent::tunnel::GET_PODS,
                &Default::default(),
                wait,
            )
            .await?;
        let response = Routed::local(call).start(req.encode_to_vec()).await?;
        let connection_id = response.connection_id();
        let payload = response.unary().await?;
        get_pods_response(connection_id, &payload).map(Response::new)
    }
}
