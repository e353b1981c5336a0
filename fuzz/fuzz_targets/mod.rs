//! The fuzz targets, one module per parser that sees network input (`README.md`
//! lists each and the property it checks). Each has `run(&[u8])`, which panics on a
//! violated property; the `fuzz` binary (`src/main.rs`) runs the one
//! `PODGATE_FUZZ_TARGET` names.

pub mod graph_request;
pub mod graph_wire;
pub mod graph_ws;
pub mod proxy_chunked;
pub mod proxy_form;
pub mod proxy_json;
pub mod proxy_multipart;
pub mod proxy_path;
pub mod proxy_request_head;
pub mod proxy_response_head;
pub mod proxy_route;
pub mod token_classify;
pub mod token_gitlab;
pub mod token_jwt;
pub mod workspaces_host;
pub mod workspaces_reconcile;

/// A target's check of one input: panics on a violated property.
pub type Target = fn(&[u8]);

/// Every target by name, in the order `scripts/fuzz.sh` runs them.
pub const TARGETS: &[(&str, Target)] = &[
    ("graph_request", graph_request::run),
    ("graph_wire", graph_wire::run),
    ("graph_ws", graph_ws::run),
    ("proxy_chunked", proxy_chunked::run),
    ("proxy_form", proxy_form::run),
    ("proxy_json", proxy_json::run),
    ("proxy_multipart", proxy_multipart::run),
    ("proxy_path", proxy_path::run),
    ("proxy_request_head", proxy_request_head::run),
    ("proxy_response_head", proxy_response_head::run),
    ("proxy_route", proxy_route::run),
    ("token_classify", token_classify::run),
    ("token_gitlab", token_gitlab::run),
    ("token_jwt", token_jwt::run),
    ("workspaces_host", workspaces_host::run),
    ("workspaces_reconcile", workspaces_reconcile::run),
];

/// The target called `name`.
pub fn by_name(name: &str) -> Option<Target> {
    TARGETS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, run)| *run)
}
