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
use super::super::state::Owner;
use super::{
    Body, Declare, authenticate_runner, empty, forbidden, message, misrouted, read_declared, reply,
    runner_token,
};

fn expires_at() -> Value {
    Value::Null
}

/// `POST /runners`: the registration token is `params[:token]`
/// (`Ci::Runners::RegisterRunnerService.new(params[:token], …)`).
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
    match shared
        .state
        .check_registration(&runner_token(&parsed.params))
    {
        Owner::Ours(()) => {}
        Owner::Misrouted(pod) => return misrouted(shared, pod),
        Owner::Unknown => return forbidden(),
    }
    match shared.state.register() {
        Ok((id, token)) => reply(
            StatusCode::CREATED,
            json!({ "id": id, "token": token, "token_expires_at": expires_at() }),
        ),
        Err(e) => message(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
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
