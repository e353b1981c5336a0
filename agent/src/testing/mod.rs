//! Test support (feature `test-util`).

pub mod kube;
