//! The simulator's control API, for tests and `podgate up --no-fleet` (not part of
//! GitLab's API; counted as `endpoint="control"`):
//!
//! - `GET /-/podsim`: `{"pod_id", "registration_token", "projects": [{"id",
//!   "registration_token"}], "external_url", "project_path", "repo_url", "sha",
//!   "ref"}`.
//! - `POST /-/podsim/jobs` with `{"name", "stage", "script": [..], "image": null |
//!   "alpine:3", "artifacts": [paths], "dependencies": [job ids], "tags": ["docker"],
//!   "project": 1002}` (every field optional; missing ones come from the simulator's
//!   job template, except `dependencies` and `tags`, which default to none, and
//!   `project`, which defaults to the Pod's projects in turn): 201 `{"id": N}`. The
//!   keys of the runners that can take the job are ticked.
//! - `GET /-/podsim/jobs/N`: `{"id", "name", "stage", "state", "runner_id", "sha",
//!   "tags", "project_id", "trace", "artifact": null | {"size", "sha256",
//!   "filename"}}`.
//! - `POST /-/podsim/runners/tick`: tick every runner's queue key, as Rails does when
//!   runners change (`tick_runner_queue`): 200 `{"ticked": N}`.
//! - `GET /-/podsim/jobs/N/artifact`: the stored file part's bytes.
//! - `GET /-/podsim/ledger`: the per-job ledger the fault drills check
//!   (`state/ledger.rs`): `{"pod_id", "jobs_created", "summary": {"picked",
//!   "picked_twice", "finished", "finished_once", "success", "failed", "unfinished",
//!   "duplicates"}, "misrouted", "jobs": [{"id", "picked_by": [runner ids],
//!   "finals": ["success"], "duplicates"}]}`; `GET /-/podsim/ledger/summary`: the
//!   same without `jobs`.
//!
//! For kas's Kubernetes API proxy (`authorize_proxy_user`, `job/allowed_agents`):
//!
//! - `GET /-/podsim/users`: `[{"id", "username", "access_level"}]` (user 1 `root`
//!   is the group's owner). `POST /-/podsim/users` with `{"username", "role":
//!   "developer" | null}` (the role in the Pod's group and project; null: not a
//!   member): 201 `{"id"}`.
//! - `POST /-/podsim/personal_access_tokens` with `{"username": "root", "scopes":
//!   ["k8s_proxy", "read_api"]}` (the defaults): 201 `{"id", "token", "user_id",
//!   "scopes"}`: a `glpat-` token routable to this Pod. `DELETE
//!   /-/podsim/personal_access_tokens/N` revokes it (204).
//! - `POST /-/podsim/sessions` with `{"username": "root"}`: 201 `{"cookie":
//!   "_gitlab_kas=<value>", "session", "csrf_token"}`: a browser session for the
//!   `_gitlab_kas` cookie and its CSRF token.
//! - `GET /-/podsim/agents`: `[{"id", "name", "user_access", "ci_access"}]`.
//!   `POST /-/podsim/agents` with one in that shape (the agent's `config.yaml`
//!   keys, e.g. `{"id": 1, "user_access": {"access_as": {"user": {}}, "projects":
//!   [{"id": "group/project-1"}]}}`): 201, replacing an agent of that id.
//!
//! For Workspaces (`workspaces.rs` answers; views described there):
//!
//! - `POST /-/podsim/agents/N/tokens` with `{"token": "glagent-…"}`: 201
//!   `{"agent_id": N}`: the token authenticates agent N's module requests
//!   (`Authorization: Bearer` or `Gitlab-Agentk-Api-Request`).
//! - `PUT /-/podsim/agents/N/workspaces_config` with the agent's
//!   `remote_development` keys (`{"enabled": true, "dns_zone": "…", …}`, what kas's
//!   `agent_configuration` would store): 200 with the stored configuration.
//! - `POST /-/podsim/workspaces` with `{"agent_id": 1, "user_id": 1, "image",
//!   "editor_port", "ports", "env", "files", "storage",
//!   "max_hours_before_termination"}` (all but `agent_id` optional): 201 view; 400
//!   `{"message": "Workspace create failed: …"}`.
//! - `GET /-/podsim/workspaces`: `{"workspaces": [view…]}`; `GET
//!   /-/podsim/workspaces/N`: view.
//! - `PATCH /-/podsim/workspaces/N` with `{"desired_state": "Stopped" | "Running" |
//!   "RestartRequested" | "Terminated"}`: 200 view; 400 `{"message": "Workspace
//!   update failed: Desired state is 'Terminated', and cannot be updated. Create a
//!   new workspace instead."}`.

use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::{Value, json};

use super::super::Shared;
use super::super::kubernetes::AgentSpec;
use super::super::repo::{self, BRANCH};
use super::super::state::JobSpec;
use super::artifacts::stream_file;
use super::{Body, message, reply};

