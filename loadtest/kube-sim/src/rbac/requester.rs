//! Who a request is served as when RBAC is enforced: the user its bearer token
//! authenticates, or the one its impersonation headers name when that user may
//! impersonate them.

use serde_json::Value;

use super::super::access::Identity;
use super::super::http::status;
use super::{Attributes, Policy, UserInfo};

/// The `Authorization: Bearer` token of a request, if any.
pub(in super::super) fn bearer(headers: &http::HeaderMap) -> Option<&str> {
    headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// The user a request is served as when RBAC is enforced: who its bearer token
/// says, or, with impersonation headers, the user they name, when that one may
/// `impersonate` each of them (`k8s.io/apiserver/pkg/endpoints/filters/impersonation.go`:
/// `users`, `groups` and `uids`, and `userextras/<key>` in
/// `authentication.k8s.io`). Impersonated users are also in
/// `system:authenticated`. Otherwise the answer: 401 for an unknown token, 403
/// for an impersonation not allowed.
pub(in super::super) fn requester(
    policy: &Policy,
    headers: &http::HeaderMap,
    id: &Identity,
) -> Result<UserInfo, (http::StatusCode, Value)> {
    let who = policy.authenticate(bearer(headers)).ok_or_else(|| {
        (
            http::StatusCode::UNAUTHORIZED,
            status(
                http::StatusCode::UNAUTHORIZED,
                "Unauthorized",
                "Unauthorized",
            ),
        )
    })?;
    let Some(user) = &id.user else {
        return Ok(who);
    };
    let mut asks: Vec<(&str, String, &str)> = vec![("", "users".into(), user.as_str())];
    asks.extend(
        id.groups
            .iter()
            .map(|g| ("", "groups".to_owned(), g.as_str())),
    );
    if let Some(uid) = &id.uid {
        asks.push(("authentication.k8s.io", "uids".into(), uid.as_str()));
    }
    for (key, values) in &id.extra {
        for v in values {
            asks.push((
                "authentication.k8s.io",
                format!("userextras/{key}"),
                v.as_str(),
            ));
        }
    }
    for (group, resource, name) in &asks {
        let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
        let a = Attributes {
            verb: "impersonate",
            group,
            resource,
            subresource,
            name,
            ..Attributes::default()
        };
        if !policy.allows(&who, &a) {
            let message = format!(
                "{resource} {name:?} is forbidden: User {:?} cannot impersonate resource {:?} in API group {group:?} at the cluster scope",
                who.name,
                if subresource.is_empty() {
                    resource.to_owned()
                } else {
                    format!("{resource}/{subresource}")
                }
            );
            return Err((
                http::StatusCode::FORBIDDEN,
                status(http::StatusCode::FORBIDDEN, "Forbidden", &message),
            ));
        }
    }
    let mut groups = id.groups.clone();
    if !groups.iter().any(|g| g == "system:authenticated") {
        groups.push("system:authenticated".into());
    }
    Ok(UserInfo {
        name: user.clone(),
        groups,
    })
}
