//! The actual state of a workspace, computed from what agentk reports about it, as
//! Rails' `ActualStateCalculator` computes it
//! (`ee/lib/remote_development/workspaces/reconcile/input/actual_state_calculator.rb`,
//! read in the `ashierj/superdemo` GitLab mirror,
//! <https://github.com/ashierj/superdemo>). agentk does not compute the state: it sends the whole Deployment
//! (`latest_k8s_deployment_info`), its termination progress and any applier error,
//! and GitLab decides.
//!
//! The rules, top to bottom, first match wins ("P" is the `reason` of the
//! Deployment's `Progressing` condition, "A" that of its `Available` condition, R
//! `spec.replicas`, AR `status.availableReplicas` (0 when absent), UR
//! `status.unavailableReplicas` (0 when absent)):
//!
//! 1. `termination_progress` `Terminated` → `Terminated`, even with an error;
//! 2. `error_details` present → `Error` (so an error beats `Terminating`);
//! 3. `termination_progress` `Terminating` → `Terminating`;
//! 4. no Deployment, no `spec`, `status` or `status.conditions`, no Progressing
//!    condition, no P, or no R → `Unknown`;
//! 5. P `ProgressDeadlineExceeded` → `Failed`;
//! 6. P one of `NewReplicaSetCreated`, `FoundNewReplicaSet`, `ReplicaSetUpdated`:
//!    R 0 → `Stopping`, R 1 → `Starting`, else go on;
//! 7. no Available condition, or no A → `Unknown`;
//! 8. P `NewReplicaSetAvailable`: A `MinimumReplicasAvailable` with R 0 and AR 0 →
//!    `Stopped`; A `MinimumReplicasAvailable` with R = AR and UR 0 → `Running`;
//!    A `MinimumReplicasAvailable` with R 0 and AR 1 → `Stopping`; A
//!    `MinimumReplicasAvailable` or `MinimumReplicasUnavailable` with R 1 and AR 0
//!    → `Starting`;
//! 9. anything else → `Unknown`.
//!
//! Values are compared as Ruby compares the decoded JSON: a present `null` is
//! "present" for `fetch` (so `"availableReplicas": null` is not 0) but absent for
//! `[]`; `false` and `null` are falsy; numbers compare by value (`1 == 1.0`).

use serde_json::Value;

use super::model::ActualState;

/// `termination_progress` when the agent has started deleting the workspace.
pub const TERMINATING: &str = "Terminating";
/// `termination_progress` when the workspace's Deployment is gone.
pub const TERMINATED: &str = "Terminated";

const PROGRESSING: &str = "Progressing";
const AVAILABLE: &str = "Available";
const NEW_REPLICA_SET_CREATED: &str = "NewReplicaSetCreated";
const FOUND_NEW_REPLICA_SET: &str = "FoundNewReplicaSet";
const REPLICA_SET_UPDATED: &str = "ReplicaSetUpdated";
const NEW_REPLICA_SET_AVAILABLE: &str = "NewReplicaSetAvailable";
const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";
const MINIMUM_REPLICAS_AVAILABLE: &str = "MinimumReplicasAvailable";
const MINIMUM_REPLICAS_UNAVAILABLE: &str = "MinimumReplicasUnavailable";

/// Ruby truthiness of a decoded JSON value: only `nil` (absent or `null`) and
/// `false` are falsy.
fn truthy(v: Option<&Value>) -> bool {
    !matches!(v, None | Some(Value::Null) | Some(Value::Bool(false)))
}

/// `hash[key]` as Ruby reads it: `None` for absent and for `null`, and for a
/// receiver that is not a Hash (Rails would raise there; this is `Unknown`).
fn get<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.as_object()?.get(key).filter(|v| !v.is_null())
}

/// Ruby's `==` between two decoded JSON values (`1 == 1.0`, `nil == nil`).
fn ruby_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => x == y,
            _ => x == y,
        },
        _ => a == b,
    }
}

/// `value == n` for an integer `n`.
fn is(v: &Value, n: i64) -> bool {
    ruby_eq(v, &Value::from(n))
}

