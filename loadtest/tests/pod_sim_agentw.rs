//! The Pod simulator's internal API for kas's Workspaces HTTP server, over real
//! HTTP as kas calls it (`agentw/server_config`, `agentw/authorize_user_access`,
//! both behind kas's JWT), and `GET /api/v4/user` with personal access tokens.

use crate::common;

use std::net::SocketAddr;

use common::{call, json as send};
use podgate_loadtest::pod_sim::{AgentSpec, PodSim, PodSimConfig};
use podgate_tokens::PodId;
use serde_json::{Value, json};

const KAS_SECRET: &[u8; 32] = b"0123456789abcdef0123456789abcdef";
const AUTHORIZE: &str = "/api/v4/internal/agents/agentw/authorize_user_access";

async fn sim() -> PodSim {
    let mut config = PodSimConfig::new(PodId::new(2).unwrap(), "127.0.0.1:0".parse().unwrap());
    config.kas_secret = Some(KAS_SECRET.to_vec());
    config.agents = vec![AgentSpec::with_user_access(1, config.pod_id)];
    config.external_url = Some("https://gitlab.example.com".into());
    PodSim::start(config).await.unwrap()
}

fn kas_header() -> String {
    let now = podgate_tokens::unix_now();
    let jwt = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &json!({"iss": "gitlab-kas", "aud": "gitlab", "iat": now, "exp": now + 30}),
        &jsonwebtoken::EncodingKey::from_secret(KAS_SECRET),
    )
    .unwrap();
    format!("gitlab-kas-api-request: {jwt}")
}

/// `authorize_user_access` for `host` and `user` (already escaped): status, JSON.
async fn authorize(addr: SocketAddr, query: &str) -> (u16, Value) {
    let kas = kas_header();
    let r = call(addr, "GET", &format!("{AUTHORIZE}?{query}"), &[&kas], b"").await;
    (r.status, r.json())
}

/// A PAT for `username` with `scopes`.
async fn pat(addr: SocketAddr, username: &str, scopes: &[&str]) -> (u64, String) {
    let r = send(
        addr,
        "POST",
        "/-/podsim/personal_access_tokens",
        &[],
        json!({"username": username, "scopes": scopes}),
    )
    .await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    let v = r.json();
    (
        v["id"].as_u64().unwrap(),
        v["token"].as_str().unwrap().to_owned(),
    )
}

