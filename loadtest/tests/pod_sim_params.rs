//! Parameters as GitLab's Grape/Rack API reads them, on every endpoint family: query,
//! JSON, `application/x-www-form-urlencoded` and `multipart/form-data`, merged
//! `GET.merge(POST)` (a body value beats the query), a key repeated in one source
//! keeping its last value, multipart field names read as Rack reads
//! `Content-Disposition`, and malformed bodies answered 400 (415 for a content type
//! the API does not take). Each case states the token GitLab authenticates and
//! checks the answer that token gets.

use crate::common;

use common::{Part, call, field, file, form, json, multipart, register, sim, take_job};
use serde_json::json;

#[tokio::test]
async fn runner_endpoints_read_the_token_parameter_from_every_body_type() {
    let pod = sim(2).await;
    let a = pod.addr();
    let reg = pod.state().registration_token().to_owned();

    // python-requests `data={...}`: a form body, the bool spelled `False`, `tag_list`
    // repeated once per tag.
    let r = form(
        a,
        "POST",
        "/api/v4/runners",
        &[],
        &format!("token={reg}&description=py&run_untagged=False&tag_list=a&tag_list=b"),
    )
    .await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    let runner = r.json()["token"].as_str().unwrap().to_owned();

    // The body beats the query, in both directions.
    let r = form(
        a,
        "POST",
        "/api/v4/runners/verify?token=glrt-wrong",
        &[],
        &format!("token={runner}"),
    )
    .await;
    assert_eq!(r.status, 200, "body token wins");
    let r = form(
        a,
        "POST",
        &format!("/api/v4/runners/verify?token={runner}"),
        &[],
        "token=glrt-wrong",
    )
    .await;
    assert_eq!(r.status, 403, "body token wins even when wrong");
    // Only in the query: it is used.
    let r = call(
        a,
        "POST",
        &format!("/api/v4/runners/verify?token={runner}"),
        &[],
        b"",
    )
    .await;
    assert_eq!(r.status, 200);
    // JSON beats the query too.
    let r = json(
        a,
        "POST",
        &format!("/api/v4/runners/verify?token={runner}"),
        &[],
        json!({"token": "glrt-wrong"}),
    )
    .await;
    assert_eq!(r.status, 403);

    // A key repeated within one source keeps its last value: form, query, multipart.
    for (body, status) in [
        (format!("token=glrt-wrong&token={runner}"), 200),
        (format!("token={runner}&token=glrt-wrong"), 403),
    ] {
        let r = form(a, "POST", "/api/v4/runners/verify", &[], &body).await;
        assert_eq!(r.status, status, "form {body}");
        let r = call(
            a,
            "POST",
            &format!("/api/v4/runners/verify?{body}"),
            &["content-type: application/json"],
            b"",
        )
        .await;
        assert_eq!(r.status, status, "query {body}");
    }
    for (first, last, status) in [
        ("glrt-wrong", runner.as_str(), 200),
        (runner.as_str(), "glrt-wrong", 403),
    ] {
        let r = multipart(
            a,
            "POST",
            "/api/v4/runners/verify",
            &[],
            &[
                field("token", first),
                field("system_id", "s_1"),
                field("token", last),
            ],
        )
        .await;
        assert_eq!(r.status, status, "multipart last token {last}");
    }
    // The query splits at `;` as well as `&` (Rack 2.2 `GET`), the form only at `&`.
    let r = call(
        a,
        "POST",
        &format!("/api/v4/runners/verify?x=1;token={runner}"),
        &[],
        b"",
    )
    .await;
    assert_eq!(r.status, 200);
    let r = form(
        a,
        "POST",
        "/api/v4/runners/verify",
        &[],
        &format!("x=1;token={runner}"),
    )
    .await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (400, Some("token is missing"))
    );

    // Multipart field names as Rack reads them: `NAME=` matches (case-insensitive
    // expression), an unquoted value stops at `[`.
    let parts = [Part {
        head: "content-disposition: form-data; NAME=token".into(),
        body: runner.as_bytes(),
    }];
    let r = multipart(a, "POST", "/api/v4/runners/verify", &[], &parts).await;
    assert_eq!(r.status, 200);
    let parts = [Part {
        head: "Content-Disposition: form-data; name=token[]".into(),
        body: runner.as_bytes(),
    }];
    let r = multipart(a, "POST", "/api/v4/runners/verify", &[], &parts).await;
    assert_eq!(r.status, 200, "name=token[] unquoted is `token`");
    // Quoted, `token[]` is an array: not a String (400).
    let r = multipart(
        a,
        "POST",
        "/api/v4/runners/verify",
        &[],
        &[field("token[]", &runner)],
    )
    .await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (400, Some("token is invalid"))
    );
    // A token sent as a file part is a hash, not a String.
    let r = multipart(
        a,
        "POST",
        "/api/v4/runners/verify",
        &[],
        &[file("token", "t.txt", runner.as_bytes())],
    )
    .await;
    assert_eq!(r.status, 400);

    // jobs/request, managers and reset with form and multipart bodies.
    let r = form(
        a,
        "POST",
        "/api/v4/jobs/request",
        &[],
        &format!("token={runner}&last_update=stale"),
    )
    .await;
    assert_eq!(r.status, 204);
    let r = form(
        a,
        "DELETE",
        "/api/v4/runners/managers",
        &[],
        &format!("token={runner}"),
    )
    .await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (400, Some("system_id is missing"))
    );
    let r = multipart(
        a,
        "DELETE",
        "/api/v4/runners/managers",
        &[],
        &[field("system_id", "s_1"), field("token", &runner)],
    )
    .await;
    assert_eq!(r.status, 204);
    let r = multipart(
        a,
        "POST",
        "/api/v4/runners/reset_authentication_token",
        &[],
        &[field("token", &runner)],
    )
    .await;
    assert_eq!(r.status, 201);
    let runner = r.json()["token"].as_str().unwrap().to_owned();
    // python-requests `delete(data={...})`: a form body on DELETE.
    let r = form(
        a,
        "DELETE",
        "/api/v4/runners",
        &[],
        &format!("token={runner}"),
    )
    .await;
    assert_eq!(r.status, 204);
    let r = form(
        a,
        "DELETE",
        "/api/v4/runners",
        &[],
        &format!("token={runner}"),
    )
    .await;
    assert_eq!(r.status, 403);
    assert_eq!(pod.metrics().misrouted.get(), 0);
}

