//! The production binary: `podgate` built without the default feature `sim`, as
//! the Dockerfile builds it. It carries the product's commands and none of the
//! simulated world's, neither as a subcommand nor as code.
//!
//! `scripts/test.sh` builds it first, as
//! `cargo build --no-default-features --bin podgate`, and keeps a copy as
//! `target/debug/podgate-product` (or `PODGATE_PRODUCT_BIN` names one).

use std::path::PathBuf;
use std::process::Command;

/// The product's commands.
const PRODUCT: [&str; 6] = ["proxy", "kas", "agentk", "token", "registry", "graph"];
/// The simulated world's commands, built only with the feature `sim`.
const SIMULATED: [&str; 5] = ["up", "loadtest", "pod-sim", "kube-sim", "workspaces"];

/// The product binary's path; fails, saying how to build it, when it is missing.
pub fn product_binary() -> PathBuf {
    let path = std::env::var_os("PODGATE_PRODUCT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_BIN_EXE_podgate")).with_file_name("podgate-product")
        });
    assert!(
        path.is_file(),
        "{} is missing: build it with `cargo build --no-default-features --bin podgate && \
         cp target/debug/podgate target/debug/podgate-product` (scripts/test.sh does)",
        path.display()
    );
    path
}

/// The subcommand names `--help` lists.
fn subcommands(bin: &std::path::Path) -> Vec<String> {
    let out = Command::new(bin)
        .arg("--help")
        .output()
        .expect("the binary runs");
    assert!(out.status.success(), "{} --help failed", bin.display());
    let help = String::from_utf8(out.stdout).expect("UTF-8 help");
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[test]
fn the_product_binary_has_no_simulator_subcommand() {
    let bin = product_binary();
    let found = subcommands(&bin);
    for c in PRODUCT {
        assert!(found.iter().any(|f| f == c), "`{c}` missing from {found:?}");
    }
    for c in SIMULATED {
        assert!(!found.iter().any(|f| f == c), "`{c}` in {found:?}");
        let out = Command::new(&bin).arg(c).output().expect("the binary runs");
        assert_eq!(out.status.code(), Some(2), "`podgate {c}` is a usage error");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("unrecognized subcommand"), "{err}");
    }
}

#[test]
fn the_product_binary_links_no_simulator_code() {
    let bytes = std::fs::read(product_binary()).expect("a readable binary");
    // Symbol names (mangled or not) and panic locations carry the crate's name.
    let simulators = regex::bytes::Regex::new("podgate_(loadtest|kube_sim|testkit)").unwrap();
    let found = simulators
        .find(&bytes)
        .map(|m| String::from_utf8_lossy(m.as_bytes()).into_owned());
    assert_eq!(
        found, None,
        "the product binary holds symbols of a simulator crate"
    );
    // The same scan finds the simulators in the default binary: it can fail.
    let default = std::fs::read(env!("CARGO_BIN_EXE_podgate")).expect("a readable binary");
    assert!(simulators.is_match(&default));
}

#[test]
fn the_default_binary_keeps_the_newcomers_commands() {
    let found = subcommands(env!("CARGO_BIN_EXE_podgate").as_ref());
    for c in PRODUCT.iter().chain(&SIMULATED) {
        assert!(found.iter().any(|f| f == c), "`{c}` missing from {found:?}");
    }
}
