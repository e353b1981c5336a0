//! What kas's Workspaces server reads off a request's host
//! (`podgate_kas::workspaces::{workspace_name, agent_of}`): the workspace
//! name (Rails' `workspace_host_parser.rb`) and the agent whose tunnel serves it.
//!
//! - nothing panics;
//! - a name is non-empty and within the host's first label;
//! - an agent id is positive and written in the name as Rails writes it:
//!   `workspace-<agent id>-<user id>-<random>`.

use podgate_kas::workspaces::{agent_of, workspace_name};

/// Checks one input (module docs); panics on a violated property.
pub fn run(data: &[u8]) {
    let Ok(host) = std::str::from_utf8(data) else {
        return;
    };
    let Some(name) = workspace_name(host) else {
        return;
    };
    assert!(!name.is_empty() && !name.contains('.'));
    assert!(host.split('.').next().is_some_and(|l| l.ends_with(&name)));
    if let Some(agent) = agent_of(&name) {
        assert!(agent > 0);
        let prefix = format!("workspace-{agent}-");
        assert!(name.starts_with(&prefix), "{name:?}: agent {agent}");
        assert!(name[prefix.len()..].contains('-'));
    }
}
