//! A workspace request through its agent's reverse tunnel (`WorkspaceRequest`), the
//! answer streamed back.

use http::header;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Limited};
use hyper::body::Incoming;
use prost::Message as _;

use super::super::k8s_proxy::BoxBody;
use super::super::k8s_proxy::forward::{self, HeaderError};
use super::WorkspacesServer;
use super::authorize::Authorized;
use super::refusal::{Refusal, tunnel_refusal};
use podgate_agent::proto::kubernetes_api::{HttpRequest, WorkspaceRequest};

impl WorkspacesServer {
    /// Send the request to the workspace through agent `agent_id`'s tunnel and
    /// stream its answer back.
    pub(super) async fn forward(
        &self,
        req: Request<Incoming>,
        agent_id: i64,
        name: &str,
        ok: Authorized,
    ) -> Result<Response<BoxBody>, Refusal> {
        let (parts, body) = req.into_parts();
        let path = parts
            .uri
            .path_and_query()
            .map_or("/".to_owned(), |p| p.as_str().to_owned());
        let mut headers = parts.headers.clone();
        // The user's credentials stay here; Host goes on (the editor builds URLs).
        headers.remove(header::AUTHORIZATION);
        podgate_agent::httpz::drop_hop_by_hop(&mut headers);
        if !headers.contains_key(header::HOST)
            && let Some(a) = parts.uri.authority()
            && let Ok(v) = HeaderValue::from_str(a.as_str())
        {
            headers.insert(header::HOST, v);
        }
        headers.append(header::VIA, self.via.clone());
        let body = match Limited::new(body, self.config.max_request_body)
            .collect()
            .await
        {
            Ok(b) => b.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return Err(Refusal::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "REQUEST_TOO_LARGE",
                    format!(
                        "request body is larger than {} bytes",
                        self.config.max_request_body
                    ),
                )
                .counted("too_large"));
            }
            Err(e) => {
                return Err(Refusal::bad_gateway(format!(
                    "reading the request body: {e}"
                )));
            }
        };
        let request = WorkspaceRequest {
            workspace_id: ok.workspace_id,
            workspace_name: name.to_owned(),
            port: ok.port,
            request: Some(HttpRequest {
                method: parts.method.as_str().to_owned(),
                path,
                headers: forward::to_proto(&headers),
                body: body.to_vec(),
            }),
        };
        let call = |s: tonic::Status| tunnel_refusal(s, agent_id, name);
        let mut routed = self
            .router
            .open(
                agent_id,
                0,
                podgate_agent::tunnel::WORKSPACE_REQUEST,
                request.encode_to_vec(),
            )
            .await
            .map_err(call)?;
        let header = forward::response_header(&mut routed)
            .await
            .map_err(|e| match e {
                HeaderError::Call(s) => call(s),
                HeaderError::Protocol(why) => Refusal::bad_gateway(why),
            })?;
        forward::streamed_response(header, routed, &self.via, &[]).map_err(Refusal::bad_gateway)
    }
}
