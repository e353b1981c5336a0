//! kube-sim's integration tests, one binary: the installed `kubectl` and kube-rs
//! against the simulator (the real clients it must satisfy).
#![allow(unreachable_pub)]

mod kubectl;
mod streams;
mod workspaces;
