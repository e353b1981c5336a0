//! # podgate-topology-service
//!
//! GitLab's Topology Service (TS), served from podgate: the service every GitLab
//! component of a Cells deployment asks where something lives.
//!
//! - [`proto`]: the wire, from podgate's transcription of GitLab's schema
//!   (`proto/`, checked against the descriptors GitLab's client gem carries).

pub mod access;
pub mod cells;
pub mod claims;
pub mod classify;
pub mod config;
pub mod grpc;
pub mod proto;
pub mod rest;
pub mod server;
