//! A Deployment's rollout status, as kube-controller-manager computes it:
//! `calculateStatus` (`pkg/controller/deployment/sync.go`), `syncRolloutStatus`
//! (`progress.go`) and the condition helpers of `util/deployment_util.go`
//! (`SetDeploymentCondition`, `DeploymentComplete`, `DeploymentProgressing`,
//! `DeploymentTimedOut`, `MaxUnavailable`).

use serde_json::{Value, json};
use tokio::time::Instant;

/// `deployment.kubernetes.io/revision` of a ReplicaSet.
pub(super) fn revision(rs: &Value) -> Option<i64> {
    rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"]
        .as_str()?
        .parse()
        .ok()
}

/// The `pod-template-hash` of a template: FNV-32a of its JSON, spelled in the
/// alphabet Kubernetes uses for generated names (`controller.ComputeHash` and
/// `rand.SafeEncodeString`; the bytes hashed differ from Go's object dump).
pub(super) fn template_hash(template: &Value) -> String {
    /// JSON with every object's keys sorted, whatever order they were written in.
    fn canonical(v: &Value, out: &mut String) {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::from(k.as_str()).to_string());
                    out.push(':');
                    canonical(&m[k], out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    canonical(item, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut text = String::new();
    canonical(template, &mut text);
    let mut h: u32 = 0x811c_9dc5;
    for b in text.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    h.to_string()
        .bytes()
        .map(|b| ALPHABET[usize::from(b) % ALPHABET.len()] as char)
        .collect()
}

/// The condition of `type` in `conditions`.
pub(super) fn condition<'a>(conditions: &'a [Value], kind: &str) -> Option<&'a Value> {
    conditions.iter().find(|c| c["type"] == kind)
}

/// `SetDeploymentCondition`: unchanged when status and reason are; the
/// transition time kept when only the reason changes; the condition moved last.
pub(super) fn set_condition(
    conditions: &mut Vec<Value>,
    kind: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: &str,
) {
    let mut transition = now.to_owned();
    if let Some(c) = condition(conditions, kind) {
        if c["status"] == status && c["reason"] == reason {
            return;
        }
        if c["status"] == status {
            transition = c["lastTransitionTime"].as_str().unwrap_or(now).to_owned();
        }
    }
    conditions.retain(|c| c["type"] != kind);
    conditions.push(json!({
        "type": kind, "status": status, "lastUpdateTime": now,
        "lastTransitionTime": transition, "reason": reason, "message": message,
    }));
}

/// A computed Deployment status and when its progress deadline passes.
pub(super) struct Computed {
    /// The new `status`.
    pub(super) value: Value,
    /// When the progress deadline passes, while it is running.
    pub(super) deadline: Option<Instant>,
}

/// An `intstr` of `replicas`: a number, or a percentage rounded up or down.
fn int_or_percent(v: &Value, replicas: i64, default: &str, round_up: bool) -> i64 {
    let text = match v {
        Value::Number(n) => return n.as_i64().unwrap_or(0),
        Value::String(s) => s.as_str(),
        _ => default,
    };
    let Some(pct) = text.strip_suffix('%').and_then(|p| p.parse::<i64>().ok()) else {
        return text.parse().unwrap_or(0);
    };
    let scaled = pct * replicas;
    if round_up {
        (scaled + 99) / 100
    } else {
        scaled / 100
    }
}

/// `MaxUnavailable` of `deployment_util.go` (with `ResolveFenceposts`).
fn max_unavailable(d: &Value, replicas: i64) -> i64 {
    let strategy = &d["spec"]["strategy"];
    if strategy["type"] == "Recreate" || replicas == 0 {
        return 0;
    }
    let ru = &strategy["rollingUpdate"];
    let surge = int_or_percent(&ru["maxSurge"], replicas, "25%", true);
    let mut unavailable = int_or_percent(&ru["maxUnavailable"], replicas, "25%", false);
    if surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    unavailable.min(replicas)
}

