//! The CustomResourceDefinitions of the custom kinds, as their installers leave
//! them.

use serde_json::{Value, json};

use super::{HELM_GROUP, KUSTOMIZE_GROUP, Kind, SOURCE_GROUP};

/// The CustomResourceDefinition of a custom kind, as its controller's installer
/// (controller-gen output applied by `flux install`, or a chart) leaves it once the
/// API server has accepted it: every served version with a permissive schema, the
/// first stored, `Established`.
pub(in super::super) fn crd_object(k: Kind) -> Value {
    let names = json!({
        "kind": k.kind,
        "listKind": format!("{}List", k.kind),
        "plural": k.plural,
        "singular": k.singular,
        "shortNames": k.short,
    });
    let versions: Vec<Value> = k
        .versions
        .iter()
        .enumerate()
        .map(|(i, v)| {
            json!({
                "name": v,
                "served": true,
                "storage": i == 0,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                "subresources": {"status": {}},
                "additionalPrinterColumns": [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}],
            })
        })
        .collect();
    let mut labels = json!({});
    if let Some(component) = match k.group {
        KUSTOMIZE_GROUP => Some("kustomize-controller"),
        HELM_GROUP => Some("helm-controller"),
        SOURCE_GROUP => Some("source-controller"),
        _ => None,
    } {
        labels = json!({
            "app.kubernetes.io/component": component,
            "app.kubernetes.io/instance": "flux-system",
            "app.kubernetes.io/part-of": "flux",
            "app.kubernetes.io/version": "v2.4.0",
        });
    }
    let condition = |t: &str, reason: &str, message: &str| json!({"type": t, "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z", "reason": reason, "message": message});
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": format!("{}.{}", k.plural, k.group),
            "labels": labels,
            "annotations": {"controller-gen.kubebuilder.io/version": "v0.16.1"},
        },
        "spec": {
            "group": k.group,
            "names": names,
            "scope": if k.namespaced { "Namespaced" } else { "Cluster" },
            "versions": versions,
            "conversion": {"strategy": "None"},
        },
        "status": {
            "acceptedNames": names,
            "conditions": [
                condition("NamesAccepted", "NoConflicts", "no conflicts found"),
                condition("Established", "InitialNamesAccepted", "the initial names have been accepted"),
            ],
            "storedVersions": [k.versions[0]],
        },
    })
}
