//! GitLab's API as kas calls it: plain HTTP to GitLab's base URL, and, for the
//! internal API (`/api/v4/internal/…`), the `Gitlab-Kas-Api-Request` header carrying
//! a short HS256 JWT signed with the GitLab ↔ kas secret (issuer `gitlab-kas`,
//! audience `gitlab`), as GitLab's kas does (`internal/gitlab/client.go`,
//! `jwtRequestHeader`). Used by [`super::agent_auth`] (`agent_info`) and the
//! Kubernetes API proxy ([`super::k8s_proxy`]: `authorize_proxy_user`,
//! `job/allowed_agents`), the agent configuration
//! ([`super::agent_config`]: `agent_configuration`) and modules' requests
//! ([`super::gitlab_access`]: `modules/<module>/…`, streamed both ways with
//! [`GitlabClient::stream`]).
//!
//! [`GitlabClient::request`] returns answers whole (status and body, at most
//! [`MAX_RESPONSE`] bytes); callers decide what a status means. Tokens sent in
//! headers are never logged here.

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// The header GitLab's internal API authenticates kas by.
pub const KAS_API_REQUEST_HEADER: &str = "Gitlab-Kas-Api-Request";

/// Largest answer read from GitLab.
pub const MAX_RESPONSE: usize = 4 << 20;

/// Why GitLab did not answer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request could not be built (a header value that is not one, a bad URL).
    #[error("building the request: {0}")]
    Build(String),
    /// Signing the `Gitlab-Kas-Api-Request` JWT failed.
    #[error("signing the kas API request token: {0}")]
    Jwt(String),
    /// Connecting, sending or reading failed.
    #[error("GitLab request failed: {0}")]
    Transport(String),
    /// The answer was larger than [`MAX_RESPONSE`].
    #[error("GitLab's answer is larger than {MAX_RESPONSE} bytes")]
    TooLarge,
}

/// A hyper client error with its causes (hyper's own message is only "client
/// error (Connect)").
fn transport_error(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// GitLab's answer.
#[derive(Debug)]
pub struct Answer {
    /// Its status.
    pub status: StatusCode,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its body.
    pub body: Bytes,
}

/// A streamed request body: chunks, or the error that aborts the request.
pub type StreamBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

/// A client of one GitLab.
pub struct GitlabClient {
    base: String,
    secret: Vec<u8>,
    client: Client<HttpConnector, Full<Bytes>>,
    streaming: Client<HttpConnector, StreamBody>,
}

impl GitlabClient {
    /// GitLab at `base_url` (`http://host:port`, no trailing `/` needed); `secret`
    /// signs the internal API's JWT.
    pub fn new(base_url: &str, secret: Vec<u8>) -> GitlabClient {
        GitlabClient {
            base: base_url.trim_end_matches('/').to_owned(),
            secret,
            client: Client::builder(TokioExecutor::new()).build(connector()),
            streaming: Client::builder(TokioExecutor::new()).build(connector()),
        }
    }

    /// `method path_and_query` with `headers` and a streamed `body`, with the
    /// `Gitlab-Kas-Api-Request` JWT (this is for the internal API); GitLab's answer
    /// as it arrives, its body unread. `path_and_query` is appended to the base URL
    /// as given (escape it first).
    pub async fn stream(
        &self,
        method: Method,
        path_and_query: &str,
        headers: HeaderMap,
        body: StreamBody,
    ) -> Result<http::Response<hyper::body::Incoming>, Error> {
        let jwt = podgate_agent::auth::mint_kas_api_request(&self.secret)
            .map_err(|e| Error::Jwt(e.to_string()))?;
        let mut request = http::Request::builder()
            .method(method)
            .uri(format!("{}{path_and_query}", self.base))
            .body(body)
            .map_err(|e| Error::Build(e.to_string()))?;
        *request.headers_mut() = headers;
        request.headers_mut().insert(
            KAS_API_REQUEST_HEADER,
            http::HeaderValue::from_str(&jwt).map_err(|e| Error::Build(e.to_string()))?,
        );
        self.streaming
            .request(request)
            .await
            .map_err(|e| Error::Transport(transport_error(&e)))
    }

    /// GitLab's base URL.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// `method path` with `headers`, a JSON `body` if any, and the
    /// `Gitlab-Kas-Api-Request` JWT when `internal`.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        json_body: Option<Vec<u8>>,
        internal: bool,
    ) -> Result<Answer, Error> {
        let mut builder = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        if internal {
            let jwt = podgate_agent::auth::mint_kas_api_request(&self.secret)
                .map_err(|e| Error::Jwt(e.to_string()))?;
            builder = builder.header(KAS_API_REQUEST_HEADER, jwt);
        }
        let body = match json_body {
            Some(b) => {
                builder = builder.header(http::header::CONTENT_TYPE, "application/json");
                Full::new(Bytes::from(b))
            }
            None => Full::new(Bytes::new()),
        };
        let request = builder
            .body(body)
            .map_err(|e| Error::Build(e.to_string()))?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| Error::Transport(e.to_string()))?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = Limited::new(response.into_body(), MAX_RESPONSE)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    Error::TooLarge
                } else {
                    Error::Transport(e.to_string())
                }
            })?
            .to_bytes();
        Ok(Answer {
            status,
            headers,
            body,
        })
    }
}

/// Plain-HTTP connections to GitLab with Nagle's algorithm off (`TCP_NODELAY`, as
/// Go's `net/http` dials): a streamed body's small chunks go out as written.
fn connector() -> HttpConnector {
    let mut c = HttpConnector::new();
    c.set_nodelay(true);
    c
}
