//! Rails → kas on the external listener, with a client shaped as Rails' own
//! (`lib/gitlab/kas/client.rb` in gitlabhq/gitlabhq): GitLab's `AgentTracker` stubs
//! and a JWT as `JSONWebToken::HMACToken` signs it (HS256 with the shared secret,
//! `iss` the GitLab host name, `aud` `gitlab-kas`, `iat`/`nbf`/`exp`/`jti`), sent as
//! `authorization: bearer …`. Two kas share one real Redis: the agent connects to
//! the first, and both list it, by project and by agent, with the meta podgate's
//! agentk registered (its cluster's version included). What podgate kas does not
//! serve of GitLab's kas API answers `Unimplemented` naming it, after the same
//! authentication; gzip is taken and given.

use std::time::Duration;

use podgate_agent::proto::gitlab::agent::agent_tracker::rpc::agent_tracker_client::AgentTrackerClient;
use podgate_agent::proto::gitlab::agent::agent_tracker::rpc::get_connected_agents_request::Request as By;
use podgate_agent::proto::gitlab::agent::agent_tracker::rpc::{
    GetConnectedAgentsRequest, GetConnectedAgentsResponse,
};
use podgate_agent::proto::gitlab::agent::entity::KubernetesVersion;
use podgate_agentk::Agentk;
use podgate_kas::{Kas, KasConfig};
use podgate_registry::{AgentEvent, BackendConfig, Registry, RegistryConfig};
use podgate_testkit::fixtures::{
    EXTERNAL_SECRET, agent_tokens, channel, configuration_stream, kas_config,
};
use podgate_testkit::kube::KubeTestServer;
use podgate_testkit::workspaces::agentk_config;
use tonic::Code;

/// The host name Rails signs with (`Settings.gitlab.host`).
const GITLAB_HOST: &str = "gitlab.example.com";

/// A token as Rails' `Gitlab::Kas::Client#token` makes it: `JSONWebToken::Token`'s
/// claims (`jti`, `iat`, `nbf` 5 s ago, `exp` in 60 s) plus issuer and audience,
/// signed with `alg`.
fn rails_token(
    secret: &[u8],
    issuer: &str,
    audience: &str,
    alg: jsonwebtoken::Algorithm,
) -> String {
    let now = podgate_tokens::unix_now();
    let claims = serde_json::json!({
        "jti": format!("{:032x}", rand::random::<u128>()),
        "iat": now,
        "nbf": now - 5,
        "exp": now + 60,
        "iss": issuer,
        "aud": audience,
    });
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(alg),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret),
    )
    .unwrap()
}

/// `request` with `authorization: <scheme> <token>` (Rails writes `bearer`).
fn with_auth<T>(mut request: tonic::Request<T>, scheme: &str, token: &str) -> tonic::Request<T> {
    request.metadata_mut().insert(
        "authorization",
        format!("{scheme} {token}").parse().unwrap(),
    );
    request
}

/// A kas on the Redis at `url`, accepting any issuer (kas's default, as GitLab's).
async fn kas_on(url: String, keys: podgate_tokens::KeySet) -> Kas {
    let registry = Registry::connect(RegistryConfig {
        backend: BackendConfig::Redis { url },
        ..RegistryConfig::default()
    })
    .await
    .unwrap();
    let config = KasConfig {
        issuer: String::new(),
        ..kas_config(keys, Duration::from_secs(10))
    };
    Kas::start(config, registry).await.unwrap()
}

