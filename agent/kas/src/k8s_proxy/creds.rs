//! Credentials of a proxy request, read exactly as GitLab's kas reads them
//! (`getAuthorizationInfoFromRequest` and helpers in
//! `internal/module/kubernetes_api/server/proxy.go`; docs/graph-api.md §2):
//!
//! 1. `Authorization` (exactly one): `Bearer <type>:<agent id>:<token>`, type `ci`
//!    (a CI job token) or `pat` (a personal, project or group access token);
//! 2. else the `_gitlab_kas` cookie (URL-unescaped: the encrypted public session
//!    id), with the agent id from `Gitlab-Agent-Id` or, when that header is absent,
//!    the `gitlab-agent-id` query parameter, and the CSRF token from `X-Csrf-Token`
//!    or `gitlab-csrf-token` (browsers cannot set headers on a WebSocket upgrade);
//! 3. else nothing usable: "no valid credentials provided".
//!
//! Every failure is a 401 whose cause is kas's own error text.

use std::collections::HashMap;

use http::HeaderMap;
use podgate_agent::httpz::{parse_query, query_unescape};
use podgate_agent::proto::gitlab::agent::prototool::Values;

/// A query string's parameters, decoded as Go's `url.ParseQuery` decodes them.
type Query = HashMap<String, Values>;

const COOKIE_NAME: &str = "_gitlab_kas";
const BEARER: &str = "Bearer ";
/// `Gitlab-Agent-Id` (`httpz.GitlabAgentIdHeader`).
pub(super) const AGENT_ID_HEADER: &str = "gitlab-agent-id";
/// `gitlab-agent-id` (`httpz.GitlabAgentIdQueryParam`).
pub(super) const AGENT_ID_PARAM: &str = "gitlab-agent-id";
/// `X-Csrf-Token` (`httpz.CsrfTokenHeader`).
pub(super) const CSRF_HEADER: &str = "x-csrf-token";
/// `gitlab-csrf-token` (`httpz.CsrfTokenQueryParam`).
pub(super) const CSRF_PARAM: &str = "gitlab-csrf-token";

/// What the request authenticates with.
#[derive(Clone, PartialEq, Eq)]
pub(super) enum Credentials {
    /// `Bearer ci:<agent>:<job token>`.
    CiJob {
        /// The CI job token.
        token: String,
    },
    /// `Bearer pat:<agent>:<access token>`.
    Pat {
        /// The access token.
        token: String,
    },
    /// The `_gitlab_kas` cookie.
    SessionCookie {
        /// The encrypted public session id (the cookie's value, unescaped).
        session: String,
        /// The CSRF token.
        csrf: String,
    },
}

impl std::fmt::Debug for Credentials {
    /// Never the secrets themselves: their fingerprints.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::CiJob { token } => {
                write!(f, "CiJob({})", podgate_tokens::fingerprint(token))
            }
            Credentials::Pat { token } => write!(f, "Pat({})", podgate_tokens::fingerprint(token)),
            Credentials::SessionCookie { session, .. } => {
                write!(f, "SessionCookie({})", podgate_tokens::fingerprint(session))
            }
        }
    }
}

/// The agent id and credentials of a request, or why there are none (kas's error
/// text, answered as 401 "Unauthorized: <text>").
pub(super) fn extract(headers: &HeaderMap, query: &str) -> Result<(i64, Credentials), String> {
    let authz: Vec<&[u8]> = headers
        .get_all(http::header::AUTHORIZATION)
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    if !authz.is_empty() {
        if authz.len() > 1 {
            return Err(format!(
                "Authorization header: expecting a single header, got {}",
                authz.len()
            ));
        }
        let value = String::from_utf8_lossy(authz[0]);
        let (agent_id, kind, token) = agent_id_and_token(&value)?;
        return Ok(match kind {
            TokenType::Ci => (agent_id, Credentials::CiJob { token }),
            TokenType::Pat => (agent_id, Credentials::Pat { token }),
        });
    }
    if let Some(cookie) = cookie(headers, COOKIE_NAME) {
        if cookie.is_empty() {
            return Err(format!("{COOKIE_NAME} cookie value must not be empty"));
        }
        // Rails (Rack) escapes cookie values.
        let session =
            query_unescape(&cookie).ok_or_else(|| format!("{COOKIE_NAME} invalid cookie value"))?;
        let params = parse_query(query);
        let agent_id = agent_id_for_cookie(headers, &params)?;
        let csrf = csrf_for_cookie(headers, &params)?;
        return Ok((agent_id, Credentials::SessionCookie { session, csrf }));
    }
    Err("no valid credentials provided".into())
}