/// `status.fetch(key, 0)`: the default only when the key is absent.
fn fetch_or_zero(status: &Value, key: &str) -> Value {
    status
        .as_object()
        .and_then(|o| o.get(key))
        .cloned()
        .unwrap_or(Value::from(0))
}

/// The `reason` of the first condition of `type` (`conditions.detect`): `None`
/// when there is no such condition, `Some(None)` when it has no reason.
fn condition_reason<'a>(conditions: &'a Value, kind: &str) -> Option<Option<&'a Value>> {
    let found = conditions
        .as_array()?
        .iter()
        .find(|c| get(c, "type").and_then(Value::as_str) == Some(kind))?;
    Some(get(found, "reason"))
}

/// The actual state of the workspace `info` describes: one element of the reconcile
/// request's `workspace_agent_infos` (`termination_progress`, `error_details`,
/// `latest_k8s_deployment_info`), by every rule of the module docs, in order.
pub fn actual_state(info: &Value) -> ActualState {
    let termination = get(info, "termination_progress").and_then(Value::as_str);
    // 1. Nothing more can be done for a workspace that is gone, error or not.
    if termination == Some(TERMINATED) {
        return ActualState::Terminated;
    }
    // 2. Any error beats Terminating.
    if truthy(info.as_object().and_then(|o| o.get("error_details"))) {
        return ActualState::Error;
    }
    // 3.
    if termination == Some(TERMINATING) {
        return ActualState::Terminating;
    }
    deployment_state(
        info.as_object()
            .and_then(|o| o.get("latest_k8s_deployment_info")),
    )
}

/// Rules 4–9: the state a Deployment object shows.
fn deployment_state(deployment: Option<&Value>) -> ActualState {
    use ActualState::*;
    // 4.
    if !truthy(deployment) {
        return Unknown;
    }
    let deployment = deployment.expect("truthy is present");
    let (Some(spec), Some(status)) = (get(deployment, "spec"), get(deployment, "status")) else {
        return Unknown;
    };
    let Some(conditions) = get(status, "conditions") else {
        return Unknown;
    };
    let Some(Some(progressing)) = condition_reason(conditions, PROGRESSING) else {
        return Unknown;
    };
    let Some(replicas) = get(spec, "replicas") else {
        return Unknown;
    };
    let progressing = progressing.as_str();
    // 5.
    if progressing == Some(PROGRESS_DEADLINE_EXCEEDED) {
        return Failed;
    }
    // 6.
    if matches!(
        progressing,
        Some(NEW_REPLICA_SET_CREATED | FOUND_NEW_REPLICA_SET | REPLICA_SET_UPDATED)
    ) {
        if is(replicas, 0) {
            return Stopping;
        }
        if is(replicas, 1) {
            return Starting;
        }
    }
    let available_replicas = fetch_or_zero(status, "availableReplicas");
    let unavailable_replicas = fetch_or_zero(status, "unavailableReplicas");
    // 7.
    let Some(Some(available)) = condition_reason(conditions, AVAILABLE) else {
        return Unknown;
    };
    let available = available.as_str();
    // 8.
    if progressing == Some(NEW_REPLICA_SET_AVAILABLE) {
        let minimum_available = available == Some(MINIMUM_REPLICAS_AVAILABLE);
        if minimum_available && is(replicas, 0) && is(&available_replicas, 0) {
            return Stopped;
        }
        if minimum_available
            && ruby_eq(replicas, &available_replicas)
            && is(&unavailable_replicas, 0)
        {
            return Running;
        }
        if minimum_available && is(replicas, 0) && is(&available_replicas, 1) {
            return Stopping;
        }
        if matches!(
            available,
            Some(MINIMUM_REPLICAS_AVAILABLE | MINIMUM_REPLICAS_UNAVAILABLE)
        ) && is(replicas, 1)
            && is(&available_replicas, 0)
        {
            return Starting;
        }
    }
    // 9.
    Unknown
}

#[cfg(test)]
mod tests;
