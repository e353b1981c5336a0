//! The GitLab-shaped peers against podgate's own kas and agentk: GitLab's agentk
//! (h2c and WebSocket, gzip) gets its configuration from podgate's kas and
//! registers, and Rails lists it by project and by agent, through the kas holding it
//! and through another; podgate's agentk connects to GitLab's kas, advertises
//! `MakeRequest`, `WatchGraph` and `WorkspaceRequest`, and serves a `MakeRequest`.
//! kubectl through podgate's kas to GitLab's agentk: `podgate_kubectl`.

use std::time::Duration;

use podgate_agentk::{Agentk, AgentkConfig};
use podgate_kas::Kas;
use podgate_kas::agent_config::AgentConfigSource;
use podgate_registry::{MemoryBackend, Registry, RegistryConfig, Topology};
use podgate_testkit::fixtures::{EXTERNAL_SECRET, agent_tokens, kas_config, memory_registry};
use podgate_testkit::kube::KubeTestServer;
use serde_json::json;

use super::agentk::{self, Config, Event, Transport};
use super::grpctool::{collect_response, request_frames};
use super::kas::{Event as KasEvent, GitlabKas};
use super::rails::RailsClient;

/// Fails a test whose peer never answers instead of hanging it.
async fn within(test: impl std::future::Future<Output = ()>) {
    tokio::time::timeout(Duration::from_secs(30), test)
        .await
        .expect("the peers did not finish within 30 s");
}

/// A podgate kas serving agent 3's configuration from a file.
async fn podgate_kas(keys: podgate_tokens::KeySet, config_dir: &std::path::Path) -> Kas {
    std::fs::write(
        config_dir.join("3.yaml"),
        "observability:\n  logging:\n    level: debug\n",
    )
    .unwrap();
    let mut config = kas_config(keys, Duration::from_secs(10));
    // kas.toml's default: any issuer, as GitLab's kas (Rails signs with its host).
    config.issuer = String::new();
    config.agent_config = Some(AgentConfigSource {
        dir: config_dir.to_owned(),
        poll: Duration::from_millis(50),
    });
    Kas::start(config, memory_registry().await).await.unwrap()
}

