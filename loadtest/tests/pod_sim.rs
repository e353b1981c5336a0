//! The Pod simulator driven directly through every endpoint of `runner-protocol.md`,
//! checking statuses and headers against GitLab's: registration and its friends
//! (authenticated by the `token` parameter only), long polls (Rails' 204 with the
//! runner's queue value, Workhorse's held 204 without one, 201 with a job, 409
//! races), job updates, trace patches (202 + Range, 416 on a gap, 400
//! without Content-Range), artifacts up and down (the file part, byte-equal), and
//! 403 + `misrouted_requests_total` for a foreign token.

use crate::common;

use std::time::{Duration, Instant};

use common::{call, json as post_json, sim_with};
use podgate_loadtest::pod_sim::PodSim;
use serde_json::json;

/// Generated jobs untagged, so the runner below (tags `a,b`) takes them all.
async fn sim(pod: u64) -> PodSim {
    sim_with(pod, |c| {
        c.conflict_every = 3;
        c.job_tag_sets = vec![vec![]];
    })
    .await
}

fn misroutes(sim: &PodSim) -> u64 {
    sim.metrics().misrouted.get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_runner_endpoint_answers_as_gitlab_does() {
    let pod = sim(2).await;
    let other = sim(3).await;
    let a = pod.addr();
    let reg = pod.state().registration_token().to_owned();

    // POST runners: a bad registration token is 403; the right one issues a runner
    // token routable to this Pod.
    let r = post_json(
        a,
        "POST",
        "/api/v4/runners",
        &[],
        json!({"token": "glrt-wrong", "description": "r"}),
    )
    .await;
    assert_eq!(r.status, 403);
    let r = post_json(a, "POST", "/api/v4/runners", &[], json!({"token": reg, "description": "r1", "tag_list": "a,b", "run_untagged": true, "info": {"name": "gitlab-runner"}})).await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    let runner = r.json()["token"].as_str().unwrap().to_owned();
    assert!(r.json()["id"].as_u64().is_some() && r.json().get("token_expires_at").is_some());
    match podgate_tokens::Classifier::with_keys(podgate_tokens::KeySet::new()).classify(&runner) {
        podgate_tokens::Classification::Routable(id) => assert_eq!(id.pod.get(), 2),
        c => panic!("runner token not routable: {c:?}"),
    }

    // verify: by the body token. The RUNNER-TOKEN header is not read: alone it is a
    // missing token (400), and it does not save a wrong body token (403).
    let r = post_json(
        a,
        "POST",
        "/api/v4/runners/verify",
        &[],
        json!({"token": runner, "system_id": "s_1"}),
    )
    .await;
    assert_eq!(
        (r.status, r.json()["token"].as_str()),
        (200, Some(runner.as_str()))
    );
    let hdr = format!("runner-token: {runner}");
    let r = post_json(
        a,
        "POST",
        "/api/v4/runners/verify",
        &[&hdr],
        json!({"system_id": "s_1"}),
    )
    .await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (400, Some("token is missing"))
    );
    let r = post_json(
        a,
        "POST",
        "/api/v4/runners/verify",
        &[&hdr],
        json!({"token": "glrt-wrong"}),
    )
    .await;
    assert_eq!(r.status, 403);
    let r = post_json(
        a,
        "POST",
        "/api/v4/runners/verify",
        &[],
        json!({"token": "glrt-unknown"}),
    )
    .await;
    assert_eq!(r.status, 403);

    // jobs/request without last_update: Workhorse passes it to Rails, which answers
    // 204 with the runner's queue value.
    let r = post_json(
        a,
        "POST",
        "/api/v4/jobs/request",
        &[],
        json!({"token": runner, "info": {}}),
    )
    .await;
    assert_eq!(r.status, 204);
    assert_eq!(r.header("gitlab-ci-builds-polling"), Some("yes"));
    let ticket = r.header("x-gitlab-last-update").unwrap().to_owned();
    assert_eq!(
        pod.state().queues().get(&runner).as_deref(),
        Some(ticket.as_str())
    );
    // Nothing queued and a current ticket → held by Workhorse for the long poll,
    // then 204 without X-GitLab-Last-Update (the runner keeps its ticket).
    let started = Instant::now();
    let r = post_json(
        a,
        "POST",
        "/api/v4/jobs/request",
        &[],
        json!({"token": runner, "last_update": ticket, "info": {}}),
    )
    .await;
    assert_eq!(r.status, 204);
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "held for the long poll"
    );
    assert_eq!(r.header("x-gitlab-last-update"), None);
    assert_eq!(r.header("gitlab-ci-builds-polling"), Some("yes"));
    // A stale ticket is answered at once by Rails, with the current one.
    let started = Instant::now();
    let r = post_json(
        a,
        "POST",
        "/api/v4/jobs/request",
        &[],
        json!({"token": runner, "last_update": "stale"}),
    )
    .await;
    assert_eq!(r.status, 204);
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(r.header("x-gitlab-last-update"), Some(ticket.as_str()));
    // A held poll is woken by a queued job the runner can take: Workhorse's 204
    // without a ticket; the runner's next request, with its old ticket, gets the job
    // from Rails: 201 with a job shaped like GitLab's.
    let mut held = pod.state().queues().held_polls();
    let poll = tokio::spawn({
        let (runner, ticket) = (runner.clone(), ticket.clone());
        async move {
            post_json(
                a,
                "POST",
                "/api/v4/jobs/request",
                &[],
                json!({"token": runner, "last_update": ticket}),
            )
            .await
        }
    });
    held.wait_for(|n| *n == 1).await.unwrap();
    assert_eq!(pod.metrics().held_polls(), 1);
    let first = pod.enqueue().unwrap();
    let r = poll.await.unwrap();
    assert_eq!((r.status, r.header("x-gitlab-last-update")), (204, None));
    let r = post_json(
        a,
        "POST",
        "/api/v4/jobs/request",
        &[],
        json!({"token": runner, "last_update": ticket}),
    )
    .await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    assert_eq!(r.header("gitlab-ci-builds-polling"), Some("yes"));
    let job = r.json();
    assert_eq!(job["id"].as_u64(), Some(first));
    for field in [
        "token",
        "job_info",
        "git_info",
        "runner_info",
        "variables",
        "steps",
        "artifacts",
        "dependencies",
        "features",
    ] {
        assert!(job.get(field).is_some(), "job JSON lacks {field}");
    }
    let job_token = job["token"].as_str().unwrap().to_owned();
    let job_hdr = format!("job-token: {job_token}");

    // Second and third picks: the third is a simulated race (409), the job stays.
    pod.enqueue().unwrap();
    pod.enqueue().unwrap();
    let poll = json!({"token": runner, "last_update": "x"});
    let r = post_json(a, "POST", "/api/v4/jobs/request", &[], poll.clone()).await;
    assert_eq!(r.status, 201);
    let r = post_json(a, "POST", "/api/v4/jobs/request", &[], poll.clone()).await;
    assert_eq!(r.status, 409);
    let r = post_json(a, "POST", "/api/v4/jobs/request", &[], poll).await;
    assert_eq!(r.status, 201);
    let dependent = r.json();
    let deps = dependent["dependencies"].as_array().unwrap();
    assert_eq!(deps.len(), 2);
    // No dependency has artifacts yet: `artifacts_file` is absent, not null.
    assert!(
        deps.iter().all(|d| d.get("artifacts_file").is_none()),
        "{deps:?}"
    );
    // Dependencies carry the running job's token (GitLab's
    // `ci_expose_running_job_token_for_artifacts`).
    assert!(deps.iter().all(|d| d["token"] == dependent["token"]));

    // PUT jobs/:id `requires :token`: the JOB-TOKEN header alone is 400; the body
    // token → 200.
    let path = format!("/api/v4/jobs/{first}");
    let r = post_json(a, "PUT", &path, &[&job_hdr], json!({"state": "running"})).await;
    assert_eq!(r.status, 400);
    let r = post_json(
        a,
        "PUT",
        &path,
        &[],
        json!({"token": job_token, "state": "running"}),
    )
    .await;
    assert_eq!(r.status, 200);
    // Trace: 202 + Range; a gap → 416 + Range; no Content-Range → 400.
    let trace = format!("/api/v4/jobs/{first}/trace");
    let r = call(
        a,
        "PATCH",
        &trace,
        &[&job_hdr, "content-range: 0-5", "content-type: text/plain"],
        b"hello\n",
    )
    .await;
    assert_eq!((r.status, r.header("range")), (202, Some("0-6")));
    assert_eq!(r.header("job-status"), Some("running"));
    assert!(r.header("x-gitlab-trace-update-interval").is_some());
    let r = call(
        a,
        "PATCH",
        &trace,
        &[&job_hdr, "content-range: 10-12", "content-type: text/plain"],
        b"gap",
    )
    .await;
    assert_eq!((r.status, r.header("range")), (416, Some("0-6")));
    let r = call(
        a,
        "PATCH",
        &trace,
        &[&job_hdr, "content-type: text/plain"],
        b"x",
    )
    .await;
    assert_eq!(r.status, 400);
    // Final update before the whole trace arrived: 202; then 200.
    let r = post_json(
        a,
        "PUT",
        &path,
        &[],
        json!({"token": job_token, "state": "success", "output": {"bytesize": 12}}),
    )
    .await;
    assert_eq!(r.status, 202);
    let r = call(
        a,
        "PATCH",
        &trace,
        &[&job_hdr, "content-range: 6-11", "content-type: text/plain"],
        b"world\n",
    )
    .await;
    assert_eq!((r.status, r.header("range")), (202, Some("0-12")));

    // Artifacts: streamed up (old runner: token in the form), the file part stored
    // and checksummed, and byte-equal down with the dependent job's token.
    let boundary = "sim-boundary";
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut form = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"token\"\r\n\r\n{job_token}\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"artifacts.zip\"\r\nContent-Type: application/zip\r\n\r\n"
    )
    .into_bytes();
    form.extend_from_slice(&payload);
    form.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let ct = format!("content-type: multipart/form-data; boundary={boundary}");
    let up = format!("/api/v4/jobs/{first}/artifacts?artifact_format=zip&artifact_type=archive");
    let r = call(a, "POST", &up, &[&ct], &form).await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    let shown = call(a, "GET", &format!("/-/podsim/jobs/{first}"), &[], b"").await;
    assert_eq!(
        shown.json()["artifact"]["size"].as_u64(),
        Some(payload.len() as u64)
    );
    assert_eq!(shown.json()["artifact"]["filename"], "artifacts.zip");
    let dep_token = dependent["token"].as_str().unwrap();
    let r = call(
        a,
        "GET",
        &format!("/api/v4/jobs/{first}/artifacts?token={dep_token}"),
        &[],
        b"",
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.body == payload, "artifact changed on the way");
    // An unknown token, or none, is 401 (`find_valid_running_job_by_token!`).
    let r = call(
        a,
        "GET",
        &format!("/api/v4/jobs/{first}/artifacts"),
        &["job-token: glcbt-nope"],
        b"",
    )
    .await;
    assert_eq!(r.status, 401);

    let r = post_json(
        a,
        "PUT",
        &path,
        &[],
        json!({"token": job_token, "state": "success", "output": {"bytesize": 12}}),
    )
    .await;
    assert_eq!((r.status, r.header("job-status")), (200, Some("success")));
    // A finished job: 403 + Job-Status. An unknown job: 403 too (never 404, so a
    // runner stops the job).
    let r = post_json(
        a,
        "PUT",
        &path,
        &[],
        json!({"token": job_token, "state": "running"}),
    )
    .await;
    assert_eq!((r.status, r.header("job-status")), (403, Some("success")));
    let r = post_json(
        a,
        "PUT",
        "/api/v4/jobs/99999",
        &[],
        json!({"token": job_token, "state": "running"}),
    )
    .await;
    assert_eq!(r.status, 403);

    // reset_authentication_token: 201 with a new token; the old one is gone.
    let r = post_json(
        a,
        "POST",
        "/api/v4/runners/reset_authentication_token",
        &[],
        json!({"token": runner}),
    )
    .await;
    assert_eq!(r.status, 201);
    let new = r.json()["token"].as_str().unwrap().to_owned();
    assert_eq!(
        post_json(
            a,
            "POST",
            "/api/v4/runners/verify",
            &[],
            json!({"token": runner})
        )
        .await
        .status,
        403
    );
    // DELETE runners/managers and DELETE runners: 204, then the token is refused.
    let r = post_json(
        a,
        "DELETE",
        "/api/v4/runners/managers",
        &[],
        json!({"token": new, "system_id": "s_1"}),
    )
    .await;
    assert_eq!(r.status, 204);
    // That manager is gone; one never seen is not found either.
    for system_id in ["s_1", "s_never"] {
        let r = post_json(
            a,
            "DELETE",
            "/api/v4/runners/managers",
            &[],
            json!({"token": new, "system_id": system_id}),
        )
        .await;
        assert_eq!(r.status, 404, "{system_id}");
    }
    let r = post_json(a, "DELETE", "/api/v4/runners", &[], json!({"token": new})).await;
    assert_eq!(r.status, 204);
    assert_eq!(
        post_json(a, "DELETE", "/api/v4/runners", &[], json!({"token": new}))
            .await
            .status,
        403
    );
    assert_eq!(misroutes(&pod), 0, "no foreign token so far");

    // A token of Pod 3 at Pod 2: 403 and counted, on every endpoint family.
    let foreign = other.state().registration_token().to_owned();
    let r = post_json(a, "POST", "/api/v4/runners", &[], json!({"token": foreign})).await;
    assert_eq!(r.status, 403);
    let r = post_json(
        a,
        "POST",
        "/api/v4/jobs/request",
        &[],
        json!({"token": foreign}),
    )
    .await;
    assert_eq!(r.status, 403);
    let other_job = other.enqueue().unwrap();
    let other_token = other.state().job(other_job).unwrap().token;
    let r = call(
        a,
        "PATCH",
        &trace,
        &[
            &format!("job-token: {other_token}"),
            "content-range: 0-0",
            "content-type: text/plain",
        ],
        b"x",
    )
    .await;
    assert_eq!(r.status, 403);
    assert_eq!(misroutes(&pod), 3);
    let metrics = String::from_utf8(call(a, "GET", "/metrics", &[], b"").await.body).unwrap();
    assert!(
        metrics.contains("misrouted_requests_total{pod=\"2\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "podsim_requests_total{endpoint=\"jobs_request\",status=\"409\",pod=\"2\"} 1"
        ),
        "{metrics}"
    );
}
