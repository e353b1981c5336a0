//! `KubernetesApi/MakeRequest` in GitLab's HTTP-over-gRPC framing, as GitLab's agentk
//! serves it (`InboundGrpcToOutboundHttp` in
//! `internal/tool/grpctool/inbound_grpc_to_outbound_http.go`, `httpDo` in
//! `internal/module/kubernetes_api/agent/server.go`):
//! <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/tool/grpctool/inbound_grpc_to_outbound_http.go>,
//! <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/module/kubernetes_api/agent/server.go>.
//!
//! - in: `grpctool.HttpRequest` `Header` (the request, the impersonation in `extra`
//!   as a `kubernetes_api.rpc.HeaderExtra`, `content_length`), `Data`*, `Trailer`;
//!   after a 101, `UpgradeData`*. `Data` for a request whose `content_length` is 0,
//!   `UpgradeData` for one that is not an upgrade (its header map has no `Upgrade`
//!   key: `prototool.HttpRequest.IsUpgrade`) or before the 101, are refused.
//! - the request goes to the API server with the agent's own `kube::Client` (its
//!   credentials; `Via: gRPC/1.0 <agentk>` appended; impersonation as
//!   [`super::k8s_api`] decides). kube's client takes a whole body, so agentk reads
//!   the body up to kas's `Trailer` (or the end of kas's frames) before sending it:
//!   kas streams it, agentk does not.
//! - out: `grpctool.HttpResponse` `Header` (status code, Go's status line, the
//!   headers with `Via: <HTTP version> <agentk>` appended), `Data`* as the body
//!   arrives (32 KiB at most each), `Trailer`; for an upgrade answered 101, then
//!   `UpgradeData`* both ways until the API server closes the connection (kas
//!   half-closing does not close it, as GitLab's agentk leaves it open).
//!
//! Errors end the call: a broken frame order with `Internal`, a failed request with
//! the status [`super::k8s_api`] gives it.

use futures_util::StreamExt as _;
use http_body_util::BodyExt as _;
use hyper_util::rt::TokioIo;
use prost::Message as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;
use tonic::Status;

use super::k8s_api::{self, via};
use super::tunnels::{Requests, Responses};
use podgate_agent::httpz::to_values;
use podgate_agent::proto::gitlab::agent::grpctool::{
    HttpRequest, HttpResponse, http_request, http_response,
};
use podgate_agent::proto::gitlab::agent::prototool;
use podgate_agent::proto::kubernetes_api::HeaderExtra;

/// The most bytes one `Data` or `UpgradeData` frame carries (GitLab's 32 KiB
/// buffers).
pub const CHUNK: usize = 32 << 10;

/// `HeaderExtra`'s protobuf full name, for its `Any`.
const HEADER_EXTRA: &str = "gitlab.agent.kubernetes_api.rpc.HeaderExtra";

