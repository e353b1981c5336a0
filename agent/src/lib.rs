//! # podgate-agent
//!
//! What podgate's kas (`podgate-kas`, `agent/kas/`) and agentk (`podgate-agentk`,
//! `agent/agentk/`) share. The two are siblings that never depend on each other
//! (`agent/e2e/tests/layout.rs` checks Cargo's graph); everything both speak or use
//! lives here:
//!
//! - [`proto`]: GitLab's `KasApi` and kas's `KasInternal` protobufs and podgate's agentk
//!   services (`agent/proto/kas.proto`), GitLab's `KubernetesApi` and
//!   `GitlabAccess` messages.
//! - [`any`]: `google.protobuf.Any` packed and unpacked as Go's `anypb` does
//!   (`Header.extra` of HTTP over gRPC).
//! - [`auth`]: JWT authentication of the external (GitLab) and internal (kas ↔ kas)
//!   listeners, each with its own secret.
//! - [`transport`]: gRPC over h2c or inside a WebSocket, on one agent port;
//!   [`ws_authority`]: the `:authority` grpc-go writes inside a WebSocket, made one
//!   h2 accepts.
//! - [`httpz`] and [`task`]: HTTP headers and queries over gRPC, hop-by-hop headers;
//!   a task aborted with its scope.
//! - [`obs`]: the `/metrics`, `/healthz`, `/readyz` listener of kas and agentk.
//! - [`graph`]: the Graph API's request model and validation, CEL, kubectl JSONPath
//!   and the WebSocket messages (pure; used by kas, agentk and the client).
//! - [`selector`]: Kubernetes label and field selectors (parse, match).
//! - [`tunnel`]: GitLab's reverse tunnel as both sides use it: method names, the
//!   agent's `Descriptor`, metadata as `prototool.Values`.
//!
//! kas, agentk and the proxy in front of them are tested together, over real sockets,
//! by a crate of its own, `podgate-agent-e2e` (`agent/e2e/`), so this one depends on
//! none of them, not even for its tests.

pub mod any;
pub mod auth;
pub mod codec;
pub mod graph;
pub mod httpz;
pub mod obs;
pub mod proto;
pub mod selector;
pub mod task;
pub mod transport;
pub mod tunnel;
pub mod ws_authority;