async fn gitlab_agentk_against_podgate_kas(transport: Transport) {
    let kube = KubeTestServer::start(100).await.unwrap();
    kube.put(
        "pods",
        "default",
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-1", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }),
    );
    let dir = tempfile::tempdir().unwrap();
    let (keys, mint) = agent_tokens();
    let kas = podgate_kas(keys, dir.path()).await;
    let address = match transport {
        Transport::H2c => kas.agent_addr().to_string(),
        Transport::WebSocket => format!("{}/-/kubernetes-agent/", kas.agent_addr()),
    };
    let mut cfg = Config::new(&address, &mint(Some(3)), &kube.url());
    cfg.transport = transport;
    let pod_id = cfg.pod_id;
    let mut agent = agentk::start(cfg).unwrap();

    // The configuration stream and the registration run side by side, as in
    // GitLab's agentk: either may come first.
    let (mut configuration, mut registered) = (None, false);
    while configuration.is_none() || !registered {
        match agent.next().await {
            Event::Configuration { commit_id, config } => {
                configuration = Some((commit_id, config));
            }
            Event::Registered => registered = true,
            _ => {}
        }
    }
    let (commit, config) = configuration.expect("a configuration");
    assert!(!commit.is_empty());
    assert_eq!(config.agent_id, 3);

    // Rails sees the Pod by project and by agent, `connection_id` = `pod_id`.
    let rails = RailsClient::new(
        &kas.external_addr().to_string(),
        &EXTERNAL_SECRET,
        "gitlab.example.com",
    )
    .unwrap();
    let by_project = rails.connected_agents_by_project(42).await.unwrap();
    assert_eq!(
        by_project
            .iter()
            .map(|a| (a.agent_id, a.connection_id))
            .collect::<Vec<_>>(),
        [(3, pod_id)]
    );
    let by_agent = rails.connected_agents_by_agent(3).await.unwrap();
    assert_eq!(by_agent.len(), 1);
    let meta = by_agent[0].agent_meta.as_ref().unwrap();
    assert_eq!(meta.version, "v16.5.0");
    assert_eq!(
        meta.kubernetes_version
            .as_ref()
            .map(|v| v.git_version.as_str()),
        Some("v1.28.2")
    );
    // kubectl through kas's Kubernetes API proxy and this agentk's tunnels:
    // `podgate_kubectl`.
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitlab_agentk_over_h2c_against_podgate_kas() {
    within(gitlab_agentk_against_podgate_kas(Transport::H2c)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitlab_agentk_over_websocket_against_podgate_kas() {
    within(gitlab_agentk_against_podgate_kas(Transport::WebSocket)).await;
}

/// Rails asks a kas that does not hold the agent: presence is shared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rails_lists_a_gitlab_agentk_through_another_kas() {
    within(async {
        let (keys, mint) = agent_tokens();
        let backend = MemoryBackend::new(Topology::default());
        let mut kases = Vec::new();
        for _ in 0..2 {
            let registry = Registry::with_memory(backend.clone(), RegistryConfig::default())
                .await
                .unwrap();
            let mut config = kas_config(keys.clone(), Duration::from_secs(10));
            // kas.toml's default: any issuer, as GitLab's kas.
            config.issuer = String::new();
            kases.push(Kas::start(config, registry).await.unwrap());
        }
        let (holder, other) = (&kases[0], &kases[1]);
        let mut cfg = Config::new(
            &holder.agent_addr().to_string(),
            &mint(Some(3)),
            "http://127.0.0.1:1",
        );
        cfg.tunnels = 1;
        let pod_id = cfg.pod_id;
        let mut agent = agentk::start(cfg).unwrap();
        agent
            .wait_for(|e| matches!(e, Event::Registered).then_some(()))
            .await;
        let rails = RailsClient::new(
            &other.external_addr().to_string(),
            &EXTERNAL_SECRET,
            "gitlab.example.com",
        )
        .unwrap();
        let by_project = rails.connected_agents_by_project(42).await.unwrap();
        assert_eq!(
            by_project
                .iter()
                .map(|a| (a.agent_id, a.connection_id))
                .collect::<Vec<_>>(),
            [(3, pod_id)]
        );
        let by_agent = rails.connected_agents_by_agent(3).await.unwrap();
        assert_eq!(
            by_agent.iter().map(|a| a.project_id).collect::<Vec<_>>(),
            [42]
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podgate_agentk_against_gitlab_kas() {
    within(podgate_agentk_against_gitlab_kas_run()).await;
}

async fn podgate_agentk_against_gitlab_kas_run() {
    let kube = KubeTestServer::start(100).await.unwrap();
    kube.put(
        "pods",
        "default",
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-1", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }),
    );
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, kube.kubeconfig()).unwrap();
    let token = "glagent-podgate-agentk-token";
    let mut kas = GitlabKas::start(token, "commit-1", Default::default())
        .await
        .unwrap();
    let _agentk = Agentk::start(AgentkConfig {
        kas_url: format!("grpc://{}", kas.addr),
        token: token.into(),
        pod_namespace: "gitlab-agent".into(),
        pod_name: "agentk-0".into(),
        idle_tunnels: 2,
        max_busy_tunnels: 10,
        observability_listen: None,
        kubeconfig: Some(kubeconfig),
        ca_file: None,
        graph_sync_timeout: Duration::from_secs(30),
    })
    .await
    .unwrap();

    let mut configured = false;
    let mut registered = false;
    let mut descriptor = None;
    while !(configured && registered && descriptor.is_some()) {
        match kas.next().await {
            KasEvent::ConfigurationRequested(r) => {
                assert!(r.agent_meta.is_some());
                configured = true;
            }
            KasEvent::Registered(r) => {
                assert_ne!(r.pod_id, 0);
                // The first registration, at connection, may precede agentk's
                // first read of kube-sim's `/version`; the next carries it.
                let version = r.agent_meta.and_then(|m| m.kubernetes_version);
                registered |= version.is_some_and(|v| v.git_version == "v1.32.0-podgate-test");
            }
            KasEvent::Tunnel(d) => descriptor = Some(d),
        }
    }
    let d = descriptor.unwrap();
    assert!(
        super::kas::supports(&d, agentk::KUBERNETES_API, "MakeRequest"),
        "{d:?}"
    );
    let methods: Vec<&str> = d
        .services
        .iter()
        .flat_map(|s| s.methods.iter().map(|m| m.name.as_str()))
        .collect();
    assert!(
        methods.contains(&"WatchGraph") && methods.contains(&"WorkspaceRequest"),
        "{methods:?}"
    );

    let frames = request_frames(
        "GET",
        "/api/v1/namespaces/default/pods",
        &[("Accept", "application/json")],
        None,
        b"",
    );
    let resp = collect_response(&kas.make_request(&frames).await.unwrap()).unwrap();
    assert_eq!(resp.status, 200);
    assert!(String::from_utf8_lossy(&resp.body).contains("web-1"));
}
