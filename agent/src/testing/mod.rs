//! Test support (feature `test-util`).

pub mod fixtures;
pub mod kube;
pub mod workspaces;
