//! The built-in rule table, with the token sources GitLab reads for each endpoint.

use regex::Regex;

use super::session::KAS_COOKIE;
use super::{Action, ByToken, PathMatch, PathRegex, Pool, Rule};

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
        action: Action::RouteByToken(ByToken {
            sources: sources
                .iter()
                .map(|s| s.parse().expect("built-in sources parse"))
                .collect(),
            ..ByToken::default()
        }),
        pool,
        read_timeout_secs: timeout,
    }
}

impl Rule {
    /// The rule with its token handling changed by `f` (built-in rules all route
    /// by token where these apply).
    fn by(mut self, f: impl FnOnce(&mut ByToken)) -> Rule {
        match &mut self.action {
            Action::RouteByToken(by) => f(by),
            _ => unreachable!("built-in rule {} does not route by token", self.name),
        }
        self
    }

    /// GitLab refuses the endpoint without a token (`requires :token`,
    /// `authenticate_runner!`, `authenticate_job!`): 400 here, on every Pod alike.
    fn token_required(self) -> Rule {
        self.by(|b| b.requires_token = true)
    }

    /// Served on the HTTP/1 fast path: runners' and jobs' own endpoints, the bulk
    /// of a fleet's requests.
    fn fast(self) -> Rule {
        self.by(|b| b.fast_path = true)
    }

    /// A body read whole is at most `bytes`.
    fn body_cap(self, bytes: usize) -> Rule {
        self.by(|b| b.max_body_bytes = Some(bytes))
    }

    /// Runners' long polls, which a Pod may have held at the edge.
    fn edge_held(self) -> Rule {
        self.by(|b| b.edge_hold = true)
    }

    /// A `kas_k8s_proxy` rule: with no token, the `_gitlab_kas` cookie's Pod first.
    fn kas_cookie_first(self) -> Rule {
        self.by(|b| b.kas_cookie = true)
    }
}

