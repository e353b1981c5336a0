//! The generator's tests: counts, determinism, and the references §6 lists.
use std::collections::{BTreeMap, BTreeSet};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::*;

/// Every object of `resource` in the cluster.
fn all(sim: &KubeSim, resource: &str) -> Vec<Value> {
    let k = kind(resource).unwrap();
    sim.shared.lock().of(k).map(|(_, o)| o.value()).collect()
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v}"))
}

/// The Pod spec references of §6 in `spec` (a Pod's, or a template's):
/// (resource, name).
fn pod_refs(spec: &Value) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let mut add = |r: &'static str, v: &Value| {
        if let Some(n) = v.as_str() {
            out.push((r, n.to_owned()));
        }
    };
    for v in spec["volumes"].as_array().into_iter().flatten() {
        add("configmaps", &v["configMap"]["name"]);
        add("secrets", &v["secret"]["secretName"]);
        add(
            "persistentvolumeclaims",
            &v["persistentVolumeClaim"]["claimName"],
        );
        for p in v["projected"]["sources"].as_array().into_iter().flatten() {
            add("configmaps", &p["configMap"]["name"]);
            add("secrets", &p["secret"]["name"]);
        }
    }
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        for c in spec[list].as_array().into_iter().flatten() {
            for e in c["env"].as_array().into_iter().flatten() {
                add("configmaps", &e["valueFrom"]["configMapKeyRef"]["name"]);
                add("secrets", &e["valueFrom"]["secretKeyRef"]["name"]);
            }
            for e in c["envFrom"].as_array().into_iter().flatten() {
                add("configmaps", &e["configMapRef"]["name"]);
                add("secrets", &e["secretRef"]["name"]);
            }
        }
    }
    add("serviceaccounts", &spec["serviceAccountName"]);
    for p in spec["imagePullSecrets"].as_array().into_iter().flatten() {
        add("secrets", &p["name"]);
    }
    add("nodes", &spec["nodeName"]);
    add("priorityclasses", &spec["priorityClassName"]);
    add("runtimeclasses", &spec["runtimeClassName"]);
    out
}

