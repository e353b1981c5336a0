//! What kas reads off a workspace request: its host, bearer token and whether it
//! asks for an upgrade; the workspace and agent a host names.

use http::header;
use http::{HeaderMap, Request};
use hyper::body::Incoming;

/// The request's host: `Host`, else the URI's authority.
pub(super) fn request_host(req: &Request<Incoming>) -> Option<String> {
    req.headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_owned()))
}

/// The token of `Authorization: Bearer <token>`.
pub(super) fn bearer(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then(|| token.to_owned())
}

/// Whether the request asks for a connection upgrade.
pub(super) fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        || headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// The workspace name in a host, parsed as Rails parses it
/// (`workspace_host_parser.rb`): the text before the first `.`, after its first `-`.
pub fn workspace_name(host: &str) -> Option<String> {
    let subdomain = host.split('.').next()?;
    let (_, name) = subdomain.split_once('-')?;
    (!name.is_empty()).then(|| name.to_owned())
}

/// The agent id in a workspace name `workspace-<agent id>-<user id>-<random>`,
/// written as Rails writes it: decimal digits, no sign, no leading zero.
pub fn agent_of(name: &str) -> Option<i64> {
    let rest = name.strip_prefix("workspace-")?;
    let (agent, rest) = rest.split_once('-')?;
    rest.contains('-').then_some(())?;
    let canonical = agent.bytes().all(|b| b.is_ascii_digit()) && !agent.starts_with('0');
    canonical.then_some(())?;
    agent.parse().ok().filter(|a: &i64| *a > 0)
}
