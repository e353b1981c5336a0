//! A proxied Kubernetes API request as one `KubernetesApi/MakeRequest` call in
//! GitLab's HTTP-over-gRPC framing, as GitLab's kas pipes it (`pipeStreams` and
//! `mergeProxiedResponseHeaders` in `internal/module/kubernetes_api/server/proxy.go`;
//! `InboundHttpToOutboundGrpc` in `internal/tool/grpctool/inbound_http_to_outbound_grpc.go`):
//! <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/tool/grpctool/inbound_http_to_outbound_grpc.go>,
//! <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/module/kubernetes_api/server/proxy.go>.
//!
//! 1. kas sends `grpctool.HttpRequest` frames: `Header` (`prototool.HttpRequest` with
//!    the method, the headers under Go's canonical names, the path after the prefix
//!    (its last `/` kept) and the query as a map; `extra`: a
//!    `kubernetes_api.rpc.HeaderExtra` in an `Any` when access is as a user;
//!    `content_length`: the `Content-Length`, -1 for a chunked body, 0 for none),
//!    the body as `Data` frames of at most 32 KiB as it arrives (more than
//!    `max_request_body` bytes: 413), `Trailer`; then, unless the request asks for
//!    an upgrade, it half-closes.
//! 2. Headers sent: GitLab's credentials (`Authorization`, `Cookie`,
//!    `Gitlab-Agent-Id`, `X-Csrf-Token`; the `gitlab-agent-id`, `gitlab-csrf-token`
//!    query parameters), `Host` and hop-by-hop headers removed, kas's `Via` appended;
//!    an `Upgrade` request keeps `Upgrade` and gets `Connection: upgrade`
//!    (`cleanHeader`).
//! 3. The answer is `grpctool.HttpResponse` frames: `Header` first (the status; the
//!    headers cleaned the same way, CORS headers removed, `Via` appended), `Data`
//!    streamed to the client as it comes (a watch runs as long as the client stays),
//!    `Trailer`, the end. An upgrade request whose answer is not 101 half-closes
//!    after the answer.
//! 4. An upgrade answered 101: the client's connection is upgraded (hyper's
//!    upgrade) and, after agentk's `Trailer`, bytes flow both ways as `UpgradeData`
//!    ([`pump_upgraded`]).
//!
//! A call that fails before agentk's header is a 502 "HTTP->gRPC: failed to read
//! gRPC response: rpc error: code = … desc = …", as kas answers; one that fails after
//! it aborts the connection, the only way left to tell the client.

use bytes::Bytes;
use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use prost::Message as _;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

use super::K8sProxy;
use super::auth::Identity;
use super::creds::{AGENT_ID_HEADER, AGENT_ID_PARAM, CSRF_HEADER, CSRF_PARAM};
use super::status::ErrResp;
use super::status::grpc_error;
use crate::http_server::{BoxBody, SyncBody, empty_body};
use crate::routing::Routed;
use crate::tunnel::{Frame as TunnelFrame, Meta};
use podgate_agent::httpz::{drop_hop_by_hop, from_values, parse_query, to_values};
use podgate_agent::proto::gitlab::agent::grpctool::{
    HttpRequest, HttpResponse, http_request, http_response,
};
use podgate_agent::proto::gitlab::agent::prototool;
use podgate_agent::proto::kubernetes_api::HeaderExtra;

/// The most body bytes one `Data` or `UpgradeData` frame carries (GitLab's 32 KiB
/// buffers, `memz.Get32k`).
pub(crate) const CHUNK: usize = 32 << 10;

