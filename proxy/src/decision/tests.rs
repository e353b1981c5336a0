use super::*;
use podgate_registry::TopologyFile;
use podgate_tokens::{Identity, InvalidReason, TokenFormat, TokenKind, UnroutableReason};

fn topology() -> Topology {
    TopologyFile::parse(
        r#"
        default_pod = 1
        [[pods]]
        id = 1
        name = "legacy"
        web = ["127.0.0.1:1"]
        [[pods]]
        id = 2
        name = "two"
        web = ["127.0.0.1:2"]
        [[pods]]
        id = 3
        name = "three"
        web = ["127.0.0.1:3"]
        state = "draining"
        "#,
        "test",
    )
    .unwrap()
    .to_topology(1)
}

fn routable(pod: u64) -> Classification {
    Classification::Routable(Identity::new(
        PodId::new(pod).unwrap(),
        TokenKind::Runner,
        TokenFormat::GitlabV1,
    ))
}

fn forwarded(o: &Outcome) -> Option<u64> {
    match o {
        Outcome::Forward { pod, .. } => Some(pod.id.get()),
        _ => None,
    }
}

#[test]
fn routable_goes_to_its_pod_and_nowhere_else() {
    let t = topology();
    assert_eq!(
        forwarded(&decide(&routable(2), &t, OnInvalid::Reject)),
        Some(2)
    );
    assert_eq!(
        decide(&routable(3), &t, OnInvalid::Reject),
        Outcome::Unavailable("pod_draining")
    );
    assert_eq!(
        decide(&routable(9), &t, OnInvalid::Reject),
        Outcome::Unavailable("unknown_pod")
    );
    // Even with on_invalid = legacy, a routable token for a missing Pod is never
    // sent to the legacy Pod.
    assert_eq!(
        decide(&routable(9), &t, OnInvalid::Legacy),
        Outcome::Unavailable("unknown_pod")
    );
}

#[test]
fn unroutable_and_invalid() {
    let t = topology();
    let u = Classification::Unroutable {
        reason: UnroutableReason::Opaque,
    };
    assert_eq!(forwarded(&decide(&u, &t, OnInvalid::Reject)), Some(1));
    let i = Classification::Invalid {
        reason: InvalidReason::BadCrc,
    };
    assert!(
        matches!(decide(&i, &t, OnInvalid::Reject), Outcome::Unauthorized(m) if m.contains("CRC"))
    );
    assert_eq!(forwarded(&decide(&i, &t, OnInvalid::Legacy)), Some(1));
    let mut no_default = t.clone();
    no_default.default_pod = None;
    assert_eq!(
        decide(&u, &no_default, OnInvalid::Reject),
        Outcome::Unavailable("no_default_pod")
    );
}

fn v1(cell: u64) -> String {
    let keys = podgate_tokens::gitlab::RoutingKeys {
        cell: Some(cell),
        organization: Some(1),
        ..Default::default()
    };
    podgate_tokens::gitlab::encode("glrt-", &keys, &[7; 16]).unwrap()
}

/// How built-in rule `name` routes by token.
fn by_token(name: &str) -> crate::rules::ByToken {
    crate::rules::builtin()
        .into_iter()
        .find(|r| r.name == name)
        .and_then(|r| r.by_token().cloned())
        .unwrap()
}

fn runner_rule() -> crate::rules::ByToken {
    by_token("jobs-request")
}

