//! The JSON of `POST …/modules/remote_development/reconcile`: what agentk sends
//! and what GitLab answers.
//!
//! Shaped as GitLab agentk's `RequestPayload`, `WorkspaceAgentInfo`, `ErrorDetails`,
//! `ResponsePayload` and `WorkspaceRailsInfo` in
//! `internal/module/remote_development/agent/reconciler.go` (gitlab-agent v16, read in
//! `pluralsh/kubernetes-agent` at `1fc64e68^`), serialised as Go's `encoding/json`
//! does: fields in declaration order, `omitempty` fields left out when empty,
//! `workspace_agent_infos` always an array (`[]`, never `null`), object keys sorted
//! (Go marshals maps sorted), and `<`, `>`, `&`, U+2028 and U+2029 escaped as
//! `\u003c`… (Go's HTML-safe escaping). The byte-exact cases are agentk's
//! `TestSerializationOfRailsRequests` (`reconciler_test.go`).
//!
//! Decoding the answer is lenient as Go's is: unknown fields are ignored, `null`
//! strings become `""` (so a new workspace's `deployment_resource_version: null` is
//! `""`), a `null` or missing list is empty. `settings` (GitLab 17.x, from
//! gitlab-agent MR 1495) is read when present.

use std::io;

use serde::{Deserialize, Deserializer, Serialize};

/// Body errors (decoding GitLab's answer). Not retried by themselves: the cycle
/// fails and the next one asks again.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The answer is not a `ResponsePayload` (agentk's words:
    /// `error parsing response body: …`).
    #[error("error parsing response body: {0}")]
    Parse(#[source] serde_json::Error),
}

/// `update_type`: whether GitLab should answer with every workspace (`full`) or only
/// those that changed (`partial`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UpdateType {
    /// The first cycle of a reconciler: GitLab answers with every workspace and all
    /// of their objects.
    Full,
    /// Every later cycle: only what changed.
    Partial,
}

impl UpdateType {
    /// `"full"` or `"partial"` (metric labels, logs).
    pub fn as_str(self) -> &'static str {
        match self {
            UpdateType::Full => "full",
            UpdateType::Partial => "partial",
        }
    }
}

/// `termination_progress`: how far the deletion of a workspace GitLab wants
/// `Terminated` has come.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TerminationProgress {
    /// Deleted, but its Deployment is still in the cluster.
    Terminating,
    /// Its Deployment (and namespace) are gone.
    Terminated,
}

/// `error_details.error_type`. agentk only ever reports `applier` (GitLab 2025's
/// validator also accepts `kubernetes`).
pub const ERROR_TYPE_APPLIER: &str = "applier";

/// `error_details`: why applying a workspace's configuration failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetails {
    /// `applier` (`omitempty` in Go).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error_type: String,
    /// Every error of the apply, joined by newlines as Go's `errors.Join` does
    /// (`omitempty` in Go).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error_message: String,
}

impl ErrorDetails {
    /// An `applier` error.
    pub fn applier(message: impl Into<String>) -> ErrorDetails {
        ErrorDetails {
            error_type: ERROR_TYPE_APPLIER.to_owned(),
            error_message: message.into(),
        }
    }
}

/// One workspace as agentk sees it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkspaceAgentInfo {
    /// The workspace's (= its Deployment's) name; always sent.
    pub name: String,
    /// Its namespace (`omitempty` in Go; agentk always knows it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// The whole Deployment as the cluster has it (metadata with managed fields,
    /// spec, status); GitLab computes the workspace's actual state from it.
    #[serde(default, skip_serializing_if = "is_empty_object")]
    pub latest_k8s_deployment_info: Option<serde_json::Value>,
    /// Set while GitLab wants the workspace `Terminated` and has not confirmed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_progress: Option<TerminationProgress>,
    /// Set when the last apply for it failed and GitLab has not seen that yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_details: Option<ErrorDetails>,
}

/// Go's `omitempty` on a map: `nil` and `{}` are both left out.
fn is_empty_object(v: &Option<serde_json::Value>) -> bool {
    match v {
        None | Some(serde_json::Value::Null) => true,
        Some(serde_json::Value::Object(m)) => m.is_empty(),
        Some(_) => false,
    }
}

/// The request body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReconcileRequest {
    /// `full` or `partial`.
    pub update_type: UpdateType,
    /// Workspaces GitLab has not seen in this state yet; `[]` when none.
    pub workspace_agent_infos: Vec<WorkspaceAgentInfo>,
}

