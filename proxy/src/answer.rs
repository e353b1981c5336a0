//! What the proxy answers itself (refusals, 401, 503, errors, the end of an edge
//! hold), built once and written by either path: pingora-proxy's session
//! ([`Answer::response_header`]) or the HTTP/1 fast path ([`Answer::write_h1`]).
//! The bytes a client sees are the same whichever path served it.

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::prelude::*;

use crate::decision::{Outcome, Refusal};

/// pingora's error type for a chunked body it cannot parse
/// (`pingora_core::protocols::http::v1::body::INVALID_CHUNK`).
const INVALID_CHUNK: &str = "InvalidChunk";
use crate::rules::Pool;

/// A response from the proxy itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Answer {
    /// The status.
    pub(crate) status: u16,
    /// Headers before `X-Request-Id`, in order.
    pub(crate) headers: Vec<(&'static str, String)>,
    /// A JSON body (`Content-Type: application/json`), or none (204).
    pub(crate) body: Option<Bytes>,
    /// `Retry-After: 5` (a 503: the runner retries).
    pub(crate) retry_after: bool,
}

impl Answer {
    /// A GitLab-style `{"message": …}` answer.
    pub(crate) fn message(status: u16, message: &str, retry_after: bool) -> Answer {
        Answer {
            status,
            headers: Vec::new(),
            body: Some(Bytes::from(
                serde_json::json!({ "message": message }).to_string(),
            )),
            retry_after,
        }
    }

    /// A refusal: its status, and `{"message": "<status> <reason>: <code>: <detail>"}`.
    pub(crate) fn refusal(refusal: &Refusal) -> Answer {
        let status = refusal.status;
        let reason = reason(status);
        Answer::message(
            status,
            &format!("{status} {reason}: {}: {}", refusal.code, refusal.detail),
            false,
        )
    }

    /// A 401 on kas's Kubernetes API proxy, as kas answers it
    /// (`internal/module/kubernetes_api/server/proxy.go`): a Kubernetes `Status` and
    /// `Gitlab-Unauthorized: true`, so kubectl, glab and GitLab's UI tell GitLab's
    /// refusal from the cluster's.
    pub(crate) fn kas_unauthorized(why: &str) -> Answer {
        Answer {
            status: 401,
            headers: vec![("gitlab-unauthorized", "true".into())],
            body: Some(Bytes::from(
                serde_json::json!({
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Failure",
                    "message": format!("GitLab Agent Server: Unauthorized: {why}"),
                    "reason": "Unauthorized",
                    "code": 401,
                })
                .to_string(),
            )),
            retry_after: false,
        }
    }

    /// The end of a long poll held at the edge, as Workhorse ends one and Rails tells
    /// the ticket: 204, `X-GitLab-Last-Update` (the runner's own, still current),
    /// `Gitlab-Ci-Builds-Polling: yes` (`workhorse/internal/builds/register.go`).
    pub(crate) fn edge_no_content(last_update: &str) -> Answer {
        Answer {
            status: 204,
            headers: vec![
                ("x-gitlab-last-update", last_update.to_owned()),
                ("gitlab-ci-builds-polling", "yes".into()),
            ],
            body: None,
            retry_after: false,
        }
    }

    /// The answer for a decided outcome; `None` when the request is forwarded.
    pub(crate) fn for_outcome(pool: Pool, outcome: &Outcome) -> Option<Answer> {
        match outcome {
            Outcome::Forward { .. } => None,
            Outcome::Unauthorized(why) if pool == Pool::KasK8sProxy => {
                Some(Answer::kas_unauthorized(why))
            }
            Outcome::Unauthorized(why) => Some(Answer::message(
                401,
                &format!("401 Unauthorized: {why}"),
                false,
            )),
            Outcome::Refused(refusal) => Some(Answer::refusal(refusal)),
            Outcome::Unavailable(why) => Some(Answer::message(
                503,
                &format!("503 Service Unavailable: {why}"),
                true,
            )),
        }
    }

