//! Ordered routing rules: the first rule whose method, path and header/cookie
//! conditions match decides how a request is routed.

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
    /// Largest body read whole to find a token, when smaller than
    /// `body_lookahead_bytes` (413 above it). `jobs/request`: 32 KiB, as Workhorse
    /// (`workhorse/internal/builds/register.go`, `maxRegisterBodySize`).
    #[serde(default)]
    pub max_body_bytes: Option<usize>,
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

/// The Pod a request without a token follows: for a rule with `kas_cookie`, the
/// `_gitlab_kas` cookie's Pod prefix; then the `_gitlab_session` cookie's; `None`:
/// the default Pod.
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
    rule: &Rule,
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
    rule.kas_cookie
        .then(by_kas_cookie)
        .flatten()
        .or_else(|| topology.pod_for_session(cookie(headers, "_gitlab_session")?))
}

/// GitLab's cookie for kas (`Gitlab::Kas::COOKIE_KEY`).
pub const KAS_COOKIE: &str = "_gitlab_kas";

fn rule(
    name: &str,
    methods: &[&str],
    path: PathMatch,
    sources: &[&str],
    pool: Pool,
    timeout: u64,
) -> Rule {
    Rule {
        name: name.into(),
        methods: methods.iter().map(|m| (*m).to_owned()).collect(),
        path,
        header: None,
        cookie: None,
        host_suffix: None,
        authorization: None,
        kas_cookie: false,
        action: ActionKind::RouteByToken,
        requires_token: false,
        max_body_bytes: None,
        sources: sources
            .iter()
            .map(|s| s.parse().expect("built-in sources parse"))
            .collect(),
        pod: None,
        pool,
        read_timeout_secs: timeout,
    }
}

fn re(s: &str) -> PathMatch {
    PathMatch::Regex(Regex::new(s).expect("built-in regex compiles"))
}

/// Runner endpoints: `authenticate_runner!` reads `params[:token]` only
/// (`lib/api/ci/helpers/runner.rb` `current_runner`); routers read `RUNNER-TOKEN`.
const RUNNER: &[&str] = &["param:token", "header:runner-token"];
/// Job endpoints: `authenticate_job!` reads `params[:token] || env['HTTP_JOB_TOKEN']`
/// (`lib/api/ci/helpers/runner.rb` `job_token`).
const JOB: &[&str] = &["param:token", "header:job-token"];
/// The general API (`lib/api/api_guard.rb` `find_user_from_sources`,
/// `lib/gitlab/auth/auth_finders.rb`), in GitLab's order: a deploy token (Basic
/// password, else `Deploy-Token`), a Bearer/OAuth token (`access_token`,
/// `Authorization: Bearer`, `bearer_token`), a personal access token
/// (`private_token`, `PRIVATE-TOKEN`), then a job token (`job_token`, `token`,
/// `JOB-TOKEN`). Rails parameters: the query beats the body.
const API: &[&str] = &[
    "basic",
    "header:deploy-token",
    "rails-param:access_token",
    "bearer",
    "rails-param:bearer_token",
    "rails-param:private_token",
    "header:private-token",
    "rails-param:job_token",
    "rails-param:token",
    "header:job-token",
];

/// kas's Kubernetes API proxy (`internal/module/kubernetes_api/server/proxy.go`
/// in gitlab-org/cluster-integration/gitlab-agent): the token inside
/// `Authorization: Bearer pat:<agent id>:<token>` or `ci:<agent id>:<job token>`;
/// with none, the cookies ([`session_pod`]).
const KAS_K8S_PROXY: &[&str] = &["kas-bearer"];

