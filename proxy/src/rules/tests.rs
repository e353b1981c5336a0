use super::*;

fn name(method: &str, path: &str, headers: &[(&str, &str)]) -> String {
    let mut h = HeaderMap::new();
    for (k, v) in headers {
        h.insert(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    let rules = builtin();
    let host = h.get(http::header::HOST).and_then(|v| v.to_str().ok());
    let i = rule_for(
        &rules,
        &Method::from_bytes(method.as_bytes()).unwrap(),
        path,
        &h,
        host,
    )
    .unwrap();
    rules[i].name.clone()
}

#[test]
fn every_runner_endpoint_has_its_rule() {
    assert_eq!(name("POST", "/api/v4/runners", &[]), "runners");
    assert_eq!(name("POST", "/api/v4/runners/verify", &[]), "runners");
    assert_eq!(name("DELETE", "/api/v4/runners", &[]), "runners");
    assert_eq!(name("DELETE", "/api/v4/runners/managers", &[]), "runners");
    assert_eq!(
        name("POST", "/api/v4/runners/reset_authentication_token", &[]),
        "runners"
    );
    assert_eq!(name("POST", "/api/v4/jobs/request", &[]), "jobs-request");
    assert_eq!(
        name("GET", "/api/v4/runners/router/discovery", &[]),
        "runner-router-discovery"
    );
    assert_eq!(
        name("POST", "/gitlab.agent.job_router.rpc.JobRouter/GetJob", &[]),
        "kas-grpc"
    );
    assert_eq!(name("PUT", "/api/v4/jobs/123", &[]), "job-update");
    assert_eq!(name("PATCH", "/api/v4/jobs/123/trace", &[]), "job-trace");
    assert_eq!(
        name("POST", "/api/v4/jobs/123/artifacts", &[]),
        "job-artifacts-upload"
    );
    assert_eq!(
        name("GET", "/api/v4/jobs/123/artifacts", &[]),
        "job-artifacts-download"
    );
    assert_eq!(name("GET", "/api/v4/projects/1", &[]), "api-token");
    assert_eq!(name("GET", "/group/sub/project.git/info/refs", &[]), "git");
    assert_eq!(
        name("POST", "/group/project.git/git-upload-pack", &[]),
        "git"
    );
    assert_eq!(
        name("POST", "/group/project.git/info/lfs/objects/batch", &[]),
        "git"
    );
    assert_eq!(name("GET", "/jwt/auth", &[]), "registry-auth");
    assert_eq!(
        name("PUT", "/api/v4/projects/1/packages/generic/p/1/f", &[]),
        "api-token"
    );
    assert_eq!(name("GET", "/-/kubernetes-agent/", &[]), "kas-agent");
    assert_eq!(
        name(
            "POST",
            "/gitlab.agent.reverse_tunnel.rpc.ReverseTunnel/Connect",
            &[]
        ),
        "kas-grpc"
    );
    assert_eq!(
        name(
            "GET",
            "/dashboard",
            &[("cookie", "a=b; _gitlab_session=cell-2-xyz")]
        ),
        "session"
    );
    assert_eq!(name("GET", "/dashboard", &[]), "default");
    assert_eq!(
        name("GET", "/dashboard", &[("cookie", "force-cell=cell-3")]),
        "force-cell"
    );
    assert_eq!(
        name(
            "GET",
            "/dashboard",
            &[("cookie", "_gitlab_session_0f3a=cell-2-xyz")]
        ),
        "session"
    );
    assert_eq!(
        name(
            "GET",
            "/dashboard",
            &[("cookie", "_gitlab_session_xyz=cell-2-a")]
        ),
        "default"
    );
}

#[test]
fn the_force_cell_cookie_names_a_cell_by_its_start() {
    let h = |c: &str| {
        let mut h = HeaderMap::new();
        h.insert(http::header::COOKIE, c.parse().unwrap());
        h
    };
    assert_eq!(force_cell(&h("a=b; force-cell=cell-12")), Some("cell-12"));
    assert_eq!(force_cell(&h("force-cell=cell-2xyz")), Some("cell-2"));
    assert_eq!(force_cell(&h("force-cell=cell-")), None);
    assert_eq!(force_cell(&h("force-cell=Cell-2")), None);
    assert_eq!(force_cell(&h("force-cells=cell-2")), None);
    assert_eq!(
        session_cookie(&h(
            "_gitlab_session_ab12=cell-1-x; _gitlab_session=cell-2-y"
        )),
        Some("cell-1-x")
    );
    assert_eq!(session_cookie(&h("_gitlab_sessionx=cell-1-x")), None);
}

#[test]
fn builtin_rules_are_valid_and_config_problems_name_fields() {
    for (i, r) in builtin().iter().enumerate() {
        assert!(r.problems(&format!("rules[{i}]")).is_empty(), "{}", r.name);
    }
    let bad: RuleSpec = toml::from_str(
        r#"name = "x"
           methods = ["GE T"]
           path = { prefix = "/" }
           action = "route-to-pod"
           read_timeout_secs = 0"#,
    )
    .unwrap();
    let p = bad.build("rules[0]").unwrap_err().join("\n");
    assert!(
        p.contains("rules[0].methods")
            && p.contains("rules[0].pod")
            && p.contains("read_timeout_secs"),
        "{p}"
    );
    let err =
        toml::from_str::<RuleSpec>("name='x'\npath={regex='('}\naction='default'").unwrap_err();
    assert!(err.to_string().contains("regex"), "{err}");
}

#[test]
fn kas_k8s_proxy_rules_come_before_kas_agent_and_need_kas_credentials_on_the_host_layout() {
    let k8s = "/-/kubernetes-agent/k8s-proxy/api/v1/pods";
    assert_eq!(name("GET", k8s, &[]), "kas-k8s-proxy");
    assert_eq!(
        name("GET", "/-/kubernetes-agent/k8s-proxy", &[]),
        "kas-k8s-proxy"
    );
    assert_eq!(
        name("GET", "/-/kubernetes-agent/k8s-proxy/graph", &[]),
        "kas-k8s-proxy"
    );
    assert_eq!(
        name("GET", "/-/kubernetes-agent/k8s-proxyx", &[]),
        "kas-agent"
    );
    assert_eq!(name("GET", "/-/kubernetes-agent/", &[]), "kas-agent");
    let rules = builtin();
    let pos = |n: &str| rules.iter().position(|r| r.name == n).unwrap();
    assert!(pos("kas-k8s-proxy") < pos("kas-agent"));
    for r in rules.iter().filter(|r| r.name.starts_with("kas-k8s-proxy")) {
        assert_eq!(r.pool, Pool::KasK8sProxy, "{}", r.name);
        let by = r.by_token().unwrap();
        assert!(by.kas_cookie, "{}", r.name);
        assert!(!by.requires_token, "{}", r.name);
    }
    // kas's own host: `/k8s-proxy/` is a namespace path on GitLab's host, so only
    // with kas's credentials.
    let host = "/k8s-proxy/api/v1/pods";
    assert_eq!(
        name("GET", host, &[("authorization", "Bearer pat:3:glpat-x")]),
        "kas-k8s-proxy-host"
    );
    assert_eq!(
        name("GET", host, &[("authorization", "bearer ci:3:glcbt-x")]),
        "kas-k8s-proxy-host"
    );
    assert_eq!(
        name("GET", host, &[("cookie", "_gitlab_kas=abc")]),
        "kas-k8s-proxy-host-cookie"
    );
    assert_eq!(
        name("GET", host, &[("authorization", "Bearer glpat-x")]),
        "default"
    );
    assert_eq!(
        name("GET", host, &[("cookie", "_gitlab_session=cell-2-x")]),
        "session"
    );
    assert_eq!(name("GET", host, &[]), "default");
}

#[test]
fn kas_cookie_names_its_pod_by_prefix_unless_ambiguous() {
    let t = podgate_registry::TopologyFile::parse(
        "default_pod = 1\n[[pods]]\nid = 1\nname = 'a'\nweb = ['a:1']\n[[pods]]\nid = 2\nname = 'b'\nweb = ['b:1']\n[[pods]]\nid = 21\nname = 'c'\nweb = ['c:1']",
        "t",
    )
    .unwrap()
    .to_topology(1);
    let rule = builtin()
        .into_iter()
        .find(|r| r.name == "kas-k8s-proxy")
        .unwrap();
    let pod = |cookies: &str| {
        let mut h = HeaderMap::new();
        h.insert(http::header::COOKIE, cookies.parse().unwrap());
        session_pod(rule.by_token().unwrap().kas_cookie, &h, &t).map(|p| p.id.get())
    };
    // GitLab writes `<session_cookie_token_prefix><encrypted id>`, no separator.
    assert_eq!(pod("_gitlab_kas=cell-1QmFzZTY0--aXY=--dGFn"), Some(1));
    assert_eq!(
        pod("_gitlab_kas=cell-21abc"),
        None,
        "cell-2 + '1abc' or cell-21 + 'abc'"
    );
    assert_eq!(
        pod("_gitlab_kas=cell-21abc; _gitlab_session=cell-2-ff"),
        Some(2)
    );
    assert_eq!(
        pod("_gitlab_kas=cell-2Zabc; _gitlab_session=cell-1-ff"),
        Some(2),
        "the kas cookie first"
    );
    // Without the prefix (older GitLab): no Pod; the session cookie, else none.
    assert_eq!(pod("_gitlab_kas=QmFzZTY0--aXY=--dGFn"), None);
    assert_eq!(
        pod("_gitlab_kas=QmFzZTY0; _gitlab_session=cell-21-ab"),
        Some(21)
    );
    // Other rules read the session cookie only.
    let api = builtin()
        .into_iter()
        .find(|r| r.name == "api-token")
        .unwrap();
    let mut h = HeaderMap::new();
    h.insert(
        http::header::COOKIE,
        "_gitlab_kas=cell-1abc".parse().unwrap(),
    );
    assert!(session_pod(api.by_token().unwrap().kas_cookie, &h, &t).is_none());
}

#[test]
fn workspace_hosts_match_by_suffix_whatever_the_path() {
    let mut rules = builtin();
    rules.insert(0, workspaces_rule(".workspaces.example.dev"));
    let pick = |host: Option<&str>, path: &str| {
        let mut h = HeaderMap::new();
        if let Some(host) = host {
            h.insert(http::header::HOST, host.parse().unwrap());
        }
        rules
            .iter()
            .find(|r| r.matches(&Method::GET, path, &h))
            .unwrap()
            .name
            .clone()
    };
    for host in [
        "60001-workspace-1-1-abc.workspaces.example.dev",
        "60001-workspace-1-1-abc.WORKSPACES.example.dev:8443",
        "60001-workspace-1-1-abc.workspaces.example.dev.",
    ] {
        assert_eq!(pick(Some(host), "/"), "kas-workspaces", "{host}");
        assert_eq!(pick(Some(host), "/api/v4/user"), "kas-workspaces", "{host}");
    }
    for host in [
        "gitlab.example.dev",
        "workspaces.example.dev",
        "x.workspaces.example.dev.evil.com",
    ] {
        assert_ne!(pick(Some(host), "/"), "kas-workspaces", "{host}");
    }
    assert_ne!(pick(None, "/"), "kas-workspaces");
    let r = &rules[0];
    assert_eq!(r.pool, Pool::KasWorkspaces);
    assert_eq!(r.action.kind(), ActionKind::RouteByToken);
    assert!(!r.by_token().unwrap().requires_token);
    // HTTP/2's :authority is passed in as the host.
    assert!(r.matches_host(
        &Method::GET,
        "/",
        &HeaderMap::new(),
        Some("3000-w.workspaces.example.dev")
    ));
    let bad = Rule {
        host_suffix: Some("a/b".into()),
        ..r.clone()
    };
    assert!(
        bad.problems("rules[0]")
            .iter()
            .any(|p| p.contains("rules[0].host_suffix")),
        "{:?}",
        bad.problems("rules[0]")
    );
}

/// What a rule does is in its action: renaming a built-in rule keeps it.
#[test]
fn behaviour_is_in_the_action_not_names() {
    let rules = builtin();
    let with = |f: fn(&ByToken) -> bool| -> Vec<&str> {
        rules
            .iter()
            .filter(|r| r.by_token().is_some_and(f))
            .map(|r| r.name.as_str())
            .collect()
    };
    assert_eq!(
        with(|b| b.requires_token),
        [
            "jobs-request",
            "runners",
            "job-trace",
            "job-artifacts-upload",
            "job-update"
        ]
    );
    assert_eq!(with(|b| b.edge_hold), ["jobs-request"]);
    assert_eq!(
        with(|b| b.max_body_bytes == Some(32 * 1024)),
        ["jobs-request"]
    );
    let renamed: Vec<Rule> = rules
        .iter()
        .cloned()
        .map(|r| Rule {
            name: format!("renamed-{}", r.name),
            ..r
        })
        .collect();
    let jobs = renamed[0].by_token().unwrap();
    assert!(jobs.requires_token && jobs.edge_hold);
    assert_eq!(jobs.max_body_bytes, Some(32 * 1024));
}

#[test]
fn typed_fields_from_proxy_toml_are_validated_by_name() {
    let parsed: RuleSpec = toml::from_str(
        r#"
        name = "polls"
        path = { regex = "^/api/v4/jobs/request$" }
        action = "route-by-token"
        sources = ["param:token"]
        requires_token = true
        max_body_bytes = 1024
        edge_hold = true
        fast_path = true
        "#,
    )
    .unwrap();
    let rule = parsed.build("rules[0]").unwrap();
    let by = rule.by_token().unwrap();
    assert!(by.requires_token && by.edge_hold && by.fast_path);
    assert_eq!(by.max_body_bytes, Some(1024));
    assert_eq!(by.sources, ["param:token".parse().unwrap()]);
    let bad: RuleSpec = toml::from_str(
        r#"
        name = "pinned"
        path = { prefix = "/" }
        action = "route-to-pod"
        pod = 2
        pool = "kas"
        requires_token = true
        max_body_bytes = 0
        edge_hold = true
        fast_path = true
        "#,
    )
    .unwrap();
    let problems = bad.build("rules[4]").unwrap_err();
    for field in ["requires_token", "max_body_bytes", "edge_hold", "fast_path"] {
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with(&format!("rules[4].{field}:"))),
            "{field}: {problems:?}"
        );
    }
    // The fields of the right action, on the wrong pool; a Pod on a rule that
    // pins none; no sources to route by.
    let problems = |toml: &str| {
        toml::from_str::<RuleSpec>(toml)
            .unwrap()
            .build("rules[1]")
            .unwrap_err()
    };
    let kas = problems(
        "name = 'k'\npath = { prefix = '/' }\naction = 'route-by-token'\n\
         sources = ['bearer']\npool = 'kas'\nedge_hold = true\nfast_path = true",
    );
    assert_eq!(kas.len(), 2, "{kas:?}");
    assert!(kas[0].starts_with("rules[1].edge_hold:"), "{kas:?}");
    assert!(kas[1].starts_with("rules[1].fast_path:"), "{kas:?}");
    let pinned = problems("name = 'd'\npath = { prefix = '/' }\naction = 'default'\npod = 2");
    assert_eq!(pinned.len(), 1, "{pinned:?}");
    assert!(
        pinned[0].starts_with("rules[1].pod: only a route-to-pod rule"),
        "{pinned:?}"
    );
    let sourceless = problems("name = 't'\npath = { prefix = '/' }\naction = 'route-by-token'");
    assert!(
        sourceless[0].starts_with("rules[1].sources:"),
        "{sourceless:?}"
    );
}

