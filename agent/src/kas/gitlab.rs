//! GitLab's API as kas calls it: plain HTTP to GitLab's base URL, and, for the
//! internal API (`/api/v4/internal/…`), the `Gitlab-Kas-Api-Request` header carrying
//! a short HS256 JWT signed with the GitLab ↔ kas secret (issuer `gitlab-kas`,
//! audience `gitlab`), as GitLab's kas does (`internal/gitlab/client.go`,
//! `jwtRequestHeader`). Used by [`super::agent_auth`] (`agent_info`) and the
//! Kubernetes API proxy ([`super::k8s_proxy`]: `authorize_proxy_user`,
//! `job/allowed_agents`).
//!
//! Answers are returned whole (status and body, at most [`MAX_RESPONSE`] bytes);
//! callers decide what a status means. Tokens sent in headers are never logged here.

use bytes::Bytes;
use http::{Method, StatusCode};
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

/// GitLab's answer.
#[derive(Debug)]
pub struct Answer {
    /// Its status.
    pub status: StatusCode,
    /// Its body.
    pub body: Bytes,
}

/// A client of one GitLab.
pub struct GitlabClient {
    base: String,
    secret: Vec<u8>,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl GitlabClient {
    /// GitLab at `base_url` (`http://host:port`, no trailing `/` needed); `secret`
    /// signs the internal API's JWT.
    pub fn new(base_url: &str, secret: Vec<u8>) -> GitlabClient {
        GitlabClient {
            base: base_url.trim_end_matches('/').to_owned(),
            secret,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
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
            let jwt = crate::auth::mint_kas_api_request(&self.secret)
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
        Ok(Answer { status, body })
    }
}