/// `HeaderExtra`'s protobuf full name, for its `Any`.
pub(crate) const HEADER_EXTRA: &str = "gitlab.agent.kubernetes_api.rpc.HeaderExtra";

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
    mut req: Request<Incoming>,
    identity: Identity,
) -> Result<Response<BoxBody>, ErrResp> {
    let is_upgrade = req.headers().contains_key(header::UPGRADE);
    let on_upgrade = is_upgrade.then(|| hyper::upgrade::on(&mut req));
    let (parts, mut body) = req.into_parts();
    let content_length = content_length(&parts.headers);
    let too_large = || {
        ErrResp::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "Request body is larger than {} bytes",
                proxy.config.max_request_body
            ),
        )
    };
    if usize::try_from(content_length).is_ok_and(|n| n > proxy.config.max_request_body) {
        return Err(too_large());
    }
    let header = http_request::Header {
        request: Some(prototool::HttpRequest {
            method: parts.method.as_str().to_owned(),
            header: to_values(&forwarded_headers(&parts.headers, &proxy.via)),
            url_path: parts.uri.path()[proxy.config.url_prefix.len() - 1..].to_owned(),
            query: forwarded_query(parts.uri.query().unwrap_or("")),
        }),
        extra: identity.impersonation.map(|imp| {
            podgate_agent::any::pack(
                HEADER_EXTRA,
                &HeaderExtra {
                    imp_config: Some(imp),
                },
            )
        }),
        content_length: Some(content_length),
    };
    let mut routed = proxy
        .router
        .call(
            identity.agent_id,
            0,
            podgate_agent::tunnel::MAKE_REQUEST,
            &Meta::new(),
        )
        .await
        .map_err(grpc_error)?;
    send(&routed, http_request::Message::Header(header)).await?;
    let mut sent = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            ErrResp::with_cause(
                StatusCode::BAD_GATEWAY,
                "HTTP->gRPC: failed to read request body",
                e.to_string(),
            )
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        sent += data.len();
        if sent > proxy.config.max_request_body {
            return Err(too_large());
        }
        for chunk in data.chunks(CHUNK) {
            let data = http_request::Data {
                data: chunk.to_vec(),
            };
            send(&routed, http_request::Message::Data(data)).await?;
        }
    }
    send(
        &routed,
        http_request::Message::Trailer(http_request::Trailer {}),
    )
    .await?;
    if !is_upgrade {
        routed.close_send().await.map_err(grpc_error)?;
    }
    let head = match next_response(&mut routed).await.map_err(grpc_error)? {
        Some(http_response::Message::Header(h)) => h.response.unwrap_or_default(),
        Some(_) => return Err(protocol_error("agentk's first message is not a Header")),
        None => return Err(protocol_error("agentk sent no response header")),
    };
    let status = u16::try_from(head.status_code)
        .ok()
        .and_then(|s| StatusCode::from_u16(s).ok())
        .ok_or_else(|| protocol_error(&format!("invalid HTTP status {}", head.status_code)))?;
    let mut headers = from_values(&head.header);
    clean_header(&mut headers);
    for name in &CORS_HEADERS {
        headers.remove(name);
    }
    headers.append(header::VIA, proxy.via.clone());
    let switching = status == StatusCode::SWITCHING_PROTOCOLS;
    let body = match on_upgrade {
        Some(on_upgrade) if switching => {
            tokio::spawn(async move {
                match on_upgrade.await {
                    Ok(upgraded) => {
                        if let Err(why) = pump_upgraded(TokioIo::new(upgraded), routed).await {
                            tracing::debug!(reason = %why, "k8s proxy: upgraded connection ended");
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "k8s proxy: the client's upgrade failed"),
                }
            });
            empty_body()
        }
        _ => response_body(routed, is_upgrade),
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    Ok(resp)
}

/// What the request's body is as GitLab's `http.Request.ContentLength` has it: the
/// `Content-Length`, -1 when chunked (unknown), 0 for none.
fn content_length(headers: &HeaderMap) -> i64 {
    if let Some(n) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.trim().parse::<i64>().ok())
    {
        return n;
    }
    if headers.contains_key(header::TRANSFER_ENCODING) {
        -1
    } else {
        0
    }
}

async fn send(routed: &Routed, msg: http_request::Message) -> Result<(), ErrResp> {
    let frame = HttpRequest { message: Some(msg) };
    routed.send(frame.encode_to_vec()).await.map_err(grpc_error)
}

/// agentk's next `HttpResponse` frame; `None` at the call's OK end.
async fn next_response(
    routed: &mut Routed,
) -> Result<Option<http_response::Message>, tonic::Status> {
    let Some(m) = routed.message().await? else {
        return Ok(None);
    };
    match HttpResponse::decode(m.as_slice()) {
        Ok(HttpResponse { message: Some(m) }) => Ok(Some(m)),
        Ok(HttpResponse { message: None }) => {
            Err(tonic::Status::internal("agentk sent an empty HttpResponse"))
        }
        Err(e) => Err(tonic::Status::internal(format!(
            "undecodable HttpResponse: {e}"
        ))),
    }
}

/// The body of an answer that is not an upgrade: `Data` frames until `Trailer`,
/// then the call's end; an upgrade request refused (not 101) half-closes then.
fn response_body(routed: Routed, close_after: bool) -> BoxBody {
    let frames = futures_util::stream::unfold(Some(routed), move |routed| async move {
        let mut routed = routed?;
        loop {
            let fail = |why: String| Some((Err(std::io::Error::other(why)), None));
            match next_response(&mut routed).await {
                Ok(Some(http_response::Message::Data(d))) if !d.data.is_empty() => {
                    return Some((Ok(Frame::data(Bytes::from(d.data))), Some(routed)));
                }
                Ok(Some(http_response::Message::Data(_))) => {}
                Ok(Some(http_response::Message::Trailer(_))) => {
                    if close_after {
                        let _ = routed.close_send().await;
                    }
                }
                Ok(Some(other)) => {
                    return fail(format!("agentk sent {other:?} in a response body"));
                }
                Ok(None) => return None,
                Err(status) => {
                    tracing::debug!(code = ?status.code(), message = status.message(), "the tunnelled response broke off");
                    return fail(status.message().to_owned());
                }
            }
        }
    });
    BoxBody::new(SyncBody(std::sync::Mutex::new(Box::pin(StreamBody::new(
        frames,
    )))))
}