#[tokio::test]
async fn malformed_bodies_are_answered_as_rack_and_grape_answer_them() {
    let pod = sim(2).await;
    let a = pod.addr();
    let reg = pod.state().registration_token().to_owned();
    let cases: Vec<(&str, Vec<&str>, Vec<u8>, u16)> = vec![
        // Not JSON, declared JSON.
        (
            "json",
            vec!["content-type: application/json"],
            b"{\"token\":".to_vec(),
            400,
        ),
        // A `%` without two hex digits.
        (
            "escape",
            vec!["content-type: application/x-www-form-urlencoded"],
            format!("token={reg}&x=%zz").into_bytes(),
            400,
        ),
        // `a=1&a[]=2`: a String where Rack needs an Array.
        (
            "shape",
            vec!["content-type: application/x-www-form-urlencoded"],
            format!("token={reg}&a=1&a[]=2").into_bytes(),
            400,
        ),
        // Multipart ending before its closing boundary.
        (
            "truncated multipart",
            vec!["content-type: multipart/form-data; boundary=b"],
            format!("--b\r\nContent-Disposition: form-data; name=\"token\"\r\n\r\n{reg}")
                .into_bytes(),
            400,
        ),
        // Rack refuses whitespace before `=` in the boundary parameter.
        (
            "boundary",
            vec!["content-type: multipart/form-data; boundary =b"],
            format!(
                "--b\r\nContent-Disposition: form-data; name=\"token\"\r\n\r\n{reg}\r\n--b--\r\n"
            )
            .into_bytes(),
            400,
        ),
        // A type the API does not take.
        (
            "xml",
            vec!["content-type: application/xml"],
            b"<token/>".to_vec(),
            415,
        ),
    ];
    for (what, headers, body, status) in cases {
        let r = call(a, "POST", "/api/v4/runners", &headers, &body).await;
        assert_eq!(r.status, status, "{what}: {:?}", r.json());
        assert!(r.json()["error"].is_string(), "{what}: Grape's error shape");
    }
    // No content type: Rack reads a POST body as a form; Grape's default format is
    // `:txt` in GitLab (only `format :json` is set), which has no parser.
    let r = call(
        a,
        "POST",
        "/api/v4/runners",
        &[],
        format!("token={reg}").as_bytes(),
    )
    .await;
    assert_eq!(r.status, 201, "no type: {:?}", r.json());
    // Multipart without a boundary is read as a form (Rack falls back).
    let r = call(
        a,
        "POST",
        "/api/v4/runners",
        &["content-type: multipart/form-data"],
        format!("token={reg}").as_bytes(),
    )
    .await;
    assert_eq!(r.status, 201);
    // No runner was registered by the refused requests: only that one.
    assert_eq!(pod.metrics().misrouted.get(), 0);
}

