//! GitLab's Workspaces endpoints (rules in [`super::super::workspaces`]):
//!
//! - `POST /api/v4/internal/kubernetes/modules/remote_development/reconcile` and
//!   `GET …/modules/remote_development/prerequisites` (`ee/lib/ee/api/internal/kubernetes.rb`):
//!   first kas's JWT (`authenticate_gitlab_kas_request!`: HS256, issuer
//!   `gitlab-kas`, audience `gitlab`; 401 `KAS JWT authentication invalid`), then `check_agent_token`: the
//!   agent token, from `Authorization: Bearer …` (what GitLab 16.5's kas sends) or
//!   else `Gitlab-Agentk-Api-Request` (newer kas; Rails reads both,
//!   `lib/gitlab/auth/auth_finders.rb`), must be an agent token of this Pod (401
//!   `401 Unauthorized` otherwise; a token routed to another Pod is also counted
//!   as a misroute), then the `remote_development` licence (403 `403 Forbidden -
//!   "remote_development" licensed feature is not available`). The reconcile
//!   answers 201 with the payload, 400 `{"message": {"error": "Workspace reconcile
//!   params validation failed: …"}}` (`render_api_error!({error: message}, 400)`),
//!   500 where Rails would raise. The prerequisites answer 200
//!   `{"shared_namespace": "…"}`, or 406 when the agent has no workspaces
//!   configuration.
//! - `POST /api/v4/internal/kubernetes/agent_configuration`
//!   (`lib/api/internal/kubernetes.rb`, `update_configuration` in the EE module):
//!   kas's JWT only; `agent_id` (Integer) and `agent_config` (JSON) required (400
//!   as Grape words it); an unknown agent is 404 `404 Not found`; the
//!   `remote_development` keys become the agent's workspaces configuration when
//!   licensed and valid; always 204.
//! - The control API's workspace calls (`/-/podsim/…`, routed from `control.rs`),
//!   in `workspaces/control.rs`.
//!
//! Layout: this file (kas's JWT and the agent token checks, the three endpoints
//! kas calls); `control` (the control API's workspace calls and a workspace's
//! view).

use http::{HeaderMap, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::{Value, json};

use super::super::Shared;
use super::super::kubernetes::AgentTokenOwner;
use super::super::params;
use super::super::workspaces::agent_config;
use super::super::workspaces::reconcile::{self, ReconcileError};
use super::{Body, empty, grape_error, header, message, reply};

mod control;

pub(crate) use control::{add_agent_token, create, list, put_workspaces_config, show, update};

/// Largest reconcile body read (a full reconcile of many workspaces carries every
/// Deployment).
const MAX_RECONCILE_BODY: usize = 64 << 20;

/// The header kas authenticates with.
const KAS_HEADER: &str = "gitlab-kas-api-request";

/// The header newer kas versions pass the agent's token in (GitLab 16.5's kas sends
/// `Authorization: Bearer`).
const AGENTK_HEADER: &str = "gitlab-agentk-api-request";

/// The agent token of a module request, as Rails finds it
/// (`cluster_agent_token_from_authorization_token`): `Authorization: Bearer` (or
/// `Token`), else `Gitlab-Agentk-Api-Request`.
fn agent_token(headers: &HeaderMap) -> String {
    header(headers, "authorization")
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("Token "))
                .map(|t| t.trim().to_owned())
        })
        .filter(|t| !t.is_empty())
        .or_else(|| header(headers, AGENTK_HEADER))
        .unwrap_or_default()
}

/// `forbidden!('"remote_development" licensed feature is not available')`.
const UNLICENSED: &str = "403 Forbidden - \"remote_development\" licensed feature is not available";

/// `not_acceptable!` of the prerequisites endpoint.
const NO_AGENT_CONFIG: &str = "The remote development workspaces config for the agent is invalid. \
     Please see https://docs.gitlab.com/user/workspace/settings/#configuration-reference";

