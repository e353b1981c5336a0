//! kas's agent listener as GitLab's agentk reaches it over a WebSocket
//! (`internal/tool/wstunnel/` and `cmd/agentk/agentkapp/app.go` in GitLab's agent):
//! subprotocol `ws-tunnel` selected, a client that does not ask for it closed with
//! 1002, and HTTP/2 inside whose `:authority` is the kas URL (`ws://host:port`, as
//! grpc-go sets it for the target `passthrough:ws://…`), written by hand here with
//! grpc-go's HPACK habits (new fields added to the dynamic table, then referred to
//! by index).

use std::time::Duration;

use futures_util::StreamExt as _;
use podgate_agent::transport::{WS_TUNNEL_PROTOCOL, WsIo};
use podgate_kas::Kas;
use podgate_testkit::fixtures::{agent_tokens, kas_config, memory_registry};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const METHOD: &[u8] = b"/gitlab.agent.gitlab_access.rpc.GitlabAccess/MakeRequest";

/// An HPACK string literal without Huffman: the length as a 7-bit-prefix integer
/// (RFC 7541 §5.1), then the bytes.
fn literal(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut n = s.len();
    if n < 127 {
        out.push(n as u8);
    } else {
        out.push(127);
        n -= 127;
        while n >= 128 {
            out.push((n % 128) as u8 | 0x80);
            n /= 128;
        }
        out.push(n as u8);
    }
    out.extend_from_slice(s);
    out
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Two `MakeRequest` calls as grpc-go writes them to `authority`: the first block
/// adds `:path`, `:authority`, `content-type`, `te` and `authorization` to the
/// dynamic table; the second refers to all five by index.
fn two_calls(authority: &[u8], token: &str) -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    out.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    let mut first = vec![0x83, 0x86]; // :method POST, :scheme http
    for (name_index, value) in [(4u8, METHOD), (1, authority)] {
        first.push(0x40 | name_index);
        first.extend(literal(value));
    }
    for (name, value) in [
        (&b"content-type"[..], &b"application/grpc"[..]),
        (b"te", b"trailers"),
        (b"authorization", format!("Bearer {token}").as_bytes()),
    ] {
        first.push(0x40);
        first.extend(literal(name));
        first.extend(literal(value));
    }
    // An empty header message: `\0` and a zero length.
    let message = [0u8, 0, 0, 0, 0];
    out.extend(frame(0x1, 0x4, 1, &first));
    out.extend(frame(0x0, 0x1, 1, &message));
    // Dynamic indices, newest first: authorization 62, te 63, content-type 64,
    // :authority 65, :path 66.
    out.extend(frame(
        0x1,
        0x4,
        3,
        &[0x83, 0x86, 0xc2, 0xc1, 0xc0, 0xbf, 0xbe],
    ));
    out.extend(frame(0x0, 0x1, 3, &message));
    out
}

/// What kas answered on each stream: its decoded header fields, or the
/// `RST_STREAM` error code.
#[derive(Debug, PartialEq)]
enum Answer {
    Fields(Vec<(String, String)>),
    Reset(u32),
}

/// Write `calls`, then read frames until streams 1 and 3 have ended.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(io: &mut S, calls: Vec<u8>) -> [Answer; 2] {
    io.write_all(&calls).await.unwrap();
    io.flush().await.unwrap();
    let mut hpack = loona_hpack::Decoder::new();
    let mut answers: [Option<Answer>; 2] = [None, None];
    let mut fields: [Vec<(String, String)>; 2] = [Vec::new(), Vec::new()];
    while answers.iter().any(Option::is_none) {
        let mut head = [0u8; 9];
        io.read_exact(&mut head).await.expect("kas closed early");
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        io.read_exact(&mut payload).await.unwrap();
        let stream = u32::from_be_bytes([head[5] & 0x7f, head[6], head[7], head[8]]);
        let slot = match stream {
            1 => 0,
            3 => 1,
            _ => {
                if head[3] == 0x4 && head[4] & 0x1 == 0 {
                    io.write_all(&frame(0x4, 0x1, 0, &[])).await.unwrap(); // SETTINGS ACK
                }
                continue;
            }
        };
        match head[3] {
            0x1 => {
                for (n, v) in hpack.decode(&payload).expect("kas's HPACK") {
                    fields[slot]
                        .push((String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()));
                }
                if head[4] & 0x1 != 0 {
                    answers[slot] = Some(Answer::Fields(std::mem::take(&mut fields[slot])));
                }
            }
            0x3 => {
                let code = u32::from_be_bytes(payload[..4].try_into().unwrap());
                answers[slot] = Some(Answer::Reset(code));
            }
            0x0 if head[4] & 0x1 != 0 => {
                answers[slot] = Some(Answer::Fields(std::mem::take(&mut fields[slot])));
            }
            _ => {}
        }
    }
    answers.map(Option::unwrap)
}