/// The fast path serves the runner and job endpoints, and says so in the rule:
/// nothing else is inferred from other fields.
#[test]
fn the_fast_path_rules_are_the_runner_and_job_endpoints() {
    let fast: Vec<String> = builtin()
        .into_iter()
        .filter(Rule::fast_path)
        .map(|r| r.name)
        .collect();
    assert_eq!(
        fast,
        [
            "jobs-request",
            "runners",
            "job-trace",
            "job-artifacts-upload",
            "job-update"
        ]
    );
}

#[test]
fn a_literal_path_regex_matches_as_the_regex_does() {
    let paths = [
        "/api/v4/jobs/request",
        "/api/v4/jobs/request/",
        "/api/v4/jobs/requests",
        "/api/v4/jobs/reques",
        "/API/v4/jobs/request",
        "/x/api/v4/jobs/request",
        "/a.b",
        "/axb",
        "",
    ];
    for pattern in [
        r"^/api/v4/jobs/request$",
        r"^/a.b$",
        r"^/api/v4/jobs/\d+$",
        r"/api/v4/jobs/request",
        r"^$",
    ] {
        let fast = PathRegex::new(pattern).unwrap();
        let regex = regex::Regex::new(pattern).unwrap();
        for path in paths {
            assert_eq!(
                fast.is_match(path),
                regex.is_match(path),
                "{pattern} on {path:?}"
            );
        }
    }
    // Only an anchored pattern without metacharacters is taken as a literal.
    assert!(
        PathRegex::new(r"^/api/v4/jobs/request$")
            .unwrap()
            .exact
            .is_some()
    );
    assert!(PathRegex::new(r"^/a.b$").unwrap().exact.is_none());
    assert!(
        PathRegex::new(r"/api/v4/jobs/request")
            .unwrap()
            .exact
            .is_none()
    );
}
