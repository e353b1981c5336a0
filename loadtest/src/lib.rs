//! # podgate-loadtest
//!
//! A GitLab Pod simulator, a simulated runner fleet and an open-loop HTTP load
//! generator, to show and measure the whole routing path on one machine.
//!
//! - [`pod_sim`]: `podgate pod-sim`, the runner API of one Pod, with misroute
//!   detection (`misrouted_requests_total`).
//!
//! Still to come (issue 5): the runner fleet, the open-loop HTTP mode and `podgate up`.

pub mod fleet;
pub mod pod_sim;
