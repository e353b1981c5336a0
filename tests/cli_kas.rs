//! `podgate kas` as a process against a real Redis: it registers itself, answers GitLab
//! on its external listener (with GitLab's JWT only), and removes itself from the
//! registry on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use base64::Engine as _;
use podgate_agent::auth::mint_external;
use podgate_agent::proto::ConnectedAgentsByIdRequest;
use podgate_agent::proto::kas_api_client::KasApiClient;
use podgate_agent::testing::fixtures::http_get;
use podgate_registry::testing::{RedisServer, free_port};
use podgate_registry::{BackendConfig, Registry, RegistryConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kas_serves_registers_itself_and_cleans_up_on_sigterm() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let external = [1u8; 32];
    std::fs::write(dir.path().join("ext"), b64(&external)).unwrap();
    std::fs::write(dir.path().join("int"), b64(&[2u8; 32])).unwrap();
    std::fs::write(dir.path().join("metrics-token"), "scrape-me\n").unwrap();
    let (agent, ext, int, obs) = (free_port(), free_port(), free_port(), free_port());
    let config = dir.path().join("kas.toml");
    std::fs::write(
        &config,
        format!(
            "agent_listen = \"127.0.0.1:{agent}\"\nexternal_listen = \"127.0.0.1:{ext}\"\ninternal_listen = \"127.0.0.1:{int}\"\n\
             observability_listen = \"127.0.0.1:{obs}\"\n\
             metrics_token_file = \"{d}/metrics-token\"\n\
             external_secret_file = \"{d}/ext\"\ninternal_secret_file = \"{d}/int\"\n\
             [registry]\nbackend = {{ kind = \"redis\", url = \"{url}\" }}\n",
            d = dir.path().display(),
            url = redis.url()
        ),
    )
    .unwrap();
    let mut kas = Command::new(env!("CARGO_BIN_EXE_podgate"))
        .args(["kas", "--config", config.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Serving once it says so.
    let mut lines = BufReader::new(kas.stdout.take().unwrap()).lines();
    let first = tokio::task::spawn_blocking(move || (lines.next(), lines))
        .await
        .unwrap();
    let (line, mut lines) = first;
    assert!(line.unwrap().unwrap().starts_with("kas: agents on"));

    let registry = Registry::connect(RegistryConfig {
        backend: BackendConfig::Redis { url: redis.url() },
        ..RegistryConfig::default()
    })
    .await
    .unwrap();
    let instances = registry.kas_instances().await.unwrap();
    assert_eq!(instances.len(), 1);
    assert_eq!(instances[0].address.0, format!("127.0.0.1:{int}"));

    // Observability: probes are open, /metrics wants the token.
    let obs_addr = std::net::SocketAddr::from(([127, 0, 0, 1], obs));
    assert_eq!(http_get(obs_addr, "/healthz").await.0, 200);
    assert_eq!(http_get(obs_addr, "/readyz").await, (200, "ready\n".into()));
    assert_eq!(http_get(obs_addr, "/metrics").await.0, 401);
    let metrics = {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut s = tokio::net::TcpStream::connect(obs_addr).await.unwrap();
        s.write_all(
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer scrape-me\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    };
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(
        metrics.contains("podgate_kas_connected_agents 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("podgate_registry_backend_up 1"),
        "{metrics}"
    );

    let mut api = KasApiClient::connect(format!("http://127.0.0.1:{ext}"))
        .await
        .unwrap();
    let mut req = tonic::Request::new(ConnectedAgentsByIdRequest { agent_id: 3 });
    let token = mint_external(&external, "gitlab", 60).unwrap();
    req.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    assert!(
        api.connected_agents_by_id(req)
            .await
            .unwrap()
            .into_inner()
            .agents
            .is_empty()
    );
    let e = api
        .connected_agents_by_id(tonic::Request::new(ConnectedAgentsByIdRequest {
            agent_id: 3,
        }))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);

    let ok = Command::new("kill")
        .args(["-TERM", &kas.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let status = tokio::task::spawn_blocking(move || {
        let rest: Vec<String> = lines.by_ref().map_while(Result::ok).collect();
        (kas.wait().unwrap(), rest)
    })
    .await
    .unwrap();
    assert!(status.0.success(), "{:?} {:?}", status.0, status.1);
    assert!(
        registry.kas_instances().await.unwrap().is_empty(),
        "kas removed itself"
    );
}
