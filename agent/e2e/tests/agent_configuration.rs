//! GitLab's agent configuration wire between kas and agentk:
//! `AgentConfiguration/GetConfiguration` (the file as `agentcfg.AgentConfiguration`,
//! resumed by commit id, posted to GitLab), `AgentRegistrar/Register` and
//! registration by the stream, and Rails' `Notifications/GitPushEvent` (to every
//! kas on one Redis, in GitLab's `kas_events` format).

use std::time::Duration;

use podgate_agent::auth::mint_external;
use podgate_agent::proto::gitlab::agent::agent_configuration::rpc::agent_configuration_client::AgentConfigurationClient;
use podgate_agent::proto::gitlab::agent::agent_configuration::rpc::{
    ConfigurationRequest, ConfigurationResponse,
};
use podgate_agent::proto::gitlab::agent::agent_registrar::rpc::RegisterRequest;
use podgate_agent::proto::gitlab::agent::agent_registrar::rpc::agent_registrar_client::AgentRegistrarClient;
use podgate_agent::proto::gitlab::agent::agentcfg;
use podgate_agent::proto::gitlab::agent::entity::AgentMeta;
use podgate_agent::proto::gitlab::agent::event::{GitPushEvent, Project};
use podgate_agent::proto::gitlab::agent::notifications::rpc::GitPushEventRequest;
use podgate_agent::proto::gitlab::agent::notifications::rpc::notifications_client::NotificationsClient;
use podgate_kas::agent_config::{AgentConfigSource, commit_id};
use podgate_kas::{Kas, KasConfig};
use podgate_registry::testing::RedisServer;
use podgate_registry::{AgentEvent, BackendConfig, Registry, RegistryConfig};
use podgate_testkit::fixtures::{
    EXTERNAL_SECRET as EXTERNAL, agent_tokens, bearer, channel, configuration_stream, kas_config,
    memory_registry,
};
use prost::Message as _;
use tonic::Code;

use crate::gitlab_access::{FakeGitlab, assert_kas_jwt, metric, start_agentk, start_kas, write};

/// `GetConfiguration` from `commit` with `token`, registering unless `skip`.
async fn get_configuration(
    kas: &Kas,
    token: &str,
    commit: &str,
    skip: bool,
) -> Result<tonic::Streaming<ConfigurationResponse>, tonic::Status> {
    let request = bearer(
        tonic::Request::new(ConfigurationRequest {
            commit_id: commit.into(),
            agent_meta: Some(AgentMeta {
                version: "v16.5.0".into(),
                commit_id: "c0ffee".into(),
                pod_namespace: "gitlab-agent".into(),
                pod_name: "agentk-7d9f".into(),
                kubernetes_version: None,
            }),
            skip_register: skip,
        }),
        token,
    );
    Ok(
        AgentConfigurationClient::new(channel(kas.agent_addr()).await)
            .get_configuration(request)
            .await?
            .into_inner(),
    )
}

/// The next message's configuration and commit.
async fn next(
    stream: &mut tonic::Streaming<ConfigurationResponse>,
) -> (agentcfg::AgentConfiguration, String) {
    let m = stream.message().await.unwrap().expect("a configuration");
    (m.configuration.expect("a configuration"), m.commit_id)
}

