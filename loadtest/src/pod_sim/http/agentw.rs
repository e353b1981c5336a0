//! GitLab's internal API for kas's Workspaces HTTP server ("agentw" mode, GitLab
//! 18.4+), `ee/lib/api/remote_development/internal/agent/agentw/*.rb`; both behind
//! `authenticate_gitlab_kas_request!` (kas's JWT, 401 `KAS JWT authentication
//! invalid`):
//!
//! - `GET /api/v4/internal/agents/agentw/server_config`: always 200
//!   `{"api_external_url", "oauth_client_id", "oauth_redirect_url"}`
//!   (`workspaces_server_operations/server_config/*.rb`): `api_external_url` is
//!   `gitlab_kas.external_url` with scheme `https` for `grpcs`/`wss` (else `http`)
//!   and `/workspaces` appended to its path; the redirect URL appends
//!   `/oauth/redirect` to that. The OAuth application GitLab creates lazily is
//!   simulated by a fixed client id per Pod.
//! - `GET /api/v4/internal/agents/agentw/authorize_user_access?workspace_host=&user_id=`:
//!   Grape `requires :workspace_host, type: String` and `requires :user_id, type:
//!   Integer` (400 as Grape words it), then **always 200** `{"status", "info"}`
//!   (`workspaces_server_operations/authorize_user_access/*.rb`): the host parsed as
//!   `workspace_host_parser.rb` does ([`parse_host`]), the workspace found by name
//!   alone (`Workspace.find_by_name`; the DNS zone is ignored), the owner only
//!   (`authorizer.rb`: `workspace.user_id == user_id`, no admin path), then the port
//!   among the `targetPort`s of the devfile's container endpoints. Success is
//!   `{"status": "AUTHORIZED", "info": {"port": "<port>", "workspace_id": N}}` (the
//!   port a string); failures `{"status": "<STATUS>", "info": {}}`. The
//!   workspace's state is not looked at: a stopped workspace of its owner is
//!   authorized (what is not running is the tunnel's business).

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::{Value, json};

use super::super::Shared;
use super::super::params;
use super::super::workspaces::Workspace;
use super::super::workspaces::desired_config::SSH_PORT;
use super::{Body, grape_error, reply};

/// `Status::AUTHORIZED` and the failures (`authorize_user_access/status.rb`).
pub(crate) mod status {
    /// The user may reach the port.
    pub(crate) const AUTHORIZED: &str = "AUTHORIZED";
    /// The host is not `<port>-<workspace name>.<zone>`.
    pub(crate) const INVALID_HOST: &str = "INVALID_HOST";
    /// No workspace by that name.
    pub(crate) const WORKSPACE_NOT_FOUND: &str = "WORKSPACE_NOT_FOUND";
    /// Not the workspace's owner.
    pub(crate) const NOT_AUTHORIZED: &str = "NOT_AUTHORIZED";
    /// The workspace does not expose the port.
    pub(crate) const PORT_NOT_FOUND: &str = "PORT_NOT_FOUND";
}

/// `OAUTH_REDIRECT_URI_PATH_SEGMENT` and `API_EXTERNAL_URL_PATH_SEGMENT`
/// (`oauth_application_attributes_generator.rb`).
const API_PATH_SEGMENT: &str = "workspaces";
const REDIRECT_PATH_SEGMENT: &str = "oauth/redirect";

/// `gitlab_kas.external_url`: the configured one, else Omnibus' default
/// (`wss://<GitLab host>/-/kubernetes-agent/`, `ws://` for plain HTTP).
fn kas_external_url(shared: &Shared) -> String {
    if let Some(u) = &shared.config.workspaces.kas_external_url {
        return u.clone();
    }
    let url = &shared.external_url;
    let ws = match url.split_once("://") {
        Some(("https", rest)) => format!("wss://{rest}"),
        Some((_, rest)) => format!("ws://{rest}"),
        None => format!("ws://{url}"),
    };
    format!("{ws}/-/kubernetes-agent/")
}

/// `api_external_url` as `OauthApplicationAttributesGenerator.generate` makes it:
/// scheme `https` for `grpcs`/`wss`, else `http`; the path gets `/workspaces`
/// appended (as Ruby's string interpolation does, a trailing `/` doubles).
pub(crate) fn api_external_url(kas_external_url: &str) -> String {
    let (scheme, rest) = kas_external_url
        .split_once("://")
        .unwrap_or(("", kas_external_url));
    let scheme = if matches!(scheme, "grpcs" | "wss") {
        "https"
    } else {
        "http"
    };
    let (authority, path) = match rest.find(['/', '?', '#']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    // URI#path= keeps the query and fragment apart; podgate's kas URLs carry none.
    let path = path.split(['?', '#']).next().unwrap_or("");
    format!("{scheme}://{authority}{path}/{API_PATH_SEGMENT}")
}

/// The simulated `workspaces_oauth_application`'s uid (Doorkeeper: 64 hex
/// characters), fixed per Pod.
fn oauth_client_id(shared: &Shared) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(format!("podsim-workspaces-oauth-{}", shared.state.pod()));
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// `GET /api/v4/internal/agents/agentw/server_config`.
pub(crate) fn server_config(shared: &Shared, req: &Request<Incoming>) -> Response<Body> {
    if let Err(r) = super::workspaces::check_kas(shared, req.headers()) {
        return r;
    }
    let api = api_external_url(&kas_external_url(shared));
    reply(
        StatusCode::OK,
        json!({
            "api_external_url": api,
            "oauth_client_id": oauth_client_id(shared),
            "oauth_redirect_url": format!("{api}/{REDIRECT_PATH_SEGMENT}"),
        }),
    )
}

/// `WorkspaceHostParser.parse_workspace_host`: `(port, workspace name)`, or `None`
/// (`INVALID_HOST`). A value with `://` is a URL whose host is taken (an
/// unparseable URL is invalid); the subdomain is the text before the first `.`,
/// split at its first `-`; both parts must be non-blank. The port is not checked
/// to be a number.
pub(crate) fn parse_host(workspace_host: &str) -> Option<(String, String)> {
    let hostname = if workspace_host.contains("://") {
        let uri: http::Uri = workspace_host.parse().ok()?;
        uri.host()?.to_owned()
    } else {
        workspace_host.to_owned()
    };
    let blank = |s: &str| s.trim().is_empty();
    if blank(&hostname) {
        return None;
    }
    let subdomain = hostname.split('.').next().unwrap_or("");
    let (port, name) = subdomain.split_once('-')?;
    if blank(port) || blank(name) {
        return None;
    }
    Some((port.to_owned(), name.to_owned()))
}

/// The `targetPort`s of the processed devfile's container endpoints: the spec's
/// ports plus the two endpoints Rails adds to the main container
/// (`main_component_updater.rb`: the editor and SSH ports).
fn exposed_ports(ws: &Workspace) -> impl Iterator<Item = u32> + '_ {
    ws.spec
        .ports
        .iter()
        .copied()
        .chain([u32::from(ws.spec.editor_port), SSH_PORT])
}

