//! # podgate-testkit
//!
//! Test support for kas and agentk, shared by the agent's and the root crate's
//! integration tests (a dev-dependency only; nothing in the product links it):
//!
//! - [`fixtures`]: kas and agentk configured on free ports, agents' tokens.
//! - [`http`]: HTTP/1 read off a socket (chunked bodies).
//! - [`kube`]: kube-sim on a free port and a `kubectl` pointed at it.
//! - [`workspaces`]: the Workspaces stack — kube-sim, the Pod simulator as GitLab,
//!   kas and agentk.

pub mod fixtures;
pub mod http;
pub mod kube;
pub mod workspaces;