fn source(dir: &std::path::Path, poll: Duration) -> Option<AgentConfigSource> {
    Some(AgentConfigSource {
        dir: dir.to_owned(),
        poll,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_configuration_reaches_agentk_and_gitlab_by_commit() {
    let mut gitlab = FakeGitlab::start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("7.yaml");
    let v1 = "remote_development:\n  enabled: true\n  dns_zone: ws.example.com\n";
    write(&file, v1);
    let (keys, mint) = agent_tokens();
    let kas = start_kas(
        keys,
        Some(gitlab.url()),
        source(dir.path(), Duration::from_millis(50)),
    )
    .await;

    // agentk gets the file as GitLab's protobuf, at its blob id; GitLab gets it as JSON.
    let token = mint(Some(7));
    let agentk = start_agentk(&kas, token.clone()).await;
    let mut config = agentk.config();
    let first = config.borrow().clone().expect("connected means configured");
    assert_eq!((first.agent_id, first.project_id), (7, 42));
    assert_eq!(first.commit_id, commit_id(v1.as_bytes()));
    let rd = first.configuration.remote_development.clone().unwrap();
    assert!(rd.enabled);
    assert_eq!(rd.dns_zone, "ws.example.com");
    assert_eq!(
        (first.configuration.agent_id, first.configuration.project_id),
        (7, 42)
    );
    let post = gitlab.next().await;
    assert_eq!(
        (post.method.as_str(), post.path.as_str()),
        ("POST", "/api/v4/internal/kubernetes/agent_configuration")
    );
    assert_kas_jwt(&post.headers);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&post.body).unwrap(),
        serde_json::json!({"agent_id": 7, "agent_config": {
            "remote_development": {"enabled": true, "dns_zone": "ws.example.com"}}})
    );

    // A second replica of the agent: same commit, not posted again.
    let (_, mut raw) = configuration_stream(channel(kas.agent_addr()).await, &token)
        .await
        .unwrap();

    // A change reaches both replicas (a new commit) and GitLab.
    let v2 = "remote_development:\n  enabled: false\n";
    write(&file, v2);
    let changed = config
        .wait_for(|c| {
            c.as_ref()
                .is_some_and(|c| c.commit_id == commit_id(v2.as_bytes()))
        })
        .await
        .unwrap()
        .clone()
        .unwrap();
    assert!(!changed.configuration.remote_development.unwrap().enabled);
    assert_eq!(next(&mut raw).await.1, commit_id(v2.as_bytes()));
    assert_eq!(
        gitlab.next_json().await,
        serde_json::json!({"agent_id": 7, "agent_config": {"remote_development": {"enabled": false}}}),
        "the second replica must not have posted v1 again"
    );

    // A file GitLab would refuse ends the stream with FailedPrecondition; nothing
    // is posted, and agentk keeps v2 while it retries.
    write(&file, "remote_development: {enabled: true, dnsZone: x}\n");
    let e = raw.message().await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(
        e.message()
            .starts_with("Config: failed to parse agent configuration")
            && e.message().contains("dnsZone"),
        "{}",
        e.message()
    );
    assert!(metric(&kas, "podgate_kas_agent_config_rejected_total") >= 1);
    assert_eq!(
        agentk.config().borrow().as_ref().unwrap().commit_id,
        commit_id(v2.as_bytes())
    );
    // Fixed: agentk, reconnecting from v2's commit, gets the new one.
    let v3 = "";
    write(&file, v3);
    config
        .wait_for(|c| c.as_ref().is_some_and(|c| c.commit_id == commit_id(b"")))
        .await
        .unwrap();
    assert_eq!(
        gitlab.next_json().await,
        serde_json::json!({"agent_id": 7, "agent_config": {}})
    );
    assert!(gitlab.nothing());
}

/// A stream resumed at the current commit gets nothing; the next change is the
/// first message it gets, with the new commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_resumed_at_the_current_commit_waits_for_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("7.yaml");
    write(&file, "flux: {}\n");
    let (keys, mint) = agent_tokens();
    let kas = start_kas(keys, None, source(dir.path(), Duration::from_millis(20))).await;
    let token = mint(Some(7));

    let current = commit_id(b"flux: {}\n");
    let mut resumed = get_configuration(&kas, &token, &current, true)
        .await
        .unwrap();
    // A stream from an older commit is answered at once.
    let mut old = get_configuration(&kas, &token, "0123abcd", true)
        .await
        .unwrap();
    let (cfg, commit) = next(&mut old).await;
    assert_eq!(commit, current);
    assert_eq!(cfg.flux.unwrap().webhook_receiver_url, "");

    // The resumed stream's first message is the next commit, not the current one.
    let v2 = "flux:\n  webhook_receiver_url: http://receiver\n";
    write(&file, v2);
    let (cfg, commit) = next(&mut resumed).await;
    assert_eq!(
        commit,
        commit_id(v2.as_bytes()),
        "the current commit was sent again"
    );
    assert_eq!(cfg.flux.unwrap().webhook_receiver_url, "http://receiver");
    assert_eq!(next(&mut old).await.1, commit_id(v2.as_bytes()));
}

/// A missing file, an empty one and a kas without configuration files all answer
/// GitLab's empty configuration: only who the agent is, at the empty blob's id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absent_or_empty_file_is_the_empty_configuration() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("8.yaml"), "# nothing yet\n");
    let (keys, mint) = agent_tokens();
    let with_files = start_kas(
        keys.clone(),
        None,
        source(dir.path(), Duration::from_secs(60)),
    )
    .await;
    let without_files = start_kas(keys, None, None).await;
    let empty = agentcfg::AgentConfiguration {
        agent_id: 7,
        project_id: 42,
        ..Default::default()
    };
    for kas in [&with_files, &without_files] {
        let mut s = get_configuration(kas, &mint(Some(7)), "", true)
            .await
            .unwrap();
        assert_eq!(next(&mut s).await, (empty.clone(), commit_id(b"")));
    }
    let mut s = get_configuration(&with_files, &mint(Some(8)), "", true)
        .await
        .unwrap();
    let (cfg, commit) = next(&mut s).await;
    assert_eq!(commit, commit_id(b"# nothing yet\n"));
    assert_eq!(
        cfg,
        agentcfg::AgentConfiguration {
            agent_id: 8,
            ..empty
        }
    );
}

