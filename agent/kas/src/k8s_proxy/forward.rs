//! A proxied Kubernetes API request as one `MakeRequest` tunnel call, as GitLab's
//! kas pipes it (`pipeStreams` and `mergeProxiedResponseHeaders` in
//! `internal/module/kubernetes_api/server/proxy.go`; `cleanHeader` and the error
//! answers of `internal/tool/grpctool/inbound_http_to_outbound_grpc.go`):
//!
//! - the path after the prefix (its last `/` kept); GitLab's credentials removed from
//!   the headers (`Authorization`, `Cookie`, `Gitlab-Agent-Id`, `X-Csrf-Token`) and
//!   the query (`gitlab-agent-id`, `gitlab-csrf-token`; the other parameters are
//!   kept as sent); `Host` and hop-by-hop headers removed; kas's `Via` appended;
//! - the body read whole (at most `max_request_body`, else 413);
//! - the response: agentk's header first (status and headers, hop-by-hop ones and
//!   any CORS headers removed, kas's CORS headers kept, `Vary` merged, `Via`
//!   appended), then each `data` chunk sent on as it arrives, so a watch streams
//!   for as long as the client keeps it open. A client that goes away drops the
//!   routed call, which cancels it at agentk.
//!
//! A call that fails before agentk's header is a 502 "HTTP->gRPC: failed to read
//! gRPC response: rpc error: code = … desc = …" (an agent that never connects ends
//! as `DeadlineExceeded`), as kas answers; one that fails after it aborts the
//! connection, the only way left to tell the client.
//!
//! Upgrades (`kubectl exec`, port-forward) are not carried by `MakeRequest`: the
//! `Upgrade` header is dropped with the other hop-by-hop headers.

use bytes::Bytes;
use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use prost::Message as _;

use super::auth::Identity;
use super::creds::{AGENT_ID_HEADER, AGENT_ID_PARAM, CSRF_HEADER, CSRF_PARAM};
use super::status::ErrResp;
use super::{BoxBody, K8sProxy};
use crate::routing::Routed;
use podgate_agent::httpz::query_unescape;
use podgate_agent::proto::kubernetes_api::{
    Header, HttpRequest, HttpResponseHeader, HttpResponsePart, http_response_part,
};

/// CORS headers an upstream answer may not set (kas sets its own).
const CORS_HEADERS: [HeaderName; 5] = [
    header::ACCESS_CONTROL_ALLOW_ORIGIN,
    header::ACCESS_CONTROL_ALLOW_HEADERS,
    header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
    header::ACCESS_CONTROL_ALLOW_METHODS,
    header::ACCESS_CONTROL_MAX_AGE,
];

/// Send `req` to `identity`'s agent and stream its answer back.
pub(super) async fn make_request(
    proxy: &K8sProxy,
    req: Request<Incoming>,
    identity: Identity,
) -> Result<Response<BoxBody>, ErrResp> {
    let (parts, body) = req.into_parts();
    let path = forwarded_path(&parts.uri, &proxy.config.url_prefix);
    let headers = forwarded_headers(&parts.headers, &proxy.via);
    let body = match Limited::new(body, proxy.config.max_request_body)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(ErrResp::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "Request body is larger than {} bytes",
                    proxy.config.max_request_body
                ),
            ));
        }
        Err(e) => {
            return Err(ErrResp::with_cause(
                StatusCode::BAD_GATEWAY,
                "HTTP->gRPC: failed to read request body",
                e.to_string(),
            ));
        }
    };
    let request = HttpRequest {
        method: parts.method.as_str().to_owned(),
        path,
        headers,
        body: body.to_vec(),
        impersonation: identity.impersonation,
    };
    let mut routed = proxy
        .router
        .open(
            identity.agent_id,
            0,
            podgate_agent::tunnel::MAKE_REQUEST,
            request.encode_to_vec(),
        )
        .await
        .map_err(grpc_error)?;
    let header = response_header(&mut routed).await.map_err(|e| match e {
        HeaderError::Call(s) => grpc_error(s),
        HeaderError::Protocol(why) => protocol_error(&why),
    })?;
    streamed_response(header, routed, &proxy.via, &CORS_HEADERS).map_err(|why| protocol_error(&why))
}

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

/// The path and query agentk requests: after the prefix (its last `/` kept), the
/// credential parameters removed, the others as sent.
fn forwarded_path(uri: &http::Uri, prefix: &str) -> String {
    let path = &uri.path()[prefix.len() - 1..];
    let query: Vec<&str> = uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .filter(|pair| {
            let key = pair.split_once('=').map_or(*pair, |(k, _)| k);
            !query_unescape(key).is_some_and(|k| k == AGENT_ID_PARAM || k == CSRF_PARAM)
        })
        .collect();
    if query.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", query.join("&"))
    }
}

/// The request headers agentk sends on: credentials, `Host` and hop-by-hop headers
/// removed, kas's `Via` appended.
fn forwarded_headers(headers: &HeaderMap, via: &HeaderValue) -> Vec<Header> {
    let mut h = headers.clone();
    for name in [
        header::AUTHORIZATION.as_str(),
        header::COOKIE.as_str(),
        AGENT_ID_HEADER,
        CSRF_HEADER,
        header::HOST.as_str(),
    ] {
        h.remove(name);
    }
    podgate_agent::httpz::drop_hop_by_hop(&mut h);
    h.append(header::VIA, via.clone());
    to_proto(&h)
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
struct SyncBody<B>(std::sync::Mutex<std::pin::Pin<Box<B>>>);

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
fn grpc_error(status: tonic::Status) -> ErrResp {
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

fn protocol_error(why: &str) -> ErrResp {
    grpc_error(tonic::Status::internal(why.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_parameters_are_stripped_the_others_kept() {
        let uri: http::Uri =
            "/k8s-proxy/api/v1/pods?watch=1&gitlab-agent-id=4&labelSelector=a%3Db&gitlab%2Dcsrf%2Dtoken=x&gitlab-csrf-token=y"
                .parse()
                .unwrap();
        assert_eq!(
            forwarded_path(&uri, "/k8s-proxy/"),
            "/api/v1/pods?watch=1&labelSelector=a%3Db"
        );
        let uri: http::Uri = "/k8s-proxy/?gitlab-agent-id=4".parse().unwrap();
        assert_eq!(forwarded_path(&uri, "/k8s-proxy/"), "/");
    }

    #[test]
    fn credential_and_hop_headers_are_stripped_via_added() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("authorization", "Bearer pat:1:glpat-x"),
            ("cookie", "_gitlab_kas=s"),
            ("gitlab-agent-id", "1"),
            ("x-csrf-token", "c"),
            ("host", "kas"),
            ("connection", "keep-alive, x-hop"),
            ("x-hop", "1"),
            ("te", "trailers"),
            ("accept", "application/json"),
            ("via", "1.1 podgate-proxy"),
        ] {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        let out = forwarded_headers(&h, &HeaderValue::from_static("gRPC/1.0 kas"));
        let mut names: Vec<&str> = out.iter().map(|h| h.name.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["accept", "via"], "{out:?}");
        let via = out.iter().find(|h| h.name == "via").unwrap();
        assert_eq!(via.values, ["1.1 podgate-proxy", "gRPC/1.0 kas"]);
    }
}