/// Bytes both ways on an upgraded connection, as GitLab's `pipeUpgradedConnection`:
/// agentk's frames up to its `Trailer` (`Data` before it is written to the client
/// too), then the client's bytes go to agentk as `UpgradeData` and agentk's
/// `UpgradeData` to the client. The client closing its side half-closes the call
/// (`CloseSend`) while agentk's bytes still flow; the call's end closes the client's
/// connection (after a write shutdown, so the client sees the end of the stream).
/// `Err` says why it ended early.
pub(crate) async fn pump_upgraded<C>(conn: C, mut routed: Routed) -> Result<(), String>
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let (mut rd, mut wr) = tokio::io::split(conn);
    let mut upgraded = false;
    let mut client_open = true;
    let mut buf = vec![0u8; CHUNK];
    let result = loop {
        tokio::select! {
            n = rd.read(&mut buf), if upgraded && client_open => match n {
                Ok(0) => {
                    client_open = false;
                    let _ = routed.close_send().await;
                }
                Ok(n) => {
                    let data = http_request::UpgradeData { data: buf[..n].to_vec() };
                    let frame = HttpRequest { message: Some(http_request::Message::UpgradeData(data)) };
                    let _ = routed.send(frame.encode_to_vec()).await;
                }
                Err(e) => break Err(format!("reading the client: {e}")),
            },
            frame = routed.next() => {
                let m = match frame {
                    Ok(Some(TunnelFrame::Message(m))) => m,
                    Ok(Some(_)) => continue,
                    Ok(None) => break Ok(()),
                    Err(s) => break Err(format!("agentk's call: {}", s.message())),
                };
                let data = match HttpResponse::decode(m.as_slice()).map(|r| r.message) {
                    Ok(Some(http_response::Message::Trailer(_))) if !upgraded => {
                        upgraded = true;
                        continue;
                    }
                    Ok(Some(http_response::Message::Data(d))) if !upgraded => d.data,
                    Ok(Some(http_response::Message::UpgradeData(d))) if upgraded => d.data,
                    other => break Err(format!("agentk sent {other:?} on an upgraded connection")),
                };
                if let Err(e) = wr.write_all(&data).await {
                    break Err(format!("writing the client: {e}"));
                }
            }
        }
    };
    let _ = wr.shutdown().await;
    result
}

/// The query agentk gets: the credential parameters removed, the others decoded
/// into the protocol's map.
fn forwarded_query(query: &str) -> std::collections::HashMap<String, prototool::Values> {
    let mut q = parse_query(query);
    q.remove(AGENT_ID_PARAM);
    q.remove(CSRF_PARAM);
    q
}

/// The request headers agentk sends on: credentials and `Host` removed, cleaned
/// ([`clean_header`]), kas's `Via` appended.
fn forwarded_headers(headers: &HeaderMap, via: &HeaderValue) -> HeaderMap {
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
    clean_header(&mut h);
    h.append(header::VIA, via.clone());
    h
}

/// GitLab's `cleanHeader`: hop-by-hop headers (and those `Connection` names)
/// removed; if `Upgrade` was there, it is put back with `Connection: upgrade`.
pub(crate) fn clean_header(headers: &mut HeaderMap) {
    let upgrade: Vec<HeaderValue> = headers.get_all(header::UPGRADE).iter().cloned().collect();
    drop_hop_by_hop(headers);
    if !upgrade.is_empty() {
        for v in upgrade {
            headers.append(header::UPGRADE, v);
        }
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

fn protocol_error(why: &str) -> ErrResp {
    grpc_error(tonic::Status::internal(why.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_parameters_are_stripped_the_others_kept() {
        let q = forwarded_query(
            "watch=1&gitlab-agent-id=4&labelSelector=a%3Db&gitlab%2Dcsrf%2Dtoken=x&gitlab-csrf-token=y",
        );
        let mut keys: Vec<&str> = q.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["labelSelector", "watch"]);
        assert_eq!(q["labelSelector"].value, ["a=b"]);
    }

    #[test]
    fn credential_and_hop_headers_are_stripped_via_added_upgrade_kept() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("authorization", "Bearer pat:1:glpat-x"),
            ("cookie", "_gitlab_kas=s"),
            ("gitlab-agent-id", "1"),
            ("x-csrf-token", "c"),
            ("host", "kas"),
            ("connection", "keep-alive, x-hop, Upgrade"),
            ("x-hop", "1"),
            ("te", "trailers"),
            ("accept", "application/json"),
            ("via", "1.1 podgate-proxy"),
        ] {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        let out = to_values(&forwarded_headers(
            &h,
            &HeaderValue::from_static("gRPC/1.0 kas"),
        ));
        let mut names: Vec<&str> = out.keys().map(String::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["Accept", "Via"], "{out:?}");
        assert_eq!(out["Via"].value, ["1.1 podgate-proxy", "gRPC/1.0 kas"]);
        h.append(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
        let out = to_values(&forwarded_headers(
            &h,
            &HeaderValue::from_static("gRPC/1.0 kas"),
        ));
        assert_eq!(out["Upgrade"].value, ["SPDY/3.1"]);
        assert_eq!(out["Connection"].value, ["upgrade"]);
    }

    #[test]
    fn content_length_is_gos() {
        let mut h = HeaderMap::new();
        assert_eq!(content_length(&h), 0);
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        assert_eq!(content_length(&h), -1);
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("12"));
        assert_eq!(content_length(&h), 12);
    }
}
