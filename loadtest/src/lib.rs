//! # podgate-loadtest
//!
//! A GitLab Pod simulator, a simulated runner fleet and an open-loop HTTP load
//! generator, to show and measure the whole routing path on one machine.
//!
//! Not built yet: issue 5 fills this crate.
