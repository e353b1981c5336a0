//! The agent's workspace Deployments: a store kept up to date by a watch, and where
//! a reconciler gets one from.

use std::sync::Arc;

use futures_util::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::sync::watch;

use super::{AGENT_ID_LABEL, Error};
use podgate_agent::task::AbortOnDrop;

/// The agent's workspace Deployments, as a store kept up to date by a watch.
/// Dropping it stops the watch.
pub struct Deployments {
    store: Store<Deployment>,
    /// Counts the watch's events (`None` for a store fed by someone else).
    events: Option<watch::Receiver<u64>>,
    _watch: Option<AbortOnDrop>,
}

impl Deployments {
    /// Watch `apps/v1` Deployments labelled `agent.gitlab.com/id=<agent_id>` in all
    /// namespaces (kube-runtime's watcher into a reflector; list errors retried with
    /// back-off), and wait until the first list is in the store (`k8s_informer.go`
    /// `Start`: `WaitForCacheSync`).
    pub async fn watch(client: kube::Client, agent_id: i64) -> Result<Deployments, Error> {
        let api = kube::Api::<Deployment>::all(client);
        let config = watcher::Config::default().labels(&format!("{AGENT_ID_LABEL}={agent_id}"));
        let (store, writer) = reflector::store();
        let (events_tx, events) = watch::channel(0u64);
        let stream = watcher(api, config).default_backoff().reflect(writer);
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(_) => events_tx.send_modify(|n| *n += 1),
                    Err(e) => tracing::warn!(error = %e, "workspaces: watching Deployments"),
                }
            }
        });
        let watch = AbortOnDrop::from(task);
        store
            .wait_until_ready()
            .await
            .map_err(|e| Error::Sync(e.to_string()))?;
        Ok(Deployments {
            store,
            events: Some(events),
            _watch: Some(watch),
        })
    }

    /// A store fed by someone else (tests: a `reflector::store::Writer`).
    pub fn from_store(store: Store<Deployment>) -> Deployments {
        Deployments {
            store,
            events: None,
            _watch: None,
        }
    }

    /// The Deployments now.
    pub fn state(&self) -> Vec<Arc<Deployment>> {
        self.store.state()
    }

    /// Wait until the store satisfies `check` (re-checked after every watch event;
    /// a store without a watch is checked once). Whether it did.
    pub async fn wait_until(&self, mut check: impl FnMut(&[Arc<Deployment>]) -> bool) -> bool {
        let Some(mut events) = self.events.clone() else {
            return check(&self.store.state());
        };
        loop {
            events.borrow_and_update();
            if check(&self.store.state()) {
                return true;
            }
            if events.changed().await.is_err() {
                return check(&self.store.state());
            }
        }
    }
}

/// Where a reconciler gets its Deployment store from: a fresh watch per reconciler,
/// as agentk builds a new informer at every full cycle.
pub trait DeploymentSource: Send + Sync + 'static {
    /// A ready store.
    fn deployments(&self) -> impl Future<Output = Result<Deployments, Error>> + Send;
}

/// Deployments of one agent, watched through kube-rs.
#[derive(Clone)]
pub struct KubeDeployments {
    /// The cluster.
    pub client: kube::Client,
    /// The agent whose workspaces to watch.
    pub agent_id: i64,
}

impl DeploymentSource for KubeDeployments {
    async fn deployments(&self) -> Result<Deployments, Error> {
        Deployments::watch(self.client.clone(), self.agent_id).await
    }
}

/// One store for every reconciler (tests).
impl DeploymentSource for Store<Deployment> {
    async fn deployments(&self) -> Result<Deployments, Error> {
        self.wait_until_ready()
            .await
            .map_err(|e| Error::Sync(e.to_string()))?;
        Ok(Deployments::from_store(self.clone()))
    }
}
