//! `MakeRequest`: the Kubernetes API proxy's requests, made against the cluster's
//! API server (kas → tunnel → here). Being built (issue 12).

use tonic::Status;

use super::tunnels::Responses;

/// Answer one tunnelled `MakeRequest` (an encoded
/// [`crate::proto::kubernetes_api::HttpRequest`]).
pub fn make_request(_client: kube::Client, _payload: Vec<u8>) -> Responses {
    Box::pin(futures_util::stream::once(async {
        Err(Status::unimplemented("MakeRequest is not served yet"))
    }))
}