#[tokio::test]
async fn server_config_and_authorize_user_access_as_rails() {
    let sim = sim().await;
    let addr = sim.addr();

    // Both need kas's JWT.
    for path in [
        "/api/v4/internal/agents/agentw/server_config".to_owned(),
        format!("{AUTHORIZE}?workspace_host=x&user_id=1"),
    ] {
        let r = call(addr, "GET", &path, &[], b"").await;
        assert_eq!(r.status, 401, "{path}");
        assert_eq!(r.json()["message"], "KAS JWT authentication invalid");
    }
    let kas = kas_header();
    let r = call(
        addr,
        "GET",
        "/api/v4/internal/agents/agentw/server_config",
        &[&kas],
        b"",
    )
    .await;
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(
        v["api_external_url"],
        "https://gitlab.example.com/-/kubernetes-agent//workspaces"
    );
    assert_eq!(
        v["oauth_redirect_url"],
        "https://gitlab.example.com/-/kubernetes-agent//workspaces/oauth/redirect"
    );
    assert_eq!(v["oauth_client_id"].as_str().unwrap().len(), 64);

    // A workspace of user 1 (root) exposing 3000 besides the editor and SSH.
    let r = send(
        addr,
        "PUT",
        "/-/podsim/agents/1/workspaces_config",
        &[],
        json!({"enabled": true, "dns_zone": "workspaces.example.dev"}),
    )
    .await;
    assert_eq!(r.status, 200);
    let r = send(
        addr,
        "POST",
        "/-/podsim/workspaces",
        &[],
        json!({"agent_id": 1, "user_id": 1, "ports": [3000]}),
    )
    .await;
    assert_eq!(r.status, 201);
    let ws = r.json();
    let (id, name) = (ws["id"].as_u64().unwrap(), ws["name"].as_str().unwrap());

    let host = |port: &str| format!("{port}-{name}.workspaces.example.dev");
    for (query, status, info) in [
        (
            format!("workspace_host={}&user_id=1", host("60001")),
            "AUTHORIZED",
            json!({"port": "60001", "workspace_id": id}),
        ),
        (
            format!("workspace_host={}&user_id=1", host("3000")),
            "AUTHORIZED",
            json!({"port": "3000", "workspace_id": id}),
        ),
        (
            format!("workspace_host={}&user_id=1", host("60022")),
            "AUTHORIZED",
            json!({"port": "60022", "workspace_id": id}),
        ),
        // The zone is ignored; a URL's host is used.
        (
            format!("workspace_host=https%3A%2F%2F60001-{name}.elsewhere%2Fpath&user_id=1"),
            "AUTHORIZED",
            json!({"port": "60001", "workspace_id": id}),
        ),
        // Owner first, then the port.
        (
            format!("workspace_host={}&user_id=2", host("4000")),
            "NOT_AUTHORIZED",
            json!({}),
        ),
        (
            format!("workspace_host={}&user_id=1", host("4000")),
            "PORT_NOT_FOUND",
            json!({}),
        ),
        (
            "workspace_host=60001-workspace-1-1-nope.z&user_id=1".to_owned(),
            "WORKSPACE_NOT_FOUND",
            json!({}),
        ),
        (
            "workspace_host=60001-.z&user_id=1".to_owned(),
            "INVALID_HOST",
            json!({}),
        ),
        (
            "workspace_host=&user_id=1".to_owned(),
            "INVALID_HOST",
            json!({}),
        ),
    ] {
        let (code, v) = authorize(addr, &query).await;
        assert_eq!(code, 200, "{query}");
        assert_eq!(v, json!({"status": status, "info": info}), "{query}");
    }
    // Grape's parameter errors.
    let (code, v) = authorize(addr, "user_id=x").await;
    assert_eq!(code, 400);
    assert_eq!(v["error"], "workspace_host is missing, user_id is invalid");

    // A stopped workspace of its owner is still authorized (Rails looks at no state).
    let r = send(
        addr,
        "PATCH",
        &format!("/-/podsim/workspaces/{id}"),
        &[],
        json!({"desired_state": "Stopped"}),
    )
    .await;
    assert_eq!(r.status, 200);
    let (_, v) = authorize(addr, &format!("workspace_host={}&user_id=1", host("60001"))).await;
    assert_eq!(v["status"], "AUTHORIZED");
}

#[tokio::test]
async fn current_user_by_personal_access_token() {
    let sim = sim().await;
    let addr = sim.addr();
    let (_, read) = pat(addr, "root", &["read_user"]).await;
    let (_, k8s) = pat(addr, "root", &["k8s_proxy"]).await;
    let (revoked_id, revoked) = pat(addr, "root", &["api"]).await;
    let r = call(
        addr,
        "DELETE",
        &format!("/-/podsim/personal_access_tokens/{revoked_id}"),
        &[],
        b"",
    )
    .await;
    assert_eq!(r.status, 204);

    for auth in [
        format!("private-token: {read}"),
        format!("authorization: Bearer {read}"),
    ] {
        let r = call(addr, "GET", "/api/v4/user", &[&auth], b"").await;
        assert_eq!(r.status, 200, "{auth}");
        let v = r.json();
        assert_eq!(v["id"], 1);
        assert_eq!(v["username"], "root");
        assert_eq!(v["state"], "active");
    }
    let r = call(addr, "GET", "/api/v4/user", &[], b"").await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json(), json!({"message": "401 Unauthorized"}));
    let r = call(
        addr,
        "GET",
        "/api/v4/user",
        &["authorization: Bearer glpat-unknown"],
        b"",
    )
    .await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json(), json!({"message": "401 Unauthorized"}));
    let auth = format!("private-token: {revoked}");
    let r = call(addr, "GET", "/api/v4/user", &[&auth], b"").await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"], "invalid_token");
    let auth = format!("private-token: {k8s}");
    let r = call(addr, "GET", "/api/v4/user", &[&auth], b"").await;
    assert_eq!(r.status, 403);
    assert_eq!(r.json()["error"], "insufficient_scope");
}