    /// A failed proxy attempt as the client sees it: no upstream of the Pod
    /// reachable → 503 + `Retry-After` (the runner retries); upstream timeout → 504;
    /// other upstream failures → 502; a client that went away → nothing (status 0).
    pub(crate) fn for_error(e: &Error) -> (u16, Option<Answer>) {
        let (code, message, retry_after) = match (e.esource(), e.etype()) {
            (_, ErrorType::HTTPStatus(code)) => (*code, reason(*code), false),
            (
                ErrorSource::Upstream | ErrorSource::Internal,
                ErrorType::ConnectTimedout
                | ErrorType::ConnectRefused
                | ErrorType::ConnectNoRoute
                | ErrorType::ConnectError
                | ErrorType::TLSHandshakeFailure,
            ) => (
                503,
                "503 Service Unavailable: no upstream of the Pod is reachable",
                true,
            ),
            (ErrorSource::Upstream, ErrorType::ReadTimedout) => (
                504,
                "504 Gateway Timeout: the Pod did not answer in time",
                false,
            ),
            (ErrorSource::Upstream, _) => (502, "502 Bad Gateway: the Pod failed", false),
            // pingora's chunked-body parser (`InvalidChunk`: a size that overflows,
            // a chunk without its CRLF) sets no source; the body is the client's.
            // NGINX (`ngx_http_parse_chunked`) and Go's `net/http` (Workhorse) answer
            // 400, and the connection's framing is lost: it closes.
            (_, ErrorType::Custom(name)) if *name == INVALID_CHUNK => {
                (400, "400 Bad Request: invalid chunked body", false)
            }
            (
                ErrorSource::Downstream,
                ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed,
            ) => (0, "", false),
            (ErrorSource::Downstream, _) => (400, "400 Bad Request", false),
            _ => (500, "500 Internal Server Error", false),
        };
        let answer = (code > 0).then(|| Answer::message(code, message, retry_after));
        (code, answer)
    }

    /// The same answer to a gRPC call (HTTP/2, `content-type: application/grpc…`):
    /// a trailers-only response, HTTP 200 with `grpc-status` and `grpc-message` and
    /// no body. The code is the one grpc-go (gitlab-runner's and agentk's gRPC) gives
    /// a plain HTTP answer of this status (`HTTPStatusConvTab`,
    /// <https://github.com/grpc/grpc-go/blob/v1.66.0/internal/transport/http_util.go>),
    /// so a grpc-go client reads the same either way, and other clients (tonic
    /// maps a plain 502 to `INTERNAL`) read what grpc-go reads: runners' breaker
    /// counts an unreachable kas as `UNAVAILABLE`.
    pub(crate) fn as_grpc(&self) -> Answer {
        let code = match self.status {
            400 => 13,             // INTERNAL
            401 => 16,             // UNAUTHENTICATED
            403 => 7,              // PERMISSION_DENIED
            404 => 12,             // UNIMPLEMENTED
            429 | 502..=504 => 14, // UNAVAILABLE
            _ => 2,                // UNKNOWN
        };
        let message = self
            .body
            .as_ref()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(b).ok())
            .and_then(|v| v["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| format!("{} {}", self.status, reason(self.status)));
        let mut headers = vec![
            ("content-type", "application/grpc".to_owned()),
            ("grpc-status", code.to_string()),
            ("grpc-message", grpc_message(&message)),
        ];
        headers.extend(self.headers.iter().cloned());
        Answer {
            status: 200,
            headers,
            body: None,
            retry_after: false,
        }
    }

    /// As pingora's response header, `X-Request-Id` included.
    pub(crate) fn response_header(&self, request_id: &str) -> Result<ResponseHeader> {
        let mut resp = ResponseHeader::build(self.status, Some(self.headers.len() + 4))?;
        if let Some(body) = &self.body {
            resp.insert_header("content-type", "application/json")?;
            resp.insert_header("content-length", body.len().to_string())?;
        }
        for (name, value) in &self.headers {
            resp.insert_header(*name, value.as_str())?;
        }
        resp.insert_header("x-request-id", request_id)?;
        if self.retry_after {
            resp.insert_header("retry-after", "5")?;
        }
        Ok(resp)
    }

    /// As HTTP/1.1 bytes, header and body, appended to `out` (one write).
    /// `close`: the connection ends after it (`Connection: close`).
    pub(crate) fn write_h1(&self, request_id: &str, close: bool, out: &mut Vec<u8>) {
        use std::io::Write as _;
        let _ = write!(out, "HTTP/1.1 {} {}\r\n", self.status, reason(self.status));
        if let Some(body) = &self.body {
            let _ = write!(
                out,
                "content-type: application/json\r\ncontent-length: {}\r\n",
                body.len()
            );
        }
        for (name, value) in &self.headers {
            let _ = write!(out, "{name}: {value}\r\n");
        }
        let _ = write!(out, "x-request-id: {request_id}\r\n");
        if self.retry_after {
            out.extend_from_slice(b"retry-after: 5\r\n");
        }
        if close {
            out.extend_from_slice(b"connection: close\r\n");
        }
        out.extend_from_slice(b"\r\n");
        if let Some(body) = &self.body {
            out.extend_from_slice(body);
        }
    }
}

/// Whether a request is a gRPC call: HTTP/2 with `content-type: application/grpc`
/// or `application/grpc+…` (gRPC over HTTP/2, "Requests").
pub(crate) fn is_grpc(http2: bool, headers: &http::HeaderMap) -> bool {
    http2
        && headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| {
                ct == "application/grpc"
                    || ct.starts_with("application/grpc+")
                    || ct.starts_with("application/grpc;")
            })
}

