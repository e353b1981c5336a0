//! A short run of every fault drill (`scripts/drills.sh --smoke`, seconds each) with
//! this build's binary: the script exits 0, and each drill's ledger check says ok
//! (every job the fleet picked up finished exactly once, on the Pod that issued it;
//! no misroute). The full drills are run by hand: `./scripts/drills.sh`.

use std::io::Read as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::process::{Signal, signal};

#[test]
fn every_drill_passes_a_smoke_run() {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut child = Command::new("bash")
        .arg(format!("{root}/scripts/drills.sh"))
        .arg("--smoke")
        .env("PODGATE", env!("CARGO_BIN_EXE_podgate"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running scripts/drills.sh");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    // The script cleans up its children on SIGTERM; a hung drill must not hang CI.
    let pid = child.id();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let status = child.wait().unwrap();
        let _ = done_tx.send(());
        status
    });
    if done_rx.recv_timeout(Duration::from_secs(420)).is_err() {
        let _ = signal(pid, Signal::TERM);
    }
    let status = waiter.join().unwrap();
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    assert!(
        status.success(),
        "drills.sh --smoke: {status}\n{out}\n{err}"
    );
    for drill in ["R2", "R3", "R4", "R5", "R7", "R8", "R9", "R10"] {
        assert!(
            out.contains(&format!("== {drill} ok")),
            "{drill} did not pass:\n{out}"
        );
    }
    let ledger_ok = out
        .lines()
        .filter(|l| l.trim() == "ledger check: ok")
        .count();
    assert_eq!(ledger_ok, 8, "a ledger check per drill:\n{out}");
    assert!(out.contains("rss check: ok"), "{out}");
    assert!(out.contains("drills: all passed"), "{out}");
}