#[tokio::test]
async fn job_endpoints_take_the_token_parameter_then_job_token() {
    let pod = sim(2).await;
    let other = sim(3).await;
    let a = pod.addr();
    let runner = register(&pod).await;
    let job = take_job(&pod, &runner, json!({"artifacts": ["out/"]})).await;
    let id = job["id"].as_u64().unwrap();
    let token = job["token"].as_str().unwrap().to_owned();
    let path = format!("/api/v4/jobs/{id}");
    let hdr = format!("job-token: {token}");

    // PUT with a form body; paths as Workhorse cleans them and Grape's `.json`.
    let r = form(
        a,
        "PUT",
        &path,
        &[],
        &format!("token={token}&state=running"),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let r = form(
        a,
        "PUT",
        &format!("{path}//"),
        &[],
        &format!("token={token}&state=running"),
    )
    .await;
    assert_eq!(r.status, 200);
    let r = json(
        a,
        "PUT",
        &format!("/api/v4/./jobs/x/../{id}.json"),
        &[],
        json!({"token": token}),
    )
    .await;
    assert_eq!(r.status, 200);
    // `params[:token] || JOB-TOKEN`: a token parameter wins over the header, even
    // an empty one; the header counts only without it.
    let r = form(a, "PUT", &path, &[&hdr], "token=&state=running").await;
    assert_eq!(r.status, 403, "an empty token parameter is still the token");
    let r = form(a, "PUT", &path, &[&hdr], "token=glcbt-wrong").await;
    assert_eq!(r.status, 403);
    let r = form(
        a,
        "PUT",
        &format!("{path}?token={token}"),
        &["job-token: glcbt-wrong"],
        "state=running",
    )
    .await;
    assert_eq!(r.status, 200, "the query token is a parameter too");

    // Trace: the token from the query, else JOB-TOKEN.
    let text = ["content-type: text/plain", "content-range: 0-2"];
    let r = call(
        a,
        "PATCH",
        &format!("{path}/trace?token={token}"),
        &text,
        b"abc",
    )
    .await;
    assert_eq!(r.status, 202);
    let r = call(
        a,
        "PATCH",
        &format!("{path}/trace?token=glcbt-wrong"),
        &[text[0], "content-range: 3-5", &hdr],
        b"def",
    )
    .await;
    assert_eq!(r.status, 403, "the query token wins over JOB-TOKEN");

    // A form-encoded trace patch: Rack reads its token from the body, and the body as
    // received is what is appended.
    let body = format!("token={token}");
    let r = form(
        a,
        "PATCH",
        &format!("{path}/trace"),
        &["content-range: 3-3", "job-token: glcbt-wrong"],
        &body,
    )
    .await;
    assert_eq!(
        (r.status, r.header("range")),
        (202, Some(format!("0-{}", 3 + body.len()).as_str()))
    );

    // Artifacts: the token field after the file part, before it, or only the header
    // (as gitlab-python-runner sends: file part first, then two fields).
    let up = format!("{path}/artifacts");
    for parts in [
        vec![file("file", "a.zip", b"one"), field("token", &token)],
        vec![field("token", &token), file("file", "a.zip", b"one")],
    ] {
        let r = multipart(a, "POST", &up, &[], &parts).await;
        assert_eq!(r.status, 201, "{:?}", r.json());
    }
    let parts = [
        file("file", "a.zip", b"two"),
        field("artifact_format", "zip"),
        field("artifact_type", "archive"),
    ];
    let r = multipart(a, "POST", &up, &[&hdr], &parts).await;
    assert_eq!(r.status, 201);
    // A repeated token field keeps its last value, wherever the file part is.
    for (parts, status) in [
        (
            vec![
                file("file", "a.zip", b"two"),
                field("token", "glcbt-wrong"),
                field("token", &token),
            ],
            201,
        ),
        (
            vec![
                field("token", &token),
                file("file", "a.zip", b"x"),
                field("token", "glcbt-wrong"),
            ],
            403,
        ),
    ] {
        let r = multipart(a, "POST", &up, &[], &parts).await;
        assert_eq!(r.status, status);
    }
    // A wrong token field beats a right header.
    let parts = [
        file("file", "a.zip", b"three"),
        field("token", "glcbt-wrong"),
    ];
    let r = multipart(a, "POST", &up, &[&hdr], &parts).await;
    assert_eq!(r.status, 403);
    // No `file` part: 400 `file is missing`.
    let r = multipart(a, "POST", &up, &[&hdr], &[field("artifact_format", "zip")]).await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (400, Some("file is missing"))
    );
    // A form field cannot pose as the uploaded file.
    let r = form(
        a,
        "POST",
        &up,
        &[&hdr],
        "file[tempfile]=/etc/passwd&file[filename]=x",
    )
    .await;
    assert_eq!(r.status, 400);
    let shown = call(a, "GET", &format!("/-/podsim/jobs/{id}/artifact"), &[], b"").await;
    assert_eq!(shown.body, b"two", "the refused upload stored nothing");

    // A job token of another Pod in a token field after the file part: a misroute.
    let other_runner = register(&other).await;
    let foreign = take_job(&other, &other_runner, json!({})).await;
    let foreign = foreign["token"].as_str().unwrap();
    let parts = [file("file", "a.zip", b"x"), field("token", foreign)];
    let r = multipart(a, "POST", &up, &[], &parts).await;
    assert_eq!(r.status, 403);
    let r = form(a, "PUT", &path, &[&hdr], &format!("token={foreign}")).await;
    assert_eq!(r.status, 403);
    assert_eq!(pod.metrics().misrouted.get(), 2);
}
