//! The independent graph model: from the objects a cluster holds, its discovery
//! documents and a Graph API request, the graph a correct server ends up with.
//! Written from `docs/graph-api.md` (§5 discovery and version selection, §6 the arcs per
//! kind, §7 roots, §8 the vertex contents) without reading the server's code, so
//! that a disagreement is a question about the spec, not a shared assumption.
//!
//! What it computes:
//!
//! - **watched resources**: every discovered `(group, version, resource)` with the
//!   `list` and `watch` verbs, not a subresource, not in the `extensions` or
//!   `events.k8s.io` groups, run through the queries in order (first match decides);
//!   per group+resource the newest stable version (`^v\d+$`) of those included, else
//!   the newest unstable one, in natural order (`v2` < `v10`);
//! - **vertices**: the objects of watched resources that pass the namespace filter
//!   (names, or label/field selector and CEL over Namespace objects), the including
//!   query's label selector, field selector and object CEL; content `o` (checked by
//!   `metadata.resourceVersion`), `j` when the query has a `json_path`, nothing for
//!   Secrets;
//! - **arcs** per the §6 table: owner references (`or` with `c`/`b`); Pod spec
//!   references (`r`) and the same in workload templates (`t`); StatefulSet service
//!   (`r`) and claim templates (`t`, ordinals `0..replicas`); Ingress backends, TLS
//!   secrets and class; PVC volume and storage class; ServiceAccount secrets; Flux
//!   Kustomization (inventory and spec references) and HelmRelease (spec references
//!   and its Helm storage Secret); Helm storage Secrets to the objects of their
//!   release manifest. Only towards watched resources; one arc per (source,
//!   destination, type); `e` when the destination is not among the vertices;
//! - **roots**: when root expressions are given, only what is reachable from a root
//!   (arcs followed forwards; backwards too for the types in `ignore_arc_direction`)
//!   is visible, and only arcs from visible sources are sent.
//!
//! Deliberately not modelled: CEL beyond the shapes in `expr`; label-selector arcs
//! (Service → Pods: the table has none); `DISCOVERY_FAILED` and other warnings; the
//! Helm release summary (`hr`); denied resources (tests that deny one do not compare
//! whole graphs).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

use base64::Engine as _;
use serde_json::{Map, Value, json};

use super::expr;
use super::select;

/// One discovered resource type (a row of an `APIResourceList`).
#[derive(Clone, Debug)]
pub struct ApiResource {
    pub group: String,
    pub version: String,
    /// The plural, or `pods/status` for a subresource.
    pub resource: String,
    pub kind: String,
    pub namespaced: bool,
    pub verbs: Vec<String>,
}

/// One stored object.
#[derive(Clone, Debug)]
pub struct Object {
    pub group: String,
    pub resource: String,
    /// `""` for cluster-scoped objects.
    pub namespace: String,
    pub name: String,
    pub value: Value,
}

/// A vertex id as the wire names it: `{g, v, r, ns, n}`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Vx {
    pub g: String,
    pub v: String,
    pub r: String,
    pub ns: String,
    pub n: String,
}

impl Vx {
    /// From a wire vertex object; `None` if it is not one.
    pub fn from_json(v: &Value) -> Option<Vx> {
        let s = |k: &str| -> Option<String> {
            match v.get(k) {
                None | Some(Value::Null) => Some(String::new()),
                Some(Value::String(s)) => Some(s.clone()),
                _ => None,
            }
        };
        Some(Vx {
            g: s("g")?,
            v: s("v")?,
            r: s("r")?,
            ns: s("ns")?,
            n: s("n")?,
        })
    }
}

impl fmt::Display for Vx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = if self.g.is_empty() { "core" } else { &self.g };
        if self.ns.is_empty() {
            write!(f, "{g}/{}/{} {}", self.v, self.r, self.n)
        } else {
            write!(f, "{g}/{}/{} {}/{}", self.v, self.r, self.ns, self.n)
        }
    }
}

/// Arc attributes (each absent on the wire when false).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Attrs {
    pub c: bool,
    pub b: bool,
    pub e: bool,
}

impl fmt::Display for Attrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut v = Vec::new();
        for (on, n) in [(self.c, "c"), (self.b, "b"), (self.e, "e")] {
            if on {
                v.push(n);
            }
        }
        write!(f, "{{{}}}", v.join(","))
    }
}

/// (source, destination, type).
pub type ArcKey = (Vx, Vx, String);

/// What a vertex must carry.
#[derive(Clone, Debug, PartialEq)]
pub enum Content {
    /// `o`, the object at this `metadata.resourceVersion`.
    Object { resource_version: String },
    /// `j`, these matches (an empty array may also be absent).
    Json(Vec<Value>),
    /// Neither `o` nor `j` with content (Secrets).
    Empty,
}

