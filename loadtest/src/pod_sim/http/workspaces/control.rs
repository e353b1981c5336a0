//! The control API's workspace calls (`/-/podsim/…`, routed from `http/control.rs`):
//! agent tokens, an agent's workspaces configuration, and workspaces: create,
//! list, show, and change the desired state.
//!
//! A workspace's view: `{"id", "name", "namespace", "agent_id", "user_id", "url",
//! "desired_state", "actual_state", "deployment_resource_version",
//! "responded_to_agent_at", "desired_state_updated_at", "actual_state_updated_at",
//! "created_at"}`, times in ISO 8601 UTC with microseconds (`responded_to_agent_at`
//! null until first returned to the agent).

use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Serialize;
use serde_json::{Map, Value, json};

use super::super::super::Shared;
use super::super::super::repo;
use super::super::super::workspaces::store::{NewWorkspace, StoreError};
use super::super::super::workspaces::{DesiredState, Workspace, WorkspaceSpec, agent_config};
use super::super::{Body, message, reply};
use super::{integer_param, json_bytes};

/// A JSON reply serialised field by field, so the keys keep the order of the
/// struct (Rails' hash order), which a `serde_json::Value` would sort.
fn json_reply(status: StatusCode, body: &impl Serialize) -> Response<Body> {
    match serde_json::to_vec(body) {
        Ok(bytes) => json_bytes(status, bytes),
        Err(e) => message(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// A JSON control body (at most 1 MiB), or the response to send.
async fn json_body(req: Request<Incoming>) -> Result<Value, Response<Body>> {
    let bytes = match Limited::new(req.into_body(), 1 << 20).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return Err(message(
                StatusCode::PAYLOAD_TOO_LARGE,
                "413 Request Entity Too Large",
            ));
        }
    };
    serde_json::from_slice(&bytes)
        .map_err(|e| message(StatusCode::BAD_REQUEST, &format!("400 Bad request - {e}")))
}

fn bad_request(m: impl std::fmt::Display) -> Response<Body> {
    message(StatusCode::BAD_REQUEST, &format!("400 Bad request - {m}"))
}

/// Unix microseconds as ISO 8601 UTC (`2026-01-02T03:04:05.123456Z`).
pub(crate) fn iso8601(micros: u64) -> String {
    let secs = micros / 1_000_000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        micros % 1_000_000
    )
}

/// A workspace as the control API shows it.
#[derive(Serialize)]
struct View<'a> {
    id: u64,
    name: &'a str,
    namespace: &'a str,
    agent_id: i64,
    user_id: u64,
    url: &'a str,
    desired_state: &'static str,
    actual_state: &'static str,
    deployment_resource_version: Option<&'a str>,
    responded_to_agent_at: Option<String>,
    desired_state_updated_at: String,
    actual_state_updated_at: String,
    created_at: String,
}

fn view(ws: &Workspace) -> View<'_> {
    View {
        id: ws.id,
        name: &ws.name,
        namespace: &ws.namespace,
        agent_id: ws.agent_id,
        user_id: ws.user_id,
        url: &ws.url,
        desired_state: ws.desired_state.as_str(),
        actual_state: ws.actual_state.as_str(),
        deployment_resource_version: ws.deployment_resource_version.as_deref(),
        responded_to_agent_at: ws.responded_to_agent_at.map(iso8601),
        desired_state_updated_at: iso8601(ws.desired_state_updated_at),
        actual_state_updated_at: iso8601(ws.actual_state_updated_at),
        created_at: iso8601(ws.created_at),
    }
}

fn not_found() -> Response<Body> {
    message(StatusCode::NOT_FOUND, "404 Workspace Not Found")
}

fn agent_not_found() -> Response<Body> {
    message(StatusCode::NOT_FOUND, "404 Agent Not Found")
}