#[test]
fn generated_clusters_are_exact_deterministic_and_their_references_resolve() {
    let sim = KubeSim::new(10);
    let base = sim.objects().len();
    let n = generate(&sim, 3000, 7);
    assert_eq!(n, 3000);
    assert_eq!(
        sim.objects().len(),
        base + n,
        "exactly as many objects as asked for"
    );
    for want in [0, 1, 13, 14, 100, 137, 500] {
        let small = KubeSim::new(10);
        assert_eq!(generate(&small, want, 3), want);
        assert_eq!(small.objects().len(), base + want);
    }

    // The same seed, the same names; another seed, others.
    let again = KubeSim::new(10);
    assert_eq!(generate(&again, 3000, 7), n);
    let names = |s: &KubeSim| -> Vec<String> {
        s.objects()
            .iter()
            .map(|o| format!("{}/{}/{}", o.resource, o.namespace, o.name))
            .collect()
    };
    assert_eq!(names(&sim), names(&again));
    let other = KubeSim::new(10);
    generate(&other, 3000, 8);
    assert_ne!(names(&sim), names(&other));

    // Every kind of docs/graph-api.md §6 is there.
    let objects = sim.objects();
    let mut per: BTreeMap<&str, usize> = BTreeMap::new();
    for o in &objects {
        *per.entry(o.resource).or_default() += 1;
    }
    for r in [
        "namespaces",
        "pods",
        "configmaps",
        "secrets",
        "serviceaccounts",
        "services",
        "persistentvolumeclaims",
        "persistentvolumes",
        "nodes",
        "deployments",
        "replicasets",
        "statefulsets",
        "daemonsets",
        "jobs",
        "cronjobs",
        "ingresses",
        "ingressclasses",
        "storageclasses",
        "priorityclasses",
        "runtimeclasses",
        "widgets",
        "kustomizations",
        "helmreleases",
        "gitrepositories",
        "helmrepositories",
        "ocirepositories",
        "customresourcedefinitions",
    ] {
        assert!(per.get(r).copied().unwrap_or(0) > 0, "no {r}: {per:?}");
    }

    let by_uid: BTreeMap<String, Value> = objects
        .iter()
        .map(|o| {
            let v = o.value();
            (s(&v["metadata"]["uid"]).to_owned(), v)
        })
        .collect();
    let exists = |resource: &str, ns: &str, name: &str| {
        let k = kind(resource).unwrap();
        let ns = if k.namespaced { ns } else { "" };
        assert!(
            sim.get(resource, ns, name).is_some(),
            "{resource} {ns}/{name} missing"
        );
    };
    let mut uses: BTreeSet<&str> = BTreeSet::new();
    for o in &objects {
        let v = o.value();
        let ns = o.namespace.as_str();
        // Owner references point at the owner's uid and kind.
        for r in v["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let owner = by_uid
                .get(s(&r["uid"]))
                .unwrap_or_else(|| panic!("owner of {}/{} missing", o.resource, o.name));
            assert_eq!(owner["kind"], r["kind"]);
            assert_eq!(owner["metadata"]["name"], r["name"]);
            assert_eq!(owner["apiVersion"], r["apiVersion"]);
            assert_eq!(
                (r["controller"].clone(), r["blockOwnerDeletion"].clone()),
                (json!(true), json!(true))
            );
        }
        let spec = &v["spec"];
        match o.resource {
            "pods" => {
                assert!(
                    v["metadata"]["ownerReferences"].is_array(),
                    "every Pod has a controller"
                );
                for (r, name) in pod_refs(spec) {
                    exists(r, ns, &name);
                }
                for (key, what) in [
                    ("initContainers", "init"),
                    ("ephemeralContainers", "ephemeral"),
                    ("priorityClassName", "priority"),
                    ("runtimeClassName", "runtime"),
                ] {
                    if !spec[key].is_null() {
                        uses.insert(what);
                    }
                }
                if spec["volumes"].to_string().contains("\"projected\"") {
                    uses.insert("projected");
                }
            }
            "deployments" | "replicasets" | "statefulsets" | "daemonsets" | "jobs" => {
                if o.resource == "statefulsets" {
                    exists("services", ns, s(&spec["serviceName"]));
                }
                for (r, name) in pod_refs(&spec["template"]["spec"]) {
                    exists(r, ns, &name);
                }
            }
            "cronjobs" => {
                for (r, name) in pod_refs(&spec["jobTemplate"]["spec"]["template"]["spec"]) {
                    exists(r, ns, &name);
                }
            }
            "serviceaccounts" => {
                for key in ["secrets", "imagePullSecrets"] {
                    for r in v[key].as_array().into_iter().flatten() {
                        exists("secrets", ns, s(&r["name"]));
                        uses.insert(if key == "secrets" {
                            "sa-secrets"
                        } else {
                            "sa-pull"
                        });
                    }
                }
            }
            "persistentvolumeclaims" => {
                exists("persistentvolumes", "", s(&spec["volumeName"]));
                exists("storageclasses", "", s(&spec["storageClassName"]));
                let pv = sim
                    .get("persistentvolumes", "", s(&spec["volumeName"]))
                    .unwrap();
                assert_eq!(pv["spec"]["claimRef"]["uid"], v["metadata"]["uid"]);
            }
            "ingresses" => {
                exists("ingressclasses", "", s(&spec["ingressClassName"]));
                exists("secrets", ns, s(&spec["tls"][0]["secretName"]));
                exists(
                    "services",
                    ns,
                    s(&spec["defaultBackend"]["service"]["name"]),
                );
                exists(
                    "services",
                    ns,
                    s(&spec["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"]),
                );
            }
            "kustomizations" => {
                exists("gitrepositories", ns, s(&spec["sourceRef"]["name"]));
                for d in spec["dependsOn"].as_array().into_iter().flatten() {
                    exists("kustomizations", ns, s(&d["name"]));
                    uses.insert("ks-depends");
                }
                for f in spec["postBuild"]["substituteFrom"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    let r = if f["kind"] == "Secret" {
                        "secrets"
                    } else {
                        "configmaps"
                    };
                    exists(r, ns, s(&f["name"]));
                }
                if let Some(n) = spec["decryption"]["secretRef"]["name"].as_str() {
                    exists("secrets", ns, n);
                }
                if let Some(n) = spec["kubeConfig"]["secretRef"]["name"].as_str() {
                    exists("secrets", ns, n);
                    uses.insert("ks-kubeconfig");
                }
                if let Some(n) = spec["serviceAccountName"].as_str() {
                    exists("serviceaccounts", ns, n);
                }
                // The inventory lists objects that exist: <ns>_<name>_<group>_<Kind>.
                for e in v["status"]["inventory"]["entries"].as_array().unwrap() {
                    let id: Vec<&str> = s(&e["id"]).split('_').collect();
                    let [ens, name, group, kind_name] = id[..] else {
                        panic!("bad inventory id {e}")
                    };
                    let k = KINDS
                        .iter()
                        .find(|k| k.group == group && k.kind == kind_name)
                        .unwrap_or_else(|| panic!("{e}: no such kind"));
                    assert_eq!(e["v"], k.versions[0]);
                    assert_eq!(ens, if k.namespaced { ns } else { "" }, "{e}");
                    exists(&k.id(), ens, name);
                    uses.insert("inventory");
                }
            }
            "helmreleases" => {
                if let Some(r) = spec["chartRef"].as_object() {
                    assert_eq!(r["kind"], "OCIRepository");
                    exists("ocirepositories", ns, s(&r["name"]));
                    exists("secrets", ns, s(&spec["kubeConfig"]["secretRef"]["name"]));
                    uses.insert("hr-chartref");
                    assert!(v["status"]["history"].is_null(), "not installed yet");
                    continue;
                }
                let source = &spec["chart"]["spec"]["sourceRef"];
                assert_eq!(source["kind"], "HelmRepository");
                exists("helmrepositories", ns, s(&source["name"]));
                for f in spec["valuesFrom"].as_array().into_iter().flatten() {
                    let r = if f["kind"] == "Secret" {
                        "secrets"
                    } else {
                        "configmaps"
                    };
                    exists(r, ns, s(&f["name"]));
                }
                for d in spec["dependsOn"].as_array().into_iter().flatten() {
                    exists("helmreleases", ns, s(&d["name"]));
                    uses.insert("hr-depends");
                }
                // The storage Secret of the latest release, as its name is derived.
                let latest = &v["status"]["history"][0];
                let storage = format!(
                    "sh.helm.release.v1.{}.v{}",
                    s(&latest["name"]),
                    latest["version"]
                );
                let secret = sim
                    .get("secrets", s(&v["status"]["storageNamespace"]), &storage)
                    .unwrap_or_else(|| panic!("{storage} missing"));
                assert_eq!(secret["type"], "helm.sh/release.v1");
                assert_eq!(secret["metadata"]["labels"]["owner"], "helm");
                assert_eq!(secret["metadata"]["labels"]["status"], "deployed");
                assert_eq!(
                    secret["metadata"]["labels"]["version"],
                    latest["version"].to_string()
                );
                assert_eq!(v["status"]["lastAttemptedRevision"], latest["chartVersion"]);
                // data.release: base64 (Secret data) of base64 of gzip of JSON.
                let once = BASE64.decode(s(&secret["data"]["release"])).unwrap();
                let gz = BASE64.decode(once).unwrap();
                let release: Value = serde_json::from_slice(&gunzip(gz)).unwrap();
                assert_eq!(release["name"], latest["name"]);
                assert_eq!(release["version"], latest["version"]);
                for doc in serde_yaml::Deserializer::from_str(s(&release["manifest"])) {
                    use serde::Deserialize as _;
                    let m = Value::deserialize(doc).unwrap();
                    let k =
                        crate::resources::kind_named(s(&m["apiVersion"]), s(&m["kind"])).unwrap();
                    exists(
                        &k.id(),
                        s(&m["metadata"]["namespace"]),
                        s(&m["metadata"]["name"]),
                    );
                    uses.insert("manifest");
                }
            }
            "gitrepositories" => exists("secrets", ns, s(&spec["secretRef"]["name"])),
            _ => {}
        }
    }
    assert_eq!(
        uses.into_iter().collect::<Vec<_>>(),
        [
            "ephemeral",
            "hr-chartref",
            "hr-depends",
            "init",
            "inventory",
            "ks-depends",
            "ks-kubeconfig",
            "manifest",
            "priority",
            "projected",
            "runtime",
            "sa-pull",
            "sa-secrets"
        ]
    );

    // Every Service but the Helm chart's selects a Pod of its namespace.
    let pods = all(&sim, "pods");
    for svc in all(&sim, "services") {
        let ns = s(&svc["metadata"]["namespace"]);
        if svc["metadata"]["name"] == "metrics" {
            continue;
        }
        let sel = svc["spec"]["selector"].as_object().unwrap();
        assert!(
            pods.iter().any(|p| p["metadata"]["namespace"] == ns
                && sel.iter().all(|(k, v)| &p["metadata"]["labels"][k] == v)),
            "service {ns}/{} selects nothing",
            svc["metadata"]["name"]
        );
    }
}

