//! Tests of one reconcile request: the response, the states it records and the config it sends.

use super::*;
use crate::pod_sim::workspaces::model::WorkspaceSpec;
use crate::pod_sim::workspaces::store::{Clock, NewWorkspace};
use serde_json::json;
use std::time::Duration;

fn setup() -> (WorkspaceStore, Workspace) {
    let store = WorkspaceStore::new(Clock::manual(1_700_000_000_000_000));
    store.put_agent_config(WorkspacesAgentConfig {
        agent_id: 1,
        enabled: true,
        dns_zone: "ws.example.dev".into(),
        ..Default::default()
    });
    let ws = store
        .create(
            NewWorkspace {
                agent_id: 1,
                user_id: 1,
                spec: WorkspaceSpec::default(),
            },
            "project-1",
        )
        .unwrap();
    (store, ws)
}

fn run(store: &WorkspaceStore, body: Value) -> ReconcileResponse {
    reconcile(store, 1, &body, ReconcileSettings::default())
        .unwrap()
        .response
}

fn deployment(name: &str, version: &str, replicas: u32, available: u32) -> Value {
    json!({"name": name, "namespace": "ns", "latest_k8s_deployment_info": {
        "metadata": {"name": name, "resourceVersion": version},
        "spec": {"replicas": replicas},
        "status": {"availableReplicas": available, "conditions": [
            {"type": "Progressing", "reason": "NewReplicaSetAvailable"},
            {"type": "Available", "reason": "MinimumReplicasAvailable"}]}}})
}

fn partial(infos: Value) -> Value {
    json!({"update_type": "partial", "workspace_agent_infos": infos})
}

