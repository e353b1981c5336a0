//! One inventory's run (cli-utils' `Applier.Run`): validate, merge the inventory,
//! apply, prune, set the inventory.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions, PropagationPolicy};
use serde_json::{Value, json};

use super::decode::{Group, decode, group_by_inventory};
use super::discovery::Resolved;
use super::{
    DELETION_DETACH, Error, FIELD_MANAGER, INVENTORY_LABEL, KubeCluster, ON_REMOVE_KEEP,
    OWNING_INVENTORY, ObjMetadata, is_status, message,
};

/// What happened to each object in one run (cli-utils' `InventoryManager`).
#[derive(Default)]
struct Outcome {
    applied: BTreeSet<ObjMetadata>,
    failed_applies: BTreeSet<ObjMetadata>,
    skipped_applies: BTreeSet<ObjMetadata>,
    failed_prunes: BTreeSet<ObjMetadata>,
    skipped_prunes: BTreeSet<ObjMetadata>,
    abandoned: BTreeSet<ObjMetadata>,
}

impl KubeCluster {
    /// The whole apply (see the module docs); every error as one message.
    pub(super) async fn apply_stream(&self, config: &str) -> Vec<String> {
        let groups = match decode(config).and_then(group_by_inventory) {
            Ok(g) => g,
            Err(e) => return vec![e.to_string()],
        };
        let mut errors = Vec::new();
        for group in groups {
            let name = group.inventory["metadata"]["name"]
                .as_str()
                .unwrap_or("")
                .to_owned();
            let before = errors.len();
            self.run_inventory(group, &mut errors).await;
            if errors.len() > before {
                tracing::warn!(inventory = %name, errors = errors.len() - before, "error when applying config");
            }
        }
        errors
    }

    /// cli-utils' `Applier.Run` for one inventory.
    async fn run_inventory(&self, group: Group, errors: &mut Vec<String>) {
        let Group {
            inventory,
            mut objects,
        } = group;
        let inv_id_obj = ObjMetadata::of(&inventory);
        let inv_id = inventory["metadata"]["labels"][INVENTORY_LABEL]
            .as_str()
            .unwrap_or("")
            .to_owned();

        // Validation, policy "exit early".
        let mut invalid = Vec::new();
        let mut resolved = Vec::with_capacity(objects.len());
        for object in std::iter::once(&inventory).chain(objects.iter()) {
            match self.validate(object).await {
                Ok(r) => resolved.push(r),
                Err(e) => invalid.push(e.to_string()),
            }
        }
        if inv_id_obj.namespace.is_empty() && invalid.is_empty() {
            invalid.push(
                Error::Invalid {
                    object: inv_id_obj.to_string(),
                    message: "metadata.namespace: Required value: namespace is required".into(),
                }
                .to_string(),
            );
        }
        if !invalid.is_empty() {
            errors.extend(invalid);
            return;
        }
        let resolved: Vec<Resolved> = resolved.into_iter().skip(1).collect();
        let mut work: Vec<(ObjMetadata, Value, Resolved)> = Vec::with_capacity(objects.len());
        for (mut object, r) in objects.drain(..).zip(resolved) {
            if !r.namespaced
                && let Some(m) = object["metadata"].as_object_mut()
            {
                m.remove("namespace");
            }
            // cli-utils' AddInventoryIDAnnotation.
            object["metadata"]["annotations"][OWNING_INVENTORY] = json!(inv_id);
            work.push((ObjMetadata::of(&object), object, r));
        }
        work.sort_by(|a, b| a.0.apply_order(&b.0));
        work.dedup_by(|a, b| a.0 == b.0);
        let local: BTreeSet<ObjMetadata> = work.iter().map(|w| w.0.clone()).collect();

        // Merge: the inventory lists the union before anything changes.
        let inventories: Api<ConfigMap> =
            Api::namespaced(self.client.clone(), &inv_id_obj.namespace);
        let (cluster_name, previous) = match self
            .merge_inventory(&inventories, &inventory, &inv_id, &local)
            .await
        {
            Ok(found) => found,
            Err(e) => {
                errors.push(e.to_string());
                return;
            }
        };

        // Apply.
        let mut outcome = Outcome::default();
        for (id, object, r) in &work {
            match self.apply_one(id, object, r, &inv_id).await {
                Ok(()) => {
                    outcome.applied.insert(id.clone());
                }
                Err(e @ Error::PolicyPrevented { .. }) => {
                    outcome.skipped_applies.insert(id.clone());
                    errors.push(e.to_string());
                }
                Err(e) => {
                    outcome.failed_applies.insert(id.clone());
                    errors.push(e.to_string());
                }
            }
        }

        // Prune what the inventory listed and the new set lacks, in reverse order.
        let mut prune: Vec<&ObjMetadata> = previous.difference(&local).collect();
        prune.sort_by(|a, b| b.apply_order(a));
        let local_namespaces: BTreeSet<&str> = local
            .iter()
            .map(|id| id.namespace.as_str())
            .chain(std::iter::once(inv_id_obj.namespace.as_str()))
            .collect();
        for id in prune {
            if id.group.is_empty()
                && id.kind == "Namespace"
                && local_namespaces.contains(id.name.as_str())
            {
                // cli-utils' LocalNamespacesFilter: a namespace still in use stays.
                outcome.skipped_prunes.insert(id.clone());
                continue;
            }
            if let Err(e) = self.prune_one(id, &inv_id, &mut outcome).await {
                outcome.failed_prunes.insert(id.clone());
                errors.push(e.to_string());
            }
        }

        // Set the inventory to what is now in the cluster.
        let mut keep: BTreeSet<ObjMetadata> = outcome.applied.clone();
        for set in [&outcome.failed_applies, &outcome.skipped_applies] {
            keep.extend(set.intersection(&previous).cloned());
        }
        for set in [&outcome.failed_prunes, &outcome.skipped_prunes] {
            keep.extend(set.intersection(&previous).cloned());
        }
        for id in &outcome.abandoned {
            keep.remove(id);
        }
        if let Err(e) = self
            .write_inventory(&inventories, &cluster_name, &keep)
            .await
        {
            errors.push(e.to_string());
        }
    }

