//! The workspaces bench's view of the `podgate agentk` child: its cycle metrics
//! and its CPU time from `/proc`.

use std::net::SocketAddr;
use std::process::Command;

use crate::support::metrics::value_or_zero;
use crate::support::metrics_text;

/// agentk's `/metrics` text.
pub async fn metrics(addr: SocketAddr) -> String {
    metrics_text(addr).await
}

/// (count, sum in seconds) of agentk's reconcile cycles of `kind` (`full`, `partial`).
pub fn cycles(text: &str, kind: &str) -> (f64, f64) {
    let h = "podgate_agentk_workspaces_cycle_duration_seconds";
    (
        value_or_zero(text, &format!("{h}_count{{type=\"{kind}\"}}")),
        value_or_zero(text, &format!("{h}_sum{{type=\"{kind}\"}}")),
    )
}

/// CPU seconds process `pid` has used so far (`utime + stime`), with `ticks` clock
/// ticks a second ([`clock_ticks`]).
pub fn cpu_secs(pid: u32, ticks: f64) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("agentk's /proc stat");
    // After the command name's closing parenthesis: state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / ticks
}

/// Clock ticks a second (`getconf CLK_TCK`), the unit of `/proc/<pid>/stat`'s times.
pub fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}
