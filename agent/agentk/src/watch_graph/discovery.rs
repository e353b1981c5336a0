//! Which group/version/resources a `WatchGraph` request watches (GitLab's Graph API
//! design, "queries" and "version selection"): every resource discovery lists (never a subresource,
//! never the co-habitation groups `extensions` and `events.k8s.io`, only resources
//! that can be listed and watched) runs through the queries in order, the first match
//! deciding; then one version per group+resource: the newest stable (`v\d+`), else
//! the newest unstable, in natural order (`v2` < `v10`).

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use podgate_agent::graph::cel::ResourceVars;
use podgate_agent::graph::request::{Compiled, CompiledQuery};

/// Groups never watched: their resources co-habit with others (GitLab's Graph API design).
const SKIPPED_GROUPS: &[&str] = &["extensions", "events.k8s.io"];

/// One resource as discovery lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Discovered {
    pub(crate) group: String,
    pub(crate) version: String,
    pub(crate) resource: String,
    pub(crate) kind: String,
    pub(crate) namespaced: bool,
    pub(crate) verbs: Vec<String>,
}

/// A resource chosen for watching, with the query that chose it.
#[derive(Debug)]
pub(crate) struct Gvr {
    pub(crate) group: Arc<str>,
    pub(crate) version: Arc<str>,
    pub(crate) resource: Arc<str>,
    pub(crate) kind: String,
    pub(crate) namespaced: bool,
    /// Index into the request's queries.
    pub(crate) query: usize,
}

/// What discovery gave, and what failed (each failure a `DISCOVERY_FAILED` warning).
pub(crate) struct DiscoveryResult {
    pub(crate) resources: Vec<Discovered>,
    pub(crate) failures: Vec<String>,
}

/// Ask the API server for every group, version and resource. A group version that
/// cannot be read is reported and skipped; the rest goes on.
pub(crate) async fn discover(client: &kube::Client) -> DiscoveryResult {
    let mut resources = Vec::new();
    let mut failures = Vec::new();
    let mut group_versions: Vec<(String, String)> = Vec::new();
    match client.list_core_api_versions().await {
        Ok(v) => group_versions.extend(v.versions.into_iter().map(|v| (String::new(), v))),
        Err(e) => failures.push(format!("listing core API versions: {e}")),
    }
    match client.list_api_groups().await {
        Ok(groups) => {
            for g in groups.groups {
                if SKIPPED_GROUPS.contains(&g.name.as_str()) {
                    continue;
                }
                for v in g.versions {
                    group_versions.push((g.name.clone(), v.version));
                }
            }
        }
        Err(e) => failures.push(format!("listing API groups: {e}")),
    }
    for (group, version) in group_versions {
        let list = if group.is_empty() {
            client.list_core_api_resources(&version).await
        } else {
            client
                .list_api_group_resources(&format!("{group}/{version}"))
                .await
        };
        match list {
            Ok(list) => resources.extend(list.resources.into_iter().map(|r| Discovered {
                group: group.clone(),
                version: version.clone(),
                resource: r.name,
                kind: r.kind,
                namespaced: r.namespaced,
                verbs: r.verbs,
            })),
            Err(e) => {
                let gv = if group.is_empty() {
                    version.clone()
                } else {
                    format!("{group}/{version}")
                };
                failures.push(format!("listing resources of {gv}: {e}"));
            }
        }
    }
    DiscoveryResult {
        resources,
        failures,
    }
}