/// The built-in rules: every runner endpoint of the GitLab runner API, Git and the
/// other job-token surfaces, kas traffic, API tokens, session cookies, and a default.
///
/// Rules match the path GitLab would serve ([`crate::path::normalize`]). Each rule's
/// sources are listed in the order GitLab reads them; the request goes to the Pod of
/// the first one present, and every token present must name that Pod
/// ([`crate::decision`]).
///
/// | rule | requests | sources, in GitLab's order | GitLab source |
/// |---|---|---|---|
/// | `jobs-request` | `POST /api/v4/jobs/request` | `param:token`, `header:runner-token` | `lib/api/ci/runner.rb`, `lib/api/ci/helpers/runner.rb` (`current_runner`: `params[:token]`); Rails never reads `RUNNER-TOKEN` for these, routers do |
/// | `runners` | `POST /api/v4/runners`, `POST …/verify`, `POST …/reset_authentication_token`, `DELETE /api/v4/runners`, `DELETE …/managers` | `param:token`, `header:runner-token` | same |
/// | `job-update` | `PUT /api/v4/jobs/:id` | `param:token`, `header:job-token` | `lib/api/ci/helpers/runner.rb` `job_token`: `params[:token] \|\| env['HTTP_JOB_TOKEN']` |
/// | `job-trace` | `PATCH /api/v4/jobs/:id/trace` | `param:token`, `header:job-token` | same (the text body is not parameters) |
/// | `job-artifacts-upload` | `POST /api/v4/jobs/:id/artifacts`, `…/authorize` | `param:token`, `header:job-token` | same; Workhorse's `/authorize` call carries the headers and query only (`workhorse/internal/api/api.go`), the final call the multipart fields |
/// | `job-artifacts-download` | `GET`/`HEAD /api/v4/jobs/:id/artifacts[/…]` | the general API's | `authenticate_job_via_dependent_job!` → `find_current_user!` with `job_token_allowed` |
/// | `git` | `/…/<project>.git/info/refs`, `git-upload-pack`, `git-receive-pack`, `info/lfs/…`, `gitlab-lfs/…` | `basic` | `app/controllers/repositories/git_http_client_controller.rb` (Basic only), `lib/gitlab/auth.rb` `find_for_git_client` (`gitlab-ci-token:<job token>`, `<user>:<PAT>`, deploy tokens) |
/// | `registry-auth` | `/jwt/auth` | `basic` | `app/controllers/jwt_controller.rb` (Basic only, `find_for_git_client`) |
/// | `kas-k8s-proxy` | `/-/kubernetes-agent/k8s-proxy/…` (Omnibus layout) → the Pod's `kas_k8s_proxy` pool | `kas-bearer`; no token: the `_gitlab_kas` cookie's Pod prefix, the `_gitlab_session` cookie's, else the default Pod | kas `internal/module/kubernetes_api/server/proxy.go`; `lib/gitlab/kas/user_access.rb` |
/// | `kas-k8s-proxy-host`, `kas-k8s-proxy-host-cookie` | `/k8s-proxy/…` (kas's own host) with a `pat:`/`ci:` bearer, or with the `_gitlab_kas` cookie | same | same; `lib/gitlab/path_regex.rb` (`k8s-proxy` is not reserved on GitLab's host) |
/// | `kas-agent`, `kas-grpc`, `kas-podgate` | agentk's gRPC and WebSocket | `bearer` | kas: `Authorization: Bearer <agent token>` |
/// | `api-token` | any other `/api/…` | `basic`, `header:deploy-token`, `rails-param:access_token`, `bearer`, `rails-param:bearer_token`, `rails-param:private_token`, `header:private-token`, `rails-param:job_token`, `rails-param:token`, `header:job-token` | `lib/api/api_guard.rb` `find_user_from_sources`, `lib/gitlab/auth/auth_finders.rb`; packages: `lib/api/helpers/authentication.rb` |
/// | `kas-workspaces` (only with `[workspaces] host_suffix`, before every other rule; [`workspaces_rule`]) | any request whose host ends with the suffix → the Pod's `kas_workspaces` pool | `bearer` (the user's personal access token) | kas's Workspaces HTTP server; `charts/gitlab/charts/kas/templates/ingress-workspaces.yaml` |
/// | `session` | anything with `_gitlab_session` | the cookie's `cell-<n>-` prefix | the Cells HTTP router |
/// | `default` | anything else | – | the legacy Pod |
pub fn builtin() -> Vec<Rule> {
    let mut rules = vec![
        // Long polls: Workhorse holds them up to 50 s on GitLab.com; allow 2 minutes+.
        rule(
            "jobs-request",
            &["POST"],
            re(r"^/api/v4/jobs/request$"),
            RUNNER,
            Pool::Web,
            150,
        ),
        rule(
            "runners",
            &["POST", "DELETE"],
            re(r"^/api/v4/runners(/verify|/managers|/reset_authentication_token)?$"),
            RUNNER,
            Pool::Web,
            60,
        ),
        rule(
            "job-trace",
            &["PATCH"],
            re(r"^/api/v4/jobs/\d+/trace$"),
            JOB,
            Pool::Web,
            60,
        ),
        rule(
            "job-artifacts-upload",
            &["POST"],
            re(r"^/api/v4/jobs/\d+/artifacts(/authorize)?$"),
            JOB,
            Pool::Web,
            3600,
        ),
        rule(
            "job-artifacts-download",
            &["GET", "HEAD"],
            re(r"^/api/v4/jobs/\d+/artifacts(/.*)?$"),
            API,
            Pool::Web,
            3600,
        ),
        rule(
            "job-update",
            &["PUT"],
            re(r"^/api/v4/jobs/\d+$"),
            JOB,
            Pool::Web,
            60,
        ),
        // Git smart HTTP and LFS: clones and pushes can run for an hour.
        rule(
            "git",
            &[],
            re(
                r"^/.+\.git/(info/refs|git-upload-pack|git-receive-pack|info/lfs/.*|gitlab-lfs/.*)$",
            ),
            &["basic"],
            Pool::Web,
            3600,
        ),
        rule(
            "registry-auth",
            &["GET", "POST"],
            re(r"^/jwt/auth$"),
            &["basic"],
            Pool::Web,
            60,
        ),
        // kubectl and the Graph API → kas's Kubernetes API proxy, in the Omnibus
        // layout; before `kas-agent`, whose pattern covers it. Watches and the
        // Graph API's WebSocket stay open as long as the client keeps them.
        rule(
            "kas-k8s-proxy",
            &[],
            re(r"^/-/kubernetes-agent/k8s-proxy(/.*)?$"),
            KAS_K8S_PROXY,
            Pool::KasK8sProxy,
            7200,
        ),
        // agentk → kas (gRPC over h2c or WebSocket through the proxy).
        rule(
            "kas-agent",
            &[],
            // Normalised like every path: `/-/kubernetes-agent/` has lost its `/`.
            re(r"^/-/kubernetes-agent(/.*)?$"),
            &["bearer"],
            Pool::Kas,
            7200,
        ),
        rule(
            "kas-grpc",
            &["POST"],
            PathMatch::Prefix("/gitlab.agent.".into()),
            &["bearer"],
            Pool::Kas,
            7200,
        ),
        // podgate's own agentk (configuration stream, reverse tunnels).
        rule(
            "kas-podgate",
            &["POST"],
            PathMatch::Prefix("/podgate.kas.v1.".into()),
            &["bearer"],
            Pool::Kas,
            7200,
        ),
        // kas's own host layout (`https://kas.example.com/k8s-proxy/`). On GitLab's
        // host `/k8s-proxy/…` is an ordinary namespace path (`k8s-proxy` is not in
        // GitLab's reserved `TOP_LEVEL_ROUTES`, `lib/gitlab/path_regex.rb`), so it
        // is kas's only with kas's credentials: a `pat:`/`ci:` bearer, or the
        // `_gitlab_kas` cookie (both rules below).
        Rule {
            authorization: Some(
                Regex::new(r"^(?i:bearer)\s+(pat|ci):").expect("built-in regex compiles"),
            ),
            ..rule(
                "kas-k8s-proxy-host",
                &[],
                re(r"^/k8s-proxy(/.*)?$"),
                KAS_K8S_PROXY,
                Pool::KasK8sProxy,
                7200,
            )
        },
        Rule {
            cookie: Some(KAS_COOKIE.into()),
            ..rule(
                "kas-k8s-proxy-host-cookie",
                &[],
                re(r"^/k8s-proxy(/.*)?$"),
                KAS_K8S_PROXY,
                Pool::KasK8sProxy,
                7200,
            )
        },
        // Any other API call with a token (packages included). Anonymous API calls
        // exist (public projects): no token goes to the default Pod.
        rule(
            "api-token",
            &[],
            PathMatch::Prefix("/api/".into()),
            API,
            Pool::Web,
            60,
        ),
    ];
    // Runner and job endpoints cannot be served without a token (`requires :token`,
    // `authenticate_runner!`, `authenticate_job!`): 400 here, on every Pod alike.
    const NEED_TOKEN: &[&str] = &[
        "jobs-request",
        "runners",
        "job-trace",
        "job-artifacts-upload",
        "job-update",
    ];
    for r in &mut rules {
        r.requires_token = NEED_TOKEN.contains(&r.name.as_str());
        r.kas_cookie = r.pool == Pool::KasK8sProxy;
        if r.name == "jobs-request" {
            r.max_body_bytes = Some(32 * 1024);
        }
    }
    rules.push(Rule {
        name: "session".into(),
        methods: vec![],
        path: PathMatch::Prefix("/".into()),
        header: None,
        cookie: Some("_gitlab_session".into()),
        host_suffix: None,
        authorization: None,
        kas_cookie: false,
        action: ActionKind::SessionPrefix,
        requires_token: false,
        max_body_bytes: None,
        sources: vec![],
        pod: None,
        pool: Pool::Web,
        read_timeout_secs: 60,
    });
    rules.push(Rule {
        name: "default".into(),
        methods: vec![],
        path: PathMatch::Prefix("/".into()),
        header: None,
        cookie: None,
        host_suffix: None,
        authorization: None,
        kas_cookie: false,
        action: ActionKind::Default,
        requires_token: false,
        max_body_bytes: None,
        sources: vec![],
        pod: None,
        pool: Pool::Web,
        read_timeout_secs: 60,
    });
    rules
}