enum TokenType {
    Ci,
    Pat,
}

/// `getAgentIdAndTokenFromHeader`.
fn agent_id_and_token(header: &str) -> Result<(i64, TokenType, String), String> {
    let value = header
        .strip_prefix(BEARER)
        .ok_or_else(|| format!("Authorization header: expecting {BEARER}token"))?;
    let (kind, contents) = value
        .split_once(':')
        .ok_or("Authorization header: invalid value")?;
    let kind = match kind {
        "ci" => TokenType::Ci,
        "pat" => TokenType::Pat,
        _ => return Err("Authorization header: unknown token type".into()),
    };
    let (agent, token) = contents
        .split_once(':')
        .ok_or("Authorization header: invalid value")?;
    let agent_id = agent
        .parse::<i64>()
        .map_err(|e| format!("Authorization header: failed to parse: parsing {agent:?}: {e}"))?;
    if token.is_empty() {
        return Err("Authorization header: empty token".into());
    }
    Ok((agent_id, kind, token.to_owned()))
}

/// The header's values (each header line one value, as Go's `Header[name]`).
fn header_values<'a>(headers: &'a HeaderMap, name: &str) -> Vec<&'a [u8]> {
    headers.get_all(name).iter().map(|v| v.as_bytes()).collect()
}

/// `getAgentIdForSessionCookieRequest`.
fn agent_id_for_cookie(headers: &HeaderMap, params: &Query) -> Result<i64, String> {
    let value = header_or_param(headers, AGENT_ID_HEADER, params, AGENT_ID_PARAM).map_err(
        |missing| match missing {
            NotOne::Header => "Gitlab-Agent-Id header must have exactly one value".to_owned(),
            NotOne::Param => format!(
                "exactly one agent id must be provided either in the \"Gitlab-Agent-Id\" header or {AGENT_ID_PARAM:?} query parameter"
            ),
        },
    )?;
    value
        .parse::<i64>()
        .map_err(|_| format!("agent id in request: invalid value: {value:?}"))
}

/// `getCsrfTokenForSessionCookieRequest`.
fn csrf_for_cookie(headers: &HeaderMap, params: &Query) -> Result<String, String> {
    header_or_param(headers, CSRF_HEADER, params, CSRF_PARAM).map_err(|missing| match missing {
        NotOne::Header => "X-Csrf-Token header must have exactly one value".to_owned(),
        NotOne::Param => format!(
            "exactly one CSRF token must be provided either in the \"X-Csrf-Token\" header or {CSRF_PARAM:?} query parameter"
        ),
    })
}

/// Where [`header_or_param`] found no single value.
enum NotOne {
    /// The header is there more than once.
    Header,
    /// No header, and the parameter is not there exactly once.
    Param,
}

/// The value of `header` if present (exactly one), else of exactly one query
/// parameter `param`.
fn header_or_param(
    headers: &HeaderMap,
    header: &str,
    params: &Query,
    param: &str,
) -> Result<String, NotOne> {
    let values = header_values(headers, header);
    match values.len() {
        1 => return Ok(String::from_utf8_lossy(values[0]).into_owned()),
        0 => {}
        _ => return Err(NotOne::Header),
    }
    match params.get(param).map(|v| v.value.as_slice()) {
        Some([one]) => Ok(one.clone()),
        _ => Err(NotOne::Param),
    }
}

