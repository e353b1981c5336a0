//! `podgate kas` as a process against a real Redis: it registers itself, answers GitLab
//! on its external listener (with GitLab's JWT only), and removes itself from the
//! registry on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use base64::Engine as _;
use podgate_agent::auth::mint_external;
use podgate_agent::proto::ConnectedAgentsByIdRequest;
use podgate_agent::proto::kas_api_client::KasApiClient;
use podgate_registry::testing::{RedisServer, free_port};
use podgate_registry::{BackendConfig, Registry, RegistryConfig};
use podgate_testkit::fixtures::http_get;

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

    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{ext}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut api = KasApiClient::new(channel);
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

    crate::common::process::terminate(kas.id());
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

/// `podgate loadtest agents` holds its agents connected to a `podgate kas` (kas's
/// own gauges count them and their idle tunnels), and they leave when it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loadtest_agents_connect_and_hold_their_tunnels() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    std::fs::write(d.join("ext"), b64(&[1u8; 32])).unwrap();
    std::fs::write(d.join("int"), b64(&[2u8; 32])).unwrap();
    let keygen = Command::new(env!("CARGO_BIN_EXE_podgate"))
        .args(["token", "keygen", "--kid", "agents", "--out"])
        .arg(d)
        .output()
        .unwrap();
    assert!(keygen.status.success(), "{keygen:?}");
    let (agent, obs) = (free_port(), free_port());
    let config = d.join("kas.toml");
    std::fs::write(
        &config,
        format!(
            "agent_listen = \"127.0.0.1:{agent}\"\nexternal_listen = \"127.0.0.1:0\"\ninternal_listen = \"127.0.0.1:0\"\n\
             observability_listen = \"127.0.0.1:{obs}\"\n\
             external_secret_file = \"{d}/ext\"\ninternal_secret_file = \"{d}/int\"\n\
             agent_keys = [\"{d}/agents.pem\"]\n",
            d = d.display(),
        ),
    )
    .unwrap();
    let mut kas = Command::new(env!("CARGO_BIN_EXE_podgate"))
        .args(["kas", "--config", config.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // kas's stdout read to its end: kas prints more lines after the first, and a
    // closed pipe would fail its `println!`.
    let (tx, first) = tokio::sync::oneshot::channel();
    let kas_stdout = kas.stdout.take().unwrap();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(kas_stdout).lines();
        let _ = tx.send(lines.next());
        lines.for_each(drop);
    });
    let first = first.await.unwrap();
    assert!(first.unwrap().unwrap().starts_with("kas: agents on"));

    let mut load = Command::new(env!("CARGO_BIN_EXE_podgate"))
        .args([
            "loadtest",
            "agents",
            "--kas",
            &format!("grpc://127.0.0.1:{agent}"),
        ])
        .arg("--key")
        .arg(d.join("agents.private.pem"))
        .args(["--agents", "25", "--first-agent", "100", "--duration", "3s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(load.stdout.take().unwrap()).lines();
    let (held, mut lines) = tokio::task::spawn_blocking(move || (lines.next(), lines))
        .await
        .unwrap();
    let held = held.unwrap().unwrap();
    assert!(
        held.starts_with("loadtest agents: 25 agents connected to grpc://127.0.0.1:"),
        "{held}"
    );
    let obs_addr = std::net::SocketAddr::from(([127, 0, 0, 1], obs));
    // Connected (the agents' own report) before the line; each replica's tunnels
    // open beside its connection.
    podgate_registry::testing::eventually(
        std::time::Duration::from_secs(10),
        "25 agents and their 50 idle tunnels at kas",
        || async {
            let (_, m) = http_get(obs_addr, "/metrics").await;
            (m.contains("podgate_kas_connected_agents 25\n")
                && m.contains("podgate_kas_tunnels{state=\"idle\"} 50\n"))
            .then_some(())
        },
    )
    .await;

    let status = tokio::task::spawn_blocking(move || load.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
    let done = lines.next().unwrap().unwrap();
    assert_eq!(
        done,
        "loadtest agents: done; 0 were not connected at the end"
    );
    // The agents are gone, their registrations are not: a `Register` lasts its TTL
    // (10 minutes), as GitLab's do; agentk has no way to unregister.
    let (_, m) = http_get(obs_addr, "/metrics").await;
    assert!(m.contains("podgate_kas_connected_agents 25\n"), "{m}");
    let _ = kas.kill();
    let _ = kas.wait();
}