#[test]
fn the_parts_stay_within_their_budgets() {
    // The cluster part first: Nodes, classes, a DaemonSet and its Pods.
    let sim = KubeSim::new(10);
    let mut sink = Sink {
        sim: &sim,
        created: 0,
        limit: usize::MAX,
    };
    let mut rng = Rng(1);
    let nodes = cluster(&mut sink, &mut rng, 4);
    assert_eq!(sink.created, 2 * 4 + 5);
    for seed in 0..40 {
        let mut rng = Rng(seed);
        let mut ns = Namespace {
            name: format!("ns-{seed}"),
            nodes: nodes.clone(),
            inventory: Vec::new(),
            infra: Vec::new(),
            first_app: None,
        };
        let before = sink.created;
        header(&mut sink, &mut ns);
        assert_eq!(sink.created - before, NS_HEADER);
        for a in 0..2 {
            let before = sink.created;
            app(&mut sink, &mut rng, &mut ns, &format!("api-{a}"));
            assert!(sink.created - before <= APP_MAX);
        }
        let before = sink.created;
        extras(&mut sink, &mut rng, &mut ns);
        assert!(sink.created - before <= EXTRAS_MAX);
        let before = sink.created;
        flux(&mut sink, &mut rng, &mut ns, seed as usize);
        assert!(sink.created - before <= FLUX_MAX);
        if seed % 2 == 1 || seed % 4 == 0 {
            assert_eq!(sink.created - before, FLUX_MAX, "the largest Flux parts");
        }
    }
}

#[test]
fn gzip_members_are_read_by_gzip() {
    for len in [0usize, 5, 70_000] {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        assert_eq!(gunzip(gzip(&data)), data, "{len}");
    }
}

/// `gz` decompressed by the system's `gzip -dc`.
fn gunzip(gz: Vec<u8>) -> Vec<u8> {
    use std::io::Write as _;
    let mut child = std::process::Command::new("gzip")
        .arg("-dc")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("gzip is installed");
    let mut stdin = child.stdin.take().unwrap();
    // Written from another thread: gzip's output fills its pipe before all the
    // input is in.
    let writer = std::thread::spawn(move || stdin.write_all(&gz).unwrap());
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(out.status.success(), "gzip -d refused the data");
    out.stdout
}
