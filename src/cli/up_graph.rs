//! The Kubernetes side of `podgate up`: a kube-sim cluster (generated objects, light
//! churn), Pod 1's kas with its Kubernetes API proxy, and one agentk connected
//! through the podgate proxy. Users reach the cluster the way GitLab users do:
//! `kubectl` and the Graph API through the proxy's `/-/kubernetes-agent/k8s-proxy/`
//! with `Bearer pat:<agent id>:<personal access token>`, which the proxy routes by the
//! token's Pod and kas authorizes with the Pod simulator (GitLab's internal API).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use podgate_agent::agentk::{Agentk, AgentkConfig};
use podgate_agent::kas::k8s_proxy::K8sProxyConfig;
use podgate_agent::kas::{Kas, KasConfig};
use podgate_agent::kube_sim::{self, Churn, KubeSim};
use podgate_loadtest::pod_sim::PodSim;
use podgate_registry::{Registry, RegistryConfig};
use podgate_tokens::{Algorithm, KeySet, MintRequest, PodId, TokenKind};

/// Where users reach kas's Kubernetes API proxy on the podgate proxy.
pub(crate) const K8S_PROXY_PREFIX: &str = "/-/kubernetes-agent/k8s-proxy/";

/// The agent `podgate up` runs.
pub(crate) const AGENT_ID: i64 = 1;

/// kube-sim, kas and agentk; stopped when dropped.
pub(crate) struct KubeSide {
    /// kas's agent listener (Pod 1's `kas` pool).
    pub(crate) kas_agent: SocketAddr,
    /// kas's Kubernetes API proxy listener (Pod 1's `kas_k8s_proxy` pool).
    pub(crate) kas_k8s_proxy: SocketAddr,
    /// kube-sim's address.
    pub(crate) kube_sim: SocketAddr,
    /// Objects kube-sim started with.
    pub(crate) objects: usize,
    /// The public key (PEM) verifying agent tokens: the proxy needs it to route them.
    pub(crate) agent_key_pem: String,
    keys: KeySet,
    kube_task: tokio::task::JoinHandle<()>,
    _churn: Option<Churn>,
    kas: Option<Kas>,
    agentk: Option<Agentk>,
}

impl Drop for KubeSide {
    fn drop(&mut self) {
        self.agentk.take();
        self.kas.take();
        self.kube_task.abort();
    }
}

/// 32 random bytes: a kas secret.
pub(crate) fn secret() -> Vec<u8> {
    use rand::RngCore as _;
    let mut s = vec![0u8; 32];
    rand::thread_rng().fill_bytes(&mut s);
    s
}

/// Start kube-sim (with `objects` generated objects, changed at `churn` per second)
/// and kas (GitLab: `gitlab`, the Pod simulator whose kas secret is `kas_secret`).
pub(crate) async fn start(
    objects: usize,
    churn: f64,
    gitlab: &PodSim,
    kas_secret: Vec<u8>,
) -> anyhow::Result<KubeSide> {
    let sim = KubeSim::new(10_000);
    let objects = sim.generate(objects, 1);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("binding kube-sim")?;
    let kube_addr = listener.local_addr()?;
    let served = sim.clone();
    let kube_task =
        tokio::spawn(async move { served.serve(listener, std::future::pending()).await });
    let churn = (churn > 0.0).then(|| sim.start_churn(churn, 1));

    let key = podgate_tokens::keys::generate(Algorithm::EdDSA)
        .map_err(|e| anyhow::anyhow!("an agent key: {e}"))?;
    let keys = podgate_tokens::keys::keyset_from_generated("agents", &key)
        .map_err(|e| anyhow::anyhow!("the agent key set: {e}"))?;
    let any: SocketAddr = "127.0.0.1:0".parse()?;
    let registry = Registry::connect(RegistryConfig::default())
        .await
        .context("kas's registry")?;
    let kas = Kas::start(
        KasConfig {
            external_listen: any,
            internal_listen: any,
            external_secret: kas_secret,
            internal_secret: secret(),
            issuer: "gitlab".into(),
            agent_listen: any,
            agent_keys: keys.clone(),
            advertise_internal: None,
            max_wait: Duration::from_secs(30),
            observability_listen: None,
            agent_info: None,
            metrics_token: None,
            k8s_proxy: Some(K8sProxyConfig {
                // GitLab's Omnibus layout: the proxy on GitLab's host, the prefix
                // kept (kas `kubernetes_api.url_path_prefix`).
                url_prefix: K8S_PROXY_PREFIX.into(),
                ..K8sProxyConfig::new(any, &format!("http://{}", gitlab.addr()))
            }),
        },
        registry,
    )
    .await
    .context("starting kas")?;
    Ok(KubeSide {
        kas_agent: kas.agent_addr(),
        kas_k8s_proxy: kas
            .k8s_proxy_addr()
            .context("kas has no Kubernetes API proxy listener")?,
        kube_sim: kube_addr,
        objects,
        agent_key_pem: key
            .public
            .clone()
            .context("an Ed25519 key has a public key")?,
        keys,
        kube_task,
        _churn: churn,
        kas: Some(kas),
        agentk: None,
    })
}