fn route(headers: &[(&str, &str)], query: Option<&str>, json: Option<&str>) -> Decision {
    let mut h = HeaderMap::new();
    for (k, v) in headers {
        h.append(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    let hop = crate::sources::connection_listed(&h);
    let request = Request {
        headers: &h,
        query,
        body: json.map(|b| {
            (
                &BodyKind::Json,
                Body {
                    bytes: b.as_bytes(),
                    complete: true,
                },
            )
        }),
        hop_by_hop: &hop,
    };
    let classifier = Classifier::with_keys(podgate_tokens::KeySet::new());
    route_by_token(
        &runner_rule(),
        &request,
        &topology(),
        &classifier,
        OnInvalid::Reject,
    )
}

#[test]
fn routes_by_the_token_gitlab_authenticates_when_all_agree() {
    let (two, also_two) = (v1(2), v1(2));
    let d = route(
        &[("runner-token", &two)],
        Some(&format!("token={also_two}")),
        Some(&format!(r#"{{"token":"{two}"}}"#)),
    );
    assert_eq!(forwarded(&d.outcome), Some(2));
    // GitLab's choice: the body's value (Grape: body beats query).
    let chosen = d.token.unwrap();
    assert_eq!(chosen.token, two);
    assert_eq!(chosen.place, crate::sources::Place::Body("json"));
}

#[test]
fn disagreeing_or_invalid_tokens_are_refused_never_forwarded() {
    let (two, three) = (v1(2), v1(3));
    let d = route(
        &[("runner-token", &two)],
        None,
        Some(&format!(r#"{{"token":"{three}"}}"#)),
    );
    match d.outcome {
        Outcome::Refused(r) => {
            assert_eq!((r.status, r.code), (400, "conflicting_tokens"));
            assert!(
                r.detail.contains("Pod 3") && r.detail.contains("Pod 2"),
                "{}",
                r.detail
            );
        }
        o => panic!("{o:?}"),
    }
    // A repeated key counts each time, even though Rack keeps only the last.
    let d = route(&[], Some(&format!("token={three}&token={two}")), None);
    assert_eq!(d.outcome.label(), "conflicting_tokens");
    // An unroutable token names the default Pod: it conflicts with Pod 2's.
    let d = route(
        &[("runner-token", "legacy-opaque-token")],
        None,
        Some(&format!(r#"{{"token":"{two}"}}"#)),
    );
    assert_eq!(d.outcome.label(), "conflicting_tokens");
    // ...and agrees with Pod 1's.
    let d = route(
        &[("runner-token", "legacy-opaque-token")],
        None,
        Some(&format!(r#"{{"token":"{}"}}"#, v1(1))),
    );
    assert_eq!(forwarded(&d.outcome), Some(1));
    // One invalid token anywhere: 401, whichever GitLab would pick.
    let mut bad = two.clone();
    bad.pop();
    bad.push(if two.ends_with('0') { '1' } else { '0' });
    let d = route(
        &[("runner-token", &bad)],
        None,
        Some(&format!(r#"{{"token":"{two}"}}"#)),
    );
    assert!(
        matches!(&d.outcome, Outcome::Unauthorized(m) if m.contains("header:runner-token")),
        "{:?}",
        d.outcome
    );
}

#[test]
fn connection_listed_headers_do_not_route_and_absent_tokens_go_to_the_default_pod() {
    let three = v1(3);
    // jobs/request cannot be served without a token: 400, not the default Pod.
    let d = route(
        &[("connection", "Runner-Token"), ("runner-token", &three)],
        None,
        None,
    );
    assert_eq!(d.outcome.label(), "token_not_found");
    // Git may be anonymous (public projects): the default Pod answers it.
    let git = by_token("git");
    let h = HeaderMap::new();
    let request = Request {
        headers: &h,
        query: None,
        body: None,
        hop_by_hop: &[],
    };
    let classifier = Classifier::with_keys(podgate_tokens::KeySet::new());
    let d = route_by_token(&git, &request, &topology(), &classifier, OnInvalid::Reject);
    assert_eq!(d.outcome.label(), "no_token");
    assert_eq!(forwarded(&d.outcome), Some(1));
    let d = route(&[], None, Some("{bad json"));
    assert_eq!(d.outcome.label(), "malformed_body");
    assert!(matches!(&d.outcome, Outcome::Refused(r) if r.status == 400));
}

#[test]
fn a_multipart_look_ahead_without_a_token_fails_closed() {
    let rule = by_token("job-artifacts-upload");
    let h = HeaderMap::new();
    let kind = BodyKind::Multipart("B".into());
    let prefix =
        b"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nPK..";
    let request = Request {
        headers: &h,
        query: None,
        body: Some((
            &kind,
            Body {
                bytes: prefix,
                complete: false,
            },
        )),
        hop_by_hop: &[],
    };
    let classifier = Classifier::with_keys(podgate_tokens::KeySet::new());
    let d = route_by_token(&rule, &request, &topology(), &classifier, OnInvalid::Reject);
    assert_eq!(d.outcome.label(), "token_not_found");
    let err = match &d.outcome {
        Outcome::Refused(r) => r.to_error(),
        o => panic!("{o:?}"),
    };
    assert_eq!(*err.etype(), pingora::ErrorType::HTTPStatus(400));
    assert_eq!(*err.esource(), pingora::ErrorSource::Downstream);
}

#[test]
fn where_gitlab_allows_no_token_the_session_cookie_or_the_default_pod_decides() {
    let api = by_token("api-token");
    let classifier = Classifier::with_keys(podgate_tokens::KeySet::new());
    let kind = BodyKind::Multipart("B".into());
    // A browser's upload: no token in the head, a file part past the look-ahead.
    let prefix =
        b"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nPK..";
    let decide_with = |headers: &HeaderMap| {
        let request = Request {
            headers,
            query: None,
            body: Some((
                &kind,
                Body {
                    bytes: prefix,
                    complete: false,
                },
            )),
            hop_by_hop: &[],
        };
        route_by_token(&api, &request, &topology(), &classifier, OnInvalid::Reject)
    };
    let d = decide_with(&HeaderMap::new());
    assert_eq!(d.outcome.label(), "no_token");
    assert_eq!(forwarded(&d.outcome), Some(1));
    let mut signed_in = HeaderMap::new();
    signed_in.insert(
        http::header::COOKIE,
        "a=b; _gitlab_session=cell-2-abcdef".parse().unwrap(),
    );
    let d = decide_with(&signed_in);
    assert_eq!(d.outcome.label(), "session");
    assert_eq!(forwarded(&d.outcome), Some(2));
}
