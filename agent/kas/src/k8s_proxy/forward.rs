//! The answer to a routed call in podgate's own `HttpResponsePart` framing (kas's
//! Workspaces server, `kas::workspaces`): one `HttpResponseHeader`, then `data`
//! chunks streamed to the client as they arrive; and the 502 kas answers when a call
//! fails before the header, as GitLab's kas does
//! (`handleIoError("failed to read gRPC response", err)` in
//! `internal/tool/grpctool/inbound_http_to_outbound_grpc.go`):
//! <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/tool/grpctool/inbound_http_to_outbound_grpc.go>.
//! The Kubernetes API proxy's own requests are `make_request`'s.

use bytes::Bytes;
use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use http_body_util::StreamBody;
use hyper::body::Frame;
use prost::Message as _;

use super::BoxBody;
use super::status::ErrResp;
use crate::routing::Routed;
use podgate_agent::proto::kubernetes_api::{
    Header, HttpResponseHeader, HttpResponsePart, http_response_part,
};

/// Why agentk's answer has no response header.
pub(crate) enum HeaderError {
    /// The call failed (routing, or agentk's status).
    Call(tonic::Status),
    /// agentk sent something else.
    Protocol(String),
}

/// The first message of a routed `MakeRequest`-shaped answer: the response header
/// (also the Workspaces server's, `kas::workspaces`).
pub(crate) async fn response_header(
    routed: &mut Routed,
) -> Result<HttpResponseHeader, HeaderError> {
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
pub(crate) fn to_proto(headers: &HeaderMap) -> Vec<Header> {
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
pub(crate) fn streamed_response(
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

/// Makes a `Send` body `Sync`, as [`BoxBody`] wants: it is only ever polled through
/// `&mut`, so the mutex is never locked.
pub(crate) struct SyncBody<B>(pub(crate) std::sync::Mutex<std::pin::Pin<Box<B>>>);

impl<B: hyper::body::Body> hyper::body::Body for SyncBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let inner = self
            .get_mut()
            .0
            .get_mut()
            .unwrap_or_else(|e| e.into_inner());
        inner.as_mut().poll_frame(cx)
    }
}

/// A routing or agentk error before the response header: 502, as kas answers
/// (`handleIoError("failed to read gRPC response", err)`), with gRPC's error text.
pub(super) fn grpc_error(status: tonic::Status) -> ErrResp {
    ErrResp::with_cause(
        StatusCode::BAD_GATEWAY,
        "HTTP->gRPC: failed to read gRPC response",
        format!(
            "rpc error: code = {:?} desc = {}",
            status.code(),
            status.message()
        ),
    )
}
