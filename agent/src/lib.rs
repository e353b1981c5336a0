//! # podgate-agent
//!
//! kas and agentk: reverse tunnels from agents, the presence registry, kas-to-kas
//! routing, the `KasApi`, the Graph API and the Workspaces reconciliation loop.
//!
//! Built so far (issue 6):
//! - [`proto`]: the seed's `KasApi` / `KasInternal` protobufs (`agent/proto/kas.proto`).
//! - [`auth`]: JWT authentication of the external (GitLab) and internal (kas ↔ kas)
//!   listeners, each with its own secret.
//! - [`kas`]: the agent, external and internal listeners; presence; connected agents
//!   from the registry; `GetPods` through a local reverse tunnel, or kas → kas, or
//!   after waiting for the agent to connect.
//! - [`agentk`]: agentk's tunnel loop (a pool of idle tunnels, back-off).
//! - `testing::kube` (feature `test-util`): an in-process Kubernetes API server that
//!   `kubectl` accepts, for testing agentk without a cluster.
//!
//! Still to come: the agentk program (kube-rs), observability listeners, the
//! `agent_info` backend for opaque agent tokens.

pub mod agentk;
pub mod auth;
pub mod kas;
pub mod obs;
pub mod proto;
#[cfg(feature = "test-util")]
pub mod testing;
pub mod transport;
