//! `/graph` on kas's Kubernetes API proxy, with agents kas cannot watch through: one
//! too old to serve `WatchGraph` (GitLab's Graph API design, `docs/graph-api.md`:
//! "kas returns an error if it cannot find an agent supporting the new
//! functionality"), one that never connects; and the end of
//! a watch in agentk when the client closes its WebSocket. A real Pod simulator
//! answers kas's `authorize_proxy_user`; the WebSocket client is tokio-tungstenite's.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use podgate_agentk::{Agentk, AgentkConfig, Handler, KubeHandler, Responses};
use podgate_kas::Kas;
use podgate_kas::k8s_proxy::K8sProxyConfig;
use podgate_loadtest::pod_sim::{AgentSpec, PodSim, PodSimConfig};
use podgate_testkit::fixtures::{EXTERNAL_SECRET, agent_tokens, kas_config, memory_registry};
use podgate_testkit::kube::KubeTestServer;
use podgate_testkit::workspaces::agentk_config;
use podgate_tokens::PodId;
use tokio::sync::Notify;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

const WAIT: Duration = Duration::from_secs(30);

/// agentk's handler, minus `WatchGraph` when `old` (an agent from before 18.1), and
/// counting the `WatchGraph` responses alive.
struct Agent {
    kube: KubeHandler,
    old: bool,
    alive: Arc<AtomicUsize>,
    ended: Arc<Notify>,
}

struct Counted {
    inner: Responses,
    alive: Arc<AtomicUsize>,
    ended: Arc<Notify>,
}

impl futures_util::Stream for Counted {
    type Item = Result<Vec<u8>, tonic::Status>;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.alive.fetch_sub(1, Ordering::SeqCst);
        self.ended.notify_one();
    }
}

impl Handler for Agent {
    /// An old agent does not advertise `WatchGraph`: kas answers `Unimplemented`.
    fn descriptor(
        &self,
    ) -> podgate_agent::proto::gitlab::agent::reverse_tunnel::info::AgentDescriptor {
        use podgate_agent::tunnel::{AGENTK_METHODS, WATCH_GRAPH, descriptor};
        let methods: Vec<&str> = AGENTK_METHODS
            .iter()
            .copied()
            .filter(|m| !self.old || *m != WATCH_GRAPH)
            .collect();
        descriptor(&methods).unwrap()
    }

    fn handle(&self, method: String, payload: Vec<u8>) -> Responses {
        if method == podgate_agent::tunnel::WATCH_GRAPH {
            if self.old {
                return Box::pin(futures_util::stream::once(async {
                    Err(tonic::Status::unimplemented(
                        "agentk does not serve \"WatchGraph\"",
                    ))
                }));
            }
            self.alive.fetch_add(1, Ordering::SeqCst);
            return Box::pin(Counted {
                inner: self.kube.handle(method, payload),
                alive: self.alive.clone(),
                ended: self.ended.clone(),
            });
        }
        self.kube.handle(method, payload)
    }
}

struct Stack {
    kas: Kas,
    bearer: String,
    alive: Arc<AtomicUsize>,
    ended: Arc<Notify>,
    _agentk: Agentk,
    _kube: KubeTestServer,
    _sim: PodSim,
}

