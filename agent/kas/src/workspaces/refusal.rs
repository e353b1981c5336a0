//! The answers kas gives itself: a status, a code and a message as JSON, each
//! counted under its outcome.

use http::header;
use http::{HeaderValue, Response, StatusCode};
use serde_json::json;

use crate::http_server::{BoxBody, full};

/// An answer kas gives itself.
#[derive(Clone, Debug)]
pub(super) struct Refusal {
    /// The HTTP status.
    pub(super) status: StatusCode,
    /// The `error` code.
    pub(super) code: &'static str,
    /// The `message`.
    pub(super) message: String,
    /// The metric outcome.
    pub(super) outcome: &'static str,
}

impl Refusal {
    pub(super) fn new(
        status: StatusCode,
        code: &'static str,
        message: impl Into<String>,
    ) -> Refusal {
        Refusal {
            status,
            code,
            message: message.into(),
            outcome: "",
        }
    }

    pub(super) fn counted(mut self, outcome: &'static str) -> Refusal {
        self.outcome = outcome;
        self
    }

    pub(super) fn unauthorized(message: impl Into<String>) -> Refusal {
        Refusal::new(StatusCode::UNAUTHORIZED, "UNAUTHORIZED", message).counted("unauthorized")
    }

    pub(super) fn bad_gateway(message: impl Into<String>) -> Refusal {
        Refusal::new(StatusCode::BAD_GATEWAY, "BAD_GATEWAY", message).counted("bad_gateway")
    }

    pub(super) fn into_response(self, server: &HeaderValue) -> Response<BoxBody> {
        let body = json!({"error": self.code, "message": self.message});
        let mut r = Response::new(full(format!("{body}\n")));
        *r.status_mut() = self.status;
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(header::SERVER, server.clone());
        if self.status == StatusCode::UNAUTHORIZED {
            h.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"GitLab Workspaces\""),
            );
        }
        r
    }
}

/// A failed tunnel call as the client's answer.
pub(super) fn tunnel_refusal(s: tonic::Status, agent_id: i64, name: &str) -> Refusal {
    use tonic::Code;
    match s.code() {
        Code::FailedPrecondition => Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "WORKSPACE_NOT_RUNNING",
            format!("workspace {name} is not running"),
        )
        .counted("not_running"),
        Code::NotFound => Refusal::new(StatusCode::NOT_FOUND, "PORT_NOT_FOUND", s.message())
            .counted("port_not_found"),
        Code::DeadlineExceeded => Refusal::new(
            StatusCode::GATEWAY_TIMEOUT,
            "AGENT_NOT_CONNECTED",
            format!("agent {agent_id} of workspace {name} is not connected"),
        )
        .counted("timeout"),
        _ => Refusal::bad_gateway(format!(
            "tunnel to workspace {name}: {:?}: {}",
            s.code(),
            s.message()
        ))
        .counted("tunnel_error"),
    }
}
