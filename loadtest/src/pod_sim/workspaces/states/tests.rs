//! Tests of the actual state computed from an agent's workspace info (§6.2).

use super::*;
use serde_json::json;

/// A Deployment with `replicas`, the two condition reasons (`None`: no such
/// condition) and extra `status` fields.
fn deployment(
    replicas: Value,
    progressing: Option<&str>,
    available: Option<&str>,
    status: Value,
) -> Value {
    let mut conditions = Vec::new();
    if let Some(r) = progressing {
        conditions.push(json!({"type": "Progressing", "status": "True", "reason": r}));
    }
    if let Some(r) = available {
        conditions.push(json!({"type": "Available", "status": "True", "reason": r}));
    }
    let mut s = status;
    s["conditions"] = Value::Array(conditions);
    json!({
        "metadata": {"name": "workspace-1-1-abcdef", "resourceVersion": "7"},
        "spec": {"replicas": replicas},
        "status": s,
    })
}

fn info(deployment: Value) -> Value {
    json!({"name": "workspace-1-1-abcdef", "namespace": "gl-rd-ns-1-1-abcdef",
           "latest_k8s_deployment_info": deployment})
}

const P_AVAILABLE: Option<&str> = Some("NewReplicaSetAvailable");
const A_MIN: Option<&str> = Some("MinimumReplicasAvailable");
const A_UNMIN: Option<&str> = Some("MinimumReplicasUnavailable");