impl ReconcileRequest {
    /// The body's bytes, exactly as agentk's Go `json.Marshal` writes them.
    pub fn to_json(&self) -> Vec<u8> {
        to_go_json(self)
    }
}

/// `image_pull_secrets[]` of a workspace (GitLab 17.6+): a Secret agentk would copy
/// into the workspace's namespace. Decoded, not acted on (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImagePullSecret {
    /// The Secret's name.
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    /// Its namespace.
    #[serde(default, deserialize_with = "null_as_default")]
    pub namespace: String,
}

/// One workspace as GitLab wants it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceRailsInfo {
    /// The workspace's name.
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    /// Its namespace.
    #[serde(default, deserialize_with = "null_as_default")]
    pub namespace: String,
    /// The Deployment resourceVersion GitLab has stored; `""` for a new workspace
    /// (GitLab sends `null`).
    #[serde(default, deserialize_with = "null_as_default")]
    pub deployment_resource_version: String,
    /// What GitLab last computed from agentk's reports.
    #[serde(default, deserialize_with = "null_as_default")]
    pub actual_state: String,
    /// `Running`, `Stopped`, `RestartRequested` or `Terminated`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub desired_state: String,
    /// A multi-document YAML stream to apply; `""`: nothing.
    #[serde(default, deserialize_with = "null_as_default")]
    pub config_to_apply: String,
    /// Secrets to copy into the workspace's namespace (GitLab 17.6+).
    #[serde(default, deserialize_with = "null_as_default")]
    pub image_pull_secrets: Vec<ImagePullSecret>,
}

/// `settings` of an answer: the intervals of the next cycles. A missing or `null`
/// field means GitLab's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    /// Seconds between full cycles (GitLab's default 3600).
    #[serde(default)]
    pub full_reconciliation_interval_seconds: Option<u64>,
    /// Seconds between partial cycles (GitLab's default 10).
    #[serde(default)]
    pub partial_reconciliation_interval_seconds: Option<u64>,
}

/// The answer body (HTTP 201).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcileResponse {
    /// Workspaces to act on, in GitLab's order (by id).
    #[serde(default, deserialize_with = "null_as_default")]
    pub workspace_rails_infos: Vec<WorkspaceRailsInfo>,
    /// The intervals for the next cycles, when GitLab sends them.
    #[serde(default)]
    pub settings: Option<Settings>,
}

impl ReconcileResponse {
    /// Decode GitLab's answer.
    pub fn from_json(body: &[u8]) -> Result<ReconcileResponse, Error> {
        serde_json::from_slice(body).map_err(Error::Parse)
    }
}

/// Go decodes `null` into a string or a slice as its zero value.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Serialise as Go's `json.Marshal`: compact, with `<`, `>`, `&`, U+2028 and U+2029
/// escaped (`encoding/json`'s HTML-safe default).
pub fn to_go_json<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, GoFormatter);
    // Serialising plain data into memory cannot fail.
    value
        .serialize(&mut ser)
        .expect("JSON serialisation into memory");
    out
}

/// serde_json's compact formatter plus Go's HTML-safe escapes.
struct GoFormatter;

impl serde_json::ser::Formatter for GoFormatter {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            let escaped = match c {
                '<' => "\\u003c",
                '>' => "\\u003e",
                '&' => "\\u0026",
                '\u{2028}' => "\\u2028",
                '\u{2029}' => "\\u2029",
                _ => continue,
            };
            writer.write_all(&fragment.as_bytes()[start..i])?;
            writer.write_all(escaped.as_bytes())?;
            start = i + c.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn info() -> WorkspaceAgentInfo {
        WorkspaceAgentInfo {
            name: "workspace1".into(),
            namespace: "namespace1".into(),
            ..Default::default()
        }
    }

    fn body(update_type: UpdateType, infos: Vec<WorkspaceAgentInfo>) -> String {
        String::from_utf8(
            ReconcileRequest {
                update_type,
                workspace_agent_infos: infos,
            }
            .to_json(),
        )
        .unwrap()
    }

