//! podgate-agent's integration tests: kas, agentk and kube-sim together over real
//! sockets.
//!
//! One test binary for the crate, a module per file: every test binary links the
//! whole dependency graph, so a binary per file would multiply the build's link
//! time. `cargo test --test integration MODULE::` runs one module; `scripts/test.sh`
//! runs each test in a process of its own (cargo-nextest).
// The modules share helpers through `pub` items no other crate sees.
#![allow(unreachable_pub)]

mod agent_configuration;
mod agentk;
mod agentk_rbac;
mod edge;
mod gitlab_access;
mod gitlab_wire;
mod graph_ws;
mod k8s_proxy_auth;
mod k8s_proxy_frames;
mod kas_api;
mod kubectl;
mod layout;
mod leader;
mod rails;
mod remote_development;
mod reverse_tunnel;
mod routing;
mod watch_graph;
mod workspace_traffic;
mod ws_apply;
mod wstunnel;
