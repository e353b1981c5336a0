//! The `/graph` WebSocket as kas reads it (`agent/kas/src/k8s_proxy/graph_ws.rs`):
//! the input is the client's byte stream after the upgrade, read by tungstenite in
//! the server role with kas's limits (1 MiB frames and messages); the first message
//! is dispatched as kas does (text: the request, compiled; binary, ping, pong,
//! close: refused), then frames are read on until the stream ends.
//!
//! - nothing panics; no message exceeds kas's limit;
//! - every close reason kas would send fits a close frame, on a char boundary, and
//!   its `error` message serialises.

use std::io::{self, Read, Write};

use podgate_agent::graph::request;
use podgate_agent::graph::wire::{ErrorInfo, MAX_CLOSE_REASON, truncate_close_reason};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocket, WebSocketConfig};

/// As `graph_ws::MAX_REQUEST_BYTES`.
const MAX_REQUEST_BYTES: usize = 1024 * 1024;

/// The client's bytes in, kas's bytes (pongs, close frames) dropped.
struct Client<'a>(&'a [u8]);

impl Read for Client<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Client<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn close(code: u16, reason: &str) {
    if reason.len() > MAX_CLOSE_REASON {
        let msg = serde_json::json!({ "error": ErrorInfo::new(code, reason) });
        assert!(msg.to_string().len() > reason.len());
    }
    let cut = truncate_close_reason(reason);
    assert!(cut.len() <= MAX_CLOSE_REASON && reason.starts_with(cut));
}

/// Checks one input (module docs); panics on a violated property.
pub fn run(data: &[u8]) {
    let mut config = WebSocketConfig::default();
    config.max_message_size = Some(MAX_REQUEST_BYTES);
    config.max_frame_size = Some(MAX_REQUEST_BYTES);
    let mut ws = WebSocket::from_raw_socket(Client(data), Role::Server, Some(config));
    let mut first = true;
    for _ in 0..64 {
        // The stream's end, a protocol error or a limit: kas drops the session.
        let Ok(m) = ws.read() else {
            return;
        };
        assert!(m.len() <= MAX_REQUEST_BYTES);
        if !first {
            continue;
        }
        first = false;
        match m {
            Message::Text(t) => {
                if let Err(e) = request::compile(t.as_str()) {
                    close(1007, &format!("Invalid request: {e}"));
                }
            }
            Message::Binary(_) => close(1003, "Expected a text message with the request JSON"),
            Message::Close(_) => return,
            _ => close(1008, "Expected the request JSON as the first message"),
        }
    }
}
