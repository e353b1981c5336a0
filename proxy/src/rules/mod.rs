//! Ordered routing rules: the first rule whose method, path and header/cookie
//! conditions match decides how a request is routed ([`rule_for`]). What a rule
//! does with the request (whether it needs a token, how much body it reads, whether
//! its polls may be held at the edge) is in its fields, never in its name.
//!
//! - this module: the rule model and matching;
//! - [`builtin`]: the built-in table, with the GitLab source of each row;
//! - [`session_pod`]: the cookies' Pod, for a request with no token.

mod builtin;
mod session;

pub use builtin::{builtin, workspaces_rule};
pub use session::{KAS_COOKIE, session_pod};

use http::{HeaderMap, Method};
use podgate_tokens::PodId;
use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::sources::TokenSource;

/// How a rule matches the path.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum PathMatch {
    /// The path starts with this.
    Prefix(String),
    /// The path matches this regular expression.
    Regex(#[serde(with = "serde_regex")] Regex),
}

mod serde_regex {
    use regex::Regex;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(r: &Regex, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(r.as_str())
    }
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Regex, D::Error> {
        let s = String::deserialize(d)?;
        Regex::new(&s).map_err(serde::de::Error::custom)
    }
}

mod serde_regex_opt {
    use regex::Regex;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(r: &Option<Regex>, s: S) -> Result<S::Ok, S::Error> {
        match r {
            Some(r) => s.serialize_some(r.as_str()),
            None => s.serialize_none(),
        }
    }
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Regex>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|s| Regex::new(&s).map_err(serde::de::Error::custom))
            .transpose()
    }
}

impl PathMatch {
    fn matches(&self, path: &str) -> bool {
        match self {
            PathMatch::Prefix(p) => path.starts_with(p.as_str()),
            PathMatch::Regex(r) => r.is_match(path),
        }
    }
}

/// Which of a Pod's upstream pools serves the request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pool {
    /// GitLab web (Workhorse).
    #[default]
    Web,
    /// The Pod's kas: its agent listener (the topology's `kas`).
    Kas,
    /// The Pod's kas: its Kubernetes API proxy listener (the topology's
    /// `kas_k8s_proxy`), a listener of its own in kas.
    #[serde(rename = "kas_k8s_proxy")]
    KasK8sProxy,
    /// The Pod's kas: its Workspaces HTTP server listener (the topology's
    /// `kas_workspaces`), user traffic for workspace hosts.
    #[serde(rename = "kas_workspaces")]
    KasWorkspaces,
}

/// What a matching rule does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ActionKind {
    /// Classify the first token found in `sources` and route by it.
    RouteByToken,
    /// Always send to `pod`.
    RouteToPod,
    /// Route by the `_gitlab_session` cookie's `cell-<n>-` prefix.
    SessionPrefix,
    /// Send to the default (legacy) Pod.
    Default,
}

/// One rule.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// A name for metrics, logs and the `X-Podgate-Rule` header.
    pub name: String,
    /// Methods it applies to; empty means any.
    #[serde(default)]
    pub methods: Vec<String>,
    /// The path condition.
    pub path: PathMatch,
    /// Only when this header is present.
    #[serde(default)]
    pub header: Option<String>,
    /// Only when this cookie is present.
    #[serde(default)]
    pub cookie: Option<String>,
    /// Only when the request's host (`Host`, or HTTP/2's `:authority`), its port
    /// removed, ends with this, case-insensitively (`.workspaces.example.com`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_suffix: Option<String>,
    /// Only when an `Authorization` header matches this regular expression.
    #[serde(
        default,
        with = "serde_regex_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub authorization: Option<Regex>,
    /// Where no token is found: route by the `_gitlab_kas` cookie's Pod prefix
    /// before the `_gitlab_session` cookie's ([`session_pod`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kas_cookie: bool,
    /// What to do.
    pub action: ActionKind,
    /// For `route-by-token`: where to look, in order.
    #[serde(default)]
    pub sources: Vec<TokenSource>,
    /// For `route-by-token`: GitLab refuses the endpoint without a token (runner
    /// and job endpoints: Grape's `requires :token`, `authenticate_job!`), so a
    /// request with none is answered 400 `token_not_found` here rather than sent to
    /// the default Pod.
    #[serde(default)]
    pub requires_token: bool,
    /// Largest body read whole to find a token, in bytes, when smaller than
    /// `body_lookahead_bytes` (413 above it). `jobs/request`: 32 KiB, as Workhorse
    /// (`workhorse/internal/builds/register.go`, `maxRegisterBodySize`).
    #[serde(default)]
    pub max_body_bytes: Option<usize>,
    /// For `route-by-token` on the `web` pool: the rule's requests are runners'
    /// `jobs/request` long polls, which a Pod with `runner_queue_redis` may have held
    /// at the edge ([`crate::edge_poll`]) rather than by its Workhorse.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub edge_hold: bool,
    /// For `route-by-token` on the `web` pool: the proxy's HTTP/1 fast path
    /// ([`crate::fast`]) may serve the rule's plain HTTP/1.1 requests itself
    /// (runner and job endpoints); else pingora-proxy serves them. Both answer
    /// alike; the fast path costs less per request.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fast_path: bool,
    /// For `route-to-pod`: the Pod.
    #[serde(default)]
    pub pod: Option<PodId>,
    /// Which upstream pool of the Pod.
    #[serde(default)]
    pub pool: Pool,
    /// Upstream read timeout in seconds (long polls need more than a minute).
    #[serde(default = "default_timeout")]
    pub read_timeout_secs: u64,
}

