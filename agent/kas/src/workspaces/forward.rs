//! A workspace request through its agent's reverse tunnel (`WorkspaceRequest`), the
//! answer streamed back.

use bytes::Bytes;
use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use prost::Message as _;

use super::WorkspacesServer;
use super::authorize::Authorized;
use super::refusal::{Refusal, tunnel_refusal};
use crate::http_server::{BoxBody, SyncBody};
use crate::routing::Routed;
use podgate_agent::proto::kubernetes_api::{
    Header, HttpRequest, HttpResponseHeader, HttpResponsePart, WorkspaceRequest, http_response_part,
};

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
                headers: to_proto(&headers),
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
        let header = response_header(&mut routed).await.map_err(|e| match e {
            HeaderError::Call(s) => call(s),
            HeaderError::Protocol(why) => Refusal::bad_gateway(why),
        })?;
        streamed_response(header, routed, &self.via, &[]).map_err(Refusal::bad_gateway)
    }
}

/// Why agentk's answer has no response header.
enum HeaderError {
    /// The call failed (routing, or agentk's status).
    Call(tonic::Status),
    /// agentk sent something else.
    Protocol(String),
}

/// The first message of the routed answer: the response header.
async fn response_header(routed: &mut Routed) -> Result<HttpResponseHeader, HeaderError> {
    let first = routed
        .message()
        .await
        .map_err(HeaderError::Call)?
        .ok_or_else(|| HeaderError::Protocol("agentk sent no response header".into()))?;
    match HttpResponsePart::decode(first.as_slice()) {
        Ok(HttpResponsePart {
            part: Some(http_response_part::Part::Header(h)),
        }) => Ok(h),
        Ok(_) => Err(HeaderError::Protocol(
            "agentk's first message is not a header".into(),
        )),
        Err(e) => Err(HeaderError::Protocol(format!(
            "undecodable HttpResponsePart: {e}"
        ))),
    }
}

/// Headers as the tunnel's request message carries them.
fn to_proto(headers: &HeaderMap) -> Vec<Header> {
    headers
        .keys()
        .map(|name| Header {
            name: name.as_str().to_owned(),
            values: headers
                .get_all(name)
                .iter()
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .collect(),
        })
        .collect()
}

/// The client's response: agentk's status and headers (hop-by-hop ones and `drop`
/// removed, kas's `Via` appended), then the body chunks as they come; `Err` names
/// an invalid status.
fn streamed_response(
    header: HttpResponseHeader,
    routed: Routed,
    via: &HeaderValue,
    drop: &[HeaderName],
) -> Result<Response<BoxBody>, String> {
    let status = u16::try_from(header.status)
        .ok()
        .and_then(|s| StatusCode::from_u16(s).ok())
        .ok_or_else(|| format!("invalid HTTP status {}", header.status))?;
    let mut upstream = HeaderMap::new();
    for h in &header.headers {
        let Ok(name) = HeaderName::from_bytes(h.name.as_bytes()) else {
            continue;
        };
        for v in &h.values {
            if let Ok(v) = HeaderValue::from_str(v) {
                upstream.append(name.clone(), v);
            }
        }
    }
    podgate_agent::httpz::drop_hop_by_hop(&mut upstream);
    for name in drop {
        upstream.remove(name);
    }
    upstream.append(header::VIA, via.clone());
    let body = futures_util::stream::unfold(Some(routed), |routed| async move {
        let mut routed = routed?;
        loop {
            match routed.message().await {
                Ok(None) => return None,
                Ok(Some(m)) => match HttpResponsePart::decode(m.as_slice()) {
                    Ok(HttpResponsePart {
                        part: Some(http_response_part::Part::Data(d)),
                    }) => {
                        if d.is_empty() {
                            continue;
                        }
                        return Some((Ok(Frame::data(Bytes::from(d))), Some(routed)));
                    }
                    _ => {
                        return Some((
                            Err(std::io::Error::other(
                                "agentk sent a message that is not data",
                            )),
                            None,
                        ));
                    }
                },
                Err(status) => {
                    tracing::debug!(code = ?status.code(), message = status.message(), "the tunnelled response broke off");
                    return Some((
                        Err(std::io::Error::other(status.message().to_owned())),
                        None,
                    ));
                }
            }
        }
    });
    let mut resp = Response::new(BoxBody::new(SyncBody(std::sync::Mutex::new(Box::pin(
        StreamBody::new(body),
    )))));
    *resp.status_mut() = status;
    *resp.headers_mut() = upstream;
    Ok(resp)
}
