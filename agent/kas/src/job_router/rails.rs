//! A `GetJob` answered from the Cell's Rails: the runner's `job_request` as the
//! body of `POST /api/v4/jobs/request`, and Rails' answer as gitlab-runner reads a
//! `GetJob` answer (`router/client.go` in gitlab-org/gitlab-runner):
//!
//! | Rails (`lib/api/ci/runner.rb`, `post '/request'`) | `GetJob` |
//! |---|---|
//! | `201` with the job JSON | OK, `job_response` = that JSON |
//! | `204` with `X-GitLab-Last-Update` | OK, empty, `x-gitlab-last-update` |
//! | `401` | `UNAUTHENTICATED` |
//! | `403` (`authenticate_runner!`: unknown or blocked token) | `PERMISSION_DENIED` |
//! | `409` (`conflict!`: the job went to another runner) | `ABORTED` |
//! | `400`, `422` | `INVALID_ARGUMENT` |
//! | `429` | `RESOURCE_EXHAUSTED` |
//! | `5xx`, no answer | `UNAVAILABLE` (gitlab-runner counts it toward its breaker) |
//!
//! Every answer carries `x-request-id`: Rails' `X-Request-Id` when it sent one,
//! else the runner's own (gitlab-runner reads it as the job's correlation id).

use http::{HeaderMap, StatusCode};
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::{Response, Status};

use crate::gitlab::{Answer, GitlabClient};
use podgate_agent::proto::gitlab::agent::job_router::rpc::GetJobResponse;

/// Rails' path for a job request.
pub(crate) const JOBS_REQUEST: &str = "/api/v4/jobs/request";
/// The response metadata gitlab-runner stores as its next `last_update`.
pub(crate) const LAST_UPDATE: &str = "x-gitlab-last-update";
/// The correlation id, both ways.
pub(crate) const REQUEST_ID: &str = "x-request-id";

/// What the call came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answered {
    Job,
    Empty,
    Refused,
    Failed,
}

/// Ask Rails with `job_request` (the runner's bytes), forwarding `request_id` and
/// `user_agent`.
pub(crate) async fn ask(
    gitlab: &GitlabClient,
    job_request: Vec<u8>,
    token: &str,
    request_id: &str,
    user_agent: Option<&str>,
) -> Result<Answer, crate::gitlab::Error> {
    let mut headers = vec![("Runner-Token", token), ("X-Request-Id", request_id)];
    if let Some(ua) = user_agent {
        headers.push(("User-Agent", ua));
    }
    gitlab
        .request(
            http::Method::POST,
            JOBS_REQUEST,
            &headers,
            Some(job_request),
            false,
        )
        .await
}

/// An empty answer (no job) with `last_update` as the runner's next ticket.
pub(crate) fn empty(last_update: &str, request_id: &str) -> Response<GetJobResponse> {
    let mut r = Response::new(GetJobResponse::default());
    put(r.metadata_mut(), LAST_UPDATE, last_update);
    put(r.metadata_mut(), REQUEST_ID, request_id);
    r
}

/// Rails' answer as a `GetJob` answer (module docs).
pub(crate) fn answer(
    answer: Answer,
    request_id: &str,
) -> (Answered, Result<Response<GetJobResponse>, Status>) {
    let id = header(&answer.headers, "x-request-id").unwrap_or(request_id);
    let text = || {
        let body = String::from_utf8_lossy(&answer.body);
        let body = body.trim();
        let body: String = body.chars().take(200).collect();
        format!("GitLab answered {}: {body}", answer.status)
    };
    match answer.status {
        StatusCode::CREATED => {
            let mut r = Response::new(GetJobResponse {
                job_response: answer.body.to_vec(),
            });
            if let Some(lu) = header(&answer.headers, "x-gitlab-last-update") {
                put(r.metadata_mut(), LAST_UPDATE, lu);
            }
            put(r.metadata_mut(), REQUEST_ID, id);
            (Answered::Job, Ok(r))
        }
        StatusCode::NO_CONTENT => {
            let lu = header(&answer.headers, "x-gitlab-last-update").unwrap_or_default();
            (Answered::Empty, Ok(empty(lu, id)))
        }
        StatusCode::UNAUTHORIZED => (Answered::Refused, Err(Status::unauthenticated(text()))),
        StatusCode::FORBIDDEN => (Answered::Refused, Err(Status::permission_denied(text()))),
        StatusCode::CONFLICT => (Answered::Failed, Err(Status::aborted(text()))),
        StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY => {
            (Answered::Failed, Err(Status::invalid_argument(text())))
        }
        StatusCode::TOO_MANY_REQUESTS => {
            (Answered::Failed, Err(Status::resource_exhausted(text())))
        }
        s if s.is_server_error() => (Answered::Failed, Err(Status::unavailable(text()))),
        _ => (Answered::Failed, Err(Status::unknown(text()))),
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Set `name` to `value` when it is a valid metadata value (Rails' and the runner's
/// values are ASCII; anything else is left out rather than failing the call).
fn put(metadata: &mut MetadataMap, name: &'static str, value: &str) {
    if let Ok(v) = value.parse::<AsciiMetadataValue>() {
        metadata.insert(name, v);
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn rails(status: u16, headers: &[(&str, &str)], body: &str) -> Answer {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        Answer {
            status: StatusCode::from_u16(status).unwrap(),
            headers: h,
            body: Bytes::from(body.to_owned()),
        }
    }

    #[test]
    fn rails_answers_become_what_gitlab_runner_reads() {
        let (r, a) = answer(
            rails(201, &[("x-request-id", "rails-1")], r#"{"id":7}"#),
            "runner-1",
        );
        let a = a.unwrap();
        assert_eq!(r, Answered::Job);
        assert_eq!(a.get_ref().job_response, br#"{"id":7}"#);
        assert_eq!(a.metadata().get(REQUEST_ID).unwrap(), "rails-1");

        let (r, a) = answer(
            rails(204, &[("X-GitLab-Last-Update", "lu2")], ""),
            "runner-2",
        );
        let a = a.unwrap();
        assert_eq!(r, Answered::Empty);
        assert!(a.get_ref().job_response.is_empty());
        assert_eq!(a.metadata().get(LAST_UPDATE).unwrap(), "lu2");
        assert_eq!(a.metadata().get(REQUEST_ID).unwrap(), "runner-2");

        for (status, code) in [
            (401, tonic::Code::Unauthenticated),
            (403, tonic::Code::PermissionDenied),
            (409, tonic::Code::Aborted),
            (400, tonic::Code::InvalidArgument),
            (429, tonic::Code::ResourceExhausted),
            (502, tonic::Code::Unavailable),
            (503, tonic::Code::Unavailable),
            (404, tonic::Code::Unknown),
        ] {
            let (_, a) = answer(rails(status, &[], "{\"message\":\"no\"}"), "id");
            let e = a.unwrap_err();
            assert_eq!(e.code(), code, "{status}");
            assert!(e.message().contains(&status.to_string()), "{e:?}");
        }
    }
}
