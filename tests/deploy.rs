//! The Kubernetes manifests under `deploy/` (Kustomize bases): `kubectl kustomize`
//! builds each; every Deployment probes `/healthz` and `/readyz` on its admin or
//! observability port, asks for resources, and is annotated for Prometheus; and
//! `kubectl apply --dry-run=server` accepts them against kube-sim (`podgate
//! kube-sim`), which answers a dry run as kube-apiserver does: validated, not
//! stored.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

/// The bases and the namespace each deploys to.
const BASES: &[(&str, &str)] = &[
    ("proxy", "podgate"),
    ("kas", "podgate"),
    ("agentk", "gitlab-agent"),
];

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Kills kube-sim when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn kubectl(args: &[&str]) -> (bool, String, String) {
    let out = Command::new("kubectl")
        .args(args)
        .output()
        .expect("kubectl is installed");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `kubectl kustomize deploy/<base>`: its objects.
fn build(base: &str) -> Vec<Value> {
    let dir = repo().join("deploy").join(base);
    let (ok, out, err) = kubectl(&["kustomize", dir.to_str().unwrap()]);
    assert!(ok, "kubectl kustomize {base}: {err}");
    serde_yaml::Deserializer::from_str(&out)
        .map(|d| {
            serde_yaml::from_value::<Value>(serde_yaml::Value::deserialize(d).unwrap()).unwrap()
        })
        .collect()
}

use serde::Deserialize as _;

#[test]
fn each_base_builds_with_probes_resources_and_scrape_annotations() {
    for (base, namespace) in BASES {
        let objects = build(base);
        let deployments: Vec<&Value> = objects
            .iter()
            .filter(|o| o["kind"] == "Deployment")
            .collect();
        assert_eq!(deployments.len(), 1, "{base}");
        let d = deployments[0];
        assert_eq!(d["metadata"]["namespace"], *namespace, "{base}");
        let template = &d["spec"]["template"];
        let c = &template["spec"]["containers"][0];
        let port_of = |name: &Value| {
            c["ports"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == *name)
                .map(|p| p["containerPort"].as_u64().unwrap())
                .unwrap_or_else(|| panic!("{base}: no port {name}"))
        };
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz", "{base}");
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz", "{base}");
        let probe_port = port_of(&c["readinessProbe"]["httpGet"]["port"]);
        let annotations = &template["metadata"]["annotations"];
        assert_eq!(annotations["prometheus.io/scrape"], "true", "{base}");
        assert_eq!(
            annotations["prometheus.io/port"],
            probe_port.to_string(),
            "{base}: metrics are on the probes' listener"
        );
        assert!(c["resources"]["requests"]["cpu"].is_string(), "{base}");
        assert!(c["resources"]["requests"]["memory"].is_string(), "{base}");
        assert!(c["resources"]["limits"]["memory"].is_string(), "{base}");
        // The selector kustomize fills in matches the pods.
        let selector = d["spec"]["selector"]["matchLabels"].as_object().unwrap();
        assert!(!selector.is_empty(), "{base}");
        for (k, v) in selector {
            assert_eq!(&template["metadata"]["labels"][k], v, "{base}");
        }
        // Services select the same pods.
        for s in objects.iter().filter(|o| o["kind"] == "Service") {
            assert_eq!(
                s["spec"]["selector"].as_object().unwrap(),
                selector,
                "{base}"
            );
        }
    }
}

/// `podgate kube-sim` on a free port: the process and its kubeconfig.
fn kube_sim(dir: &Path) -> (Running, PathBuf) {
    let config = dir.join("kubeconfig");
    let mut child = Command::new(env!("CARGO_BIN_EXE_podgate"))
        .args(["kube-sim", "--listen", "127.0.0.1:0", "--kubeconfig-out"])
        .arg(&config)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let running = Running(child);
    let (tx, rx) = std::sync::mpsc::channel();
    // Read its output to the end: a closed pipe would stop it at its next line.
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    while let Ok(line) = rx.recv_timeout(std::time::Duration::from_secs(60)) {
        if line.starts_with("kube-sim: kubeconfig ") {
            return (running, config);
        }
    }
    panic!("kube-sim wrote no kubeconfig within 60 s");
}

#[test]
fn the_bases_pass_a_server_side_dry_run_against_kube_sim() {
    let dir = tempfile::tempdir().unwrap();
    let (_sim, config) = kube_sim(dir.path());
    let config = config.to_str().unwrap();
    // The bases leave their namespace to you (`kubectl create namespace`, whose
    // protobuf body kube-sim does not take: the same object as YAML).
    let ns = dir.path().join("namespace.yaml");
    std::fs::write(
        &ns,
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: podgate\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: gitlab-agent\n",
    )
    .unwrap();
    let (ok, _, err) = kubectl(&["--kubeconfig", config, "apply", "-f", ns.to_str().unwrap()]);
    assert!(ok, "{err}");
    for (base, namespace) in BASES {
        let path = repo().join("deploy").join(base);
        let (ok, out, err) = kubectl(&[
            "--kubeconfig",
            config,
            "apply",
            "--dry-run=server",
            "-k",
            path.to_str().unwrap(),
        ]);
        assert!(
            ok,
            "kubectl apply --dry-run=server -k deploy/{base}: {err}{out}"
        );
        let applied = out
            .lines()
            .filter(|l| l.ends_with("(server dry run)"))
            .count();
        assert_eq!(applied, build(base).len(), "{base}: {out}");
        // A dry run stores nothing.
        let (ok, out, err) = kubectl(&[
            "--kubeconfig",
            config,
            "get",
            "deployments,services,configmaps,serviceaccounts,roles.rbac.authorization.k8s.io",
            "-n",
            namespace,
            "-o",
            "name",
        ]);
        assert!(ok, "{err}");
        assert_eq!(out.trim(), "", "{base}: the dry run stored {out}");
    }
}

/// The configuration files the bases ship are what `podgate proxy` and `podgate
/// kas` accept, apart from the files they name (Secrets mounted in the cluster).
#[test]
fn the_shipped_configurations_parse() {
    let text = std::fs::read_to_string(repo().join("deploy/proxy/proxy.toml")).unwrap();
    if let Err(e) = podgate_proxy::config::ProxyConfig::parse(&text, "deploy/proxy/proxy.toml") {
        panic!("{e}");
    }
    let dir = tempfile::tempdir().unwrap();
    // kas checks its secret files exist: point them at stand-ins.
    let text = std::fs::read_to_string(repo().join("deploy/kas/kas.toml"))
        .unwrap()
        .replace("/etc/kas", dir.path().to_str().unwrap());
    std::fs::create_dir_all(dir.path().join("secrets")).unwrap();
    std::fs::create_dir_all(dir.path().join("agent-keys")).unwrap();
    use base64::Engine as _;
    for (i, f) in ["gitlab_kas_secret", "kas_internal_secret", "metrics_token"]
        .iter()
        .enumerate()
    {
        let secret = base64::engine::general_purpose::STANDARD.encode([i as u8 + 1; 32]);
        std::fs::write(dir.path().join("secrets").join(f), secret).unwrap();
    }
    let path = dir.path().join("kas.toml");
    std::fs::write(&path, text).unwrap();
    if let Err(e) = podgate_kas::config::KasFileConfig::load(&path) {
        panic!("{e}");
    }
}

/// The Debian packages of `debian:bookworm-slim` the binary may rely on without
/// installing them (the C library and the GCC runtime).
const BASE_PACKAGES: &[&str] = &["libc6", "libgcc-s1"];

/// The `Dockerfile`, checked without a Docker engine (none runs on these
/// machines): its runtime stage installs the Debian package of every shared
/// library the built binary links (`ldd`, then `dpkg -S` on this Debian
/// bookworm machine), it builds the product binary (no `sim` feature), and every
/// Deployment's image is `podgate` with a first argument that is a subcommand of
/// that binary (`podgate <it> --help` succeeds).
#[test]
fn the_image_provides_the_binarys_libraries_and_runs_each_deployments_role() {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let build_line = dockerfile
        .lines()
        .find(|l| l.contains("cargo build"))
        .expect("a cargo build in the build stage");
    assert!(
        build_line.contains("--no-default-features"),
        "the image builds without the simulators: {build_line}"
    );
    let runtime = dockerfile.split("\nFROM ").last().expect("a runtime stage");
    assert!(runtime.starts_with("debian:bookworm-slim"), "{runtime}");
    let installed: Vec<&str> = runtime
        .split("--no-install-recommends")
        .nth(1)
        .expect("an apt-get install in the runtime stage")
        .split("&&")
        .next()
        .unwrap()
        .split_whitespace()
        .filter(|w| *w != "\\")
        .collect();
    assert!(runtime.contains("ENTRYPOINT [\"/usr/local/bin/podgate\"]"));

    let binary = env!("CARGO_BIN_EXE_podgate");
    let ldd = Command::new("ldd").arg(binary).output().unwrap();
    let ldd = String::from_utf8(ldd.stdout).unwrap();
    let libraries: Vec<&str> = ldd
        .lines()
        .filter_map(|l| l.split("=> ").nth(1))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(libraries.iter().any(|l| l.contains("libssl")), "{ldd}");
    for lib in libraries {
        // Merged /usr: dpkg knows each file under one of the two paths.
        let real = std::fs::canonicalize(lib).unwrap();
        let candidates = [
            real.display().to_string(),
            real.display().to_string().replacen("/usr/lib/", "/lib/", 1),
            Path::new(lib).display().to_string(),
        ];
        let package = candidates
            .iter()
            .find_map(|p| {
                let out = Command::new("dpkg").args(["-S", p]).output().ok()?;
                let text = String::from_utf8(out.stdout).ok()?;
                let pkg = text.split(':').next()?.trim().to_owned();
                (!pkg.is_empty()).then_some(pkg)
            })
            .unwrap_or_else(|| panic!("no Debian package holds {lib}"));
        assert!(
            installed.contains(&package.as_str()) || BASE_PACKAGES.contains(&package.as_str()),
            "{lib} is in {package}, which the runtime stage does not install: {installed:?}"
        );
    }

    let product = super::product_binary::product_binary();
    for (base, _) in BASES {
        for o in build(base).iter().filter(|o| o["kind"] == "Deployment") {
            for c in o["spec"]["template"]["spec"]["containers"]
                .as_array()
                .unwrap()
            {
                let image = c["image"].as_str().unwrap();
                assert!(image.starts_with("podgate:"), "{base}: {image}");
                assert!(
                    c.get("command").is_none(),
                    "{base}: the ENTRYPOINT runs podgate"
                );
                let role = c["args"][0].as_str().unwrap();
                let help = Command::new(&product)
                    .args([role, "--help"])
                    .output()
                    .unwrap();
                assert!(help.status.success(), "{base}: podgate {role} --help");
            }
        }
    }
}
