//! Requests open to a Pod's kas, by client, for `podgate_proxy_kas_open`: runners on
//! GitLab's Job Router hold a `GetJob` call (or a `ws-tunnel` WebSocket) open for
//! as long as kas holds their long poll, so this is the edge's count of them.

use podgate_registry::Pod;

use crate::metrics;
use crate::rules::{Pool, Rule};
use crate::sources::Candidate;

/// One request open to a Pod's kas, in `podgate_proxy_kas_open{pod,client}` until
/// dropped with the request's context.
pub(crate) struct KasOpen(prometheus::IntGauge);

impl KasOpen {
    /// Count a request forwarded by `rule` to `pod` with `token`, if it goes to kas:
    /// `client="runner"` for a runner token (GitLab's Job Router: gitlab-runner's
    /// `router/` sends its runner token as the bearer), else `agent`.
    pub(crate) fn open(rule: &Rule, pod: &Pod, token: Option<&Candidate>) -> Option<KasOpen> {
        if rule.pool != Pool::Kas {
            return None;
        }
        let client = if token.is_some_and(|t| is_runner_token(&t.token)) {
            "runner"
        } else {
            "agent"
        };
        let gauge = metrics::METRICS
            .kas_open
            .with_label_values(&[pod.id.to_string().as_str(), client]);
        gauge.inc();
        Some(KasOpen(gauge))
    }
}

impl Drop for KasOpen {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl std::fmt::Debug for KasOpen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KasOpen")
    }
}

/// A runner authentication token: GitLab's `glrt-` (or `glrtr-`) prefix, after an
/// instance prefix if one is set (`acme-glrt-…`; `lib/authn/token_field/prefix_helper.rb`
/// in GitLab puts the instance prefix first).
fn is_runner_token(token: &str) -> bool {
    use podgate_tokens::TokenKind;
    let mut parts = token.split('-');
    let _body = parts.next_back();
    parts
        .take(2)
        .map(TokenKind::from_gitlab_prefix)
        .find(|k| *k != TokenKind::Other)
        == Some(TokenKind::Runner)
}

#[cfg(test)]
mod tests {
    use super::is_runner_token;

    #[test]
    fn runner_tokens_by_gitlab_prefix() {
        assert!(is_runner_token("glrt-AAAAGM6Mg.01.1b0zz5pn1"));
        assert!(is_runner_token("glrt-t1_abc-def"));
        assert!(is_runner_token("acme-glrt-abc"));
        assert!(is_runner_token("glrtr-abc"));
        assert!(!is_runner_token("glagent-abc"));
        assert!(!is_runner_token("glpat-glrt-abc"));
        assert!(!is_runner_token("glrt"));
        assert!(!is_runner_token("pat:1:glpat-x"));
    }
}