/// The `{status, info}` answer for `workspace_host` and `user_id`
/// (`AuthorizeUserAccess::Main`).
pub(crate) fn authorize(shared: &Shared, workspace_host: &str, user_id: i64) -> Value {
    let fail = |s: &str| json!({"status": s, "info": {}});
    let Some((port, name)) = parse_host(workspace_host) else {
        return fail(status::INVALID_HOST);
    };
    let Some(ws) = shared.workspaces.find_by_name(&name) else {
        return fail(status::WORKSPACE_NOT_FOUND);
    };
    if i64::try_from(ws.user_id).ok() != Some(user_id) {
        return fail(status::NOT_AUTHORIZED);
    }
    if !exposed_ports(&ws).any(|p| p.to_string() == port) {
        return fail(status::PORT_NOT_FOUND);
    }
    json!({
        "status": status::AUTHORIZED,
        "info": {"port": port, "workspace_id": ws.id},
    })
}

/// Grape's `type: Integer` coercion of a query value: an integer literal.
fn integer(v: &Value) -> Option<i64> {
    match v {
        Value::String(s) => s.trim().parse().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

/// `GET /api/v4/internal/agents/agentw/authorize_user_access`.
pub(crate) fn authorize_user_access(shared: &Shared, req: &Request<Incoming>) -> Response<Body> {
    if let Err(r) = super::workspaces::check_kas(shared, req.headers()) {
        return r;
    }
    let params = match params::query(req.uri()) {
        Ok(p) => p,
        Err(e) => return super::param_error(e),
    };
    let mut errors = Vec::new();
    let host = match params.get("workspace_host") {
        None => {
            errors.push("workspace_host is missing");
            None
        }
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            errors.push("workspace_host is invalid");
            None
        }
    };
    let user = match params.get("user_id") {
        None => {
            errors.push("user_id is missing");
            None
        }
        Some(v) => {
            let n = integer(v);
            if n.is_none() {
                errors.push("user_id is invalid");
            }
            n
        }
    };
    match (host, user) {
        (Some(host), Some(user)) if errors.is_empty() => {
            reply(StatusCode::OK, authorize(shared, &host, user))
        }
        _ => grape_error(StatusCode::BAD_REQUEST, &errors.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_parse_as_rails_parses_them() {
        let ok = |h: &str, port: &str, name: &str| {
            assert_eq!(
                parse_host(h),
                Some((port.to_owned(), name.to_owned())),
                "{h}"
            );
        };
        ok(
            "60001-workspace-4-1-n8dl59.workspaces.localtest.me",
            "60001",
            "workspace-4-1-n8dl59",
        );
        ok(
            "https://60001-workspace-4-1-n8dl59.workspaces.localtest.me/path?x=1",
            "60001",
            "workspace-4-1-n8dl59",
        );
        // Not checked to be numeric (WORKSPACE_NOT_FOUND later, not INVALID_HOST).
        ok("invalid-format", "invalid", "format");
        for bad in [
            "",
            "60001-.workspaces.localtest.me",
            "-workspace-1.zone",
            "workspace.zone",
            "https://60001-w.zone/path with a space",
            "https://",
        ] {
            assert_eq!(parse_host(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn api_external_url_as_rails_builds_it() {
        assert_eq!(
            api_external_url("wss://kas.example.com"),
            "https://kas.example.com/workspaces"
        );
        assert_eq!(
            api_external_url("grpcs://kas.example.com"),
            "https://kas.example.com/workspaces"
        );
        assert_eq!(
            api_external_url("ws://gdk.test:3000/-/kubernetes-agent"),
            "http://gdk.test:3000/-/kubernetes-agent/workspaces"
        );
        // Omnibus' default ends with `/`: Ruby's interpolation doubles it.
        assert_eq!(
            api_external_url("wss://gitlab.example.com/-/kubernetes-agent/"),
            "https://gitlab.example.com/-/kubernetes-agent//workspaces"
        );
        assert_eq!(
            api_external_url("grpc://127.0.0.1:8150"),
            "http://127.0.0.1:8150/workspaces"
        );
    }
}
