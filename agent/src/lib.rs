//! # podgate-agent
//!
//! kas and agentk: reverse tunnels from agents, the presence registry, kas-to-kas
//! routing, the `KasApi`, the Graph API and the Workspaces reconciliation loop.
//!
//! - [`proto`]: the seed's `KasApi` / `KasInternal` protobufs and podgate's agentk
//!   services (`agent/proto/kas.proto`).
//! - [`auth`]: JWT authentication of the external (GitLab) and internal (kas ↔ kas)
//!   listeners, each with its own secret.
//! - [`kas`]: the agent, external, internal and observability listeners; agent
//!   authentication (local JWTs, GitLab's `agent_info` for opaque tokens); presence;
//!   connected agents from the registry; calls to agents ([`kas::routing`]) through a
//!   local reverse tunnel, or kas → kas, or after waiting for the agent to connect;
//!   the Kubernetes API proxy ([`kas::k8s_proxy`]: `kubectl` through GitLab, and the
//!   Graph API's `/graph` WebSocket); agentk modules' requests to GitLab
//!   ([`kas::gitlab_access`]: `GitlabAccess.MakeRequest`); agent configurations from
//!   a directory, sent to agentk and posted to GitLab ([`kas::agent_config`]); the
//!   Workspaces HTTP server ([`kas::workspaces`]: a workspace's URL, authorised by
//!   GitLab, through the agent's tunnel); metrics.
//! - [`agentk`]: the agent: configuration stream, a pool of reverse tunnels that grows
//!   under load, `GetPods` with kube-rs, `MakeRequest` (the proxy's HTTP requests),
//!   `WatchGraph` (the Graph API's watches), the Workspaces module
//!   ([`agentk::remote_development`]: leader election with a Lease
//!   ([`agentk::leader`]), the reconcile loop with GitLab through kas, server-side
//!   apply of GitLab's objects by inventory) and workspace traffic to workspace
//!   Services, metrics and health endpoints.
//! - [`transport`]: gRPC over h2c or inside a WebSocket, on one agent port.
//! - `httpz` and `task`: what kas and agentk both use (HTTP headers and queries over
//!   gRPC, hop-by-hop headers; a task aborted with its scope). kas and agentk never
//!   import each other (`tests/layout.rs`).
//! - [`obs`]: the `/metrics`, `/healthz`, `/readyz` listener of kas and agentk.
//! - [`kube_sim`]: a simulated Kubernetes API server that `kubectl` and kube-rs
//!   accept (`podgate kube-sim`); `testing::kube` (feature `test-util`) runs it on a
//!   free port for tests, and `testing::workspaces` the Workspaces stack around it
//!   (kube-sim, the Pod simulator as GitLab, kas and agentk).
//! - [`graph`]: the Graph API's request model and validation, CEL, kubectl JSONPath
//!   and the WebSocket messages (pure; used by kas, agentk and the client).
//! - [`selector`]: Kubernetes label and field selectors (parse, match).

pub mod agentk;
pub mod auth;
pub mod graph;
mod httpz;
pub mod kas;
pub mod kube_sim;
pub mod obs;
pub mod proto;
pub mod selector;
mod task;
#[cfg(feature = "test-util")]
pub mod testing;
pub mod transport;