/// The first cookie called `name` in any `Cookie` header (Go's `Request.Cookie`;
/// surrounding double quotes dropped).
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|line| line.split(';'))
        .filter_map(|part| part.trim().split_once('='))
        .find(|(k, _)| k.trim() == name)
        .map(|(_, v)| {
            let v = v.trim();
            v.strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v)
                .to_owned()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn err(pairs: &[(&str, &str)], query: &str) -> String {
        extract(&headers(pairs), query).unwrap_err()
    }

    #[test]
    fn bearer_forms() {
        assert_eq!(
            extract(&headers(&[("authorization", "Bearer pat:7:glpat-x")]), "").unwrap(),
            (
                7,
                Credentials::Pat {
                    token: "glpat-x".into()
                }
            )
        );
        assert_eq!(
            extract(&headers(&[("authorization", "Bearer ci:-1:a:b")]), "").unwrap(),
            (
                -1,
                Credentials::CiJob {
                    token: "a:b".into()
                }
            )
        );
        assert!(err(&[("authorization", "Basic x")], "").contains("expecting Bearer token"));
        assert!(err(&[("authorization", "Bearer pat")], "").contains("invalid value"));
        assert!(err(&[("authorization", "Bearer pat:1")], "").contains("invalid value"));
        assert!(err(&[("authorization", "Bearer xyz:1:tok")], "").contains("unknown token type"));
        assert!(err(&[("authorization", "Bearer pat:abc:tok")], "").contains("failed to parse"));
        assert!(err(&[("authorization", "Bearer pat:1:")], "").contains("empty token"));
        assert!(
            err(
                &[
                    ("authorization", "Bearer pat:1:a"),
                    ("authorization", "Bearer pat:1:a")
                ],
                ""
            )
            .contains("expecting a single header, got 2")
        );
        assert_eq!(err(&[], ""), "no valid credentials provided");
    }

    #[test]
    fn the_header_wins_over_the_cookie() {
        let h = headers(&[
            ("authorization", "Bearer ci:3:tok"),
            ("cookie", "_gitlab_kas=abc"),
        ]);
        assert_eq!(extract(&h, "").unwrap().0, 3);
    }

    #[test]
    fn cookie_with_headers_or_query_parameters() {
        let h = headers(&[
            ("cookie", "other=1; _gitlab_kas=a%2Fb%3D"),
            ("gitlab-agent-id", "5"),
            ("x-csrf-token", "csrf"),
        ]);
        assert_eq!(
            extract(&h, "").unwrap(),
            (
                5,
                Credentials::SessionCookie {
                    session: "a/b=".into(),
                    csrf: "csrf".into()
                }
            )
        );
        let h = headers(&[("cookie", "_gitlab_kas=s")]);
        assert_eq!(
            extract(&h, "watch=1&gitlab-agent-id=9&gitlab-csrf-token=c%2Bd").unwrap(),
            (
                9,
                Credentials::SessionCookie {
                    session: "s".into(),
                    csrf: "c+d".into()
                }
            )
        );
        // The header is taken when both are there.
        let h = headers(&[("cookie", "_gitlab_kas=s"), ("gitlab-agent-id", "4")]);
        assert_eq!(
            extract(&h, "gitlab-agent-id=9&gitlab-csrf-token=c")
                .unwrap()
                .0,
            4
        );
    }

    #[test]
    fn cookie_failures() {
        assert!(err(&[("cookie", "_gitlab_kas=")], "").contains("must not be empty"));
        assert!(err(&[("cookie", "_gitlab_kas=%zz")], "").contains("invalid cookie value"));
        assert!(
            err(
                &[
                    ("cookie", "_gitlab_kas=s"),
                    ("gitlab-agent-id", "1"),
                    ("gitlab-agent-id", "1")
                ],
                "gitlab-csrf-token=c"
            )
            .contains("Gitlab-Agent-Id header must have exactly one value")
        );
        assert!(
            err(&[("cookie", "_gitlab_kas=s")], "gitlab-csrf-token=c")
                .contains("exactly one agent id")
        );
        assert!(
            err(
                &[("cookie", "_gitlab_kas=s")],
                "gitlab-agent-id=1&gitlab-agent-id=2"
            )
            .contains("exactly one agent id")
        );
        assert!(err(&[("cookie", "_gitlab_kas=s")], "gitlab-agent-id=x").contains("invalid value"));
        assert!(
            err(&[("cookie", "_gitlab_kas=s")], "gitlab-agent-id=1")
                .contains("exactly one CSRF token")
        );
        assert!(
            err(
                &[
                    ("cookie", "_gitlab_kas=s"),
                    ("x-csrf-token", "a"),
                    ("x-csrf-token", "b")
                ],
                "gitlab-agent-id=1"
            )
            .contains("X-Csrf-Token header must have exactly one value")
        );
    }

    #[test]
    fn debug_shows_no_secret() {
        let c = Credentials::Pat {
            token: "glpat-secretsecretsecret".into(),
        };
        assert!(!format!("{c:?}").contains("secretsecret"));
    }
}
