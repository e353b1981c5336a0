//! GitLab's reverse tunnel (`ReverseTunnel/Connect`) between podgate's kas and
//! agentk, and frame by frame as GitLab's agentk speaks it: a tunnel must open with
//! its `Descriptor`; a method no tunnel advertises is `Unimplemented`; calls stream
//! request messages (with metadata and a close) and response messages, through one
//! kas and through a second one (kas → kas); agentk's `Error` frame reaches the
//! caller as that status; a caller going away cancels agentk's handler; a tunnel
//! that names no connection (a GitLab agentk) serves calls for any replica.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use podgate_agent::proto::gitlab::agent::prototool::Values;
use podgate_agent::proto::gitlab::agent::reverse_tunnel::info::AgentDescriptor;
use podgate_agent::proto::gitlab::agent::reverse_tunnel::rpc::reverse_tunnel_client::ReverseTunnelClient;
use podgate_agent::proto::gitlab::agent::reverse_tunnel::rpc::{
    ConnectRequest, ConnectResponse, Descriptor, Header, Message, Trailer, connect_request,
    connect_response,
};
use podgate_agent::proto::{GetPodsRequest, GetPodsResponse};
use podgate_agent::tunnel::{GET_PODS, WATCH_GRAPH, descriptor};
use podgate_agentk::{Call, Handler, Responses, TunnelPool, serve_tunnels, unary};
use podgate_kas::Kas;
use podgate_kas::routing::Routed;
use podgate_kas::tunnel::Meta;
use podgate_registry::{MemoryBackend, Registry, RegistryConfig};
use podgate_testkit::fixtures::{agent_tokens, channel, configuration_stream, kas_config};
use prost::Message as _;
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

/// The test handler's methods.
const SUM: &str = "/podgate.test.Test/Sum";
const FAIL: &str = "/podgate.test.Test/Fail";
const HANG: &str = "/podgate.test.Test/Hang";

/// `n` kas instances on one in-memory registry, and an agent token minter.
async fn kases(n: usize) -> (Vec<Kas>, impl Fn(Option<u64>) -> String) {
    kases_waiting(n, Duration::from_secs(5)).await
}

/// [`kases`] whose calls wait at most `max_wait` for their agent.
async fn kases_waiting(n: usize, max_wait: Duration) -> (Vec<Kas>, impl Fn(Option<u64>) -> String) {
    let (keys, mint) = agent_tokens();
    let backend = MemoryBackend::new(podgate_registry::Topology::default());
    let mut out = Vec::new();
    for _ in 0..n {
        let registry = Registry::with_memory(backend.clone(), RegistryConfig::default())
            .await
            .unwrap();
        let kas = Kas::start(kas_config(keys.clone(), max_wait), registry);
        out.push(kas.await.unwrap());
    }
    (out, mint)
}

/// `Sum` streams each request message back as it comes, then the metadata
/// `x-test` and the count of messages; `Fail` answers `FailedPrecondition` with
/// details; `Hang` never answers and says on `dropped` when it was cancelled.
struct Test {
    dropped: Arc<Notify>,
}

struct OnDrop(Arc<Notify>);
impl Drop for OnDrop {
    fn drop(&mut self) {
        self.0.notify_one();
    }
}

/// The details `Fail` sends: a `google.rpc.Status` whose details name a cause.
fn fail_details() -> podgate_agent::proto::google::rpc::Status {
    podgate_agent::proto::google::rpc::Status {
        code: Code::FailedPrecondition as i32,
        message: "the widget is not ready".into(),
        details: vec![prost_types::Any {
            type_url: "type.googleapis.com/podgate.test.Cause".into(),
            value: b"cause".to_vec(),
        }],
    }
}

impl Handler for Test {
    fn descriptor(&self) -> AgentDescriptor {
        descriptor(&[GET_PODS, SUM, FAIL, HANG]).unwrap()
    }

    fn streams_requests(&self, method: &str) -> bool {
        method == SUM || method == HANG
    }

    fn call(&self, call: Call) -> Responses {
        let Call {
            method,
            metadata,
            requests,
        } = call;
        if method == HANG {
            let guard = OnDrop(self.dropped.clone());
            return Box::pin(futures_util::stream::once(async move {
                let _guard = guard;
                std::future::pending::<Result<Vec<u8>, tonic::Status>>().await
            }));
        }
        let tag = metadata
            .get("x-test")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("none")
            .to_owned();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let mut requests = requests;
            let mut n = 0u32;
            while let Some(m) = requests.next().await {
                n += 1;
                if tx.send(Ok(m)).await.is_err() {
                    return;
                }
            }
            let _ = tx.send(Ok(tag.into_bytes())).await;
            let _ = tx.send(Ok(n.to_be_bytes().to_vec())).await;
        });
        Box::pin(ReceiverStream::new(rx))
    }

    fn handle(&self, method: String, _payload: Vec<u8>) -> Responses {
        unary(async move {
            if method == FAIL {
                let details = fail_details().encode_to_vec();
                return Err(tonic::Status::with_details(
                    Code::FailedPrecondition,
                    "the widget is not ready",
                    details.into(),
                ));
            }
            Ok(GetPodsResponse::default().encode_to_vec())
        })
    }
}

