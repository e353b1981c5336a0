//! Tasks kas and agentk spawn and tie to a scope.

/// Aborts its task when dropped (agentk's tunnels and Deployment watch, kas's
/// module request body pump).
pub struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl AbortOnDrop {
    /// Spawns `task` on the current runtime, aborted when the guard drops.
    pub fn spawn(task: impl std::future::Future<Output = ()> + Send + 'static) -> Self {
        Self(tokio::spawn(task))
    }
}

impl From<tokio::task::JoinHandle<()>> for AbortOnDrop {
    fn from(handle: tokio::task::JoinHandle<()>) -> Self {
        Self(handle)
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