/// The body of `POST /-/podsim/jobs`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewJob {
    name: Option<String>,
    stage: Option<String>,
    script: Option<Vec<String>>,
    /// Absent: the template's image; `null`: no image.
    #[serde(default, deserialize_with = "present")]
    image: Option<Option<String>>,
    artifacts: Option<Vec<String>>,
    #[serde(default)]
    dependencies: Vec<u64>,
    #[serde(default)]
    tags: Vec<String>,
    project: Option<u64>,
}

/// Tells an explicit `null` (`Some(None)`) from an absent field (`None`).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

pub(crate) async fn route(shared: &Shared, req: Request<Incoming>, rest: &str) -> Response<Body> {
    let parts: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    match (req.method(), parts.as_slice()) {
        (&Method::GET, []) => info(shared),
        (&Method::POST, ["jobs"]) => create(shared, req).await,
        (&Method::POST, ["runners", "tick"]) => {
            reply(StatusCode::OK, json!({ "ticked": shared.state.tick_all() }))
        }
        (&Method::GET, ["jobs", id]) => match id.parse() {
            Ok(id) => show(shared, id),
            Err(_) => message(StatusCode::NOT_FOUND, "404 Job Not Found"),
        },
        (&Method::GET, ["jobs", id, "artifact"]) => {
            match id.parse().ok().and_then(|id| shared.state.job(id)) {
                Some(job) => match job.artifact {
                    Some(a) => stream_file(&a).await,
                    None => message(StatusCode::NOT_FOUND, "404 Artifact Not Found"),
                },
                None => message(StatusCode::NOT_FOUND, "404 Job Not Found"),
            }
        }
        (&Method::GET, ["ledger"]) => ledger(shared, true),
        (&Method::GET, ["ledger", "summary"]) => ledger(shared, false),
        (&Method::GET, ["users"]) => reply(StatusCode::OK, json!(shared.kube.users())),
        (&Method::POST, ["users"]) => create_user(shared, req).await,
        (&Method::POST, ["personal_access_tokens"]) => create_pat(shared, req).await,
        (&Method::DELETE, ["personal_access_tokens", id]) => {
            match id.parse().ok().map(|id| shared.kube.revoke_pat(id)) {
                Some(true) => super::empty(StatusCode::NO_CONTENT),
                _ => message(StatusCode::NOT_FOUND, "404 Token Not Found"),
            }
        }
        (&Method::POST, ["sessions"]) => create_session(shared, req).await,
        (&Method::GET, ["agents"]) => reply(StatusCode::OK, json!(shared.kube.agents())),
        (&Method::POST, ["agents", id, "tokens"]) => {
            super::workspaces::add_agent_token(shared, req, id).await
        }
        (&Method::PUT, ["agents", id, "workspaces_config"]) => {
            super::workspaces::put_workspaces_config(shared, req, id).await
        }
        (&Method::POST, ["workspaces"]) => super::workspaces::create(shared, req).await,
        (&Method::GET, ["workspaces"]) => super::workspaces::list(shared),
        (&Method::GET, ["workspaces", id]) => super::workspaces::show(shared, id),
        (&Method::PATCH, ["workspaces", id]) => super::workspaces::update(shared, req, id).await,
        (&Method::POST, ["agents"]) => match body::<AgentSpec>(req).await {
            Ok(agent) => {
                shared.kube.put_agent(agent.clone());
                reply(StatusCode::CREATED, json!(agent))
            }
            Err(r) => r,
        },
        _ => message(StatusCode::NOT_FOUND, "404 Not Found"),
    }
}