/// What a vertex carried (`o`, `j` as received).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Payload {
    pub o: Option<Value>,
    pub j: Option<Vec<Value>>,
}

impl Content {
    /// Why `got` does not satisfy this, if it does not.
    pub fn check(&self, got: &Payload) -> Result<(), String> {
        let empty_o = got.o.as_ref().is_none_or(|o| o == &json!({}));
        let empty_j = got.j.as_ref().is_none_or(Vec::is_empty);
        match self {
            Content::Empty if empty_o && empty_j => Ok(()),
            Content::Empty => Err(format!("content where none may be: {got:?}")),
            Content::Json(want) => {
                if got.o.is_some() {
                    Err("o set although the query has a json_path".into())
                } else if got.j.as_ref().unwrap_or(&Vec::new()) != want {
                    Err(format!("j {:?}, want {want:?}", got.j))
                } else {
                    Ok(())
                }
            }
            Content::Object { resource_version } => {
                if got.j.is_some() {
                    return Err("j set without a json_path".into());
                }
                let rv = got
                    .o
                    .as_ref()
                    .and_then(|o| o["metadata"]["resourceVersion"].as_str());
                if rv == Some(resource_version.as_str()) {
                    Ok(())
                } else {
                    Err(format!(
                        "o at resourceVersion {rv:?}, want {resource_version:?}"
                    ))
                }
            }
        }
    }
}

/// The graph the client must end up with.
#[derive(Clone, Debug, Default)]
pub struct Expected {
    pub vertices: BTreeMap<Vx, Content>,
    pub arcs: BTreeMap<ArcKey, Attrs>,
    /// (group, resource) → (selected version, namespaced).
    pub watched: BTreeMap<(String, String), (String, bool)>,
}

/// Natural order of version strings: digit runs compare as numbers.
pub fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    fn chunks(s: &str) -> Vec<(bool, String)> {
        let mut out: Vec<(bool, String)> = Vec::new();
        for c in s.chars() {
            let d = c.is_ascii_digit();
            match out.last_mut() {
                Some((ld, cur)) if *ld == d => cur.push(c),
                _ => out.push((d, c.to_string())),
            }
        }
        out
    }
    let (ca, cb) = (chunks(a), chunks(b));
    for (x, y) in ca.iter().zip(&cb) {
        let o = match (x.0, y.0) {
            (true, true) => {
                let (nx, ny) = (x.1.trim_start_matches('0'), y.1.trim_start_matches('0'));
                nx.len().cmp(&ny.len()).then_with(|| nx.cmp(ny))
            }
            _ => x.1.cmp(&y.1),
        };
        if o.is_ne() {
            return o;
        }
    }
    ca.len().cmp(&cb.len())
}

fn stable(v: &str) -> bool {
    v.len() > 1 && v.starts_with('v') && v[1..].chars().all(|c| c.is_ascii_digit())
}

/// The chosen one of `versions`: newest stable, else newest unstable.
pub fn select_version<'a>(versions: &[&'a str]) -> Option<&'a str> {
    let newest = |f: &dyn Fn(&str) -> bool| {
        versions
            .iter()
            .copied()
            .filter(|v| f(v))
            .max_by(|a, b| natural_cmp(a, b))
    };
    newest(&stable).or_else(|| newest(&|v| !stable(v)))
}

/// The groups never watched (co-habitation duplicates, docs/graph-api.md §5).
const EXCLUDED_GROUPS: &[&str] = &["extensions", "events", "events.k8s.io"];

/// A parsed include query.
struct Include {
    label_selector: String,
    field_selector: String,
    object: Option<expr::Expr>,
    json_path: Option<String>,
}

enum Query {
    Include(expr::Expr, Include),
    Exclude(expr::Expr),
}

fn str_field(v: &Value, k: &str) -> String {
    v.get(k).and_then(Value::as_str).unwrap_or("").to_owned()
}

fn parse_queries(request: &Value) -> Vec<Query> {
    request["queries"]
        .as_array()
        .expect("the model needs a valid request")
        .iter()
        .map(|q| {
            if let Some(inc) = q.get("include") {
                let o = &inc["object"];
                let ose = str_field(o, "object_selector_expression");
                let jp = str_field(o, "json_path");
                Query::Include(
                    expr::parse(inc["resource_selector_expression"].as_str().unwrap()),
                    Include {
                        label_selector: str_field(o, "label_selector"),
                        field_selector: str_field(o, "field_selector"),
                        object: (!ose.is_empty()).then(|| expr::parse(&ose)),
                        json_path: (!jp.is_empty()).then_some(jp),
                    },
                )
            } else {
                Query::Exclude(expr::parse(
                    q["exclude"]["resource_selector_expression"]
                        .as_str()
                        .unwrap(),
                ))
            }
        })
        .collect()
}

