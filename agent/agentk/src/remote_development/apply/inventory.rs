//! The inventory ConfigMap: found by its inventory-id label, merged before an apply
//! and set to what is in the cluster after it (cli-utils' `ClusterClient`).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams};
use serde_json::Value;

use super::{
    Error, INVENTORY_LABEL, INVENTORY_WRITE_TRIES, KubeCluster, ObjMetadata, is_status, message,
};

impl KubeCluster {
    /// cli-utils' `ClusterClient.Merge`: find the inventory ConfigMap by label,
    /// store the union, create it when missing. Returns its name in the cluster and
    /// the objects it listed before.
    pub(super) async fn merge_inventory(
        &self,
        api: &Api<ConfigMap>,
        local_inventory: &Value,
        inv_id: &str,
        local: &BTreeSet<ObjMetadata>,
    ) -> Result<(String, BTreeSet<ObjMetadata>), Error> {
        for _ in 0..INVENTORY_WRITE_TRIES {
            let found = self.find_inventory(api, inv_id).await?;
            let Some(mut cm) = found else {
                let mut cm: ConfigMap = serde_json::from_value(local_inventory.clone())
                    .map_err(|e| Error::Inventory(format!("inventory object: {e}")))?;
                cm.data = Some(data_of(local));
                cm.metadata.resource_version = None;
                let name = cm.metadata.name.clone().unwrap_or_default();
                match api.create(&PostParams::default(), &cm).await {
                    Ok(_) => return Ok((name, BTreeSet::new())),
                    Err(e) if is_status(&e, 409) => continue,
                    Err(e) => return Err(Error::Inventory(message(&e))),
                }
            };
            let previous = listed(&cm)?;
            let name = cm.metadata.name.clone().unwrap_or_default();
            let union: BTreeSet<ObjMetadata> = previous.union(local).cloned().collect();
            if union == previous {
                return Ok((name, previous));
            }
            cm.data = Some(data_of(&union));
            cm.metadata.managed_fields = None;
            match api.replace(&name, &PostParams::default(), &cm).await {
                Ok(_) => return Ok((name, previous)),
                Err(e) if is_status(&e, 409) => continue,
                Err(e) => return Err(Error::Inventory(message(&e))),
            }
        }
        Err(Error::Inventory(format!(
            "inventory {inv_id}: written by others {INVENTORY_WRITE_TRIES} times in a row"
        )))
    }

    /// The inventory ConfigMap labelled `inv_id`, if any (cli-utils'
    /// `GetClusterInventoryInfo`).
    pub(super) async fn find_inventory(
        &self,
        api: &Api<ConfigMap>,
        inv_id: &str,
    ) -> Result<Option<ConfigMap>, Error> {
        let list = api
            .list(&ListParams::default().labels(&format!("{INVENTORY_LABEL}={inv_id}")))
            .await
            .map_err(|e| {
                Error::Inventory(format!(
                    "failed to read inventory objects from cluster: {}",
                    message(&e)
                ))
            })?;
        let mut items = list.items;
        match items.len() {
            0 => Ok(None),
            1 => Ok(items.pop()),
            n => Err(Error::Inventory(format!(
                "found {n} inventory objects with inventory id {inv_id}"
            ))),
        }
    }

    /// cli-utils' `ClusterClient.Replace`: the inventory lists `keep` (written only
    /// when that changes it).
    pub(super) async fn write_inventory(
        &self,
        api: &Api<ConfigMap>,
        name: &str,
        keep: &BTreeSet<ObjMetadata>,
    ) -> Result<(), Error> {
        for _ in 0..INVENTORY_WRITE_TRIES {
            let mut cm = match api.get_opt(name).await {
                Ok(Some(cm)) => cm,
                Ok(None) => {
                    return Err(Error::Inventory(format!(
                        "updating inventory object {name}: it is gone"
                    )));
                }
                Err(e) => return Err(Error::Inventory(message(&e))),
            };
            if listed(&cm)? == *keep {
                return Ok(());
            }
            cm.data = Some(data_of(keep));
            cm.metadata.managed_fields = None;
            match api.replace(name, &PostParams::default(), &cm).await {
                Ok(_) => return Ok(()),
                Err(e) if is_status(&e, 409) => continue,
                Err(e) => return Err(Error::Inventory(message(&e))),
            }
        }
        Err(Error::Inventory(format!(
            "inventory {name}: written by others {INVENTORY_WRITE_TRIES} times in a row"
        )))
    }
}

/// An inventory's `data`: every object's key, values empty (status policy none).
fn data_of(set: &BTreeSet<ObjMetadata>) -> BTreeMap<String, String> {
    set.iter()
        .map(|id| (id.to_string(), String::new()))
        .collect()
}

/// The objects an inventory ConfigMap lists.
fn listed(cm: &ConfigMap) -> Result<BTreeSet<ObjMetadata>, Error> {
    cm.data
        .iter()
        .flat_map(|d| d.keys())
        .map(|k| ObjMetadata::parse(k))
        .collect()
}
