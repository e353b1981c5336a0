//! Registration and the other runner-token endpoints (`lib/api/ci/runner.rb`,
//! `resource :runners`). Each declares `requires :token, type: String` (400 when it
//! is missing) and authenticates `params[:token]` only: the `RUNNER-TOKEN` header
//! new runners also send is not read (403 for a wrong token). Verify, reset and
//! `jobs/request` record the runner manager of `system_id` (`DELETE
//! /runners/managers` of an unknown one is 404).

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::{Value, json};

use super::super::Shared;
use super::super::queue::matching::tag_list;
use super::super::state::{AccessLevel, Owner, RunnerSpec};
use super::{
    Body, Declare, authenticate_runner, empty, forbidden, grape_error, message, misrouted,
    read_declared, reply, runner_token,
};

fn expires_at() -> Value {
    Value::Null
}

/// `POST /runners`: the registration token is `params[:token]`
/// (`Ci::Runners::RegisterRunnerService.new(params[:token], …)`): the instance
/// registration token registers an instance runner, a project's a project runner.
/// The runner's attributes are Grape's `optional` parameters of `lib/api/ci/runner.rb`:
/// `tag_list` (`type: Array[String], coerce_with: CommaSeparatedToArray.coerce`),
/// `run_untagged`, `locked`, `paused`, `active` (Booleans; `paused` wins over the
/// deprecated `active`), `access_level` (`not_protected` or `ref_protected`). A runner
/// without tags that does not run untagged jobs is refused with `Ci::Runner`'s
/// validation error (400 `{"message": {"tags_list": [...]}}`).
pub(crate) async fn register(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let declared = Declare {
        required: &["token"],
        strings: &[
            "description",
            "maintenance_note",
            "maintainer_note",
            "access_level",
        ],
        hashes: &["info"],
    };
    let parsed = match read_declared(shared, req, &declared).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    let params = &parsed.params;
    let mut errors = Vec::new();
    let mut boolean = |key: &str| match params.get(key) {
        None | Some(Value::Null) => None,
        Some(v) => match grape_boolean(v) {
            Some(b) => Some(b),
            None => {
                errors.push(format!("{key} is invalid"));
                None
            }
        },
    };
    let active = boolean("active");
    let paused = boolean("paused");
    let locked = boolean("locked");
    let run_untagged = boolean("run_untagged");
    let access_level = match params.get("access_level") {
        None | Some(Value::Null) => Some(AccessLevel::NotProtected),
        Some(v) => AccessLevel::parse(&grape_string(v)),
    };
    let Some(access_level) = access_level else {
        errors.push("access_level does not have a valid value".into());
        return grape_error(StatusCode::BAD_REQUEST, &errors.join(", "));
    };
    if !errors.is_empty() {
        return grape_error(StatusCode::BAD_REQUEST, &errors.join(", "));
    }
    let runner_type = match shared.state.check_registration(&runner_token(params)) {
        Owner::Ours(t) => t,
        Owner::Misrouted(pod) => return misrouted(shared, pod),
        Owner::Unknown => return forbidden(),
    };
    let spec = RunnerSpec {
        runner_type,
        tags: params.get("tag_list").map(tag_list).unwrap_or_default(),
        run_untagged: run_untagged.unwrap_or(true),
        locked: locked.unwrap_or(false),
        access_level,
        // `attributes[:active] = !attributes.delete(:paused) if attributes.include?(:paused)`.
        paused: paused.unwrap_or(!active.unwrap_or(true)),
        description: params
            .get("description")
            .map(grape_string)
            .unwrap_or_default(),
    };
    if let Err(e) = spec.validate() {
        return reply(
            StatusCode::BAD_REQUEST,
            json!({ "message": { "tags_list": [e] } }),
        );
    }
    match shared.state.register_runner(spec) {
        Ok((id, token)) => reply(
            StatusCode::CREATED,
            json!({ "id": id, "token": token, "token_expires_at": expires_at() }),
        ),
        Err(e) => message(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// A scalar parameter as Ruby's `to_s` writes it.
fn grape_string(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Grape's `Boolean` coercion (dry-types `Params::Bool`, on the value's `to_s`):
/// `None` when the value is not one of its true or false words.
fn grape_boolean(v: &Value) -> Option<bool> {
    const TRUE: [&str; 14] = [
        "1", "on", "On", "ON", "t", "true", "True", "TRUE", "T", "y", "yes", "Yes", "YES", "Y",
    ];
    const FALSE: [&str; 14] = [
        "0", "off", "Off", "OFF", "f", "false", "False", "FALSE", "F", "n", "no", "No", "NO", "N",
    ];
    if v.is_array() || v.is_object() {
        return None;
    }
    let s = grape_string(v);
    if TRUE.contains(&s.as_str()) {
        Some(true)
    } else if FALSE.contains(&s.as_str()) {
        Some(false)
    } else {
        None
    }
}

/// `POST /runners/verify`.
pub(crate) async fn verify(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let declared = Declare {
        required: &["token"],
        strings: &["system_id"],
        hashes: &["info"],
    };
    let parsed = match read_declared(shared, req, &declared).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    let token = runner_token(&parsed.params);
    match authenticate_runner(shared, &token) {
        Ok(id) => {
            ensure_manager(shared, id, &parsed.params);
            reply(
                StatusCode::OK,
                json!({ "id": id, "token": token, "token_expires_at": expires_at() }),
            )
        }
        Err(r) => r,
    }
}

/// `GET /runners/router/discovery` (GitLab 18.7+, "Discover Job Router information"
/// in GitLab's runners API documentation; gitlab-runner's `GetRouterDiscovery` in
/// `network/gitlab.go` sends `Runner-Token` and reads `server_url`): the runner of
/// the `Runner-Token` header authenticated (403 otherwise), then `200
/// {"server_url": …}` with the Job Router's URL, or `501` when the router is off
/// on this Pod (gitlab-runner then polls `jobs/request`).
pub(crate) fn discovery(shared: &Shared, req: &Request<Incoming>) -> Response<Body> {
    let token = super::header(req.headers(), "runner-token").unwrap_or_default();
    if let Err(r) = authenticate_runner(shared, &token) {
        return r;
    }
    match &shared.config.job_router_url {
        Some(url) => reply(StatusCode::OK, json!({ "server_url": url })),
        None => message(
            StatusCode::NOT_IMPLEMENTED,
            "501 Not Implemented - the Job Router is not enabled",
        ),
    }
}

/// `authenticate_runner!` with `ensure_runner_manager: true` records the manager of
/// `params[:system_id]`, `<legacy>` without one.
pub(crate) fn ensure_manager(shared: &Shared, runner: u64, params: &super::super::params::Params) {
    let system_id = params
        .get("system_id")
        .and_then(Value::as_str)
        .unwrap_or("<legacy>");
    shared.state.ensure_manager(runner, system_id);
}

/// `DELETE /runners`.
pub(crate) async fn unregister(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let declared = Declare {
        required: &["token"],
        strings: &[],
        hashes: &[],
    };
    let parsed = match read_declared(shared, req, &declared).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    let token = runner_token(&parsed.params);
    match authenticate_runner(shared, &token) {
        Ok(_) => {
            shared.state.unregister(&token);
            empty(StatusCode::NO_CONTENT)
        }
        Err(r) => r,
    }
}

/// `DELETE /runners/managers` (`requires :token, :system_id`).
pub(crate) async fn managers(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let declared = Declare {
        required: &["token", "system_id"],
        strings: &[],
        hashes: &[],
    };
    let parsed = match read_declared(shared, req, &declared).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    let system_id = parsed
        .params
        .get("system_id")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match authenticate_runner(shared, &runner_token(&parsed.params)) {
        Ok(runner) if shared.state.remove_manager(runner, system_id) => {
            empty(StatusCode::NO_CONTENT)
        }
        Ok(_) => message(StatusCode::NOT_FOUND, "404 Runner manager not found"),
        Err(r) => r,
    }
}

/// `POST /runners/reset_authentication_token`.
pub(crate) async fn reset(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let declared = Declare {
        required: &["token"],
        strings: &[],
        hashes: &[],
    };
    let parsed = match read_declared(shared, req, &declared).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    let token = runner_token(&parsed.params);
    match authenticate_runner(shared, &token) {
        Ok(id) => ensure_manager(shared, id, &parsed.params),
        Err(r) => return r,
    }
    match shared.state.reset_token(&token) {
        Ok(Some(new)) => reply(
            StatusCode::CREATED,
            json!({ "token": new, "token_expires_at": expires_at() }),
        ),
        Ok(None) => forbidden(),
        Err(e) => message(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}
