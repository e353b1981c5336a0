//! podgate's proxy at the edge, run in the test's process (`podgate_proxy::server::run`
//! on a thread of its own, as `podgate proxy` runs it): one Pod whose GitLab, kas
//! agent listener and kas Kubernetes API proxy are given, on a cleartext listener
//! (agentk's gRPC and WebSocket, `/-/kubernetes-agent/`) and a TLS one (kubectl's
//! `/-/kubernetes-agent/k8s-proxy/`; client-go sends a bearer token over TLS only).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use podgate_proxy::config::ProxyConfig;
use podgate_proxy::server::{RunOptions, run};
use podgate_registry::testing::{eventually, free_port};
use podgate_testkit::fixtures::self_signed_cert;

/// Where kubectl finds the Kubernetes API proxy in GitLab's Omnibus layout; kas's
/// `url_prefix` behind the proxy.
pub const K8S_PROXY_PREFIX: &str = "/-/kubernetes-agent/k8s-proxy/";

/// Where agentk dials a `wss://` kas URL in GitLab's Omnibus layout.
pub const AGENT_PATH: &str = "/-/kubernetes-agent/";

/// A running proxy: its listeners and the certificate its TLS listener presents.
pub struct Edge {
    /// Cleartext HTTP/1 and h2c.
    pub addr: SocketAddr,
    /// TLS (self-signed for `localhost` and `127.0.0.1`).
    pub tls_addr: SocketAddr,
    /// The TLS certificate, PEM: its own CA.
    pub ca_pem: String,
}

/// The Pod behind the proxy, all its traffic to one instance of each.
pub struct Pod {
    /// The Pod's GitLab (Rails and Workhorse).
    pub gitlab: SocketAddr,
    /// kas's agent listener.
    pub kas: SocketAddr,
    /// kas's Kubernetes API proxy listener.
    pub kas_k8s_proxy: SocketAddr,
    /// The public key of the Pod's agent tokens, PEM: the proxy verifies agent
    /// tokens to route them.
    pub agent_key_pem: String,
}

/// Starts the proxy for `pod` (Pod 1, the default Pod) with its files in `dir`; returns
/// once both listeners accept.
pub async fn start(pod: &Pod, dir: &Path) -> Edge {
    let (cert, key) = self_signed_cert(dir);
    let keys = dir.join("agents.pem");
    std::fs::write(&keys, &pod.agent_key_pem).unwrap();
    let (port, tls_port) = (free_port(), free_port());
    let config = format!(
        "listen = \"127.0.0.1:{port}\"\n\
         admin_listen = \"off\"\n\
         grace_period_secs = 0\n\
         upgrade_sock = \"{sock}\"\n\
         keys = [\"{keys}\"]\n\
         [tls]\n\
         listen = \"127.0.0.1:{tls_port}\"\n\
         cert = \"{cert}\"\n\
         key = \"{key}\"\n\
         [topology]\n\
         default_pod = 1\n\
         [[topology.pods]]\n\
         id = 1\n\
         name = \"pod-1\"\n\
         web = [\"{gitlab}\"]\n\
         kas = [\"{kas}\"]\n\
         kas_k8s_proxy = [\"{k8s}\"]\n",
        sock = dir.join("upgrade.sock").display(),
        keys = keys.display(),
        cert = cert.display(),
        key = key.display(),
        gitlab = pod.gitlab,
        kas = pod.kas,
        k8s = pod.kas_k8s_proxy,
    );
    let config = ProxyConfig::parse(&config, "the test's proxy.toml").unwrap();
    std::thread::spawn(move || {
        // Returns only on a start-up error; serving, it runs until the process ends.
        if let Err(e) = run(config, RunOptions::default()) {
            panic!("the proxy did not start: {e}");
        }
    });
    let edge = Edge {
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        tls_addr: SocketAddr::from(([127, 0, 0, 1], tls_port)),
        ca_pem: std::fs::read_to_string(&cert).unwrap(),
    };
    for addr in [edge.addr, edge.tls_addr] {
        accepting(addr).await;
    }
    edge
}

/// Returns once `addr` accepts a connection (within a minute). pingora binds its
/// listeners on threads of its own after `run` has built the server and announces
/// nothing, so this polls.
async fn accepting(addr: SocketAddr) {
    eventually(
        Duration::from_secs(60),
        &format!("the proxy to accept on {addr}"),
        || async move { tokio::net::TcpStream::connect(addr).await.ok().map(|_| ()) },
    )
    .await;
}
