//! `/graph` on the Kubernetes API proxy: the Graph API's WebSocket (as
//! gitlab-org/cli `internal/commands/cluster/graph/graph.go`, <https://docs.gitlab.com/cli/cluster/graph/>).
//!
//! - The upgrade must offer the subprotocol `gitlab-agent-graph-api` (the one GitLab's
//!   client, `glab cluster graph`, offers: `internal/commands/cluster/graph/server.go`
//!   in gitlab-org/cli); anything else is refused with a 400 `Status` before any
//!   upgrade.
//! - The first message is a text message with the request JSON, validated fully here
//!   ([`podgate_agent::graph::request::compile`]); a bad one closes with 1007
//!   (`StatusInvalidFramePayloadData`) naming the field. A binary message closes with
//!   1003; a second message of any kind with 1008 (GitLab's design document: "Server
//!   closes the connection if another message is received"; docs/graph-api.md §9).
//! - Then `WatchGraph` goes to the agent through a reverse tunnel, routed like every
//!   agent call ([`AgentRouter`]); each `WatchGraphResponse` batch becomes one text
//!   message ([`podgate_agent::graph::wire::encode_response`]). An agent that does not serve
//!   `WatchGraph` (gRPC `Unimplemented`) closes with 1011 and a reason telling the
//!   user to upgrade the agent, as GitLab's design document asks; an agent that does not connect in
//!   time closes with 1013 (`StatusTryAgainLater`).
//! - A close reason longer than a close frame holds (123 bytes) is first sent whole
//!   as `{"error":{"code":…,"code_string":…,"reason":…}}`, then the close frame
//!   carries it truncated.
//!
//! Closing the WebSocket drops the tunnel, which stops the watch in agentk.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use prost::Message as _;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};

use crate::http_server::{BoxBody, empty_body};
use crate::routing::AgentRouter;
use podgate_agent::graph::wire::{ErrorInfo, MAX_CLOSE_REASON, truncate_close_reason};
use podgate_agent::proto::kubernetes_api::{
    ImpersonationConfig, WatchGraphRequest, WatchGraphResponse,
};

/// The subprotocol of the Graph API.
pub(crate) const SUBPROTOCOL: &str = "gitlab-agent-graph-api";

/// How long the client may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// How long to wait for the client's close frame after sending ours.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest client message accepted (the request JSON).
const MAX_REQUEST_BYTES: usize = 1024 * 1024;

/// Who the authenticated request is for, and how to reach its agent.
pub(crate) struct GraphContext {
    /// The agent whose cluster is watched.
    pub agent_id: i64,
    /// The user to impersonate, when access is as a user.
    pub impersonation: Option<ImpersonationConfig>,
    /// Routes the `WatchGraph` call to the agent.
    pub router: Arc<AgentRouter>,
}

fn header_has_token(req: &http::Request<Incoming>, name: http::HeaderName, token: &str) -> bool {
    req.headers()
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

fn refuse(code: u16, message: &str) -> http::Response<BoxBody> {
    super::status_response(
        http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::BAD_REQUEST),
        message,
    )
}

/// Serve `/graph`: refuse what is not a Graph API WebSocket upgrade, else answer 101
/// and run the session on the upgraded connection.
pub(crate) fn handle(req: http::Request<Incoming>, ctx: GraphContext) -> http::Response<BoxBody> {
    use http::header;
    let upgrade = req.method() == http::Method::GET
        && header_has_token(&req, header::UPGRADE, "websocket")
        && header_has_token(&req, header::CONNECTION, "upgrade");
    if !upgrade {
        return refuse(400, "Bad request: /graph expects a WebSocket upgrade");
    }
    if req
        .headers()
        .get(header::SEC_WEBSOCKET_VERSION)
        .is_none_or(|v| v != "13")
    {
        return refuse(400, "Bad request: WebSocket version 13 expected");
    }
    let Some(key) = req.headers().get(header::SEC_WEBSOCKET_KEY).cloned() else {
        return refuse(400, "Bad request: Sec-WebSocket-Key missing");
    };
    if !header_has_token(&req, header::SEC_WEBSOCKET_PROTOCOL, SUBPROTOCOL) {
        return refuse(
            400,
            &format!("Bad request: expected WebSocket subprotocol {SUBPROTOCOL}"),
        );
    }
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    tokio::spawn(async move {
        match hyper::upgrade::on(req).await {
            Ok(upgraded) => {
                let mut config = WebSocketConfig::default();
                config.max_message_size = Some(MAX_REQUEST_BYTES);
                config.max_frame_size = Some(MAX_REQUEST_BYTES);
                let ws = WebSocketStream::from_raw_socket(
                    TokioIo::new(upgraded),
                    Role::Server,
                    Some(config),
                )
                .await;
                session(ws, ctx).await;
            }
            Err(e) => tracing::debug!(error = %e, "graph: the upgrade failed"),
        }
    });
    let mut resp = http::Response::new(empty_body());
    *resp.status_mut() = http::StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::UPGRADE, http::HeaderValue::from_static("websocket"));
    h.insert(
        header::CONNECTION,
        http::HeaderValue::from_static("Upgrade"),
    );
    h.insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        http::HeaderValue::from_static(SUBPROTOCOL),
    );
    if let Ok(v) = http::HeaderValue::from_str(&accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    resp
}

