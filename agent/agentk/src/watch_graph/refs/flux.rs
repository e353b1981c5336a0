//! Flux's and Helm's references: a Kustomization's inventory, sources and
//! dependencies, a HelmRelease's chart, values and storage Secret, and the objects
//! a Helm storage Secret's release lists.

use serde::Deserialize as _;
use serde_json::Value;

use podgate_agent::graph::request::ArcType;

use super::{CORE, Collector, Target, at, items, str_at};

pub(super) const SOURCE: &str = "source.toolkit.fluxcd.io";
pub(super) const KUSTOMIZE: &str = "kustomize.toolkit.fluxcd.io";
pub(super) const HELM: &str = "helm.toolkit.fluxcd.io";

/// A Kustomization's references.
pub(super) fn kustomization(c: &mut Collector<'_>, obj: &Value, spec: &Value) {
    for e in items(at(obj, &["status", "inventory", "entries"])) {
        if let Some(id) = str_at(e, "id") {
            inventory_entry(c, id);
        }
    }
    if let Some(s) = spec.get("sourceRef") {
        c.kind_ref(SOURCE, s, None, ArcType::Reference);
    }
    for d in items(spec.get("dependsOn")) {
        c.kind_ref(KUSTOMIZE, d, Some("Kustomization"), ArcType::Reference);
    }
    for s in items(at(spec, &["postBuild", "substituteFrom"])) {
        c.kind_ref(CORE, s, None, ArcType::Reference);
    }
    common(c, spec);
    c.local_at(
        "secrets",
        spec,
        &["decryption", "secretRef", "name"],
        ArcType::Reference,
    );
}

/// A HelmRelease's references.
pub(super) fn helm_release(c: &mut Collector<'_>, obj: &Value, spec: &Value) {
    if let Some(s) = at(spec, &["chart", "spec", "sourceRef"]) {
        c.kind_ref(SOURCE, s, None, ArcType::Reference);
    }
    if let Some(s) = spec.get("chartRef") {
        c.kind_ref(SOURCE, s, None, ArcType::Reference);
    }
    for v in items(spec.get("valuesFrom")) {
        c.kind_ref(CORE, v, None, ArcType::Reference);
    }
    for d in items(spec.get("dependsOn")) {
        c.kind_ref(HELM, d, Some("HelmRelease"), ArcType::Reference);
    }
    common(c, spec);
    helm_storage_secret(c, obj, spec);
}

/// The objects of the Helm release a storage Secret holds (see the module docs).
/// A release that cannot be decoded names nothing.
pub(super) fn helm_release_objects(c: &mut Collector<'_>, obj: &Value) {
    use base64::Engine as _;
    use std::io::Read as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let Some(data) = at(obj, &["data", "release"]).and_then(Value::as_str) else {
        return;
    };
    let Ok(helm) = b64.decode(data) else { return };
    let Ok(mut raw) = b64.decode(helm.trim_ascii()) else {
        return;
    };
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        let limit = 64 * 1024 * 1024;
        if flate2::read::GzDecoder::new(raw.as_slice())
            .take(limit)
            .read_to_end(&mut out)
            .is_err()
        {
            return;
        }
        raw = out;
    }
    let Ok(release) = serde_json::from_slice::<Value>(&raw) else {
        return;
    };
    let release_ns = str_at(&release, "namespace")
        .unwrap_or(c.namespace)
        .to_owned();
    let Some(manifest) = str_at(&release, "manifest") else {
        return;
    };
    for doc in serde_yaml::Deserializer::from_str(manifest) {
        let Ok(v) = serde_json::Value::deserialize(doc) else {
            continue;
        };
        let (Some(api_version), Some(kind)) = (str_at(&v, "apiVersion"), str_at(&v, "kind")) else {
            continue;
        };
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        let meta = v.get("metadata").unwrap_or(&Value::Null);
        let ns = str_at(meta, "namespace").unwrap_or(&release_ns).to_owned();
        c.push(
            Target::Kind(group.to_owned(), kind.to_owned()),
            &ns,
            str_at(meta, "name"),
            ArcType::Reference,
        );
    }
}

/// `kubeConfig.secretRef` and `serviceAccountName`, shared by Flux kinds.
fn common(c: &mut Collector<'_>, spec: &Value) {
    c.local_at(
        "secrets",
        spec,
        &["kubeConfig", "secretRef", "name"],
        ArcType::Reference,
    );
    c.local(
        CORE,
        "serviceaccounts",
        str_at(spec, "serviceAccountName"),
        ArcType::Reference,
    );
}

/// A Flux inventory id: `<namespace>_<name>_<group>_<Kind>` (namespace and group may
/// be empty; names, namespaces, groups and kinds cannot contain `_`).
fn inventory_entry(c: &mut Collector<'_>, id: &str) {
    let parts: Vec<&str> = id.splitn(4, '_').collect();
    if let [ns, name, group, kind] = parts[..] {
        c.push(
            Target::Kind(group.to_owned(), kind.to_owned()),
            ns,
            Some(name),
            ArcType::Reference,
        );
    }
}

/// The Helm storage Secret of a HelmRelease's latest release: helm-controller v2
/// names the release `spec.releaseName`, else `<targetNamespace>-<name>` when a target
/// namespace is set, else `<name>`; it is stored in `spec.storageNamespace`, else the
/// target namespace, else the HelmRelease's own; the version is the newest
/// `status.history[]` entry's (`status.lastReleaseRevision` in older objects).
fn helm_storage_secret(c: &mut Collector<'_>, obj: &Value, spec: &Value) {
    let name = at(obj, &["metadata", "name"])
        .and_then(Value::as_str)
        .unwrap_or("");
    let target_ns = str_at(spec, "targetNamespace").filter(|s| !s.is_empty());
    let release = match (
        str_at(spec, "releaseName").filter(|s| !s.is_empty()),
        target_ns,
    ) {
        (Some(r), _) => r.to_owned(),
        (None, Some(t)) => format!("{t}-{name}"),
        (None, None) => name.to_owned(),
    };
    let storage_ns = str_at(spec, "storageNamespace")
        .filter(|s| !s.is_empty())
        .or(target_ns)
        .unwrap_or(c.namespace)
        .to_owned();
    let status = obj.get("status").unwrap_or(&Value::Null);
    let version = items(status.get("history"))
        .next()
        .and_then(|h| h.get("version"))
        .and_then(Value::as_u64)
        .or_else(|| status.get("lastReleaseRevision").and_then(Value::as_u64));
    if let Some(v) = version {
        let secret = format!("sh.helm.release.v1.{release}.v{v}");
        c.push(
            Target::Resource(CORE, "secrets"),
            &storage_ns,
            Some(&secret),
            ArcType::Reference,
        );
    }
}
