//! The reconciler over fake GitLab and cluster, after agentk's
//! `reconciler_test.go` (creation, termination, a terminated workspace, applier
//! errors) plus version guards and failures.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use kube::runtime::watcher::Event;

use super::*;
use crate::remote_development::fakes::{FakeCluster, FakeRails, deployment, rails_info, store};

struct Setup {
    rails: Arc<FakeRails>,
    cluster: Arc<FakeCluster>,
    writer: kube::runtime::reflector::store::Writer<Deployment>,
    r: Reconciler<FakeRails, FakeCluster>,
    metrics: WorkspacesMetrics,
}

fn setup() -> Setup {
    let rails = Arc::new(FakeRails::default());
    let cluster = Arc::new(FakeCluster::default());
    let (reader, writer) = store();
    let metrics = WorkspacesMetrics::default();
    let r = Reconciler::new(
        rails.clone(),
        cluster.clone(),
        Deployments::from_store(reader),
        Applies::default(),
        metrics.clone(),
    );
    Setup {
        rails,
        cluster,
        writer,
        r,
        metrics,
    }
}

impl Setup {
    /// Run one cycle; wait for the applies it started; the body it sent.
    async fn cycle(&mut self) -> Result<String, Error> {
        let before = self.rails.requests().len();
        let result = self.r.run().await;
        self.r.errors().wait_idle().await;
        let requests = self.rails.requests();
        assert_eq!(requests.len(), before + 1, "one request per cycle");
        result.map(|_| requests[before].body.clone())
    }

    fn put(&mut self, name: &str, namespace: &str, version: &str) {
        self.writer
            .apply_watcher_event(&Event::Apply(deployment(name, namespace, version)));
    }

    fn remove(&mut self, name: &str, namespace: &str) {
        self.writer
            .apply_watcher_event(&Event::Delete(deployment(name, namespace, "0")));
    }
}

const EMPTY_FULL: &str = r#"{"update_type":"full","workspace_agent_infos":[]}"#;
const EMPTY_PARTIAL: &str = r#"{"update_type":"partial","workspace_agent_infos":[]}"#;