/// A replica of agent `agent` connected to `kas` (its configuration stream) with 2
/// idle tunnels there.
async fn replica(kas: &Kas, token: String, agent: i64, dropped: Arc<Notify>) -> impl Sized {
    let ch = channel(kas.agent_addr()).await;
    let (conn, stream) = configuration_stream(ch.clone(), &token).await.unwrap();
    let handler = Arc::new(Test { dropped });
    let tunnels = podgate_agent::task::AbortOnDrop::spawn(serve_tunnels(
        ch,
        token,
        Some(conn),
        TunnelPool::new(2),
        handler,
    ));
    kas.tunnels().wait_idle(agent, conn, 2).await;
    (stream, tunnels)
}

/// Metadata `x-test: <v>` in the tunnel's form.
fn meta(v: &str) -> Meta {
    Meta::from([(
        "x-test".to_owned(),
        Values {
            value: vec![v.to_owned()],
        },
    )])
}

/// Every response message of `call`, to its end (which must be OK).
async fn messages(call: &mut Routed) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(m) = call.message().await.unwrap() {
        out.push(m);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_calls_carry_request_messages_and_a_close_through_one_and_two_kas() {
    let (kases, mint) = kases(2).await;
    let _replica = replica(&kases[1], mint(Some(3)), 3, Arc::new(Notify::new())).await;
    // kases[1] holds the tunnels (local); kases[0] routes kas → kas.
    for (kas, via) in [(&kases[1], "local"), (&kases[0], "kas")] {
        let mut call = kas.router().call(3, 0, SUM, &meta(via)).await.unwrap();
        for m in ["one", "two", "three"] {
            call.send(m.as_bytes().to_vec()).await.unwrap();
        }
        // The first message comes back before the close: both ways stream.
        assert_eq!(call.message().await.unwrap().unwrap(), b"one");
        call.close_send().await.unwrap();
        let rest = messages(&mut call).await;
        let want: Vec<Vec<u8>> = vec![
            b"two".to_vec(),
            b"three".to_vec(),
            via.as_bytes().to_vec(),
            3u32.to_be_bytes().to_vec(),
        ];
        assert_eq!(rest, want, "through {via}");
        assert!(call.header().is_some(), "a header came through {via}");
        assert!(call.trailer().is_some(), "a trailer came through {via}");
    }
    assert_eq!(kases[0].tunnels().idle(3, 0), 0, "kas → kas, not a tunnel");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_no_tunnel_advertises_is_unimplemented() {
    let (kases, mint) = kases(2).await;
    let _replica = replica(&kases[1], mint(Some(3)), 3, Arc::new(Notify::new())).await;
    for kas in &kases {
        let e = kas
            .router()
            .open(3, 0, WATCH_GRAPH, Vec::new())
            .await
            .err()
            .unwrap();
        assert_eq!(e.code(), Code::Unimplemented, "{e:?}");
        assert!(e.message().contains(WATCH_GRAPH), "{e:?}");
    }
    // The tunnels stay for methods they serve.
    let pods = kases[0].router().open(3, 0, GET_PODS, Vec::new()).await;
    pods.unwrap().unary().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_frame_reaches_the_caller_as_its_status() {
    let (kases, mint) = kases(2).await;
    let _replica = replica(&kases[1], mint(Some(3)), 3, Arc::new(Notify::new())).await;
    for kas in &kases {
        let e = kas
            .router()
            .open(3, 0, FAIL, Vec::new())
            .await
            .err()
            .unwrap();
        assert_eq!(e.code(), Code::FailedPrecondition);
        assert_eq!(e.message(), "the widget is not ready");
        let details = podgate_agent::proto::google::rpc::Status::decode(e.details()).unwrap();
        assert_eq!(details, fail_details());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_caller_cancels_the_agentk_handler() {
    let (kases, mint) = kases(2).await;
    let dropped = Arc::new(Notify::new());
    let _replica = replica(&kases[1], mint(Some(3)), 3, dropped.clone()).await;
    for kas in &kases {
        let call = kas.router().call(3, 0, HANG, &Meta::new()).await.unwrap();
        call.send(b"stdin".to_vec()).await.unwrap();
        // Busy at agentk's kas until the caller goes away mid-request.
        podgate_registry::testing::eventually(Duration::from_secs(5), "busy", || async {
            (kases[1].metrics().tunnels_busy.get() == 1).then_some(())
        })
        .await;
        drop(call);
        dropped.notified().await;
        podgate_registry::testing::eventually(Duration::from_secs(5), "released", || async {
            (kases[1].metrics().tunnels_busy.get() == 0).then_some(())
        })
        .await;
    }
}

/// A raw tunnel on `kas` for `token`, its first frame `first`; `connection` names a
/// connection in the metadata. Returns what kas answered.
async fn raw_tunnel(
    kas: &Kas,
    token: &str,
    first: Option<connect_request::Msg>,
    connection: Option<i64>,
) -> (
    mpsc::Sender<ConnectRequest>,
    Result<tonic::Streaming<ConnectResponse>, tonic::Status>,
) {
    let (up, rx) = mpsc::channel(8);
    if let Some(msg) = first {
        up.send(ConnectRequest { msg: Some(msg) }).await.unwrap();
    }
    let mut request =
        podgate_testkit::fixtures::bearer(tonic::Request::new(ReceiverStream::new(rx)), token);
    if let Some(c) = connection {
        request
            .metadata_mut()
            .insert(podgate_agent::tunnel::CONNECTION_ID_KEY, c.into());
    }
    let mut client = ReverseTunnelClient::new(channel(kas.agent_addr()).await);
    let down = client.connect(request).await.map(|r| r.into_inner());
    (up, down)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_without_a_valid_descriptor_is_refused() {
    let (kases, mint) = kases(1).await;
    let token = mint(Some(3));
    let empty_method = descriptor(&[GET_PODS]).map(|mut d| {
        d.services[0].methods[0].name.clear();
        d
    });
    let firsts = [
        connect_request::Msg::Message(Message { data: Vec::new() }),
        connect_request::Msg::Header(Header::default()),
        connect_request::Msg::Descriptor(Descriptor {
            agent_descriptor: None,
        }),
        connect_request::Msg::Descriptor(Descriptor {
            agent_descriptor: Some(empty_method.unwrap()),
        }),
    ];
    for first in firsts {
        let what = format!("{first:?}");
        let (_up, down) = raw_tunnel(&kases[0], &token, Some(first), None).await;
        let e = down.err().unwrap();
        assert_eq!(e.code(), Code::InvalidArgument, "{what}: {e:?}");
    }
    // A named connection that is not a number is refused too.
    let mut request = podgate_testkit::fixtures::bearer(
        tonic::Request::new(futures_util::stream::pending::<ConnectRequest>()),
        &token,
    );
    request.metadata_mut().insert(
        podgate_agent::tunnel::CONNECTION_ID_KEY,
        "twelve".parse().unwrap(),
    );
    let mut client = ReverseTunnelClient::new(channel(kases[0].agent_addr()).await);
    let e = client.connect(request).await.err().unwrap();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(kases[0].tunnels().idle(3, 0), 0);
}

/// A tunnel as GitLab's agentk opens it (no connection id, on an agent registered
/// nowhere) serves a call for any replica, frame by frame in GitLab's order:
/// `RequestInfo`, `Message`, `CloseSend` down; `Header`, `Message`, `Trailer` up,
/// then the half-close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gitlab_shaped_tunnel_serves_a_call_for_any_replica() {
    let (kases, mint) = kases(1).await;
    let kas = &kases[0];
    let token = mint(Some(8));
    let desc = descriptor(&[GET_PODS]).unwrap();
    let first = connect_request::Msg::Descriptor(Descriptor {
        agent_descriptor: Some(desc),
    });
    let (up, down) = raw_tunnel(kas, &token, Some(first), None).await;
    let mut down = down.unwrap();
    kas.tunnels().wait_idle(8, 0, 1).await;
    // A tunnel naming no connection serves "any replica" only.
    assert_eq!(kas.tunnels().idle(8, 77), 0);

    let request = GetPodsRequest {
        agent_id: 8,
        connection_id: 0,
        namespace: "prod".into(),
    };
    let router = kas.router();
    let payload = request.encode_to_vec();
    let caller = tokio::spawn(async move {
        let call = router.call(8, 0, GET_PODS, &meta("gitlab")).await?;
        let mut call = call.start(payload).await?;
        let frames = (call.message().await?, call.message().await?);
        Ok::<_, tonic::Status>((frames, call.trailer().cloned()))
    });
    let next = |m: Option<ConnectResponse>| m.and_then(|m| m.msg);
    let info = match next(down.message().await.unwrap()) {
        Some(connect_response::Msg::RequestInfo(i)) => i,
        other => panic!("expected RequestInfo, got {other:?}"),
    };
    assert_eq!(info.method_name, GET_PODS);
    assert_eq!(info.meta["x-test"].value, ["gitlab"]);
    match next(down.message().await.unwrap()) {
        Some(connect_response::Msg::Message(m)) => assert_eq!(m.data, request.encode_to_vec()),
        other => panic!("expected a Message, got {other:?}"),
    }
    assert!(matches!(
        next(down.message().await.unwrap()),
        Some(connect_response::Msg::CloseSend(_))
    ));
    let answer = GetPodsResponse::default().encode_to_vec();
    for msg in [
        connect_request::Msg::Header(Header::default()),
        connect_request::Msg::Message(Message {
            data: answer.clone(),
        }),
        connect_request::Msg::Trailer(Trailer { meta: meta("done") }),
    ] {
        up.send(ConnectRequest { msg: Some(msg) }).await.unwrap();
    }
    drop(up);
    let ((first, end), trailer) = caller.await.unwrap().unwrap();
    assert_eq!(first, Some(answer));
    assert_eq!(
        end, None,
        "the half-close after the trailer ends the call OK"
    );
    assert_eq!(trailer, Some(meta("done")));
    // kas ends the tunnel once the call is over.
    assert!(down.message().await.unwrap().is_none());
}

/// Tunnels naming no connection (GitLab's agentk) on the kas the registry names for
/// the agent serve calls for any replica routed there from another kas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_naming_no_connection_serve_calls_routed_from_another_kas() {
    let (kases, mint) = kases_waiting(2, Duration::from_millis(500)).await;
    let token = mint(Some(5));
    let ch = channel(kases[1].agent_addr()).await;
    // Registered on kases[1]; its tunnels name no connection.
    let (conn, _presence) = configuration_stream(ch.clone(), &token).await.unwrap();
    let handler = Arc::new(Test {
        dropped: Arc::new(Notify::new()),
    });
    let _tunnels = podgate_agent::task::AbortOnDrop::spawn(serve_tunnels(
        ch,
        token,
        None,
        TunnelPool::new(2),
        handler,
    ));
    kases[1].tunnels().wait_idle(5, 0, 2).await;
    assert_eq!(
        kases[1].tunnels().idle(5, conn),
        0,
        "they name no connection"
    );
    let call = kases[0].router().open(5, 0, GET_PODS, Vec::new()).await;
    let call = call.unwrap();
    assert_eq!(call.connection_id(), 0, "a tunnel that named none answered");
    GetPodsResponse::decode(call.unary().await.unwrap().as_slice()).unwrap();
    // Asked for that replica by its id, they do not serve it: its own tunnels would.
    let e = tokio::time::timeout(
        Duration::from_secs(30),
        kases[0].router().open(5, conn, GET_PODS, Vec::new()),
    )
    .await
    .expect("ends at max_wait")
    .err()
    .unwrap();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e:?}");
}

/// A tunnel that ends before agentk answers anything (it died while idle) is left,
/// and `open` sends the call down the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_that_ends_before_answering_is_left_for_the_next() {
    let (kases, mint) = kases(1).await;
    let kas = &kases[0];
    let token = mint(Some(8));
    let first = || {
        Some(connect_request::Msg::Descriptor(Descriptor {
            agent_descriptor: Some(descriptor(&[GET_PODS]).unwrap()),
        }))
    };
    let (dead_up, dead_down) = raw_tunnel(kas, &token, first(), None).await;
    kas.tunnels().wait_idle(8, 0, 1).await;
    let (up, down) = raw_tunnel(kas, &token, first(), None).await;
    kas.tunnels().wait_idle(8, 0, 2).await;
    let router = kas.router();
    let mut caller = tokio::spawn(async move { router.open(8, 0, GET_PODS, Vec::new()).await });
    // The first tunnel takes the call and ends without a frame.
    let mut dead_down = dead_down.unwrap();
    let info = dead_down.message().await.unwrap().and_then(|m| m.msg);
    assert!(matches!(info, Some(connect_response::Msg::RequestInfo(_))));
    drop(dead_up);
    // The second answers it.
    let mut down = down.unwrap();
    let info = tokio::select! {
        m = down.message() => m.unwrap().and_then(|m| m.msg),
        r = &mut caller => panic!("the call ended on the dead tunnel: {:?}", r.unwrap().err()),
    };
    assert!(matches!(info, Some(connect_response::Msg::RequestInfo(_))));
    for msg in [
        connect_request::Msg::Header(Header::default()),
        connect_request::Msg::Message(Message {
            data: b"pods".to_vec(),
        }),
        connect_request::Msg::Trailer(Trailer::default()),
    ] {
        up.send(ConnectRequest { msg: Some(msg) }).await.unwrap();
    }
    drop(up);
    let answer = caller.await.unwrap().unwrap().unary().await.unwrap();
    assert_eq!(answer, b"pods");
}
