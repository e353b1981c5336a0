//! kas's Kubernetes API proxy as GitLab's `InboundHttpToOutboundGrpc` frames a
//! request, seen by a scripted agent (a [`Handler`] on podgate's agentk that records
//! every `grpctool.HttpRequest` frame and answers as GitLab's agentk would), with raw
//! HTTP/1.1 clients:
//!
//! - a chunked body is `content_length` -1 and streams: its first chunk reaches the
//!   agent before the client sent the rest; then `Trailer` and `CloseSend`; the
//!   header carries Go's header names, the query without kas's credentials, and the
//!   user's impersonation in a `HeaderExtra` `Any`;
//! - an upgrade keeps `Upgrade` with `Connection: upgrade`, is not half-closed after
//!   its `Trailer`, and after the agent's 101 carries bytes both ways as
//!   `UpgradeData`; the client's write shutdown reaches the agent as the end of its
//!   requests, and the agent's last bytes and end reach the client.

use std::sync::Arc;
use std::time::Duration;

use podgate_agent::proto::gitlab::agent::grpctool::{
    HttpRequest, HttpResponse, http_request, http_response,
};
use podgate_agent::proto::gitlab::agent::prototool;
use podgate_agent::proto::kubernetes_api::HeaderExtra;
use podgate_agentk::{Agentk, Call, Handler, Responses};
use podgate_testkit::workspaces::agentk_config;
use prost::Message as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::kubectl::{Stack, stack};

/// What the agent saw: a request frame, or the end of the requests (`None`).
type Seen = Option<http_request::Message>;

struct Scripted {
    seen: mpsc::UnboundedSender<Seen>,
}

fn response(m: http_response::Message) -> Result<Vec<u8>, tonic::Status> {
    Ok(HttpResponse { message: Some(m) }.encode_to_vec())
}

fn head(status: i32, header: &[(&str, &str)]) -> http_response::Message {
    http_response::Message::Header(http_response::Header {
        response: Some(prototool::HttpResponse {
            status_code: status,
            status: format!("{status}"),
            header: header
                .iter()
                .map(|(k, v)| {
                    let v = prototool::Values {
                        value: vec![(*v).to_owned()],
                    };
                    ((*k).to_owned(), v)
                })
                .collect(),
        }),
    })
}

impl Handler for Scripted {
    fn streams_requests(&self, method: &str) -> bool {
        method == podgate_agent::tunnel::MAKE_REQUEST
    }

    /// Records every frame; after the request's `Trailer` answers 200 "ok", or for
    /// an upgrade 101, then each `UpgradeData` upper-cased, and "bye" at the end of
    /// the requests.
    fn call(&self, mut call: Call) -> Responses {
        let (tx, rx) = mpsc::channel(16);
        let seen = self.seen.clone();
        tokio::spawn(async move {
            use futures_util::StreamExt as _;
            let mut upgrade = false;
            while let Some(m) = call.requests.next().await {
                let m = HttpRequest::decode(m.as_slice()).unwrap().message.unwrap();
                let _ = seen.send(Some(m.clone()));
                match m {
                    http_request::Message::Header(h) => {
                        upgrade = h.request.unwrap().header.contains_key("Upgrade");
                    }
                    http_request::Message::Trailer(_) if upgrade => {
                        let up = [("Upgrade", "test-proto"), ("Connection", "upgrade")];
                        let _ = tx.send(response(head(101, &up))).await;
                        let t = http_response::Message::Trailer(http_response::Trailer {});
                        let _ = tx.send(response(t)).await;
                    }
                    http_request::Message::Trailer(_) => {
                        let _ = tx.send(response(head(200, &[]))).await;
                        let d = http_response::Data {
                            data: b"ok".to_vec(),
                        };
                        let _ = tx.send(response(http_response::Message::Data(d))).await;
                        let t = http_response::Message::Trailer(http_response::Trailer {});
                        let _ = tx.send(response(t)).await;
                    }
                    http_request::Message::UpgradeData(d) => {
                        let data = d.data.to_ascii_uppercase();
                        let d = http_response::UpgradeData { data };
                        let m = http_response::Message::UpgradeData(d);
                        let _ = tx.send(response(m)).await;
                    }
                    http_request::Message::Data(_) => {}
                }
            }
            let _ = seen.send(None);
            if upgrade {
                let d = http_response::UpgradeData {
                    data: b"bye".to_vec(),
                };
                let _ = tx
                    .send(response(http_response::Message::UpgradeData(d)))
                    .await;
            }
        });
        Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
    }

    fn handle(&self, method: String, _payload: Vec<u8>) -> Responses {
        Box::pin(futures_util::stream::once(async move {
            Err(tonic::Status::unimplemented(method))
        }))
    }
}

