//! A workspace's URL through the whole path: `podgate proxy` (the `kas-workspaces`
//! rule: the host ends with `[workspaces] host_suffix`) → the Pod its personal
//! access token names → that Pod's kas Workspaces HTTP server (user from GitLab's
//! `/api/v4/user`, `agentw/authorize_user_access`) → agentk's reverse tunnel
//! (`WorkspaceRequest`) → the kube-sim backend of the workspace's Service.
//!
//! Pod 1 (the default Pod) and Pod 2 each have a Pod simulator as GitLab and a kas;
//! agent 7 of Pod 2 runs workspaces on kube-sim with its controllers. Checked:
//! a running workspace's editor and app ports answer with the backend's text
//! naming the workspace's Deployment and port; another user's token is 403; a host
//! GitLab cannot parse is 400; no token reaches the default Pod's kas, 401; a
//! token whose checksum is broken is refused by the proxy; a stopped workspace is
//! 503 "workspace … is not running".

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use podgate_loadtest::pod_sim::PodSim;
use podgate_loadtest::pod_sim::workspaces::{ActualState, DesiredState, WorkspaceSpec};
use podgate_testkit::workspaces::{
    self, WorkspacesStack, ZONE, assert_backend, assert_not_running, assert_refused,
    gitlab_kas_config, pod_sim_config, start_kas, with_workspaces,
};

/// `GET /?folder=%2Fprojects` with `host` and `extra` headers through `addr`:
/// status, body.
async fn get(addr: SocketAddr, host: &str, extra: &str) -> (u16, String) {
    workspaces::get_host(addr, "/?folder=%2Fprojects", host, extra).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_url_through_the_proxy_reaches_its_service() {
    // Pod 2: GitLab with agent 7, its kas and agentk; Pod 1: GitLab without agents
    // and its kas.
    let stack = WorkspacesStack::builder().pod(2).start().await;
    let (gitlab2, kas2) = (&stack.sim, &stack.kas);
    let gitlab1 = PodSim::start(pod_sim_config(1, &[], &stack.tokens))
        .await
        .unwrap();
    let kas1 = start_kas(with_workspaces(gitlab_kas_config(
        &stack.tokens,
        &format!("http://{}", gitlab1.addr()),
        None,
        Duration::from_secs(5),
    )))
    .await;
    gitlab2.kube().add_user("alice", Some("developer")).unwrap();
    let root_pat = gitlab2
        .create_personal_access_token("root", &["read_user"])
        .unwrap();
    let alice_pat = gitlab2
        .create_personal_access_token("alice", &["api"])
        .unwrap();

    let proxy = common::start_proxy(
        &format!(
            r#"[workspaces]
            host_suffix = ".{ZONE}"
            [topology]
            default_pod = 1
            [[topology.pods]]
            id = 1
            name = "legacy"
            web = ["{web1}"]
            kas_workspaces = ["{ws1}"]
            [[topology.pods]]
            id = 2
            name = "pod-2"
            web = ["{web2}"]
            kas = ["{agents2}"]
            kas_workspaces = ["{ws2}"]
            "#,
            web1 = gitlab1.addr(),
            ws1 = kas1.workspaces_addr().unwrap(),
            web2 = gitlab2.addr(),
            agents2 = kas2.agent_addr(),
            ws2 = kas2.workspaces_addr().unwrap(),
        ),
        tempfile::tempdir().unwrap(),
    )
    .await;
    let proxy_addr = SocketAddr::from(([127, 0, 0, 1], proxy.port));

    let ws = stack
        .running_workspace(WorkspaceSpec {
            ports: vec![3000],
            ..WorkspaceSpec::default()
        })
        .await;
    assert!(
        ws.url
            .starts_with(&format!("https://60001-{}.{ZONE}/", ws.name)),
        "{}",
        ws.url
    );
    let host = |port: u32| format!("{port}-{}.{ZONE}", ws.name);
    let root = format!("Authorization: Bearer {root_pat}\r\n");

    // A running workspace: the editor and an app port reach its Service.
    for port in [60001, 3000] {
        assert_backend(
            &get(proxy_addr, &host(port), &root).await,
            &ws,
            port,
            "GET /?folder=%2Fprojects",
        );
    }

    // Another user's token: GitLab says only the owner.
    let alice = format!("Authorization: Bearer {alice_pat}\r\n");
    assert_refused(
        &get(proxy_addr, &host(60001), &alice).await,
        403,
        "NOT_AUTHORIZED",
    );
    // A host GitLab cannot parse (no `<port>-` before the first dot).
    assert_refused(
        &get(proxy_addr, &format!("nodash.{ZONE}"), &root).await,
        400,
        "INVALID_HOST",
    );
    // No token: the default Pod's kas asks for one.
    assert_refused(
        &get(proxy_addr, &host(60001), "").await,
        401,
        "UNAUTHORIZED",
    );
    // A token whose checksum is broken: the proxy refuses it.
    let mut broken = root_pat.clone();
    let last = broken.pop().unwrap();
    broken.push(if last == 'a' { 'b' } else { 'a' });
    let (status, body) = get(
        proxy_addr,
        &host(60001),
        &format!("Authorization: Bearer {broken}\r\n"),
    )
    .await;
    assert_eq!(status, 401, "{body}");

    // Stopped: a clear 503.
    stack
        .set_state(ws.id, DesiredState::Stopped, ActualState::Stopped)
        .await;
    assert_not_running(&get(proxy_addr, &host(60001), &root).await, &ws);

    // Pod 1's kas saw only the request without a token.
    let text = kas1.metrics().render();
    assert!(
        text.contains("podgate_kas_workspace_requests_total{outcome=\"unauthorized\"} 1"),
        "{text}"
    );
    assert!(!text.contains("outcome=\"forwarded\""), "{text}");
    drop(proxy);
    stack.shutdown().await;
}