/// Without `skip_register`, a stream registers a random connection id with its
/// agent meta for as long as it is open; with it, nothing; `Register` registers
/// the `pod_id`. Configurations carry `[gitlab] external_url`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_by_stream_and_by_register() {
    let (keys, mint) = agent_tokens();
    let registry = memory_registry().await;
    let mut events = registry.subscribe();
    let config = podgate_kas::KasConfig {
        gitlab_external_url: Some("https://gitlab.example.com".into()),
        ..kas_config(keys, Duration::from_secs(5))
    };
    let kas = Kas::start(config, registry.clone()).await.unwrap();
    let token = mint(Some(3));
    for bad in ["nope", mint(None).as_str(), &token.replace('.', "x")] {
        let e = get_configuration(&kas, bad, "", false).await.unwrap_err();
        assert_eq!(
            (e.code(), e.message()),
            (Code::Unauthenticated, "unauthenticated")
        );
    }

    // skip_register: no registration (the first message is there, so the stream
    // has been served).
    let mut skipped = get_configuration(&kas, &token, "", true).await.unwrap();
    let (cfg, _) = next(&mut skipped).await;
    assert_eq!(cfg.gitlab_external_url, "https://gitlab.example.com");
    assert!(registry.connections_by_agent(3).await.unwrap().is_empty());

    let mut stream = get_configuration(&kas, &token, "", false).await.unwrap();
    let connection_id = match events.recv().await.unwrap() {
        AgentEvent::Connected {
            agent_id: 3,
            connection_id,
            ..
        } => connection_id,
        e => panic!("{e:?}"),
    };
    assert!(connection_id > 0);
    next(&mut stream).await;
    let conns = registry.connections_by_agent(3).await.unwrap();
    assert_eq!(conns.len(), 1);
    assert_eq!(
        (
            conns[0].project_id,
            conns[0].pod_name.as_str(),
            conns[0].version.as_str(),
            conns[0].commit.as_str()
        ),
        (42, "agentk-7d9f", "v16.5.0", "c0ffee")
    );
    assert_eq!(conns[0].kas.0, kas.internal_addr().to_string());
    // The stream ends: its registration goes (an event, no polling).
    drop(stream);
    loop {
        if let AgentEvent::Disconnected {
            agent_id: 3,
            connection_id: c,
            ..
        } = events.recv().await.unwrap()
        {
            assert_eq!(c, connection_id);
            break;
        }
    }
    assert!(registry.connections_by_agent(3).await.unwrap().is_empty());

    // Register: connection `pod_id`; refused for pod_id 0 and bad tokens.
    let mut registrar = AgentRegistrarClient::new(channel(kas.agent_addr()).await);
    let register = |pod_id: i64, token: &str| {
        bearer(
            tonic::Request::new(RegisterRequest {
                agent_meta: Some(AgentMeta {
                    version: "v16.5.0".into(),
                    pod_name: "agentk-pod".into(),
                    ..Default::default()
                }),
                pod_id,
            }),
            token,
        )
    };
    let e = registrar.register(register(5, "nope")).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    let e = registrar.register(register(0, &token)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    registrar.register(register(77, &token)).await.unwrap();
    registrar.register(register(77, &token)).await.unwrap();
    let conns = registry.connections_by_project(42).await.unwrap();
    assert_eq!(
        conns
            .iter()
            .map(|c| (c.agent_id, c.connection_id, c.pod_name.as_str()))
            .collect::<Vec<_>>(),
        [(3, 77, "agentk-pod")]
    );
    kas.shutdown().await.unwrap();
    assert!(registry.connections_by_agent(3).await.unwrap().is_empty());
}

