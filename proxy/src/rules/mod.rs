//! Ordered routing rules: the first rule whose method, path and header/cookie
//! conditions match decides how a request is routed ([`rule_for`]). What a rule
//! does with the request (whether it needs a token, how much body it reads, whether
//! its polls may be held at the edge) is in its action, never in its name.
//!
//! - this module: the rule model ([`Rule`], an [`Action`] per kind with what only
//!   that kind needs) and matching;
//! - [`RuleSpec`]: a rule as `proxy.toml` writes it, checked into a [`Rule`];
//! - [`builtin`]: the built-in table, with the GitLab source of each row;
//! - [`session_pod`]: the cookies' Pod, for a request with no token.

mod builtin;
mod session;
mod spec;

pub use builtin::{builtin, workspaces_rule};
pub use session::{KAS_COOKIE, session_pod};
pub use spec::RuleSpec;

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
    Regex(#[serde(with = "serde_regex")] PathRegex),
}

/// A path's regular expression, and the one path it matches when it is a literal
/// (`^/api/v4/jobs/request$`): that is compared as a string rather than run, on
/// every request the rule is tried for.
#[derive(Clone, Debug)]
pub struct PathRegex {
    regex: Regex,
    exact: Option<String>,
}

impl PathRegex {
    /// `pattern` compiled, or why it does not compile.
    pub fn new(pattern: &str) -> Result<Self, regex::Error> {
        let regex = Regex::new(pattern)?;
        let exact = pattern
            .strip_prefix('^')
            .and_then(|p| p.strip_suffix('$'))
            .filter(|lit| regex::escape(lit) == *lit)
            .map(str::to_owned);
        Ok(PathRegex { regex, exact })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        self.regex.as_str()
    }

    fn is_match(&self, path: &str) -> bool {
        match &self.exact {
            Some(exact) => path == exact,
            None => self.regex.is_match(path),
        }
    }
}

mod serde_regex {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::PathRegex;

    pub(super) fn serialize<S: Serializer>(r: &PathRegex, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(r.as_str())
    }
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<PathRegex, D::Error> {
        let s = String::deserialize(d)?;
        PathRegex::new(&s).map_err(serde::de::Error::custom)
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

/// What a matching rule does, as `proxy.toml` names it ([`RuleSpec::action`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ActionKind {
    /// Classify the first token found in `sources` and route by it.
    RouteByToken,
    /// Always send to `pod`.
    RouteToPod,
    /// Route by the `force-cell` cookie's cell, else the `_gitlab_session`
    /// cookie's `cell-<n>-` prefix.
    SessionPrefix,
    /// Send to the default (legacy) Pod.
    Default,
}

/// What a matching rule does, with what only that action needs: a rule cannot
/// carry a token source without routing by token, nor a Pod without pinning one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Classify the tokens found and route by them.
    RouteByToken(ByToken),
    /// Always send to this Pod.
    RouteToPod(PodId),
    /// Route by the `force-cell` cookie's cell, else the `_gitlab_session` cookie's
    /// `cell-<n>-` prefix, else the default Pod (GitLab's HTTP Router's
    /// `session_prefix` rules, in that order).
    SessionPrefix,
    /// Send to the default (legacy) Pod.
    Default,
}

impl Action {
    /// The action's name in `proxy.toml`.
    pub fn kind(&self) -> ActionKind {
        match self {
            Action::RouteByToken(_) => ActionKind::RouteByToken,
            Action::RouteToPod(_) => ActionKind::RouteToPod,
            Action::SessionPrefix => ActionKind::SessionPrefix,
            Action::Default => ActionKind::Default,
        }
    }
}

/// How a `route-by-token` rule finds and uses its token.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ByToken {
    /// Where to look, in order (at least one).
    pub sources: Vec<TokenSource>,
    /// GitLab refuses the endpoint without a token (runner and job endpoints:
    /// Grape's `requires :token`, `authenticate_job!`), so a request with none is
    /// answered 400 `token_not_found` here rather than sent to the default Pod.
    pub requires_token: bool,
    /// Largest body read whole to find a token, in bytes, when smaller than
    /// `body_lookahead_bytes` (413 above it). `jobs/request`: 32 KiB, as Workhorse
    /// (`workhorse/internal/builds/register.go`, `maxRegisterBodySize`).
    pub max_body_bytes: Option<usize>,
    /// Where no token is found: route by the `_gitlab_kas` cookie's Pod prefix
    /// before the `_gitlab_session` cookie's ([`session_pod`]).
    pub kas_cookie: bool,
    /// On the `web` pool only: the rule's requests are runners' `jobs/request` long
    /// polls, which a Pod with `runner_queue_redis` may have held at the edge
    /// ([`crate::edge_poll`]) rather than by its Workhorse.
    pub edge_hold: bool,
    /// On the `web` pool only: the proxy's HTTP/1 fast path ([`crate::fast`]) may
    /// serve the rule's plain HTTP/1.1 requests itself (runner and job endpoints);
    /// else pingora-proxy serves them. Both answer alike; the fast path costs less
    /// per request.
    pub fast_path: bool,
}

