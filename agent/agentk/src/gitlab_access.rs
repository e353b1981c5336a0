//! agentk modules' requests to GitLab's internal API, through kas: the client side of
//! `GitlabAccess.MakeRequest` (GitLab's `internal/module/gitlab_access/rpc/rpc.proto`;
//! agentk's `modagent.Api.MakeGitLabRequest`, `internal/module/modagent/api.go`).
//!
//! One request is one gRPC stream (gzip-compressed, as GitLab's agentk) on the
//! agent's kas channel, authenticated by the agent token, in GitLab's messages
//! (`grpctool.HttpRequest`): a header (method, path, query, headers, and the module
//! name as `gitlab_access.rpc.HeaderExtra` packed in a `google.protobuf.Any`), the
//! body in chunks, a trailer; kas answers with a header (status, headers), the body in chunks
//! and a trailer. kas sends the request on to
//! `/api/v4/internal/kubernetes/modules/<module><path>` on the agent's GitLab and
//! streams the answer back unchanged (`podgate-kas`, `agent/kas/src/gitlab_access/`).

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt as _;
use http::{HeaderMap, HeaderValue, Method};
use tonic::transport::Channel;

use podgate_agent::httpz::{from_values, parse_query, to_values};
use podgate_agent::proto::gitlab::agent::grpctool::{
    HttpRequest, http_request as request, http_response as response,
};
use podgate_agent::proto::gitlab::agent::prototool;
use podgate_agent::proto::gitlab_access::HeaderExtra;
use podgate_agent::proto::gitlab_access::gitlab_access_client::GitlabAccessClient;

/// The protobuf full name of [`HeaderExtra`], packed in `Header.extra`.
const HEADER_EXTRA: &str = "gitlab.agent.gitlab_access.rpc.HeaderExtra";

/// Largest answer [`ModuleClient::request`] reads.
pub const MAX_ANSWER: usize = 64 << 20;

/// Request bodies go to kas in chunks of this size (GitLab's 32 KiB buffers).
const CHUNK: usize = 32 << 10;

/// Why a module request got no answer from GitLab.
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    /// The request cannot be sent (an empty module name, a path without `/`).
    #[error("bad module request: {0}")]
    BadRequest(String),
    /// kas refused or failed the call (its gRPC status: `Unauthenticated` for a bad
    /// token, `Unavailable` when GitLab cannot be reached, …).
    #[error("kas: {}: {}", .0.code(), .0.message())]
    Kas(#[from] tonic::Status),
    /// kas's answer did not follow the protocol (messages out of order).
    #[error("kas answered out of protocol: {0}")]
    Protocol(String),
    /// The answer was larger than [`MAX_ANSWER`].
    #[error("GitLab's answer is larger than {MAX_ANSWER} bytes")]
    TooLarge,
}

impl ModuleError {
    /// The gRPC code kas ended the call with, if it was kas that failed it.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            ModuleError::Kas(s) => Some(s.code()),
            _ => None,
        }
    }
}

/// GitLab's answer, as GitLab gave it.
#[derive(Clone, Debug)]
pub struct ModuleAnswer {
    /// HTTP status.
    pub status: u16,
    /// Response headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

/// Makes module requests to GitLab through kas, as one agent (its token).
#[derive(Clone)]
pub struct ModuleClient {
    channel: Channel,
    token: String,
}

impl std::fmt::Debug for ModuleClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModuleClient")
            .field("token", &podgate_tokens::fingerprint(&self.token))
            .finish_non_exhaustive()
    }
}

impl ModuleClient {
    /// Requests over `channel` (kas's agent listener) with the agent `token`.
    pub fn new(channel: Channel, token: String) -> ModuleClient {
        ModuleClient { channel, token }
    }

