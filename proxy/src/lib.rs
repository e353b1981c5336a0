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
//! - [`service`]: [`service::PodGate`], the pingora `ProxyHttp` implementation;
//!   [`body`]: the body prefix it reads before routing.
//! - [`fast`]: the HTTP/1 fast path for runner and job endpoints, a pingora
//!   `ServerApp` in front of that service that routes with the same `PodGate` and
//!   hands every other request to it.
//! - [`config`] and [`server`]: `proxy.toml` and `podgate proxy`.
//!
//! ## The routing contract
//!
//! A request goes to the Pod of the token GitLab will authenticate, and only if
//! every token it carries in any source GitLab might read names that same Pod: an
//! invalid one is a 401, two Pods are a 400 `conflicting_tokens`, and nothing is
//! forwarded. A token header listed in `Connection:` is removed, never routed by.
//!
//! ## Bodies
//!
//! When a rule's token may be a parameter, a JSON or form body is read whole (at
//! most `body_lookahead_bytes`, default 64 KiB; more: 413) and a multipart body up to
//! `body_lookahead_bytes`, wherever the token part is within it. What was read is
//! replayed upstream byte for byte from pingora's retry buffer (sized for it by a
//! patch to pingora, `vendor/README.md`); the rest of an upload streams unbuffered.
//! A body that cannot be parsed, or a multipart look-ahead with no token when the
//! request has none elsewhere, is a 400 — never the default Pod.
//! `Expect: 100-continue` is answered by the proxy when it reads a body.
//!
//! ## Request heads
//!
//! An HTTP/1 request without `Host` (HTTP/1.0 included) is a 400, and a request
//! head must arrive within `head_timeout_ms` of its first byte (default 30 s).
//!
//! ## Long polls at the edge
//!
//! [`edge_poll`]: for Pods that set `runner_queue_redis`, a `jobs/request` poll whose
//! `last_update` is the runner's current queue value is held in the proxy, with no
//! upstream connection, as the Pod's Workhorse would hold it: answered 204 with
//! `X-GitLab-Last-Update` when `edge_poll_hold_secs` end, forwarded at once when the
//! runner's queue key changes, forwarded (fail open) when that Redis is unreachable.
//!
//! ## Operations
//!
//! - [`console`]: the web console on the admin listener (`[console] enabled`), a
//!   page fed by events derived from `/metrics` and the Graph API's WebSocket.
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
pub mod config;
pub mod console;
pub mod decision;
pub mod edge_poll;
pub mod fast;
pub mod handover;
pub mod health;
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