impl KubeSide {
    /// Start agentk for [`AGENT_ID`] (a token routable to `pod`), dialling kas through
    /// the proxy at `proxy`, with a kubeconfig for kube-sim written into `dir`; wait
    /// until it is connected.
    pub(crate) async fn connect_agent(
        &mut self,
        proxy: SocketAddr,
        pod: PodId,
        dir: &Path,
    ) -> anyhow::Result<()> {
        let mut req = MintRequest::new(TokenKind::Agent, pod, 365 * 24 * 3600);
        req.agent = Some(AGENT_ID as u64);
        req.project = Some(podgate_loadtest::pod_sim::kubernetes::project_id(pod));
        let signing = self.keys.signing_key().context("the agent signing key")?;
        let token = podgate_tokens::mint(&req, signing, podgate_tokens::unix_now())
            .context("minting the agent token")?;
        let kubeconfig = dir.join("agentk-kubeconfig");
        std::fs::write(
            &kubeconfig,
            kube_sim::kubeconfig(&format!("http://{}", self.kube_sim)),
        )?;
        let agentk = Agentk::start(AgentkConfig {
            kas_url: format!("grpc://{proxy}"),
            token,
            pod_namespace: "gitlab-agent".into(),
            pod_name: "agentk-up".into(),
            idle_tunnels: 4,
            max_busy_tunnels: 500,
            observability_listen: None,
            kubeconfig: Some(kubeconfig),
            ca_file: None,
            graph_sync_timeout: Duration::from_secs(30),
        })
        .await
        .context("starting agentk")?;
        tokio::time::timeout(Duration::from_secs(30), agentk.connected())
            .await
            .context("agentk did not connect to kas through the proxy in 30 s")?;
        self.agentk = Some(agentk);
        Ok(())
    }
}

/// A self-signed P-256 certificate for `localhost` and `127.0.0.1` (its own CA):
/// `(tls.crt, tls.key)` written into `dir`. client-go sends a bearer token only over
/// TLS, so `kubectl` needs the proxy's TLS listener.
pub(crate) fn self_signed_cert(dir: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
    use openssl::asn1::Asn1Time;
    use openssl::bn::BigNum;
    use openssl::ec::{EcGroup, EcKey};
    use openssl::hash::MessageDigest;
    use openssl::nid::Nid;
    use openssl::pkey::PKey;
    use openssl::x509::extension::SubjectAlternativeName;
    use openssl::x509::{X509Builder, X509NameBuilder};
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)?;
    let key = PKey::from_ec_key(EcKey::generate(&group)?)?;
    let mut name = X509NameBuilder::new()?;
    name.append_entry_by_text("CN", "localhost")?;
    let name = name.build();
    let mut b = X509Builder::new()?;
    b.set_version(2)?;
    let serial = BigNum::from_u32(rand::random::<u32>())?.to_asn1_integer()?;
    b.set_serial_number(&serial)?;
    b.set_subject_name(&name)?;
    b.set_issuer_name(&name)?;
    b.set_pubkey(&key)?;
    b.set_not_before(Asn1Time::days_from_now(0)?.as_ref())?;
    b.set_not_after(Asn1Time::days_from_now(30)?.as_ref())?;
    let san = SubjectAlternativeName::new()
        .dns("localhost")
        .ip("127.0.0.1")
        .build(&b.x509v3_context(None, None))?;
    b.append_extension(san)?;
    b.sign(&key, MessageDigest::sha256())?;
    let (cert, key_path) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&cert, b.build().to_pem()?)?;
    std::fs::write(&key_path, key.private_key_to_pem_pkcs8()?)?;
    Ok((cert, key_path))
}

/// A kubeconfig for `kubectl`: the proxy's Kubernetes API proxy URL (HTTPS, trusting
/// `ca`) and the bearer value `pat:<agent>:<token>`. Written into `dir`; its path.
pub(crate) fn user_kubeconfig(
    dir: &Path,
    server: &str,
    ca: &Path,
    bearer: &str,
) -> anyhow::Result<PathBuf> {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: podgate\n  cluster:\n    server: {server}\n    \
         certificate-authority: {}\n\
         users:\n- name: podgate\n  user:\n    token: \"{bearer}\"\ncontexts:\n- name: podgate\n  context:\n    \
         cluster: podgate\n    user: podgate\n    namespace: default\ncurrent-context: podgate\n",
        ca.display()
    );
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}
