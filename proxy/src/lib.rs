//! # podgate-proxy
//!
//! The pingora edge router: it reads the runner, job or agent token of each request,
//! classifies it with `podgate-tokens`, and sends the request to the Pod (or that Pod's
//! kas) the token names.
//!
//! ## Where to start reading
//!
//! - [`rules`]: ordered rules (method, path, header/cookie conditions) and the
//!   built-in set, with the table of which token sources GitLab reads for each
//!   endpoint, in which order, and the GitLab file each row comes from.
//! - [`path`]: the path GitLab would serve (Workhorse's cleaning, Grape's trailing
//!   `/` and `.json`), which rules match; the request is forwarded as received.
//! - [`sources`] and [`params`]: every token a request carries — headers,
//!   `Authorization`, and Rack/Grape parameters from the query and JSON, form and
//!   multipart bodies — and the one GitLab authenticates.
//! - [`decision`]: tokens + topology → forward, 400, 401 or 503. Pure and tested.
//! - [`pipeline`]: the routing of one request as both paths run it, two pure
//!   steps: plan (Host, rule, body policy), then decide.
//! - [`service`]: [`service::PodGate`], the pingora `ProxyHttp` implementation,
//!   and the steps after the decision both paths share; [`body`]: the body prefix
//!   it reads before routing.
//! - [`fast`]: the HTTP/1 fast path for runner and job endpoints, a pingora
//!   `ServerApp` in front of that service: an I/O adapter over [`pipeline`] and
//!   the shared steps, handing every other request to the service.
//! - [`config`] and [`server`]: `proxy.toml` and `podgate proxy`.
//!
//! ## The routing contract
//!
//! Which token routes a request, where it may be, where the request goes and what
//! the proxy answers itself (400, 401, 404, 413, 503, …) is written once, in
//! `docs/routing.md`; [`pipeline`] and [`decision`] implement it. A request head
//! must arrive within `head_timeout_ms` of its first byte (default 30 s).
//!
//! ## Long polls at the edge
//!
//! [`edge_poll`]: for Pods that set `runner_queue_redis`, a poll by a rule with
//! `edge_hold` (the built-in `jobs/request` rule) whose `last_update` is the
//! runner's current queue value is held in the proxy, with no upstream
//! connection, as the Pod's Workhorse would hold it (`docs/routing.md`).
//!
//! ## Operations
//!
//! - The web console, a crate of its own (`podgate-console`, `proxy/console/`),
//!   which [`admin`] mounts on the admin listener (`[console] enabled`): a page
//!   fed by events derived from `/metrics` and the Graph API's WebSocket.
//! - [`upstreams`]: one pingora load balancer per (Pod, pool), names resolved off
//!   the request path; [`health`]: active checks, an upstream failing `fall` checks
//!   in a row takes no traffic until it passes `rise`.
//! - [`metrics`] and [`admin`]: Prometheus metrics, `/metrics`, `/healthz`, `/readyz`
//!   on their own listener. The Grafana dashboard is `dashboards/podgate-proxy.json`.
//! - [`server`]: signals. SIGTERM drains; SIGQUIT hands the listening sockets to a new
//!   binary started with `--upgrade`, and [`handover`] hands it the idle client
//!   connections too, so no request is lost to a connection closing under it.

pub mod admin;
mod answer;
pub mod body;
pub mod claims;
pub mod config;
pub mod decision;
pub mod edge_poll;
pub mod fast;
pub mod handover;
pub mod health;
pub mod http1;
pub mod metrics;
pub mod params;
pub mod path;
pub mod pipeline;
mod request_id;
pub mod rules;
pub mod server;
pub mod service;
pub mod sources;
pub mod upstreams;
