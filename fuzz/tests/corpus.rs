//! Every committed corpus input (`fuzz/corpus/<target>/`) and every regression input
//! (`fuzz/regressions/<target>/`, the crashes fuzzing found, kept after their fix)
//! replayed once through its target, without fuzzing: a target that panics, aborts
//! or hangs on one of them fails this test and names the input.
//!
//! libFuzzer runs file arguments once each and exits (`-runs` is ignored for them),
//! so the binaries need no coverage instrumentation here; `scripts/fuzz.sh` fuzzes.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The targets and their binaries, as Cargo built them for this test.
const TARGETS: &[(&str, &str)] = &[
    ("graph_request", env!("CARGO_BIN_EXE_graph_request")),
    ("graph_wire", env!("CARGO_BIN_EXE_graph_wire")),
    ("graph_ws", env!("CARGO_BIN_EXE_graph_ws")),
    ("proxy_chunked", env!("CARGO_BIN_EXE_proxy_chunked")),
    ("proxy_form", env!("CARGO_BIN_EXE_proxy_form")),
    ("proxy_json", env!("CARGO_BIN_EXE_proxy_json")),
    ("proxy_multipart", env!("CARGO_BIN_EXE_proxy_multipart")),
    ("proxy_path", env!("CARGO_BIN_EXE_proxy_path")),
    (
        "proxy_request_head",
        env!("CARGO_BIN_EXE_proxy_request_head"),
    ),
    (
        "proxy_response_head",
        env!("CARGO_BIN_EXE_proxy_response_head"),
    ),
    ("proxy_route", env!("CARGO_BIN_EXE_proxy_route")),
    ("token_classify", env!("CARGO_BIN_EXE_token_classify")),
    ("token_gitlab", env!("CARGO_BIN_EXE_token_gitlab")),
    ("token_jwt", env!("CARGO_BIN_EXE_token_jwt")),
    ("workspaces_host", env!("CARGO_BIN_EXE_workspaces_host")),
    (
        "workspaces_reconcile",
        env!("CARGO_BIN_EXE_workspaces_reconcile"),
    ),
];

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("a readable directory").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_target_is_listed() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut on_disk: Vec<String> = inputs(&root.join("fuzz_targets"))
        .iter()
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let listed: Vec<&str> = TARGETS.iter().map(|(t, _)| *t).collect();
    assert_eq!(on_disk, listed, "fuzz_targets/ and TARGETS differ");
}

#[test]
fn committed_inputs_replay_without_a_crash() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut failures = Vec::new();
    for (target, bin) in TARGETS {
        let mut files = inputs(&root.join("corpus").join(target));
        assert!(!files.is_empty(), "{target}: no committed corpus");
        files.extend(inputs(&root.join("regressions").join(target)));
        // Each input runs once; a hang is a failure too (libFuzzer's -timeout).
        // These binaries are unoptimised, with frames 10-100 times release's, so
        // their main thread gets the 64 MiB stack `scripts/fuzz.sh --quick` gives
        // (the long runs check release-like frames on a tokio worker's 2 MiB).
        let out = Command::new("sh")
            .args(["-c", r#"ulimit -s 65536 && exec "$0" "$@""#, bin])
            .arg("-timeout=30")
            .arg("-rss_limit_mb=2048")
            .args(&files)
            .output()
            .expect("the target runs");
        if !out.status.success() {
            let log = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            failures.push(format!(
                "{target} ({} inputs) exited {}:\n{}",
                files.len(),
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ));
        } else {
            let log = String::from_utf8_lossy(&out.stderr);
            let ran = log.matches("Running: ").count();
            assert_eq!(
                ran,
                files.len(),
                "{target}: libFuzzer ran {ran} of {} inputs:\n{log}",
                files.len()
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
