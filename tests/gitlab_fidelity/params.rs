//! GitLab-fidelity cases: params.

use super::*;

/// How Rack, Grape, Doorkeeper and Rails read parameters and credentials: decoded keys,
/// Rack 2.2's `;` query separator, case-insensitive auth schemes, empty values, and
/// Rails' method override.
pub(super) fn params(cases: &mut Vec<Case>) {
    let (p2, p3) = (gitlab_token("glrt-", 2), gitlab_token("glrt-", 3));
    let j3 = gitlab_token("glcbt-", 3);
    let (pat2, pat3) = (gitlab_token("glpat-", 2), gitlab_token("glpat-", 3));
    let conflict = Expect::Refused(400, "conflicting_tokens");
    let form = "application/x-www-form-urlencoded";
    cases.push(Case::new(
        "jobs-request: query key percent-encoded (%74oken = token) Pod 2 + JSON token Pod 3",
        format!(
            "Rack unescapes keys too (rack lib/rack/query_parser.rb #parse_nested_query), so \
             the query holds params[:token] (Pod 2); GitLab authenticates the JSON token (Pod 3): \
             two Pods. {RUNNER_AUTH}"
        ),
        Req::new("POST", &format!("/api/v4/jobs/request?%74oken={p2}")).body(
            "application/json",
            format!(r#"{{"token":"{p3}"}}"#).into_bytes(),
        ),
        conflict.clone(),
    ));
    cases.push(Case::new(
        "register: form key percent-encoded (%74oken) Pod 3",
        format!(
            "Rack unescapes form keys: GitLab authenticates params[:token] (Pod 3). {RUNNER_AUTH}"
        ),
        Req::new("POST", "/api/v4/runners")
            .body(form, format!("description=x&%74oken={p3}").into_bytes()),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "jobs-request: query token value percent-encoded, JSON body without a token",
        format!("GitLab authenticates the decoded query token (Pod 3). {RUNNER_AUTH}"),
        Req::new(
            "POST",
            &format!(
                "/api/v4/jobs/request?token=%{:02X}{}",
                p3.as_bytes()[0],
                &p3[1..]
            ),
        )
        .body("application/json", br#"{"last_update":"x"}"#.to_vec()),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "verify: JSON key with a \\u escape (tok\\u0065n) Pod 3",
        format!("Ruby's JSON parser decodes the key to `token`: GitLab authenticates it (Pod 3). {RUNNER_AUTH}"),
        Req::new("POST", "/api/v4/runners/verify")
            .body("application/json", format!(r#"{{"tok\u0065n":"{p3}"}}"#).into_bytes()),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "jobs-request: JSON key tok\\u0065n Pod 3 + RUNNER-TOKEN Pod 2",
        format!("The escaped key is params[:token] (Pod 3); RUNNER-TOKEN names Pod 2: two Pods. {RUNNER_AUTH}"),
        Req::new("POST", "/api/v4/jobs/request")
            .header("runner-token", &p2)
            .body("application/json", format!(r#"{{"tok\u0065n":"{p3}"}}"#).into_bytes()),
        conflict.clone(),
    ));
    cases.push(Case::new(
        "jobs-request: `;` in the query (a=1;token=Pod 2) + JSON token Pod 3",
        format!(
            "Rack 2.2 splits a query on `&` and `;` (rack lib/rack/request.rb #GET: \
             parse_query(query_string, '&;')), so the query holds a token (Pod 2); GitLab \
             authenticates the JSON token (Pod 3): two Pods. {RUNNER_AUTH}"
        ),
        Req::new("POST", &format!("/api/v4/jobs/request?a=1;token={p2}")).body(
            "application/json",
            format!(r#"{{"token":"{p3}"}}"#).into_bytes(),
        ),
        conflict.clone(),
    ));
    cases.push(Case::new(
        "verify: `;` in the query (system_id=s;token=Pod 3), form body without a token",
        format!("Rack 2.2 reads token from the query (Pod 3). {RUNNER_AUTH}"),
        Req::new(
            "POST",
            &format!("/api/v4/runners/verify?system_id=s;token={p3}"),
        )
        .body(form, b"system_id=s".to_vec()),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "verify: `;` inside a form value is not a separator (x=1;token=Pod 2&token=Pod 3)",
        format!(
            "Rack parses form bodies on `&` only (rack lib/rack/request.rb #POST: \
             parse_query(form_vars, '&')), so `1;token=…` is the value of x and the only token \
             is Pod 3. {RUNNER_AUTH}"
        ),
        Req::new("POST", "/api/v4/runners/verify")
            .body(form, format!("x=1;token={p2}&token={p3}").into_bytes()),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "api: Authorization: bearer (lower case) Pod 3",
        format!("Doorkeeper matches the scheme with /^Bearer /i (doorkeeper lib/doorkeeper/oauth/token.rb #from_bearer_authorization): GitLab authenticates it (Pod 3). {API_AUTH}"),
        Req::new("GET", "/api/v4/projects/5").header("authorization", &format!("bearer {pat3}")),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "api: Authorization: bearer (lower case) Pod 3 + PRIVATE-TOKEN Pod 2",
        format!("GitLab authenticates the bearer token (Pod 3) first; PRIVATE-TOKEN names Pod 2: two Pods. {API_AUTH}"),
        Req::new("GET", "/api/v4/projects/5")
            .header("authorization", &format!("bearer {pat3}"))
            .header("private-token", &pat2),
        conflict.clone(),
    ));
    cases.push(Case::new(
        "git: Authorization: BASIC (upper case) gitlab-ci-token Pod 3",
        format!(
            "Rails compares the scheme case-insensitively (actionpack \
             ActionController::HttpAuthentication::Basic #has_basic_credentials?): GitLab \
             authenticates the job token (Pod 3). {GIT_AUTH}"
        ),
        Req::new(
            "GET",
            "/group/project.git/info/refs?service=git-upload-pack",
        )
        .header(
            "authorization",
            &basic("gitlab-ci-token", &j3).replacen("Basic", "BASIC", 1),
        ),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "api: empty private_token param + PRIVATE-TOKEN Pod 3",
        format!("auth_finders.rb skips empty values (`.presence`): GitLab authenticates PRIVATE-TOKEN (Pod 3). {API_AUTH}"),
        Req::new("GET", "/api/v4/projects/5?private_token=").header("private-token", &pat3),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "jobs-request: RUNNER-TOKEN spelled in capitals Pod 2 + form token Pod 3",
        format!("Header names are case-insensitive; RUNNER-TOKEN (Pod 2) and the form token GitLab authenticates (Pod 3) name two Pods. {RUNNER_AUTH}"),
        Req::new("POST", "/api/v4/jobs/request")
            .header("RUNNER-TOKEN", &p2)
            .body(form, format!("token={p3}").into_bytes()),
        conflict,
    ));
    cases.push(Case::new(
        "jobs-request: form body without Content-Type, token Pod 3",
        format!(
            "Rack treats a POST without Content-Type as a form (rack lib/rack/request.rb \
             #form_data?: `(meth == POST && type.nil?)`, #POST parses it with \
             parse_query(form_vars, '&')); Grape keeps such a body raw (default format :txt, \
             grape lib/grape/middleware/formatter.rb), so GitLab authenticates the form token \
             (Pod 3). {RUNNER_AUTH}"
        ),
        Req::new("POST", "/api/v4/jobs/request")
            .body("", format!("token={p3}&last_update=x").into_bytes()),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "verify: form key `[token]` (leading brackets dropped by Rack 2.2) Pod 3",
        format!(
            "rack lib/rack/query_parser.rb #normalize_params: `name =~ %r(\\A[\\[\\]]*([^\\[\\]]+)\\]*)` \
             strips leading brackets, so `[token]=…` is params[:token]: GitLab authenticates it \
             (Pod 3). {RUNNER_AUTH}"
        ),
        Req::new("POST", "/api/v4/runners/verify")
            .body(form, format!("system_id=s&[token]={p3}").into_bytes()),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "path POST /api/v4/jobs/reques%74 (percent-encoded literal), JSON token Pod 2",
        format!(
            "Grape compiles route literals with Mustermann uri_decode (mustermann \
             ast/compiler.rb), so GitLab serves POST /api/v4/jobs/request and authenticates \
             the JSON token (Pod 2); Workhorse only skips its long poll. {PATH_RULES}. {RUNNER_AUTH}"
        ),
        Req::new("POST", "/api/v4/jobs/reques%74")
            .body("application/json", format!(r#"{{"token":"{p2}"}}"#).into_bytes()),
        Expect::Pod(2),
    ));
    cases.push(Case::new(
        "path POST /api/v4/runners/verif%79 (percent-encoded literal), form token Pod 3",
        format!(
            "Grape (Mustermann uri_decode) serves POST /api/v4/runners/verify and authenticates \
             the form token (Pod 3). {PATH_RULES}. {RUNNER_AUTH}"
        ),
        Req::new("POST", "/api/v4/runners/verif%79").body(form, format!("token={p3}").into_bytes()),
        Expect::Pod(3),
    ));
    let override_why = |how: &str| {
        format!(
            "Rails' default middleware stack runs Rack::MethodOverride (rack \
             lib/rack/method_override.rb: a POST with {how} becomes PUT before routing), so \
             GitLab serves PUT /api/v4/jobs/7 and authenticates the body token (Pod 3). {JOB_AUTH}"
        )
    };
    cases.push(Case::new(
        "job-update via POST + X-HTTP-Method-Override: PUT, JSON token Pod 3",
        override_why("X-HTTP-Method-Override: PUT"),
        Req::new("POST", "/api/v4/jobs/7")
            .header("x-http-method-override", "PUT")
            .body(
                "application/json",
                format!(r#"{{"token":"{j3}","state":"running"}}"#).into_bytes(),
            ),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "job-update via POST with _method=PUT in the form body, token Pod 3",
        override_why("a `_method=PUT` form field"),
        Req::new("POST", "/api/v4/jobs/7").body(
            form,
            format!("_method=PUT&state=running&token={j3}").into_bytes(),
        ),
        Expect::Pod(3),
    ));
}
