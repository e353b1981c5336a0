//! The cluster as the `remote_development` reconciler changes it, through kube-rs:
//! GitLab's `config_to_apply` streams applied as GitLab's agentk applies them
//! (`internal/module/remote_development/agent/k8s/client.go`), which is cli-utils'
//! `Applier.Run` (`sigs.k8s.io/cli-utils` `pkg/apply/applier.go`) once per inventory.
//!
//! [`KubeCluster::apply`](super::ports::Cluster::apply):
//!
//! 1. **Decode** the multi-document YAML (empty documents skipped, `…List` kinds
//!    flattened, as kubectl's resource builder in local mode).
//! 2. **Group** by inventory: every object labelled
//!    `cli-utils.sigs.k8s.io/inventory-id` (an inventory ConfigMap) starts a group,
//!    named by the object's name; every other object joins the group its
//!    `config.k8s.io/owning-inventory` annotation names. agentk's errors: `no
//!    inventory found` (no inventory object at all), `no owning inventory found` (an
//!    object without the annotation); either fails the whole stream before anything
//!    is written.
//! 3. Per inventory, in the order the inventories appear, errors collected and every
//!    inventory tried (agentk joins the errors of all of them):
//!    - **validate** (policy "exit early": any problem stops this inventory before
//!      it touches the cluster; cli-utils' `pkg/object/validation` words): kind,
//!      name, the kind known to the API server (found by discovery and cached),
//!      namespace required for namespaced kinds and empty for cluster-scoped ones;
//!    - **merge** the inventory: the inventory ConfigMap (found in its namespace by
//!      its inventory-id label, `found N inventory objects with inventory id X` when
//!      several) gets the union of what it listed and the new set in `data`, keys in
//!      cli-utils' `ObjMetadata` format `<namespace>_<name>_<group>_<kind>` (values
//!      empty: status policy "none"); created from the sent ConfigMap when missing;
//!    - **apply** each object, in cli-utils' kind order (`pkg/ordering/sort.go`:
//!      Namespace, ResourceQuota, …, ServiceAccount, …, ConfigMap, Secret, Service,
//!      …, Deployment, …; others after), with the owning-inventory annotation set
//!      to the inventory id, by server-side apply (field manager `agentk`,
//!      conflicts forced). The inventory policy is cli-utils' default, "must
//!      match": an object that exists without this inventory's annotation (or with
//!      another's) is not touched (`inventory policy prevented actuation (strategy:
//!      Apply, status: NoMatch, policy: MustMatch)`);
//!    - **prune** (reverse kind order) what the inventory listed that the new set
//!      lacks: deleted (propagation `Background`, precondition on its uid) when its
//!      annotation names this inventory; left alone when it names another or none
//!      (kept in the inventory, as cli-utils keeps skipped prunes); abandoned (the
//!      annotation removed, dropped from the inventory) when annotated
//!      `client.lifecycle.config.k8s.io/deletion: detach` or
//!      `cli-utils.sigs.k8s.io/on-remove: keep`; already gone is fine;
//!    - **set** the inventory to what is now in the cluster (cli-utils'
//!      `DeleteOrUpdateInvTask`): applied objects, plus failed or skipped ones the
//!      inventory listed before, plus failed or skipped prunes, minus abandoned ones.
//!
//! Errors are worded as cli-utils logs them (`apply errored (object: <id>):
//! <apiserver message>`, …), the API server's own message included. Unlike agentk
//! 2023 (which reported only cli-utils' `ErrorType` events), failed and skipped
//! applies are reported too: GitLab shows them as the workspace's error. The
//! inventory ConfigMap is re-read and written again when someone else wrote it in
//! between (409), where cli-utils would fail the run: two applies of one workspace
//! can overlap.
//!
//! Namespaces ([`super::ports::Cluster`]'s other methods): created with a plain
//! create (AlreadyExists is fine, as agentk's reconciler treats it), deleted with
//! default options (agentk's `DeleteNamespace`; NotFound is fine, and so is the
//! Conflict the API server answers while the namespace is terminating, which agentk
//! 2023 would have reported as an error on every cycle), looked up with a get.
//!
//! Layout: `objmeta.rs` (cli-utils' object identity and kind order), `decode.rs`
//! (the YAML stream and its grouping by inventory), `discovery.rs` (kinds the API
//! server serves, cached), `inventory.rs` (the inventory ConfigMap), `run.rs`
//! (validate, apply and prune one inventory), `namespaces.rs` (the [`Cluster`]
//! impl: applies and namespaces); unit tests in `apply/tests.rs`.

mod decode;
mod discovery;
mod inventory;
mod namespaces;
mod objmeta;
mod run;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::api::{Api, DynamicObject};
use thiserror::Error;

use self::discovery::Resolved;
pub use self::objmeta::ObjMetadata;
#[cfg(doc)]
use super::ports::Cluster;

