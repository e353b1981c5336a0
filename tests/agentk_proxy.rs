//! agentk through the podgate proxy: the proxy routes agentk's gRPC (over h2c, and
//! inside a WebSocket; in cleartext and over TLS) by the agent token's Pod to that
//! Pod's kas, and the reverse
//! tunnels and configuration stream work through it. GitLab's `GetPods` is then
//! answered with pods agentk listed with kube-rs.

use crate::common;

use common::{Stub, start_proxy};
use podgate_agent::auth::mint_external;
use podgate_agent::proto::GetPodsRequest;
use podgate_agent::proto::kas_api_client::KasApiClient;
use podgate_agentk::{Agentk, AgentkConfig};
use podgate_kas::Kas;
use podgate_testkit::fixtures::{
    AgentTokens, EXTERNAL_SECRET as EXTERNAL, channel, kas_config, memory_registry,
    self_signed_cert,
};
use podgate_testkit::kube::KubeTestServer;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agentk_reaches_its_pods_kas_through_the_proxy_over_h2c_and_websocket_with_and_without_tls()
{
    let dir = tempfile::tempdir().unwrap();
    let tokens = AgentTokens::new(2);
    std::fs::write(dir.path().join("agents.pem"), tokens.public_pem()).unwrap();
    let mint = |agent: u64| tokens.mint(Some(agent));

    // Pod 2's kas; Pod 1 (legacy) has none, so a misroute could not be answered.
    let registry = memory_registry().await;
    let kas = Kas::start(
        kas_config(tokens.keys(), std::time::Duration::from_secs(10)),
        registry,
    )
    .await
    .unwrap();
    let legacy = Stub::start(1).await;
    let web2 = Stub::start(2).await;
    let topology = common::topology(&[
        common::pod_entry(1, &[legacy.addr.to_string()], ""),
        common::pod_entry(
            2,
            &[web2.addr.to_string()],
            &format!("kas = [\"{}\"]", kas.agent_addr()),
        ),
    ]);
    let kube = KubeTestServer::start(10).await.unwrap();
    kube.put(
        "pods",
        "default",
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "web-1", "namespace": "default"},
               "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
    );
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, kube.kubeconfig()).unwrap();
    // The proxy's TLS listener, with a certificate only the test's CA file trusts.
    let (cert, key) = self_signed_cert(dir.path());
    let tls_port = podgate_registry::testing::free_port();
    // The top-level keys, then `[tls]`, then the topology's tables.
    let config = format!(
        "keys = [\"{}\"]\n[tls]\nlisten = \"127.0.0.1:{tls_port}\"\ncert = \"{}\"\nkey = \"{}\"\n{topology}",
        dir.path().join("agents.pem").display(),
        cert.display(),
        key.display()
    );
    let proxy = start_proxy(&config, dir).await;
    common::wait_accepting(tls_port).await;

    let gitlab = mint_external(&EXTERNAL, "gitlab", 600).unwrap();
    let mut api = KasApiClient::new(channel(kas.external_addr()).await);
    for (agent, url) in [
        (3, format!("grpc://127.0.0.1:{}", proxy.port)),
        (
            4,
            format!("ws://127.0.0.1:{}/-/kubernetes-agent/", proxy.port),
        ),
        (5, format!("grpcs://localhost:{tls_port}")),
        (6, format!("wss://127.0.0.1:{tls_port}/-/kubernetes-agent/")),
    ] {
        let agentk = Agentk::start(AgentkConfig {
            kas_url: url.clone(),
            token: mint(agent),
            pod_namespace: "gitlab-agent".into(),
            pod_name: format!("agentk-{agent}"),
            idle_tunnels: 2,
            max_busy_tunnels: 10,
            observability_listen: None,
            kubeconfig: Some(kubeconfig.clone()),
            ca_file: Some(cert.clone()),
            graph_sync_timeout: std::time::Duration::from_secs(30),
        })
        .await
        .unwrap();
        let status = tokio::time::timeout(std::time::Duration::from_secs(30), agentk.connected())
            .await
            .unwrap_or_else(|_| panic!("{url}: not connected after 30 s: {:?}", agentk.status()));
        assert_eq!(status.agent_id, agent as i64, "{url}");
        let conn = status.connection_id.unwrap();
        kas.tunnels().wait_idle(agent as i64, conn, 2).await;
        let mut req = tonic::Request::new(GetPodsRequest {
            agent_id: agent as i64,
            connection_id: 0,
            namespace: String::new(),
        });
        req.metadata_mut()
            .insert("authorization", format!("Bearer {gitlab}").parse().unwrap());
        let resp = api.get_pods(req).await.unwrap().into_inner();
        assert_eq!(resp.connection_id, conn, "{url}");
        assert_eq!(resp.pods.len(), 1, "{url}");
        assert_eq!(resp.pods[0].name, "web-1", "{url}");
    }
    // kas's certificate is verified: without the CA that signed it, no connection.
    let untrusting = Agentk::start(AgentkConfig {
        kas_url: format!("grpcs://localhost:{tls_port}"),
        token: mint(7),
        pod_namespace: "gitlab-agent".into(),
        pod_name: "agentk-7".into(),
        idle_tunnels: 2,
        max_busy_tunnels: 10,
        observability_listen: None,
        kubeconfig: Some(kubeconfig.clone()),
        ca_file: None,
        graph_sync_timeout: std::time::Duration::from_secs(30),
    })
    .await
    .unwrap();
    let status = untrusting.wait_for(|s| s.last_error.is_some()).await;
    assert_eq!(status.last_error, Some(tonic::Code::Unavailable));
    assert_eq!(status.connection_id, None);
    drop(untrusting);

    // The proxy counted agent traffic to Pod 2's kas, none to the legacy Pod. A
    // request is counted when it ends: the WebSocket ends once agentk 4 is gone.
    for rule in ["kas-grpc", "kas-agent"] {
        podgate_registry::testing::eventually(
            std::time::Duration::from_secs(10),
            "the proxy counts the agent traffic",
            || async {
                let (_, metrics) = common::admin_get(&proxy, "/metrics").await;
                common::metrics::value(
                    &metrics,
                    &format!(r#"podgate_proxy_requests_total{{pod="2",rule="{rule}"}}"#),
                )
                .map(drop)
            },
        )
        .await;
    }
    assert!(legacy.seen().is_empty());
}
