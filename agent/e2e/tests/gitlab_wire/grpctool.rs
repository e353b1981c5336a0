//! GitLab's `grpctool` for the GitLab-shaped peers, on the tests' own protobuf
//! types: token credentials, and HTTP carried over a gRPC stream as
//! `grpctool.HttpRequest`/`HttpResponse` frames.
//!
//! Written from GitLab's `internal/tool/grpctool/token_creds.go` (per-RPC metadata
//! `authorization: Bearer <token>`) and `internal/tool/prototool/` (headers and
//! queries as `map<string, Values>`):
//! <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/tool/grpctool/token_creds.go>.
//! The agent's side of HTTP over gRPC is [`super::grpc2http`].

use std::collections::HashMap;

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
