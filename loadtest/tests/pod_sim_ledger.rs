//! The per-job ledger the fault drills check (`GET /-/podsim/ledger`): a job picked
//! up and finished appears once, with its runner; a second final update is refused
//! and counted as a duplicate; a token of another Pod is counted as a misroute.

use crate::common;

use common::{json, register, sim, take_job};
use serde_json::{Value, json};

async fn ledger(pod: &podgate_loadtest::pod_sim::PodSim) -> Value {
    let r = common::call(pod.addr(), "GET", "/-/podsim/ledger", &[], b"").await;
    assert_eq!(r.status, 200);
    r.json()
}

#[tokio::test]
async fn a_finished_job_appears_once_and_a_second_finish_is_a_duplicate() {
    let pod = sim(2).await;
    let runner = register(&pod).await;
    let job = take_job(&pod, &runner, json!({"artifacts": []})).await;
    let (id, token) = (job["id"].as_u64().unwrap(), job["token"].as_str().unwrap());
    let runner_id = job["runner_info"]["runner_id"].as_u64();

    let l = ledger(&pod).await;
    assert_eq!(l["pod_id"], 2);
    assert_eq!(l["summary"]["picked"], 1);
    assert_eq!(l["summary"]["unfinished"], 1);
    assert_eq!(l["summary"]["finished"], 0);

    let path = format!("/api/v4/jobs/{id}");
    let finish = json!({"token": token, "state": "success", "output": {"bytesize": 0}});
    let r = json(pod.addr(), "PUT", &path, &[], finish.clone()).await;
    assert_eq!(r.status, 200);

    let l = ledger(&pod).await;
    assert_eq!(
        l["summary"],
        json!({"picked": 1, "picked_twice": 0, "finished": 1, "finished_once": 1,
               "success": 1, "failed": 0, "unfinished": 0, "duplicates": 0})
    );
    let jobs = l["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{l}");
    assert_eq!(jobs[0]["id"], id);
    assert_eq!(jobs[0]["finals"], json!(["success"]));
    assert_eq!(jobs[0]["picked_by"].as_array().unwrap().len(), 1);
    if let Some(r) = runner_id {
        assert_eq!(jobs[0]["picked_by"][0], r);
    }

    // Sent again (a runner retrying a result it thinks lost): refused, a duplicate.
    let r = json(pod.addr(), "PUT", &path, &[], finish).await;
    assert_eq!(r.status, 403);
    assert_eq!(r.header("job-status"), Some("success"));
    let l = ledger(&pod).await;
    assert_eq!(l["summary"]["duplicates"], 1);
    assert_eq!(l["summary"]["finished"], 1);
    assert_eq!(l["summary"]["finished_once"], 0, "no longer exactly once");
    assert_eq!(l["jobs"][0]["duplicates"], 1);
    assert_eq!(l["jobs"][0]["finals"], json!(["success"]));

    // A running update is no final state: nothing recorded for it.
    let r = json(
        pod.addr(),
        "PUT",
        &path,
        &[],
        json!({"token": token, "state": "running"}),
    )
    .await;
    assert_eq!(r.status, 403);
    assert_eq!(ledger(&pod).await["summary"]["duplicates"], 1);

    // The summary view leaves the jobs out.
    let r = common::call(pod.addr(), "GET", "/-/podsim/ledger/summary", &[], b"").await;
    assert_eq!(r.json()["summary"]["duplicates"], 1);
    assert!(r.json().get("jobs").is_none());
}

#[tokio::test]
async fn a_token_of_another_pod_is_counted_in_the_ledger() {
    let (p2, p3) = (sim(2).await, sim(3).await);
    let foreign = register(&p3).await;
    let r = json(
        p2.addr(),
        "POST",
        "/api/v4/runners/verify",
        &[],
        json!({"token": foreign}),
    )
    .await;
    assert_eq!(r.status, 403);
    let l = ledger(&p2).await;
    assert_eq!(l["misrouted"], 1);
    assert_eq!(l["summary"]["picked"], 0);
    assert_eq!(ledger(&p3).await["misrouted"], 0);
}
