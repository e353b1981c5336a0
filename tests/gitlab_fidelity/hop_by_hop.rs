//! GitLab-fidelity cases: hop by hop.

use super::*;

pub(super) fn hop_by_hop(cases: &mut Vec<Case>) {
    let (p2, p3) = (gitlab_token("glrt-", 2), gitlab_token("glrt-", 3));
    let (j2, j3) = (gitlab_token("glcbt-", 2), gitlab_token("glcbt-", 3));
    let pat3 = gitlab_token("glpat-", 3);
    cases.push(
        Case::new(
            "Connection: close, runner-token — RUNNER-TOKEN Pod 3 is hop-by-hop; JSON token Pod 2",
            format!("{HOP_BY_HOP}; GitLab authenticates the JSON token (Pod 2). {RUNNER_AUTH}"),
            Req::new("POST", "/api/v4/jobs/request")
                .header("runner-token", &p3)
                .connection("close, runner-token")
                .body(
                    "application/json",
                    format!(r#"{{"token":"{p2}"}}"#).into_bytes(),
                ),
            Expect::Pod(2),
        )
        .stripped("runner-token"),
    );
    cases.push(
        Case::new(
            "second Connection header lists JOB-TOKEN (invalid); JSON token Pod 3",
            format!("{HOP_BY_HOP}; GitLab authenticates the JSON token (Pod 3). {JOB_AUTH}"),
            Req::new("PUT", "/api/v4/jobs/7")
                .header("job-token", &corrupt(&j2))
                .header("connection", "job-token")
                .body(
                    "application/json",
                    format!(r#"{{"token":"{j3}","state":"running"}}"#).into_bytes(),
                ),
            Expect::Pod(3),
        )
        .stripped("job-token"),
    );
    cases.push(
        Case::new(
            "Connection: Job-Token, close (mixed case) — query token Pod 2 decides",
            format!("{HOP_BY_HOP}; GitLab authenticates ?token= (Pod 2). {JOB_AUTH}"),
            Req::new("PATCH", &format!("/api/v4/jobs/7/trace?token={j2}"))
                .header("job-token", &j3)
                .header("content-range", "0-3")
                .connection("Job-Token, close")
                .body("text/plain", b"log\n".to_vec()),
            Expect::Pod(2),
        )
        .stripped("job-token"),
    );
    cases.push(
        Case::new(
            "Connection: close, private-token — the only token is hop-by-hop: default Pod",
            format!("{HOP_BY_HOP}; GitLab sees no token: an anonymous API request goes to the default Pod. {API_AUTH}"),
            Req::new("GET", "/api/v4/projects/5")
                .header("private-token", &pat3)
                .connection("close, private-token"),
            Expect::Pod(1),
        )
        .stripped("private-token"),
    );
    cases.push(
        Case::new(
            "Connection: close, authorization — git clone credentials are hop-by-hop: default Pod",
            format!("{HOP_BY_HOP}; GitLab sees an anonymous git request. {GIT_AUTH}"),
            Req::new(
                "GET",
                "/group/project.git/info/refs?service=git-upload-pack",
            )
            .header("authorization", &basic("gitlab-ci-token", &j3))
            .connection("close, authorization"),
            Expect::Pod(1),
        )
        .stripped("authorization"),
    );
    cases.push(
        Case::new(
            "Connection: close, runner-token with RUNNER-TOKEN invalid; form token Pod 3",
            format!("{HOP_BY_HOP}; the invalid token never reaches GitLab, which authenticates the form token (Pod 3). {RUNNER_AUTH}"),
            Req::new("POST", "/api/v4/runners/verify")
                .header("runner-token", &corrupt(&p2))
                .connection("close, runner-token")
                .body("application/x-www-form-urlencoded", format!("token={p3}").into_bytes()),
            Expect::Pod(3),
        )
        .stripped("runner-token"),
    );
    cases.push(Case::new(
        "Connection lists another header: JOB-TOKEN Pod 3 still conflicts with JSON token Pod 2",
        format!("Only Connection-listed headers are hop-by-hop; GitLab authenticates the JSON token (Pod 2), JOB-TOKEN names Pod 3: refused. {JOB_AUTH}"),
        Req::new("PUT", "/api/v4/jobs/7")
            .header("job-token", &j3)
            .header("x-trace", "1")
            .connection("close, x-trace")
            .body("application/json", format!(r#"{{"token":"{j2}"}}"#).into_bytes()),
        Expect::Refused(400, "conflicting_tokens"),
    ));
}
