//! Every committed corpus input (`fuzz/corpus/<target>/`) and every regression input
//! (`fuzz/regressions/<target>/`, the crashes fuzzing found, kept after their fix)
//! replayed once through its target, without fuzzing: a target that panics, aborts
//! or hangs on one of them fails this test and names the input.
//!
//! libFuzzer runs file arguments once each and exits (`-runs` is ignored for them),
//! so the binary needs no coverage instrumentation here; `scripts/fuzz.sh` fuzzes.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The one fuzz binary, as Cargo built it for this test; `PODGATE_FUZZ_TARGET` picks
/// the target. (The test does not link the targets itself: `scripts/fuzz.sh --quick`
/// builds them instrumented, for the binary's libFuzzer runtime only.)
const FUZZ: &str = env!("CARGO_BIN_EXE_fuzz");

/// The targets in `fuzz_targets/`, one module each.
fn targets() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    inputs(&root.join("fuzz_targets"))
        .iter()
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .filter(|name| name != "mod")
        .collect()
}

/// The fuzz binary run on `target` with `args`.
fn run(target: &str, args: &[&str]) -> std::process::Output {
    Command::new(FUZZ)
        .env("PODGATE_FUZZ_TARGET", target)
        .args(args)
        .output()
        .expect("the fuzz binary runs")
}

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
    // An unknown name is refused with the list of the binary's targets.
    let out = run("proxy_nothing", &["-runs=1"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let log = String::from_utf8_lossy(&out.stderr);
    let listed = log
        .split_once("names no fuzz target; one of: ")
        .unwrap_or_else(|| panic!("no list of targets in: {log}"))
        .1
        .trim();
    assert!(
        log.contains("PODGATE_FUZZ_TARGET=\"proxy_nothing\""),
        "the refusal names what was asked: {log}"
    );
    assert_eq!(
        listed.split(", ").collect::<Vec<_>>(),
        targets(),
        "fuzz_targets/ and the binary's TARGETS differ"
    );
}

#[test]
fn committed_inputs_replay_without_a_crash() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut failures = Vec::new();
    for target in targets() {
        let mut files = inputs(&root.join("corpus").join(&target));
        assert!(!files.is_empty(), "{target}: no committed corpus");
        files.extend(inputs(&root.join("regressions").join(&target)));
        // Each input runs once; a hang is a failure too (libFuzzer's -timeout).
        // These binaries are unoptimised, with frames 10-100 times release's, so
        // their main thread gets the 64 MiB stack `scripts/fuzz.sh --quick` gives
        // (the long runs check release-like frames on a tokio worker's 2 MiB).
        let out = Command::new("sh")
            .args(["-c", r#"ulimit -s 65536 && exec "$0" "$@""#, FUZZ])
            .env("PODGATE_FUZZ_TARGET", &target)
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