async fn connected(
    kas: &Kas,
    by: By,
    scheme: &str,
    token: &str,
) -> Result<GetConnectedAgentsResponse, tonic::Status> {
    let mut client = AgentTrackerClient::new(channel(kas.external_addr()).await);
    client
        .get_connected_agents(with_auth(
            tonic::Request::new(GetConnectedAgentsRequest { request: Some(by) }),
            scheme,
            token,
        ))
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rails_lists_connected_agents_by_project_and_by_agent_through_either_kas() {
    let redis = podgate_registry::testing::RedisServer::start();
    let (keys, mint) = agent_tokens();
    let kas1 = kas_on(redis.url(), keys.clone()).await;
    let kas2 = kas_on(redis.url(), keys).await;
    let token = rails_token(
        &EXTERNAL_SECRET,
        GITLAB_HOST,
        "gitlab-kas",
        jsonwebtoken::Algorithm::HS256,
    );

    // Nothing connected yet.
    let none = connected(&kas2, By::ProjectId(42), "bearer", &token)
        .await
        .unwrap();
    assert!(none.agents.is_empty(), "{none:?}");

    // Agent 7 (project 42, the fixture tokens' project) connects to kas1 only.
    let (connection, _stream) =
        configuration_stream(channel(kas1.agent_addr()).await, &mint(Some(7)))
            .await
            .unwrap();
    for (which, kas) in [("the kas holding it", &kas1), ("the other kas", &kas2)] {
        for by in [By::ProjectId(42), By::AgentId(7)] {
            // Registered before kas answered the agent's stream: no waiting.
            let agents = connected(kas, by, "bearer", &token).await.unwrap().agents;
            assert_eq!(agents.len(), 1, "{which}, {by:?}: {agents:?}");
            let a = &agents[0];
            assert_eq!(
                (a.agent_id, a.project_id, a.connection_id),
                (7, 42, connection),
                "{which}, {by:?}"
            );
            assert!(a.agent_meta.is_some(), "{which}, {by:?}: agent_meta");
            let at = a.connected_at.expect("connected_at");
            let now = i64::try_from(podgate_tokens::unix_now()).unwrap();
            assert!((now - 600..=now + 5).contains(&at.seconds), "{at:?}");
        }
        // Another project, another agent: nothing.
        for by in [By::ProjectId(43), By::AgentId(8)] {
            let r = connected(kas, by, "bearer", &token).await.unwrap();
            assert!(r.agents.is_empty(), "{which}, {by:?}: {r:?}");
        }
    }

    // Neither id: GitLab's validation error.
    let mut client = AgentTrackerClient::new(channel(kas2.external_addr()).await);
    let e = client
        .get_connected_agents(with_auth(
            tonic::Request::new(GetConnectedAgentsRequest { request: None }),
            "bearer",
            &token,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("GetConnectedAgentsRequest"), "{e:?}");
}

/// podgate's agentk registers as GitLab's agentk does: its pod and the Kubernetes
/// version read from the cluster's `/version`; Rails reads them back through the
/// kas that does not hold the agent. The registration at connection carries the
/// version agentk read last (none yet), the one right after it the version just
/// read: the test looks at each registration the registry announces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rails_sees_the_meta_and_kubernetes_version_agentk_registered() {
    let redis = podgate_registry::testing::RedisServer::start();
    let (keys, mint) = agent_tokens();
    let kas1 = kas_on(redis.url(), keys.clone()).await;
    let kas2 = kas_on(redis.url(), keys).await;
    let observer = Registry::connect(RegistryConfig {
        backend: BackendConfig::Redis { url: redis.url() },
        ..RegistryConfig::default()
    })
    .await
    .unwrap();
    let mut registrations = observer.subscribe();
    let kube = KubeTestServer::start(10).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, kube.kubeconfig()).unwrap();
    let _agentk = Agentk::start(agentk_config(&kas1, mint(Some(7)), Some(kubeconfig)))
        .await
        .unwrap();
    let token = rails_token(
        &EXTERNAL_SECRET,
        GITLAB_HOST,
        "gitlab-kas",
        jsonwebtoken::Algorithm::HS256,
    );
    let meta = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match registrations.recv().await {
                Ok(AgentEvent::Connected { agent_id: 7, .. } | AgentEvent::Resync)
                | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Ok(_) => continue,
                Err(e) => panic!("the registry's events: {e}"),
            }
            let agents = connected(&kas2, By::AgentId(7), "bearer", &token)
                .await
                .unwrap()
                .agents;
            // A resync (the observer's first) may come before the agent registers.
            let [agent] = agents.as_slice() else {
                assert!(agents.is_empty(), "{agents:?}");
                continue;
            };
            let meta = agent.agent_meta.clone().expect("agent_meta");
            if meta
                .kubernetes_version
                .as_ref()
                .is_some_and(|v| !v.git_version.is_empty())
            {
                return meta;
            }
        }
    })
    .await
    .expect("a registration with the cluster's version");
    assert_eq!(
        (meta.pod_namespace.as_str(), meta.pod_name.as_str()),
        ("default", "agentk-0")
    );
    assert_eq!(meta.version, env!("CARGO_PKG_VERSION"));
    // kube-sim's `/version`.
    assert_eq!(
        meta.kubernetes_version,
        Some(KubernetesVersion {
            major: "1".into(),
            minor: "32".into(),
            git_version: "v1.32.0-podgate-test".into(),
            platform: "linux/amd64".into(),
        })
    );
}

