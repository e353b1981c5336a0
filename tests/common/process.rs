//! Signals to the processes a test started: `kill(2)` through rustix, not a `kill`
//! process per signal.

use std::process::Child;

pub use rustix::process::Signal;

/// Send `signal` to the process `pid` (a child's `id()`).
pub fn signal(pid: u32, signal: Signal) -> std::io::Result<()> {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(|| std::io::Error::other(format!("no process can have pid {pid}")))?;
    rustix::process::kill_process(pid, signal)?;
    Ok(())
}

/// SIGTERM to `pid`; panics when it cannot be sent (the process is gone already).
pub fn terminate(pid: u32) {
    signal(pid, Signal::TERM).unwrap_or_else(|e| panic!("SIGTERM to {pid}: {e}"));
}

/// A child asked to stop (SIGTERM) when dropped, and waited for: it cleans up after
/// itself (`podgate up` stops its own children).
pub struct Terminated(pub Child);

impl Drop for Terminated {
    fn drop(&mut self) {
        let _ = signal(self.0.id(), Signal::TERM);
        let _ = self.0.wait();
    }
}

/// Children killed (SIGKILL) when the test ends, however it ends.
pub struct Procs(pub Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
