//! # podgate-agent
//!
//! kas and agentk: reverse tunnels from agents, the presence registry, kas-to-kas
//! routing, the `KasApi`, the Graph API and the Workspaces reconciliation loop.
//!
//! Built so far (issue 6): [`testing::kube`] (feature `test-util`), an in-process
//! Kubernetes API server that `kubectl` accepts, for testing agentk without a cluster.
//! kas, agentk and the tunnels are still to come.

#[cfg(feature = "test-util")]
pub mod testing;