/// CEL variables for an object expression.
fn object_vars(o: &Object, version: &str) -> Map<String, Value> {
    let meta = &o.value["metadata"];
    let map = |k: &str| match &meta[k] {
        Value::Object(m) => Value::Object(m.clone()),
        _ => json!({}),
    };
    let mut m = Map::new();
    m.insert("obj".into(), o.value.clone());
    m.insert("group".into(), json!(o.group));
    m.insert("version".into(), json!(version));
    m.insert("resource".into(), json!(o.resource));
    m.insert("namespace".into(), json!(o.namespace));
    m.insert("name".into(), json!(o.name));
    m.insert("labels".into(), map("labels"));
    m.insert("annotations".into(), map("annotations"));
    m
}

/// A reference found in an object, before it is resolved to a watched resource.
struct Ref {
    g: String,
    r: String,
    /// The destination's namespace if it is namespaced.
    ns: String,
    n: String,
    t: &'static str,
    c: bool,
    b: bool,
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

fn arr(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or(&[])
}

fn push(out: &mut Vec<Ref>, g: &str, r: &str, ns: &str, n: &str, t: &'static str) {
    if !n.is_empty() {
        out.push(Ref {
            g: g.into(),
            r: r.into(),
            ns: ns.into(),
            n: n.into(),
            t,
            c: false,
            b: false,
        });
    }
}

/// References in a Pod spec, of type `t` (`r` for a Pod, `t` for a template).
fn pod_spec_refs(spec: &Value, ns: &str, t: &'static str, out: &mut Vec<Ref>) {
    for v in arr(&spec["volumes"]) {
        push(out, "", "configmaps", ns, s(&v["configMap"]["name"]), t);
        push(out, "", "secrets", ns, s(&v["secret"]["secretName"]), t);
        push(
            out,
            "",
            "persistentvolumeclaims",
            ns,
            s(&v["persistentVolumeClaim"]["claimName"]),
            t,
        );
        for src in arr(&v["projected"]["sources"]) {
            push(out, "", "configmaps", ns, s(&src["configMap"]["name"]), t);
            push(out, "", "secrets", ns, s(&src["secret"]["name"]), t);
        }
    }
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        for c in arr(&spec[list]) {
            for e in arr(&c["env"]) {
                let from = &e["valueFrom"];
                push(
                    out,
                    "",
                    "configmaps",
                    ns,
                    s(&from["configMapKeyRef"]["name"]),
                    t,
                );
                push(out, "", "secrets", ns, s(&from["secretKeyRef"]["name"]), t);
            }
            for e in arr(&c["envFrom"]) {
                push(out, "", "configmaps", ns, s(&e["configMapRef"]["name"]), t);
                push(out, "", "secrets", ns, s(&e["secretRef"]["name"]), t);
            }
        }
    }
    push(
        out,
        "",
        "serviceaccounts",
        ns,
        s(&spec["serviceAccountName"]),
        t,
    );
    for p in arr(&spec["imagePullSecrets"]) {
        push(out, "", "secrets", ns, s(&p["name"]), t);
    }
    push(out, "", "nodes", "", s(&spec["nodeName"]), t);
    push(
        out,
        "scheduling.k8s.io",
        "priorityclasses",
        "",
        s(&spec["priorityClassName"]),
        t,
    );
    push(
        out,
        "node.k8s.io",
        "runtimeclasses",
        "",
        s(&spec["runtimeClassName"]),
        t,
    );
}

/// Kinds to resources, from discovery: (group, Kind) → plural.
type Kinds = BTreeMap<(String, String), String>;

fn by_kind(kinds: &Kinds, group: &str, kind: &str) -> Option<String> {
    kinds.get(&(group.to_owned(), kind.to_owned())).cloned()
}

/// A Flux-style `{kind, name, namespace?, apiVersion?}` reference; `group` when the
/// reference names no apiVersion.
fn kinded_ref(
    kinds: &Kinds,
    r: &Value,
    default_group: &str,
    default_kind: &str,
    ns: &str,
    out: &mut Vec<Ref>,
) {
    let kind = match s(&r["kind"]) {
        "" => default_kind,
        k => k,
    };
    let group = match s(&r["apiVersion"]) {
        "" => default_group,
        av => av.rsplit_once('/').map_or("", |(g, _)| g),
    };
    let ns = match s(&r["namespace"]) {
        "" => ns,
        n => n,
    };
    if let Some(res) = by_kind(kinds, group, kind) {
        push(out, group, &res, ns, s(&r["name"]), "r");
    }
}