fn default_timeout() -> u64 {
    60
}

impl Rule {
    /// Whether this rule applies to the request, its host read from `Host`.
    pub fn matches(&self, method: &Method, path: &str, headers: &HeaderMap) -> bool {
        let host = headers
            .get(http::header::HOST)
            .and_then(|v| v.to_str().ok());
        self.matches_host(method, path, headers, host)
    }

    /// Whether this rule applies to the request whose host is `host` (`Host`, or
    /// HTTP/2's `:authority`).
    pub fn matches_host(
        &self,
        method: &Method,
        path: &str,
        headers: &HeaderMap,
        host: Option<&str>,
    ) -> bool {
        self.host_suffix
            .as_deref()
            .is_none_or(|suffix| host.is_some_and(|h| host_ends_with(h, suffix)))
            && (self.methods.is_empty()
                || self
                    .methods
                    .iter()
                    .any(|m| m.eq_ignore_ascii_case(method.as_str())))
            && self.path.matches(path)
            && self
                .header
                .as_ref()
                .is_none_or(|h| headers.contains_key(h.as_str()))
            && self
                .cookie
                .as_ref()
                .is_none_or(|c| cookie(headers, c).is_some())
            && self.authorization.as_ref().is_none_or(|re| {
                headers
                    .get_all(http::header::AUTHORIZATION)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .any(|v| re.is_match(v))
            })
    }

    /// Every problem with this rule, each naming its field (`rules[3].pod`).
    pub fn problems(&self, at: &str) -> Vec<String> {
        let mut bad = Vec::new();
        if self.name.is_empty() {
            bad.push(format!("{at}.name: must not be empty"));
        }
        for m in &self.methods {
            if Method::from_bytes(m.as_bytes()).is_err() {
                bad.push(format!("{at}.methods: {m:?} is not an HTTP method"));
            }
        }
        match self.action {
            ActionKind::RouteByToken if self.sources.is_empty() => bad.push(format!(
                "{at}.sources: route-by-token needs at least one source"
            )),
            ActionKind::RouteToPod if self.pod.is_none() => {
                bad.push(format!("{at}.pod: route-to-pod needs a Pod id"))
            }
            _ => {}
        }
        if let Some(suffix) = &self.host_suffix
            && (suffix.is_empty() || suffix.contains(['/', ':', ' ']))
        {
            bad.push(format!(
                "{at}.host_suffix = {suffix:?}: a domain suffix such as \".workspaces.example.com\""
            ));
        }
        if self.max_body_bytes == Some(0) {
            bad.push(format!("{at}.max_body_bytes: must be positive"));
        }
        let by_token = self.action == ActionKind::RouteByToken;
        if self.requires_token && !by_token {
            bad.push(format!(
                "{at}.requires_token: only a route-by-token rule reads a token"
            ));
        }
        if self.max_body_bytes.is_some() && !by_token {
            bad.push(format!(
                "{at}.max_body_bytes: only a route-by-token rule reads a body"
            ));
        }
        if self.edge_hold && !(by_token && self.pool == Pool::Web) {
            bad.push(format!(
                "{at}.edge_hold: only a route-by-token rule on the web pool (runners' \
                 jobs/request polls) can be held at the edge"
            ));
        }
        if self.fast_path && !(by_token && self.pool == Pool::Web) {
            bad.push(format!(
                "{at}.fast_path: only a route-by-token rule on the web pool (runner and \
                 job endpoints) is served on the fast path"
            ));
        }
        if self.read_timeout_secs == 0 {
            bad.push(format!("{at}.read_timeout_secs: must be positive"));
        }
        bad
    }
}

/// Whether `host` (a `Host` value, its port ignored) ends with `suffix`, ASCII
/// case-insensitively.
pub fn host_ends_with(host: &str, suffix: &str) -> bool {
    let host = match host.rsplit_once(':') {
        Some((h, port)) if !h.ends_with(']') || host.starts_with('[') => {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                h
            } else {
                host
            }
        }
        _ => host,
    };
    let host = host.trim_end_matches('.');
    host.len() > suffix.len()
        && host.as_bytes()[host.len() - suffix.len()..].eq_ignore_ascii_case(suffix.as_bytes())
}

/// The value of cookie `name`.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            (k == name).then_some(v)
        })
}

/// The index of the first of `rules` matching the request whose host is `host`
/// (`Host`, or HTTP/2's `:authority`). Rules match the path GitLab would serve
/// ([`crate::path::normalize`]); the request is forwarded as received.
pub fn rule_for(
    rules: &[Rule],
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    host: Option<&str>,
) -> Option<usize> {
    let path = crate::path::normalize(path);
    rules
        .iter()
        .position(|r| r.matches_host(method, &path, headers, host))
}

#[cfg(test)]
mod tests;
