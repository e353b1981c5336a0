//! GitLab's `grpctool` for the GitLab-shaped peers, on the tests' own protobuf
//! types: token credentials, and HTTP carried over a gRPC stream as
//! `grpctool.HttpRequest`/`HttpResponse` frames.
//!
//! Written from GitLab's `internal/tool/grpctool/token_creds.go` (per-RPC metadata
//! `authorization: Bearer <token>`),
//! `internal/tool/grpctool/inbound_grpc_to_outbound_http.go` (the agent's side:
//! Header, Data*, Trailer in; Header, Data*, Trailer out, the response body sent as
//! it arrives) and `internal/tool/prototool/` (headers and queries as
//! `map<string, Values>`):
//! <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/tool/grpctool/inbound_grpc_to_outbound_http.go>.
//! HTTP upgrades (`UpgradeData`) are refused, as GitLab's `HttpDo` contract allows
//! for an implementation without them.

use std::collections::HashMap;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::mpsc;

use super::proto::gitlab::agent::grpctool::{
    HttpRequest, HttpResponse, http_request, http_response,
};
use super::proto::gitlab::agent::prototool;

/// What went wrong carrying HTTP over gRPC. Not retried: each is a broken exchange.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The frames broke GitLab's order (Header, Data*, Trailer).
    #[error("HTTP over gRPC: {0}")]
    Protocol(String),
    /// The upstream HTTP request failed.
    #[error("HTTP request to {url}: {source}")]
    Http {
        /// The URL asked for.
        url: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// GitLab's `token_creds.go`: every call carries `authorization: Bearer <token>`.
#[derive(Clone)]
pub struct TokenCreds(pub tonic::metadata::MetadataValue<tonic::metadata::Ascii>);

impl TokenCreds {
    /// Credentials for `token`.
    pub fn new(token: &str) -> Self {
        Self(format!("Bearer {token}").parse().expect("a token is ASCII"))
    }
}

impl tonic::service::Interceptor for TokenCreds {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert("authorization", self.0.clone());
        Ok(req)
    }
}

/// `map<string, Values>` from HTTP header pairs (`prototool.HttpHeaderToValuesMap`).
pub fn values_map<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> HashMap<String, prototool::Values> {
    let mut map: HashMap<String, prototool::Values> = HashMap::new();
    for (k, v) in pairs {
        map.entry(k.to_owned())
            .or_default()
            .value
            .push(v.to_owned());
    }
    map
}

/// The frames a caller sends for one HTTP request without upgrade: Header (with
/// `content_length` as GitLab's `inbound_http_to_outbound_grpc.go` sets it), the body
/// as one Data frame if any, Trailer.
pub fn request_frames(
    method: &str,
    url_path: &str,
    headers: &[(&str, &str)],
    extra: Option<prost_types::Any>,
    body: &[u8],
) -> Vec<HttpRequest> {
    let header = http_request::Header {
        request: Some(prototool::HttpRequest {
            method: method.to_owned(),
            header: values_map(headers.iter().copied()),
            url_path: url_path.to_owned(),
            query: HashMap::new(),
        }),
        extra,
        content_length: Some(i64::try_from(body.len()).expect("small body")),
    };
    let mut frames = vec![HttpRequest {
        message: Some(http_request::Message::Header(header)),
    }];
    if !body.is_empty() {
        frames.push(HttpRequest {
            message: Some(http_request::Message::Data(http_request::Data {
                data: body.to_vec(),
            })),
        });
    }
    frames.push(HttpRequest {
        message: Some(http_request::Message::Trailer(http_request::Trailer {})),
    });
    frames
}

/// An HTTP response put back together from `HttpResponse` frames.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CollectedResponse {
    /// The status code.
    pub status: i32,
    /// The headers.
    pub headers: HashMap<String, prototool::Values>,
    /// The body.
    pub body: Vec<u8>,
}

/// Puts a response back together; fails unless the frames are Header, Data*,
/// Trailer.
pub fn collect_response(frames: &[HttpResponse]) -> Result<CollectedResponse, Error> {
    let mut out = CollectedResponse::default();
    let mut iter = frames.iter().map(|f| f.message.as_ref());
    match iter.next() {
        Some(Some(http_response::Message::Header(h))) => {
            let r = h.response.clone().unwrap_or_default();
            out.status = r.status_code;
            out.headers = r.header;
        }
        other => {
            return Err(Error::Protocol(format!(
                "expected a Header first, got {other:?}"
            )));
        }
    }
    for frame in iter.by_ref() {
        match frame {
            Some(http_response::Message::Data(d)) => out.body.extend_from_slice(&d.data),
            Some(http_response::Message::Trailer(_)) => return Ok(out),
            other => {
                return Err(Error::Protocol(format!(
                    "expected Data or Trailer, got {other:?}"
                )));
            }
        }
    }
    Err(Error::Protocol("no Trailer".into()))
}

/// The agent's side of `MakeRequest`: reads `HttpRequest` frames from `inbound` until
/// Trailer or end of stream, makes the request against `base_url` and sends the
/// response to `outbound` as Header, Data* (as the body arrives), Trailer.
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
    let mut body = Vec::new();
    while let Some(frame) = inbound.recv().await {
        match frame.message {
            Some(http_request::Message::Data(d)) => body.extend_from_slice(&d.data),
            Some(http_request::Message::Trailer(_)) => break,
            Some(http_request::Message::UpgradeData(_)) => {
                return Err(Error::Protocol(
                    "UpgradeData: this agent serves no HTTP upgrades".into(),
                ));
            }
            other => {
                return Err(Error::Protocol(format!(
                    "expected Data or Trailer, got {other:?}"
                )));
            }
        }
    }
    let query: Vec<(String, String)> = request
        .query
        .iter()
        .flat_map(|(k, v)| v.value.iter().map(move |v| (k.clone(), v.clone())))
        .collect();
    let mut url = format!("{}{}", base_url.trim_end_matches('/'), request.url_path);
    if !query.is_empty() {
        let encoded: Vec<String> = query
            .iter()
            .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
            .collect();
        url = format!("{url}?{}", encoded.join("&"));
    }
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
    let resp = client.request(req).await.map_err(|e| http_err(e.into()))?;
    let (parts, mut body) = resp.into_parts();
    let headers = values_map(
        parts
            .headers
            .iter()
            .filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?))),
    );
    let head = http_response::Header {
        response: Some(prototool::HttpResponse {
            status_code: i32::from(parts.status.as_u16()),
            status: format!(
                "{} {}",
                parts.status.as_u16(),
                parts.status.canonical_reason().unwrap_or("")
            ),
            header: headers,
        }),
    };
    let send = |m: http_response::Message| outbound.send(HttpResponse { message: Some(m) });
    if send(http_response::Message::Header(head)).await.is_err() {
        return Ok(());
    }
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

fn percent_encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}
