use super::*;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    h
}

fn srcs(list: &[&str]) -> Vec<TokenSource> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

fn tokens(f: &Found) -> Vec<&str> {
    f.candidates.iter().map(|c| c.token.as_str()).collect()
}

fn chosen(f: &Found) -> Option<&str> {
    f.chosen.map(|i| f.candidates[i].token.as_str())
}

#[test]
fn body_beats_query_and_the_last_value_wins() {
    let s = srcs(&["param:token", "header:runner-token"]);
    let h = headers(&[("runner-token", "hdr")]);
    let body = Body {
        bytes: b"token=b1&token=b2",
        complete: true,
    };
    let f = collect(
        &s,
        &h,
        Some("token=q1&token=q2"),
        Some((&BodyKind::Form, body)),
        &[],
    )
    .unwrap();
    assert_eq!(tokens(&f), ["q1", "q2", "b1", "b2", "hdr"]);
    assert_eq!(chosen(&f), Some("b2"));
    assert_eq!(f.candidates[3].place, Place::Body("form"));
    // No body value: the query's last.
    let f = collect(&s, &h, Some("token=q1&token=q2"), None, &[]).unwrap();
    assert_eq!(chosen(&f), Some("q2"));
    // Rails parameters: the query beats the body.
    let rails = srcs(&["rails-param:token"]);
    let f = collect(
        &rails,
        &h,
        Some("token=q1&token=q2"),
        Some((&BodyKind::Form, body)),
        &[],
    )
    .unwrap();
    assert_eq!(chosen(&f), Some("q2"));
    // No parameter at all: the header.
    let f = collect(&s, &h, None, None, &[]).unwrap();
    assert_eq!(chosen(&f), Some("hdr"));
}

#[test]
fn authorization_schemes_and_hop_by_hop_headers() {
    let s = srcs(&["header:job-token", "bearer", "basic"]);
    // user "gitlab-ci-token", password "glcbt-1".
    let h = headers(&[
        ("job-token", " glcbt-j "),
        ("job-token", "glcbt-k"),
        ("authorization", "basic Z2l0bGFiLWNpLXRva2VuOmdsY2J0LTE="),
    ]);
    let f = collect(&s, &h, None, None, &[]).unwrap();
    assert_eq!(tokens(&f), ["glcbt-j", "glcbt-k", "glcbt-1"]);
    assert_eq!(chosen(&f), Some("glcbt-k"));
    let hop = connection_listed(&headers(&[("connection", "close, Job-Token, upgrade")]));
    assert_eq!(
        hop,
        [
            http::HeaderName::from_static("close"),
            http::HeaderName::from_static("job-token")
        ]
    );
    let f = collect(&s, &h, None, None, &hop).unwrap();
    assert_eq!(tokens(&f), ["glcbt-1"]);
    let bearer = headers(&[("authorization", "Bearer glpat-x")]);
    assert_eq!(
        chosen(&collect(&s, &bearer, None, None, &[]).unwrap()),
        Some("glpat-x")
    );
}

#[test]
fn malformed_parameters_and_truncated_multipart() {
    let s = srcs(&["param:token"]);
    let h = HeaderMap::new();
    assert!(collect(&s, &h, Some("token=%zz"), None, &[]).is_err());
    let json = Body {
        bytes: b"{\"token\":",
        complete: true,
    };
    assert_eq!(
        collect(&s, &h, None, Some((&BodyKind::Json, json)), &[]),
        Err(Malformed::Json)
    );
    let mp = Body {
        bytes: b"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x\"\r\n\r\nPK",
        complete: false,
    };
    let f = collect(
        &s,
        &h,
        None,
        Some((&BodyKind::Multipart("B".into()), mp)),
        &[],
    )
    .unwrap();
    assert!(f.truncated && f.candidates.is_empty());
}

#[test]
fn lookup_is_found_absent_or_malformed() {
    let s = srcs(&["param:token", "header:job-token"]);
    let h = headers(&[("job-token", "glcbt-h")]);
    assert_eq!(
        lookup(&s, &h, Some("token=q"), None, &[]),
        Lookup::Found {
            candidates: vec![
                Candidate {
                    token: "q".into(),
                    source: 0,
                    place: Place::Query
                },
                Candidate {
                    token: "glcbt-h".into(),
                    source: 1,
                    place: Place::Head
                },
            ],
            chosen: 0,
        }
    );
    let empty = HeaderMap::new();
    assert_eq!(
        lookup(&s, &empty, Some("other=1"), None, &[]),
        Lookup::Absent { truncated: false }
    );
    assert_eq!(
        lookup(&s, &empty, Some("token[]=x"), None, &[]),
        Lookup::Malformed(Malformed::NotAString("token".into()))
    );
}

#[test]
fn source_names_round_trip_and_errors_are_clear() {
    for s in [
        "header:runner-token",
        "bearer",
        "basic",
        "param:token",
        "rails-param:private_token",
        "query:token",
    ] {
        assert_eq!(s.parse::<TokenSource>().unwrap().to_string(), s);
    }
    assert!(
        "param"
            .parse::<TokenSource>()
            .unwrap_err()
            .contains("parameter name")
    );
    assert!(
        "json:token"
            .parse::<TokenSource>()
            .unwrap_err()
            .contains("param:token")
    );
    assert!(
        "cookie:x"
            .parse::<TokenSource>()
            .unwrap_err()
            .contains("expected")
    );
    let p: TokenSource = "param:token".parse().unwrap();
    assert_eq!(p.label(Place::Body("json")), "json:token");
    assert_eq!(p.label(Place::Query), "query:token");
    assert_eq!(p.labels().len(), 4);
}

#[test]
fn kas_bearer_takes_the_token_out_of_kas_credentials() {
    let s = srcs(&["kas-bearer"]);
    let found = |v: &str| {
        chosen(&collect(&s, &headers(&[("authorization", v)]), None, None, &[]).unwrap())
            .map(str::to_owned)
    };
    assert_eq!(
        found("Bearer pat:42:glpat-abc").as_deref(),
        Some("glpat-abc")
    );
    assert_eq!(found("Bearer ci:7:glcbt-x:y").as_deref(), Some("glcbt-x:y"));
    assert_eq!(found("Bearer pat:-1:t").as_deref(), Some("t"));
    // What kas refuses carries no token (kas answers its own 401 where it goes).
    for refused in [
        "Bearer pat:x:",
        "Bearer pat:42:",
        "Bearer pat:abc:glpat-abc",
        "Bearer pat:99999999999999999999:t",
        "Bearer job:42:t",
        "Bearer glpat-abc",
        "Bearer pat:42",
        "Basic cGF0OjQyOmdscGF0LWFiYw==",
    ] {
        assert_eq!(found(refused), None, "{refused}");
    }
    assert_eq!(kas_token("ci:1:tok"), Some("tok"));
    assert_eq!(
        "kas-bearer".parse::<TokenSource>().unwrap(),
        TokenSource::KasBearer
    );
    assert_eq!(TokenSource::KasBearer.to_string(), "kas-bearer");
    // A plain bearer source does not read kas's credentials as kas does.
    let plain = srcs(&["bearer"]);
    let h = headers(&[("authorization", "Bearer pat:42:glpat-abc")]);
    assert_eq!(
        chosen(&collect(&plain, &h, None, None, &[]).unwrap()),
        Some("pat:42:glpat-abc")
    );
}
