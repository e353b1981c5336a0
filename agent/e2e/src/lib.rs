//! # podgate-agent-e2e
//!
//! kas, agentk and podgate's proxy in front of them, tested together over real
//! sockets. The library is empty; the tests are in `tests/` (one binary, a module
//! per file) and the routing bench in `benches/`:
//!
//! - kas and agentk end to end, with kube-sim as the cluster and the test kit's
//!   fixtures (`podgate-kube-sim`, `podgate-testkit`);
//! - the installed `kubectl` through the proxy (`tests/edge.rs`) and kas to agentk;
//! - GitLab's agent wire from GitLab's side (`tests/gitlab_wire/`): the tests' own
//!   transcription of GitLab's protobufs, which `build.rs` generates apart from
//!   podgate's, and GitLab-shaped agentk, kas and Rails peers written from GitLab's
//!   source;
//! - the workspace's dependency rules, on the graph Cargo resolves
//!   (`tests/layout.rs`).
//!
//! It is a crate of its own so that the crates it tests depend on none of each
//! other for their tests: `podgate-agent`, which kas and agentk share, has no
//! dev-dependency on either.
