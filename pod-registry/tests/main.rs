//! podgate-registry's integration tests: both backends' conformance and Redis's own
//! behaviour, on a real redis-server.
//!
//! One test binary for the crate, a module per file: every test binary links the
//! whole dependency graph, so a binary per file would multiply the build's link
//! time. `cargo test --test integration MODULE::` runs one module; `scripts/test.sh`
//! runs each test in a process of its own (cargo-nextest).

mod conformance;
mod redis_behaviour;
