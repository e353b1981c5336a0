//! The in-process Kubernetes API server of tests: a [`KubeSim`](crate::kube_sim::KubeSim)
//! on a free loopback port, stopped when dropped.

use std::net::SocketAddr;

use serde_json::Value;
use tokio::net::TcpListener;

use crate::kube_sim::{self, KubeSim};

/// The test API server. Dropping it stops it (open watches end too).
pub struct KubeTestServer {
    addr: SocketAddr,
    sim: KubeSim,
    task: tokio::task::JoinHandle<()>,
}

impl KubeTestServer {
    /// Serve on a free loopback port. At most `history_limit` events are kept for
    /// watch resumption.
    pub async fn start(history_limit: usize) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let sim = KubeSim::new(history_limit);
        let s = sim.clone();
        let task = tokio::spawn(async move { s.serve(listener, std::future::pending()).await });
        Ok(KubeTestServer { addr, sim, task })
    }

    /// The simulated cluster behind this server.
    pub fn sim(&self) -> &KubeSim {
        &self.sim
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig pointing at this server (no auth, plain HTTP).
    pub fn kubeconfig(&self) -> String {
        kube_sim::kubeconfig(&self.url())
    }

    /// Create or replace an object directly (as another client would).
    pub fn put(&self, plural: &str, namespace: &str, object: Value) -> Value {
        self.sim.put(plural, namespace, object)
    }

    /// Delete an object directly.
    pub fn delete(&self, plural: &str, namespace: &str, name: &str) -> bool {
        self.sim.delete(plural, namespace, name)
    }

    /// An object, if present.
    pub fn get(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        self.sim.get(plural, namespace, name)
    }

    /// Stop serving and wait until it has stopped: every connection (kept-alive
    /// ones and watches included) is closed when this returns. Dropping the server
    /// only asks for that.
    pub async fn stop(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.sim.resource_version()
    }
}

impl Drop for KubeTestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
