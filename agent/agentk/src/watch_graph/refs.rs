//! The references an object makes to others: the arcs it is the source of
//! (the `sarc` arcs of the Graph API). GitLab's agentk code for this is not public, so
//! this follows a table built from the two examples of GitLab's Graph API design
//! (`docs/graph-api.md` §6):
//!
//! - every object: `metadata.ownerReferences[]` → owner, `or` (`c` = controller,
//!   `b` = blockOwnerDeletion);
//! - Pod: volumes (ConfigMap, Secret, PVC, projected ConfigMap/Secret), container
//!   `env[].valueFrom` and `envFrom[]` (init and ephemeral containers too),
//!   `serviceAccountName`, `imagePullSecrets`, `nodeName`, `priorityClassName`,
//!   `runtimeClassName` → `r`;
//! - the same fields in a pod template (Deployment, ReplicaSet, StatefulSet,
//!   DaemonSet, Job, and CronJob's job template) → `t`: the controller passes them on
//!   without using them itself;
//! - StatefulSet: `serviceName` → Service `r`; volume claim templates → the PVCs
//!   `<template>-<set>-<ordinal>` for each replica, `t`;
//! - Ingress: backend Services, TLS Secrets, `ingressClassName` → `r`;
//! - PersistentVolumeClaim: `volumeName`, `storageClassName` → `r`;
//! - ServiceAccount: `secrets[]`, `imagePullSecrets[]` → Secret `r`;
//! - Flux `Kustomization`: `status.inventory.entries[].id`
//!   (`<ns>_<name>_<group>_<Kind>`, a list reference) and `sourceRef`, `dependsOn`,
//!   `postBuild.substituteFrom`, `decryption.secretRef`, `kubeConfig.secretRef`,
//!   `serviceAccountName` → `r`;
//! - Flux `HelmRelease`: `chart.spec.sourceRef` / `chartRef`, `valuesFrom`,
//!   `dependsOn`, `kubeConfig.secretRef`, `serviceAccountName`, and its latest
//!   release's Helm storage Secret (`sh.helm.release.v1.<release>.v<version>`) → `r`;
//! - Helm storage Secret (type `helm.sh/release.v1`): every object of the release's
//!   manifest (a list reference, as GitLab's design document has the HelmRelease's
//!   Secret store the list of managed objects) → `r`.
//!   Helm stores the release as base64 of gzipped JSON (`pkg/storage/driver/util.go`
//!   `encodeRelease` in helm/helm) in `data.release`; namespaced objects without a
//!   namespace are in the release's namespace.
//!
//! Layout: owner references and the built-in kinds here; Flux's and Helm's in
//! `flux`.

use serde_json::Value;

use podgate_agent::graph::request::ArcType;

mod flux;

/// What a reference names: a resource by its plural (built-in fields) or a kind
/// (owner references, Flux references), in a group.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Target {
    /// `(group, resource)`.
    Resource(&'static str, &'static str),
    /// `(group, Kind)`.
    Kind(String, String),
}

/// One reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Ref {
    pub(crate) target: Target,
    /// The destination's namespace ("" when it is cluster-scoped: resolved later).
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) arc: ArcType,
    pub(crate) controller: bool,
    pub(crate) block_owner_deletion: bool,
}

const CORE: &str = "";

struct Collector<'a> {
    namespace: &'a str,
    out: Vec<Ref>,
}

impl Collector<'_> {
    fn push(&mut self, target: Target, namespace: &str, name: Option<&str>, arc: ArcType) {
        let Some(name) = name.filter(|n| !n.is_empty()) else {
            return;
        };
        self.out.push(Ref {
            target,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            arc,
            controller: false,
            block_owner_deletion: false,
        });
    }

    fn local(
        &mut self,
        group: &'static str,
        resource: &'static str,
        name: Option<&str>,
        arc: ArcType,
    ) {
        let ns = self.namespace.to_owned();
        self.push(Target::Resource(group, resource), &ns, name, arc);
    }

    fn cluster(
        &mut self,
        group: &'static str,
        resource: &'static str,
        name: Option<&str>,
        arc: ArcType,
    ) {
        self.push(Target::Resource(group, resource), "", name, arc);
    }

    /// The name at `path` in `v`: a core `resource` in this namespace.
    fn local_at(&mut self, resource: &'static str, v: &Value, path: &[&str], arc: ArcType) {
        self.local(CORE, resource, at(v, path).and_then(Value::as_str), arc);
    }

    /// A Flux-style `{kind, name, namespace?}` reference in `group`.
    fn kind_ref(&mut self, group: &str, r: &Value, default_kind: Option<&str>, arc: ArcType) {
        let Some(kind) = str_at(r, "kind").or(default_kind) else {
            return;
        };
        let ns = str_at(r, "namespace").unwrap_or(self.namespace).to_owned();
        self.push(
            Target::Kind(group.to_owned(), kind.to_owned()),
            &ns,
            str_at(r, "name"),
            arc,
        );
    }
}

