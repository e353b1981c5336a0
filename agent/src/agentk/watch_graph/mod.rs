//! `WatchGraph`: the Graph API's watch, evaluated in agentk (seed 003). Being built
//! (issue 12).

use tonic::Status;

use super::tunnels::Responses;

/// Answer one tunnelled `WatchGraph` (an encoded
/// [`crate::proto::kubernetes_api::WatchGraphRequest`]) with a stream of encoded
/// [`crate::proto::kubernetes_api::WatchGraphResponse`] batches.
pub fn watch_graph(_client: kube::Client, _payload: Vec<u8>) -> Responses {
    Box::pin(futures_util::stream::once(async {
        Err(Status::unimplemented("WatchGraph is not served yet"))
    }))
}