async fn scripted_agent(s: &Stack) -> (Agentk, mpsc::UnboundedReceiver<Seen>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let agentk = Agentk::start_with(
        agentk_config(&s.kas, (s.mint)(Some(1)), None),
        Arc::new(Scripted { seen: tx }),
    )
    .await
    .unwrap();
    tokio::time::timeout(Duration::from_secs(30), agentk.connected())
        .await
        .expect("agentk connected");
    (agentk, rx)
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("the agent saw a frame")
        .expect("the agent is running")
}

fn data(d: &[u8]) -> Seen {
    Some(http_request::Message::Data(http_request::Data {
        data: d.to_vec(),
    }))
}

fn trailer() -> Seen {
    Some(http_request::Message::Trailer(http_request::Trailer {}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_body_streams_to_the_agent_in_gitlabs_frames() {
    let s = stack().await;
    let (_agentk, mut seen) = scripted_agent(&s).await;
    let mut conn = TcpStream::connect(s.kas.k8s_proxy_addr().unwrap())
        .await
        .unwrap();
    let req = format!(
        "POST /-/kubernetes-agent/k8s-proxy/api/v1/namespaces/default/configmaps?gitlab-agent-id=1&x=a+b HTTP/1.1\r\n\
         Host: kas\r\nAuthorization: Bearer pat:1:{}\r\ncontent-type: application/json\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n6\r\npart-1\r\n",
        s.pat
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    let Some(http_request::Message::Header(h)) = next(&mut seen).await else {
        panic!("a Header first");
    };
    assert_eq!(h.content_length, Some(-1));
    let r = h.request.unwrap();
    assert_eq!(
        (r.method.as_str(), r.url_path.as_str()),
        ("POST", "/api/v1/namespaces/default/configmaps")
    );
    assert_eq!(r.query.keys().collect::<Vec<_>>(), ["x"]);
    assert_eq!(r.query["x"].value, ["a b"]);
    assert_eq!(r.header["Content-Type"].value, ["application/json"]);
    assert!(r.header["Via"].value[0].starts_with("gRPC/1.0 podgate-kas/"));
    for gone in ["Authorization", "Host", "Transfer-Encoding", "Connection"] {
        assert!(!r.header.contains_key(gone), "{gone}: {:?}", r.header);
    }
    let extra = h.extra.expect("access as a user sends HeaderExtra");
    assert_eq!(
        extra.type_url,
        "type.googleapis.com/gitlab.agent.kubernetes_api.rpc.HeaderExtra"
    );
    let imp = HeaderExtra::decode(extra.value.as_slice())
        .unwrap()
        .imp_config
        .unwrap();
    assert!(imp.username.starts_with("gitlab:user:"), "{imp:?}");
    // The first chunk arrives while the client still holds the rest.
    assert_eq!(next(&mut seen).await, data(b"part-1"));
    conn.write_all(b"6\r\npart-2\r\n0\r\n\r\n").await.unwrap();
    assert_eq!(next(&mut seen).await, data(b"part-2"));
    assert_eq!(next(&mut seen).await, trailer());
    assert_eq!(next(&mut seen).await, None, "kas half-closes");
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(
        answer.ends_with("ok") || answer.contains("\r\n2\r\nok\r\n"),
        "{answer}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_carries_bytes_both_ways_and_half_closes_as_gitlab() {
    let s = stack().await;
    let (_agentk, mut seen) = scripted_agent(&s).await;
    let mut conn = TcpStream::connect(s.kas.k8s_proxy_addr().unwrap())
        .await
        .unwrap();
    let req = format!(
        "GET /-/kubernetes-agent/k8s-proxy/api/v1/namespaces/default/pods/web-1/exec HTTP/1.1\r\nHost: kas\r\n\
         Authorization: Bearer pat:1:{}\r\nConnection: Upgrade\r\nUpgrade: test-proto\r\n\r\n",
        s.pat
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    let Some(http_request::Message::Header(h)) = next(&mut seen).await else {
        panic!("a Header first");
    };
    assert_eq!(h.content_length, Some(0));
    let r = h.request.unwrap();
    assert_eq!(r.header["Upgrade"].value, ["test-proto"]);
    assert_eq!(r.header["Connection"].value, ["upgrade"]);
    assert_eq!(next(&mut seen).await, trailer());
    // The answer's head, up to its blank line.
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(conn.read_u8().await.unwrap());
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("upgrade: test-proto"),
        "{head}"
    );
    conn.write_all(b"hello").await.unwrap();
    // Not half-closed after the Trailer: the next frame is the client's bytes.
    assert_eq!(
        next(&mut seen).await,
        Some(http_request::Message::UpgradeData(
            http_request::UpgradeData {
                data: b"hello".to_vec()
            }
        ))
    );
    let mut buf = [0u8; 5];
    conn.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"HELLO");
    conn.shutdown().await.unwrap();
    assert_eq!(
        next(&mut seen).await,
        None,
        "the client's shutdown is CloseSend"
    );
    let mut rest = Vec::new();
    conn.read_to_end(&mut rest).await.unwrap();
    assert_eq!(rest, b"bye");
}
