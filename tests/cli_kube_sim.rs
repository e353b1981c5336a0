//! `podgate kube-sim` as a process, driven by the installed `kubectl` (the test fails
//! when kubectl is missing): objects from a seed file, get with a label selector,
//! apply, delete, `get -w` seeing an apply, a bad seed named, a clean SIGTERM, a
//! generated cluster listed whole, one churning with a denied resource, and RBAC
//! enforced over HTTPS.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

const SEED: &str = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: shop
---
apiVersion: v1
kind: Pod
metadata:
  name: web-1
  namespace: shop
  labels: {app: web}
spec:
  containers: [{name: nginx, image: "nginx:1.27"}]
---
apiVersion: v1
kind: Pod
metadata:
  name: db-1
  namespace: shop
  labels: {app: db}
spec:
  containers: [{name: pg, image: "postgres:16"}]
status:
  phase: Running
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
data:
  mode: demo
"#;

const NEW_POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: web-2
  namespace: shop
  labels: {app: web}
spec:
  containers: [{name: nginx, image: "nginx:1.27"}]
"#;

/// A running `podgate kube-sim`, killed if the test panics before SIGTERM.
struct Sim {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Sim {
    /// `podgate kube-sim --listen 127.0.0.1:0 ARGS --kubeconfig-out KUBECONFIG`.
    fn start(args: &[&str], kubeconfig: &Path) -> Sim {
        let mut child = Command::new(env!("CARGO_BIN_EXE_podgate"))
            .args(["kube-sim", "--listen", "127.0.0.1:0"])
            .args(args)
            .arg("--kubeconfig-out")
            .arg(kubeconfig)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let lines = line_channel(child.stdout.take().unwrap());
        Sim { child, lines }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Forward the lines of `r` to a channel, from a thread.
fn line_channel(r: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// The next line starting with `prefix`, the rest of it.
fn expect_prefix(lines: &mpsc::Receiver<String>, prefix: &str) -> String {
    loop {
        let line = lines
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("no line starting {prefix:?}: {e}"));
        if let Some(rest) = line.strip_prefix(prefix) {
            return rest.to_owned();
        }
    }
}

/// Run kubectl to completion: (success, stdout, stderr).
fn kubectl(config: &Path, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    let mut child = kubectl_command(config, args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl is installed");
    let mut input = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).unwrap();
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn kubectl_command(config: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("kubectl");
    c.arg("--kubeconfig").arg(config).args(args);
    // kubectl's discovery cache (~/.kube/cache) in the test's own directory, not in
    // one an earlier run left behind.
    c.env(
        "HOME",
        config.parent().expect("the kubeconfig is in a directory"),
    );
    c
}

/// `kubectl ARGS` left running (a watch), and its output lines.
fn kubectl_watch(config: &Path, args: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let mut child = kubectl_command(config, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl is installed");
    let lines = line_channel(child.stdout.take().unwrap());
    (child, lines)
}

fn names(list_json: &str) -> Vec<String> {
    let list: Value = serde_json::from_str(list_json).unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn kube_sim_serves_kubectl_from_a_seed_file_until_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let seed = dir.path().join("seed.yaml");
    std::fs::write(&seed, SEED).unwrap();
    let config_out = dir.path().join("kubeconfig");
    let mut sim = Sim::start(&["--seed", seed.to_str().unwrap()], &config_out);
    assert_eq!(
        expect_prefix(&sim.lines, "kube-sim: loaded "),
        format!("4 objects from {}", seed.display())
    );
    let url = expect_prefix(&sim.lines, "kube-sim: Kubernetes API on ");
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let config = PathBuf::from(expect_prefix(&sim.lines, "kube-sim: kubeconfig "));
    assert_eq!(config, config_out);
    assert!(std::fs::read_to_string(&config).unwrap().contains(&url));

    // The seeded objects, across namespaces.
    let (ok, out, err) = kubectl(&config, &["get", "pods", "-A", "-o", "name"], None);
    assert!(ok, "get -A: {err}");
    assert_eq!(out.lines().collect::<Vec<_>>(), ["pod/db-1", "pod/web-1"]);
    let (ok, out, err) = kubectl(
        &config,
        &["get", "configmap", "settings", "-o", "json"],
        None,
    );
    assert!(ok, "get cm: {err}");
    let cm: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(cm["data"]["mode"], "demo");
    assert_eq!(cm["metadata"]["namespace"], "default");

    // A label selector, as JSON.
    let (ok, out, err) = kubectl(
        &config,
        &["get", "pods", "-n", "shop", "-l", "app=web", "-o", "json"],
        None,
    );
    assert!(ok, "get -l: {err}");
    assert_eq!(names(&out), ["web-1"]);

    // get -w sees an ADDED event from an apply made once the initial list is out.
    let (mut watch, events) = kubectl_watch(
        &config,
        &[
            "get",
            "pods",
            "-n",
            "shop",
            "-w",
            "--output-watch-events",
            "-o",
            "custom-columns=EVENT:.type,NAME:.object.metadata.name",
        ],
    );
    let event = |want: &str| {
        loop {
            let line = events
                .recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|e| panic!("kubectl -w never printed {want:?}: {e}"));
            if line.split_whitespace().collect::<Vec<_>>().join(" ") == want {
                return;
            }
        }
    };
    event("ADDED db-1");
    event("ADDED web-1");
    let (ok, out, err) = kubectl(&config, &["apply", "-f", "-"], Some(NEW_POD));
    assert!(ok, "apply: {out}\n{err}");
    assert!(out.contains("pod/web-2 created"), "{out}");
    event("ADDED web-2");
    let _ = watch.kill();
    let _ = watch.wait();

    let (ok, out, err) = kubectl(
        &config,
        &["get", "pods", "-n", "shop", "-l", "app=web", "-o", "json"],
        None,
    );
    assert!(ok, "get -l: {err}");
    assert_eq!(names(&out), ["web-1", "web-2"]);

    // delete, then it is gone.
    let (ok, out, err) = kubectl(
        &config,
        &["delete", "pod", "-n", "shop", "web-1", "--wait=false"],
        None,
    );
    assert!(ok, "delete: {out}\n{err}");
    assert!(out.contains("pod \"web-1\" deleted"), "{out}");
    let (ok, _, err) = kubectl(&config, &["get", "pod", "-n", "shop", "web-1"], None);
    assert!(!ok && err.contains("NotFound"), "{err}");

    // SIGTERM: a clean stop.
    crate::common::process::terminate(sim.child.id());
    expect_prefix(&sim.lines, "kube-sim: stopping");
    let status = sim.child.wait().unwrap();
    assert!(status.success(), "{status}");
}

#[test]
fn a_bad_seed_document_is_named_and_nothing_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let seed = dir.path().join("seed.yaml");
    std::fs::write(
        &seed,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n---\napiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: d}\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_podgate"))
        .args(["kube-sim", "--listen", "127.0.0.1:0", "--seed"])
        .arg(&seed)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("loading --seed {}", seed.display()))
            && err
                .contains("seed document 2: apiVersion \"policy/v1\" kind \"PodDisruptionBudget\""),
        "{err}"
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("Kubernetes API on"),
        "served despite a bad seed"
    );
}

#[test]
fn a_generated_cluster_is_listed_whole_by_kubectl() {
    let dir = tempfile::tempdir().unwrap();
    let config_out = dir.path().join("kubeconfig");
    let sim = Sim::start(&["--objects", "500", "--gen-seed", "42"], &config_out);
    let generated: usize = expect_prefix(&sim.lines, "kube-sim: generated ")
        .strip_suffix(" objects (--gen-seed 42)")
        .expect("the seed is named")
        .parse()
        .unwrap();
    assert!(generated >= 500, "{generated}");
    let config = PathBuf::from(expect_prefix(&sim.lines, "kube-sim: kubeconfig "));

    let (ok, out, err) = kubectl(
        &config,
        &[
            "get",
            "ns,secrets,cm,sa,svc,deploy,rs,ds,pods,pvc,pv,nodes,sts,jobs,cronjobs,ingresses,ingressclasses,sc,pc,runtimeclasses,widgets,ks,hr,gitrepo,helmrepo,ocirepo,crds",
            "-A",
            "-o",
            "json",
        ],
        None,
    );
    assert!(ok, "get: {err}");
    let list: Value = serde_json::from_str(&out).unwrap();
    let items = list["items"].as_array().unwrap();
    // Exactly what was generated, besides default, kube-system and the six
    // CustomResourceDefinitions.
    assert_eq!(generated, 500);
    assert_eq!(items.len(), generated + 2 + 6);
    let uids: std::collections::HashSet<&str> = items
        .iter()
        .map(|i| i["metadata"]["uid"].as_str().unwrap())
        .collect();
    let mut owned = 0;
    for i in items {
        for r in i["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
        {
            assert!(uids.contains(r["uid"].as_str().unwrap()), "{r}");
            owned += 1;
        }
    }
    let count = |kind: &str| items.iter().filter(|i| i["kind"] == kind).count();
    assert_eq!(owned, count("Pod") + count("ReplicaSet") + count("Job"));
    for kind in [
        "Widget",
        "StatefulSet",
        "Ingress",
        "DaemonSet",
        "Node",
        "PersistentVolume",
        "Kustomization",
        "HelmRelease",
        "GitRepository",
        "HelmRepository",
        "OCIRepository",
    ] {
        assert!(count(kind) > 0, "no {kind}");
    }
    assert_eq!(count("CronJob"), count("Job"));
    assert!(count("Deployment") > 10, "{}", count("Deployment"));
}

#[test]
fn a_churning_cluster_is_watched_and_a_denied_resource_is_forbidden() {
    let dir = tempfile::tempdir().unwrap();
    let config_out = dir.path().join("kubeconfig");
    let sim = Sim::start(
        &[
            "--objects",
            "400",
            "--churn",
            "40",
            "--deny",
            "apps/deployments",
            "--deny",
            "/secrets",
        ],
        &config_out,
    );
    let config = PathBuf::from(expect_prefix(&sim.lines, "kube-sim: kubeconfig "));
    assert_eq!(
        expect_prefix(&sim.lines, "kube-sim: churning "),
        "40 changes a second (--gen-seed 1)"
    );

    for (resource, group) in [("deployments", "apps"), ("secrets", "")] {
        let (ok, _, err) = kubectl(&config, &["get", resource, "-A"], None);
        assert!(!ok, "{resource} listed");
        let qualified = if group.is_empty() {
            resource.to_owned()
        } else {
            format!("{resource}.{group}")
        };
        assert_eq!(
            err.trim(),
            format!(
                "Error from server (Forbidden): {qualified} is forbidden: User \"system:anonymous\" cannot list resource \"{resource}\" in API group \"{group}\" at the cluster scope"
            )
        );
    }

    // The watch sees the churn: Pods coming, changing and going.
    let (mut watch, events) = kubectl_watch(
        &config,
        &[
            "get",
            "pods",
            "-A",
            "-w",
            "--watch-only",
            "--output-watch-events",
            "-o",
            "custom-columns=EVENT:.type,KIND:.object.kind",
        ],
    );
    let mut seen = std::collections::BTreeSet::new();
    while !["ADDED Pod", "DELETED Pod", "MODIFIED Pod"]
        .iter()
        .all(|w| seen.contains(*w))
    {
        let line = events
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("the churn stalled after {seen:?}: {e}"));
        seen.insert(line.split_whitespace().collect::<Vec<_>>().join(" "));
    }
    let _ = watch.kill();
    let _ = watch.wait();

    // An unserved resource is refused up front.
    let out = Command::new(env!("CARGO_BIN_EXE_podgate"))
        .args([
            "kube-sim",
            "--listen",
            "127.0.0.1:0",
            "--deny",
            "apps/daemonset",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("kube-sim serves no resource \"daemonset\" in group \"apps\""),
        "{err}"
    );
}

/// `--enforce-rbac`: HTTPS with a certificate the written kubeconfig trusts, whose
/// administrator token (`system:masters`) installs a role; a ServiceAccount's
/// token then does what its role grants and nothing else; no token is
/// `system:anonymous`, a wrong one is 401.
#[test]
fn enforced_rbac_serves_https_an_administrator_and_service_accounts() {
    let dir = tempfile::tempdir().unwrap();
    let config_out = dir.path().join("kubeconfig");
    let sim = Sim::start(&["--enforce-rbac"], &config_out);
    let url = expect_prefix(&sim.lines, "kube-sim: Kubernetes API on ");
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let admin = PathBuf::from(expect_prefix(&sim.lines, "kube-sim: kubeconfig "));
    assert_eq!(admin, config_out);

    // The administrator installs a reader of ConfigMaps in `shop`.
    let token = "reader-token-0123456789";
    let secret_data = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(token)
    };
    let manifests = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: shop}}\n---\n\
         apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: reader, namespace: shop}}\n---\n\
         apiVersion: v1\nkind: Secret\nmetadata:\n  name: reader-token\n  namespace: shop\n  \
         annotations: {{kubernetes.io/service-account.name: reader}}\n\
         type: kubernetes.io/service-account-token\ndata: {{token: {secret_data}}}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: read-cm, namespace: shop}}\n\
         rules: [{{apiGroups: [\"\"], resources: [configmaps], verbs: [get, list]}}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: read-cm, namespace: shop}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: read-cm}}\n\
         subjects: [{{kind: ServiceAccount, name: reader, namespace: shop}}]\n"
    );
    let (ok, out, err) = kubectl(&admin, &["apply", "-f", "-"], Some(&manifests));
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("rolebinding.rbac.authorization.k8s.io/read-cm created"),
        "{out}"
    );

    // The ServiceAccount: the admin's kubeconfig (same server and CA), its token.
    let admin_text = std::fs::read_to_string(&admin).unwrap();
    assert!(
        admin_text.contains("certificate-authority-data: "),
        "{admin_text}"
    );
    let admin_token = admin_text
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .expect("the administrator's token");
    let as_user = |t: &str, name: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, admin_text.replace(admin_token, t)).unwrap();
        path
    };
    let reader = as_user(token, "reader");
    let (ok, out, err) = kubectl(
        &reader,
        &["get", "configmaps", "-n", "shop", "-o", "name"],
        None,
    );
    assert!(ok, "{out}{err}");
    let (ok, _, err) = kubectl(&reader, &["get", "secrets", "-n", "shop"], None);
    assert!(!ok);
    assert_eq!(
        err.trim(),
        "Error from server (Forbidden): secrets is forbidden: User \"system:serviceaccount:shop:reader\" cannot list resource \"secrets\" in API group \"\" in the namespace \"shop\""
    );
    let (ok, _, err) = kubectl(&reader, &["get", "configmaps", "-n", "default"], None);
    assert!(!ok, "the Role is for shop only");
    assert!(err.contains("in the namespace \"default\""), "{err}");

    let (ok, _, err) = kubectl(
        &as_user("nobody-issued-this", "stranger"),
        &["get", "ns"],
        None,
    );
    assert!(!ok);
    assert!(err.contains("Unauthorized"), "{err}");
    let anonymous = dir.path().join("anonymous");
    std::fs::write(
        &anonymous,
        // Basic credentials: no bearer token, so anonymous, as kube-apiserver
        // (no authenticator reads them) treats them. (`user: {}` makes kubectl
        // prompt for a password.)
        admin_text.replace(&format!("token: {admin_token}"), "username: nobody"),
    )
    .unwrap();
    let (ok, _, err) = kubectl(&anonymous, &["get", "ns"], None);
    assert!(!ok);
    assert!(
        err.contains("User \"system:anonymous\" cannot list"),
        "{err}"
    );
}