    /// One request: `method path` (a `?query` is sent as the query) for `module`,
    /// with a JSON body if any; the whole answer (at most [`MAX_ANSWER`] bytes).
    /// Any status GitLab answers is an answer; [`ModuleError`] means none came.
    pub async fn request(
        &self,
        module: &str,
        method: Method,
        path: &str,
        json_body: Option<Vec<u8>>,
    ) -> Result<ModuleAnswer, ModuleError> {
        let mut headers = HeaderMap::new();
        if json_body.is_some() {
            headers.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
        headers.insert(
            http::header::ACCEPT,
            HeaderValue::from_static("application/json"),
        );
        self.request_with(module, method, path, headers, json_body.map(Bytes::from))
            .await
    }

    /// [`ModuleClient::request`] with the caller's headers and any body.
    pub async fn request_with(
        &self,
        module: &str,
        method: Method,
        path: &str,
        headers: HeaderMap,
        body: Option<Bytes>,
    ) -> Result<ModuleAnswer, ModuleError> {
        if module.is_empty() {
            return Err(ModuleError::BadRequest("empty module name".into()));
        }
        let (url_path, query) = match path.split_once('?') {
            Some((p, q)) => (p, parse_query(q)),
            None => (path, Default::default()),
        };
        if !url_path.starts_with('/') {
            return Err(ModuleError::BadRequest(format!(
                "path {url_path:?} does not start with /"
            )));
        }
        let body = body.unwrap_or_default();
        let header = request::Header {
            request: Some(prototool::HttpRequest {
                method: method.as_str().to_owned(),
                header: to_values(&headers),
                url_path: url_path.to_owned(),
                query,
            }),
            extra: Some(podgate_agent::any::pack(
                HEADER_EXTRA,
                &HeaderExtra {
                    module_name: module.to_owned(),
                },
            )),
            content_length: Some(body.len() as i64),
        };
        let mut messages = vec![HttpRequest {
            message: Some(request::Message::Header(header)),
        }];
        let mut rest = body;
        while !rest.is_empty() {
            let chunk = rest.split_to(rest.len().min(CHUNK));
            messages.push(HttpRequest {
                message: Some(request::Message::Data(request::Data {
                    data: chunk.to_vec(),
                })),
            });
        }
        messages.push(HttpRequest {
            message: Some(request::Message::Trailer(request::Trailer {})),
        });
        let mut call = tonic::Request::new(tokio_stream::iter(messages));
        call.metadata_mut().insert(
            "authorization",
            format!("Bearer {}", self.token)
                .parse()
                .map_err(|_| ModuleError::BadRequest("the token is not a header value".into()))?,
        );
        let mut stream = podgate_agent::gzip_client!(GitlabAccessClient::new(self.channel.clone()))
            .max_decoding_message_size(8 << 20)
            .make_request(call)
            .await?
            .into_inner();
        let first = stream
            .next()
            .await
            .transpose()?
            .and_then(|m| m.message)
            .ok_or_else(|| ModuleError::Protocol("no response header".into()))?;
        let response::Message::Header(h) = first else {
            return Err(ModuleError::Protocol(
                "the first message is not the response header".into(),
            ));
        };
        let r = h
            .response
            .ok_or_else(|| ModuleError::Protocol("a header without a response".into()))?;
        let status = u16::try_from(r.status_code)
            .ok()
            .filter(|s| (100..=999).contains(s))
            .ok_or_else(|| ModuleError::Protocol(format!("status {}", r.status_code)))?;
        let mut body = BytesMut::new();
        let mut trailer = false;
        while let Some(m) = stream.next().await.transpose()? {
            match m.message {
                Some(response::Message::Data(d)) if !trailer => {
                    if body.len() + d.data.len() > MAX_ANSWER {
                        return Err(ModuleError::TooLarge);
                    }
                    body.extend_from_slice(&d.data);
                }
                Some(response::Message::Trailer(_)) if !trailer => trailer = true,
                _ => return Err(ModuleError::Protocol("unexpected message".into())),
            }
        }
        if !trailer {
            return Err(ModuleError::Protocol(
                "the answer ended without a trailer".into(),
            ));
        }
        Ok(ModuleAnswer {
            status,
            headers: from_values(&r.header),
            body: body.freeze(),
        })
    }
}
