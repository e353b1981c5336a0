//! podgate's end-to-end tests: the `podgate` binary and the crates together, against
//! real clients (kubectl, git, Chromium, Prometheus, a third-party runner).
//!
//! One test binary for the crate, a module per file: every test binary links the
//! whole dependency graph, so a binary per file would multiply the build's link
//! time. `cargo test --test integration MODULE::` runs one module; `scripts/test.sh`
//! runs each test in a process of its own (cargo-nextest).
// The modules share helpers through `pub` items no other crate sees.
#![allow(unreachable_pub)]

mod agent_fleet;
mod agentk_proxy;
mod cli_graph;
mod cli_kas;
mod cli_kube_sim;
mod cli_registry;
mod cli_token;
mod cli_up;
mod cli_workspaces;
mod common;
mod console;
mod dashboards;
mod deploy;
mod drills_smoke;
mod fleet_storm;
mod gitlab_fidelity;
mod graph_api;
mod job_router;
mod k8s_proxy;
mod product_binary;
mod prometheus;
mod proxy_console;
mod proxy_edge_poll;
mod proxy_endpoints;
mod proxy_ops;
mod proxy_routing;
mod proxy_upstreams;
mod third_party_runner;
mod topology_service;
mod workspace_traffic;
mod workspaces_e2e;