/// One rule: the conditions a request must meet, then what to do with it. Written
/// in `proxy.toml` as a [`RuleSpec`], whose [`RuleSpec::build`] checks it.
#[derive(Clone, Debug)]
pub struct Rule {
    /// A name for metrics, logs and the `X-Podgate-Rule` header.
    pub name: String,
    /// Methods it applies to; empty means any.
    pub methods: Vec<String>,
    /// The path condition.
    pub path: PathMatch,
    /// Only when this header is present.
    pub header: Option<String>,
    /// Only when this cookie is present.
    pub cookie: Option<String>,
    /// Only when the request's host (`Host`, or HTTP/2's `:authority`), its port
    /// removed, ends with this, case-insensitively (`.workspaces.example.com`).
    pub host_suffix: Option<String>,
    /// Only when an `Authorization` header matches this regular expression.
    pub authorization: Option<Regex>,
    /// What to do.
    pub action: Action,
    /// Which upstream pool of the Pod.
    pub pool: Pool,
    /// Upstream read timeout in seconds (long polls need more than a minute).
    pub read_timeout_secs: u64,
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

    /// How the rule routes by token, when it does.
    pub fn by_token(&self) -> Option<&ByToken> {
        match &self.action {
            Action::RouteByToken(by) => Some(by),
            _ => None,
        }
    }

    /// Whether the rule's requests may be served on the HTTP/1 fast path.
    pub fn fast_path(&self) -> bool {
        self.by_token().is_some_and(|b| b.fast_path)
    }

    /// Whether the rule's requests are runners' polls a Pod may have held at the
    /// edge.
    pub fn edge_hold(&self) -> bool {
        self.by_token().is_some_and(|b| b.edge_hold)
    }

    /// What the types cannot rule out, each problem naming its field
    /// (`rules[3].read_timeout_secs`).
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
        if let Some(suffix) = &self.host_suffix
            && (suffix.is_empty() || suffix.contains(['/', ':', ' ']))
        {
            bad.push(format!(
                "{at}.host_suffix = {suffix:?}: a domain suffix such as \".workspaces.example.com\""
            ));
        }
        if self.read_timeout_secs == 0 {
            bad.push(format!("{at}.read_timeout_secs: must be positive"));
        }
        if let Action::RouteByToken(by) = &self.action {
            if by.sources.is_empty() {
                bad.push(format!(
                    "{at}.sources: route-by-token needs at least one source"
                ));
            }
            if by.max_body_bytes == Some(0) {
                bad.push(format!("{at}.max_body_bytes: must be positive"));
            }
            if by.edge_hold && self.pool != Pool::Web {
                bad.push(format!(
                    "{at}.edge_hold: only a rule on the web pool (runners' jobs/request \
                     polls) can be held at the edge"
                ));
            }
            if by.fast_path && self.pool != Pool::Web {
                bad.push(format!(
                    "{at}.fast_path: only a rule on the web pool (runner and job \
                     endpoints) is served on the fast path"
                ));
            }
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

/// The value of the first cookie whose name `name` accepts.
fn cookie_where(headers: &HeaderMap, name: impl Fn(&str) -> bool) -> Option<&str> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            name(k).then_some(v)
        })
}

/// The value of cookie `name`; for [`SESSION_COOKIE`], of the Rails session's
/// cookie under either of its names ([`session_cookie`]).
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    if name == SESSION_COOKIE {
        return session_cookie(headers);
    }
    cookie_where(headers, |k| k == name)
}

/// The Rails session's cookie.
pub const SESSION_COOKIE: &str = "_gitlab_session";

/// The Rails session cookie's value: `_gitlab_session`, or `_gitlab_session_<hex>`
/// as Rails names it in development (`config/initializers/session_store.rb` in
/// gitlabhq/gitlabhq); GitLab's HTTP Router's session rule matches
/// `_gitlab_session(_[0-9a-f]+)?`.
pub fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    cookie_where(headers, |k| {
        k.strip_prefix(SESSION_COOKIE).is_some_and(|rest| {
            rest.is_empty()
                || rest.strip_prefix('_').is_some_and(|hex| {
                    !hex.is_empty() && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
                })
        })
    })
}

/// The `force-cell` cookie, which GitLab's HTTP Router reads before the session
/// cookie (its `session_prefix` rules, for development and tests: value
/// `^(?<cell_name>cell-\d+)`): the cell name it starts with.
pub const FORCE_CELL_COOKIE: &str = "force-cell";

/// The cell name (`cell-<n>`) the `force-cell` cookie starts with.
pub fn force_cell(headers: &HeaderMap) -> Option<&str> {
    let v = cookie(headers, FORCE_CELL_COOKIE)?;
    let digits = v.strip_prefix("cell-")?;
    let n = digits.bytes().take_while(u8::is_ascii_digit).count();
    (n > 0).then(|| &v[.."cell-".len() + n])
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