const SOURCE_GROUP: &str = "source.toolkit.fluxcd.io";

/// The objects a Helm release manifest names (Helm storage Secret `data.release`:
/// base64 of the Secret encoding, over base64 of gzip of the release JSON).
fn helm_manifest_refs(kinds: &Kinds, secret: &Value, ns: &str, out: &mut Vec<Ref>) {
    use std::io::Read as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let Some(data) = secret["data"]["release"].as_str() else {
        return;
    };
    let Ok(once) = b64.decode(data) else { return };
    let Ok(twice) = b64.decode(&once) else { return };
    let mut json_text = Vec::new();
    if flate2::read::GzDecoder::new(&twice[..])
        .read_to_end(&mut json_text)
        .is_err()
    {
        // Helm also stores uncompressed releases.
        json_text = twice;
    }
    let Ok(release) = serde_json::from_slice::<Value>(&json_text) else {
        return;
    };
    let release_ns = match s(&release["namespace"]) {
        "" => ns,
        n => n,
    };
    for doc in serde_yaml::Deserializer::from_str(s(&release["manifest"])) {
        use serde::Deserialize as _;
        let Ok(obj) = Value::deserialize(doc) else {
            continue;
        };
        let av = s(&obj["apiVersion"]);
        let group = av.rsplit_once('/').map_or("", |(g, _)| g);
        let obj_ns = match s(&obj["metadata"]["namespace"]) {
            "" => release_ns,
            n => n,
        };
        if let Some(res) = by_kind(kinds, group, s(&obj["kind"])) {
            push(out, group, &res, obj_ns, s(&obj["metadata"]["name"]), "r");
        }
    }
}

