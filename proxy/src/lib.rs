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
//! - [`service`]: [`service::PodGate`], the pingora `ProxyHttp` implementation.
//! - [`config`] and [`server`]: `proxy.toml` and `podgate proxy`.
//!
//! ## Bodies
//!
//! A JSON body (old runners' `jobs/request`) is read whole, at most 32 KiB (more:
//! 413), and replayed upstream byte for byte from pingora's retry buffer. A multipart
//! upload is read for exactly one chunk (≤ 64 KiB): pingora's retry buffer holds
//! 64 KiB and silently drops the body if a second read overflows it, so a token after
//! the first chunk is not looked for; the rest of the upload streams unbuffered.
//! `Expect: 100-continue` is answered by the proxy when it reads a body.
//!
//! ## Operations
//!
//! - [`health`]: active checks; an upstream failing `fall` checks in a row takes no
//!   traffic until it passes `rise`.
//! - [`metrics`] and [`admin`]: Prometheus metrics, `/metrics`, `/healthz`, `/readyz`
//!   on their own listener. The Grafana dashboard is `dashboards/podgate-proxy.json`.
//! - [`server`]: signals. SIGTERM drains; SIGQUIT hands the listening sockets to a new
//!   binary started with `--upgrade`.

pub mod admin;
pub mod config;
pub mod decision;
pub mod health;
pub mod metrics;
pub mod rules;
pub mod server;
pub mod service;
pub mod sources;