/// The field manager of every server-side apply (GitLab's `modagent.FieldManager`).
pub const FIELD_MANAGER: &str = "agentk";
/// The label that makes a ConfigMap an inventory (cli-utils' `common.InventoryLabel`).
pub const INVENTORY_LABEL: &str = "cli-utils.sigs.k8s.io/inventory-id";
/// The annotation naming an object's inventory (cli-utils' `OwningInventoryKey`).
pub const OWNING_INVENTORY: &str = "config.k8s.io/owning-inventory";
/// cli-utils' `PreventRemoveFilter` annotations: the object is abandoned, not pruned.
const DELETION_DETACH: (&str, &str) = ("client.lifecycle.config.k8s.io/deletion", "detach");
const ON_REMOVE_KEEP: (&str, &str) = ("cli-utils.sigs.k8s.io/on-remove", "keep");
/// How often a conflicting inventory write is retried.
const INVENTORY_WRITE_TRIES: usize = 5;

/// Why an apply (or part of one) failed; each becomes one message.
#[derive(Debug, Error)]
pub enum Error {
    /// No object of the stream is an inventory (agentk's `noInventoryFoundErr`).
    #[error("no inventory found")]
    NoInventory,
    /// An object lacks `config.k8s.io/owning-inventory` (agentk's
    /// `noOwningInventoryFoundErr`).
    #[error("no owning inventory found")]
    NoOwningInventory,
    /// An object's owning inventory is not in the stream (agentk would crash).
    #[error(
        "no owning inventory found: {object} names inventory {inventory:?}, which is not in the config"
    )]
    UnknownInventory {
        /// The object (`ObjMetadata` format).
        object: String,
        /// The inventory it names.
        inventory: String,
    },
    /// A document is not YAML, or not an object.
    #[error("error decoding config_to_apply document {document}: {message}")]
    Decode {
        /// Which document, counting from 1.
        document: usize,
        /// What is wrong.
        message: String,
    },
    /// cli-utils' validation (`pkg/object/validation`).
    #[error("invalid object: {object:?}: {message}")]
    Invalid {
        /// The object (`ObjMetadata` format).
        object: String,
        /// What is wrong.
        message: String,
    },
    /// A stored inventory entry does not parse (cli-utils' `ParseObjMetadata`).
    #[error("unable to parse stored object metadata: {0}")]
    BadInventoryEntry(String),
    /// Reading or writing the inventory ConfigMap failed.
    #[error("{0}")]
    Inventory(String),
    /// Applying one object failed.
    #[error("apply errored (object: {object}): {message}")]
    Apply {
        /// The object (`ObjMetadata` format).
        object: String,
        /// The API server's message.
        message: String,
    },
    /// cli-utils' inventory policy kept an object from being applied.
    #[error(
        "apply filtered (filter: InventoryPolicyApplyFilter, object: {object}): inventory policy prevented actuation (strategy: Apply, status: {status}, policy: MustMatch)"
    )]
    PolicyPrevented {
        /// The object (`ObjMetadata` format).
        object: String,
        /// `Empty` (no annotation) or `NoMatch` (another inventory's).
        status: &'static str,
    },
    /// Pruning one object failed.
    #[error("error deleting object (object: {object:?}): {message}")]
    Prune {
        /// The object (`ObjMetadata` format).
        object: String,
        /// The API server's message.
        message: String,
    },
    /// A namespace operation failed.
    #[error("{0}")]
    Namespace(String),
}

/// The cluster, through kube-rs. Cheap to clone; clones share the discovery cache.
#[derive(Clone)]
pub struct KubeCluster {
    client: kube::Client,
    /// Discovery results by (apiVersion, kind) and by (group, kind) (the preferred
    /// version, for prunes, which know only the group).
    by_version: Arc<Mutex<HashMap<(String, String), Resolved>>>,
    by_group: Arc<Mutex<HashMap<(String, String), Resolved>>>,
    /// Held while asking discovery, so that many applies starting at once (a full
    /// reconcile of many workspaces) ask once per kind, not once each.
    discovering: Arc<tokio::sync::Mutex<()>>,
}

/// The API server's message of a kube-rs error (client-go's `StatusError.Error()`
/// is its status message), or the error itself.
fn message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if !s.message.is_empty() => s.message.clone(),
        other => other.to_string(),
    }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

impl KubeCluster {
    /// Apply and look up through `client`.
    pub fn new(client: kube::Client) -> KubeCluster {
        KubeCluster {
            client,
            by_version: Arc::default(),
            by_group: Arc::default(),
            discovering: Arc::default(),
        }
    }

    /// The API of `r`'s objects in `namespace` (all of them when cluster-scoped).
    fn api(&self, r: &Resolved, namespace: &str) -> Api<DynamicObject> {
        if r.namespaced {
            Api::namespaced_with(self.client.clone(), namespace, &r.resource)
        } else {
            Api::all_with(self.client.clone(), &r.resource)
        }
    }
}