/// Answer one tunnelled `MakeRequest` whose request frames are `requests`. The
/// response frames come from a task that ends when kas goes away (the returned
/// stream is dropped).
pub fn make_request(client: kube::Client, requests: Requests) -> Responses {
    let (tx, rx) = mpsc::channel::<Result<Vec<u8>, Status>>(16);
    tokio::spawn(async move {
        let served = tokio::select! {
            _ = tx.closed() => return,
            r = serve(client, requests, &tx) => r,
        };
        if let Err(status) = served {
            let _ = tx.send(Err(status)).await;
        }
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

type Out = mpsc::Sender<Result<Vec<u8>, Status>>;

/// Why serving stopped early: kas went away (nothing to tell), or a status for it.
async fn send(out: &Out, m: http_response::Message) -> Result<(), Status> {
    let frame = HttpResponse { message: Some(m) };
    out.send(Ok(frame.encode_to_vec()))
        .await
        .map_err(|_| Status::cancelled("kas went away"))
}

async fn next_frame(requests: &mut Requests) -> Result<Option<http_request::Message>, Status> {
    let Some(m) = requests.next().await else {
        return Ok(None);
    };
    match HttpRequest::decode(m.as_slice()) {
        Ok(HttpRequest { message: Some(m) }) => Ok(Some(m)),
        Ok(HttpRequest { message: None }) => Err(Status::internal("empty HttpRequest frame")),
        Err(e) => Err(Status::invalid_argument(format!(
            "undecodable HttpRequest frame: {e}"
        ))),
    }
}

async fn serve(client: kube::Client, mut requests: Requests, out: &Out) -> Result<(), Status> {
    let header = match next_frame(&mut requests).await? {
        Some(http_request::Message::Header(h)) => h,
        other => {
            return Err(Status::internal(format!(
                "expected an HttpRequest Header first, got {other:?}"
            )));
        }
    };
    let request = header.request.clone().unwrap_or_default();
    let is_upgrade = request.header.contains_key("Upgrade");
    let without_body = header.content_length == Some(0);
    let mut body = Vec::new();
    loop {
        match next_frame(&mut requests).await? {
            Some(http_request::Message::Data(d)) => {
                if without_body {
                    return Err(Status::internal(
                        "unexpected HttpRequest_Data message received",
                    ));
                }
                body.extend_from_slice(&d.data);
            }
            Some(http_request::Message::Trailer(_)) | None => break,
            Some(http_request::Message::UpgradeData(_)) if !is_upgrade => {
                return Err(Status::internal(
                    "unexpected HttpRequest_UpgradeData message for non-upgrade request",
                ));
            }
            Some(other) => {
                return Err(Status::internal(format!(
                    "unexpected {other:?} before the request's Trailer"
                )));
            }
        }
    }
    let imp = match &header.extra {
        Some(any) => {
            podgate_agent::any::unpack::<HeaderExtra>(any, HEADER_EXTRA)
                .map_err(|e| Status::invalid_argument(format!("MakeRequest header extra: {e}")))?
                .imp_config
        }
        None => None,
    };
    let req = k8s_api::build(&request, imp.as_ref(), body)?;
    let mut resp = client.send(req).await.map_err(|e| {
        tracing::warn!(error = %e, "kubernetes API request failed");
        Status::unavailable(format!("gRPC -> HTTP: kubernetes API request failed: {e}"))
    })?;
    let status = resp.status();
    let mut headers = resp.headers().clone();
    headers.append(http::header::VIA, via(resp.version()));
    let head = http_response::Header {
        response: Some(prototool::HttpResponse {
            status_code: i32::from(status.as_u16()),
            status: format!(
                "{} {}",
                status.as_u16(),
                status.canonical_reason().unwrap_or("")
            ),
            header: to_values(&headers),
        }),
    };
    send(out, http_response::Message::Header(head)).await?;
    if is_upgrade && status == http::StatusCode::SWITCHING_PROTOCOLS {
        let upgraded = hyper::upgrade::on(&mut resp).await.map_err(|e| {
            Status::unavailable(format!("gRPC -> HTTP: the API server's upgrade: {e}"))
        })?;
        send(
            out,
            http_response::Message::Trailer(http_response::Trailer {}),
        )
        .await?;
        return pump_upgraded(TokioIo::new(upgraded), requests, out).await;
    }
    let mut body = resp.into_body();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            Status::unavailable(format!("gRPC -> HTTP: read HTTP response body: {e}"))
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        for chunk in data.chunks(CHUNK) {
            let d = http_response::Data {
                data: chunk.to_vec(),
            };
            send(out, http_response::Message::Data(d)).await?;
        }
    }
    send(
        out,
        http_response::Message::Trailer(http_response::Trailer {}),
    )
    .await
}

/// The upgraded connection both ways until the API server closes it: kas's
/// `UpgradeData` written to it, its bytes sent as `UpgradeData`. The end of kas's
/// frames stops the writing only.
async fn pump_upgraded<C>(conn: C, mut requests: Requests, out: &Out) -> Result<(), Status>
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut rd, mut wr) = tokio::io::split(conn);
    let mut kas_open = true;
    let mut buf = vec![0u8; CHUNK];
    loop {
        tokio::select! {
            frame = next_frame(&mut requests), if kas_open => match frame? {
                Some(http_request::Message::UpgradeData(d)) => {
                    wr.write_all(&d.data).await.map_err(|e| {
                        Status::unavailable(format!("gRPC -> HTTP: upgrade request write: {e}"))
                    })?;
                }
                None => kas_open = false,
                Some(other) => {
                    return Err(Status::internal(format!(
                        "unexpected {other:?} on an upgraded connection"
                    )));
                }
            },
            n = rd.read(&mut buf) => match n {
                Ok(0) => return Ok(()),
                Ok(n) => {
                    let d = http_response::UpgradeData { data: buf[..n].to_vec() };
                    send(out, http_response::Message::UpgradeData(d)).await?;
                }
                Err(e) => {
                    return Err(Status::unavailable(format!(
                        "gRPC -> HTTP: read upgrade response body: {e}"
                    )));
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client whose API server must never be reached.
    fn unreachable_client() -> kube::Client {
        let svc = tower::service_fn(|_req: http::Request<kube::client::Body>| async {
            Err::<http::Response<kube::client::Body>, std::io::Error>(std::io::Error::other(
                "the API server was called",
            ))
        });
        kube::Client::new(svc, "default")
    }

    fn frames(msgs: Vec<http_request::Message>) -> Requests {
        Box::pin(futures_util::stream::iter(
            msgs.into_iter()
                .map(|m| HttpRequest { message: Some(m) }.encode_to_vec()),
        ))
    }

    fn header(content_length: i64, upgrade: bool) -> http_request::Message {
        let mut h = std::collections::HashMap::new();
        if upgrade {
            h.insert(
                "Upgrade".to_owned(),
                prototool::Values {
                    value: vec!["SPDY/3.1".into()],
                },
            );
        }
        http_request::Message::Header(http_request::Header {
            request: Some(prototool::HttpRequest {
                method: "POST".into(),
                header: h,
                url_path: "/api/v1/namespaces/default/pods/web-1/exec".into(),
                query: Default::default(),
            }),
            extra: None,
            content_length: Some(content_length),
        })
    }

    async fn refusal(msgs: Vec<http_request::Message>) -> Status {
        let mut out = make_request(unreachable_client(), frames(msgs));
        match out.next().await {
            Some(Err(s)) => s,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn frames_out_of_gitlabs_order_are_refused_before_the_api_server_is_called() {
        let data = || {
            http_request::Message::Data(http_request::Data {
                data: b"x".to_vec(),
            })
        };
        let up = || {
            http_request::Message::UpgradeData(http_request::UpgradeData {
                data: b"x".to_vec(),
            })
        };
        let s = refusal(vec![data()]).await;
        assert_eq!(s.code(), tonic::Code::Internal);
        assert!(s.message().contains("Header first"), "{s:?}");
        let s = refusal(vec![header(0, false), data()]).await;
        assert_eq!(s.code(), tonic::Code::Internal);
        assert_eq!(s.message(), "unexpected HttpRequest_Data message received");
        let s = refusal(vec![header(-1, false), up()]).await;
        assert_eq!(
            s.message(),
            "unexpected HttpRequest_UpgradeData message for non-upgrade request"
        );
        // In order, the request is made (here: the API server cannot be reached).
        let s = refusal(vec![header(1, true), data()]).await;
        assert_eq!(s.code(), tonic::Code::Unavailable);
        assert!(s.message().contains("the API server was called"), "{s:?}");
    }
}