    /// cli-utils' validation of one object; its API resource.
    async fn validate(&self, object: &Value) -> Result<Resolved, Error> {
        let id = ObjMetadata::of(object);
        let invalid = |message: String| Error::Invalid {
            object: id.to_string(),
            message,
        };
        if id.kind.is_empty() {
            return Err(invalid("kind: Required value: kind is required".into()));
        }
        if id.name.is_empty() {
            return Err(invalid(
                "metadata.name: Required value: name is required".into(),
            ));
        }
        let api_version = object["apiVersion"].as_str().unwrap_or("");
        let r = self
            .resolve(api_version, &id.kind)
            .await
            .map_err(&invalid)?;
        if r.namespaced && id.namespace.is_empty() {
            return Err(invalid(
                "metadata.namespace: Required value: namespace is required".into(),
            ));
        }
        if !r.namespaced && !id.namespace.is_empty() {
            return Err(invalid(format!(
                "metadata.namespace: Invalid value: {:?}: namespace must be empty",
                id.namespace
            )));
        }
        Ok(r)
    }

    /// Inventory policy check, then server-side apply.
    async fn apply_one(
        &self,
        id: &ObjMetadata,
        object: &Value,
        r: &Resolved,
        inv_id: &str,
    ) -> Result<(), Error> {
        let api = self.api(r, &id.namespace);
        // cli-utils' InventoryPolicyApplyFilter (policy MustMatch).
        match api.get_opt(&id.name).await {
            Ok(None) => {}
            Ok(Some(live)) => {
                let owner = live
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(OWNING_INVENTORY));
                match owner {
                    Some(o) if o == inv_id => {}
                    Some(_) => {
                        return Err(Error::PolicyPrevented {
                            object: id.to_string(),
                            status: "NoMatch",
                        });
                    }
                    None => {
                        return Err(Error::PolicyPrevented {
                            object: id.to_string(),
                            status: "Empty",
                        });
                    }
                }
            }
            Err(e) => {
                return Err(Error::Apply {
                    object: id.to_string(),
                    message: format!("failed to get current object from cluster: {}", message(&e)),
                });
            }
        }
        let params = PatchParams::apply(FIELD_MANAGER).force();
        api.patch(&id.name, &params, &Patch::Apply(object))
            .await
            .map(|_| ())
            .map_err(|e| Error::Apply {
                object: id.to_string(),
                message: message(&e),
            })
    }

    /// cli-utils' prune of one object (filters, then delete).
    async fn prune_one(
        &self,
        id: &ObjMetadata,
        inv_id: &str,
        outcome: &mut Outcome,
    ) -> Result<(), Error> {
        let fail = |message: String| Error::Prune {
            object: id.to_string(),
            message,
        };
        let Some(r) = self
            .resolve_group_kind(&id.group, &id.kind)
            .await
            .map_err(fail)?
        else {
            // Not served any more: nothing to delete (dropped from the inventory).
            return Ok(());
        };
        let api = self.api(&r, &id.namespace);
        let Some(live) = api.get_opt(&id.name).await.map_err(|e| fail(message(&e)))? else {
            return Ok(());
        };
        let annotations = live.metadata.annotations.clone().unwrap_or_default();
        let abandon = [DELETION_DETACH, ON_REMOVE_KEEP]
            .iter()
            .any(|(k, v)| annotations.get(*k).is_some_and(|a| a == v));
        if abandon {
            // cli-utils' PreventRemoveFilter: keep the object, drop the annotation.
            if annotations
                .get(OWNING_INVENTORY)
                .is_some_and(|o| o == inv_id)
            {
                let patch = json!({"metadata": {"annotations": {OWNING_INVENTORY: null}}});
                api.patch(&id.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(|e| fail(message(&e)))?;
            }
            outcome.abandoned.insert(id.clone());
            return Ok(());
        }
        if annotations.get(OWNING_INVENTORY).map(String::as_str) != Some(inv_id) {
            // cli-utils' InventoryPolicyPruneFilter (MustMatch): not ours to delete.
            tracing::debug!(object = %id, "prune skipped: another inventory owns it");
            outcome.skipped_prunes.insert(id.clone());
            return Ok(());
        }
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            preconditions: live.metadata.uid.clone().map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&id.name, &params).await {
            Ok(_) => Ok(()),
            Err(e) if is_status(&e, 404) => Ok(()),
            Err(e) => Err(fail(message(&e))),
        }
    }
}
