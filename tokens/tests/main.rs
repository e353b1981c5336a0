//! podgate-tokens's integration tests: GitLab v1 tokens, JWTs and robustness
//! properties.
//!
//! One test binary for the crate, a module per file: every test binary links the
//! whole dependency graph, so a binary per file would multiply the build's link
//! time. `cargo test --test integration MODULE::` runs one module; `scripts/test.sh`
//! runs each test in a process of its own (cargo-nextest).

mod gitlab_v1;
mod jwt;
mod robustness;