/// Pod simulator (agents 1 and 2 usable by their project's members), kas with its
/// proxy (`max_wait` 1 s), kube-sim, and agentk for agent 1 (`old`: without
/// `WatchGraph`). Agent 2 never connects.
async fn stack(old: bool) -> Stack {
    let pod = PodId::new(1).unwrap();
    let mut sim_config = PodSimConfig::new(pod, "127.0.0.1:0".parse().unwrap());
    sim_config.kas_secret = Some(EXTERNAL_SECRET.to_vec());
    sim_config.agents = vec![
        AgentSpec::with_user_access(1, pod),
        AgentSpec::with_user_access(2, pod),
    ];
    let sim = PodSim::start(sim_config).await.unwrap();
    let pat = sim
        .create_personal_access_token("root", &["k8s_proxy"])
        .unwrap();
    let (keys, mint) = agent_tokens();
    let mut config = kas_config(keys, Duration::from_secs(1));
    config.k8s_proxy = Some(K8sProxyConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        &format!("http://{}", sim.addr()),
    ));
    let kas = Kas::start(config, memory_registry().await).await.unwrap();
    let kube = KubeTestServer::start(1000).await.unwrap();
    kube.put(
        "configmaps",
        "default",
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c1", "namespace": "default"}}),
    );
    let client = kube.client().await;
    let (alive, ended) = (Arc::new(AtomicUsize::new(0)), Arc::new(Notify::new()));
    let agent = Arc::new(Agent {
        kube: KubeHandler::new(client),
        old,
        alive: alive.clone(),
        ended: ended.clone(),
    });
    let agentk = Agentk::start_with(
        AgentkConfig {
            pod_namespace: "gitlab-agent".into(),
            ..agentk_config(&kas, mint(Some(1)), None)
        },
        agent,
    )
    .await
    .unwrap();
    tokio::time::timeout(WAIT, agentk.connected())
        .await
        .unwrap();
    Stack {
        kas,
        bearer: pat,
        alive,
        ended,
        _agentk: agentk,
        _kube: kube,
        _sim: sim,
    }
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(s: &Stack, agent: i64) -> Ws {
    let url = format!(
        "ws://{}/k8s-proxy/graph",
        s.kas.k8s_proxy_addr().expect("a proxy listener")
    );
    let mut req = url.into_client_request().unwrap();
    req.headers_mut().insert(
        "authorization",
        format!("Bearer pat:{agent}:{}", s.bearer).parse().unwrap(),
    );
    req.headers_mut().insert(
        "sec-websocket-protocol",
        "gitlab-agent-graph-api".parse().unwrap(),
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    ws.send(Message::text(
        r#"{"queries":[{"include":{"resource_selector_expression":"resource == 'configmaps'"}}]}"#,
    ))
    .await
    .unwrap();
    ws
}

/// The close frame (code, reason), and any `error` message before it.
async fn closed(ws: &mut Ws) -> (u16, String, Option<serde_json::Value>) {
    let mut error = None;
    loop {
        match tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("a close in time")
        {
            Some(Ok(Message::Close(Some(f)))) => {
                return (u16::from(f.code), f.reason.to_string(), error);
            }
            Some(Ok(Message::Text(t))) => {
                let v: serde_json::Value = serde_json::from_str(&t).unwrap();
                error = v.get("error").cloned();
            }
            other => panic!("expected a close frame, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn an_agent_without_watch_graph_is_told_to_upgrade() {
    let s = stack(true).await;
    let mut ws = connect(&s, 1).await;
    let (code, reason, error) = closed(&mut ws).await;
    assert_eq!(code, 1011, "{reason}");
    let full = error.map_or(reason.clone(), |e| e["reason"].as_str().unwrap().to_owned());
    assert!(full.contains("does not support the Graph API"), "{full}");
    assert!(full.contains("Upgrade the agent"), "{full}");
}

#[tokio::test]
async fn an_agent_that_never_connects_closes_with_try_again_later() {
    let s = stack(false).await;
    let mut ws = connect(&s, 2).await;
    let (code, reason, _) = closed(&mut ws).await;
    assert_eq!(code, 1013, "{reason}");
    assert!(reason.contains("not connected"), "{reason}");
}

#[tokio::test]
async fn closing_the_websocket_ends_the_watch_in_agentk() {
    let s = stack(false).await;
    let mut ws = connect(&s, 1).await;
    let first = tokio::time::timeout(WAIT, ws.next()).await.unwrap();
    let Some(Ok(Message::Text(t))) = first else {
        panic!("expected the initial graph, got {first:?}");
    };
    assert!(t.contains(r#""n":"c1""#), "{t}");
    assert_eq!(
        s.alive.load(Ordering::SeqCst),
        1,
        "one watch running in agentk"
    );
    ws.close(None).await.unwrap();
    // kas drops the tunnel; agentk drops the watch (and its informers) with it.
    tokio::time::timeout(WAIT, async {
        while s.alive.load(Ordering::SeqCst) != 0 {
            s.ended.notified().await;
        }
    })
    .await
    .expect("the watch ended in agentk after the WebSocket closed");
}
