//! podgate-loadtest's integration tests: the Pod simulator, the runner fleet and the
//! open-loop generator.
//!
//! One test binary for the crate, a module per file: every test binary links the
//! whole dependency graph, so a binary per file would multiply the build's link
//! time. `cargo test --test integration MODULE::` runs one module; `scripts/test.sh`
//! runs each test in a process of its own (cargo-nextest).
// The modules share helpers through `pub` items no other crate sees.
#![allow(unreachable_pub)]

mod common;
mod fleet_gitlab;
mod fleet_job_router;
mod fleet_report;
mod fleet_retries;
mod fleet_scheduling;
mod open_loop;
mod pod_sim;
mod pod_sim_agentw;
mod pod_sim_git;
mod pod_sim_jobs;
mod pod_sim_ledger;
mod pod_sim_params;
mod pod_sim_queue;
mod pod_sim_workspaces;