/// `calculateStatus` and `syncRolloutStatus`.
pub(super) fn deployment_status(
    d: &Value,
    all_rs: &[Value],
    new_rs: &str,
    mut conditions: Vec<Value>,
    now: &str,
    factor: f64,
) -> Computed {
    let sum = |f: &str| {
        all_rs
            .iter()
            .map(|rs| rs["status"][f].as_i64().unwrap_or(0))
            .sum::<i64>()
    };
    let replicas_spec = d["spec"]["replicas"].as_i64().unwrap_or(1);
    let total = sum("replicas");
    let updated = all_rs
        .iter()
        .find(|rs| rs["metadata"]["name"] == new_rs)
        .and_then(|rs| rs["status"]["replicas"].as_i64())
        .unwrap_or(0);
    let ready = sum("readyReplicas");
    let available = sum("availableReplicas");
    let desired_total: i64 = all_rs
        .iter()
        .map(|rs| rs["spec"]["replicas"].as_i64().unwrap_or(0))
        .sum();
    let unavailable = (desired_total - available).max(0);
    let generation = d["metadata"]["generation"].as_i64().unwrap_or(1);
    let old = &d["status"];
    let old_n = |f: &str| old[f].as_i64().unwrap_or(0);
    if available >= replicas_spec - max_unavailable(d, replicas_spec) {
        set_condition(
            &mut conditions,
            "Available",
            "True",
            "MinimumReplicasAvailable",
            "Deployment has minimum availability.",
            now,
        );
    } else {
        set_condition(
            &mut conditions,
            "Available",
            "False",
            "MinimumReplicasUnavailable",
            "Deployment does not have minimum availability.",
            now,
        );
    }
    let progressing = condition(&conditions, "Progressing").cloned();
    let reason = progressing
        .as_ref()
        .map(|c| c["reason"].clone())
        .unwrap_or(Value::Null);
    let complete_already = total == updated && reason == "NewReplicaSetAvailable";
    let mut deadline = None;
    if !complete_already {
        let complete =
            updated == replicas_spec && total == replicas_spec && available == replicas_spec;
        let progress = updated > old_n("updatedReplicas")
            || (total - updated) < (old_n("replicas") - old_n("updatedReplicas"))
            || ready > old_n("readyReplicas")
            || available > old_n("availableReplicas");
        if complete {
            set_condition(
                &mut conditions,
                "Progressing",
                "True",
                "NewReplicaSetAvailable",
                &format!("ReplicaSet {new_rs:?} has successfully progressed."),
                now,
            );
        } else if progress {
            let transition = progressing
                .as_ref()
                .filter(|c| c["status"] == "True")
                .and_then(|c| c["lastTransitionTime"].as_str())
                .unwrap_or(now)
                .to_owned();
            conditions.retain(|c| c["type"] != "Progressing");
            conditions.push(json!({
                "type": "Progressing", "status": "True", "lastUpdateTime": now,
                "lastTransitionTime": transition, "reason": "ReplicaSetUpdated",
                "message": format!("ReplicaSet {new_rs:?} is progressing."),
            }));
        } else if reason != "ProgressDeadlineExceeded" {
            let seconds = d["spec"]["progressDeadlineSeconds"]
                .as_f64()
                .unwrap_or(600.0);
            let limit = std::time::Duration::from_secs_f64((seconds * factor).max(0.0));
            let since = progressing
                .as_ref()
                .and_then(|c| c["lastUpdateTime"].as_str())
                .and_then(|t| humantime_serde::re::humantime::parse_rfc3339_weak(t).ok());
            if let Some(since) = since {
                let left = (since + limit).duration_since(std::time::SystemTime::now());
                match left {
                    Err(_) => set_condition(
                        &mut conditions,
                        "Progressing",
                        "False",
                        "ProgressDeadlineExceeded",
                        &format!("ReplicaSet {new_rs:?} has timed out progressing."),
                        now,
                    ),
                    Ok(left) => {
                        deadline =
                            Some(Instant::now() + left + std::time::Duration::from_millis(20))
                    }
                }
            }
        }
    }
    let mut status = json!({"observedGeneration": generation});
    for (f, n) in [
        ("replicas", total),
        ("updatedReplicas", updated),
        ("readyReplicas", ready),
        ("availableReplicas", available),
        ("unavailableReplicas", unavailable),
    ] {
        if n != 0 {
            status[f] = json!(n);
        }
    }
    status["conditions"] = json!(conditions);
    Computed {
        value: status,
        deadline,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_hash_ignores_key_order_and_follows_content() {
        let a = json!({"metadata": {"labels": {"app": "x", "tier": "y"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
        let b = json!({"spec": {"containers": [{"image": "i", "name": "c"}]}, "metadata": {"labels": {"tier": "y", "app": "x"}}});
        assert_eq!(template_hash(&a), template_hash(&b));
        let mut c = a.clone();
        c["spec"]["containers"][0]["image"] = json!("j");
        assert_ne!(template_hash(&a), template_hash(&c));
        assert!(
            template_hash(&a)
                .chars()
                .all(|ch| "bcdfghjklmnpqrstvwxz2456789".contains(ch))
        );
    }

    #[test]
    fn max_unavailable_rounds_as_the_controller_does() {
        let d = |strategy: Value| json!({"spec": {"strategy": strategy}});
        assert_eq!(max_unavailable(&d(json!({})), 1), 0);
        assert_eq!(max_unavailable(&d(json!({})), 4), 1);
        assert_eq!(max_unavailable(&d(json!({"type": "Recreate"})), 4), 0);
        assert_eq!(
            max_unavailable(
                &d(json!({"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 0}})),
                3
            ),
            1
        );
        assert_eq!(
            max_unavailable(&d(json!({"rollingUpdate": {"maxUnavailable": "50%"}})), 3),
            1
        );
    }
}
