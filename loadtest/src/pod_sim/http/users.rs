//! `GET /api/v4/user` (`lib/api/users.rb`, `resource :user … get`): the user a
//! personal access token authenticates, as GitLab's API guard finds it
//! (`lib/api/api_guard.rb`, `lib/gitlab/auth/auth_finders.rb`): the token from
//! `PRIVATE-TOKEN`, the `private_token` parameter, or `Authorization: Bearer`.
//!
//! - no token, or one this Pod does not know: 401 `{"message": "401 Unauthorized"}`;
//! - a revoked token: 401 `{"error": "invalid_token", "error_description": "Token
//!   was revoked. You have to re-authorize from the user."}`;
//! - a token without `api`, `read_api` or `read_user` (the scopes a `GET` of
//!   `API::Users` allows, `allow_access_with_scope :read_user`): 403
//!   `insufficient_scope`;
//! - else 200 with the user entity (`API::Entities::UserPublic`'s fields that the
//!   simulator has).

use http::{HeaderMap, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json;

use super::super::Shared;
use super::super::kubernetes::PatUser;
use super::super::params;
use super::{Body, header, message, reply};

/// Scopes that may `GET /api/v4/user`.
const SCOPES: [&str; 3] = ["api", "read_api", "read_user"];

/// The token GitLab's guard reads for a personal access token.
fn token(headers: &HeaderMap, uri: &http::Uri) -> Option<String> {
    if let Some(t) = header(headers, "private-token").filter(|t| !t.is_empty()) {
        return Some(t);
    }
    if let Ok(q) = params::query(uri)
        && let Some(t) = q.get("private_token").and_then(|v| v.as_str())
        && !t.is_empty()
    {
        return Some(t.to_owned());
    }
    let auth = header(headers, "authorization")?;
    let (scheme, rest) = auth.split_once(' ')?;
    let t = rest.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !t.is_empty()).then(|| t.to_owned())
}

/// `GET /api/v4/user`.
pub(crate) fn current_user(shared: &Shared, req: &Request<Incoming>) -> Response<Body> {
    let unauthorized = || message(StatusCode::UNAUTHORIZED, "401 Unauthorized");
    let Some(token) = token(req.headers(), req.uri()) else {
        return unauthorized();
    };
    match shared.kube.pat_user(&token) {
        PatUser::Unknown => {
            tracing::debug!(
                token = %podgate_tokens::fingerprint(&token),
                "GET /user: unknown token"
            );
            unauthorized()
        }
        PatUser::Revoked => reply(
            StatusCode::UNAUTHORIZED,
            json!({"error": "invalid_token",
                   "error_description": "Token was revoked. You have to re-authorize from the user."}),
        ),
        PatUser::User(_, scopes) if !scopes.iter().any(|s| SCOPES.contains(&s.as_str())) => reply(
            StatusCode::FORBIDDEN,
            json!({"error": "insufficient_scope",
                       "error_description": "The request requires higher privileges than provided by the access token.",
                       "scope": SCOPES.join(" ")}),
        ),
        PatUser::User(u, _) => {
            let web_url = format!("{}/{}", shared.external_url, u.username);
            reply(
                StatusCode::OK,
                json!({
                    "id": u.id,
                    "username": u.username,
                    "public_email": null,
                    "name": u.username,
                    "state": "active",
                    "locked": false,
                    "avatar_url": null,
                    "web_url": web_url,
                    "created_at": "2024-01-01T00:00:00.000Z",
                    "bot": false,
                    "email": format!("{}@example.com", u.username),
                    "is_admin": u.id == 1,
                }),
            )
        }
    }
}
