//! Workspace traffic in one process: kas's Workspaces HTTP server authenticates a
//! personal access token with the Pod simulator (`GET /api/v4/user`), asks it
//! `agentw/authorize_user_access`, and tunnels the request through a real agentk
//! (`WorkspaceRequest`) to the kube-sim backend of the workspace's Service; a
//! stopped or terminated workspace is 503, another user 403, a bad host 400, no token 401, a
//! port the workspace does not expose 404, an upgrade 501.

use std::net::SocketAddr;

use podgate_loadtest::pod_sim::workspaces::{ActualState, DesiredState, WorkspaceSpec};
use podgate_testkit::workspaces::{
    self, WorkspacesStack, ZONE, assert_backend, assert_not_running, assert_refused,
};

/// `GET /some/path?x=1` with `host` and `extra` headers to `addr`: status, body.
async fn get(addr: SocketAddr, host: &str, extra: &str) -> (u16, String) {
    workspaces::get_host(addr, "/some/path?x=1", host, extra).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_workspace_is_reached_through_kas_and_agentk() {
    let stack = WorkspacesStack::builder().start().await;
    let sim = &stack.sim;
    sim.kube().add_user("alice", Some("developer")).unwrap();
    let root_pat = sim
        .create_personal_access_token("root", &["read_user"])
        .unwrap();
    let alice_pat = sim.create_personal_access_token("alice", &["api"]).unwrap();
    let ws_addr = stack.workspaces_addr();

    let ws = stack
        .running_workspace(WorkspaceSpec {
            ports: vec![3000],
            ..WorkspaceSpec::default()
        })
        .await;
    let host = |port: u32| format!("{port}-{}.{ZONE}", ws.name);
    let root = format!("Authorization: Bearer {root_pat}\r\n");

    // The editor port and an app port reach the workspace's Service backends.
    for port in [60001, 3000] {
        assert_backend(
            &get(ws_addr, &host(port), &root).await,
            &ws,
            port,
            "GET /some/path?x=1",
        );
    }

    // Refusals.
    assert_refused(&get(ws_addr, &host(60001), "").await, 401, "UNAUTHORIZED");
    assert_refused(
        &get(
            ws_addr,
            &host(60001),
            "Authorization: Bearer glpat-nobody\r\n",
        )
        .await,
        401,
        "UNAUTHORIZED",
    );
    let alice = format!("Authorization: Bearer {alice_pat}\r\n");
    assert_refused(
        &get(ws_addr, &host(60001), &alice).await,
        403,
        "NOT_AUTHORIZED",
    );
    assert_refused(
        &get(ws_addr, "nodash.workspaces.example.dev", &root).await,
        400,
        "INVALID_HOST",
    );
    assert_refused(
        &get(ws_addr, &host(4000), &root).await,
        404,
        "PORT_NOT_FOUND",
    );
    assert_refused(
        &get(
            ws_addr,
            "60001-workspace-7-1-nosuch.workspaces.example.dev",
            &root,
        )
        .await,
        404,
        "WORKSPACE_NOT_FOUND",
    );
    let upgrade = format!("{root}Connection: Upgrade\r\nUpgrade: websocket\r\n");
    assert_refused(
        &get(ws_addr, &host(60001), &upgrade).await,
        501,
        "UPGRADE_NOT_SUPPORTED",
    );

    // Stopped: GitLab still authorizes its owner; agentk finds no ready endpoint.
    stack
        .set_state(ws.id, DesiredState::Stopped, ActualState::Stopped)
        .await;
    assert_not_running(&get(ws_addr, &host(60001), &root).await, &ws);

    // Terminated: its Service is gone too (agentk's remembered Service no longer
    // answers), and the owner still gets the same clear 503.
    stack
        .set_state(ws.id, DesiredState::Terminated, ActualState::Terminated)
        .await;
    assert_refused(
        &get(ws_addr, &host(60001), &root).await,
        503,
        "WORKSPACE_NOT_RUNNING",
    );

    let metrics = stack.kas.metrics().render();
    for line in [
        "podgate_kas_workspace_requests_total{outcome=\"forwarded\"} 2",
        "podgate_kas_workspace_requests_total{outcome=\"not_running\"} 2",
        "podgate_kas_workspace_requests_total{outcome=\"not_authorized\"} 1",
        "podgate_kas_workspace_requests_total{outcome=\"unauthorized\"} 2",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    stack.shutdown().await;
}
