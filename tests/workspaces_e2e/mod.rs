//! Workspaces end to end, every part a real process (`podgate kube-sim`, `podgate
//! pod-sim` as GitLab, `podgate kas`, two `podgate agentk` replicas), and what went
//! over the wire between kas and GitLab recorded by a proxy of the test's own
//! ([`recorder`]), which shares no code with kas or agentk. kube-sim enforces RBAC
//! (`--enforce-rbac`, HTTPS): the ServiceAccount and roles of `deploy/agentk` are
//! applied with `kubectl` as an operator would, and agentk runs with that
//! ServiceAccount's token, so every test here also shows the shipped RBAC is
//! enough for Workspaces.
//!
//! - `lifecycle`: create → Starting → Running; stop → Stopping → Stopped; restart
//!   (RestartRequested → Stopped → Running); terminate → Terminating → Terminated
//!   with the namespace gone; a crashing container → Failed; an object the API
//!   refuses → Error with its message; partial cycles carry only what changed, full
//!   cycles carry everything.
//! - `faults`: GitLab answering 500 for a while (the loop goes on; the missed full
//!   is retried as full), the leading agentk killed (the other takes the Lease and
//!   starts with a full reconcile), kas restarted; afterwards every workspace is in
//!   its desired state, none lost, none duplicated.

mod cluster;
mod http;
mod procs;
mod recorder;

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};

use cluster::{Cluster, Timings};
use recorder::Exchange;

/// Long enough for a few reconcile cycles on a busy 2-core machine.
const STEP: Duration = Duration::from_secs(60);

/// Whether GitLab's answer `e` says workspace `name` is `state`.
fn says(e: &Exchange, name: &str, state: &str) -> bool {
    e.status == 201
        && e.response["workspace_rails_infos"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|i| i["name"] == name && i["actual_state"] == state)
}

/// Wait until GitLab's answers, after the `from`-th reconcile, say workspace `name`
/// is each of `states` in turn (other states may come between): the order the
/// workspace went through them. Panics naming the state that never came.
async fn went_through(c: &Cluster, from: usize, name: &str, states: &[&str]) {
    let mut at = from;
    for s in states {
        let (next, _) = c
            .recorder
            .next_after(
                at,
                STEP,
                &format!("saying {name} is {s} (after {states:?} began)"),
                |e| says(e, name, s),
            )
            .await;
        at = next;
    }
}

/// Every partial request leaves out a workspace whose Deployment GitLab already
/// acknowledged at that resource version (unless it carries termination progress
/// or an error); every answer is taken as GitLab's acknowledgement. A full cycle
/// starts from nothing acknowledged.
fn assert_partials_carry_only_changes(log: &[Exchange]) {
    let mut acked: HashMap<String, String> = HashMap::new();
    for (i, e) in log.iter().enumerate() {
        if e.update_type() == "full" {
            acked.clear();
        } else {
            for info in e.request["workspace_agent_infos"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let name = info["name"].as_str().unwrap();
                let rv = info["latest_k8s_deployment_info"]["metadata"]["resourceVersion"].as_str();
                let extra = info.get("termination_progress").is_some()
                    || info.get("error_details").is_some();
                if let (Some(rv), false) = (rv, extra) {
                    assert_ne!(
                        acked.get(name).map(String::as_str),
                        Some(rv),
                        "reconcile #{i} re-sent {name} at resourceVersion {rv}, which GitLab had acknowledged"
                    );
                }
            }
        }
        if e.status == 201 {
            for info in e.response["workspace_rails_infos"]
                .as_array()
                .into_iter()
                .flatten()
            {
                if let (Some(name), Some(rv)) = (
                    info["name"].as_str(),
                    info["deployment_resource_version"].as_str(),
                ) {
                    acked.insert(name.to_owned(), rv.to_owned());
                }
            }
        }
    }
}

fn id(view: &Value) -> u64 {
    view["id"].as_u64().unwrap()
}

