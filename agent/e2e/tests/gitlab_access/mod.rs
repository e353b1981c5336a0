//! kas's `GitlabAccess.MakeRequest` and agent configuration files, against a real
//! kas, a real agentk (its `ModuleClient` and `Agentk::config`) and a small HTTP
//! server standing for GitLab that records what it received and answers as told.
//!
//! The harness (the fake GitLab, kas and agentk, raw calls) is [`harness`].

mod harness;
pub use harness::*;

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt as _;
use http::Method;
use podgate_agent::proto::gitlab::agent::grpctool::{
    HttpRequest as Request, http_request as request, http_response as response,
};
use podgate_agent::proto::gitlab_access::HeaderExtra;
use podgate_agent::proto::gitlab_access::gitlab_access_client::GitlabAccessClient;
use podgate_kas::agent_config::AgentConfigSource;
use podgate_testkit::fixtures::{agent_tokens, bearer, channel};
use prost::Message as _;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn module_requests_reach_gitlab_and_come_back_unchanged() {
    let mut gitlab = FakeGitlab::start().await;
    let (keys, mint) = agent_tokens();
    let kas = start_kas(keys, Some(gitlab.url()), None).await;
    let token = mint(Some(7));
    let agentk = start_agentk(&kas, token.clone()).await;
    let client = agentk.module_client();

    // The path, the query (Go's encoding), both auth headers, the body.
    let body = br#"{"update_type":"full","workspace_agent_infos":[]}"#.to_vec();
    let answer = client
        .request(
            "remote_development",
            Method::POST,
            "/reconcile?b=2&a=x%20y&b=1",
            Some(body.clone()),
        )
        .await
        .unwrap();
    assert_eq!(answer.status, 201);
    assert_eq!(answer.body, "answer:201");
    assert_eq!(answer.headers["x-answered"], "yes");
    assert_eq!(answer.headers["content-type"], "application/json");
    let seen = gitlab.next_module().await;
    assert_eq!(seen.method, "POST");
    assert_eq!(
        seen.path,
        "/api/v4/internal/kubernetes/modules/remote_development/reconcile"
    );
    assert_eq!(seen.query.as_deref(), Some("a=x+y&b=2&b=1"));
    // GitLab 16.5's kas: the agent token as `Authorization: Bearer`, beside its JWT.
    assert_eq!(
        seen.headers["authorization"],
        format!("Bearer {token}").as_str()
    );
    assert_kas_jwt(&seen.headers);
    assert_eq!(seen.headers["content-type"], "application/json");
    assert_eq!(seen.body, body);

    // GitLab's status and body come back unchanged, whatever they are.
    for status in [400u16, 500, 201] {
        let mut headers = http::HeaderMap::new();
        headers.insert("x-answer-status", status.to_string().parse().unwrap());
        let answer = client
            .request_with(
                "remote_development",
                Method::GET,
                "/prerequisites",
                headers,
                None,
            )
            .await
            .unwrap();
        assert_eq!(answer.status, status);
        assert_eq!(answer.body, format!("answer:{status}"));
        let seen = gitlab.next_module().await;
        assert_eq!(seen.method, "GET");
        assert!(seen.body.is_empty());
    }

    // Large bodies both ways (3 MiB up, 5 MiB down), intact.
    let big = pattern(3 << 20, 1);
    let mut headers = http::HeaderMap::new();
    headers.insert("x-answer-size", (5u32 << 20).to_string().parse().unwrap());
    let answer = client
        .request_with(
            "remote_development",
            Method::POST,
            "/reconcile",
            headers,
            Some(Bytes::from(big.clone())),
        )
        .await
        .unwrap();
    assert_eq!(answer.status, 201);
    assert!(
        answer.body == pattern(5 << 20, 7),
        "the large answer differs"
    );
    let seen = gitlab.next_module().await;
    assert!(seen.body == big, "the large request body differs");
    // Streamed: GitLab got it chunked, not collected and re-sent with a length.
    assert_eq!(seen.headers["transfer-encoding"], "chunked");
    assert!(seen.headers.get("content-length").is_none());

    // Through the raw protocol: the answer arrives as a header, many data messages
    // of at most 32 KiB each, and a trailer.
    let messages = raw_call(
        &kas,
        &token,
        raw_request(
            "remote_development",
            "/reconcile",
            &[("X-Answer-Size", "2097152")],
            &pattern(1 << 20, 3),
            100_000,
        ),
    )
    .await
    .unwrap();
    let response::Message::Header(h) = &messages[0] else {
        panic!("the first message is not the header: {:?}", messages[0]);
    };
    let r = h.response.as_ref().unwrap();
    assert_eq!((r.status_code, r.status.as_str()), (201, "201 Created"));
    assert!(matches!(
        messages.last(),
        Some(response::Message::Trailer(_))
    ));
    let data: Vec<&Vec<u8>> = messages
        .iter()
        .filter_map(|m| match m {
            response::Message::Data(d) => Some(&d.data),
            _ => None,
        })
        .collect();
    assert!(data.len() >= 64, "{} data messages", data.len());
    assert!(data.iter().all(|d| d.len() <= 32 << 10));
    assert_eq!(data.iter().map(|d| d.len()).sum::<usize>(), 2 << 20);
    assert_eq!(gitlab.next_module().await.body, pattern(1 << 20, 3));

    // Counted by module and status class.
    let count = |status: &str| {
        metric(
            &kas,
            &format!(
                "podgate_kas_module_requests_total{{module=\"remote_development\",status=\"{status}\"}}"
            ),
        )
    };
    assert_eq!((count("2xx"), count("4xx"), count("5xx")), (4, 1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrades_bad_tokens_and_bad_requests_are_refused_before_gitlab() {
    let mut gitlab = FakeGitlab::start().await;
    let (keys, mint) = agent_tokens();
    let kas = start_kas(keys, Some(gitlab.url()), None).await;
    let token = mint(Some(7));

    for headers in [
        &[("Upgrade", "websocket"), ("Connection", "Upgrade")][..],
        &[("connection", "keep-alive, upgrade")][..],
    ] {
        let e = raw_call(
            &kas,
            &token,
            raw_request("remote_development", "/x", headers, b"", 10),
        )
        .await
        .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert_eq!(e.message(), "connection upgrade is not supported");
    }
    let e = raw_call(&kas, &token, raw_request("", "/x", &[], b"", 10))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let e = raw_call(
        &kas,
        &token,
        raw_request(
            "remote_development",
            "/../../agent_configuration",
            &[],
            b"",
            10,
        ),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");

    // A token kas does not accept, and no token at all.
    let (_, other_mint) = agent_tokens();
    for bad in [other_mint(Some(7)), "glagent-not-a-real-token".into()] {
        let e = raw_call(
            &kas,
            &bad,
            raw_request("remote_development", "/x", &[], b"{}", 10),
        )
        .await
        .unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    }
    let mut client = GitlabAccessClient::new(channel(kas.agent_addr()).await);
    let e = client
        .make_request(tonic::Request::new(tokio_stream::iter(raw_request(
            "remote_development",
            "/x",
            &[],
            b"",
            10,
        ))))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);

    // Data for a request announced without a body: refused, and GitLab's request
    // is aborted rather than completed.
    let mut messages = raw_request("remote_development", "/x", &[], b"", 10);
    messages.insert(
        1,
        Request {
            message: Some(request::Message::Data(request::Data {
                data: b"surprise".to_vec(),
            })),
        },
    );
    let e = raw_call(&kas, &token, messages).await;
    // GitLab may have answered the empty request before kas read the data (then the
    // body it saw is empty, below); else the call ends with kas's error.
    if let Err(e) = e {
        assert_eq!(e.code(), Code::Internal, "{e:?}");
        assert_eq!(e.message(), "unexpected HttpRequest_Data message received");
    }
    // A request whose first message is not a header.
    let e = raw_call(
        &kas,
        &token,
        vec![Request {
            message: Some(request::Message::Trailer(request::Trailer {})),
        }],
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    // `Header.extra` holding another message, or nothing: refused, naming the type
    // URL sent and the one wanted (GitLab's `UnmarshalTo`).
    for (type_url, shown) in [
        (
            "type.googleapis.com/gitlab.agent.kubernetes_api.rpc.HeaderExtra",
            "\"type.googleapis.com/gitlab.agent.kubernetes_api.rpc.HeaderExtra\"",
        ),
        ("", "\"\""),
    ] {
        let mut messages = raw_request("remote_development", "/x", &[], b"", 10);
        let Some(request::Message::Header(h)) = &mut messages[0].message else {
            unreachable!("raw_request starts with the header")
        };
        h.extra = (!type_url.is_empty()).then(|| prost_types::Any {
            type_url: type_url.into(),
            value: HeaderExtra {
                module_name: "remote_development".into(),
            }
            .encode_to_vec(),
        });
        let e = raw_call(&kas, &token, messages).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert_eq!(
            e.message(),
            format!("Header.extra: mismatched message type: got {shown}, want \"{HEADER_EXTRA}\"")
        );
    }

    // Nothing refused reached GitLab; a good request still does.
    let agentk = start_agentk(&kas, token).await;
    agentk
        .module_client()
        .request("remote_development", Method::GET, "/ok", None)
        .await
        .unwrap();
    loop {
        let seen = gitlab.next().await;
        if seen.path.ends_with("/ok") {
            break;
        }
        assert_eq!(
            seen.path, "/api/v4/internal/kubernetes/modules/remote_development/x",
            "only the bodiless request may have reached GitLab"
        );
        assert!(seen.body.is_empty());
    }
    assert!(gitlab.nothing());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn module_names_are_escaped_as_gitlab_escapes_them() {
    let mut gitlab = FakeGitlab::start().await;
    let (keys, mint) = agent_tokens();
    let kas = start_kas(keys, Some(gitlab.url()), None).await;
    let agentk = start_agentk(&kas, mint(Some(7))).await;
    let answer = agentk
        .module_client()
        .request("my module/v2", Method::PUT, "/a b/c", Some(b"{}".to_vec()))
        .await
        .unwrap();
    assert_eq!(answer.status, 201);
    let seen = gitlab.next_module().await;
    assert_eq!(seen.method, "PUT");
    // url.PathEscape on the name, then url.URL.String() escapes the whole path
    // (the name's % again), as GitLab's kas writes it.
    assert_eq!(
        seen.path,
        "/api/v4/internal/kubernetes/modules/my%2520module%252Fv2/a%20b/c"
    );
    let e = agentk
        .module_client()
        .request("", Method::GET, "/x", None)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("empty module name"), "{e}");
    // Names that are not GitLab's modules are counted as "other".
    assert_eq!(
        metric(
            &kas,
            "podgate_kas_module_requests_total{module=\"other\",status=\"2xx\"}"
        ),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitlab_down_is_unavailable_and_no_gitlab_is_failed_precondition() {
    // A port nothing listens on.
    let closed = {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    let (keys, mint) = agent_tokens();
    let kas = start_kas(keys.clone(), Some(format!("http://{closed}")), None).await;
    let agentk = start_agentk(&kas, mint(Some(7))).await;
    let e = agentk
        .module_client()
        .request(
            "remote_development",
            Method::POST,
            "/reconcile",
            Some(b"{}".to_vec()),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::Unavailable), "{e}");
    assert_eq!(
        metric(
            &kas,
            "podgate_kas_module_requests_total{module=\"remote_development\",status=\"unavailable\"}"
        ),
        1
    );

    let kas = start_kas(keys, None, None).await;
    let agentk = start_agentk(&kas, mint(Some(7))).await;
    let e = agentk
        .module_client()
        .request("remote_development", Method::POST, "/reconcile", None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::FailedPrecondition), "{e}");
}

/// The whole path against the real Pod simulator (GitLab's side): the agent's
/// configuration file reaches GitLab through kas's `agent_configuration` post, and
/// agentk's module requests through kas are authenticated by GitLab with both
/// headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_the_pod_simulator() {
    use podgate_loadtest::pod_sim::PodSim;
    use podgate_testkit::workspaces::pod_sim_config;
    let tokens = podgate_testkit::fixtures::AgentTokens::new(1);
    let sim = PodSim::start(pod_sim_config(1, &[7], &tokens))
        .await
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("7.yaml"),
        "remote_development:\n  enabled: true\n  dns_zone: workspaces.example.dev\n",
    );
    let kas = start_kas(
        tokens.keys(),
        Some(format!("http://{}", sim.addr())),
        Some(AgentConfigSource {
            dir: dir.path().to_owned(),
            poll: Duration::from_millis(50),
        }),
    )
    .await;
    let agentk = start_agentk(&kas, tokens.mint(Some(7))).await;
    // GitLab answered kas's post (204).
    podgate_registry::testing::eventually(
        Duration::from_secs(20),
        "kas to post the agent configuration",
        || async {
            (metric(&kas, "podgate_kas_agent_config_posts_total{result=\"ok\"}") >= 1).then_some(())
        },
    )
    .await;
    let client = agentk.module_client();
    let answer = client
        .request("remote_development", Method::GET, "/prerequisites", None)
        .await
        .unwrap();
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&answer.body).unwrap(),
        serde_json::json!({"shared_namespace": ""})
    );
    let answer = client
        .request(
            "remote_development",
            Method::POST,
            "/reconcile",
            Some(br#"{"update_type":"full","workspace_agent_infos":[]}"#.to_vec()),
        )
        .await
        .unwrap();
    assert_eq!(answer.status, 201, "{:?}", answer.body);
    let payload: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
    assert_eq!(payload["workspace_rails_infos"], serde_json::json!([]));
    assert!(payload["settings"].is_object(), "{payload}");
    // GitLab's 400 comes back as GitLab wrote it.
    let answer = client
        .request(
            "remote_development",
            Method::POST,
            "/reconcile",
            Some(br#"{"update_type":"sometimes"}"#.to_vec()),
        )
        .await
        .unwrap();
    assert_eq!(answer.status, 400);
    let text = String::from_utf8_lossy(&answer.body);
    assert!(
        text.contains("Workspace reconcile params validation failed"),
        "{text}"
    );
    // An agent kas accepts but GitLab does not know: GitLab's 401, unchanged.
    let stranger = start_agentk(&kas, tokens.mint(Some(99))).await;
    let answer = stranger
        .module_client()
        .request("remote_development", Method::GET, "/prerequisites", None)
        .await
        .unwrap();
    assert_eq!(answer.status, 401);
}

/// GitLab's agentk compresses every call with gzip (`grpc.UseCompressor(gzip)`):
/// kas takes a gzip-compressed `MakeRequest`, and compresses its answer exactly when
/// the caller accepts gzip (`grpc-encoding: gzip` on the response).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_compressed_calls_are_served_and_answered_compressed_when_accepted() {
    use tonic::codec::CompressionEncoding::Gzip;
    let mut gitlab = FakeGitlab::start().await;
    let (keys, mint) = agent_tokens();
    let kas = start_kas(keys, Some(gitlab.url()), None).await;
    let token = mint(Some(7));
    let body = pattern(200_000, 5);
    for accept in [true, false] {
        let mut client =
            GitlabAccessClient::new(channel(kas.agent_addr()).await).send_compressed(Gzip);
        if accept {
            client = client.accept_compressed(Gzip);
        }
        let response = client
            .make_request(bearer(
                tonic::Request::new(tokio_stream::iter(raw_request(
                    "remote_development",
                    "/gz",
                    &[("X-Answer-Size", "100000")],
                    &body,
                    32 << 10,
                ))),
                &token,
            ))
            .await
            .unwrap();
        let encoding = response
            .metadata()
            .get("grpc-encoding")
            .map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(
            encoding.as_deref(),
            accept.then_some("gzip"),
            "accept {accept}"
        );
        let mut stream = response.into_inner();
        let mut answer = Vec::new();
        while let Some(m) = stream.next().await {
            if let Some(response::Message::Data(d)) = m.unwrap().message {
                answer.extend_from_slice(&d.data);
            }
        }
        assert!(answer == pattern(100_000, 7), "the answer differs");
        assert!(gitlab.next_module().await.body == body, "the body differs");
    }
}