#[tokio::test]
async fn creation_sends_each_deployment_version_once() {
    let mut s = setup();
    // A new workspace: GitLab has no version for it yet.
    s.rails.answer_infos(&[rails_info(
        "ws",
        "ns",
        "Running",
        "CreationRequested",
        None,
        "---\nkind: ConfigMap\n",
    )]);
    assert_eq!(s.cycle().await.unwrap(), EMPTY_FULL);
    assert!(s.cluster.has_namespace("ns"));
    assert_eq!(
        *s.cluster.applied.lock().unwrap(),
        vec!["---\nkind: ConfigMap\n"]
    );
    assert!(s.r.persisted().is_persisted("ws", ""));

    // Its Deployment appears: sent whole, as the cluster has it.
    s.put("ws", "ns", "5");
    s.rails
        .answer_infos(&[rails_info("ws", "ns", "Running", "Starting", Some("5"), "")]);
    let body = s.cycle().await.unwrap();
    let sent: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(sent["update_type"], "partial");
    let info = &sent["workspace_agent_infos"][0];
    assert_eq!(info["name"], "ws");
    assert_eq!(info["namespace"], "ns");
    assert_eq!(info["latest_k8s_deployment_info"]["kind"], "Deployment");
    assert_eq!(info["latest_k8s_deployment_info"]["apiVersion"], "apps/v1");
    assert_eq!(
        info["latest_k8s_deployment_info"]["metadata"]["resourceVersion"],
        "5"
    );
    assert_eq!(
        info["latest_k8s_deployment_info"]["status"]["availableReplicas"],
        1
    );
    // Keys sorted, as Go marshals maps.
    assert!(body.contains(r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"labels""#));
    // No config: nothing applied; the namespace exists: not created again.
    assert_eq!(s.cluster.applied.lock().unwrap().len(), 1);
    assert_eq!(s.cluster.created.lock().unwrap().len(), 1);

    // GitLab acknowledged version 5: not sent again.
    assert_eq!(s.cycle().await.unwrap(), EMPTY_PARTIAL);
    // A new version is.
    s.put("ws", "ns", "6");
    let body = s.cycle().await.unwrap();
    assert!(body.contains(r#""resourceVersion":"6""#), "{body}");
    // Not acknowledged (GitLab answered with nothing): sent again.
    let body = s.cycle().await.unwrap();
    assert!(body.contains(r#""resourceVersion":"6""#), "{body}");
    assert_eq!(s.metrics.sent.get(), 3);
    assert_eq!(s.metrics.cycles("full", "ok"), 1);
    assert_eq!(s.metrics.cycles("partial", "ok"), 4);
}

#[tokio::test]
async fn a_deployment_of_an_unknown_workspace_is_sent_until_acknowledged() {
    let mut s = setup();
    s.put("b", "nb", "1");
    s.put("a", "na", "1");
    let body = s.cycle().await.unwrap();
    let sent: serde_json::Value = serde_json::from_str(&body).unwrap();
    let names: Vec<_> = sent["workspace_agent_infos"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["a", "b"], "ordered by name");
}

#[tokio::test]
async fn termination_is_reported_until_gitlab_confirms() {
    let mut s = setup();
    s.put("ws", "ns", "1");
    s.cluster.namespaces.lock().unwrap().insert("ns".into());
    // Full: GitLab acknowledges version 1 and wants the workspace gone.
    s.rails.answer_infos(&[rails_info(
        "ws",
        "ns",
        "Terminated",
        "Running",
        Some("1"),
        "---\n",
    )]);
    s.cycle().await.unwrap();
    assert_eq!(*s.cluster.deleted.lock().unwrap(), vec!["ns"]);
    assert_eq!(
        s.r.terminations().get("ws", "ns"),
        Some(TerminationProgress::Terminating)
    );
    // `config_to_apply` is not applied for a Terminated workspace.
    assert!(s.cluster.applied.lock().unwrap().is_empty());

    // The Deployment is still there: Terminating, and only that (version known).
    s.rails.answer_infos(&[rails_info(
        "ws",
        "ns",
        "Terminated",
        "Terminating",
        Some("1"),
        "",
    )]);
    assert_eq!(
        s.cycle().await.unwrap(),
        r#"{"update_type":"partial","workspace_agent_infos":[{"name":"ws","namespace":"ns","termination_progress":"Terminating"}]}"#
    );
    assert_eq!(
        s.cluster.deleted.lock().unwrap().len(),
        2,
        "deleting again is fine"
    );

    // Gone from the cluster: Terminated, until GitLab says it is.
    s.remove("ws", "ns");
    s.cluster.namespaces.lock().unwrap().remove("ns");
    assert_eq!(
        s.cycle().await.unwrap(),
        r#"{"update_type":"partial","workspace_agent_infos":[{"name":"ws","namespace":"ns","termination_progress":"Terminated"}]}"#
    );
    // What is reported is decided from the store; the tracker changes only when
    // GitLab answers for the workspace.
    assert_eq!(
        s.r.terminations().get("ws", "ns"),
        Some(TerminationProgress::Terminating)
    );
    s.rails.answer_infos(&[rails_info(
        "ws",
        "ns",
        "Terminated",
        "Terminated",
        Some("1"),
        "",
    )]);
    let body = s.cycle().await.unwrap();
    assert!(body.contains("Terminated"));
    assert!(s.r.terminations().is_empty());
    assert!(!s.r.persisted().contains("ws"));
    // Never mentioned again.
    assert_eq!(s.cycle().await.unwrap(), EMPTY_PARTIAL);
    assert!(!s.cluster.has_namespace("ns"));
}

#[tokio::test]
async fn a_terminated_workspace_without_namespace_is_terminated_at_once() {
    let mut s = setup();
    s.rails.answer_infos(&[rails_info(
        "gone",
        "gone-ns",
        "Terminated",
        "Running",
        Some("1"),
        "",
    )]);
    s.cycle().await.unwrap();
    assert!(s.cluster.deleted.lock().unwrap().is_empty());
    assert_eq!(
        s.r.terminations().get("gone", "gone-ns"),
        Some(TerminationProgress::Terminated)
    );
    s.rails.answer_infos(&[rails_info(
        "gone",
        "gone-ns",
        "Terminated",
        "Terminated",
        Some("1"),
        "",
    )]);
    assert_eq!(
        s.cycle().await.unwrap(),
        r#"{"update_type":"partial","workspace_agent_infos":[{"name":"gone","namespace":"gone-ns","termination_progress":"Terminated"}]}"#
    );
    assert!(s.r.terminations().is_empty());
    assert_eq!(s.cycle().await.unwrap(), EMPTY_PARTIAL);
}

#[tokio::test]
async fn applier_errors_are_reported_once() {
    let mut s = setup();
    s.cluster
        .fail_next_apply(&["no owning inventory found", "second"]);
    s.rails.answer_infos(&[rails_info(
        "ws",
        "ns",
        "Running",
        "CreationRequested",
        None,
        "x",
    )]);
    s.cycle().await.unwrap();
    let key = WorkspaceKey::new("ws", "ns");
    assert_eq!(
        s.r.errors().get(&key).unwrap().error.as_deref(),
        Some("no owning inventory found\nsecond")
    );
    assert_eq!(s.metrics.apply_errors.get(), 1);

    // Reported; GitLab answers that cycle with the workspace: the error is dropped.
    s.rails
        .answer_infos(&[rails_info("ws", "ns", "Running", "Error", None, "")]);
    assert_eq!(
        s.cycle().await.unwrap(),
        r#"{"update_type":"partial","workspace_agent_infos":[{"name":"ws","namespace":"ns","error_details":{"error_type":"applier","error_message":"no owning inventory found\nsecond"}}]}"#
    );
    assert_eq!(s.r.errors().get(&key), None);
    assert_eq!(s.cycle().await.unwrap(), EMPTY_PARTIAL);
}

#[tokio::test]
async fn an_error_gitlab_did_not_answer_for_is_reported_again() {
    let mut s = setup();
    s.cluster.fail_next_apply(&["boom"]);
    s.rails.answer_infos(&[rails_info(
        "ws",
        "ns",
        "Running",
        "CreationRequested",
        None,
        "x",
    )]);
    s.cycle().await.unwrap();
    // GitLab answers without the workspace, then fails: the error stays.
    let body = s.cycle().await.unwrap();
    assert!(body.contains(r#""error_message":"boom""#));
    s.rails.answer(500, "oops");
    assert!(s.cycle().await.is_err());
    let body = s.cycle().await.unwrap();
    assert!(body.contains(r#""error_message":"boom""#), "{body}");
}

#[tokio::test]
async fn a_newer_apply_replaces_the_reported_error_and_an_older_result_is_dropped() {
    let mut s = setup();
    let key = WorkspaceKey::new("ws", "ns");
    s.cluster.fail_next_apply(&["first"]);
    s.rails.answer_infos(&[rails_info(
        "ws",
        "ns",
        "Running",
        "CreationRequested",
        None,
        "a",
    )]);
    s.cycle().await.unwrap();
    let v1 = s.r.errors().get(&key).unwrap().version;

    // The error is reported; GitLab answers with a new config whose apply is slow.
    let gate = s.cluster.gate_next_apply();
    s.rails
        .answer_infos(&[rails_info("ws", "ns", "Running", "Error", None, "b")]);
    s.r.run().await.unwrap();
    let state = s.r.errors().get(&key).unwrap();
    assert!(state.version > v1);
    assert_eq!(
        state.error, None,
        "the reported error is gone, the new apply runs"
    );
    // While it runs there is nothing to report.
    s.r.run().await.unwrap();
    assert_eq!(s.rails.requests().last().unwrap().body, EMPTY_PARTIAL);
    // It fails: reported on the next cycle.
    gate.send(vec!["second".into()]).unwrap();
    s.r.errors().wait_idle().await;
    let body = s.cycle().await.unwrap();
    assert!(body.contains(r#""error_message":"second""#), "{body}");
}

#[tokio::test]
async fn namespace_errors_go_to_the_error_tracker() {
    let mut s = setup();
    *s.cluster.namespace_error.lock().unwrap() = Some("forbidden".into());
    s.rails.answer_infos(&[
        rails_info("a", "na", "Running", "CreationRequested", None, "x"),
        rails_info("b", "nb", "Terminated", "Running", None, ""),
    ]);
    s.cycle().await.unwrap();
    *s.cluster.namespace_error.lock().unwrap() = None;
    let body = s.cycle().await.unwrap();
    assert_eq!(
        body,
        r#"{"update_type":"partial","workspace_agent_infos":[{"name":"a","namespace":"na","error_details":{"error_type":"applier","error_message":"error when checking if namespace na exists: forbidden"}},{"name":"b","namespace":"nb","error_details":{"error_type":"applier","error_message":"error when handling terminated state for workspace b: failed to check if namespace exists: forbidden"}}]}"#
    );
    assert!(s.cluster.applied.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_failed_full_cycle_is_retried_as_full_and_changes_nothing() {
    let mut s = setup();
    s.rails.answer(500, r#"{"message":"oops"}"#);
    let e = s.cycle().await.unwrap_err();
    assert_eq!(e.to_string(), "unexpected status code: 500");
    s.rails.fail("kas is gone");
    let e = s.cycle().await.unwrap_err();
    assert_eq!(e.to_string(), "error making api request: kas is gone");
    s.rails.answer(201, "not json");
    let e = s.cycle().await.unwrap_err();
    assert!(
        e.to_string().starts_with("error parsing response body: "),
        "{e}"
    );
    assert_eq!(s.r.next_update_type(), UpdateType::Full);
    assert_eq!(s.cycle().await.unwrap(), EMPTY_FULL);
    assert_eq!(s.r.next_update_type(), UpdateType::Partial);
    assert_eq!(s.metrics.cycles("full", "error"), 3);
    assert_eq!(s.metrics.cycles("full", "ok"), 1);
}

#[tokio::test]
async fn settings_are_handed_back() {
    let mut s = setup();
    s.rails.answer(
        201,
        r#"{"workspace_rails_infos":[],"settings":{"full_reconciliation_interval_seconds":100,"partial_reconciliation_interval_seconds":40}}"#,
    );
    let report = s.r.run().await.unwrap();
    assert_eq!(
        report,
        CycleReport {
            update_type: UpdateType::Full,
            sent: 0,
            received: 0,
            settings: Some(Settings {
                full_reconciliation_interval_seconds: Some(100),
                partial_reconciliation_interval_seconds: Some(40),
            }),
        }
    );
}

#[tokio::test]
async fn applies_queue_behind_a_limit() {
    let mut s = setup();
    let n = MAX_CONCURRENT_APPLIES + 8;
    let gates: Vec<_> = (0..n).map(|_| s.cluster.gate_next_apply()).collect();
    let infos: Vec<_> = (0..n)
        .map(|i| {
            rails_info(
                &format!("ws{i}"),
                &format!("ns{i}"),
                "Running",
                "CreationRequested",
                None,
                "x",
            )
        })
        .collect();
    s.rails.answer_infos(&infos);
    s.r.run().await.unwrap();
    let mut started = s.cluster.started.subscribe();
    started
        .wait_for(|n| *n == MAX_CONCURRENT_APPLIES)
        .await
        .unwrap();
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(*started.borrow(), MAX_CONCURRENT_APPLIES, "the rest wait");
    let mut gates = gates.into_iter();
    gates.next().unwrap().send(vec![]).unwrap();
    started
        .wait_for(|n| *n == MAX_CONCURRENT_APPLIES + 1)
        .await
        .unwrap();
    for g in gates {
        let _ = g.send(vec![]);
    }
    s.r.errors().wait_idle().await;
    assert_eq!(s.cluster.applied.lock().unwrap().len(), n);
}