fn re(s: &str) -> PathMatch {
    PathMatch::Regex(PathRegex::new(s).expect("built-in regex compiles"))
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
/// | `runner-router-discovery` | `GET /api/v4/runners/router/discovery` (GitLab 18.7+) | `header:runner-token` | GitLab's runners API docs ("Discover Job Router information"); gitlab-runner `network/gitlab.go` `GetRouterDiscovery` sends only `Runner-Token` |
/// | `job-update` | `PUT /api/v4/jobs/:id` | `param:token`, `header:job-token` | `lib/api/ci/helpers/runner.rb` `job_token`: `params[:token] \|\| env['HTTP_JOB_TOKEN']` |
/// | `job-trace` | `PATCH /api/v4/jobs/:id/trace` | `param:token`, `header:job-token` | same (the text body is not parameters) |
/// | `job-artifacts-upload` | `POST /api/v4/jobs/:id/artifacts`, `…/authorize` | `param:token`, `header:job-token` | same; Workhorse's `/authorize` call carries the headers and query only (`workhorse/internal/api/api.go`), the final call the multipart fields |
/// | `job-artifacts-download` | `GET`/`HEAD /api/v4/jobs/:id/artifacts[/…]` | the general API's | `authenticate_job_via_dependent_job!` → `find_current_user!` with `job_token_allowed` |
/// | `git` | `/…/<project>.git/info/refs`, `git-upload-pack`, `git-receive-pack`, `info/lfs/…`, `gitlab-lfs/…` | `basic` | `app/controllers/repositories/git_http_client_controller.rb` (Basic only), `lib/gitlab/auth.rb` `find_for_git_client` (`gitlab-ci-token:<job token>`, `<user>:<PAT>`, deploy tokens) |
/// | `registry-auth` | `/jwt/auth` | `basic` | `app/controllers/jwt_controller.rb` (Basic only, `find_for_git_client`) |
/// | `kas-k8s-proxy` | `/-/kubernetes-agent/k8s-proxy/…` (Omnibus layout) → the Pod's `kas_k8s_proxy` pool | `kas-bearer`; no token: the `_gitlab_kas` cookie's Pod prefix, the `_gitlab_session` cookie's, else the default Pod | kas `internal/module/kubernetes_api/server/proxy.go`; `lib/gitlab/kas/user_access.rb` |
/// | `kas-k8s-proxy-host`, `kas-k8s-proxy-host-cookie` | `/k8s-proxy/…` (kas's own host) with a `pat:`/`ci:` bearer, or with the `_gitlab_kas` cookie | same | same; `lib/gitlab/path_regex.rb` (`k8s-proxy` is not reserved on GitLab's host) |
/// | `kas-agent`, `kas-grpc` | agentk's gRPC (GitLab's agent wire) and WebSocket; runners' Job Router (`/gitlab.agent.job_router.rpc.JobRouter/GetJob`, or a `ws-tunnel` WebSocket to `/-/kubernetes-agent/`) | `bearer` | kas: `Authorization: Bearer <agent token>`; gitlab-runner `router/token_creds.go` (`authorization: Bearer <runner token>` on every call) and `router/client_conn_factory.go` (the WebSocket upgrade's `Authorization`) |
/// | `api-token` | any other `/api/…` | `basic`, `header:deploy-token`, `rails-param:access_token`, `bearer`, `rails-param:bearer_token`, `rails-param:private_token`, `header:private-token`, `rails-param:job_token`, `rails-param:token`, `header:job-token` | `lib/api/api_guard.rb` `find_user_from_sources`, `lib/gitlab/auth/auth_finders.rb`; packages: `lib/api/helpers/authentication.rb` |
/// | `kas-workspaces` (only with `[workspaces] host_suffix`, before every other rule; [`workspaces_rule`]) | any request whose host ends with the suffix → the Pod's `kas_workspaces` pool | `bearer` (the user's personal access token) | kas's Workspaces HTTP server; `charts/gitlab/charts/kas/templates/ingress-workspaces.yaml` |
/// | `force-cell` | anything with a `force-cell` cookie | the cookie's `cell-<n>` (else the session cookie's) | the Cells HTTP router's `session_prefix` rules |
/// | `session` | anything with `_gitlab_session` (or `_gitlab_session_<hex>`) | the cookie's `cell-<n>-` prefix | the Cells HTTP router |
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
        )
        .token_required()
        .fast()
        .body_cap(32 * 1024)
        .edge_held(),
        rule(
            "runners",
            &["POST", "DELETE"],
            re(r"^/api/v4/runners(/verify|/managers|/reset_authentication_token)?$"),
            RUNNER,
            Pool::Web,
            60,
        )
        .token_required()
        .fast(),
        // The Job Router's discovery: the runner's token in `Runner-Token` only.
        rule(
            "runner-router-discovery",
            &["GET"],
            re(r"^/api/v4/runners/router/discovery$"),
            &["header:runner-token"],
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
        )
        .token_required()
        .fast(),
        rule(
            "job-artifacts-upload",
            &["POST"],
            re(r"^/api/v4/jobs/\d+/artifacts(/authorize)?$"),
            JOB,
            Pool::Web,
            3600,
        )
        .token_required()
        .fast(),
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
        )
        .token_required()
        .fast(),
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
        )
        .kas_cookie_first(),
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
            .kas_cookie_first()
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
            .kas_cookie_first()
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
    // GitLab's HTTP Router's `session_prefix` rules: `force-cell` first.
    rules.push(Rule {
        name: "force-cell".into(),
        methods: vec![],
        path: PathMatch::Prefix("/".into()),
        header: None,
        cookie: Some(super::FORCE_CELL_COOKIE.into()),
        host_suffix: None,
        authorization: None,
        action: Action::SessionPrefix,
        pool: Pool::Web,
        read_timeout_secs: 60,
    });
    rules.push(Rule {
        name: "session".into(),
        methods: vec![],
        path: PathMatch::Prefix("/".into()),
        header: None,
        cookie: Some("_gitlab_session".into()),
        host_suffix: None,
        authorization: None,
        action: Action::SessionPrefix,
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
        action: Action::Default,
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
