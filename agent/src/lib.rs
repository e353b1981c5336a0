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
//!   Graph API's `/graph` WebSocket); metrics.
//! - [`agentk`]: the agent: configuration stream, a pool of reverse tunnels that grows
//!   under load, `GetPods` with kube-rs, `MakeRequest` (the proxy's HTTP requests),
//!   `WatchGraph` (the Graph API's watches), metrics and health endpoints.
//! - [`transport`]: gRPC over h2c or inside a WebSocket, on one agent port.
//! - [`obs`]: the `/metrics`, `/healthz`, `/readyz` listener of kas and agentk.
//! - [`kube_sim`]: a simulated Kubernetes API server that `kubectl` and kube-rs
//!   accept (`podgate kube-sim`); `testing::kube` (feature `test-util`) runs it on a
//!   free port for tests.
//! - [`graph`]: the Graph API's request model and validation, CEL, kubectl JSONPath
//!   and the WebSocket messages (pure; used by kas, agentk and the client).
//! - [`selector`]: Kubernetes label and field selectors (parse, match).
//!
//! The Workspaces reconciliation loop is a later issue.

pub mod agentk;
pub mod auth;
pub mod graph;
pub mod kas;
pub mod kube_sim;
pub mod obs;
pub mod proto;
pub mod selector;
#[cfg(feature = "test-util")]
pub mod testing;
pub mod transport;
