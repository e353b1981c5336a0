//! The workspace's dependency rules (`docs/architecture.md`), checked on the graph
//! Cargo resolves (`cargo metadata`), so an import that breaks one fails here:
//!
//! - kas and agentk are siblings: neither depends on the other. What both use lives
//!   below them, in `podgate-agent` (protobufs, auth, transport, HTTP helpers, the
//!   Graph API model, selectors).
//! - The product's crates reach no simulator through their normal dependencies:
//!   the Pod simulator and runner fleet (`podgate-loadtest`), kube-sim
//!   (`podgate-kube-sim`) and the test kit (`podgate-testkit`) are dev-dependencies
//!   or the root binary's `sim` feature only.
//! - `podgate-agent`, below kas and agentk, does not depend on them even for its
//!   tests: their tests together live in this crate (`podgate-agent-e2e`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// The product's library crates.
const PRODUCT: [&str; 7] = [
    "podgate-tokens",
    "podgate-registry",
    "podgate-topology-service",
    "podgate-proxy",
    "podgate-agent",
    "podgate-kas",
    "podgate-agentk",
];

/// The simulated world's crates.
const SIMULATORS: [&str; 3] = ["podgate-loadtest", "podgate-kube-sim", "podgate-testkit"];

/// Package name → the names of its normal (not dev, not build) dependencies, as
/// Cargo resolves the workspace.
fn normal_graph() -> BTreeMap<String, BTreeSet<String>> {
    graph(|kind| kind.is_null())
}

/// Package name → the names of its dependencies of the kinds `kind` accepts
/// (`null` for normal, `"dev"`, `"build"`), as Cargo resolves the workspace.
fn graph(kind: fn(&Value) -> bool) -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    // The graph for the host platform only: that is what a build here downloads, so
    // `--offline` holds on a machine whose cargo cache has only this build's crates
    // (without the filter, Cargo wants every platform's packages in Cargo.lock).
    let version = Command::new(&cargo)
        .arg("-vV")
        .output()
        .expect("cargo -vV runs");
    let version = String::from_utf8_lossy(&version.stdout);
    let host = version
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("cargo -vV names the host");
    let out = Command::new(&cargo)
        .args(["metadata", "--format-version", "1", "--offline", "--locked"])
        .args(["--filter-platform", host])
        .current_dir(&root)
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON");
    let name_of: BTreeMap<&str, &str> = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    meta["resolve"]["nodes"]
        .as_array()
        .expect("resolve.nodes")
        .iter()
        .map(|n| {
            let deps = n["deps"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| {
                    d["dep_kinds"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|k| kind(&k["kind"]))
                })
                .map(|d| name_of[d["pkg"].as_str().unwrap()].to_owned())
                .collect();
            (name_of[n["id"].as_str().unwrap()].to_owned(), deps)
        })
        .collect()
}

/// Every package `from` reaches through normal dependencies.
fn closure(graph: &BTreeMap<String, BTreeSet<String>>, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![from.to_owned()];
    while let Some(p) = todo.pop() {
        for d in graph.get(&p).into_iter().flatten() {
            if seen.insert(d.clone()) {
                todo.push(d.clone());
            }
        }
    }
    seen
}

#[test]
fn the_graph_sees_the_known_edges() {
    let g = normal_graph();
    assert!(closure(&g, "podgate-kas").contains("podgate-agent"));
    assert!(closure(&g, "podgate-agentk").contains("kube"));
    assert!(closure(&g, "podgate-testkit").contains("podgate-kube-sim"));
    // Dev-dependencies are not normal ones: this crate's tests run kas and agentk.
    assert!(!closure(&g, "podgate-agent-e2e").contains("podgate-kas"));
    assert!(graph(|k| k == "dev")["podgate-agent-e2e"].contains("podgate-kas"));
}

#[test]
fn kas_and_agentk_do_not_depend_on_each_other() {
    let g = normal_graph();
    assert!(
        !closure(&g, "podgate-kas").contains("podgate-agentk"),
        "podgate-kas reaches podgate-agentk"
    );
    assert!(
        !closure(&g, "podgate-agentk").contains("podgate-kas"),
        "podgate-agentk reaches podgate-kas"
    );
}

#[test]
fn kas_builds_without_kube_rs() {
    let g = normal_graph();
    let reach = closure(&g, "podgate-kas");
    for k in ["kube", "kube-client", "k8s-openapi"] {
        assert!(!reach.contains(k), "podgate-kas reaches {k}");
    }
}

#[test]
fn product_crates_reach_no_simulator() {
    let g = normal_graph();
    for p in PRODUCT {
        let reach = closure(&g, p);
        let sims: Vec<_> = SIMULATORS.iter().filter(|s| reach.contains(**s)).collect();
        assert!(sims.is_empty(), "{p} reaches {sims:?}");
    }
}

#[test]
fn the_shared_agent_crate_tests_without_kas_agentk_or_the_proxy() {
    let all = graph(|_| true);
    let deps = &all["podgate-agent"];
    for p in [
        "podgate-kas",
        "podgate-agentk",
        "podgate-proxy",
        "podgate-loadtest",
        "podgate-kube-sim",
        "podgate-testkit",
    ] {
        assert!(!deps.contains(p), "podgate-agent depends on {p}");
    }
}
