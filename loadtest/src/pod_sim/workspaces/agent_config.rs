//! An agent's workspaces configuration from the `remote_development` keys of its
//! `config.yaml`, as Rails' `AgentConfigOperations::Updater` makes the
//! `workspaces_agent_configs` row of it
//! (`ee/lib/remote_development/agent_config_operations/updater.rb`, the
//! `pavankalisetti009/gitlab` mirror) when kas posts the agent's configuration to
//! `POST /api/v4/internal/kubernetes/agent_configuration`:
//!
//! - no `remote_development` key: nothing is stored (the update is skipped);
//! - `enabled` is true only for `true` or `"true"`;
//! - `gitlab_workspaces_proxy.namespace` becomes `gitlab_workspaces_proxy_namespace`,
//!   `network_policy.enabled` (unless null) `network_policy_enabled`,
//!   `network_policy.egress` `network_policy_egress`;
//! - every other setting (`labels`, `annotations`, `image_pull_secrets`,
//!   `max_resources_per_workspace`, quotas, …) is taken as written, with
//!   `ee/lib/remote_development/settings/default_settings.rb`'s default when
//!   absent; unknown keys (the deprecated `partial_sync_interval`, …) are ignored.
//!
//! Checks from `ee/app/models/remote_development/workspaces_agent_config.rb`: the DNS
//! zone is a hostname, quotas are integers ≥ -1, and `allow_privilege_escalation`
//! needs `use_kubernetes_user_namespaces`. A configuration that fails them is not
//! stored (Rails logs and still answers 204).

use serde_json::{Map, Value};
use thiserror::Error;

use super::model::{EgressRule, ImagePullSecret, WorkspacesAgentConfig};

/// A configuration Rails would not save.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("{}", .0.join(", "))]
pub struct AgentConfigError(pub Vec<String>);

/// Rails' `enabled` rule: `true` or `"true"`.
fn enabled(v: Option<&Value>) -> bool {
    matches!(v, Some(Value::Bool(true))) || v.and_then(Value::as_str) == Some("true")
}

/// A string column's value (scalars are stringified as Active Record casts them).
fn string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// An integer column's value (`"3"` and `3.0` are 3, as Active Record casts them).
fn integer(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n
            .as_i64()
            .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A boolean column's value (`"true"`, `"false"` too).
fn boolean(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::String(s) if s == "true" => Some(true),
        Value::String(s) if s == "false" => Some(false),
        _ => None,
    }
}

/// Whether `zone` is a hostname: dot-separated labels of letters, digits and inner
/// hyphens, each 1–63 characters.
fn is_hostname(zone: &str) -> bool {
    !zone.is_empty()
        && zone.len() <= 253
        && zone.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// ActiveModel's humanised attribute name (`dns_zone` → `Dns zone`).
fn human(field: &str) -> String {
    let s = field.replace('_', " ");
    let mut c = s.chars();
    match c.next() {
        Some(first) => first.to_uppercase().chain(c).collect(),
        None => s,
    }
}

/// The workspaces configuration of agent `agent_id` from its whole agent
/// configuration (`{"remote_development": {…}, …}`): `None` when it has no
/// `remote_development` key (Rails skips the update).
pub fn from_agent_config(
    agent_id: i64,
    config: &Value,
) -> Result<Option<WorkspacesAgentConfig>, AgentConfigError> {
    match config.get("remote_development") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(None),
        Some(rd) => from_remote_development(agent_id, rd).map(Some),
    }
}

