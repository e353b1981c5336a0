//! GitLab-fidelity cases: paths.

use super::*;

pub(super) fn paths(cases: &mut Vec<Case>) {
    let (p2, p3) = (gitlab_token("glrt-", 2), gitlab_token("glrt-", 3));
    let (j2, j3) = (gitlab_token("glcbt-", 2), gitlab_token("glcbt-", 3));
    let json = |t: &str| format!(r#"{{"token":"{t}","state":"running"}}"#).into_bytes();
    let form = |t: &str| format!("token={t}&system_id=s_1").into_bytes();
    let mut add = |name: &str, req: Req, pod: u64, what: &str| {
        cases.push(Case::new(
            format!("path {name}"),
            format!("GitLab serves this path as {what} and authenticates the body token (Pod {pod}). {PATH_RULES}"),
            req,
            Expect::Pod(pod),
        ));
    };
    add(
        "PUT /api/v4/jobs/1// (JSON job token)",
        Req::new("PUT", "/api/v4/jobs/1//").body("application/json", json(&j3)),
        3,
        "PUT /api/v4/jobs/1 (job update)",
    );
    add(
        "PUT /api/v4/jobs/1/ (JSON job token)",
        Req::new("PUT", "/api/v4/jobs/1/").body("application/json", json(&j2)),
        2,
        "PUT /api/v4/jobs/1",
    );
    add(
        "PUT /api/v4//jobs//1 (form job token)",
        Req::new("PUT", "/api/v4//jobs//1").body(
            "application/x-www-form-urlencoded",
            format!("state=running&token={j3}").into_bytes(),
        ),
        3,
        "PUT /api/v4/jobs/1",
    );
    add(
        "PUT /api/v4/jobs/request/../7 (JSON job token)",
        Req::new("PUT", "/api/v4/jobs/request/../7").body("application/json", json(&j2)),
        2,
        "PUT /api/v4/jobs/7",
    );
    add(
        "POST /api/v4//jobs/request (JSON)",
        Req::new("POST", "/api/v4//jobs/request").body("application/json", json(&p2)),
        2,
        "POST /api/v4/jobs/request",
    );
    add(
        "POST /api/v4/jobs/request/ (JSON)",
        Req::new("POST", "/api/v4/jobs/request/").body("application/json", json(&p3)),
        3,
        "POST /api/v4/jobs/request",
    );
    add(
        "POST /api/v4/jobs/request.json (JSON)",
        Req::new("POST", "/api/v4/jobs/request.json").body("application/json", json(&p2)),
        2,
        "POST /api/v4/jobs/request",
    );
    add(
        "POST /api/v4/jobs/./request (form)",
        Req::new("POST", "/api/v4/jobs/./request")
            .body("application/x-www-form-urlencoded", form(&p3)),
        3,
        "POST /api/v4/jobs/request",
    );
    add(
        "POST /api/v4/runners/verify.json (form)",
        Req::new("POST", "/api/v4/runners/verify.json")
            .body("application/x-www-form-urlencoded", form(&p3)),
        3,
        "POST /api/v4/runners/verify",
    );
    add(
        "POST /api/v4/runners/./verify (form)",
        Req::new("POST", "/api/v4/runners/./verify")
            .body("application/x-www-form-urlencoded", form(&p2)),
        2,
        "POST /api/v4/runners/verify",
    );
    add(
        "POST /api/v4/x/../runners (form registration)",
        Req::new("POST", "/api/v4/x/../runners")
            .body("application/x-www-form-urlencoded", form(&p3)),
        3,
        "POST /api/v4/runners",
    );
    add(
        "POST /api/v4/runners/ (multipart registration)",
        Req::new("POST", "/api/v4/runners/").body(&mp_type(), multipart(&[field("token", &p2)])),
        2,
        "POST /api/v4/runners",
    );
    add(
        "DELETE /api/v4/runners// (JSON)",
        Req::new("DELETE", "/api/v4/runners//").body("application/json", json(&p3)),
        3,
        "DELETE /api/v4/runners",
    );
    add(
        "DELETE /api/v4/runners/managers/ (form)",
        Req::new("DELETE", "/api/v4/runners/managers/")
            .body("application/x-www-form-urlencoded", form(&p2)),
        2,
        "DELETE /api/v4/runners/managers",
    );
    add(
        "POST /api/v4/runners/reset_authentication_token.json (JSON)",
        Req::new("POST", "/api/v4/runners/reset_authentication_token.json")
            .body("application/json", json(&p3)),
        3,
        "POST /api/v4/runners/reset_authentication_token",
    );
    add(
        "PATCH /api/v4/jobs//7//trace/ (form token)",
        Req::new("PATCH", "/api/v4/jobs//7//trace/").body(
            "application/x-www-form-urlencoded",
            format!("token={j3}").into_bytes(),
        ),
        3,
        "PATCH /api/v4/jobs/7/trace",
    );
    add(
        "PATCH /api/v4/jobs/7/trace.json (JSON token)",
        Req::new("PATCH", "/api/v4/jobs/7/trace.json").body("application/json", json(&j2)),
        2,
        "PATCH /api/v4/jobs/7/trace",
    );
    add(
        "POST /api/v4/jobs/7/artifacts/ (multipart token)",
        Req::new("POST", "/api/v4/jobs/7/artifacts/").body(
            &mp_type(),
            multipart(&[field("token", &j3), file_part(256)]),
        ),
        3,
        "POST /api/v4/jobs/7/artifacts",
    );
    add(
        "POST /api/v4/jobs/7/./artifacts (multipart token)",
        Req::new("POST", "/api/v4/jobs/7/./artifacts").body(
            &mp_type(),
            multipart(&[field("token", &j2), file_part(256)]),
        ),
        2,
        "POST /api/v4/jobs/7/artifacts",
    );
    cases.push(Case::new(
        "path POST /api/v4//jobs/request?token=Pod2 with JSON token Pod 3",
        format!(
            "GitLab serves POST /api/v4/jobs/request and authenticates the body token (Pod 3); the \
             query token names Pod 2: refused. {PATH_RULES}. {RUNNER_AUTH}"
        ),
        Req::new("POST", &format!("/api/v4//jobs/request?token={p2}"))
            .body("application/json", json(&p3)),
        Expect::Refused(400, "conflicting_tokens"),
    ));
    cases.push(Case::new(
        "path PUT /api/v4/jobs/1// with an invalid JSON token",
        format!(
            "GitLab serves PUT /api/v4/jobs/1 and reads the (invalid) body token: 401. {PATH_RULES}"
        ),
        Req::new("PUT", "/api/v4/jobs/1//").body("application/json", json(&corrupt(&j3))),
        Expect::Refused(401, "401"),
    ));
    cases.push(Case::new(
        "path PUT /api/v4/jobs/1// with a JSON body holding no token",
        format!("GitLab serves PUT /api/v4/jobs/1 (Grape requires :token → 400 everywhere). {PATH_RULES}"),
        Req::new("PUT", "/api/v4/jobs/1//").body("application/json", br#"{"state":"running"}"#.to_vec()),
        Expect::Refused(400, "token_not_found"),
    ));
}
