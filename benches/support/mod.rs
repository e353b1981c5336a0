//! What the benches share: stopping a child, reading a process's `/metrics` (the
//! `podgate` commands' HTTP client and the tests' Prometheus text reader, by
//! `#[path]`) and its memory from `/proc`. Each bench uses a part of it.

#![allow(dead_code, unreachable_pub)]

// Their unit tests compile here without a test harness to run them.
#[allow(unused_imports)]
#[path = "../../src/cli/http_client.rs"]
mod http_client;
#[allow(unused_imports)]
#[path = "../../tests/common/metrics.rs"]
pub mod metrics;

use std::net::SocketAddr;
use std::process::Child;

/// SIGTERM to `pid`, so it can shut down cleanly (and a heap profiler wrapping it
/// write its output).
pub fn terminate(pid: u32) {
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
}

/// A child stopped with SIGTERM when dropped, and waited for.
pub struct Terminated(pub Child);

impl Drop for Terminated {
    fn drop(&mut self) {
        terminate(self.0.id());
        let _ = self.0.wait();
    }
}

/// The `/metrics` text on `addr`; empty when nothing answers yet.
pub async fn metrics_text(addr: SocketAddr) -> String {
    http_client::get(addr, "/metrics")
        .await
        .map(|(_, text)| text)
        .unwrap_or_default()
}

/// (`VmRSS`, `VmHWM`) of process `pid` in KiB; zeros once it is gone.
pub fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}
