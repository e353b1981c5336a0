//! The pages of the Pod's own namespaces: its group `team-<pod>` (`/team-<pod>/…`,
//! a project's page, an issue, `.json` and `.atom` variants), any more groups
//! `team-<pod>-<name>` it creates, and its organization `org-<pod>`
//! (`/o/org-<pod>/…`), which `podgate up` claims for the Pod at the Topology
//! Service. The path rules of a router in front must bring them here: a
//! page of another Pod's namespace is counted as a misroute and answered 404, as
//! GitLab answers a namespace it does not have.

use hyper::{Response, StatusCode};
use podgate_tokens::PodId;
use serde_json::json;

use super::{Body, message, reply};
use crate::pod_sim::Shared;

/// The top-level group Pod `pod` owns.
pub fn namespace(pod: PodId) -> String {
    format!("team-{pod}")
}

/// The organization Pod `pod` owns.
pub fn organization(pod: PodId) -> String {
    format!("org-{pod}")
}

/// The Pod a `team-<n>`, `team-<n>-<name>` or `org-<n>` name belongs to (GitLab
/// finds a namespace by its path case-insensitively).
fn owner(name: &str, prefix: &str) -> Option<PodId> {
    let name = name.split('.').next().unwrap_or(name).to_ascii_lowercase();
    let pod = name.strip_prefix(prefix)?.split('-').next()?;
    pod.parse().ok().and_then(PodId::new)
}

/// The page of `path`, when it is one of a Pod's namespaces' (`None`: not a page
/// path).
pub(crate) fn route(shared: &Shared, path: &str) -> Option<(&'static str, Response<Body>)> {
    let mut segments = path.trim_start_matches('/').split('/');
    let first = segments.next()?;
    let (pod, kind) = if first == "o" {
        (owner(segments.next()?, "org-")?, "organization_page")
    } else {
        (owner(first, "team-")?, "namespace_page")
    };
    let this = shared.state.pod();
    if pod != this {
        shared.metrics.misrouted.inc();
        tracing::warn!(this_pod = %this, owner = %pod, path, "misrouted request: a page of another Pod's namespace");
        return Some((kind, message(StatusCode::NOT_FOUND, "404 Not Found")));
    }
    Some((
        kind,
        reply(StatusCode::OK, json!({"pod": this.get(), "page": path})),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_belongs_to_the_pod_it_carries() {
        let pod = |n| PodId::new(n);
        assert_eq!(owner("team-3", "team-"), pod(3));
        assert_eq!(owner("Team-3.json", "team-"), pod(3));
        assert_eq!(owner("team-3-late", "team-"), pod(3));
        assert_eq!(owner("team-31", "team-"), pod(31));
        assert_eq!(owner("org-2", "org-"), pod(2));
        assert_eq!(owner("team-x", "team-"), None);
        assert_eq!(owner("team-0", "team-"), None);
        assert_eq!(owner("fresh-3", "team-"), None);
    }
}
