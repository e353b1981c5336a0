//! The installed `kubectl` through podgate's proxy and kas (its Kubernetes API
//! proxy, a personal access token as GitLab's user access takes it) to the
//! GitLab-shaped agentk, which dials kas through the proxy too, and on to a kube-sim: `get`, `get -w` (an event caused by a later `apply`
//! arrives while the watch runs), `apply`, and the upgrades — `exec` (a command's
//! output and exit code come back), `port-forward` (bytes both ways) and `logs -f`.
//! The stack and the kubectl runs are `crate::kubectl`'s (the same commands to
//! podgate's agentk); kube-sim's container runs `echo` as a shell would, echoes what
//! reaches a declared `containerPort` (8080 here), and logs the lines
//! `KubeSim::container_log` appends.

use std::time::Duration;

use super::agentk::{self, Config, Event, Transport};
use crate::kubectl::{Stack, exec_port_forward_and_logs, get_watch_and_apply, stack};

/// The GitLab-shaped agentk of agent 1 on `s`'s kas through `s`'s proxy (over
/// `transport`: h2c to the proxy's cleartext listener, or a WebSocket to its
/// `/-/kubernetes-agent/`) and kube-sim, registered.
async fn gitlab_agentk(s: &Stack, transport: Transport) -> agentk::Agentk {
    let address = match transport {
        Transport::H2c => s.edge.addr.to_string(),
        Transport::WebSocket => format!("{}{}", s.edge.addr, crate::edge::AGENT_PATH),
    };
    let mut cfg = Config::new(&address, &(s.mint)(Some(1)), &s.kube.url());
    cfg.tunnels = 4;
    cfg.transport = transport;
    let mut agent = agentk::start(cfg).unwrap();
    let registered = agent.wait_for(|e| matches!(e, Event::Registered).then_some(()));
    tokio::time::timeout(Duration::from_secs(30), registered)
        .await
        .expect("the GitLab agentk registered with kas");
    agent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_watch_and_apply_through_the_proxy_and_kas_to_a_gitlab_agentk() {
    let s = stack().await;
    let _agent = gitlab_agentk(&s, Transport::H2c).await;
    get_watch_and_apply(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_exec_port_forward_and_logs_through_the_proxy_and_kas_to_a_gitlab_agentk() {
    let s = stack().await;
    let _agent = gitlab_agentk(&s, Transport::H2c).await;
    exec_port_forward_and_logs(&s).await;
}

/// The same over a WebSocket (`ws-tunnel`), gzip on, as GitLab's agentk dials a
/// `wss://` kas URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_exec_port_forward_and_logs_through_the_proxy_and_kas_to_a_gitlab_agentk_over_websocket()
 {
    let s = stack().await;
    let _agent = gitlab_agentk(&s, Transport::WebSocket).await;
    exec_port_forward_and_logs(&s).await;
}