/// Every rule of §6.2, in order, plus the precedence cases.
#[test]
fn every_rule_in_order() {
    use ActualState::*;
    let running = deployment(
        json!(1),
        P_AVAILABLE,
        A_MIN,
        json!({"availableReplicas": 1}),
    );
    let err = json!({"error_type": "applier", "error_message": "boom"});
    let cases: Vec<(&str, Value, ActualState)> = vec![
        // 1. Terminated, even with an error and a running Deployment.
        (
            "terminated",
            json!({"name": "w", "termination_progress": "Terminated"}),
            Terminated,
        ),
        (
            "terminated beats error",
            json!({"name": "w", "termination_progress": "Terminated", "error_details": err}),
            Terminated,
        ),
        (
            "terminated beats a running deployment",
            json!({"name": "w", "termination_progress": "Terminated",
                   "latest_k8s_deployment_info": running}),
            Terminated,
        ),
        // 2. Error, even while terminating or running.
        ("error", json!({"name": "w", "error_details": err}), Error),
        (
            "error beats terminating",
            json!({"name": "w", "termination_progress": "Terminating", "error_details": err}),
            Error,
        ),
        (
            "error beats a running deployment",
            json!({"name": "w", "error_details": err, "latest_k8s_deployment_info": running}),
            Error,
        ),
        (
            "null error_details is no error",
            json!({"name": "w", "error_details": null, "latest_k8s_deployment_info": running}),
            Running,
        ),
        // 3. Terminating, whatever the Deployment says.
        (
            "terminating",
            json!({"name": "w", "termination_progress": "Terminating"}),
            Terminating,
        ),
        (
            "terminating beats a running deployment",
            json!({"name": "w", "termination_progress": "Terminating",
                   "latest_k8s_deployment_info": running}),
            Terminating,
        ),
        // 4. Unknown: nothing to look at.
        ("no deployment", json!({"name": "w"}), Unknown),
        ("null deployment", info(Value::Null), Unknown),
        (
            "no spec",
            info(json!({"status": {"conditions": []}})),
            Unknown,
        ),
        ("no status", info(json!({"spec": {"replicas": 1}})), Unknown),
        (
            "no conditions",
            info(json!({"spec": {"replicas": 1}, "status": {}})),
            Unknown,
        ),
        (
            "no progressing condition",
            info(deployment(json!(1), None, A_MIN, json!({}))),
            Unknown,
        ),
        (
            "progressing without reason",
            info(json!({"spec": {"replicas": 1},
                        "status": {"conditions": [{"type": "Progressing", "status": "True"}]}})),
            Unknown,
        ),
        (
            "no replicas",
            info(json!({"spec": {},
                        "status": {"conditions": [{"type": "Progressing", "reason": "NewReplicaSetAvailable"}]}})),
            Unknown,
        ),
        // 5. Failed, before anything about replicas.
        (
            "progress deadline exceeded",
            info(deployment(
                json!(1),
                Some("ProgressDeadlineExceeded"),
                None,
                json!({}),
            )),
            Failed,
        ),
        (
            "progress deadline exceeded at 0 replicas",
            info(deployment(
                json!(0),
                Some("ProgressDeadlineExceeded"),
                A_MIN,
                json!({}),
            )),
            Failed,
        ),
        // 6. Rolling out: the replicas decide, without an Available condition.
        (
            "replica set created, 0",
            info(deployment(
                json!(0),
                Some("NewReplicaSetCreated"),
                None,
                json!({}),
            )),
            Stopping,
        ),
        (
            "replica set created, 1",
            info(deployment(
                json!(1),
                Some("NewReplicaSetCreated"),
                None,
                json!({}),
            )),
            Starting,
        ),
        (
            "found new replica set, 0",
            info(deployment(
                json!(0),
                Some("FoundNewReplicaSet"),
                None,
                json!({}),
            )),
            Stopping,
        ),
        (
            "found new replica set, 1",
            info(deployment(
                json!(1),
                Some("FoundNewReplicaSet"),
                None,
                json!({}),
            )),
            Starting,
        ),
        (
            "replica set updated, 0",
            info(deployment(
                json!(0),
                Some("ReplicaSetUpdated"),
                None,
                json!({}),
            )),
            Stopping,
        ),
        (
            "replica set updated, 1",
            info(deployment(
                json!(1),
                Some("ReplicaSetUpdated"),
                None,
                json!({}),
            )),
            Starting,
        ),
        // 7. Other replica counts go on, and need an Available reason.
        (
            "replica set updated, 2, no available",
            info(deployment(
                json!(2),
                Some("ReplicaSetUpdated"),
                None,
                json!({}),
            )),
            Unknown,
        ),
        (
            "replica set updated, 2, available",
            info(deployment(
                json!(2),
                Some("ReplicaSetUpdated"),
                A_MIN,
                json!({"availableReplicas": 2}),
            )),
            Unknown,
        ),
        (
            "complete without available condition",
            info(deployment(
                json!(1),
                P_AVAILABLE,
                None,
                json!({"availableReplicas": 1}),
            )),
            Unknown,
        ),
        (
            "available without reason",
            info(
                json!({"spec": {"replicas": 1}, "status": {"availableReplicas": 1, "conditions": [
                {"type": "Progressing", "reason": "NewReplicaSetAvailable"},
                {"type": "Available", "status": "True"}]}}),
            ),
            Unknown,
        ),
        // 8. Complete.
        (
            "stopped",
            info(deployment(json!(0), P_AVAILABLE, A_MIN, json!({}))),
            Stopped,
        ),
        (
            "stopped, explicit 0",
            info(deployment(
                json!(0),
                P_AVAILABLE,
                A_MIN,
                json!({"availableReplicas": 0}),
            )),
            Stopped,
        ),
        ("running", info(running.clone()), Running),
        (
            "running, 1.0",
            info(deployment(
                json!(1),
                P_AVAILABLE,
                A_MIN,
                json!({"availableReplicas": 1.0}),
            )),
            Running,
        ),
        (
            "running needs no unavailable replicas",
            info(deployment(
                json!(1),
                P_AVAILABLE,
                A_MIN,
                json!({"availableReplicas": 1, "unavailableReplicas": 1}),
            )),
            Unknown,
        ),
        (
            "running with 2 replicas",
            info(deployment(
                json!(2),
                P_AVAILABLE,
                A_MIN,
                json!({"availableReplicas": 2}),
            )),
            Running,
        ),
        (
            "stopping",
            info(deployment(
                json!(0),
                P_AVAILABLE,
                A_MIN,
                json!({"availableReplicas": 1}),
            )),
            Stopping,
        ),
        (
            "starting, minimum available",
            info(deployment(json!(1), P_AVAILABLE, A_MIN, json!({}))),
            Starting,
        ),
        (
            "starting, minimum unavailable",
            info(deployment(
                json!(1),
                P_AVAILABLE,
                A_UNMIN,
                json!({"unavailableReplicas": 1}),
            )),
            Starting,
        ),
        // 9. Anything else.
        (
            "minimum unavailable at 0 replicas",
            info(deployment(json!(0), P_AVAILABLE, A_UNMIN, json!({}))),
            Unknown,
        ),
        (
            "unknown progressing reason",
            info(deployment(
                json!(1),
                Some("Whatever"),
                A_MIN,
                json!({"availableReplicas": 1}),
            )),
            Unknown,
        ),
        (
            "unknown available reason",
            info(deployment(
                json!(1),
                P_AVAILABLE,
                Some("Whatever"),
                json!({"availableReplicas": 1}),
            )),
            Unknown,
        ),
        (
            "null availableReplicas is not 0",
            info(deployment(
                json!(0),
                P_AVAILABLE,
                A_MIN,
                json!({"availableReplicas": null}),
            )),
            Unknown,
        ),
        (
            "an unknown termination progress is ignored",
            json!({"name": "w", "termination_progress": "Gone", "latest_k8s_deployment_info": running}),
            Running,
        ),
    ];
    let mut failures = Vec::new();
    for (name, info, want) in &cases {
        let got = actual_state(info);
        if got != *want {
            failures.push(format!("{name}: got {got:?}, want {want:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Every actual state the calculator can produce appears in the table.
    for state in [
        Terminated,
        Error,
        Terminating,
        Unknown,
        Failed,
        Stopping,
        Starting,
        Stopped,
        Running,
    ] {
        assert!(
            cases.iter().any(|(_, _, w)| *w == state),
            "{state:?} not covered"
        );
    }
}

/// The first matching Progressing and Available conditions count
/// (`conditions.detect`), not later ones.
#[test]
fn the_first_condition_of_a_type_counts() {
    let d = json!({"spec": {"replicas": 1}, "status": {"availableReplicas": 1, "conditions": [
        {"type": "Progressing", "reason": "NewReplicaSetAvailable"},
        {"type": "Available", "reason": "MinimumReplicasAvailable"},
        {"type": "Progressing", "reason": "ProgressDeadlineExceeded"},
    ]}});
    assert_eq!(actual_state(&info(d)), ActualState::Running);
}
