use std::sync::Arc;
use std::time::Duration;

use podgate_registry::{MemoryBackend, Registry, RegistryConfig};

use super::*;

/// A kas's presence over an in-memory registry. The registry's own expiry is far
/// longer than the jumps of the paused clock, which leave its refresh no time
/// to run.
async fn presence(ttl: Duration) -> (Arc<Presence>, Registry) {
    let config = RegistryConfig {
        ttl: Duration::from_secs(24 * 3600),
        refresh_interval: Duration::from_secs(3600),
        ..RegistryConfig::default()
    };
    let registry = Registry::with_memory(MemoryBackend::default(), config)
        .await
        .unwrap();
    let metrics = Arc::new(KasMetrics::new());
    let auth = Arc::new(AgentAuth::new(
        Arc::new(podgate_tokens::Classifier::with_keys(
            podgate_tokens::KeySet::new(),
        )),
        None,
        metrics.registry(),
    ));
    let presence = Arc::new(Presence {
        draining: tokio::sync::watch::channel(false).1,
        registry: registry.clone(),
        auth,
        tunnels: Arc::new(Tunnels::new(metrics.clone(), 8)),
        metrics,
        kas: "grpc://kas-a:8155".into(),
        ttl,
        expiring: Default::default(),
    });
    (presence, registry)
}

fn who() -> AgentIdentity {
    AgentIdentity {
        agent_id: 7,
        project_id: 42,
        project_path: "group/agents".into(),
    }
}

fn meta(version: &str) -> AgentMeta {
    AgentMeta {
        version: version.into(),
        pod_name: "agentk-0".into(),
        ..Default::default()
    }
}

async fn pods(registry: &Registry) -> Vec<(i64, String)> {
    registry
        .connections_by_agent(who().agent_id)
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.connection_id, c.version))
        .collect()
}

/// The next disconnect event (connects, announced asynchronously, are skipped).
async fn disconnect(
    events: &mut tokio::sync::broadcast::Receiver<podgate_registry::AgentEvent>,
) -> podgate_registry::AgentEvent {
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match events.recv().await.unwrap() {
                podgate_registry::AgentEvent::Connected { .. } => {}
                other => return other,
            }
        }
    })
    .await
    .expect("a disconnect event")
}

#[tokio::test(start_paused = true)]
async fn a_registration_lasts_its_ttl_from_the_last_register() {
    let ttl = Duration::from_secs(600);
    let (presence, registry) = presence(ttl).await;
    presence
        .register_for_ttl(who(), meta("v1"), 99)
        .await
        .unwrap();
    assert_eq!(pods(&registry).await, [(99, "v1".to_owned())]);
    let by_project = registry.connections_by_project(42).await.unwrap();
    assert_eq!(by_project[0].pod_name, "agentk-0");

    // Refreshed before it expires: it lasts a TTL from the refresh, with the new meta.
    tokio::time::advance(ttl - Duration::from_secs(1)).await;
    presence
        .register_for_ttl(who(), meta("v2"), 99)
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(2)).await;
    tokio::task::yield_now().await;
    assert_eq!(pods(&registry).await, [(99, "v2".to_owned())]);
    assert_eq!(presence.metrics.connected_agents.get(), 1);

    // No further Register: gone a TTL after the last one, announced as a disconnect.
    let mut events = registry.subscribe();
    tokio::time::advance(ttl).await;
    let event = disconnect(&mut events).await;
    assert!(
        matches!(
            event,
            podgate_registry::AgentEvent::Disconnected {
                agent_id: 7,
                connection_id: 99,
                ..
            }
        ),
        "{event:?}"
    );
    assert!(pods(&registry).await.is_empty());
    assert_eq!(presence.metrics.connected_agents.get(), 0);
    assert!(presence.expiring.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn pods_expire_apart_and_pod_id_0_is_refused() {
    let ttl = Duration::from_secs(600);
    let (presence, registry) = presence(ttl).await;
    presence
        .register_for_ttl(who(), meta("v1"), 1)
        .await
        .unwrap();
    tokio::time::advance(ttl / 2).await;
    presence
        .register_for_ttl(who(), meta("v1"), 2)
        .await
        .unwrap();
    let mut events = registry.subscribe();
    tokio::time::advance(ttl / 2 + Duration::from_secs(1)).await;
    let event = disconnect(&mut events).await;
    assert!(
        matches!(
            event,
            podgate_registry::AgentEvent::Disconnected {
                connection_id: 1,
                ..
            }
        ),
        "{event:?}"
    );
    assert_eq!(pods(&registry).await, [(2, "v1".to_owned())]);

    let refused = presence
        .register_for_ttl(who(), meta("v1"), 0)
        .await
        .unwrap_err();
    assert!(matches!(refused, Error::ZeroPodId));
    assert_eq!(Status::from(refused).code(), tonic::Code::InvalidArgument);
}

#[tokio::test(start_paused = true)]
async fn a_draining_kas_registers_nothing() {
    let (presence, registry) = presence(Duration::from_secs(600)).await;
    let (tx, rx) = tokio::sync::watch::channel(true);
    let presence = Arc::new(Presence {
        draining: rx,
        registry: registry.clone(),
        auth: presence.auth.clone(),
        tunnels: presence.tunnels.clone(),
        metrics: presence.metrics.clone(),
        kas: presence.kas.clone(),
        ttl: presence.ttl,
        expiring: Default::default(),
    });
    let e = presence
        .register_for_ttl(who(), meta("v1"), 5)
        .await
        .unwrap_err();
    assert_eq!(Status::from(e).code(), tonic::Code::Unavailable);
    assert!(pods(&registry).await.is_empty());
    drop(tx);
}
