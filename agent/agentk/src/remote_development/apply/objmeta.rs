//! cli-utils' `ObjMetadata`: an object's identity in an inventory, its key format
//! and the kind order applies and prunes follow.

use std::fmt;

use serde_json::Value;

use super::Error;

/// An object's identity in an inventory: cli-utils' `ObjMetadata`
/// (`pkg/object/objmetadata.go`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjMetadata {
    /// Namespace (`""` for cluster-scoped objects).
    pub namespace: String,
    /// Name.
    pub name: String,
    /// API group (`""` for the core group).
    pub group: String,
    /// Kind.
    pub kind: String,
}

/// RBAC kinds, whose names may hold colons (stored as `__`).
fn is_rbac(group: &str, kind: &str) -> bool {
    group == "rbac.authorization.k8s.io"
        && matches!(
            kind,
            "Role" | "ClusterRole" | "RoleBinding" | "ClusterRoleBinding"
        )
}

impl ObjMetadata {
    /// The identity of `object` (apiVersion's group, kind, namespace, name).
    pub fn of(object: &Value) -> ObjMetadata {
        let api_version = object["apiVersion"].as_str().unwrap_or("");
        ObjMetadata {
            namespace: object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_owned(),
            name: object["metadata"]["name"].as_str().unwrap_or("").to_owned(),
            group: group_of(api_version).to_owned(),
            kind: object["kind"].as_str().unwrap_or("").to_owned(),
        }
    }

    /// Parse an inventory key (cli-utils' `ParseObjMetadata`: namespace up to the
    /// first `_`, kind after the last, group before it, the rest the name).
    pub fn parse(s: &str) -> Result<ObjMetadata, Error> {
        let bad = || Error::BadInventoryEntry(s.to_owned());
        let (namespace, rest) = s.split_once('_').ok_or_else(bad)?;
        let (rest, kind) = rest.rsplit_once('_').ok_or_else(bad)?;
        let (name, group) = rest.rsplit_once('_').ok_or_else(bad)?;
        let name = name.replace("__", ":");
        if name.contains('_') {
            return Err(Error::BadInventoryEntry(format!(
                "too many fields within: {rest}"
            )));
        }
        Ok(ObjMetadata {
            namespace: namespace.to_owned(),
            name,
            group: group.to_owned(),
            kind: kind.to_owned(),
        })
    }

    /// cli-utils' sort position of the kind (`pkg/ordering/sort.go`): the listed
    /// kinds first, in order; `ValidatingWebhookConfiguration` last; others between.
    pub(super) fn kind_rank(&self) -> i32 {
        const FIRST: &[(&str, &str)] = &[
            ("", "Namespace"),
            ("", "ResourceQuota"),
            ("storage.k8s.io", "StorageClass"),
            ("apiextensions.k8s.io", "CustomResourceDefinition"),
            (
                "admissionregistration.k8s.io",
                "MutatingWebhookConfiguration",
            ),
            ("", "ServiceAccount"),
            ("extensions", "PodSecurityPolicy"),
            ("policy", "PodSecurityPolicy"),
            ("rbac.authorization.k8s.io", "Role"),
            ("rbac.authorization.k8s.io", "ClusterRole"),
            ("rbac.authorization.k8s.io", "RoleBinding"),
            ("rbac.authorization.k8s.io", "ClusterRoleBinding"),
            ("", "ConfigMap"),
            ("", "Secret"),
            ("", "Service"),
            ("", "LimitRange"),
            ("scheduling.k8s.io", "PriorityClass"),
            ("extensions", "Deployment"),
            ("apps", "Deployment"),
            ("apps", "StatefulSet"),
            ("batch", "CronJob"),
            ("policy", "PodDisruptionBudget"),
        ];
        let me = (self.group.as_str(), self.kind.as_str());
        if let Some(i) = FIRST.iter().position(|gk| *gk == me) {
            return i as i32 - FIRST.len() as i32;
        }
        if me
            == (
                "admissionregistration.k8s.io",
                "ValidatingWebhookConfiguration",
            )
        {
            return 1;
        }
        0
    }

    /// cli-utils' order: kind rank, then group, kind, namespace, name.
    pub(super) fn apply_order(&self, other: &ObjMetadata) -> std::cmp::Ordering {
        (
            self.kind_rank(),
            &self.group,
            &self.kind,
            &self.namespace,
            &self.name,
        )
            .cmp(&(
                other.kind_rank(),
                &other.group,
                &other.kind,
                &other.namespace,
                &other.name,
            ))
    }
}

impl fmt::Display for ObjMetadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = if is_rbac(&self.group, &self.kind) {
            self.name.replace(':', "__")
        } else {
            self.name.clone()
        };
        write!(
            f,
            "{}_{}_{}_{}",
            self.namespace, name, self.group, self.kind
        )
    }
}

/// `apps` of `apps/v1`; `""` of `v1`.
fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("")
}