/// Every reference `o` makes, per the §6 table.
fn refs(o: &Object, kinds: &Kinds) -> Vec<Ref> {
    let v = &o.value;
    let ns = o.namespace.as_str();
    let mut out = Vec::new();
    for or in arr(&v["metadata"]["ownerReferences"]) {
        let group = s(&or["apiVersion"]).rsplit_once('/').map_or("", |(g, _)| g);
        if let Some(res) = by_kind(kinds, group, s(&or["kind"])) {
            let name = s(&or["name"]);
            if !name.is_empty() {
                out.push(Ref {
                    g: group.into(),
                    r: res,
                    ns: ns.into(),
                    n: name.into(),
                    t: "or",
                    c: or["controller"] == true,
                    b: or["blockOwnerDeletion"] == true,
                });
            }
        }
    }
    let spec = &v["spec"];
    match (o.group.as_str(), o.resource.as_str()) {
        ("", "pods") => pod_spec_refs(spec, ns, "r", &mut out),
        ("apps", "deployments" | "replicasets" | "statefulsets" | "daemonsets")
        | ("batch", "jobs") => pod_spec_refs(&spec["template"]["spec"], ns, "t", &mut out),
        ("batch", "cronjobs") => pod_spec_refs(
            &spec["jobTemplate"]["spec"]["template"]["spec"],
            ns,
            "t",
            &mut out,
        ),
        _ => {}
    }
    match (o.group.as_str(), o.resource.as_str()) {
        ("apps", "statefulsets") => {
            push(&mut out, "", "services", ns, s(&spec["serviceName"]), "r");
            let replicas = spec["replicas"].as_u64().unwrap_or(1);
            for t in arr(&spec["volumeClaimTemplates"]) {
                let tmpl = s(&t["metadata"]["name"]);
                if tmpl.is_empty() {
                    continue;
                }
                for i in 0..replicas {
                    let name = format!("{tmpl}-{}-{i}", o.name);
                    push(&mut out, "", "persistentvolumeclaims", ns, &name, "t");
                }
            }
        }
        ("networking.k8s.io", "ingresses") => {
            for rule in arr(&spec["rules"]) {
                for p in arr(&rule["http"]["paths"]) {
                    let svc = s(&p["backend"]["service"]["name"]);
                    push(&mut out, "", "services", ns, svc, "r");
                }
            }
            let def = s(&spec["defaultBackend"]["service"]["name"]);
            push(&mut out, "", "services", ns, def, "r");
            for t in arr(&spec["tls"]) {
                push(&mut out, "", "secrets", ns, s(&t["secretName"]), "r");
            }
            let class = s(&spec["ingressClassName"]);
            push(
                &mut out,
                "networking.k8s.io",
                "ingressclasses",
                "",
                class,
                "r",
            );
        }
        ("", "persistentvolumeclaims") => {
            push(
                &mut out,
                "",
                "persistentvolumes",
                "",
                s(&spec["volumeName"]),
                "r",
            );
            let sc = s(&spec["storageClassName"]);
            push(&mut out, "storage.k8s.io", "storageclasses", "", sc, "r");
        }
        ("", "serviceaccounts") => {
            for list in ["secrets", "imagePullSecrets"] {
                for x in arr(&v[list]) {
                    push(&mut out, "", "secrets", ns, s(&x["name"]), "r");
                }
            }
        }
        ("", "secrets") if s(&v["type"]) == "helm.sh/release.v1" => {
            helm_manifest_refs(kinds, v, ns, &mut out);
        }
        ("kustomize.toolkit.fluxcd.io", "kustomizations") => {
            for e in arr(&v["status"]["inventory"]["entries"]) {
                let parts: Vec<&str> = s(&e["id"]).split('_').collect();
                if let [ens, name, group, kind] = parts[..]
                    && let Some(res) = by_kind(kinds, group, kind)
                {
                    push(&mut out, group, &res, ens, name, "r");
                }
            }
            kinded_ref(kinds, &spec["sourceRef"], SOURCE_GROUP, "", ns, &mut out);
            flux_common(
                kinds,
                spec,
                ns,
                "kustomize.toolkit.fluxcd.io",
                "Kustomization",
                &mut out,
            );
            for x in arr(&spec["postBuild"]["substituteFrom"]) {
                kinded_ref(kinds, x, "", "", ns, &mut out);
            }
            let dec = s(&spec["decryption"]["secretRef"]["name"]);
            push(&mut out, "", "secrets", ns, dec, "r");
        }
        ("helm.toolkit.fluxcd.io", "helmreleases") => {
            let chart = &spec["chart"]["spec"]["sourceRef"];
            if chart.is_object() {
                // A source in another namespace is named by `namespace`; default: own.
                kinded_ref(kinds, chart, SOURCE_GROUP, "", ns, &mut out);
            }
            if spec["chartRef"].is_object() {
                kinded_ref(kinds, &spec["chartRef"], SOURCE_GROUP, "", ns, &mut out);
            }
            for x in arr(&spec["valuesFrom"]) {
                kinded_ref(kinds, x, "", "", ns, &mut out);
            }
            flux_common(
                kinds,
                spec,
                ns,
                "helm.toolkit.fluxcd.io",
                "HelmRelease",
                &mut out,
            );
            // The latest release's storage Secret.
            let latest = arr(&v["status"]["history"])
                .first()
                .and_then(|h| h["version"].as_u64())
                .or_else(|| v["status"]["lastReleaseRevision"].as_u64());
            if let Some(version) = latest {
                let target = s(&spec["targetNamespace"]);
                let release = match s(&spec["releaseName"]) {
                    "" if !target.is_empty() => format!("{target}-{}", o.name),
                    "" => o.name.clone(),
                    r => r.to_owned(),
                };
                let storage_ns = match (s(&spec["storageNamespace"]), target) {
                    ("", "") => ns,
                    ("", t) => t,
                    (sn, _) => sn,
                };
                let name = format!("sh.helm.release.v1.{release}.v{version}");
                push(&mut out, "", "secrets", storage_ns, &name, "r");
            }
        }
        _ => {}
    }
    out
}

/// `dependsOn`, `kubeConfig.secretRef` and `serviceAccountName` of a Flux object.
fn flux_common(kinds: &Kinds, spec: &Value, ns: &str, group: &str, kind: &str, out: &mut Vec<Ref>) {
    for d in arr(&spec["dependsOn"]) {
        kinded_ref(kinds, d, group, kind, ns, out);
    }
    let kc = s(&spec["kubeConfig"]["secretRef"]["name"]);
    push(out, "", "secrets", ns, kc, "r");
    push(
        out,
        "",
        "serviceaccounts",
        ns,
        s(&spec["serviceAccountName"]),
        "r",
    );
}