/// `grpc-message`'s percent-encoding (gRPC over HTTP/2: bytes outside 0x20-0x7E,
/// and `%`, as `%XX`).
fn grpc_message(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for b in message.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The canonical reason phrase of `status`.
pub(crate) fn reason(status: u16) -> &'static str {
    http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_renderings_carry_the_same_fields() {
        let a = Answer::message(503, "503 Service Unavailable: pod_draining", true);
        let mut raw = Vec::new();
        a.write_h1("abc", false, &mut raw);
        let text = String::from_utf8(raw).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{text}"
        );
        assert!(text.contains("retry-after: 5\r\n"));
        assert!(text.contains("x-request-id: abc\r\n"));
        assert!(text.ends_with("\r\n\r\n{\"message\":\"503 Service Unavailable: pod_draining\"}"));
        assert!(!text.contains("connection: close"));
        let h = a.response_header("abc").unwrap();
        assert_eq!(h.status.as_u16(), 503);
        assert_eq!(h.headers["retry-after"], "5");
        assert_eq!(
            h.headers["content-length"],
            a.body.as_ref().unwrap().len().to_string()
        );
    }

    #[test]
    fn an_edge_no_content_has_no_body_and_the_ticket() {
        let mut raw = Vec::new();
        Answer::edge_no_content("t1").write_h1("id", true, &mut raw);
        let text = String::from_utf8(raw).unwrap();
        assert_eq!(
            text,
            "HTTP/1.1 204 No Content\r\nx-gitlab-last-update: t1\r\ngitlab-ci-builds-polling: yes\r\nx-request-id: id\r\nconnection: close\r\n\r\n"
        );
    }

    #[test]
    fn a_grpc_call_gets_the_status_grpc_go_reads_from_the_http_one() {
        let a = Answer::message(503, "503 Service Unavailable: no upstream 100%", true).as_grpc();
        assert_eq!(a.status, 200);
        assert_eq!(a.body, None);
        assert!(!a.retry_after);
        assert_eq!(
            a.headers,
            [
                ("content-type", "application/grpc".to_owned()),
                ("grpc-status", "14".to_owned()),
                (
                    "grpc-message",
                    "503 Service Unavailable: no upstream 100%25".to_owned()
                ),
            ]
        );
        let h = a.response_header("id").unwrap();
        assert_eq!(h.status.as_u16(), 200);
        assert!(h.headers.get("content-length").is_none());
        for (status, code) in [
            (401, "16"),
            (403, "7"),
            (404, "12"),
            (400, "13"),
            (429, "14"),
            (504, "14"),
            (413, "2"),
        ] {
            let a = Answer::message(status, "x", false).as_grpc();
            assert_eq!(a.headers[1], ("grpc-status", code.to_owned()), "{status}");
        }
        let mut h = http::HeaderMap::new();
        h.insert("content-type", "application/grpc+proto".parse().unwrap());
        assert!(is_grpc(true, &h));
        assert!(!is_grpc(false, &h));
        h.insert("content-type", "application/grpc-web".parse().unwrap());
        assert!(!is_grpc(true, &h));
    }

    #[test]
    fn an_unparsable_chunked_body_is_the_clients_400() {
        let e = Error::explain(
            ErrorType::Custom("InvalidChunk"),
            "Invalid chunked encoding",
        );
        let (code, answer) = Answer::for_error(&e);
        assert_eq!(code, 400);
        assert_eq!(answer.unwrap().status, 400);
        // From the Pod's side it is the Pod's failure.
        let e = Error::explain(
            ErrorType::Custom("InvalidChunk"),
            "Invalid chunked encoding",
        )
        .into_up();
        assert_eq!(Answer::for_error(&e).0, 502);
    }

    #[test]
    fn refusals_name_status_code_and_detail() {
        let r = Refusal::bad_request("missing_host", "no Host");
        let a = Answer::refusal(&r);
        assert_eq!(a.status, 400);
        assert_eq!(
            a.body.unwrap(),
            Bytes::from(r#"{"message":"400 Bad Request: missing_host: no Host"}"#)
        );
    }
}
