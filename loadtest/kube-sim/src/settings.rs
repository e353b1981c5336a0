//! The timings of the controllers and of namespace deletion.

use std::time::Duration;

use super::{Error, Result};

/// Timings of the simulated controllers and of namespace deletion.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// From a Pod's creation to it running (and ready, unless an image's tag is
    /// `crashloop`). Default 300 ms.
    pub pod_start_delay: Duration,
    /// From a Pod's deletion (a scale-down) to it being gone. Default 200 ms.
    pub pod_stop_delay: Duration,
    /// How long a deleted namespace stays `Terminating` before what is in it, then
    /// itself, is deleted. Default 200 ms.
    pub namespace_delete_delay: Duration,
    /// What a Deployment's `progressDeadlineSeconds` (600 by default) is multiplied
    /// by before `ProgressDeadlineExceeded`: 0.01 makes the default deadline 6 s.
    /// Default 1.
    pub progress_deadline_factor: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            pod_start_delay: Duration::from_millis(300),
            pod_stop_delay: Duration::from_millis(200),
            namespace_delete_delay: Duration::from_millis(200),
            progress_deadline_factor: 1.0,
        }
    }
}

impl Settings {
    /// Check the settings; the error names the bad field.
    pub fn validate(&self) -> Result<()> {
        let f = self.progress_deadline_factor;
        if !(f.is_finite() && f > 0.0) {
            return Err(Error::Setting {
                field: "progress_deadline_factor",
                message: format!("{f}: expected a number above 0"),
            });
        }
        Ok(())
    }
}

/// A duration as the `podgate kube-sim` flags take it: `300ms`, `2s`, `1m30s`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime_serde::re::humantime::parse_duration(s)
        .map_err(|e| format!("{s:?}: {e} (a duration such as 300ms, 2s or 1m)"))
}