/// The graph a correct server converges to for `request` over `objects`.
pub fn expected_graph(discovery: &[ApiResource], objects: &[Object], request: &Value) -> Expected {
    let queries = parse_queries(request);

    // Watched resources: queries per GVR, then one version per group+resource.
    // (group, resource) → the included versions: (version, query index, namespaced).
    type Candidates<'a> = BTreeMap<(String, String), Vec<(&'a str, usize, bool)>>;
    let mut candidates = Candidates::new();
    let mut kinds = Kinds::new();
    for res in discovery {
        if res.resource.contains('/') {
            continue;
        }
        kinds.insert((res.group.clone(), res.kind.clone()), res.resource.clone());
        if EXCLUDED_GROUPS.contains(&res.group.as_str())
            || !["list", "watch"]
                .iter()
                .all(|v| res.verbs.iter().any(|x| x == v))
        {
            continue;
        }
        let mut vars = Map::new();
        vars.insert("group".into(), json!(res.group));
        vars.insert("version".into(), json!(res.version));
        vars.insert("resource".into(), json!(res.resource));
        vars.insert("namespaced".into(), json!(res.namespaced));
        for (i, q) in queries.iter().enumerate() {
            match q {
                Query::Exclude(e) if expr::matches(e, &vars) => break,
                Query::Include(e, _) if expr::matches(e, &vars) => {
                    candidates
                        .entry((res.group.clone(), res.resource.clone()))
                        .or_default()
                        .push((&res.version, i, res.namespaced));
                    break;
                }
                _ => {}
            }
        }
    }
    let mut watched = BTreeMap::new();
    let mut query_of = BTreeMap::new();
    for (gr, vs) in &candidates {
        let versions: Vec<&str> = vs.iter().map(|(v, _, _)| *v).collect();
        let chosen = select_version(&versions).expect("at least one version");
        let (_, qi, namespaced) = vs.iter().find(|(v, _, _)| *v == chosen).unwrap();
        watched.insert(gr.clone(), (chosen.to_owned(), *namespaced));
        query_of.insert(gr.clone(), *qi);
    }

    // Namespaces.
    let nsreq = &request["namespaces"];
    let names: Vec<String> = arr(&nsreq["names"])
        .iter()
        .map(|n| s(n).to_owned())
        .collect();
    let (ls, fs, ose) = (
        str_field(nsreq, "label_selector"),
        str_field(nsreq, "field_selector"),
        str_field(nsreq, "object_selector_expression"),
    );
    let ns_expr = (!ose.is_empty()).then(|| expr::parse(&ose));
    let namespace_objects: BTreeMap<&str, &Object> = objects
        .iter()
        .filter(|o| o.group.is_empty() && o.resource == "namespaces")
        .map(|o| (o.name.as_str(), o))
        .collect();
    let ns_passes = |o: &Object| {
        select::labels_match(&ls, &o.value["metadata"]["labels"])
            && select::fields_match(&fs, &o.value)
            && ns_expr
                .as_ref()
                .is_none_or(|e| expr::matches(e, &object_vars(o, "v1")))
    };
    let namespace_filter: Option<BTreeSet<String>> = if !names.is_empty() {
        Some(
            names
                .iter()
                .filter(|n| {
                    ns_expr.is_none()
                        || namespace_objects
                            .get(n.as_str())
                            .is_some_and(|o| ns_passes(o))
                })
                .cloned()
                .collect(),
        )
    } else if ls.is_empty() && fs.is_empty() && ns_expr.is_none() {
        None
    } else {
        Some(
            namespace_objects
                .iter()
                .filter(|(_, o)| ns_passes(o))
                .map(|(n, _)| (*n).to_owned())
                .collect(),
        )
    };

    // Vertices.
    let mut nodes: BTreeMap<Vx, (&Object, Content)> = BTreeMap::new();
    for o in objects {
        let gr = (o.group.clone(), o.resource.clone());
        let Some((version, namespaced)) = watched.get(&gr) else {
            continue;
        };
        if *namespaced
            && let Some(f) = &namespace_filter
            && !f.contains(&o.namespace)
        {
            continue;
        }
        let Query::Include(_, inc) = &queries[query_of[&gr]] else {
            unreachable!()
        };
        if !select::labels_match(&inc.label_selector, &o.value["metadata"]["labels"])
            || !select::fields_match(&inc.field_selector, &o.value)
            || inc
                .object
                .as_ref()
                .is_some_and(|e| !expr::matches(e, &object_vars(o, version)))
        {
            continue;
        }
        let content = if o.group.is_empty() && o.resource == "secrets" {
            Content::Empty
        } else if let Some(jp) = &inc.json_path {
            Content::Json(select::json_path(jp, &o.value))
        } else {
            Content::Object {
                resource_version: s(&o.value["metadata"]["resourceVersion"]).to_owned(),
            }
        };
        let vx = Vx {
            g: o.group.clone(),
            v: version.clone(),
            r: o.resource.clone(),
            ns: if *namespaced {
                o.namespace.clone()
            } else {
                String::new()
            },
            n: o.name.clone(),
        };
        nodes.insert(vx, (o, content));
    }

    // Arcs between them.
    let mut arcs: BTreeMap<ArcKey, Attrs> = BTreeMap::new();
    for (src, (o, _)) in &nodes {
        for r in refs(o, &kinds) {
            let Some((version, namespaced)) = watched.get(&(r.g.clone(), r.r.clone())) else {
                continue;
            };
            let dst = Vx {
                g: r.g,
                v: version.clone(),
                r: r.r,
                ns: if *namespaced { r.ns } else { String::new() },
                n: r.n,
            };
            let e = !nodes.contains_key(&dst);
            let a = arcs.entry((src.clone(), dst, r.t.to_owned())).or_default();
            a.c |= r.c;
            a.b |= r.b;
            a.e = e;
        }
    }

    // Roots.
    let roots = &request["roots"];
    let root_exprs: Vec<expr::Expr> = arr(&roots["object_selector_expressions"])
        .iter()
        .map(|e| expr::parse(s(e)))
        .collect();
    let visible: BTreeSet<Vx> = if root_exprs.is_empty() {
        nodes.keys().cloned().collect()
    } else {
        let undirected: BTreeSet<&str> =
            arr(&roots["ignore_arc_direction"]).iter().map(s).collect();
        let mut next: BTreeMap<&Vx, Vec<&Vx>> = BTreeMap::new();
        for (src, dst, t) in arcs.keys() {
            if nodes.contains_key(dst) {
                next.entry(src).or_default().push(dst);
                if undirected.contains(t.as_str()) {
                    next.entry(dst).or_default().push(src);
                }
            }
        }
        let mut seen: BTreeSet<Vx> = BTreeSet::new();
        let mut queue: VecDeque<&Vx> = nodes
            .iter()
            .filter(|(vx, (o, _))| {
                root_exprs
                    .iter()
                    .any(|e| expr::matches(e, &object_vars(o, &vx.v)))
            })
            .map(|(vx, _)| vx)
            .collect();
        while let Some(vx) = queue.pop_front() {
            if seen.insert(vx.clone()) {
                queue.extend(next.get(vx).into_iter().flatten().copied());
            }
        }
        seen
    };

    Expected {
        vertices: nodes
            .into_iter()
            .filter(|(vx, _)| visible.contains(vx))
            .map(|(vx, (_, c))| (vx, c))
            .collect(),
        arcs: arcs
            .into_iter()
            .filter(|((src, _, _), _)| visible.contains(src))
            .collect(),
        watched,
    }
}

