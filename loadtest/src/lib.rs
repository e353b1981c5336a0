//! # podgate-loadtest
//!
//! A GitLab Pod simulator, a simulated runner fleet and an open-loop HTTP load
//! generator, to show and measure the whole routing path on one machine.
//!
//! - [`pod_sim`]: `podgate pod-sim`, the runner API of one Pod, with misroute
//!   detection (`misrouted_requests_total`).
//! - [`fleet`]: `podgate loadtest runners`, simulated runners (old and new) that
//!   schedule their requests as gitlab-runner does (`check_interval`, `concurrent`,
//!   `request_concurrency`, retries, health), with a per-endpoint HDR report.
//! - [`open_loop`]: `podgate loadtest http`, constant-rate requests with latencies
//!   corrected for coordinated omission.
//! - [`wake`]: `podgate loadtest wake`, the time from a job queued to the held poll
//!   of its runner answered, on the Job Router or REST.
//!
//! `podgate up` (in the binary) puts three simulators, the proxy and a fleet together.

pub mod fleet;
pub mod open_loop;
pub mod pod_sim;
pub mod wake;