/// A JSON control body, or the response to send.
async fn body<T: serde::de::DeserializeOwned>(req: Request<Incoming>) -> Result<T, Response<Body>> {
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewUser {
    username: String,
    #[serde(default)]
    role: Option<String>,
}

async fn create_user(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let new: NewUser = match body(req).await {
        Ok(n) => n,
        Err(r) => return r,
    };
    match shared.kube.add_user(&new.username, new.role.as_deref()) {
        Ok(id) => reply(StatusCode::CREATED, json!({ "id": id })),
        Err(e) => message(StatusCode::BAD_REQUEST, &format!("400 Bad request - {e}")),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewPat {
    #[serde(default = "root")]
    username: String,
    #[serde(default = "default_scopes")]
    scopes: Vec<String>,
}

fn root() -> String {
    "root".into()
}

fn default_scopes() -> Vec<String> {
    vec!["k8s_proxy".into(), "read_api".into()]
}

async fn create_pat(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let new: NewPat = match body(req).await {
        Ok(n) => n,
        Err(r) => return r,
    };
    let Some(user) = shared.kube.user_by_name(&new.username) else {
        return message(StatusCode::NOT_FOUND, "404 User Not Found");
    };
    let token = match shared.state.issue_personal_access_token() {
        Ok(t) => t,
        Err(e) => return message(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    match shared
        .kube
        .add_pat(token.clone(), user.id, new.scopes.clone())
    {
        Ok(id) => reply(
            StatusCode::CREATED,
            json!({ "id": id, "token": token, "user_id": user.id, "scopes": new.scopes }),
        ),
        Err(e) => message(StatusCode::BAD_REQUEST, &format!("400 Bad request - {e}")),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewSession {
    #[serde(default = "root")]
    username: String,
}

async fn create_session(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let new: NewSession = match body(req).await {
        Ok(n) => n,
        Err(r) => return r,
    };
    if shared.kube.user_by_name(&new.username).is_none() {
        return message(StatusCode::NOT_FOUND, "404 User Not Found");
    }
    match shared.kube.sign_in(&new.username) {
        Ok((session, csrf)) => reply(
            StatusCode::CREATED,
            json!({
                "cookie": format!("_gitlab_kas={session}"),
                "session": session,
                "csrf_token": csrf,
            }),
        ),
        Err(e) => message(StatusCode::BAD_REQUEST, &format!("400 Bad request - {e}")),
    }
}

fn sha(shared: &Shared) -> Value {
    shared.repo.as_ref().map_or(Value::Null, |r| json!(r.sha))
}

fn info(shared: &Shared) -> Response<Body> {
    let path = repo::project_path(shared.state.pod());
    reply(
        StatusCode::OK,
        json!({
            "pod_id": shared.state.pod().get(),
            "registration_token": shared.state.registration_token(),
            "projects": shared
                .state
                .project_registration_tokens()
                .into_iter()
                .map(|(id, token)| json!({ "id": id, "registration_token": token }))
                .collect::<Vec<_>>(),
            "external_url": shared.external_url,
            "project_path": path,
            "repo_url": format!("{}/{path}.git", shared.external_url),
            "sha": sha(shared),
            "ref": BRANCH,
        }),
    )
}

async fn create(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let body = match Limited::new(req.into_body(), 1 << 20).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return message(
                StatusCode::PAYLOAD_TOO_LARGE,
                "413 Request Entity Too Large",
            );
        }
    };
    let new: NewJob = match serde_json::from_slice(&body) {
        Ok(n) => n,
        Err(e) => return message(StatusCode::BAD_REQUEST, &format!("400 Bad request - {e}")),
    };
    let template = shared.state.job_template();
    let spec = JobSpec {
        name: new.name,
        stage: new.stage.unwrap_or_else(|| template.stage.clone()),
        script: new.script.unwrap_or_else(|| template.script.clone()),
        image: new.image.unwrap_or_else(|| template.image.clone()),
        artifacts: new.artifacts.unwrap_or_else(|| template.artifacts.clone()),
        dependencies: Some(new.dependencies),
        tags: new.tags,
        project: new.project,
    };
    if spec.script.is_empty() {
        return message(StatusCode::BAD_REQUEST, "400 Bad request - script is empty");
    }
    match shared.state.enqueue_spec(spec) {
        Ok(id) => {
            shared.metrics.queued.set(shared.state.queued() as i64);
            reply(StatusCode::CREATED, json!({ "id": id }))
        }
        Err(e) => message(StatusCode::BAD_REQUEST, &format!("400 Bad request - {e}")),
    }
}

/// `GET /-/podsim/ledger[/summary]`: the per-job ledger the drills check.
fn ledger(shared: &Shared, with_jobs: bool) -> Response<Body> {
    let (summary, jobs) = shared.state.ledger();
    let mut body = json!({
        "pod_id": shared.state.pod().get(),
        "jobs_created": shared.state.jobs_created(),
        "summary": summary,
        "misrouted": shared.metrics.misrouted.get(),
    });
    if with_jobs {
        body["jobs"] = json!(jobs);
    }
    reply(StatusCode::OK, body)
}

fn show(shared: &Shared, id: u64) -> Response<Body> {
    let Some(job) = shared.state.job(id) else {
        return message(StatusCode::NOT_FOUND, "404 Job Not Found");
    };
    reply(
        StatusCode::OK,
        json!({
            "id": job.id,
            "name": job.name,
            "stage": job.stage,
            "state": job.state.as_str(),
            "runner_id": job.runner,
            "sha": sha(shared),
            "tags": job.tags,
            "project_id": job.project,
            "trace": String::from_utf8_lossy(&job.trace),
            "trace_bytes": job.trace_len,
            "artifact": job.artifact.map(|a| json!({
                "size": a.size,
                "sha256": a.sha256,
                "filename": a.filename,
            })),
        }),
    )
}
