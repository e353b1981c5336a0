//! Discovery: where the API server serves a kind, cached per [`KubeCluster`].

use kube::api::ApiResource;
use kube::core::GroupVersion;
use kube::discovery::Scope;

use super::{KubeCluster, is_status, message};

/// A kind the API server serves: where and how.
#[derive(Clone)]
pub(super) struct Resolved {
    /// The resource to address it by.
    pub(super) resource: ApiResource,
    /// Whether its objects live in a namespace.
    pub(super) namespaced: bool,
}

impl KubeCluster {
    /// Where `kind` of `api_version` is served (discovery of the whole group
    /// version, cached: one request per group version, however many kinds).
    pub(super) async fn resolve(&self, api_version: &str, kind: &str) -> Result<Resolved, String> {
        let key = (api_version.to_owned(), kind.to_owned());
        if let Some(r) = self.by_version.lock().expect("cache").get(&key) {
            return Ok(r.clone());
        }
        let _one_at_a_time = self.discovering.lock().await;
        if let Some(r) = self.by_version.lock().expect("cache").get(&key) {
            return Ok(r.clone());
        }
        let unknown = || format!("unknown resource type: \"{api_version}, Kind={kind}\"");
        let gv: GroupVersion = api_version.parse().map_err(|_| unknown())?;
        let api_group = match kube::discovery::pinned_group(&self.client, &gv).await {
            Ok(g) => g,
            Err(kube::Error::Discovery(_)) => return Err(unknown()),
            Err(e) if is_status(&e, 404) => return Err(unknown()),
            Err(e) => return Err(format!("discovering {api_version}: {}", message(&e))),
        };
        let mut cache = self.by_version.lock().expect("cache");
        for (resource, caps) in api_group.versioned_resources(&gv.version) {
            let r = Resolved {
                namespaced: caps.scope == Scope::Namespaced,
                resource,
            };
            cache.insert((api_version.to_owned(), r.resource.kind.clone()), r);
        }
        cache.get(&key).cloned().ok_or_else(unknown)
    }

    /// Where `kind` of `group` is served in the group's preferred version; `None`
    /// when it is not served (cli-utils skips such prunes: `meta.IsNoMatchError`).
    pub(super) async fn resolve_group_kind(
        &self,
        group: &str,
        kind: &str,
    ) -> Result<Option<Resolved>, String> {
        let key = (group.to_owned(), kind.to_owned());
        if let Some(r) = self.by_group.lock().expect("cache").get(&key) {
            return Ok(Some(r.clone()));
        }
        let _one_at_a_time = self.discovering.lock().await;
        if let Some(r) = self.by_group.lock().expect("cache").get(&key) {
            return Ok(Some(r.clone()));
        }
        let api_group = match kube::discovery::group(&self.client, group).await {
            Ok(g) => g,
            Err(kube::Error::Discovery(_)) => return Ok(None),
            Err(e) if is_status(&e, 404) => return Ok(None),
            Err(e) => return Err(format!("discovering {group} {kind}: {}", message(&e))),
        };
        let Some((resource, caps)) = api_group.recommended_kind(kind) else {
            return Ok(None);
        };
        let r = Resolved {
            resource,
            namespaced: caps.scope == Scope::Namespaced,
        };
        self.by_group.lock().expect("cache").insert(key, r.clone());
        Ok(Some(r))
    }
}