/// `POST /-/podsim/agents/N/tokens` `{"token": "…"}`: 201 `{"agent_id": N}`.
pub(crate) async fn add_agent_token(
    shared: &Shared,
    req: Request<Incoming>,
    agent: &str,
) -> Response<Body> {
    let Some(agent) = agent.parse().ok().filter(|a| shared.kube.has_agent(*a)) else {
        return agent_not_found();
    };
    let body = match json_body(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let Some(token) = body.get("token").and_then(Value::as_str) else {
        return bad_request("token is missing");
    };
    match shared.kube.add_agent_token(token.to_owned(), agent) {
        Ok(()) => reply(StatusCode::CREATED, json!({"agent_id": agent})),
        Err(e) => bad_request(e),
    }
}

/// `PUT /-/podsim/agents/N/workspaces_config` with the agent's `remote_development`
/// keys: 200 with the stored configuration.
pub(crate) async fn put_workspaces_config(
    shared: &Shared,
    req: Request<Incoming>,
    agent: &str,
) -> Response<Body> {
    let Some(agent) = agent.parse().ok().filter(|a| shared.kube.has_agent(*a)) else {
        return agent_not_found();
    };
    let body = match json_body(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    if !body.is_object() {
        return bad_request("the body must be the remote_development keys, an object");
    }
    match agent_config::from_remote_development(agent, &body) {
        Ok(c) => {
            shared.workspaces.put_agent_config(c.clone());
            json_reply(StatusCode::OK, &c)
        }
        Err(e) => message(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}

/// `POST /-/podsim/workspaces` `{"agent_id", "user_id" (1), …WorkspaceSpec}`: 201
/// view.
pub(crate) async fn create(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let body = match json_body(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let Value::Object(mut fields) = body else {
        return bad_request("the body must be an object");
    };
    let agent_id = match fields.remove("agent_id").map(|v| integer_param(Some(&v))) {
        Some(Ok(a)) => a,
        None => return bad_request("agent_id is missing"),
        Some(Err(_)) => return bad_request("agent_id is invalid"),
    };
    let user_id = match fields.remove("user_id").map(|v| integer_param(Some(&v))) {
        None => 1,
        Some(Ok(u)) if u > 0 => u as u64,
        Some(_) => return bad_request("user_id is invalid"),
    };
    if !shared.kube.has_agent(agent_id) {
        return agent_not_found();
    }
    if !shared.kube.users().iter().any(|u| u.id == user_id) {
        return message(StatusCode::NOT_FOUND, "404 User Not Found");
    }
    let spec: WorkspaceSpec = match serde_json::from_value(Value::Object(Map::from_iter(fields))) {
        Ok(s) => s,
        Err(e) => return bad_request(e),
    };
    let project = repo::project_path(shared.state.pod());
    let project = project.rsplit('/').next().unwrap_or(&project).to_owned();
    let created = shared.workspaces.create(
        NewWorkspace {
            agent_id,
            user_id,
            spec,
        },
        &project,
    );
    shared.metrics.refresh_workspaces(&shared.workspaces);
    match created {
        Ok(ws) => json_reply(StatusCode::CREATED, &view(&ws)),
        Err(e) => message(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}

/// `GET /-/podsim/workspaces`: `{"workspaces": [view…]}`.
pub(crate) fn list(shared: &Shared) -> Response<Body> {
    #[derive(Serialize)]
    struct List<'a> {
        workspaces: Vec<View<'a>>,
    }
    let all = shared.workspaces.list();
    json_reply(
        StatusCode::OK,
        &List {
            workspaces: all.iter().map(view).collect(),
        },
    )
}

/// `GET /-/podsim/workspaces/N`.
pub(crate) fn show(shared: &Shared, id: &str) -> Response<Body> {
    match id.parse().ok().and_then(|id| shared.workspaces.get(id)) {
        Some(ws) => json_reply(StatusCode::OK, &view(&ws)),
        None => not_found(),
    }
}

/// `PATCH /-/podsim/workspaces/N` `{"desired_state": "Stopped"}`: 200 view; 400
/// with Rails' message (`Workspace update failed: …`).
pub(crate) async fn update(shared: &Shared, req: Request<Incoming>, id: &str) -> Response<Body> {
    let Some(id) = id
        .parse()
        .ok()
        .filter(|id| shared.workspaces.get(*id).is_some())
    else {
        return not_found();
    };
    let body = match json_body(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let Some(name) = body.get("desired_state").and_then(Value::as_str) else {
        return bad_request("desired_state is missing");
    };
    let Some(state) = DesiredState::parse(name) else {
        // `validates :desired_state, inclusion: { in: VALID_DESIRED_STATES }`.
        return message(
            StatusCode::BAD_REQUEST,
            "Workspace update failed: Desired state is not included in the list",
        );
    };
    let result = shared.workspaces.set_desired_state(id, state);
    shared.metrics.refresh_workspaces(&shared.workspaces);
    match result {
        Ok(ws) => json_reply(StatusCode::OK, &view(&ws)),
        Err(StoreError::NotFound(_)) => not_found(),
        Err(e) => message(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::iso8601;

    #[test]
    fn iso8601_dates() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(iso8601(951_782_400_000_001), "2000-02-29T00:00:00.000001Z");
        assert_eq!(
            iso8601(1_798_761_599_999_999),
            "2026-12-31T23:59:59.999999Z"
        );
    }
}
