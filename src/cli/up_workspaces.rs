//! The Workspaces side of `podgate up` (issue 13): Pod 1's agent runs GitLab's
//! `remote_development` module.
//!
//! - kas reads the agent's configuration from a directory, as GitLab's kas reads
//!   `.gitlab/agents/<name>/config.yaml` ([`AgentConfigDir`]: `<dir>/1.yaml` with
//!   `remote_development: {enabled: true, dns_zone: …}`), sends it to agentk on the
//!   configuration stream and posts it to the Pod simulator (GitLab's
//!   `agent_configuration` internal API);
//! - agentk's module, enabled by that configuration, elects itself leader with a
//!   Lease and reconciles workspaces with the Pod simulator through kas
//!   (`POST …/modules/remote_development/reconcile`), against kube-sim, whose
//!   Deployment controller and Service backends run;
//! - at start one workspace is created ([`first_workspace`]); the periodic table
//!   lists every workspace with its desired and actual state ([`table`]), and
//!   `podgate workspaces --gitlab <Pod 1> list|create|stop|…` drives them
//!   ([`drive_line`]);
//! - a request for a workspace's host (`<port>-<name>.workspaces.localhost`, which
//!   resolves to this machine) with its owner's personal access token reaches the
//!   workspace's Service: the proxy's `kas-workspaces` rule sends it to the kas
//!   Workspaces HTTP server of the Pod the token names, which asks GitLab and
//!   forwards it through agentk's tunnel (the `open: curl …` line).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use podgate_kas::agent_config::AgentConfigSource;
use podgate_loadtest::pod_sim::PodSim;
use podgate_loadtest::pod_sim::workspaces::{Workspace, WorkspaceSpec};
use serde_json::json;

/// The agent's `remote_development.dns_zone`: workspace URLs are
/// `https://<port>-<workspace name>.<zone>/`. Names under `localhost` resolve to
/// this machine (RFC 6761), so they can reach the proxy once it routes them.
pub(crate) const DNS_ZONE: &str = "workspaces.localhost";

/// How often kas looks at the agent configuration file (edits show up this fast).
const CONFIG_POLL: Duration = Duration::from_secs(2);

/// How long `podgate up` waits for kas to tell GitLab the agent's configuration.
const CONFIG_WAIT: Duration = Duration::from_secs(60);

/// The user who owns the workspace created at start (`root`).
const USER_ID: u64 = 1;

/// The directory kas reads agent configurations from (`[agent_configuration] dir`),
/// holding `<agent id>.yaml`; removed when dropped.
pub(crate) struct AgentConfigDir {
    dir: tempfile::TempDir,
    agent_id: i64,
}

impl AgentConfigDir {
    /// A directory with agent `agent_id`'s configuration: Workspaces enabled in
    /// [`DNS_ZONE`].
    pub(crate) fn new(agent_id: i64) -> anyhow::Result<AgentConfigDir> {
        let dir = tempfile::Builder::new()
            .prefix("podgate-up-agents-")
            .tempdir()
            .context("a directory for agent configurations")?;
        let file = dir.path().join(format!("{agent_id}.yaml"));
        std::fs::write(&file, agent_config_yaml())
            .with_context(|| format!("writing {}", file.display()))?;
        Ok(AgentConfigDir { dir, agent_id })
    }

    /// kas's `[agent_configuration]`.
    pub(crate) fn source(&self) -> AgentConfigSource {
        AgentConfigSource {
            dir: self.dir.path().to_owned(),
            poll: CONFIG_POLL,
        }
    }

    /// The agent's configuration file.
    pub(crate) fn file(&self) -> std::path::PathBuf {
        self.dir.path().join(format!("{}.yaml", self.agent_id))
    }
}

/// The agent's `config.yaml`, as a GitLab user writes it for Workspaces
/// (`ee/lib/remote_development/agent_config_operations`: `enabled` and `dns_zone`
/// are the keys that must be set).
fn agent_config_yaml() -> String {
    format!("remote_development:\n  enabled: true\n  dns_zone: {DNS_ZONE}\n")
}