/// The external listener authenticates as GitLab's kas: HS256/384/512 with the
/// shared secret, audience `gitlab-kas`, any issuer, the scheme in any case; a
/// wrong secret, audience or algorithm, an expired token or none is
/// `Unauthenticated` with no detail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rails_tokens_are_checked_as_gitlab_kas_checks_them() {
    use jsonwebtoken::Algorithm::{HS256, HS384, HS512};
    let redis = podgate_registry::testing::RedisServer::start();
    let kas = kas_on(redis.url(), podgate_tokens::KeySet::new()).await;
    for (what, scheme, token) in [
        (
            "Rails' own",
            "bearer",
            rails_token(&EXTERNAL_SECRET, GITLAB_HOST, "gitlab-kas", HS256),
        ),
        (
            "Bearer",
            "Bearer",
            rails_token(&EXTERNAL_SECRET, GITLAB_HOST, "gitlab-kas", HS256),
        ),
        (
            "another issuer",
            "BEARER",
            rails_token(&EXTERNAL_SECRET, "gitlab", "gitlab-kas", HS256),
        ),
        (
            "HS384",
            "bearer",
            rails_token(&EXTERNAL_SECRET, GITLAB_HOST, "gitlab-kas", HS384),
        ),
        (
            "HS512",
            "bearer",
            rails_token(&EXTERNAL_SECRET, GITLAB_HOST, "gitlab-kas", HS512),
        ),
    ] {
        let r = connected(&kas, By::AgentId(7), scheme, &token).await;
        assert!(r.is_ok(), "{what}: {r:?}");
    }
    let expired = {
        let now = podgate_tokens::unix_now();
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(HS256),
            &serde_json::json!({"iss": GITLAB_HOST, "aud": "gitlab-kas", "iat": now - 300, "exp": now - 120}),
            &jsonwebtoken::EncodingKey::from_secret(&EXTERNAL_SECRET),
        )
        .unwrap()
    };
    for (what, scheme, token) in [
        (
            "another secret",
            "bearer",
            rails_token(
                b"another-secret-of-32-bytes-long!",
                GITLAB_HOST,
                "gitlab-kas",
                HS256,
            ),
        ),
        (
            "another audience",
            "bearer",
            rails_token(&EXTERNAL_SECRET, GITLAB_HOST, "gitlab", HS256),
        ),
        ("expired", "bearer", expired),
        (
            "basic scheme",
            "Basic",
            rails_token(&EXTERNAL_SECRET, GITLAB_HOST, "gitlab-kas", HS256),
        ),
        ("garbage", "bearer", "not-a-jwt".to_owned()),
    ] {
        let e = connected(&kas, By::AgentId(7), scheme, &token)
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{what}: {e:?}");
        assert_eq!(e.message(), "unauthenticated", "{what}: no detail leaks");
    }
}

/// The rest of GitLab's kas API answers `Unimplemented` naming the method, but
/// only to an authenticated caller; the tracker takes gzip and answers with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unserved_gitlab_kas_api_is_unimplemented_by_name_and_gzip_is_taken() {
    use tonic::codec::CompressionEncoding::Gzip;
    let redis = podgate_registry::testing::RedisServer::start();
    let kas = kas_on(redis.url(), podgate_tokens::KeySet::new()).await;
    let token = rails_token(
        &EXTERNAL_SECRET,
        GITLAB_HOST,
        "gitlab-kas",
        jsonwebtoken::Algorithm::HS256,
    );
    let ch = channel(kas.external_addr()).await;
    let call = |path: &'static str, token: Option<String>| {
        let ch = ch.clone();
        async move {
            let mut grpc = tonic::client::Grpc::new(ch);
            grpc.ready().await.unwrap();
            let mut request = tonic::Request::new(());
            if let Some(t) = token {
                request = with_auth(request, "bearer", &t);
            }
            grpc.unary::<(), (), _>(
                request,
                http::uri::PathAndQuery::from_static(path),
                tonic_prost::ProstCodec::default(),
            )
            .await
            .unwrap_err()
        }
    };
    for (path, says) in [
        (
            "/gitlab.agent.configuration_project.rpc.ConfigurationProject/ListAgentConfigFiles",
            "gitlab.agent.configuration_project.rpc.ConfigurationProject/ListAgentConfigFiles: \
             GitLab kas API that podgate kas does not serve",
        ),
        (
            "/gitlab.agent.agent_tracker.rpc.AgentTracker/GetConnectedAgentsByAgentIDs",
            "gitlab.agent.agent_tracker.rpc.AgentTracker/GetConnectedAgentsByAgentIDs: \
             GitLab kas API that podgate kas does not serve",
        ),
        (
            "/no.such.Service/Method",
            "no.such.Service/Method: no such method on kas's API",
        ),
    ] {
        let e = call(path, Some(token.clone())).await;
        assert_eq!(e.code(), Code::Unimplemented, "{path}: {e:?}");
        assert!(e.message().starts_with(says), "{path}: {e:?}");
        let e = call(path, None).await;
        assert_eq!(
            e.code(),
            Code::Unauthenticated,
            "{path} without a token: {e:?}"
        );
    }

    let response = AgentTrackerClient::new(ch.clone())
        .send_compressed(Gzip)
        .accept_compressed(Gzip)
        .get_connected_agents(with_auth(
            tonic::Request::new(GetConnectedAgentsRequest {
                request: Some(By::ProjectId(42)),
            }),
            "bearer",
            &token,
        ))
        .await
        .unwrap();
    assert_eq!(
        response.metadata().get("grpc-encoding").unwrap(),
        "gzip",
        "the answer is compressed"
    );
}