/// How many arcs of each kind (`group/resource -type-> group/resource`) `expected`
/// holds: what a comparison covered.
pub fn census(expected: &Expected) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for (s, d, t) in expected.arcs.keys() {
        *out.entry(format!("{}/{} -{t}-> {}/{}", s.g, s.r, d.g, d.r))
            .or_default() += 1;
    }
    out
}

/// The differences between `expected` and a client's graph, `None` when equal;
/// summarised by kind of difference, with a few examples each.
pub fn diff(
    expected: &Expected,
    vertices: &BTreeMap<Vx, Payload>,
    arcs: &BTreeMap<ArcKey, Attrs>,
) -> Option<String> {
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut add = |what: String, example: String| groups.entry(what).or_default().push(example);
    let kind = |vx: &Vx| format!("{}/{}", vx.g, vx.r);
    for (vx, c) in &expected.vertices {
        match vertices.get(vx) {
            None => add(format!("missing vertex {}", kind(vx)), vx.to_string()),
            Some(p) => {
                if let Err(e) = c.check(p) {
                    add(format!("wrong content {}", kind(vx)), format!("{vx}: {e}"));
                }
            }
        }
    }
    for vx in vertices.keys() {
        if !expected.vertices.contains_key(vx) {
            add(format!("unexpected vertex {}", kind(vx)), vx.to_string());
        }
    }
    let arc_kind = |(s, d, t): &ArcKey| format!("{} -{t}-> {}", kind(s), kind(d));
    for (k, a) in &expected.arcs {
        match arcs.get(k) {
            None => add(
                format!("missing arc {}", arc_kind(k)),
                format!("{} -> {} {a}", k.0, k.1),
            ),
            Some(got) if got != a => add(
                format!("wrong attributes {}", arc_kind(k)),
                format!("{} -> {}: {got}, want {a}", k.0, k.1),
            ),
            Some(_) => {}
        }
    }
    for (k, a) in arcs {
        if !expected.arcs.contains_key(k) {
            add(
                format!("unexpected arc {}", arc_kind(k)),
                format!("{} -> {} {a}", k.0, k.1),
            );
        }
    }
    if groups.is_empty() {
        return None;
    }
    let mut out = format!(
        "expected {} vertices / {} arcs, the client has {} / {}:\n",
        expected.vertices.len(),
        expected.arcs.len(),
        vertices.len(),
        arcs.len()
    );
    for (what, examples) in groups {
        out.push_str(&format!("  {what}: {} (e.g. ", examples.len()));
        out.push_str(
            &examples
                .iter()
                .take(3)
                .cloned()
                .collect::<Vec<_>>()
                .join("; "),
        );
        out.push_str(")\n");
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_in_natural_order() {
        assert_eq!(select_version(&["v1beta1", "v1"]), Some("v1"));
        assert_eq!(select_version(&["v2", "v10", "v1"]), Some("v10"));
        assert_eq!(select_version(&["v2beta1", "v10beta1"]), Some("v10beta1"));
        assert_eq!(select_version(&["v1alpha1", "v1beta2"]), Some("v1beta2"));
        assert_eq!(select_version(&["v1beta1", "v2alpha1", "v1"]), Some("v1"));
        assert_eq!(select_version(&[]), None);
    }

    fn res(g: &str, v: &str, r: &str, kind: &str, namespaced: bool) -> ApiResource {
        ApiResource {
            group: g.into(),
            version: v.into(),
            resource: r.into(),
            kind: kind.into(),
            namespaced,
            verbs: vec!["list".into(), "watch".into()],
        }
    }

    fn obj(g: &str, r: &str, ns: &str, value: Value) -> Object {
        Object {
            group: g.into(),
            resource: r.into(),
            namespace: ns.into(),
            name: value["metadata"]["name"].as_str().unwrap().into(),
            value,
        }
    }

    fn vx(g: &str, v: &str, r: &str, ns: &str, n: &str) -> Vx {
        Vx {
            g: g.into(),
            v: v.into(),
            r: r.into(),
            ns: ns.into(),
            n: n.into(),
        }
    }

    /// The model itself, on a hand-made cluster: owner arcs point up, roots without
    /// `ignore_arc_direction` see only downwards.
    #[test]
    fn owner_arcs_missing_destinations_and_roots() {
        let disc = [
            res("", "v1", "pods", "Pod", true),
            res("", "v1", "pods/status", "Pod", true),
            res("", "v1", "configmaps", "ConfigMap", true),
            res("apps", "v1", "replicasets", "ReplicaSet", true),
            res("apps", "v1", "deployments", "Deployment", true),
            res("events.k8s.io", "v1", "events", "Event", true),
        ];
        let objects = [
            obj(
                "apps",
                "deployments",
                "ns",
                json!({"metadata": {"name": "web", "resourceVersion": "1"}}),
            ),
            obj(
                "apps",
                "replicasets",
                "ns",
                json!({"metadata": {"name": "web-1", "resourceVersion": "2",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "controller": true}]}}),
            ),
            obj(
                "",
                "pods",
                "ns",
                json!({"metadata": {"name": "web-1-a", "resourceVersion": "3",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "controller": true, "blockOwnerDeletion": true}]},
                "spec": {"volumes": [{"configMap": {"name": "cm"}}, {"configMap": {"name": "cm"}}]}}),
            ),
            obj(
                "events.k8s.io",
                "events",
                "ns",
                json!({"metadata": {"name": "ev"}}),
            ),
        ];
        let all = expected_graph(
            &disc,
            &objects,
            &json!({"queries": [{"include": {"resource_selector_expression": "true"}}]}),
        );
        assert_eq!(all.vertices.len(), 3, "{:?}", all.vertices);
        let pod = vx("", "v1", "pods", "ns", "web-1-a");
        let rs = vx("apps", "v1", "replicasets", "ns", "web-1");
        let cm = vx("", "v1", "configmaps", "ns", "cm");
        assert_eq!(
            all.arcs[&(pod.clone(), rs.clone(), "or".into())],
            Attrs {
                c: true,
                b: true,
                e: false
            }
        );
        assert_eq!(
            all.arcs[&(pod.clone(), cm, "r".into())],
            Attrs {
                c: false,
                b: false,
                e: true
            }
        );
        assert_eq!(all.arcs.len(), 3);

        let roots = |ignore: Value| {
            json!({"queries": [{"include": {"resource_selector_expression": "true"}}],
                "roots": {"object_selector_expressions": ["resource == 'deployments' && name == 'web'"],
                          "ignore_arc_direction": ignore}})
        };
        let down = expected_graph(&disc, &objects, &roots(json!([])));
        assert_eq!(down.vertices.len(), 1);
        assert!(down.arcs.is_empty());
        let both = expected_graph(&disc, &objects, &roots(json!(["or"])));
        assert_eq!(both.vertices.len(), 3);
        assert_eq!(both.arcs.len(), 3);
    }
}
