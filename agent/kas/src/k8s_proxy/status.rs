//! Error answers as Kubernetes `Status` objects, as GitLab's kas writes them
//! (`writeErrorResponse` and `code2reason` in
//! `internal/module/kubernetes_api/server/proxy.go`): `kind: Status`,
//! `apiVersion: v1`, `status: Failure`, the reason mapped from the HTTP code (empty
//! when kas maps none), the code, and a message that starts with
//! `GitLab Agent Server: ` and goes on with the cause when there is one. kas
//! negotiates the encoding; podgate always answers JSON, which every Kubernetes
//! client reads.
//!
//! A 401 also carries `Gitlab-Unauthorized: true`, so clients can tell kas's refusal
//! from the cluster's.

use http::{HeaderValue, Response, StatusCode};
use serde_json::json;

use crate::http_server::{BoxBody, full};

/// The header that marks kas's own 401 (`httpz.GitlabUnauthorizedHeader`).
pub(super) const GITLAB_UNAUTHORIZED: &str = "gitlab-unauthorized";

/// An error kas answers instead of forwarding (`grpctool.ErrResp`).
#[derive(Debug)]
pub(super) struct ErrResp {
    /// The HTTP status.
    pub code: StatusCode,
    /// What kas says (after `GitLab Agent Server: `).
    pub msg: String,
    /// The cause, appended as `: <cause>`.
    pub cause: Option<String>,
}

impl ErrResp {
    /// `code` with `msg` and no cause.
    pub(super) fn new(code: StatusCode, msg: impl Into<String>) -> ErrResp {
        ErrResp {
            code,
            msg: msg.into(),
            cause: None,
        }
    }

    /// `code` with `msg` and `cause`.
    pub(super) fn with_cause(
        code: StatusCode,
        msg: impl Into<String>,
        cause: impl Into<String>,
    ) -> ErrResp {
        ErrResp {
            code,
            msg: msg.into(),
            cause: Some(cause.into()),
        }
    }

    /// The full message (`formatStatusMessage`).
    pub(super) fn message(&self) -> String {
        match &self.cause {
            Some(c) => format!("GitLab Agent Server: {}: {c}", self.msg),
            None => format!("GitLab Agent Server: {}", self.msg),
        }
    }

    /// The `Status` answer (with `Gitlab-Unauthorized: true` on a 401).
    pub(super) fn into_response(self) -> Response<BoxBody> {
        let body = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message(),
            "reason": reason(self.code),
            "code": self.code.as_u16(),
        });
        let mut r = Response::new(full(body.to_string()));
        *r.status_mut() = self.code;
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if self.code == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(GITLAB_UNAUTHORIZED, HeaderValue::from_static("true"));
        }
        r
    }
}

/// kas's `code2reason` (`metav1.StatusReason…`); `""` (unknown) for any other code.
pub(super) fn reason(code: StatusCode) -> &'static str {
    match code.as_u16() {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Gone",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "",
    }
}

/// A routing or agentk error before the response header: 502, as kas answers
/// (`handleIoError("failed to read gRPC response", err)`), with gRPC's error text.
pub(super) fn grpc_error(status: tonic::Status) -> ErrResp {
    ErrResp::with_cause(
        StatusCode::BAD_GATEWAY,
        "HTTP->gRPC: failed to read gRPC response",
        format!(
            "rpc error: code = {:?} desc = {}",
            status.code(),
            status.message()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;

    #[tokio::test]
    async fn a_401_is_a_status_with_the_gitlab_unauthorized_header() {
        let r = ErrResp::with_cause(StatusCode::UNAUTHORIZED, "Unauthorized", "empty token")
            .into_response();
        assert_eq!(r.status(), 401);
        assert_eq!(r.headers()[GITLAB_UNAUTHORIZED], "true");
        let body = r.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["kind"], "Status");
        assert_eq!(v["apiVersion"], "v1");
        assert_eq!(v["status"], "Failure");
        assert_eq!(v["reason"], "Unauthorized");
        assert_eq!(v["code"], 401);
        assert_eq!(
            v["message"],
            "GitLab Agent Server: Unauthorized: empty token"
        );
    }

    #[tokio::test]
    async fn other_codes_carry_no_gitlab_unauthorized() {
        let r = ErrResp::new(StatusCode::FORBIDDEN, "Forbidden: CI job token").into_response();
        assert!(r.headers().get(GITLAB_UNAUTHORIZED).is_none());
        assert_eq!(reason(StatusCode::BAD_GATEWAY), "");
    }
}
