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
    first_match(
        &rules,
        &Method::from_bytes(method.as_bytes()).unwrap(),
        path,
        &h,
    )
    .unwrap()
    .name
    .clone()
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
        name("POST", "/podgate.kas.v1.ReverseTunnel/Open", &[]),
        "kas-podgate"
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
}

#[test]
fn builtin_rules_are_valid_and_config_problems_name_fields() {
    for (i, r) in builtin().iter().enumerate() {
        assert!(r.problems(&format!("rules[{i}]")).is_empty(), "{}", r.name);
    }
    let bad: Rule = toml::from_str(
        r#"name = "x"
           methods = ["GE T"]
           path = { prefix = "/" }
           action = "route-to-pod"
           read_timeout_secs = 0"#,
    )
    .unwrap();
    let p = bad.problems("rules[0]").join("\n");
    assert!(
        p.contains("rules[0].methods")
            && p.contains("rules[0].pod")
            && p.contains("read_timeout_secs"),
        "{p}"
    );
    let err = toml::from_str::<Rule>("name='x'\npath={regex='('}\naction='default'").unwrap_err();
    assert!(err.to_string().contains("regex"), "{err}");
}