/// Wait until kas has told GitLab (`sim`) agent `agent_id`'s configuration with
/// Workspaces enabled, then create a workspace for `root` (desired state
/// `Running`), as the control API's `POST /-/podsim/workspaces` does.
pub(crate) async fn first_workspace(sim: &PodSim, agent_id: i64) -> anyhow::Result<Workspace> {
    // GitLab has no change notification for this: look every 50 ms.
    tokio::time::timeout(CONFIG_WAIT, async {
        while !sim
            .workspaces()
            .agent_config(agent_id)
            .is_some_and(|c| c.enabled)
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .with_context(|| {
        format!(
            "kas did not post agent {agent_id}'s configuration (remote_development enabled) \
             to the Pod simulator within {CONFIG_WAIT:?}"
        )
    })?;
    sim.create_workspace(agent_id, USER_ID, WorkspaceSpec::default())
        .map_err(|e| anyhow::anyhow!("creating a workspace: {e}"))
}

/// Every workspace of `sim`, as `podgate workspaces list` prints them (id, name,
/// desired and actual state, URL), each line indented by two spaces.
pub(crate) fn table(sim: &PodSim) -> String {
    let views: Vec<serde_json::Value> = sim
        .workspaces()
        .list()
        .iter()
        .map(|w| {
            json!({
                "id": w.id,
                "name": w.name,
                "desired_state": w.desired_state.as_str(),
                "actual_state": w.actual_state.as_str(),
                "url": w.url,
            })
        })
        .collect();
    let mut out = String::from("  workspaces\n");
    for line in super::workspaces::table(&views).lines() {
        out.push_str("  ");
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The lines `podgate up` prints about Workspaces at start: the agent
/// configuration, the workspace created, how to reach it (through the proxy at
/// `proxy`, with a personal access token of its owner in `pat_file`), how to drive
/// workspaces.
pub(crate) fn start_lines(
    sim: &PodSim,
    config: &AgentConfigDir,
    ws: &Workspace,
    proxy: SocketAddr,
    pat_file: &Path,
) -> Vec<String> {
    let mut lines = vec![
        format!(
            "  workspaces agent {} (remote_development enabled, dns_zone {DNS_ZONE}; config {})",
            config.agent_id,
            config.file().display()
        ),
        format!(
            "  workspace id={} name={} namespace={} url={}",
            ws.id, ws.name, ws.namespace, ws.url
        ),
    ];
    if let Some(line) = url_line(ws, proxy, pat_file) {
        lines.push(line);
    }
    lines.push(drive_line(sim));
    lines
}

/// How to drive the simulated GitLab's workspaces.
pub(crate) fn drive_line(sim: &PodSim) -> String {
    format!(
        "  try: podgate workspaces --gitlab http://{} list|create --agent 1 --user 1|stop ID|start ID|restart ID|terminate ID",
        sim.addr()
    )
}

/// How a user reaches workspace `ws`: its URL's host, on the proxy's port (plain
/// HTTP), with a personal access token of its owner (`pat_file`). Names under
/// `localhost` resolve to the loopback address; a proxy listening elsewhere is
/// named with `--connect-to`. `None` when the URL has no host.
fn url_line(ws: &Workspace, proxy: SocketAddr, pat_file: &Path) -> Option<String> {
    let host = ws
        .url
        .split_once("://")
        .map_or(ws.url.as_str(), |(_, rest)| rest)
        .split('/')
        .next()
        .filter(|h| !h.is_empty())?;
    let port = proxy.port();
    let connect_to = if proxy.ip().is_loopback() || proxy.ip().is_unspecified() {
        String::new()
    } else {
        format!(" --connect-to ::{proxy}")
    };
    Some(format!(
        "  open: curl -H \"Authorization: Bearer $(cat {})\"{connect_to} http://{host}:{port}/",
        pat_file.display()
    ))
}