/// The rule for workspace hosts (`https://<port>-<workspace>.<zone>/`, kas's
/// Workspaces HTTP server), matched by the request's host ending with `suffix`
/// (`.<zone>`), whatever its path: to the `kas_workspaces` pool of the Pod that
/// `Authorization: Bearer <personal access token>` names (a routable `glpat-`
/// token), else the default Pod. Editors keep long responses open: one hour.
///
/// GitLab sends workspace hosts to kas with a wildcard ingress
/// (`charts/gitlab/charts/kas/templates/ingress-workspaces.yaml`); with Cells the
/// browser's OAuth session decides (GitLab has not settled how, issue 469155):
/// podgate routes by the user's token, as its API rules do.
pub fn workspaces_rule(suffix: &str) -> Rule {
    Rule {
        host_suffix: Some(suffix.to_owned()),
        ..rule(
            "kas-workspaces",
            &[],
            PathMatch::Prefix("/".into()),
            &["bearer"],
            Pool::KasWorkspaces,
            3600,
        )
    }
}

/// The first matching rule.
pub fn first_match<'a>(
    rules: &'a [Rule],
    method: &Method,
    path: &str,
    headers: &HeaderMap,
) -> Option<&'a Rule> {
    rules.iter().find(|r| r.matches(method, path, headers))
}

#[cfg(test)]
mod tests;
