//! The agent's side of `KubernetesApi/MakeRequest`, as GitLab's agentk serves it:
//! `grpctool.HttpRequest` frames in, an HTTP request to the Kubernetes API,
//! `grpctool.HttpResponse` frames out, on the tests' own protobuf types.
//!
//! Written from GitLab's `internal/tool/grpctool/inbound_grpc_to_outbound_http.go`
//! and `internal/module/kubernetes_api/agent/server.go`:
//! - in: Header, Data*, Trailer; after an upgrade, UpgradeData*;
//! - out: Header, Data* (the body as it arrives), Trailer; then, if the request was
//!   an upgrade (its header map has the key `Upgrade`, exactly as Go's
//!   `http.Header` spells it: `prototool.HttpRequest.IsUpgrade`) and the answer is
//!   `101`, UpgradeData* carrying the upgraded connection both ways until the
//!   Kubernetes API closes it;
//! - a request with `content_length` 0 is sent without a body.
//!
//! <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/tool/grpctool/inbound_grpc_to_outbound_http.go>

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::grpctool::values_map;
use super::proto::gitlab::agent::grpctool::{
    HttpRequest, HttpResponse, http_request, http_response,
};
use super::proto::gitlab::agent::prototool;

/// What went wrong serving one request. Not retried: kas gets it as the call's error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The frames broke GitLab's order.
    #[error("HTTP over gRPC: {0}")]
    Protocol(String),
    /// The Kubernetes API request failed.
    #[error("HTTP request to {url}: {source}")]
    Http {
        /// The URL asked for.
        url: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Reads one request from `inbound`, makes it against `base_url`, and sends the
/// response to `outbound`.
pub async fn serve_http(
    base_url: String,
    mut inbound: mpsc::Receiver<HttpRequest>,
    outbound: mpsc::Sender<HttpResponse>,
) -> Result<(), Error> {
    let header = match inbound.recv().await.and_then(|f| f.message) {
        Some(http_request::Message::Header(h)) => h,
        other => {
            return Err(Error::Protocol(format!(
                "expected a Header first, got {other:?}"
            )));
        }
    };
    let request = header.request.unwrap_or_default();
    let is_upgrade = request.header.contains_key("Upgrade");
    let mut body = Vec::new();
    while let Some(frame) = inbound.recv().await {
        match frame.message {
            Some(http_request::Message::Data(d)) if header.content_length != Some(0) => {
                body.extend_from_slice(&d.data);
            }
            Some(http_request::Message::Trailer(_)) => break,
            other => {
                return Err(Error::Protocol(format!(
                    "expected Data or Trailer, got {other:?}"
                )));
            }
        }
    }
    let url = url(&base_url, &request);
    let http_err = |source: Box<dyn std::error::Error + Send + Sync>| Error::Http {
        url: url.clone(),
        source,
    };
    let mut builder = http::Request::builder()
        .method(request.method.as_str())
        .uri(&url);
    for (name, values) in &request.header {
        for v in &values.value {
            builder = builder.header(name, v);
        }
    }
    let req = builder
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| http_err(e.into()))?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut resp = client.request(req).await.map_err(|e| http_err(e.into()))?;
    let status = resp.status();
    let head = http_response::Header {
        response: Some(prototool::HttpResponse {
            status_code: i32::from(status.as_u16()),
            status: format!(
                "{} {}",
                status.as_u16(),
                status.canonical_reason().unwrap_or("")
            ),
            header: values_map(
                resp.headers()
                    .iter()
                    .filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?))),
            ),
        }),
    };
    let send = |m: http_response::Message| outbound.send(HttpResponse { message: Some(m) });
    if send(http_response::Message::Header(head)).await.is_err() {
        return Ok(());
    }
    if is_upgrade && status == http::StatusCode::SWITCHING_PROTOCOLS {
        let upgraded = hyper::upgrade::on(&mut resp)
            .await
            .map_err(|e| http_err(e.into()))?;
        if send(http_response::Message::Trailer(http_response::Trailer {}))
            .await
            .is_err()
        {
            return Ok(());
        }
        return pipe_upgraded(TokioIo::new(upgraded), inbound, &outbound)
            .await
            .map_err(|e| http_err(e.into()));
    }
    let mut body = resp.into_body();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| http_err(e.into()))?;
        if let Ok(data) = frame.into_data()
            && send(http_response::Message::Data(http_response::Data {
                data: data.to_vec(),
            }))
            .await
            .is_err()
        {
            return Ok(());
        }
    }
    let _ = send(http_response::Message::Trailer(http_response::Trailer {})).await;
    Ok(())
}

/// Upgraded bytes both ways until the Kubernetes API closes the connection (the end
/// of kas's frames does not close it, as in GitLab's `pipeInboundToOutbound`).
async fn pipe_upgraded(
    conn: TokioIo<hyper::upgrade::Upgraded>,
    mut inbound: mpsc::Receiver<HttpRequest>,
    outbound: &mpsc::Sender<HttpResponse>,
) -> std::io::Result<()> {
    let (mut rd, mut wr) = tokio::io::split(conn);
    let to_kube = async {
        while let Some(frame) = inbound.recv().await {
            match frame.message {
                Some(http_request::Message::UpgradeData(d)) => wr.write_all(&d.data).await?,
                other => {
                    let msg = format!("expected UpgradeData, got {other:?}");
                    return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, msg));
                }
            }
        }
        std::future::pending().await
    };
    let from_kube = async {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let n = rd.read(&mut buf).await?;
            if n == 0 {
                return Ok(());
            }
            let data = http_response::UpgradeData {
                data: buf[..n].to_vec(),
            };
            let frame = HttpResponse {
                message: Some(http_response::Message::UpgradeData(data)),
            };
            if outbound.send(frame).await.is_err() {
                return Ok(());
            }
        }
    };
    tokio::select! {
        r = to_kube => r,
        r = from_kube => r,
    }
}

/// The Kubernetes API URL of `request` (`server.go`'s `newRequest`).
fn url(base_url: &str, request: &prototool::HttpRequest) -> String {
    let mut url = format!("{}{}", base_url.trim_end_matches('/'), request.url_path);
    let query: Vec<String> = request
        .query
        .iter()
        .flat_map(|(k, v)| {
            v.value
                .iter()
                .map(move |v| format!("{}={}", encode(k), encode(v)))
        })
        .collect();
    if !query.is_empty() {
        url = format!("{url}?{}", query.join("&"));
    }
    url
}

fn encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}