/// Rails' push notification makes the streams of the project's agents read their
/// file at once (their poll is an hour away); it takes Rails' JWT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_git_push_event_refreshes_the_projects_open_streams() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("7.yaml");
    write(&file, "flux: {}\n");
    let (keys, mint) = agent_tokens();
    let kas = start_kas(keys, None, source(dir.path(), Duration::from_secs(3600))).await;
    let mut stream = get_configuration(&kas, &mint(Some(7)), "", true)
        .await
        .unwrap();
    assert_eq!(next(&mut stream).await.1, commit_id(b"flux: {}\n"));
    let v2 = "gitops: {}\n";
    write(&file, v2);

    let mut rails = NotificationsClient::new(channel(kas.external_addr()).await);
    let e = rails
        .git_push_event(push_request(42, "nope"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    let e = rails
        .git_push_event(bearer(
            tonic::Request::new(GitPushEventRequest { event: None }),
            &mint_external(&EXTERNAL, "gitlab", 60).unwrap(),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let jwt = mint_external(&EXTERNAL, "gitlab", 60).unwrap();
    rails.git_push_event(push_request(42, &jwt)).await.unwrap();
    let (cfg, commit) = next(&mut stream).await;
    assert_eq!(commit, commit_id(v2.as_bytes()));
    assert!(cfg.gitops.is_some());
}

/// A registry on the Redis server `redis`.
async fn redis_registry(redis: &RedisServer) -> Registry {
    Registry::connect(RegistryConfig {
        backend: BackendConfig::Redis { url: redis.url() },
        ..RegistryConfig::default()
    })
    .await
    .unwrap()
}

/// `GitPushEvent` for `project`, as Rails sends it.
fn push_request(project: i64, jwt: &str) -> tonic::Request<GitPushEventRequest> {
    bearer(
        tonic::Request::new(GitPushEventRequest {
            event: Some(GitPushEvent {
                project: Some(Project {
                    id: project,
                    full_path: "group/agents".into(),
                }),
            }),
        }),
        jwt,
    )
}

/// Two kas on one Redis: a push Rails reports to kas A refreshes a stream held by
/// kas B. What kas A publishes is GitLab's `kas_events` message (an `Any` of
/// `gitlab.agent.event.GitPushEvent`, byte for byte as GitLab's types encode it),
/// and an event a GitLab kas publishes there refreshes podgate's streams too. With
/// Redis gone the push is refused `UNAVAILABLE`, as GitLab's kas refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_git_push_event_reaches_every_kas_on_redis_in_gitlabs_format() {
    use crate::gitlab_wire::proto::gitlab::agent::event as gitlab;

    let mut redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("7.yaml");
    write(&file, "flux: {}\n");
    let (keys, mint) = agent_tokens();
    let start = |registry| {
        let config = KasConfig {
            agent_config: source(dir.path(), Duration::from_secs(3600)),
            ..kas_config(keys.clone(), Duration::from_secs(10))
        };
        Kas::start(config, registry)
    };
    let kas_a = start(redis_registry(&redis).await).await.unwrap();
    let kas_b = start(redis_registry(&redis).await).await.unwrap();
    let observer = redis_registry(&redis).await;
    let mut published = observer.kas_events();

    let mut stream = get_configuration(&kas_b, &mint(Some(7)), "", true)
        .await
        .unwrap();
    assert_eq!(next(&mut stream).await.1, commit_id(b"flux: {}\n"));
    let v2 = "gitops: {}\n";
    write(&file, v2);
    let jwt = mint_external(&EXTERNAL, "gitlab", 60).unwrap();
    let mut rails_a = NotificationsClient::new(channel(kas_a.external_addr()).await);
    rails_a
        .git_push_event(push_request(42, &jwt))
        .await
        .unwrap();
    let (_, commit) = next(&mut stream).await;
    assert_eq!(
        commit,
        commit_id(v2.as_bytes()),
        "kas B's stream saw kas A's push"
    );

    let gitlab_event = gitlab::GitPushEvent {
        project: Some(gitlab::Project {
            id: 42,
            full_path: "group/agents".into(),
        }),
    };
    let gitlab_payload = crate::gitlab_wire::any(&gitlab_event).encode_to_vec();
    let payload = tokio::time::timeout(Duration::from_secs(30), published.recv())
        .await
        .expect("the event was published")
        .unwrap();
    assert_eq!(
        &payload[..],
        &gitlab_payload[..],
        "GitLab's kas_events bytes"
    );

    // A GitLab kas on the same Redis publishes a push (redis-cli -x: the payload
    // from stdin, binary-safe).
    let v3 = "gitops: {}\nflux: {}\n";
    write(&file, v3);
    let mut cli = tokio::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &redis.port().to_string()])
        .args(["-x", "PUBLISH", "kas_events"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    {
        use tokio::io::AsyncWriteExt as _;
        let mut stdin = cli.stdin.take().unwrap();
        stdin.write_all(&gitlab_payload).await.unwrap();
    }
    assert!(cli.wait().await.unwrap().success());
    let (_, commit) = next(&mut stream).await;
    assert_eq!(commit, commit_id(v3.as_bytes()), "GitLab's event was heard");

    redis.kill();
    let e = rails_a
        .git_push_event(push_request(42, &jwt))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(
        e.message()
            .starts_with("Failed to publish received git push event"),
        "{e:?}"
    );
}
