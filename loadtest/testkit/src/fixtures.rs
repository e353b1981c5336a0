//! Shared pieces of kas/agentk tests and benchmarks: secrets, a loopback
//! [`KasConfig`], agent tokens, a plain HTTP GET and a self-signed certificate.
//! They panic on failure: a fixture that cannot be set up is a failed test.

use podgate_agent::proto::gitlab::agent::agent_configuration::rpc::agent_configuration_client::AgentConfigurationClient;
use podgate_agent::proto::gitlab::agent::agent_configuration::rpc::{
    ConfigurationRequest, ConfigurationResponse,
};
use podgate_agent::proto::gitlab::agent::agent_registrar::rpc::RegisterRequest;
use podgate_agent::proto::gitlab::agent::agent_registrar::rpc::agent_registrar_client::AgentRegistrarClient;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use podgate_tokens::{KeySet, MintRequest, PodId, TokenKind};

use podgate_kas::KasConfig;

/// The GitLab ↔ kas secret of tests.
pub const EXTERNAL_SECRET: [u8; 32] = *b"gitlab-kas-shared-secret-32bytes";
/// The kas ↔ kas secret of tests.
pub const INTERNAL_SECRET: [u8; 32] = *b"kas-to-kas-only-secret-32-bytes!";

/// A kas on free loopback ports (observability included) with the test secrets,
/// verifying agents with `keys`; `max_wait`: how long a request waits for an agent
/// connected nowhere.
pub fn kas_config(keys: KeySet, max_wait: Duration) -> KasConfig {
    let any = || SocketAddr::from(([127, 0, 0, 1], 0));
    KasConfig {
        external_listen: any(),
        internal_listen: any(),
        external_secret: EXTERNAL_SECRET.to_vec(),
        internal_secret: INTERNAL_SECRET.to_vec(),
        issuer: "gitlab".into(),
        agent_listen: any(),
        agent_keys: keys,
        advertise_internal: None,
        max_wait,
        max_idle_tunnels_per_agent: podgate_kas::DEFAULT_MAX_IDLE_TUNNELS_PER_AGENT,
        observability_listen: Some(any()),
        agent_info: None,
        metrics_token: None,
        k8s_proxy: None,
        gitlab_url: None,
        gitlab_external_url: None,
        agent_config: None,
        workspaces: None,
        job_router: None,
    }
}

/// An Ed25519 agent-token key (kid `agents`) and its tokens, routable to one Pod.
#[derive(Clone)]
pub struct AgentTokens {
    keys: KeySet,
    public_pem: String,
    pod: u64,
}

impl AgentTokens {
    /// A fresh key; tokens route to `pod`.
    pub fn new(pod: u64) -> AgentTokens {
        let key = podgate_tokens::keys::generate(podgate_tokens::Algorithm::EdDSA)
            .expect("generating a key");
        AgentTokens {
            keys: podgate_tokens::keys::keyset_from_generated("agents", &key).expect("a key set"),
            public_pem: key.public.clone().expect("Ed25519 has a public key"),
            pod,
        }
    }

    /// The key set (signing and verifying).
    pub fn keys(&self) -> KeySet {
        self.keys.clone()
    }

    /// The public key, PEM: write it as `agents.pem` for a kas's `agent_keys`.
    pub fn public_pem(&self) -> &str {
        &self.public_pem
    }

    /// An agent token for `agent` (none: a token without an agent id), project 42,
    /// valid for an hour.
    pub fn mint(&self, agent: Option<u64>) -> String {
        let mut req = MintRequest::new(
            TokenKind::Agent,
            PodId::new(self.pod).expect("a valid Pod id"),
            3600,
        );
        req.agent = agent;
        req.project = Some(42);
        podgate_tokens::mint(
            &req,
            self.keys.signing_key().expect("a signing key"),
            podgate_tokens::unix_now(),
        )
        .expect("minting an agent token")
    }
}

