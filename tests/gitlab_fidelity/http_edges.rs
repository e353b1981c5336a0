//! GitLab-fidelity cases: http edges.

use super::*;

pub(super) fn http_edges(cases: &mut Vec<Case>) {
    let p2 = gitlab_token("glrt-", 2);
    let pat3 = gitlab_token("glpat-", 3);
    let no_host = |req: Req| Req {
        version: "HTTP/1.0",
        host: false,
        ..req
    };
    cases.push(Case::new(
        "HTTP/1.0 GET without Host",
        "no Host: no URL to serve (RFC 9112 §3.2); never forwarded (today it goes out as HTTP/1.1 without Host)",
        no_host(Req::new("GET", "/api/v4/projects/5").header("private-token", &pat3).connection("")),
        Expect::Refused(400, ""),
    ));
    cases.push(Case::new(
        "HTTP/1.0 POST jobs/request without Host",
        "no Host: never forwarded, whatever its token",
        no_host(
            Req::new("POST", "/api/v4/jobs/request")
                .connection("")
                .body(
                    "application/json",
                    format!(r#"{{"token":"{p2}"}}"#).into_bytes(),
                ),
        ),
        Expect::Refused(400, ""),
    ));
    cases.push(Case::new(
        "HTTP/1.0 with Host (control)",
        format!("GitLab authenticates the PRIVATE-TOKEN (Pod 3). {API_AUTH}"),
        Req {
            version: "HTTP/1.0",
            ..Req::new("GET", "/api/v4/projects/5")
                .header("private-token", &pat3)
                .connection("")
        },
        Expect::Pod(3),
    ));
    cases.push(
        Case::new(
            "head written one line per write, 40 ms apart, well within the head deadline",
            format!("GitLab authenticates the JSON token (Pod 2). {RUNNER_AUTH}"),
            Req::new("POST", "/api/v4/jobs/request")
                .header("user-agent", "gitlab-runner 17.0.0")
                .header("accept", "application/json")
                .body(
                    "application/json",
                    format!(r#"{{"token":"{p2}"}}"#).into_bytes(),
                ),
            Expect::Pod(2),
        )
        .delivery(Delivery::SlowHead { pause_ms: 40 }),
    );
}