/// The workspaces configuration of agent `agent_id` from its `remote_development`
/// keys.
pub fn from_remote_development(
    agent_id: i64,
    rd: &Value,
) -> Result<WorkspacesAgentConfig, AgentConfigError> {
    let empty = Map::new();
    let rd = rd.as_object().unwrap_or(&empty);
    let mut c = WorkspacesAgentConfig {
        agent_id,
        enabled: enabled(rd.get("enabled")),
        ..Default::default()
    };
    let mut errors = Vec::new();
    let mut invalid = |field: &str| errors.push(format!("{} is invalid", human(field)));
    let present = |key: &str| rd.get(key).filter(|v| !v.is_null());

    if let Some(v) = present("dns_zone") {
        match string(v) {
            Some(s) => c.dns_zone = s,
            None => invalid("dns_zone"),
        }
    }
    if let Some(ns) = present("gitlab_workspaces_proxy")
        .and_then(|p| p.get("namespace"))
        .filter(|v| !v.is_null())
    {
        match string(ns) {
            Some(s) => c.gitlab_workspaces_proxy_namespace = s,
            None => invalid("gitlab_workspaces_proxy_namespace"),
        }
    }
    if let Some(np) = present("network_policy") {
        if let Some(e) = np.get("enabled").filter(|v| !v.is_null()) {
            match boolean(e) {
                Some(b) => c.network_policy_enabled = b,
                None => invalid("network_policy_enabled"),
            }
        }
        if let Some(egress) = np.get("egress").filter(|v| !v.is_null()) {
            match serde_json::from_value::<Vec<EgressRule>>(egress.clone()) {
                Ok(rules) => c.network_policy_egress = rules,
                Err(_) => invalid("network_policy_egress"),
            }
        }
    }
    for (key, map) in [
        ("labels", &mut c.labels),
        ("annotations", &mut c.annotations),
    ] {
        if let Some(v) = present(key) {
            match v.as_object() {
                Some(o) => {
                    map.clear();
                    for (k, v) in o {
                        match string(v) {
                            Some(s) => {
                                map.insert(k.clone(), s);
                            }
                            None => invalid(key),
                        }
                    }
                }
                None => invalid(key),
            }
        }
    }
    for (key, slot) in [
        (
            "max_resources_per_workspace",
            &mut c.max_resources_per_workspace,
        ),
        (
            "default_resources_per_workspace_container",
            &mut c.default_resources_per_workspace_container,
        ),
    ] {
        if let Some(v) = present(key) {
            if v.is_object() {
                *slot = v.clone();
            } else {
                invalid(key);
            }
        }
    }
    if let Some(v) = present("image_pull_secrets") {
        match serde_json::from_value::<Vec<ImagePullSecret>>(v.clone()) {
            Ok(s) => c.image_pull_secrets = s,
            Err(_) => invalid("image_pull_secrets"),
        }
    }
    if let Some(v) = present("shared_namespace") {
        match string(v) {
            Some(s) => c.shared_namespace = s,
            None => invalid("shared_namespace"),
        }
    }
    for (key, slot) in [
        (
            "max_active_hours_before_stop",
            &mut c.max_active_hours_before_stop,
        ),
        (
            "max_stopped_hours_before_termination",
            &mut c.max_stopped_hours_before_termination,
        ),
    ] {
        if let Some(v) = present(key) {
            match integer(v)
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| *n > 0)
            {
                Some(n) => *slot = n,
                None => invalid(key),
            }
        }
    }
    for (key, slot) in [
        ("workspaces_quota", &mut c.workspaces_quota),
        (
            "workspaces_per_user_quota",
            &mut c.workspaces_per_user_quota,
        ),
    ] {
        if let Some(v) = present(key) {
            match integer(v) {
                Some(n) if n >= -1 => *slot = n,
                Some(_) => errors.push(format!(
                    "{} must be greater than or equal to -1",
                    human(key)
                )),
                None => errors.push(format!("{} is not a number", human(key))),
            }
        }
    }
    let mut invalid = |field: &str| errors.push(format!("{} is invalid", human(field)));
    for (key, slot) in [
        (
            "allow_privilege_escalation",
            &mut c.allow_privilege_escalation,
        ),
        (
            "use_kubernetes_user_namespaces",
            &mut c.use_kubernetes_user_namespaces,
        ),
    ] {
        if let Some(v) = present(key) {
            match boolean(v) {
                Some(b) => *slot = b,
                None => invalid(key),
            }
        }
    }
    if !is_hostname(&c.dns_zone) {
        errors.push("Dns zone must be a valid hostname".into());
    }
    if c.allow_privilege_escalation && !c.use_kubernetes_user_namespaces {
        errors.push(
            "Allow privilege escalation can be true only if either use_kubernetes_user_namespaces \
             is true or default_runtime_class is non-empty"
                .into(),
        );
    }
    if errors.is_empty() {
        Ok(c)
    } else {
        Err(AgentConfigError(errors))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_map_to_the_row_as_rails_maps_them() {
        let c = from_agent_config(
            4,
            &json!({"remote_development": {
                "enabled": "true",
                "dns_zone": "workspaces.example.dev",
                "gitlab_workspaces_proxy": {"namespace": "proxy"},
                "network_policy": {"enabled": false, "egress": [{"allow": "10.0.0.0/8"}]},
                "labels": {"team": "a"},
                "annotations": {"note": 1},
                "max_resources_per_workspace": {"limits": {"cpu": "2"}},
                "image_pull_secrets": [{"name": "regcred", "namespace": "default"}],
                "shared_namespace": "ws",
                "workspaces_quota": "5",
                "workspaces_per_user_quota": 2,
                "max_active_hours_before_stop": 1,
                "partial_sync_interval": "10s",
            }}),
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.agent_id, 4);
        assert!(c.enabled);
        assert_eq!(c.dns_zone, "workspaces.example.dev");
        assert_eq!(c.gitlab_workspaces_proxy_namespace, "proxy");
        assert!(!c.network_policy_enabled);
        assert_eq!(
            c.network_policy_egress,
            vec![EgressRule {
                allow: "10.0.0.0/8".into(),
                except: vec![]
            }]
        );
        assert_eq!(c.labels["team"], "a");
        assert_eq!(c.annotations["note"], "1");
        assert_eq!(
            c.max_resources_per_workspace,
            json!({"limits": {"cpu": "2"}})
        );
        assert_eq!(c.image_pull_secrets.len(), 1);
        assert_eq!(c.shared_namespace, "ws");
        assert_eq!((c.workspaces_quota, c.workspaces_per_user_quota), (5, 2));
        assert_eq!(c.max_active_hours_before_stop, 1);
        // Defaults for what is not written.
        assert_eq!(c.max_stopped_hours_before_termination, 744);
    }

    #[test]
    fn defaults_and_skips() {
        assert_eq!(from_agent_config(1, &json!({"ci_access": {}})), Ok(None));
        let c = from_remote_development(
            1,
            &json!({"enabled": "yes", "dns_zone": "z.dev",
                                                   "network_policy": {"enabled": null}}),
        )
        .unwrap();
        assert!(!c.enabled);
        assert!(c.network_policy_enabled);
        assert_eq!(c.network_policy_egress.len(), 1);
        assert_eq!(c.network_policy_egress[0].except.len(), 3);
    }

    #[test]
    fn what_the_model_refuses() {
        let e = from_remote_development(
            1,
            &json!({"enabled": true, "dns_zone": "not a zone", "workspaces_quota": -2,
                    "allow_privilege_escalation": true}),
        )
        .unwrap_err();
        assert_eq!(
            e.0,
            vec![
                "Workspaces quota must be greater than or equal to -1".to_owned(),
                "Dns zone must be a valid hostname".to_owned(),
                "Allow privilege escalation can be true only if either use_kubernetes_user_namespaces is true or default_runtime_class is non-empty".to_owned(),
            ]
        );
    }
}
