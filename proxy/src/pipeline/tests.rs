use http::HeaderValue;
use podgate_tokens::KeySet;

use super::*;

/// The default Pod 1 alone.
fn topology() -> Topology {
    let one = podgate_tokens::PodId::new(1).unwrap();
    Topology {
        version: 1,
        pods: [(
            one,
            std::sync::Arc::new(podgate_registry::Pod::new(one, "legacy", "127.0.0.1:1")),
        )]
        .into_iter()
        .collect(),
        default_pod: Some(one),
    }
}

fn head<'a>(method: &'a Method, path: &'a str, headers: &'a HeaderMap) -> Head<'a> {
    Head {
        method,
        path,
        query: None,
        headers,
        host: headers.get("host").and_then(|v| v.to_str().ok()),
        http2: false,
        hop_by_hop: &[],
    }
}

fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(*k, HeaderValue::from_static(v));
    }
    h
}

#[test]
fn an_http1_request_without_host_is_refused_before_any_rule() {
    let rules = rules::builtin();
    let h = headers(&[]);
    let plan = plan(
        &rules,
        &head(&Method::POST, "/api/v4/jobs/request", &h),
        1000,
    );
    assert!(matches!(plan, Plan::MissingHost(r) if r.code == "missing_host"));
    let mut h2 = head(&Method::POST, "/api/v4/jobs/request", &h);
    h2.http2 = true;
    assert!(matches!(plan_of(&rules, &h2), Plan::Route { .. }));
}

fn plan_of(rules: &[Rule], head: &Head<'_>) -> Plan {
    plan(rules, head, 64 * 1024)
}

#[test]
fn the_body_cap_is_the_rules_when_smaller_than_the_look_ahead() {
    let rules = rules::builtin();
    let h = headers(&[("host", "gitlab"), ("content-type", "application/json")]);
    let Plan::Route { rule, body } =
        plan_of(&rules, &head(&Method::POST, "/api/v4/jobs/request", &h))
    else {
        panic!("routed");
    };
    assert!(rules[rule].edge_hold());
    assert_eq!(body.unwrap().limit, 32 * 1024);
    let Plan::Route { body, .. } = plan(
        &rules,
        &head(&Method::POST, "/api/v4/jobs/request", &h),
        1000,
    ) else {
        panic!("routed");
    };
    assert_eq!(body.unwrap().limit, 1000);
    // Multipart is looked into up to the look-ahead, whatever the cap.
    let h = headers(&[
        ("host", "gitlab"),
        ("content-type", "multipart/form-data; boundary=x"),
    ]);
    let Plan::Route { body, .. } =
        plan_of(&rules, &head(&Method::POST, "/api/v4/jobs/request", &h))
    else {
        panic!("routed");
    };
    assert_eq!(body.unwrap().limit, 64 * 1024);
}

#[test]
fn a_multipart_type_without_boundary_is_refused_with_its_rule() {
    let rules = rules::builtin();
    let h = headers(&[("host", "gitlab"), ("content-type", "multipart/form-data")]);
    let plan = plan_of(&rules, &head(&Method::POST, "/api/v4/jobs/request", &h));
    assert!(matches!(plan, Plan::Refuse { rule: 0, refusal } if refusal.code == "malformed_body"));
}

/// The outcome for `path` when its JSON body was not read whole (declared
/// larger than the plan's limit).
fn past_the_cap(path: &str) -> Outcome {
    let rules = rules::builtin();
    let h = headers(&[("host", "gitlab"), ("content-type", "application/json")]);
    let view = head(&Method::POST, path, &h);
    let Plan::Route {
        rule,
        body: Some(plan),
    } = plan_of(&rules, &view)
    else {
        panic!("{path}: routed with a body");
    };
    let body = BodyRead::Read {
        plan: &plan,
        bytes: &[],
        complete: false,
    };
    decide_by(&rules[rule], &view, body).outcome
}

fn decide_by(rule: &Rule, view: &Head<'_>, body: BodyRead<'_>) -> Decision {
    let classifier = Classifier::with_keys(KeySet::new());
    decide(
        rule,
        view,
        body,
        &topology(),
        &classifier,
        OnInvalid::Reject,
    )
}

#[test]
fn a_body_past_the_cap_is_refused_only_where_a_token_is_required() {
    let outcome = past_the_cap("/api/v4/jobs/request");
    assert!(matches!(outcome, Outcome::Refused(r) if r.status == 413));
    // The general API routes a large body by its head: no token there, the default Pod.
    let outcome = past_the_cap("/api/v4/projects/1/repository/commits");
    assert!(
        matches!(
            outcome,
            Outcome::Forward {
                why: "no_token",
                ..
            }
        ),
        "{outcome:?}"
    );
    let rules = rules::builtin();
    let h = headers(&[("host", "gitlab")]);
    let d = decide_by(
        &rules[0],
        &head(&Method::POST, "/api/v4/jobs/request", &h),
        BodyRead::Overflow { limit: 9 },
    );
    assert!(matches!(d.outcome, Outcome::Refused(r) if r.status == 413));
}

#[test]
fn rules_that_do_not_route_by_token_have_a_fixed_outcome() {
    let rules = rules::builtin();
    let h = headers(&[("host", "gitlab")]);
    let view = head(&Method::GET, "/dashboard", &h);
    let Plan::Route { rule, body: None } = plan_of(&rules, &view) else {
        panic!("routed without a body");
    };
    assert_eq!(rules[rule].name, "default");
    let d = decide_by(&rules[rule], &view, BodyRead::Skipped);
    assert!(matches!(d.outcome, Outcome::Forward { why: "default", pod } if pod.id.get() == 1));
}
