//! The HTTP request kas sends GitLab, built and checked from the header message.

use std::collections::HashMap;

use http::{HeaderMap, HeaderValue, Method};
use tonic::Status;

use super::url::{Mode, encode_query, escape, path_escape};
use super::{MODULE_REQUEST_API_PATH, USER_AGENT};
use podgate_agent::proto::gitlab::agent::grpctool::http_request;
use podgate_agent::proto::gitlab::agent::prototool::Values;

/// The HTTP request kas sends, from the header message.
pub(super) struct Outbound {
    /// The method.
    pub(super) method: Method,
    /// Below GitLab's base URL, escaped.
    pub(super) path_and_query: String,
    /// The headers GitLab gets.
    pub(super) headers: HeaderMap,
    /// The header said there is no body (`content_length` 0).
    pub(super) no_body: bool,
}

impl Outbound {
    pub(super) fn from_header(
        header: http_request::Header,
        module: &str,
        token: &str,
    ) -> Result<Outbound, Status> {
        let req = header
            .request
            .ok_or_else(|| Status::invalid_argument("the header has no request"))?;
        if module.is_empty() {
            return Err(Status::invalid_argument("module_name must not be empty"));
        }
        if req.method.is_empty() {
            return Err(Status::invalid_argument("method must not be empty"));
        }
        let method = Method::from_bytes(req.method.as_bytes())
            .map_err(|_| Status::invalid_argument(format!("method {:?} is not one", req.method)))?;
        if !req.url_path.starts_with('/') {
            return Err(Status::invalid_argument("url_path must start with /"));
        }
        if req.url_path.split('/').any(|s| s == "." || s == "..") {
            return Err(Status::invalid_argument(
                "url_path must not have . or .. segments",
            ));
        }
        if is_upgrade(&req.header) {
            return Err(Status::invalid_argument(
                "connection upgrade is not supported",
            ));
        }
        let mut path_and_query = escape(
            &format!(
                "{MODULE_REQUEST_API_PATH}{}{}",
                path_escape(module),
                req.url_path
            ),
            Mode::Path,
        );
        let query = encode_query(&req.query);
        if !query.is_empty() {
            path_and_query.push('?');
            path_and_query.push_str(&query);
        }
        let mut headers = podgate_agent::httpz::from_values(&req.header);
        podgate_agent::httpz::drop_hop_by_hop(&mut headers);
        for name in [
            http::header::HOST,
            http::header::CONTENT_LENGTH,
            http::header::USER_AGENT,
        ] {
            headers.remove(name);
        }
        headers.remove(super::super::gitlab::KAS_API_REQUEST_HEADER);
        // GitLab 16.5's kas: `WithAgentToken` sets `Authorization` over the caller's.
        headers.insert(
            http::header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| Status::unauthenticated("unauthenticated"))?,
        );
        headers.insert(
            http::header::USER_AGENT,
            HeaderValue::from_static(USER_AGENT),
        );
        Ok(Outbound {
            method,
            path_and_query,
            headers,
            no_body: header.content_length == Some(0),
        })
    }
}

/// Whether the request asks for a connection upgrade: an `Upgrade` header (GitLab's
/// `HttpRequest.IsUpgrade`), or `Connection: upgrade`.
pub(super) fn is_upgrade(header: &HashMap<String, Values>) -> bool {
    header.iter().any(|(name, values)| {
        name.eq_ignore_ascii_case("upgrade")
            || (name.eq_ignore_ascii_case("connection")
                && values.value.iter().any(|v| {
                    v.split(',')
                        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
                }))
    })
}
