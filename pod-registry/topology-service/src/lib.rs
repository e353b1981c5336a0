//! # podgate-topology-service
//!
//! GitLab's Topology Service (TS), served from podgate: the service every GitLab
//! component of a Cells deployment asks where something lives.
//!
//! - [`proto`]: the wire, from podgate's transcription of GitLab's schema
//!   (`proto/`, checked against the descriptors GitLab's client gem carries).
//! - [`classify`]: `Classify` (the claims chain, the retired single claim, types);
//!   [`cells`]: the configured Cells; [`claims`]: claims and leases, in memory or
//!   on Redis; [`access`]: each method's caller roles.
//! - [`grpc`]: the services; [`rest`]: `POST /v1/classify` and `GET /metrics`;
//!   [`server`]: one listener for both, mutual TLS with [`tls`]; [`config`]:
//!   `topology-service.toml`;
//!   [`metrics`]: requests by method and code.

pub mod access;
pub mod cells;
pub mod claims;
pub mod classify;
pub mod config;
pub mod grpc;
pub mod metrics;
pub mod proto;
pub mod rest;
pub mod server;
pub mod tls;
