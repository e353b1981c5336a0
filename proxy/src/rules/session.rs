//! The Pod of a request with no token: its `_gitlab_kas` or `_gitlab_session`
//! cookie's.

use http::HeaderMap;

use super::cookie;

/// The Pod a request without a token follows: with `kas_cookie` (a rule's
/// [`super::ByToken::kas_cookie`]), the `_gitlab_kas` cookie's Pod prefix; then the
/// `_gitlab_session` cookie's; `None`: the default Pod.
///
/// GitLab writes the `_gitlab_kas` cookie as the Rails session's
/// `session_cookie_token_prefix` (a Cell's `cell-<id>`, the same prefix its session
/// ids carry) followed directly, with no separator, by the encrypted public session
/// id (`Gitlab::Kas::UserAccess.cookie_data` in `lib/gitlab/kas/user_access.rb`;
/// releases before the prefix wrote the encrypted id alone, which names no Pod). A
/// prefix that is itself a prefix of another Pod's (`cell-1`, `cell-12`) cannot be
/// told apart from the encrypted bytes after it; such a value is not used.
/// Browsers send the session cookie along in the Omnibus layout
/// (`/-/kubernetes-agent/k8s-proxy/` is on GitLab's host), not to kas's own host.
pub fn session_pod<'a>(
    kas_cookie: bool,
    headers: &HeaderMap,
    topology: &'a podgate_registry::Topology,
) -> Option<&'a std::sync::Arc<podgate_registry::Pod>> {
    let by_kas_cookie = || {
        let value = cookie(headers, KAS_COOKIE)?;
        let mut matching = topology.pods.values().filter(|p| {
            let prefix = p.session_prefix();
            value.len() > prefix.len() && value.starts_with(&prefix)
        });
        let pod = matching.next()?;
        matching.next().is_none().then_some(pod)
    };
    kas_cookie
        .then(by_kas_cookie)
        .flatten()
        .or_else(|| topology.pod_for_session(super::session_cookie(headers)?))
}

/// GitLab's cookie for kas (`Gitlab::Kas::COOKIE_KEY`).
pub const KAS_COOKIE: &str = "_gitlab_kas";