fn name(view: &Value) -> String {
    view["name"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lifecycle() {
    let c = Cluster::start(
        Timings {
            pod_start: "3s",
            pod_stop: "3s",
            namespace_delete: "3s",
            full: "12s",
            partial: "1s",
        },
        2,
    )
    .await;
    c.leader(STEP).await;

    // Nothing yet: the first cycle is full, with an empty list (never null).
    let (_, first) = c
        .recorder
        .next_after(0, STEP, "at start", |e| e.status == 201)
        .await;
    assert_eq!(first.update_type(), "full");
    assert_eq!(
        first.request,
        json!({"update_type": "full", "workspace_agent_infos": []})
    );
    let auth: HashMap<_, _> = first.headers.iter().cloned().collect();
    assert!(auth.contains_key("gitlab-kas-api-request"), "{auth:?}");
    assert!(auth.contains_key("authorization"), "{auth:?}");

    // Create → Starting → Running.
    let ws = c.create(json!({})).await;
    let (ws_id, ws_name) = (id(&ws), name(&ws));
    assert_eq!(ws["actual_state"], "CreationRequested");
    c.until_actual(ws_id, "Running", STEP).await;
    went_through(
        &c,
        0,
        &ws_name,
        &["CreationRequested", "Starting", "Running"],
    )
    .await;

    // Stop → Stopping → Stopped.
    c.desire(ws_id, "Stopped").await;
    c.until_actual(ws_id, "Stopped", STEP).await;
    went_through(&c, 0, &ws_name, &["Running", "Stopping", "Stopped"]).await;

    // Restart: RestartRequested → (Stopped) → Running, and GitLab turns the desired
    // state back to Running by itself.
    c.desire(ws_id, "Running").await;
    c.until_actual(ws_id, "Running", STEP).await;
    c.desire(ws_id, "RestartRequested").await;
    let from = c.recorder.len();
    c.until_actual(ws_id, "Stopped", STEP).await;
    let w = c.until_actual(ws_id, "Running", STEP).await;
    assert_eq!(w["desired_state"], "Running", "{w}");
    went_through(&c, from, &ws_name, &["Stopped", "Starting", "Running"]).await;

    // A crashing container → Failed.
    let crash = c.create(json!({"image": "busybox:crashloop"})).await;
    c.until_actual(id(&crash), "Failed", STEP).await;

    // An object the API refuses (a Service port out of range) → Error, with the API
    // server's message on the wire.
    let refused = c.create(json!({"ports": [70000]})).await;
    c.until_actual(id(&refused), "Error", STEP).await;
    // GitLab turns the workspace to Error while it answers the reconcile that
    // carried the error; the recorder logs that reconcile once the answer is back.
    let refused_name = name(&refused);
    let (_, carried) = c
        .recorder
        .next_after(0, STEP, "carrying the applier error", |e| {
            e.info(&refused_name)
                .is_some_and(|i| i.get("error_details").is_some())
        })
        .await;
    let reported = carried.info(&refused_name).unwrap()["error_details"].clone();
    assert_eq!(reported["error_type"], "applier", "{reported}");
    assert!(
        reported["error_message"]
            .as_str()
            .unwrap()
            .contains("must be between 1 and 65535"),
        "{reported}"
    );

    // Partial cycles carry only changes; a full cycle carries every workspace and
    // GitLab answers it with every workspace.
    let settled = c.recorder.len();
    let (_, idle) = c
        .recorder
        .next_after(
            settled,
            STEP,
            "partial and idle for the running workspace",
            |e| e.update_type() == "partial" && e.status == 201 && e.info(&ws_name).is_none(),
        )
        .await;
    assert!(
        idle.returned().iter().all(|n| *n != ws_name),
        "{:?}",
        idle.response
    );
    let (_, full) = c
        .recorder
        .next_after(settled, STEP, "full", |e| {
            e.update_type() == "full" && e.status == 201
        })
        .await;
    let mut reported = full.reported();
    reported.sort();
    assert_eq!(
        reported,
        c.deployments().await,
        "a full cycle reports every Deployment"
    );
    let mut returned = full.returned();
    returned.sort();
    let mut all: Vec<String> = c.workspaces().await.iter().map(name).collect();
    all.sort();
    assert_eq!(returned, all, "a full answer returns every workspace");

    // Terminate → Terminating → Terminated, the namespace gone; an errored workspace
    // terminates too (Terminated beats Error).
    let namespace = ws["namespace"].as_str().unwrap().to_owned();
    assert!(c.namespace_exists(&namespace).await);
    let from = c.recorder.len();
    c.desire(ws_id, "Terminated").await;
    c.desire(id(&refused), "Terminated").await;
    c.until_actual(ws_id, "Terminated", STEP).await;
    c.until_actual(id(&refused), "Terminated", STEP).await;
    went_through(&c, from, &ws_name, &["Terminating", "Terminated"]).await;
    assert!(
        !c.namespace_exists(&namespace).await,
        "{namespace} is still there"
    );
    // Once GitLab said Terminated, agentk never mentions it again.
    let done = c.recorder.len();
    c.recorder
        .next_after(done, STEP, "a later full", |e| {
            e.update_type() == "full" && e.status == 201
        })
        .await;
    assert!(
        c.recorder.log()[done + 1..]
            .iter()
            .all(|e| e.info(&ws_name).is_none()),
        "a terminated workspace was reported again"
    );

    assert_partials_carry_only_changes(&c.recorder.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn faults() {
    let mut c = Cluster::start(
        Timings {
            pod_start: "500ms",
            pod_stop: "300ms",
            namespace_delete: "300ms",
            full: "6s",
            partial: "1s",
        },
        2,
    )
    .await;
    c.leader(STEP).await;
    let a = c.create(json!({})).await;
    let b = c.create(json!({})).await;
    c.until_actual(id(&a), "Running", STEP).await;
    c.until_actual(id(&b), "Running", STEP).await;

    // GitLab fails for a while, across a full interval: the loop keeps trying, every
    // try after the failed full is a full again, and the first success is full.
    let (at, _) = c
        .recorder
        .next_after(c.recorder.len(), STEP, "full", |e| {
            e.update_type() == "full" && e.status == 201
        })
        .await;
    c.recorder.fail(Some(500));
    c.desire(id(&b), "Stopped").await;
    let (failed_full, _) = c
        .recorder
        .next_after(at, STEP, "full failing", |e| {
            e.update_type() == "full" && e.status == 500
        })
        .await;
    let (next, _) = c
        .recorder
        .next_after(failed_full, STEP, "a retry", |e| e.status == 500)
        .await;
    c.recorder.fail(None);
    let (recovered, first_ok) = c
        .recorder
        .next_after(next, STEP, "a success after the outage", |e| {
            e.status == 201
        })
        .await;
    assert_eq!(
        first_ok.update_type(),
        "full",
        "the missed full is retried as full"
    );
    let log = c.recorder.log();
    assert!(
        log[failed_full..recovered - 1]
            .iter()
            .all(|e| e.update_type() == "full"),
        "every try after a failed full is full"
    );
    assert!(
        recovered - 1 - at >= 3,
        "the loop kept going during the outage"
    );
    c.until_actual(id(&b), "Stopped", STEP).await;

    // The leader is killed: the other replica takes the Lease once it expires and
    // begins with a full reconcile.
    let leader = c.leader(STEP).await;
    let before = c.recorder.len();
    c.kill_agentk(&leader).await;
    // The old leader is dead: a request of its that was on its way is answered
    // (and logged) after this, but arrived before it.
    let killed = c.recorder.arrivals();
    let successor = podgate_registry::testing::eventually(STEP, "another leader", || async {
        let h = c.lease_holder().await;
        (!h.is_empty() && h != leader).then_some(h)
    })
    .await;
    assert_ne!(successor, leader);
    // Every reconcile since the kill came from the successor.
    let (_, first) = c
        .recorder
        .next_after(before, STEP, "from the new leader", |e| {
            e.status == 201 && e.arrival >= killed
        })
        .await;
    assert_eq!(
        first.update_type(),
        "full",
        "a new leader starts with a full reconcile"
    );
    c.desire(id(&a), "Stopped").await;
    c.desire(id(&b), "Running").await;

    // kas restarts; reconciles go on through the new one.
    c.restart_kas().await;
    let after = c.recorder.len();
    c.recorder
        .next_after(after, STEP, "through the restarted kas", |e| {
            e.status == 201
        })
        .await;
    let d = c.create(json!({})).await;
    c.desire(id(&a), "Running").await;

    // Nothing lost, nothing duplicated: every workspace in its desired state, one
    // Deployment per workspace.
    c.until_actual(id(&a), "Running", STEP).await;
    c.until_actual(id(&b), "Running", STEP).await;
    c.until_actual(id(&d), "Running", STEP).await;
    let workspaces = c.workspaces().await;
    assert_eq!(workspaces.len(), 3);
    for w in &workspaces {
        assert_eq!(w["actual_state"], w["desired_state"], "{w}");
    }
    let mut names: Vec<String> = workspaces.iter().map(name).collect();
    names.sort();
    assert_eq!(c.deployments().await, names);
    assert_partials_carry_only_changes(&c.recorder.log());
}
