//! Tasks kas and agentk spawn and tie to a scope.

/// Aborts its task when dropped (agentk's tunnels and Deployment watch, kas's
/// module request body pump).
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
