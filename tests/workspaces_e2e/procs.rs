//! The real processes of the end-to-end test: `podgate pod-sim`, `podgate kube-sim`,
//! `podgate kas` and `podgate agentk`, each a child process whose stdout lines are
//! kept so the test can wait for the line that says it is ready. Children are
//! killed when dropped.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;

use crate::common::process::{Signal, signal};

/// A running `podgate` subcommand.
pub struct Proc {
    /// What it is, for messages.
    pub name: String,
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    count: watch::Receiver<usize>,
}

impl Proc {
    /// `podgate <args>`; its stderr goes to ours when `PODGATE_TEST_LOG` is set (and
    /// is the log filter), else nowhere.
    pub fn spawn(name: &str, args: &[&str]) -> Proc {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_podgate"));
        cmd.args(args).stdout(Stdio::piped()).kill_on_drop(true);
        match std::env::var("PODGATE_TEST_LOG") {
            Ok(filter) => {
                cmd.env("PODGATE_LOG", filter).stderr(Stdio::inherit());
            }
            Err(_) => {
                cmd.stderr(Stdio::null());
            }
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        let stdout = child.stdout.take().unwrap();
        let lines: Arc<Mutex<Vec<String>>> = Arc::default();
        let (tx, count) = watch::channel(0);
        let keep = lines.clone();
        let label = name.to_owned();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if std::env::var_os("PODGATE_TEST_LOG").is_some() {
                    eprintln!("[{label}] {line}");
                }
                let n = {
                    let mut l = keep.lock().unwrap();
                    l.push(line);
                    l.len()
                };
                tx.send_replace(n);
            }
        });
        Proc {
            name: name.to_owned(),
            child,
            lines,
            count,
        }
    }

    /// The first stdout line containing `needle` (waiting up to `within` for it).
    pub async fn line(&mut self, needle: &str, within: Duration) -> String {
        let found = tokio::time::timeout(within, async {
            loop {
                if let Some(l) = self
                    .lines
                    .lock()
                    .unwrap()
                    .iter()
                    .find(|l| l.contains(needle))
                {
                    return Some(l.clone());
                }
                if self.count.changed().await.is_err() {
                    return None;
                }
            }
        })
        .await;
        match found {
            Ok(Some(l)) => l,
            _ => panic!(
                "{}: no line containing {needle:?} within {within:?}; it printed: {:#?}",
                self.name,
                self.lines.lock().unwrap()
            ),
        }
    }

    /// The word after `key` in the first line containing `needle` (e.g. an address).
    pub async fn value_after(&mut self, needle: &str, key: &str, within: Duration) -> String {
        let line = self.line(needle, within).await;
        let rest = line
            .split_once(key)
            .unwrap_or_else(|| panic!("{}: {key:?} not in {line:?}", self.name))
            .1;
        rest.split_whitespace()
            .next()
            .unwrap_or_default()
            .trim_end_matches([',', '/'])
            .to_owned()
    }

    /// SIGKILL: a crash, nothing released.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// SIGTERM, and wait for the exit.
    pub async fn terminate(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = signal(pid, Signal::TERM);
        }
        let _ = tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await;
    }
}