fn field<'a>(answer: &'a Answer, name: &str) -> Option<&'a str> {
    match answer {
        Answer::Fields(f) => f.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str()),
        Answer::Reset(_) => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_go_over_ws_tunnel_with_the_kas_url_as_authority_is_served() {
    let (keys, mint) = agent_tokens();
    let kas = Kas::start(
        kas_config(keys, Duration::from_secs(5)),
        memory_registry().await,
    )
    .await
    .unwrap();
    let url = format!("ws://{}", kas.agent_addr());
    let token = mint(Some(7));

    let mut request = url.as_str().into_client_request().unwrap();
    request.headers_mut().insert(
        "sec-websocket-protocol",
        WS_TUNNEL_PROTOCOL.parse().unwrap(),
    );
    let tcp = tokio::net::TcpStream::connect(kas.agent_addr())
        .await
        .unwrap();
    let (ws, response) = tokio_tungstenite::client_async(request, tcp).await.unwrap();
    assert_eq!(
        response.headers()["sec-websocket-protocol"],
        WS_TUNNEL_PROTOCOL,
        "kas selects ws-tunnel"
    );
    let mut io = WsIo::new(ws);
    let answers = tokio::time::timeout(
        Duration::from_secs(20),
        exchange(&mut io, two_calls(url.as_bytes(), &token)),
    )
    .await
    .expect("kas answered both calls");
    // Both calls reached the service (authenticated, then refused for want of a
    // GitLab URL), neither stream was reset.
    for answer in &answers {
        assert_eq!(field(answer, "grpc-status"), Some("9"), "{answer:?}");
        assert!(
            field(answer, "grpc-message").is_some_and(|m| m.contains("GitLab%20URL")),
            "{answer:?}"
        );
    }

    // The same bytes on h2c, where grpc-go never writes such an `:authority`: the
    // h2 crate resets the streams (PROTOCOL_ERROR) — what the WebSocket path mends.
    let mut tcp = tokio::net::TcpStream::connect(kas.agent_addr())
        .await
        .unwrap();
    let answers = tokio::time::timeout(
        Duration::from_secs(20),
        exchange(&mut tcp, two_calls(url.as_bytes(), &token)),
    )
    .await
    .expect("kas answered both calls");
    assert_eq!(answers, [Answer::Reset(1), Answer::Reset(1)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_without_ws_tunnel_is_closed_with_1002() {
    let (keys, _) = agent_tokens();
    let kas = Kas::start(
        kas_config(keys, Duration::from_secs(5)),
        memory_registry().await,
    )
    .await
    .unwrap();
    let tcp = tokio::net::TcpStream::connect(kas.agent_addr())
        .await
        .unwrap();
    let (mut ws, response) =
        tokio_tungstenite::client_async(format!("ws://{}/", kas.agent_addr()), tcp)
            .await
            .unwrap();
    assert!(response.headers().get("sec-websocket-protocol").is_none());
    let close = tokio::time::timeout(Duration::from_secs(20), ws.next())
        .await
        .expect("kas closes the WebSocket")
        .expect("a message")
        .expect("a close frame");
    let tokio_tungstenite::tungstenite::Message::Close(Some(frame)) = close else {
        panic!("not a close frame: {close:?}");
    };
    assert_eq!(frame.code, CloseCode::Protocol);
    assert_eq!(
        frame.reason,
        "Expecting \"ws-tunnel\" subprotocol, got \"\""
    );
}
