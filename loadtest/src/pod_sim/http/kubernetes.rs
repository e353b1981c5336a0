//! The two endpoints GitLab's kas calls for its Kubernetes API proxy (rules in
//! [`super::super::kubernetes`]):
//!
//! - `POST /api/v4/internal/kubernetes/authorize_proxy_user`
//!   (`lib/api/internal/kubernetes.rb`): first `authenticate_gitlab_kas_request!`
//!   (`lib/api/helpers/kas_helpers.rb`): the `Gitlab-Kas-Api-Request` header must be
//!   an HS256 JWT signed with the GitLab ↔ kas secret, issuer `gitlab-kas` (`401
//!   {"message": "KAS JWT authentication invalid"}` otherwise, and always when the
//!   simulator has no secret); then Grape's `params` block (`agent_id` Integer,
//!   `access_type` one of `session_cookie`, `personal_access_token`, `access_key`,
//!   and a non-blank `csrf_token` for `session_cookie`: 400 naming the parameter).
//! - `GET /api/v4/job/allowed_agents` (`lib/api/ci/jobs.rb`): the job token in
//!   `Job-Token` (or `job_token` / `token`), the job must be running (401 otherwise,
//!   as `find_user_from_job_token` refuses); a token of another Pod is a misroute
//!   (403).

use http::{HeaderMap, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::Value;

use super::super::Shared;
use super::super::params::{self, Declared};
use super::super::state::{JobState, Owner};
use super::{Body, grape_error, message, misrouted, read, reply};

/// The header kas authenticates with.
const KAS_HEADER: &str = "gitlab-kas-api-request";

/// `Gitlab::Kas.verify_api_request`: an HS256 JWT, issuer `gitlab-kas`, not expired.
fn kas_request_ok(shared: &Shared, headers: &HeaderMap) -> bool {
    let Some(secret) = &shared.config.kas_secret else {
        return false;
    };
    let Some(token) = headers.get(KAS_HEADER).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
    validation.set_issuer(&["gitlab-kas"]);
    validation.validate_aud = false;
    validation.set_required_spec_claims(&["exp", "iss"]);
    jsonwebtoken::decode::<Value>(
        token,
        &jsonwebtoken::DecodingKey::from_secret(secret),
        &validation,
    )
    .is_ok()
}

fn refusal((status, body): (u16, Value)) -> Response<Body> {
    reply(
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        body,
    )
}

/// `POST /api/v4/internal/kubernetes/authorize_proxy_user`.
pub(crate) async fn authorize_proxy_user(
    shared: &Shared,
    req: Request<Incoming>,
) -> Response<Body> {
    if !kas_request_ok(shared, req.headers()) {
        return message(StatusCode::UNAUTHORIZED, "KAS JWT authentication invalid");
    }
    let parsed = match read(shared, req).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    let p = &parsed.params;
    let mut errors = Vec::new();
    let agent_id = match p.get("agent_id") {
        None => {
            errors.push("agent_id is missing".to_owned());
            None
        }
        Some(Value::Number(n)) if n.is_i64() => n.as_i64(),
        Some(Value::String(s)) => match s.trim().parse::<i64>() {
            Ok(n) => Some(n),
            Err(_) => {
                errors.push("agent_id is invalid".to_owned());
                None
            }
        },
        Some(_) => {
            errors.push("agent_id is invalid".to_owned());
            None
        }
    };
    let string = |key: &str, errors: &mut Vec<String>| match params::string(p, key) {
        Ok(Declared::Value(s)) => Some(s),
        Ok(Declared::Missing) => {
            errors.push(format!("{key} is missing"));
            None
        }
        Ok(Declared::Null) => None,
        Err(e) => {
            errors.push(e);
            None
        }
    };
    let access_type = string("access_type", &mut errors);
    if access_type
        .as_deref()
        .is_some_and(|t| t != "session_cookie" && t != "personal_access_token")
    {
        errors.push("access_type does not have a valid value".into());
    }
    let access_key = string("access_key", &mut errors);
    let csrf = if access_type.as_deref() == Some("session_cookie") {
        let c = string("csrf_token", &mut errors);
        if c.as_deref().is_some_and(|c| c.trim().is_empty()) {
            errors.push("csrf_token is empty".into());
        }
        c
    } else {
        None
    };
    if !errors.is_empty() {
        return grape_error(StatusCode::BAD_REQUEST, &errors.join(", "));
    }
    let (Some(agent_id), Some(access_type), Some(access_key)) = (agent_id, access_type, access_key)
    else {
        return message(
            StatusCode::BAD_REQUEST,
            "400 Bad request - Unable to get user from request data",
        );
    };
    // A personal access token of another Pod: the proxy sent it to the wrong Pod.
    if access_type == "personal_access_token"
        && !shared.kube.is_pat(&access_key)
        && let Owner::Misrouted(pod) = shared.state.owner_of(&access_key)
    {
        return misrouted(shared, pod);
    }
    match shared
        .kube
        .authorize_proxy_user(agent_id, &access_type, &access_key, csrf.as_deref())
    {
        Ok(v) => reply(StatusCode::OK, v),
        Err(r) => refusal(r),
    }
}

/// `GET /api/v4/job/allowed_agents`.
pub(crate) async fn allowed_agents(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let parsed = match read(shared, req).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    // `find_user_from_job_token`: the `job_token` or `token` parameter, else the header.
    let token = ["job_token", "token"]
        .iter()
        .find_map(|k| {
            params::string(&parsed.params, k)
                .ok()?
                .value()
                .map(str::to_owned)
        })
        .or_else(|| super::header(&parsed.headers, "job-token"))
        .unwrap_or_default();
    let unauthorized = || message(StatusCode::UNAUTHORIZED, "401 Unauthorized");
    let id = match shared.state.job_by_token(&token) {
        Owner::Ours(id) => id,
        Owner::Misrouted(pod) => return misrouted(shared, pod),
        Owner::Unknown => return unauthorized(),
    };
    match shared.state.job(id) {
        Some(job) if job.state == JobState::Running => {
            reply(StatusCode::OK, shared.kube.allowed_agents(id))
        }
        _ => unauthorized(),
    }
}
