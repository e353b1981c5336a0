//! GitLab-fidelity cases: bodies.

use super::*;

pub(super) fn bodies(cases: &mut Vec<Case>) {
    let (p2, p3) = (gitlab_token("glrt-", 2), gitlab_token("glrt-", 3));
    let (j2, j3) = (gitlab_token("glcbt-", 2), gitlab_token("glcbt-", 3));

    // --- unparseable bodies: fail closed.
    let malformed = Expect::Refused(400, "malformed_body");
    let why = "GitLab cannot read params[:token] from a body it cannot parse (Grape answers \
               400 for bad JSON, grape lib/grape/middleware/formatter.rb; Rack raises \
               InvalidParameterError / EOFError → 400 for a bad form or multipart, rack \
               lib/rack/query_parser.rb, lib/rack/multipart/parser.rb); the proxy must not \
               guess";
    let bad_json = format!(r#"{{"token":"{p2}","info":{{"name":"x"}}"#);
    cases.push(Case::new(
        "jobs-request: truncated JSON",
        why,
        Req::new("POST", "/api/v4/jobs/request")
            .body("application/json", bad_json.clone().into_bytes()),
        malformed.clone(),
    ));
    cases.push(Case::new(
        "jobs-request: truncated JSON beside a RUNNER-TOKEN header",
        why,
        Req::new("POST", "/api/v4/jobs/request")
            .header("runner-token", &p2)
            .body("application/json", bad_json.into_bytes()),
        malformed.clone(),
    ));
    cases.push(Case::new(
        "job-update: JSON with a trailing comma",
        why,
        Req::new("PUT", "/api/v4/jobs/7").body(
            "application/json",
            format!(r#"{{"token":"{j3}","state":"running",}}"#).into_bytes(),
        ),
        malformed.clone(),
    ));
    cases.push(Case::new(
        "verify: form body with bad percent-encoding in another field",
        why,
        Req::new("POST", "/api/v4/runners/verify").body(
            "application/x-www-form-urlencoded",
            format!("token={p3}&system_id=%ZZ").into_bytes(),
        ),
        malformed.clone(),
    ));
    cases.push(Case::new(
        "register: form body with a truncated percent-escape in the token",
        why,
        Req::new("POST", "/api/v4/runners").body(
            "application/x-www-form-urlencoded",
            format!("description=x&token={p3}%4").into_bytes(),
        ),
        malformed.clone(),
    ));
    cases.push(Case::new(
        "trace: form body with bad percent-encoding, JOB-TOKEN header present",
        why,
        Req::new("PATCH", "/api/v4/jobs/7/trace")
            .header("job-token", &j2)
            .body("application/x-www-form-urlencoded", b"token=%G1%".to_vec()),
        malformed.clone(),
    ));
    cases.push(Case::new(
        "artifacts-upload: multipart without a boundary parameter",
        "Rack cannot split the body without a boundary (rack lib/rack/multipart/parser.rb \
         .parse returns EMPTY: no params at all), so GitLab reads no token from it and \
         authenticate_job! fails on every Pod; either refusal is fail-closed",
        Req::new("POST", "/api/v4/jobs/7/artifacts").body(
            "multipart/form-data",
            multipart(&[field("token", &j2), file_part(64)]),
        ),
        Expect::Refused(400, "malformed_body|token_not_found"),
    ));
    cases.push(Case::new(
        "artifacts-upload: multipart body that never opens its boundary",
        why,
        Req::new("POST", "/api/v4/jobs/7/artifacts").body(
            &mp_type(),
            format!("token={j2}\r\nthis is not a multipart body\r\n").into_bytes(),
        ),
        malformed.clone(),
    ));
    {
        let mut body = multipart(&[field("token", &p3), field("system_id", "s_1")]);
        let cut = body.len() - format!("--{BOUNDARY}--\r\n").len();
        body.truncate(cut);
        cases.push(Case::new(
            "verify: complete multipart body without its closing boundary",
            why,
            Req::new("POST", "/api/v4/runners/verify").body(&mp_type(), body),
            malformed.clone(),
        ));
    }
    cases.push(Case::new(
        "jobs-request: multipart part without the blank line after its headers",
        why,
        Req::new("POST", "/api/v4/jobs/request").body(
            &mp_type(),
            format!(
                "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"token\"\r\n{p2}\r\n--{BOUNDARY}--\r\n"
            )
            .into_bytes(),
        ),
        malformed,
    ));

    // --- no token in the inspected body and none elsewhere: fail closed.
    let missing = Expect::Refused(400, "token_not_found");
    let why = "GitLab: Grape `requires :token` answers 400 \"token is missing\" on every Pod \
               (lib/api/ci/runner.rb); the proxy must not pick the default Pod";
    cases.push(Case::new(
        "verify: empty form body",
        why,
        Req::new("POST", "/api/v4/runners/verify")
            .body("application/x-www-form-urlencoded", Vec::new()),
        missing.clone(),
    ));
    cases.push(Case::new(
        "jobs-request: JSON whose only token is nested (info.token is not params[:token])",
        why,
        Req::new("POST", "/api/v4/jobs/request").body(
            "application/json",
            format!(r#"{{"info":{{"token":"{p2}"}},"last_update":"x"}}"#).into_bytes(),
        ),
        missing.clone(),
    ));
    cases.push(Case::new(
        "artifacts-upload: multipart with only a file part and no JOB-TOKEN",
        "GitLab: authenticate_job! finds neither params[:token] nor JOB-TOKEN → 403 on every \
         Pod (lib/api/ci/helpers/runner.rb); the proxy must not pick the default Pod",
        Req::new("POST", "/api/v4/jobs/7/artifacts")
            .body(&mp_type(), multipart(&[file_part(2048)])),
        missing.clone(),
    ));
    cases.push(Case::new(
        "artifacts-upload: 100 KiB file part first, token part after the look-ahead, no header",
        "the token part lies beyond body_lookahead_bytes (65536): the proxy cannot see the token \
         GitLab would read (lib/api/ci/helpers/runner.rb #job_token) and must not guess",
        Req::new("POST", "/api/v4/jobs/7/artifacts").body(
            &mp_type(),
            multipart(&[file_part(100 * 1024), field("token", &j3)]),
        ),
        missing.clone(),
    ));
    // --- body encodings GitLab decodes.
    cases.push(Case::new(
        "jobs-request: JSON token with a \\u escape",
        format!("Ruby's JSON parser decodes \\u0067 to `g`: GitLab authenticates the decoded token (Pod 3). {RUNNER_AUTH}"),
        Req::new("POST", "/api/v4/jobs/request").body(
            "application/json",
            format!(r#"{{"token":"\u0067{}","last_update":"x"}}"#, &p3[1..]).into_bytes(),
        ),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "register: form token fully percent-encoded",
        format!("Rack unescapes form values (rack lib/rack/query_parser.rb): GitLab authenticates the decoded token (Pod 2). {RUNNER_AUTH}"),
        Req::new("POST", "/api/v4/runners").body(
            "application/x-www-form-urlencoded",
            format!(
                "description=x&token={}",
                p2.bytes().map(|b| format!("%{b:02X}")).collect::<String>()
            )
            .into_bytes(),
        ),
        Expect::Pod(2),
    ));
    cases.push(Case::new(
        "verify: content type in capitals with a charset",
        format!("Rack downcases the media type (rack lib/rack/request.rb #media_type), so the body is a form: Pod 3. {RUNNER_AUTH}"),
        Req::new("POST", "/api/v4/runners/verify").body(
            "APPLICATION/X-WWW-FORM-URLENCODED; charset=UTF-8",
            format!("token={p3}&system_id=s_1").into_bytes(),
        ),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "jobs-request: application/json; charset=utf-8",
        format!("Grape parses a JSON body whatever its charset: Pod 2. {RUNNER_AUTH}"),
        Req::new("POST", "/api/v4/jobs/request").body(
            "application/json; charset=utf-8",
            format!(r#"{{"token":"{p2}","last_update":"x"}}"#).into_bytes(),
        ),
        Expect::Pod(2),
    ));
    cases.push(Case::new(
        "jobs-request: JSON with a nested token beside the top-level one",
        format!("Only the top-level key is params[:token]: Pod 3 (the nested Pod 2 token is not a token source). {RUNNER_AUTH}"),
        Req::new("POST", "/api/v4/jobs/request").body(
            "application/json",
            format!(r#"{{"info":{{"name":"x","token":"{p2}"}},"token":"{p3}"}}"#).into_bytes(),
        ),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "trace: text/plain log that looks like JSON and a form, JOB-TOKEN Pod 3",
        format!(
            "Rack parses only form media types and Grape only JSON, so a text/plain trace body is \
             never params (rack lib/rack/request.rb #form_data?); GitLab authenticates JOB-TOKEN \
             (Pod 3). {JOB_AUTH}"
        ),
        Req::new("PATCH", "/api/v4/jobs/7/trace")
            .header("job-token", &j3)
            .header("content-range", "0-99")
            .body(
                "text/plain",
                format!("{{\"token\":\"{j2}\"}}\ntoken={j2}&x=1\n").into_bytes(),
            ),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "jobs-request: chunked JSON body",
        format!("The body (dechunked) is the same JSON: GitLab authenticates its token (Pod 2). {RUNNER_AUTH}"),
        Req {
            chunked: true,
            ..Req::new("POST", "/api/v4/jobs/request").body(
                "application/json",
                format!(r#"{{"token":"{p2}","last_update":"x"}}"#).into_bytes(),
            )
        },
        Expect::Pod(2),
    ));
    cases.push(
        Case::new(
            "register: multipart with Expect: 100-continue (curl --form)",
            format!("GitLab authenticates the multipart token part (Pod 3). {RUNNER_AUTH}"),
            Req::new("POST", "/api/v4/runners")
                .header("expect", "100-continue")
                .body(
                    &mp_type(),
                    multipart(&[field("description", "x"), field("token", &p3)]),
                ),
            Expect::Pod(3),
        )
        .delivery(Delivery::Expect100),
    );

    // --- multipart details.
    cases.push(Case::new(
        "artifacts-upload: small file part first, token part after it",
        format!("Rack reads every part: GitLab authenticates the token part (Pod 3). {RACK_MULTIPART}. {JOB_AUTH}"),
        Req::new("POST", "/api/v4/jobs/7/artifacts")
            .body(&mp_type(), multipart(&[file_part(1024), field("token", &j3)])),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "artifacts-upload: 40 KiB file part first, token part within the 64 KiB look-ahead",
        format!("GitLab authenticates the token part (Pod 2). {RACK_MULTIPART}. {JOB_AUTH}"),
        Req::new("POST", "/api/v4/jobs/7/artifacts").body(
            &mp_type(),
            multipart(&[
                file_part(40 * 1024),
                field("artifact_format", "zip"),
                field("token", &j2),
            ]),
        ),
        Expect::Pod(2),
    ));
    cases.push(Case::new(
        "artifacts-upload: 200 KiB file part, JOB-TOKEN header (body streams past the look-ahead)",
        format!("No token part; GitLab authenticates JOB-TOKEN (Pod 3); the body must arrive byte-identical. {JOB_AUTH}"),
        Req::new("POST", "/api/v4/jobs/7/artifacts")
            .header("job-token", &j3)
            .body(&mp_type(), multipart(&[file_part(200 * 1024)])),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "artifacts-upload: chunked 150 KiB multipart, token part first",
        format!("GitLab authenticates the token part (Pod 2); the dechunked body must arrive byte-identical. {JOB_AUTH}"),
        Req {
            chunked: true,
            ..Req::new("POST", "/api/v4/jobs/7/artifacts")
                .body(&mp_type(), multipart(&[field("token", &j2), file_part(150 * 1024)]))
        },
        Expect::Pod(2),
    ));
    cases.push(
        Case::new(
            "artifacts-upload: short first read (head + 5 body bytes), file part then token part",
            format!(
                "GitLab authenticates the token part (Pod 3), however the bytes arrive. {JOB_AUTH}"
            ),
            Req::new("POST", "/api/v4/jobs/7/artifacts").body(
                &mp_type(),
                multipart(&[file_part(300), field("token", &j3)]),
            ),
            Expect::Pod(3),
        )
        .delivery(Delivery::Pieces {
            first: 5,
            piece: 64,
            pause_ms: 15,
        }),
    );
    cases.push(
        Case::new(
            "verify: short first read of a multipart body, token split across writes",
            format!("GitLab authenticates the token part (Pod 2). {RUNNER_AUTH}"),
            Req::new("POST", "/api/v4/runners/verify").body(
                &mp_type(),
                multipart(&[field("system_id", "s_1"), field("token", &p2)]),
            ),
            Expect::Pod(2),
        )
        .delivery(Delivery::Pieces {
            first: 3,
            piece: 11,
            pause_ms: 10,
        }),
    );
    cases.push(
        Case::new(
            "jobs-request: short first read of a JSON body",
            format!("GitLab authenticates the JSON token (Pod 3). {RUNNER_AUTH}"),
            Req::new("POST", "/api/v4/jobs/request").body(
                "application/json",
                format!(r#"{{"last_update":"x","token":"{p3}"}}"#).into_bytes(),
            ),
            Expect::Pod(3),
        )
        .delivery(Delivery::Pieces {
            first: 1,
            piece: 9,
            pause_ms: 10,
        }),
    );
    cases.push(
        Case::new(
            "register: short first read of a form body",
            format!("GitLab authenticates the form token (Pod 2). {RUNNER_AUTH}"),
            Req::new("POST", "/api/v4/runners").body(
                "application/x-www-form-urlencoded",
                format!("description=x&token={p2}").into_bytes(),
            ),
            Expect::Pod(2),
        )
        .delivery(Delivery::Pieces {
            first: 0,
            piece: 7,
            pause_ms: 10,
        }),
    );
    cases.push(
        Case::new(
            "jobs-request: a form body whose conflicting second token arrives in a later write",
            "Rack keeps the last `token` (Pod 3) but the first (Pod 2) is a token too: refused",
            Req::new("POST", "/api/v4/jobs/request").body(
                "application/x-www-form-urlencoded",
                format!("token={p2}&last_update=x&token={p3}").into_bytes(),
            ),
            Expect::Refused(400, "conflicting_tokens"),
        )
        .delivery(Delivery::Pieces {
            first: 60,
            piece: 20,
            pause_ms: 10,
        }),
    );
    cases.push(Case::new(
        "verify: multipart with lower-case part headers and an unquoted name",
        format!("Rack matches the header name case-insensitively and accepts an unquoted name: Pod 3. {RACK_MULTIPART}"),
        Req::new("POST", "/api/v4/runners/verify").body(
            &mp_type(),
            format!(
                "--{BOUNDARY}\r\ncontent-disposition: form-data; name=token\r\n\r\n{p3}\r\n--{BOUNDARY}--\r\n"
            )
            .into_bytes(),
        ),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "verify: multipart with a quoted boundary parameter",
        format!("Rack strips the quotes (rack lib/rack/multipart/parser.rb MULTIPART): Pod 2. {RUNNER_AUTH}"),
        Req::new("POST", "/api/v4/runners/verify").body(
            &format!("multipart/form-data; boundary=\"{BOUNDARY}\""),
            multipart(&[field("token", &p2)]),
        ),
        Expect::Pod(2),
    ));
    cases.push(Case::new(
        "verify: multipart NAME=\"token\" (upper-case parameter name) alone",
        format!(
            "Rack 2.2 matches `name=` case-insensitively (/…name=…/ni), so GitLab on Rack 2.2 \
             authenticates it (Pod 3); the proxy must count it. {RACK_MULTIPART}"
        ),
        Req::new("POST", "/api/v4/runners/verify").body(
            &mp_type(),
            format!(
                "--{BOUNDARY}\r\nContent-Disposition: form-data; NAME=\"token\"\r\n\r\n{p3}\r\n--{BOUNDARY}--\r\n"
            )
            .into_bytes(),
        ),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "verify: multipart NAME=\"token\" Pod 2 beside name=\"token\" Pod 3",
        format!("Both parts are params[:token] for Rack 2.2 (the last wins): two Pods, refused. {RACK_MULTIPART}"),
        Req::new("POST", "/api/v4/runners/verify").body(
            &mp_type(),
            format!(
                "--{BOUNDARY}\r\nContent-Disposition: form-data; NAME=\"token\"\r\n\r\n{p2}\r\n\
                 --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"token\"\r\n\r\n{p3}\r\n--{BOUNDARY}--\r\n"
            )
            .into_bytes(),
        ),
        Expect::Refused(400, "conflicting_tokens"),
    ));
    cases.push(Case::new(
        "jobs-request: multipart field \"TOKEN\" (invalid) is not params[:token]; RUNNER-TOKEN Pod 2",
        format!(
            "params keys are case-sensitive: `TOKEN` is another field, not a token source; the \
             only token is RUNNER-TOKEN (Pod 2). {RACK_MULTIPART}"
        ),
        Req::new("POST", "/api/v4/jobs/request")
            .header("runner-token", &p2)
            .body(&mp_type(), multipart(&[field("TOKEN", &corrupt(&p3))])),
        Expect::Pod(2),
    ));
    cases.push(Case::new(
        "jobs-request: multipart token parts repeated, three values, last two agree",
        "Rack keeps the last `token` (Pod 3); the first names Pod 2: refused",
        Req::new("POST", "/api/v4/jobs/request").body(
            &mp_type(),
            multipart(&[
                field("token", &p2),
                field("token", &p3),
                field("token", &p3),
            ]),
        ),
        Expect::Refused(400, "conflicting_tokens"),
    ));
}