/// A key for Pod 1's agent tokens and a minter of them.
pub fn agent_tokens() -> (
    KeySet,
    impl Fn(Option<u64>) -> String + Clone + Send + Sync + 'static,
) {
    let tokens = AgentTokens::new(1);
    (tokens.keys(), move |agent| tokens.mint(agent))
}

/// `request` with `authorization: Bearer token`.
pub fn bearer<T>(mut request: tonic::Request<T>, token: &str) -> tonic::Request<T> {
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("a header value"),
    );
    request
}

/// `GET path` over HTTP/1.1 on `addr`: the status and the body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connecting");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("writing the request");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("reading the reply");
    let status = out
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .expect("an HTTP status line");
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned());
    (status, body.unwrap_or_default())
}

/// A self-signed P-256 certificate for `localhost` and `127.0.0.1`, made by the
/// `openssl` command: (`tls.crt`, `tls.key`) in `dir`. The certificate is its own CA.
pub fn self_signed_cert(dir: &Path) -> (PathBuf, PathBuf) {
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    let ok = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
        .args(["-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("running openssl")
        .success();
    assert!(ok, "openssl req failed");
    (cert, key)
}

/// A connected gRPC channel to `addr` (h2c).
pub async fn channel(addr: SocketAddr) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("a valid URI")
        .connect()
        .await
        .expect("connecting")
}

/// A presence registry on a fresh in-memory store.
pub async fn memory_registry() -> podgate_registry::Registry {
    podgate_registry::Registry::with_memory(
        podgate_registry::MemoryBackend::new(podgate_registry::Topology::default()),
        podgate_registry::RegistryConfig::default(),
    )
    .await
    .expect("a memory registry")
}

/// Connect an agentk replica as GitLab's agentk does, on `agent_channel` with
/// `token`: `AgentRegistrar/Register` with a fresh `pod_id`, then
/// `AgentConfiguration/GetConfiguration` with `skip_register`, read up to its first
/// message. The `pod_id` (the replica's connection id, which its tunnels name) and
/// the stream. The registration lasts until kas's registration TTL passes without
/// another `Register`, or kas stops.
pub async fn configuration_stream(
    agent_channel: tonic::transport::Channel,
    token: &str,
) -> Result<(i64, tonic::Streaming<ConfigurationResponse>), tonic::Status> {
    static NEXT: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(1);
    // Unique within the process, and apart from other processes' ids.
    let pod_id = (i64::from(std::process::id()) << 32)
        | NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    AgentRegistrarClient::new(agent_channel.clone())
        .register(bearer(
            tonic::Request::new(RegisterRequest {
                agent_meta: None,
                pod_id,
            }),
            token,
        ))
        .await?;
    let request = bearer(
        tonic::Request::new(ConfigurationRequest {
            skip_register: true,
            ..Default::default()
        }),
        token,
    );
    let mut stream = AgentConfigurationClient::new(agent_channel)
        .get_configuration(request)
        .await?
        .into_inner();
    stream
        .message()
        .await?
        .ok_or_else(|| tonic::Status::internal("the stream ended at once"))?;
    Ok((pod_id, stream))
}

/// GitLab's `GetPods(agent_id, connection_id)` with its token `gitlab`.
pub fn get_pods(
    agent_id: i64,
    connection_id: i64,
    gitlab: &str,
) -> tonic::Request<podgate_agent::proto::GetPodsRequest> {
    bearer(
        tonic::Request::new(podgate_agent::proto::GetPodsRequest {
            agent_id,
            connection_id,
            namespace: String::new(),
        }),
        gitlab,
    )
}

/// A `GetPods` answer as sorted `namespace/name` strings.
pub fn pod_names(response: &podgate_agent::proto::GetPodsResponse) -> Vec<String> {
    let mut names: Vec<String> = response
        .pods
        .iter()
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect();
    names.sort();
    names
}
