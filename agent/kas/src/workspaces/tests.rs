//! Unit tests of the Workspaces server's request parsing.

use http::header;
use http::{HeaderMap, HeaderValue};

use super::authorize::query_escape;
use super::request::{agent_of, bearer, is_upgrade, workspace_name};

#[test]
fn names_and_agents_from_hosts() {
    assert_eq!(
        workspace_name("60001-workspace-4-1-n8dl59.workspaces.localtest.me:8443").as_deref(),
        Some("workspace-4-1-n8dl59")
    );
    assert_eq!(workspace_name("nodash.zone"), None);
    assert_eq!(agent_of("workspace-4-1-n8dl59"), Some(4));
    assert_eq!(agent_of("workspace-17-230-abc"), Some(17));
    for bad in [
        "workspace-x-1-a",
        "workspace-4-1",
        "other-4-1-a",
        "workspace--1-a",
        // Found by `fuzz/fuzz_targets/workspaces_host.rs`: read as agent 8, a name
        // Rails never writes.
        "workspace-08-2300-abc",
        "workspace-+8-1-a",
        "workspace-0-1-a",
    ] {
        assert_eq!(agent_of(bad), None, "{bad}");
    }
}

#[test]
fn bearer_tokens_and_upgrades() {
    let mut h = HeaderMap::new();
    assert_eq!(bearer(&h), None);
    h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic abc"));
    assert_eq!(bearer(&h), None);
    h.insert(
        header::AUTHORIZATION,
        HeaderValue::from_static("bearer glpat-x"),
    );
    assert_eq!(bearer(&h).as_deref(), Some("glpat-x"));
    assert!(!is_upgrade(&h));
    h.insert(
        header::CONNECTION,
        HeaderValue::from_static("keep-alive, Upgrade"),
    );
    assert!(is_upgrade(&h));
}

#[test]
fn hosts_are_escaped_for_the_query() {
    assert_eq!(query_escape("60001-w.z:8443"), "60001-w.z%3A8443");
}