fn kinds(config: &str) -> Vec<String> {
    config
        .lines()
        .filter_map(|l| l.strip_prefix("kind: "))
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_new_workspace_goes_out_once_with_everything() {
    let (store, ws) = setup();
    let r = run(&store, partial(json!([])));
    assert_eq!(r.workspace_rails_infos.len(), 1);
    let info = &r.workspace_rails_infos[0];
    assert_eq!(
        (info.name.as_str(), info.desired_state, info.actual_state),
        (ws.name.as_str(), "Running", "CreationRequested")
    );
    assert_eq!(info.deployment_resource_version, None);
    assert!(kinds(&info.config_to_apply).contains(&"Secret".to_owned()));
    assert!(info.config_to_apply.contains("replicas: 1"));
    assert_eq!(r.settings, ReconcileSettings::default());
    // Nothing changed: an idle partial returns nothing.
    assert!(
        run(&store, partial(json!([])))
            .workspace_rails_infos
            .is_empty()
    );
    // A full returns it, with everything.
    let r = run(
        &store,
        json!({"update_type": "full", "workspace_agent_infos": []}),
    );
    assert_eq!(r.workspace_rails_infos.len(), 1);
    assert!(kinds(&r.workspace_rails_infos[0].config_to_apply).contains(&"Secret".to_owned()));
}

#[test]
fn reported_workspaces_come_back_with_their_version_and_state() {
    let (store, ws) = setup();
    run(&store, partial(json!([])));
    let r = run(
        &store,
        partial(json!([
            deployment(&ws.name, "41", 1, 1),
            deployment("orphan", "1", 1, 1)
        ])),
    );
    assert_eq!(r.workspace_rails_infos.len(), 1);
    let info = &r.workspace_rails_infos[0];
    assert_eq!(info.actual_state, "Running");
    assert_eq!(info.deployment_resource_version.as_deref(), Some("41"));
    // The actual state changed since the last response: everything is sent.
    assert!(kinds(&info.config_to_apply).contains(&"Secret".to_owned()));
    // Reported again unchanged: returned (named in the request) without config.
    let r = run(&store, partial(json!([deployment(&ws.name, "41", 1, 1)])));
    assert_eq!(r.workspace_rails_infos[0].config_to_apply, "");
    // Without a deployment the version is kept.
    let r = run(
        &store,
        partial(json!([{"name": ws.name, "namespace": ws.namespace}])),
    );
    assert_eq!(
        r.workspace_rails_infos[0]
            .deployment_resource_version
            .as_deref(),
        Some("41")
    );
    assert_eq!(r.workspace_rails_infos[0].actual_state, "Unknown");
}

#[test]
fn stop_sends_a_partial_config_without_secrets() {
    let (store, ws) = setup();
    run(&store, partial(json!([deployment(&ws.name, "2", 1, 1)])));
    store
        .set_desired_state(ws.id, DesiredState::Stopped)
        .unwrap();
    let r = run(&store, partial(json!([])));
    let info = &r.workspace_rails_infos[0];
    assert_eq!(info.desired_state, "Stopped");
    let k = kinds(&info.config_to_apply);
    assert!(
        k.contains(&"Deployment".to_owned()) && !k.contains(&"Secret".to_owned()),
        "{k:?}"
    );
    assert!(!info.config_to_apply.contains("-secrets-inventory"));
    assert!(info.config_to_apply.contains("replicas: 0"));
}

#[test]
fn restart_requested_runs_again_once_stopped() {
    let (store, ws) = setup();
    run(&store, partial(json!([deployment(&ws.name, "2", 1, 1)])));
    store
        .set_desired_state(ws.id, DesiredState::RestartRequested)
        .unwrap();
    let r = run(&store, partial(json!([])));
    assert!(
        r.workspace_rails_infos[0]
            .config_to_apply
            .contains("replicas: 0")
    );
    // Still stopping: stays RestartRequested.
    let r = run(&store, partial(json!([deployment(&ws.name, "3", 0, 1)])));
    assert_eq!(r.workspace_rails_infos[0].desired_state, "RestartRequested");
    assert_eq!(r.workspace_rails_infos[0].actual_state, "Stopping");
    // Stopped: Running, and this very response carries replicas 1.
    let r = run(&store, partial(json!([deployment(&ws.name, "4", 0, 0)])));
    let info = &r.workspace_rails_infos[0];
    assert_eq!(
        (info.desired_state, info.actual_state),
        ("Running", "Stopped")
    );
    assert!(info.config_to_apply.contains("replicas: 1"));
}

#[test]
fn terminated_workspaces_get_inventories_until_confirmed() {
    let (store, ws) = setup();
    run(&store, partial(json!([deployment(&ws.name, "2", 1, 1)])));
    store
        .set_desired_state(ws.id, DesiredState::Terminated)
        .unwrap();
    for _ in 0..2 {
        let r = run(&store, partial(json!([])));
        let info = &r.workspace_rails_infos[0];
        assert_eq!(info.desired_state, "Terminated");
        assert_eq!(kinds(&info.config_to_apply), vec!["ConfigMap", "ConfigMap"]);
    }
    let r = run(
        &store,
        partial(
            json!([{"name": ws.name, "namespace": ws.namespace, "termination_progress": "Terminating"}]),
        ),
    );
    assert_eq!(r.workspace_rails_infos[0].actual_state, "Terminating");
    let r = run(
        &store,
        partial(
            json!([{"name": ws.name, "namespace": ws.namespace, "termination_progress": "Terminated"}]),
        ),
    );
    assert_eq!(r.workspace_rails_infos[0].actual_state, "Terminated");
    // Confirmed: never mentioned again, full or partial.
    assert!(
        run(&store, partial(json!([])))
            .workspace_rails_infos
            .is_empty()
    );
    assert!(
        run(
            &store,
            json!({"update_type": "full", "workspace_agent_infos": []})
        )
        .workspace_rails_infos
        .is_empty()
    );
}

#[test]
fn lifecycle_rules_with_a_moved_clock() {
    // Older than max_hours_before_termination (24 h): terminated.
    let (store, ws) = setup();
    run(&store, partial(json!([deployment(&ws.name, "2", 1, 1)])));
    store.clock().advance(Duration::from_secs(24 * 3600 + 1));
    // Unreported workspaces are not touched by the rules.
    assert!(
        run(&store, partial(json!([])))
            .workspace_rails_infos
            .is_empty()
    );
    let r = run(&store, partial(json!([deployment(&ws.name, "2", 1, 1)])));
    assert_eq!(r.workspace_rails_infos[0].desired_state, "Terminated");

    // A long-lived workspace: active for 36 h → stopped; stopped for more than
    // 744 h → terminated.
    let (store, _) = setup();
    let spec = WorkspaceSpec {
        max_hours_before_termination: 10_000,
        ..Default::default()
    };
    let ws = store
        .create(
            NewWorkspace {
                agent_id: 1,
                user_id: 2,
                spec,
            },
            "p",
        )
        .unwrap();
    let find = |r: ReconcileResponse| {
        r.workspace_rails_infos
            .into_iter()
            .find(|i| i.name == ws.name)
            .unwrap()
    };
    store.clock().advance(Duration::from_secs(36 * 3600));
    let r = run(&store, partial(json!([deployment(&ws.name, "2", 1, 1)])));
    assert_eq!(find(r).desired_state, "Running");
    store.clock().advance(Duration::from_secs(1));
    let r = run(&store, partial(json!([deployment(&ws.name, "2", 1, 1)])));
    let info = find(r);
    assert_eq!(info.desired_state, "Stopped");
    assert!(info.config_to_apply.contains("replicas: 0"));
    store.clock().advance(Duration::from_secs(744 * 3600));
    let r = run(&store, partial(json!([deployment(&ws.name, "3", 0, 0)])));
    assert_eq!(find(r).desired_state, "Stopped");
    store.clock().advance(Duration::from_secs(1));
    let r = run(&store, partial(json!([deployment(&ws.name, "3", 0, 0)])));
    assert_eq!(find(r).desired_state, "Terminated");
}

#[test]
fn bad_params_and_bad_infos() {
    let (store, _) = setup();
    let e = reconcile(
        &store,
        1,
        &json!({"update_type": "sometimes", "workspace_agent_infos": []}),
        ReconcileSettings::default(),
    )
    .unwrap_err();
    assert!(
        matches!(e, ReconcileError::BadRequest(m) if m.starts_with("Workspace reconcile params validation failed"))
    );
    let e = reconcile(
        &store,
        1,
        &partial(json!([{"name": "x"}])),
        ReconcileSettings::default(),
    )
    .unwrap_err();
    assert!(matches!(e, ReconcileError::Internal(_)));
}

#[test]
fn response_fields_in_rails_order() {
    let (store, _) = setup();
    let r = run(&store, partial(json!([])));
    let text = serde_json::to_string(&r).unwrap();
    let order = [
        "\"name\"",
        "\"namespace\"",
        "\"desired_state\"",
        "\"actual_state\"",
        "\"deployment_resource_version\":null",
        "\"config_to_apply\"",
        "\"image_pull_secrets\":[]",
        "\"settings\":{\"full_reconciliation_interval_seconds\":3600,\"partial_reconciliation_interval_seconds\":10}",
    ];
    let pos: Vec<usize> = order
        .iter()
        .map(|k| text.find(k).unwrap_or_else(|| panic!("{k} in {text}")))
        .collect();
    assert!(pos.windows(2).all(|w| w[0] < w[1]), "{text}");
}