/// Serialised JSON as the reply.
fn json_bytes(status: StatusCode, bytes: Vec<u8>) -> Response<Body> {
    let mut r = Response::new(super::full(bytes));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn unauthorized() -> Response<Body> {
    message(StatusCode::UNAUTHORIZED, "401 Unauthorized")
}

/// `Gitlab::Kas.verify_api_request` (`lib/gitlab/kas.rb`): the
/// `Gitlab-Kas-Api-Request` header is an HS256 JWT signed with the GitLab ↔ kas
/// secret, issuer `gitlab-kas`, audience `gitlab`; `exp` and `nbf` are checked when
/// present (ruby-jwt's rules; Rails' own specs send neither).
fn kas_request_ok(shared: &Shared, headers: &HeaderMap) -> bool {
    let Some(secret) = &shared.config.kas_secret else {
        return false;
    };
    let Some(token) = headers.get(KAS_HEADER).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
    validation.set_issuer(&["gitlab-kas"]);
    validation.set_audience(&["gitlab"]);
    validation.set_required_spec_claims(&["iss", "aud"]);
    validation.validate_nbf = true;
    jsonwebtoken::decode::<Value>(
        token,
        &jsonwebtoken::DecodingKey::from_secret(secret),
        &validation,
    )
    .is_ok()
}

/// `authenticate_gitlab_kas_request!`.
pub(crate) fn check_kas(shared: &Shared, headers: &HeaderMap) -> Result<(), Response<Body>> {
    if kas_request_ok(shared, headers) {
        Ok(())
    } else {
        Err(message(
            StatusCode::UNAUTHORIZED,
            "KAS JWT authentication invalid",
        ))
    }
}

/// `check_agent_token`: the agent the request's agent token names.
fn check_agent(shared: &Shared, headers: &HeaderMap) -> Result<i64, Response<Body>> {
    let token = agent_token(headers);
    if token.is_empty() {
        return Err(unauthorized());
    }
    match shared.kube.agent_for_token(&token) {
        AgentTokenOwner::Agent(id) => Ok(id),
        AgentTokenOwner::Misrouted(pod) => {
            shared.metrics.misrouted.inc();
            tracing::warn!(
                this_pod = %shared.state.pod(),
                token_pod = %pod,
                token = %podgate_tokens::fingerprint(&token),
                "misrouted module request: the agent token belongs to another Pod"
            );
            Err(unauthorized())
        }
        AgentTokenOwner::Unknown => Err(unauthorized()),
    }
}

/// kas, then the agent, then the licence.
fn module_request(shared: &Shared, headers: &HeaderMap) -> Result<i64, Response<Body>> {
    check_kas(shared, headers)?;
    let agent = check_agent(shared, headers)?;
    if !shared.config.workspaces.licensed {
        return Err(message(StatusCode::FORBIDDEN, UNLICENSED));
    }
    Ok(agent)
}

/// `POST /api/v4/internal/kubernetes/modules/remote_development/reconcile`.
pub(crate) async fn reconcile(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let agent = match module_request(shared, req.headers()) {
        Ok(a) => a,
        Err(r) => return r,
    };
    let limits = params::Limits {
        max_body: MAX_RECONCILE_BODY,
        max_file: shared.config.max_artifact_bytes,
        upload_dir: shared.artifacts.path(),
    };
    let parsed = match params::read(req, &limits).await {
        Ok(p) => p,
        Err(e) => return super::param_error(e),
    };
    let params = Value::Object(parsed.params);
    let update_type = params
        .get("update_type")
        .and_then(Value::as_str)
        .filter(|t| matches!(*t, "full" | "partial"))
        .unwrap_or("invalid");
    let settings = shared.config.workspaces.settings;
    let resp = match reconcile::plan(&shared.workspaces, agent, &params, settings) {
        Ok(plan) => {
            let infos = params["workspace_agent_infos"]
                .as_array()
                .map_or(0, Vec::len);
            // The objects and their YAML for many workspaces take a while: off the
            // async workers.
            let rendered = tokio::task::spawn_blocking(move || {
                let outcome = plan.render();
                let bytes = serde_json::to_vec(&outcome.response);
                (
                    outcome.response.workspace_rails_infos.len(),
                    outcome.orphans.len(),
                    bytes,
                )
            })
            .await;
            match rendered {
                Ok((returned, orphans, Ok(bytes))) => {
                    tracing::debug!(agent, update_type, infos, returned, orphans, "reconcile");
                    json_bytes(StatusCode::CREATED, bytes)
                }
                Ok((_, _, Err(e))) => message(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
                Err(e) => message(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
            }
        }
        Err(ReconcileError::BadRequest(m)) => {
            reply(StatusCode::BAD_REQUEST, json!({"message": {"error": m}}))
        }
        Err(ReconcileError::Internal(m)) => {
            tracing::warn!(agent, error = %m, "reconcile failed");
            message(
                StatusCode::INTERNAL_SERVER_ERROR,
                "500 Internal Server Error",
            )
        }
    };
    shared
        .metrics
        .workspace_reconciles
        .with_label_values(&[update_type, resp.status().as_str()])
        .inc();
    shared.metrics.refresh_workspaces(&shared.workspaces);
    resp
}

/// `GET /api/v4/internal/kubernetes/modules/remote_development/prerequisites`.
pub(crate) async fn prerequisites(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let agent = match module_request(shared, req.headers()) {
        Ok(a) => a,
        Err(r) => return r,
    };
    match shared.workspaces.agent_config(agent) {
        Some(c) => reply(
            StatusCode::OK,
            json!({"shared_namespace": c.shared_namespace}),
        ),
        None => message(StatusCode::NOT_ACCEPTABLE, NO_AGENT_CONFIG),
    }
}

/// `requires :agent_id, type: Integer`.
fn integer_param(v: Option<&Value>) -> Result<i64, &'static str> {
    match v {
        None => Err("missing"),
        Some(Value::Number(n)) => n.as_i64().ok_or("invalid"),
        Some(Value::String(s)) => s.trim().parse().map_err(|_| "invalid"),
        Some(_) => Err("invalid"),
    }
}

/// `POST /api/v4/internal/kubernetes/agent_configuration`.
pub(crate) async fn agent_configuration(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    if let Err(r) = check_kas(shared, req.headers()) {
        return r;
    }
    let parsed = match super::read(shared, req).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    let p = &parsed.params;
    let mut errors = Vec::new();
    let agent_id = match integer_param(p.get("agent_id")) {
        Ok(id) => Some(id),
        Err(why) => {
            errors.push(format!("agent_id is {why}"));
            None
        }
    };
    // `type: JSON`: an object (or array), or a string holding one.
    let config = match p.get("agent_config") {
        None => {
            errors.push("agent_config is missing".into());
            None
        }
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(v @ (Value::Object(_) | Value::Array(_))) => Some(v),
            _ => {
                errors.push("agent_config is invalid".into());
                None
            }
        },
        Some(v @ (Value::Object(_) | Value::Array(_))) => Some(v.clone()),
        Some(_) => {
            errors.push("agent_config is invalid".into());
            None
        }
    };
    let (Some(agent_id), Some(config)) = (agent_id, config) else {
        return grape_error(StatusCode::BAD_REQUEST, &errors.join(", "));
    };
    if !shared.kube.has_agent(agent_id) {
        return message(StatusCode::NOT_FOUND, "404 Not found");
    }
    if shared.config.workspaces.licensed {
        match agent_config::from_agent_config(agent_id, &config) {
            Ok(Some(c)) => shared.workspaces.put_agent_config(c),
            Ok(None) => {}
            // Rails logs the model's errors and answers 204 all the same.
            Err(e) => {
                tracing::warn!(agent_id, error = %e, "agent_configuration: workspaces agent config not saved")
            }
        }
    }
    empty(StatusCode::NO_CONTENT)
}