type Ws = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// Close with `code` and `reason`: a reason too long for the close frame is sent
/// whole as an `error` message first. Then wait (briefly) for the client's close.
async fn close(mut ws: Ws, code: u16, reason: &str) {
    if reason.len() > MAX_CLOSE_REASON {
        let msg = serde_json::json!({ "error": ErrorInfo::new(code, reason) });
        let _ = ws.send(Message::text(msg.to_string())).await;
    }
    let frame = CloseFrame {
        code: CloseCode::from(code),
        reason: truncate_close_reason(reason).to_owned().into(),
    };
    if ws.close(Some(frame)).await.is_err() {
        return;
    }
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
}

/// A routing or agent error as a close code and reason.
fn close_for(status: &tonic::Status) -> (u16, String) {
    use tonic::Code;
    match status.code() {
        Code::Unimplemented => (
            1011,
            "The agent does not support the Graph API (WatchGraph). Upgrade the agent to a version that does."
                .to_owned(),
        ),
        Code::InvalidArgument => (1007, status.message().to_owned()),
        Code::DeadlineExceeded | Code::Unavailable => (
            1013,
            format!("The agent is not connected: {}", status.message()),
        ),
        Code::PermissionDenied => (1008, status.message().to_owned()),
        _ => (1011, format!("Agent error: {}", status.message())),
    }
}

async fn session(mut ws: Ws, ctx: GraphContext) {
    // The request: the first message.
    let first = match tokio::time::timeout(REQUEST_TIMEOUT, ws.next()).await {
        Err(_) => return close(ws, 1008, "No request received").await,
        Ok(None | Some(Err(_))) => return,
        Ok(Some(Ok(m))) => m,
    };
    let text = match first {
        Message::Text(t) => t,
        Message::Binary(_) => {
            return close(ws, 1003, "Expected a text message with the request JSON").await;
        }
        Message::Close(_) => return,
        _ => return close(ws, 1008, "Expected the request JSON as the first message").await,
    };
    if let Err(e) = podgate_agent::graph::request::compile(text.as_str()) {
        return close(ws, 1007, &format!("Invalid request: {e}")).await;
    }
    let payload = WatchGraphRequest {
        request_json: text.as_str().to_owned(),
        impersonation: ctx.impersonation,
    }
    .encode_to_vec();
    // Route while watching the client: it may go away, or talk out of turn.
    let routed = tokio::select! {
        r = ctx.router.open(ctx.agent_id, 0, podgate_agent::tunnel::WATCH_GRAPH, payload) => r,
        m = ws.next() => {
            return match m {
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => {}
                Some(Ok(_)) => close(ws, 1008, "Only one message (the request) is expected").await,
            };
        }
    };
    let mut routed = match routed {
        Ok(r) => r,
        Err(status) => {
            let (code, reason) = close_for(&status);
            return close(ws, code, &reason).await;
        }
    };
    loop {
        tokio::select! {
            m = routed.message() => match m {
                Ok(Some(bytes)) => {
                    let text = match WatchGraphResponse::decode(bytes.as_slice())
                        .map_err(|e| e.to_string())
                        .and_then(|r| podgate_agent::graph::wire::encode_response(&r))
                    {
                        Ok(t) => t,
                        Err(e) => {
                            return close(ws, 1011, &format!("Undecodable message from the agent: {e}")).await;
                        }
                    };
                    if ws.send(Message::text(text)).await.is_err() {
                        return;
                    }
                }
                Ok(None) => return close(ws, 1000, "The agent ended the watch").await,
                Err(status) => {
                    let (code, reason) = close_for(&status);
                    return close(ws, code, &reason).await;
                }
            },
            m = ws.next() => match m {
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => {
                    return close(ws, 1008, "Only one message (the request) is expected").await;
                }
            },
        }
    }
}