    /// agentk's `TestSerializationOfRailsRequests`, byte for byte.
    #[test]
    fn requests_serialise_as_agentk_does() {
        let with_info = WorkspaceAgentInfo {
            latest_k8s_deployment_info: Some(json!({"a": 1})),
            ..info()
        };
        assert_eq!(
            body(UpdateType::Partial, vec![with_info]),
            r#"{"update_type":"partial","workspace_agent_infos":[{"name":"workspace1","namespace":"namespace1","latest_k8s_deployment_info":{"a":1}}]}"#
        );
        let terminating = WorkspaceAgentInfo {
            termination_progress: Some(TerminationProgress::Terminating),
            ..info()
        };
        assert_eq!(
            body(UpdateType::Partial, vec![terminating]),
            r#"{"update_type":"partial","workspace_agent_infos":[{"name":"workspace1","namespace":"namespace1","termination_progress":"Terminating"}]}"#
        );
        let errored = WorkspaceAgentInfo {
            error_details: Some(ErrorDetails::applier("applierError")),
            ..info()
        };
        assert_eq!(
            body(UpdateType::Partial, vec![errored]),
            r#"{"update_type":"partial","workspace_agent_infos":[{"name":"workspace1","namespace":"namespace1","error_details":{"error_type":"applier","error_message":"applierError"}}]}"#
        );
        assert_eq!(
            body(UpdateType::Full, vec![]),
            r#"{"update_type":"full","workspace_agent_infos":[]}"#
        );
    }

    #[test]
    fn every_field_at_once_in_go_order_and_empty_ones_left_out() {
        let all = WorkspaceAgentInfo {
            latest_k8s_deployment_info: Some(json!({"z": {"b": 2, "a": [1, "x"]}, "a": null})),
            termination_progress: Some(TerminationProgress::Terminated),
            error_details: Some(ErrorDetails::applier("")),
            ..info()
        };
        assert_eq!(
            body(UpdateType::Full, vec![all]),
            r#"{"update_type":"full","workspace_agent_infos":[{"name":"workspace1","namespace":"namespace1","latest_k8s_deployment_info":{"a":null,"z":{"a":[1,"x"],"b":2}},"termination_progress":"Terminated","error_details":{"error_type":"applier"}}]}"#
        );
        // An empty map is left out as Go's omitempty does; the name never is.
        let bare = WorkspaceAgentInfo {
            name: String::new(),
            latest_k8s_deployment_info: Some(json!({})),
            ..Default::default()
        };
        assert_eq!(
            body(UpdateType::Partial, vec![bare]),
            r#"{"update_type":"partial","workspace_agent_infos":[{"name":""}]}"#
        );
    }

    #[test]
    fn html_characters_are_escaped_as_go_does() {
        let errored = WorkspaceAgentInfo {
            error_details: Some(ErrorDetails::applier("a<b>&c\u{2028}\"\n")),
            ..info()
        };
        let out = body(UpdateType::Partial, vec![errored]);
        assert!(
            out.contains(r#""error_message":"a\u003cb\u003e\u0026c\u2028\"\n""#),
            "{out}"
        );
        // Still the same JSON for any decoder.
        let back: ReconcileRequest = serde_json::from_str(&out).unwrap();
        assert_eq!(
            back.workspace_agent_infos[0]
                .error_details
                .as_ref()
                .unwrap()
                .error_message,
            "a<b>&c\u{2028}\"\n"
        );
    }

    #[test]
    fn answers_decode_with_nulls_as_empty_and_unknown_fields_ignored() {
        let r = ReconcileResponse::from_json(
            br#"{"workspace_rails_infos":[{"name":"w","namespace":"n","desired_state":"Running",
                "actual_state":"CreationRequested","deployment_resource_version":null,
                "config_to_apply":"---\nkind: X\n","image_pull_secrets":[{"name":"s","namespace":"o"}],
                "something_new":{"x":1}}],
               "settings":{"full_reconciliation_interval_seconds":100,"partial_reconciliation_interval_seconds":40},
               "other":1}"#,
        )
        .unwrap();
        let w = &r.workspace_rails_infos[0];
        assert_eq!(w.deployment_resource_version, "");
        assert_eq!(w.desired_state, "Running");
        assert_eq!(w.config_to_apply, "---\nkind: X\n");
        assert_eq!(w.image_pull_secrets[0].name, "s");
        assert_eq!(
            r.settings,
            Some(Settings {
                full_reconciliation_interval_seconds: Some(100),
                partial_reconciliation_interval_seconds: Some(40),
            })
        );
        let empty = ReconcileResponse::from_json(br#"{"workspace_rails_infos":null}"#).unwrap();
        assert!(empty.workspace_rails_infos.is_empty());
        assert_eq!(empty.settings, None);
        let partial_settings =
            ReconcileResponse::from_json(br#"{"workspace_rails_infos":[],"settings":{}}"#).unwrap();
        assert_eq!(partial_settings.settings, Some(Settings::default()));
        let e = ReconcileResponse::from_json(b"<html>").unwrap_err();
        assert!(
            e.to_string().starts_with("error parsing response body: "),
            "{e}"
        );
    }
}