fn str_at<'v>(v: &'v Value, key: &str) -> Option<&'v str> {
    v.get(key).and_then(Value::as_str)
}

fn items(v: Option<&Value>) -> impl Iterator<Item = &Value> {
    v.and_then(Value::as_array).into_iter().flatten()
}

fn at<'v>(v: &'v Value, path: &[&str]) -> Option<&'v Value> {
    path.iter().try_fold(v, |v, k| v.get(*k))
}

/// Every reference `obj` (of `group`/`kind`, in `namespace`) makes, duplicates
/// included (the graph collapses them into one arc per destination and type).
pub(crate) fn references(group: &str, kind: &str, namespace: &str, obj: &Value) -> Vec<Ref> {
    let mut c = Collector {
        namespace,
        out: Vec::new(),
    };
    for o in items(at(obj, &["metadata", "ownerReferences"])) {
        let (Some(api_version), Some(kind), Some(name)) = (
            str_at(o, "apiVersion"),
            str_at(o, "kind"),
            str_at(o, "name"),
        ) else {
            continue;
        };
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        c.out.push(Ref {
            target: Target::Kind(group.to_owned(), kind.to_owned()),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            arc: ArcType::OwnerReference,
            controller: o.get("controller").and_then(Value::as_bool) == Some(true),
            block_owner_deletion: o.get("blockOwnerDeletion").and_then(Value::as_bool)
                == Some(true),
        });
    }
    let spec = obj.get("spec").unwrap_or(&Value::Null);
    match (group, kind) {
        (CORE, "Pod") => pod_spec(&mut c, spec, ArcType::Reference),
        ("apps", "Deployment" | "ReplicaSet" | "DaemonSet") | ("batch", "Job") => {
            if let Some(t) = at(spec, &["template", "spec"]) {
                pod_spec(&mut c, t, ArcType::Transitive);
            }
        }
        ("apps", "StatefulSet") => {
            if let Some(t) = at(spec, &["template", "spec"]) {
                pod_spec(&mut c, t, ArcType::Transitive);
            }
            c.local(
                CORE,
                "services",
                str_at(spec, "serviceName"),
                ArcType::Reference,
            );
            let set = at(obj, &["metadata", "name"])
                .and_then(Value::as_str)
                .unwrap_or("");
            let replicas = spec.get("replicas").and_then(Value::as_u64).unwrap_or(1);
            for t in items(spec.get("volumeClaimTemplates")) {
                if let Some(tmpl) = at(t, &["metadata", "name"]).and_then(Value::as_str) {
                    for i in 0..replicas.min(10_000) {
                        let name = format!("{tmpl}-{set}-{i}");
                        c.local(
                            CORE,
                            "persistentvolumeclaims",
                            Some(&name),
                            ArcType::Transitive,
                        );
                    }
                }
            }
        }
        ("batch", "CronJob") => {
            if let Some(t) = at(spec, &["jobTemplate", "spec", "template", "spec"]) {
                pod_spec(&mut c, t, ArcType::Transitive);
            }
        }
        ("networking.k8s.io", "Ingress") => {
            let backend = |c: &mut Collector<'_>, b: &Value| {
                let name = at(b, &["service", "name"]).and_then(Value::as_str);
                c.local(CORE, "services", name, ArcType::Reference);
            };
            if let Some(b) = spec.get("defaultBackend") {
                backend(&mut c, b);
            }
            for rule in items(spec.get("rules")) {
                for p in items(at(rule, &["http", "paths"])) {
                    if let Some(b) = p.get("backend") {
                        backend(&mut c, b);
                    }
                }
            }
            for t in items(spec.get("tls")) {
                c.local(CORE, "secrets", str_at(t, "secretName"), ArcType::Reference);
            }
            c.cluster(
                "networking.k8s.io",
                "ingressclasses",
                str_at(spec, "ingressClassName"),
                ArcType::Reference,
            );
        }
        (CORE, "PersistentVolumeClaim") => {
            c.cluster(
                CORE,
                "persistentvolumes",
                str_at(spec, "volumeName"),
                ArcType::Reference,
            );
            c.cluster(
                "storage.k8s.io",
                "storageclasses",
                str_at(spec, "storageClassName"),
                ArcType::Reference,
            );
        }
        (CORE, "ServiceAccount") => {
            for s in items(obj.get("secrets")).chain(items(obj.get("imagePullSecrets"))) {
                c.local(CORE, "secrets", str_at(s, "name"), ArcType::Reference);
            }
        }
        (flux::KUSTOMIZE, "Kustomization") => flux::kustomization(&mut c, obj, spec),
        (flux::HELM, "HelmRelease") => flux::helm_release(&mut c, obj, spec),
        (CORE, "Secret") if str_at(obj, "type") == Some("helm.sh/release.v1") => {
            flux::helm_release_objects(&mut c, obj);
        }
        _ => {}
    }
    c.out
}

