//! [`Inclusion`]: which of a workspace's objects a reconcile response carries
//! (`reconcile/output/response_payload_builder.rb`, `config_to_apply_builder.rb`).

use super::super::model::{ActualState, DesiredState, Workspace};

/// Which of a workspace's objects a reconcile response carries (the §5 table).
/// `reconcile.rs` chooses it, e.g. with [`Inclusion::for_workspace`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Inclusion {
    /// No config: `config_to_apply` is `""`.
    Nothing,
    /// Desired `Terminated`: the workspace and secrets inventory ConfigMaps only
    /// (applied empty, they prune everything they tracked).
    InventoriesOnly,
    /// A partial reconciliation: the workspace inventory, Deployment, Service, PVC,
    /// ServiceAccount and NetworkPolicy — not the secrets inventory (sending it
    /// without its Secrets would prune them), ResourceQuota or Secrets.
    Partial,
    /// Everything: the partial set plus the secrets inventory, ResourceQuota and
    /// both Secrets.
    All,
}

impl Inclusion {
    /// What Rails sends for `ws` in a `full` (`full == true`) or partial reconcile
    /// response: `response_payload_builder.rb`'s `should_include_config_to_apply?`
    /// (full, `force_include_all_resources`, desired or actual state changed since
    /// the last response — strictly later, as `workspace.rb`'s
    /// `…_updated_more_recently_than_last_response_to_agent?` — or never responded,
    /// or desired `Terminated` while actual is not) and
    /// `should_include_all_resources?` (full, forced, or actual state changed), then
    /// `config_to_apply_builder.rb`'s rule that desired `Terminated` sends only the
    /// inventories.
    pub fn for_workspace(ws: &Workspace, full: bool) -> Inclusion {
        let since_response = |t: u64| ws.responded_to_agent_at.is_none_or(|r| t > r);
        let actual_changed = since_response(ws.actual_state_updated_at);
        let include = full
            || ws.force_include_all_resources
            || since_response(ws.desired_state_updated_at)
            || actual_changed
            || (ws.desired_state == DesiredState::Terminated
                && ws.actual_state != ActualState::Terminated);
        if !include {
            Inclusion::Nothing
        } else if ws.desired_state == DesiredState::Terminated {
            Inclusion::InventoriesOnly
        } else if full || ws.force_include_all_resources || actual_changed {
            Inclusion::All
        } else {
            Inclusion::Partial
        }
    }
}