/// The resources to watch: queries in order, first match decides; then version
/// selection per group+resource. Errors evaluating a resource expression are
/// returned as warnings' messages and the resource is skipped by that query.
pub(crate) fn select(
    request: &Compiled,
    discovered: &[Discovered],
    errors: &mut Vec<String>,
) -> Vec<Gvr> {
    // (group, resource) → candidates (version, index of query, discovered entry).
    let mut candidates: HashMap<(&str, &str), Vec<(&Discovered, usize)>> = HashMap::new();
    for d in discovered {
        if d.resource.contains('/') || SKIPPED_GROUPS.contains(&d.group.as_str()) {
            continue;
        }
        if !(d.verbs.iter().any(|v| v == "list") && d.verbs.iter().any(|v| v == "watch")) {
            continue;
        }
        let vars = ResourceVars {
            group: &d.group,
            version: &d.version,
            resource: &d.resource,
            namespaced: d.namespaced,
        };
        for (i, q) in request.queries.iter().enumerate() {
            let (expr, include) = match q {
                CompiledQuery::Include { resource, .. } => (resource, true),
                CompiledQuery::Exclude { resource } => (resource, false),
            };
            match expr.eval_resource(&vars) {
                Ok(true) => {
                    if include {
                        candidates
                            .entry((&d.group, &d.resource))
                            .or_default()
                            .push((d, i));
                    }
                    break;
                }
                Ok(false) => {}
                Err(e) => errors.push(format!(
                    "queries[{i}] on {}/{}/{}: {e}",
                    d.group, d.version, d.resource
                )),
            }
        }
    }
    let mut chosen: Vec<Gvr> = candidates
        .into_values()
        .filter_map(|mut c| {
            c.sort_by(|a, b| version_order(&a.0.version, &b.0.version));
            let (d, query) = c.pop()?;
            Some(Gvr {
                group: d.group.as_str().into(),
                version: d.version.as_str().into(),
                resource: d.resource.as_str().into(),
                kind: d.kind.clone(),
                namespaced: d.namespaced,
                query,
            })
        })
        .collect();
    chosen.sort_by(|a, b| (&a.group, &a.resource).cmp(&(&b.group, &b.resource)));
    chosen
}

fn is_stable(v: &str) -> bool {
    v.len() > 1 && v.starts_with('v') && v[1..].bytes().all(|b| b.is_ascii_digit())
}

/// Orders versions so the one to pick is greatest: any stable above any unstable;
/// within each, natural order (digit runs compared as numbers: `v2` < `v10`,
/// `v1beta2` < `v1beta10`).
pub(crate) fn version_order(a: &str, b: &str) -> Ordering {
    is_stable(a).cmp(&is_stable(b)).then_with(|| natural(a, b))
}

fn natural(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        match (a.first(), b.first()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let na = a.iter().take_while(|c| c.is_ascii_digit()).count();
                let nb = b.iter().take_while(|c| c.is_ascii_digit()).count();
                let (da, db) = (trim_zeros(&a[..na]), trim_zeros(&b[..nb]));
                let o = da.len().cmp(&db.len()).then_with(|| da.cmp(db));
                if o != Ordering::Equal {
                    return o;
                }
                a = &a[na..];
                b = &b[nb..];
            }
            (Some(x), Some(y)) => {
                if x != y {
                    return x.cmp(y);
                }
                a = &a[1..];
                b = &b[1..];
            }
        }
    }
}

fn trim_zeros(d: &[u8]) -> &[u8] {
    let z = d.iter().take_while(|c| **c == b'0').count();
    &d[z.min(d.len().saturating_sub(1))..]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn best(versions: &[&str]) -> String {
        let mut v: Vec<&str> = versions.to_vec();
        v.sort_by(|a, b| version_order(a, b));
        v.last().map(|s| s.to_string()).unwrap_or_default()
    }

    #[test]
    fn newest_stable_wins_over_any_unstable() {
        assert_eq!(best(&["v1", "v2beta1", "v1beta2"]), "v1");
        assert_eq!(best(&["v1", "v2", "v10beta1"]), "v2");
        assert_eq!(best(&["v2", "v10", "v9"]), "v10");
    }

    #[test]
    fn newest_unstable_in_natural_order_when_no_stable() {
        assert_eq!(best(&["v2beta1", "v10beta1"]), "v10beta1");
        assert_eq!(best(&["v1beta2", "v1beta10", "v1alpha1"]), "v1beta10");
    }
}