/// A pod spec's references, typed `arc` (`r` in a Pod, `t` in a template).
fn pod_spec(c: &mut Collector<'_>, spec: &Value, arc: ArcType) {
    for v in items(spec.get("volumes")) {
        c.local_at("configmaps", v, &["configMap", "name"], arc);
        c.local_at("secrets", v, &["secret", "secretName"], arc);
        c.local_at(
            "persistentvolumeclaims",
            v,
            &["persistentVolumeClaim", "claimName"],
            arc,
        );
        for s in items(at(v, &["projected", "sources"])) {
            c.local_at("configmaps", s, &["configMap", "name"], arc);
            c.local_at("secrets", s, &["secret", "name"], arc);
        }
    }
    for key in ["containers", "initContainers", "ephemeralContainers"] {
        for ctr in items(spec.get(key)) {
            for e in items(ctr.get("env")) {
                let from = e.get("valueFrom").unwrap_or(&Value::Null);
                c.local_at("configmaps", from, &["configMapKeyRef", "name"], arc);
                c.local_at("secrets", from, &["secretKeyRef", "name"], arc);
            }
            for e in items(ctr.get("envFrom")) {
                c.local_at("configmaps", e, &["configMapRef", "name"], arc);
                c.local_at("secrets", e, &["secretRef", "name"], arc);
            }
        }
    }
    let sa = str_at(spec, "serviceAccountName").or_else(|| str_at(spec, "serviceAccount"));
    c.local(CORE, "serviceaccounts", sa, arc);
    for s in items(spec.get("imagePullSecrets")) {
        c.local(CORE, "secrets", str_at(s, "name"), arc);
    }
    c.cluster(CORE, "nodes", str_at(spec, "nodeName"), arc);
    c.cluster(
        "scheduling.k8s.io",
        "priorityclasses",
        str_at(spec, "priorityClassName"),
        arc,
    );
    c.cluster(
        "node.k8s.io",
        "runtimeclasses",
        str_at(spec, "runtimeClassName"),
        arc,
    );
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn names(refs: &[Ref]) -> Vec<(String, String, &'static str)> {
        refs.iter()
            .map(|r| {
                let t = match &r.target {
                    Target::Resource(_, res) => (*res).to_owned(),
                    Target::Kind(_, k) => k.clone(),
                };
                (t, r.name.clone(), r.arc.as_str())
            })
            .collect()
    }

    #[test]
    fn pod_references_are_r_and_template_references_t() {
        let spec = json!({
            "volumes": [{"configMap": {"name": "cm1"}}, {"secret": {"secretName": "s1"}},
                        {"projected": {"sources": [{"configMap": {"name": "cm2"}}]}}],
            "containers": [{"envFrom": [{"secretRef": {"name": "s2"}}],
                            "env": [{"valueFrom": {"configMapKeyRef": {"name": "cm3"}}}]}],
            "serviceAccountName": "sa1",
            "imagePullSecrets": [{"name": "pull"}]
        });
        let pod = json!({"metadata": {"name": "p", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs1", "controller": true, "blockOwnerDeletion": true}]},
            "spec": spec});
        let refs = references("", "Pod", "ns1", &pod);
        assert_eq!(
            refs[0].target,
            Target::Kind("apps".into(), "ReplicaSet".into())
        );
        assert!(refs[0].controller && refs[0].block_owner_deletion);
        let got = names(&refs[1..]);
        assert_eq!(
            got,
            vec![
                ("configmaps".into(), "cm1".into(), "r"),
                ("secrets".into(), "s1".into(), "r"),
                ("configmaps".into(), "cm2".into(), "r"),
                ("configmaps".into(), "cm3".into(), "r"),
                ("secrets".into(), "s2".into(), "r"),
                ("serviceaccounts".into(), "sa1".into(), "r"),
                ("secrets".into(), "pull".into(), "r"),
            ]
        );
        let deploy = json!({"metadata": {"name": "d"}, "spec": {"template": {"spec": spec}}});
        assert!(
            references("apps", "Deployment", "ns1", &deploy)
                .iter()
                .all(|r| r.arc == ArcType::Transitive)
        );
    }

    #[test]
    fn flux_inventory_and_helm_storage_secret() {
        let k = json!({"metadata": {"name": "k"}, "spec": {"sourceRef": {"kind": "GitRepository", "name": "repo"}},
            "status": {"inventory": {"entries": [{"id": "ns1_web_apps_Deployment", "v": "v1"},
                                                  {"id": "_admin_rbac.authorization.k8s.io_ClusterRole", "v": "v1"}]}}});
        let refs = references(flux::KUSTOMIZE, "Kustomization", "ns1", &k);
        assert_eq!(
            refs[0].target,
            Target::Kind("apps".into(), "Deployment".into())
        );
        assert_eq!(
            (refs[0].namespace.as_str(), refs[0].name.as_str()),
            ("ns1", "web")
        );
        assert_eq!(refs[1].namespace, "");
        assert_eq!(
            refs[2].target,
            Target::Kind(flux::SOURCE.into(), "GitRepository".into())
        );
        let hr = json!({"metadata": {"name": "podinfo"}, "spec": {"targetNamespace": "apps"},
            "status": {"history": [{"version": 3}, {"version": 2}]}});
        let refs = references(flux::HELM, "HelmRelease", "flux-system", &hr);
        let s = refs
            .iter()
            .find(|r| r.name.starts_with("sh.helm"))
            .expect("storage secret");
        assert_eq!(
            (s.namespace.as_str(), s.name.as_str()),
            ("apps", "sh.helm.release.v1.apps-podinfo.v3")
        );
    }

    #[test]
    fn statefulset_claims_per_replica() {
        let sts = json!({"metadata": {"name": "db"}, "spec": {"replicas": 2, "serviceName": "db-h",
            "volumeClaimTemplates": [{"metadata": {"name": "data"}}]}});
        let got = names(&references("apps", "StatefulSet", "ns", &sts));
        assert_eq!(
            got,
            vec![
                ("services".into(), "db-h".into(), "r"),
                ("persistentvolumeclaims".into(), "data-db-0".into(), "t"),
                ("persistentvolumeclaims".into(), "data-db-1".into(), "t"),
            ]
        );
    }

    #[test]
    fn helm_storage_secret_names_the_objects_of_its_release() {
        use base64::Engine as _;
        use std::io::Write as _;
        let release = json!({"name": "redis", "namespace": "db", "version": 2,
            "manifest": "---\n# Source: x\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: redis\n---\napiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: redis\n  namespace: other\n"});
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(release.to_string().as_bytes()).expect("gzip");
        let b64 = base64::engine::general_purpose::STANDARD;
        let helm = b64.encode(gz.finish().expect("gzip"));
        let secret = json!({"type": "helm.sh/release.v1", "metadata": {"name": "sh.helm.release.v1.redis.v2"},
            "data": {"release": b64.encode(helm)}});
        let refs = references("", "Secret", "db", &secret);
        let got: Vec<(String, &str, &str)> = refs
            .iter()
            .map(|r| match &r.target {
                Target::Kind(g, k) => (format!("{g}/{k}"), r.namespace.as_str(), r.name.as_str()),
                Target::Resource(..) => panic!("kind references expected"),
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("/ServiceAccount".to_owned(), "db", "redis"),
                ("apps/StatefulSet".to_owned(), "other", "redis")
            ]
        );
        assert!(refs.iter().all(|r| r.arc == ArcType::Reference));
        // Not a Helm storage Secret, or undecodable: nothing.
        let plain = json!({"type": "Opaque", "data": {"release": b64.encode(b"x")}});
        assert!(references("", "Secret", "db", &plain).is_empty());
    }
}
