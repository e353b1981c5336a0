//! Jobs as a real runner meets them: the control API queues them, the payload
//! carries GitLab's predefined variables, the configured script and image (none is
//! possible) and `dependencies[].artifacts_file` only when there are artifacts; trace
//! patches count only the `Content-Range` start (exclusive ends, inclusive ends and
//! empty patches all work; 416 + `Range` when the start is not the trace length);
//! artifacts are stored as the `file` part's bytes and come back byte-equal.

use crate::common;

use common::{call, field, file, json, multipart, register, sim, sim_with, take_job, variable};
use serde_json::json;

#[tokio::test]
async fn payload_carries_the_predefined_variables_and_the_spec() {
    let pod = sim_with(2, |c| {
        c.external_url = Some("http://proxy.test:8080/".into())
    })
    .await;
    let a = pod.addr();
    let runner = register(&pod).await;
    let info = call(a, "GET", "/-/podsim", &[], b"").await.json();
    let sha = info["sha"].as_str().expect("a real commit").to_owned();
    assert_eq!(sha.len(), 40);
    assert_eq!(
        info["repo_url"],
        "http://proxy.test:8080/group/project-2.git"
    );

    let job = take_job(
        &pod,
        &runner,
        json!({"name": "compile", "stage": "build", "script": ["echo hi", "mkdir out"], "image": null, "artifacts": []}),
    )
    .await;
    let token = job["token"].as_str().unwrap();
    let id = job["id"].as_u64().unwrap();
    assert_eq!(job["image"], serde_json::Value::Null);
    assert_eq!(
        job["artifacts"],
        serde_json::Value::Null,
        "no artifact paths"
    );
    assert_eq!(job["services"], json!([]));
    assert_eq!(job["steps"][0]["script"], json!(["echo hi", "mkdir out"]));
    assert_eq!(job["job_info"]["name"], "compile");
    assert_eq!(job["job_info"]["stage"], "build");
    assert_eq!(job["git_info"]["sha"], sha.as_str());
    assert_eq!(job["git_info"]["ref"], "main");
    let repo_url = format!("http://gitlab-ci-token:{token}@proxy.test:8080/group/project-2.git");
    assert_eq!(job["git_info"]["repo_url"], repo_url.as_str());
    for (key, value) in [
        ("CI", "true"),
        ("GITLAB_CI", "true"),
        ("CI_SERVER", "yes"),
        ("CI_PROJECT_PATH", "group/project-2"),
        ("CI_PROJECT_NAME", "project-2"),
        ("CI_PROJECT_ID", "1002"),
        ("CI_CONFIG_PATH", ".gitlab-ci.yml"),
        ("CI_COMMIT_SHA", sha.as_str()),
        ("CI_COMMIT_SHORT_SHA", &sha[..8]),
        ("CI_COMMIT_REF_NAME", "main"),
        ("CI_COMMIT_BRANCH", "main"),
        ("CI_JOB_NAME", "compile"),
        ("CI_JOB_STAGE", "build"),
        ("CI_JOB_TOKEN", token),
        ("CI_SERVER_URL", "http://proxy.test:8080"),
        ("CI_SERVER_HOST", "proxy.test"),
        ("CI_SERVER_PORT", "8080"),
        ("CI_SERVER_PROTOCOL", "http"),
        ("CI_API_V4_URL", "http://proxy.test:8080/api/v4"),
        ("CI_PROJECT_URL", "http://proxy.test:8080/group/project-2"),
        ("CI_REPOSITORY_URL", repo_url.as_str()),
        ("CI_PIPELINE_ID", "1"),
        ("CI_DEFAULT_BRANCH", "main"),
        ("CI_POD_ID", "2"),
    ] {
        assert_eq!(variable(&job, key), Some(value), "{key}");
    }
    assert_eq!(variable(&job, "CI_JOB_ID"), Some(id.to_string().as_str()));
    assert_eq!(
        variable(&job, "CI_JOB_URL"),
        Some(format!("http://proxy.test:8080/group/project-2/-/jobs/{id}").as_str())
    );
    // Every variable is a string with GitLab's flags; the job token is masked.
    for v in job["variables"].as_array().unwrap() {
        assert!(
            v["value"].is_string() && v["public"].is_boolean() && v["masked"].is_boolean(),
            "{v}"
        );
    }
    let masked = job["variables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["key"] == "CI_JOB_TOKEN")
        .unwrap();
    assert_eq!(
        (masked["public"].as_bool(), masked["masked"].as_bool()),
        (Some(false), Some(true))
    );

    // Generated jobs keep the configured template, an image included.
    let generated = pod.enqueue().unwrap();
    let r = json(
        a,
        "POST",
        "/api/v4/jobs/request",
        &[],
        json!({"token": runner}),
    )
    .await;
    assert_eq!(r.json()["id"].as_u64(), Some(generated));
    assert_eq!(r.json()["image"]["name"], "alpine:3.20");
    assert_eq!(r.json()["artifacts"][0]["paths"], json!(["out/"]));

    // The control API refuses what it cannot queue.
    let r = json(
        a,
        "POST",
        "/-/podsim/jobs",
        &[],
        json!({"dependencies": [999]}),
    )
    .await;
    assert_eq!(r.status, 400);
    let r = json(
        a,
        "POST",
        "/-/podsim/jobs",
        &[],
        json!({"scripts": ["typo"]}),
    )
    .await;
    assert_eq!(r.status, 400);
    let r = call(a, "GET", "/-/podsim/jobs/999", &[], b"").await;
    assert_eq!(r.status, 404);
    // Control traffic is labelled apart from runner traffic.
    assert!(
        pod.metrics()
            .render()
            .contains("podsim_requests_total{endpoint=\"control\",status=\"201\",pod=\"2\"}")
    );
}

#[tokio::test]
async fn trace_counts_only_the_content_range_start() {
    let pod = sim(2).await;
    let a = pod.addr();
    let runner = register(&pod).await;
    let job = take_job(&pod, &runner, json!({})).await;
    let id = job["id"].as_u64().unwrap();
    let hdr = format!("job-token: {}", job["token"].as_str().unwrap());
    let trace = format!("/api/v4/jobs/{id}/trace");
    let patch = |range: &'static str, body: &'static [u8]| {
        let hdr = hdr.clone();
        let trace = trace.clone();
        async move {
            let range = format!("content-range: {range}");
            call(
                a,
                "PATCH",
                &trace,
                &[&hdr, &range, "content-type: text/plain"],
                body,
            )
            .await
        }
    };
    // gitlab-python-runner: exclusive end. GitLab Runner: inclusive end. Either way
    // only the start counts and the end is start + body length.
    let r = patch("0-6", b"hello\n").await;
    assert_eq!((r.status, r.header("range")), (202, Some("0-6")));
    let r = patch("6-11", b"world\n").await;
    assert_eq!((r.status, r.header("range")), (202, Some("0-12")));
    // An end that says nothing true, and a unit GitLab does not parse (its start
    // reads as 0, which is not the length: 416).
    let r = patch("12-1", b"!!").await;
    assert_eq!((r.status, r.header("range")), (202, Some("0-14")));
    let r = patch("bytes 14-15", b"??").await;
    assert_eq!((r.status, r.header("range")), (416, Some("0-14")));
    // An empty patch at the end (a runner flushing an empty buffer): 202.
    let r = patch("14-14", b"").await;
    assert_eq!((r.status, r.header("range")), (202, Some("0-14")));
    // A start before or after the end: 416 with the current length, nothing kept.
    for range in ["3-5", "20-22"] {
        let r = patch(range, b"xyz").await;
        assert_eq!(
            (r.status, r.header("range")),
            (416, Some("0-14")),
            "{range}"
        );
        assert_eq!(r.json()["message"], "416 Range Not Satisfiable");
    }
    // No Content-Range: 400, but only after the token was checked.
    let r = call(
        a,
        "PATCH",
        &trace,
        &[&hdr, "content-type: text/plain"],
        b"x",
    )
    .await;
    assert_eq!(r.status, 400);
    let r = call(
        a,
        "PATCH",
        &trace,
        &["job-token: glcbt-wrong", "content-type: text/plain"],
        b"x",
    )
    .await;
    assert_eq!(r.status, 403);
    let shown = call(a, "GET", &format!("/-/podsim/jobs/{id}"), &[], b"")
        .await
        .json();
    assert_eq!(shown["trace"], "hello\nworld\n!!");
    assert_eq!(shown["state"], "running");
}

#[tokio::test]
async fn artifacts_are_the_file_part_and_dependencies_see_them() {
    let pod = sim(2).await;
    let a = pod.addr();
    let runner = register(&pod).await;
    let build = take_job(
        &pod,
        &runner,
        json!({"name": "build", "artifacts": ["out/"]}),
    )
    .await;
    let build_id = build["id"].as_u64().unwrap();
    let build_token = build["token"].as_str().unwrap().to_owned();
    let payload: Vec<u8> = (0..700_000u32).map(|i| (i * 31 % 253) as u8).collect();
    let parts = [
        file("file", "artifacts.zip", &payload),
        field("artifact_format", "zip"),
        field("artifact_type", "archive"),
    ];
    let r = multipart(
        a,
        "POST",
        &format!("/api/v4/jobs/{build_id}/artifacts"),
        &[&format!("job-token: {build_token}")],
        &parts,
    )
    .await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    let shown = call(a, "GET", &format!("/-/podsim/jobs/{build_id}"), &[], b"")
        .await
        .json();
    let sha256 = shown["artifact"]["sha256"].as_str().unwrap().to_owned();
    assert_eq!(
        shown["artifact"]["size"].as_u64(),
        Some(payload.len() as u64)
    );
    assert_eq!(shown["artifact"]["filename"], "artifacts.zip");
    let stored = call(
        a,
        "GET",
        &format!("/-/podsim/jobs/{build_id}/artifact"),
        &[],
        b"",
    )
    .await;
    assert!(stored.body == payload, "stored bytes are the file part's");
    use sha2::Digest;
    let expected: String = sha2::Sha256::digest(&payload)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(sha256, expected);
    let r = json(
        a,
        "PUT",
        &format!("/api/v4/jobs/{build_id}"),
        &[],
        json!({"token": build_token, "state": "success"}),
    )
    .await;
    assert_eq!(r.status, 200);

    // A job depending on `build` (with artifacts) and on a job without any.
    let empty = take_job(&pod, &runner, json!({"name": "lint", "artifacts": []})).await;
    let test = take_job(
        &pod,
        &runner,
        json!({"name": "test", "dependencies": [build_id, empty["id"]]}),
    )
    .await;
    let deps = test["dependencies"].as_array().unwrap();
    assert_eq!(deps[0]["name"], "build");
    assert_eq!(
        deps[0]["artifacts_file"],
        json!({"filename": "artifacts.zip", "size": payload.len()})
    );
    assert_eq!(deps[1]["name"], "lint");
    assert!(deps[1].get("artifacts_file").is_none(), "absent, not null");
    // Downloaded with the token the dependency entry carries (the running job's):
    // the same bytes.
    let r = call(
        a,
        "GET",
        &format!("/api/v4/jobs/{build_id}/artifacts"),
        &[&format!(
            "job-token: {}",
            deps[0]["token"].as_str().unwrap()
        )],
        b"",
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.body == payload, "download is byte-equal");
    // The finished job's own token no longer authenticates (401), nor does none.
    let r = call(
        a,
        "GET",
        &format!("/api/v4/jobs/{build_id}/artifacts?job_token={build_token}"),
        &[],
        b"",
    )
    .await;
    assert_eq!(r.status, 401);
    let r = call(
        a,
        "GET",
        &format!("/api/v4/jobs/{build_id}/artifacts"),
        &[],
        b"",
    )
    .await;
    assert_eq!(r.status, 401);
    // No artifacts: 404.
    let r = call(
        a,
        "GET",
        &format!("/api/v4/jobs/{}/artifacts", empty["id"]),
        &[&format!("job-token: {}", test["token"].as_str().unwrap())],
        b"",
    )
    .await;
    assert_eq!(r.status, 404);
}
