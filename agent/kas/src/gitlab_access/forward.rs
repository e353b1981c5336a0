//! One module request: sent to GitLab with the caller's body pumped in as it
//! arrives, GitLab's answer streamed back in [`CHUNK`]-sized messages.

use std::io;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Frame;
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use super::super::gitlab::{GitlabClient, StreamBody};
use super::outbound::Outbound;
use super::{CHUNK, MakeRequestStream};
use podgate_agent::proto::gitlab::agent::grpctool::{
    HttpRequest, HttpResponse, http_request, http_response,
};
use podgate_agent::proto::gitlab::agent::prototool;
use podgate_agent::task::AbortOnDrop;

type BodyChunk = Result<Frame<Bytes>, io::Error>;

/// Send `outbound` with the body read from `inbound`; GitLab's status and the stream
/// of response messages.
pub(super) async fn forward(
    gitlab: Arc<GitlabClient>,
    outbound: Outbound,
    inbound: Streaming<HttpRequest>,
) -> Result<(u16, MakeRequestStream), Status> {
    // Why the caller's stream failed, recorded before GitLab's request is aborted, so
    // the caller hears about its own mistake rather than "GitLab unavailable".
    let failed: Arc<OnceLock<Status>> = Arc::default();
    let (body_tx, body_rx) = mpsc::channel::<BodyChunk>(4);
    let body: StreamBody = if outbound.no_body {
        drop(body_rx);
        http_body_util::Empty::new().map_err(|e| match e {}).boxed()
    } else {
        BodyExt::boxed(http_body_util::StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(body_rx),
        ))
    };
    let pump = AbortOnDrop::spawn(pump(
        inbound,
        (!outbound.no_body).then_some(body_tx),
        failed.clone(),
    ));
    let response = match gitlab
        .stream(
            outbound.method,
            &outbound.path_and_query,
            outbound.headers,
            body,
        )
        .await
    {
        Ok(r) => r,
        Err(e) => {
            if let Some(status) = failed.get() {
                return Err(status.clone());
            }
            tracing::warn!(error = %e, path = %outbound.path_and_query, "module request to GitLab failed");
            return Err(Status::unavailable(format!("gRPC -> HTTP: {e}")));
        }
    };
    let (parts, mut body) = response.into_parts();
    let status = parts.status.as_u16();
    let mut headers = parts.headers;
    podgate_agent::httpz::drop_hop_by_hop(&mut headers);
    let head = HttpResponse {
        message: Some(http_response::Message::Header(http_response::Header {
            response: Some(prototool::HttpResponse {
                status_code: i32::from(status),
                status: match parts.status.canonical_reason() {
                    Some(reason) => format!("{status} {reason}"),
                    None => status.to_string(),
                },
                header: podgate_agent::httpz::to_values(&headers),
            }),
        })),
    };
    let (tx, rx) = mpsc::channel::<Result<HttpResponse, Status>>(4);
    tokio::spawn(async move {
        // The caller's body is no longer needed once GitLab's answer is complete.
        let _pump = pump;
        if tx.send(Ok(head)).await.is_err() {
            return;
        }
        while let Some(frame) = body.frame().await {
            let frame = match frame {
                Ok(f) => f,
                Err(e) => {
                    let status = failed.get().cloned().unwrap_or_else(|| {
                        Status::unavailable(format!("gRPC -> HTTP: read HTTP response body: {e}"))
                    });
                    let _ = tx.send(Err(status)).await;
                    return;
                }
            };
            let Ok(mut data) = frame.into_data() else {
                continue;
            };
            while !data.is_empty() {
                let chunk = data.split_to(data.len().min(CHUNK));
                let message = HttpResponse {
                    message: Some(http_response::Message::Data(http_response::Data {
                        data: chunk.to_vec(),
                    })),
                };
                if tx.send(Ok(message)).await.is_err() {
                    return;
                }
            }
        }
        // A caller that broke protocol meanwhile hears so instead of a trailer.
        let end = match failed.get() {
            Some(status) => Err(status.clone()),
            None => Ok(HttpResponse {
                message: Some(http_response::Message::Trailer(http_response::Trailer {})),
            }),
        };
        let _ = tx.send(end).await;
    });
    Ok((
        status,
        Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)),
    ))
}

/// The caller's messages after the header into GitLab's request body (`body`; none
/// when the header announced no body). A protocol error or a broken caller stream
/// is recorded in `failed` and then aborts the body, so GitLab never sees a
/// truncated body as complete.
async fn pump(
    mut inbound: Streaming<HttpRequest>,
    mut body: Option<mpsc::Sender<BodyChunk>>,
    failed: Arc<OnceLock<Status>>,
) {
    let fail = |body: Option<mpsc::Sender<BodyChunk>>, status: Status| async move {
        let _ = failed.set(status.clone());
        if let Some(b) = body {
            let _ = b
                .send(Err(io::Error::other(status.message().to_owned())))
                .await;
        }
    };
    let announced_none = body.is_none();
    loop {
        match inbound.message().await {
            Ok(Some(HttpRequest {
                message: Some(http_request::Message::Data(d)),
            })) => {
                if announced_none {
                    return fail(
                        body.take(),
                        Status::internal("unexpected HttpRequest_Data message received"),
                    )
                    .await;
                }
                if let Some(b) = &body
                    && b.send(Ok(Frame::data(Bytes::from(d.data)))).await.is_err()
                {
                    // GitLab stopped reading (it answered already).
                    return;
                }
            }
            // The end of the body: the sender dropped ends it cleanly.
            Ok(Some(HttpRequest {
                message: Some(http_request::Message::Trailer(_)),
            }))
            | Ok(None) => return,
            Ok(Some(_)) => {
                return fail(
                    body.take(),
                    Status::invalid_argument("unexpected message after the request header"),
                )
                .await;
            }
            Err(e) => {
                return fail(
                    body.take(),
                    Status::cancelled(format!("request stream: {}", e.message())),
                )
                .await;
            }
        }
    }
}
