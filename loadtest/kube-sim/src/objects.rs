//! Direct reads and writes of the cluster's objects, as another client would make
//! them (without `managedFields` and namespace checks): [`KubeSim::put`],
//! [`KubeSim::get`], [`KubeSim::delete`], [`KubeSim::objects`], generated clusters
//! and seed documents ([`KubeSim::load_seed`]).

use std::sync::Arc;

use ::http::Method;
use serde::Deserialize as _;
use serde_json::Value;

use super::resources::{KINDS, Kind, NAMESPACES, key, kind, kind_named};
use super::store::{self, Stored};
use super::{Error, KubeSim, Result, generate, http};

impl KubeSim {
    /// Every stored object, with its kind's group, storage version and plural: what
    /// a test needs to compute a graph independently. Cheap: objects are shared
    /// with the store and parsed only when asked ([`StoredObject::value`]).
    pub fn objects(&self) -> Vec<StoredObject> {
        let store = self.shared.lock();
        let mut out = Vec::with_capacity(store.objects.len());
        for k in KINDS {
            out.extend(store.of(*k).map(|((_, ns, name), o)| StoredObject {
                group: k.group,
                version: k.versions[0],
                resource: k.plural,
                namespaced: k.namespaced,
                namespace: ns.clone(),
                name: name.clone(),
                object: o.clone(),
            }));
        }
        out
    }

    /// Create or replace an object directly (as another client would, though
    /// without `managedFields` and namespace checks; refusals and validation
    /// apply); returns the stored object or a `Status`. `resource` names the kind as kubectl does:
    /// `pods`, `deployments.apps`, or a bare plural served by one group only.
    pub fn put(&self, resource: &str, namespace: &str, object: Value) -> Value {
        let Some(k) = kind(resource) else {
            return http::status(
                ::http::StatusCode::NOT_FOUND,
                "NotFound",
                &format!("the server doesn't have a resource type \"{resource}\""),
            );
        };
        self.put_kind(k, namespace, object)
    }

    pub(super) fn put_kind(&self, k: Kind, namespace: &str, object: Value) -> Value {
        let name = object["metadata"]["name"].as_str().unwrap_or("").to_owned();
        let exists = self
            .shared
            .lock()
            .objects
            .contains_key(&key(k, namespace, &name));
        let (_, v) = self.shared.write(store::Write {
            admit: true,
            ..store::Write::new(
                if exists { Method::PUT } else { Method::POST },
                k,
                namespace,
                Some(&name).filter(|_| exists).map(String::as_str),
                object,
            )
        });
        v
    }

    /// Delete an object directly; whether it existed. A namespace goes at once,
    /// with everything in it.
    pub fn delete(&self, resource: &str, namespace: &str, name: &str) -> bool {
        kind(resource).is_some_and(|k| {
            if k == NAMESPACES {
                return self.shared.purge_namespace(name);
            }
            self.shared
                .apply(Method::DELETE, k, namespace, Some(name), Value::Null)
                .0
                .is_success()
        })
    }

    /// An object, if present (`namespace` is `""` for cluster-scoped kinds), in its
    /// kind's preferred version.
    pub fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        let k = kind(resource)?;
        self.shared
            .lock()
            .objects
            .get(&key(k, namespace, name))
            .map(|s| s.value())
    }

    /// Add a generated cluster of exactly `objects` objects (see the `generate`
    /// module: Nodes and classes; namespaces with apps, Deployments → ReplicaSets →
    /// Pods linked by controller owner references, Ingresses, StatefulSets,
    /// CronJobs, Widgets, Flux Kustomizations and HelmReleases with their sources
    /// and Helm storage Secrets), the same for the same `seed`; returns how many
    /// objects were added.
    pub fn generate(&self, objects: usize, seed: u64) -> usize {
        generate::generate(self, objects, seed)
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().rv
    }

    /// Load objects from a multi-document YAML text (`---` between documents), each
    /// created or replaced as [`KubeSim::put`] does; namespaced objects without a
    /// namespace go to `default`. Empty documents are skipped. Returns how many
    /// objects were loaded; on an error, the documents before the bad one stay loaded.
    pub fn load_seed(&self, yaml: &str) -> Result<usize> {
        let mut loaded = 0;
        for (i, doc) in serde_yaml::Deserializer::from_str(yaml).enumerate() {
            let document = i + 1;
            let fail = |name: Option<String>, message: String| Error::Seed {
                document,
                name,
                message,
            };
            let object = Value::deserialize(doc).map_err(|e| fail(None, e.to_string()))?;
            if object.is_null() {
                continue;
            }
            if !object.is_object() {
                return Err(fail(None, "not a mapping".into()));
            }
            let api_version = object["apiVersion"].as_str().unwrap_or("");
            let kind_name = object["kind"].as_str().unwrap_or("");
            let name = object["metadata"]["name"].as_str().unwrap_or("");
            let Some(k) = kind_named(api_version, kind_name) else {
                return Err(fail(
                    None,
                    format!("apiVersion {api_version:?} kind {kind_name:?} is not served"),
                ));
            };
            let namespace = if k.namespaced {
                object["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("default")
                    .to_owned()
            } else {
                String::new()
            };
            let label = if k.namespaced {
                format!("{kind_name} {namespace}/{name}")
            } else {
                format!("{kind_name} {name}")
            };
            if name.is_empty() {
                return Err(fail(Some(label), "metadata.name: Required value".into()));
            }
            let stored = self.put_kind(k, &namespace, object);
            if stored["kind"] == "Status" {
                let message = stored["message"].as_str().unwrap_or("refused").to_owned();
                return Err(fail(Some(label), message));
            }
            loaded += 1;
        }
        Ok(loaded)
    }
}

/// One object as [`KubeSim::objects`] lists it.
#[derive(Clone, Debug)]
pub struct StoredObject {
    /// The API group: `apps`, `""` for the core group.
    pub group: &'static str,
    /// The version objects of the kind are stored (and preferred) in: `v1`.
    pub version: &'static str,
    /// The plural resource name: `deployments`.
    pub resource: &'static str,
    /// Whether the kind lives in namespaces.
    pub namespaced: bool,
    /// The namespace; `""` for cluster-scoped kinds.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    object: Arc<Stored>,
}

impl StoredObject {
    /// The object as stored (in [`StoredObject::version`]), parsed.
    pub fn value(&self) -> Value {
        self.object.value()
    }

    /// The object's JSON text as stored.
    pub fn json(&self) -> &str {
        &self.object.text
    }
}
