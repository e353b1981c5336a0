//! # podgate-proxy
//!
//! The pingora edge router: it reads the runner, job or agent token of each request,
//! classifies it with `podgate-tokens`, and sends the request to the Pod (or that Pod's
//! kas) the token names.
//!
//! ## Where to start reading
//!
//! - [`rules`]: ordered rules (method, path, header/cookie conditions) and the
//!   built-in set covering every runner endpoint and kas traffic.
//! - [`sources`]: where tokens are found: headers, `Authorization`, query, JSON body,
//!   multipart form, each read without disturbing the request.
//! - [`decision`]: classification + topology → forward, 401 or 503. Pure and tested.
//!
//! Work in progress (issue 4): the pingora service, Pod pools and health checks,
//! metrics and the `podgate proxy` command come next.

pub mod config;
pub mod decision;
pub mod rules;
pub mod server;
pub mod service;
pub mod sources;
