//! One Graph API session: dial, send the request, read and print messages until
//! the initial graph has come (the first message and any that follow it within the
//! settle time), or, with `--watch`, until interrupted or closed; close, print the
//! summary, and turn how it ended into an exit code and a last line. Reading follows
//! glab's `server.go` `readActions`: text messages only ("unexpected message type"
//! otherwise), each one JSON; an `error` message is terminal, and its full reason is
//! preferred to the close frame's truncated one.

use std::io::{self, Write as _};
use std::time::{Duration, Instant};

use futures_util::{SinkExt as _, StreamExt as _};
use podgate_agent::graph::wire::{self, ErrorInfo, Message as WireMessage};
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{self, Message};

use super::Output;
use super::dial::{self, Socket, Target};
use super::state::{self, GraphState};

/// Exit code for a server or transport error.
const EXIT_SERVER: u8 = 1;
/// After an `error` message, how long to wait for the close frame that follows it.
const CLOSE_AFTER_ERROR: Duration = Duration::from_secs(5);
/// How long our own close handshake may take before we give up on it.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// What the session prints and when it stops.
#[derive(Debug, Clone, Copy)]
pub(super) struct SessionOptions {
    /// Keep reading after the initial graph.
    pub(super) watch: bool,
    /// Without `watch`: the initial graph is complete when no message has come for
    /// this long.
    pub(super) settle: Duration,
    /// What stdout shows.
    pub(super) output: Output,
    /// Print no stream, only the summary and errors.
    pub(super) summary_only: bool,
}

/// How reading the stream ended.
#[derive(Debug)]
enum End {
    /// The initial graph arrived (without `--watch`).
    Done,
    /// SIGINT or SIGTERM.
    Interrupted,
    /// stdout was closed (e.g. `| head`).
    StdoutClosed,
    /// The server sent a close frame.
    Closed(Option<CloseFrame>),
    /// An `error` message came but no close frame followed in time.
    ErrorWithoutClose,
    /// The connection ended without a close frame.
    Dropped,
    /// A binary message (glab: "unexpected message type").
    Binary,
    /// A message that is not the Graph API's JSON.
    BadJson(String),
    /// A message over the 4 MiB limit.
    TooBig(String),
    /// Any other read or write error.
    Transport(String),
}

/// Run the session; the exit code.
pub(super) async fn session(
    target: &Target,
    authorization: &str,
    request: String,
    opts: SessionOptions,
) -> u8 {
    let started = Instant::now();
    let mut ws = match dial::connect(target, authorization).await {
        Ok(ws) => ws,
        Err(e) => {
            // A refused upgrade, a subprotocol not agreed, or no connection at all.
            eprintln!("podgate graph: {e}");
            return EXIT_SERVER;
        }
    };
    let mut state = GraphState::new(started.elapsed());
    if let Err(e) = ws.send(Message::text(request)).await {
        eprintln!("podgate graph: WebSocket write: {e}");
        return EXIT_SERVER;
    }
    let sent = Instant::now();
    let mut stdout = io::BufWriter::new(io::stdout().lock());
    let mut error: Option<ErrorInfo> = None;
    let end = read_stream(&mut ws, &mut state, &mut error, &mut stdout, sent, opts).await;
    let _ = stdout.flush();
    drop(stdout);

    // Our side of the close, where the server has not closed.
    let our_close = match &end {
        End::Done | End::Interrupted | End::StdoutClosed => Some(CloseCode::Normal),
        End::Binary => Some(CloseCode::Unsupported),
        End::BadJson(_) => Some(CloseCode::Invalid),
        End::TooBig(_) => Some(CloseCode::Size),
        End::ErrorWithoutClose => Some(CloseCode::Normal),
        End::Closed(_) | End::Dropped | End::Transport(_) => None,
    };
    match our_close {
        Some(code) => close(&mut ws, code).await,
        // Send the reply to the server's close frame that tungstenite queued.
        None if matches!(end, End::Closed(_)) => {
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, ws.flush()).await;
        }
        None => {}
    }

    eprint!("{}", state.summary());
    let (code, line) = verdict(&end, error.as_ref(), &state, opts);
    if let Some(line) = line {
        eprintln!("podgate graph: {line}");
    }
    code
}

/// Read messages until the stream ends (see [`End`]), printing each one.
async fn read_stream(
    ws: &mut Socket,
    state: &mut GraphState,
    error: &mut Option<ErrorInfo>,
    out: &mut impl io::Write,
    sent: Instant,
    opts: SessionOptions,
) -> End {
    let interrupt = crate::cli::shutdown_signal();
    tokio::pin!(interrupt);
    let mut error_deadline: Option<tokio::time::Instant> = None;
    let mut settled: Option<tokio::time::Instant> = None;
    loop {
        let error_wait = async {
            match error_deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let settle_wait = async {
            match settled {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let next = tokio::select! {
            _ = &mut interrupt => return End::Interrupted,
            _ = error_wait => return End::ErrorWithoutClose,
            _ = settle_wait, if error_deadline.is_none() => return End::Done,
            next = ws.next() => next,
        };
        let text = match next {
            None => return End::Dropped,
            Some(Err(e)) => return read_error(e),
            Some(Ok(Message::Text(t))) => t,
            Some(Ok(Message::Binary(_))) => return End::Binary,
            Some(Ok(Message::Close(frame))) => return End::Closed(frame),
            Some(Ok(_)) => continue,
        };
        state.received(text.len(), sent.elapsed());
        let parsed = serde_json::from_str::<WireMessage>(&text);
        if !opts.summary_only {
            let written = match (&parsed, opts.output) {
                (_, Output::Json) => writeln!(out, "{}", one_line(&text)),
                (Ok(msg), Output::Text) => state::message_lines(msg)
                    .iter()
                    .try_for_each(|line| writeln!(out, "{line}")),
                (Err(_), Output::Text) => Ok(()),
            };
            if let Err(e) = written.and_then(|()| out.flush()) {
                return if e.kind() == io::ErrorKind::BrokenPipe {
                    End::StdoutClosed
                } else {
                    End::Transport(format!("writing stdout: {e}"))
                };
            }
        }
        let msg = match parsed {
            Ok(msg) => msg,
            Err(e) => return End::BadJson(e.to_string()),
        };
        state.apply(&msg);
        if let Some(e) = msg.error {
            // The close frame follows with a truncated reason; keep the full one.
            *error = Some(e);
            error_deadline = Some(tokio::time::Instant::now() + CLOSE_AFTER_ERROR);
            continue;
        }
        if !opts.watch && error.is_none() {
            settled = Some(tokio::time::Instant::now() + opts.settle);
        }
    }
}

fn read_error(e: tungstenite::Error) -> End {
    use tungstenite::Error as E;
    use tungstenite::error::{CapacityError, ProtocolError};
    match e {
        E::Capacity(CapacityError::MessageTooLong { size, max_size }) => End::TooBig(format!(
            "a message of {size} bytes is over the {max_size}-byte (4 MiB) limit GitLab's client sets"
        )),
        E::Protocol(ProtocolError::ResetWithoutClosingHandshake) | E::ConnectionClosed => {
            End::Dropped
        }
        E::Io(e)
            if matches!(
                e.kind(),
                io::ErrorKind::ConnectionReset | io::ErrorKind::UnexpectedEof
            ) =>
        {
            End::Dropped
        }
        e => End::Transport(format!("WebSocket read: {e}")),
    }
}

/// A message as one line: JSON strings cannot hold raw line breaks, so any in a
/// message are whitespace between tokens and can go.
fn one_line(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains(['\n', '\r']) {
        text.replace(['\n', '\r'], "").into()
    } else {
        text.into()
    }
}

/// Close our side with `code` and wait (briefly) for the server's reply.
async fn close(ws: &mut Socket, code: CloseCode) {
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
        let frame = CloseFrame {
            code,
            reason: "".into(),
        };
        if ws.close(Some(frame)).await.is_err() {
            return;
        }
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
}

/// `1007 StatusInvalidFramePayloadData`.
fn code_text(code: u16) -> String {
    format!("{code} {}", wire::close_code_string(code))
}

/// The exit code and the final error line for how the stream ended.
fn verdict(
    end: &End,
    error: Option<&ErrorInfo>,
    state: &GraphState,
    opts: SessionOptions,
) -> (u8, Option<String>) {
    // The full reason of an `error` message beats a close frame's truncated one.
    let error_line = |code: u16, close_reason: &str| -> String {
        let reason = error.map_or(close_reason, |e| e.reason.as_str());
        if reason.is_empty() {
            code_text(code)
        } else {
            format!("{}: {reason}", code_text(code))
        }
    };
    match end {
        End::Done | End::StdoutClosed => (0, None),
        End::Interrupted => match error {
            Some(e) => (
                EXIT_SERVER,
                Some(format!(
                    "interrupted after an error: {}",
                    error_line(e.code, "")
                )),
            ),
            None if opts.watch || state.any_message() => (0, None),
            None => (
                EXIT_SERVER,
                Some("interrupted before the first message".into()),
            ),
        },
        End::Closed(frame) => {
            let (code, reason) = match frame {
                Some(f) => (u16::from(f.code), f.reason.as_str()),
                None => (1005, ""),
            };
            let line = format!(
                "the server closed the connection: {}",
                error_line(code, reason)
            );
            let ok = code == 1000 && error.is_none() && state.any_message();
            (if ok { 0 } else { EXIT_SERVER }, Some(line))
        }
        End::ErrorWithoutClose => {
            let e = error.expect("only after an error message");
            (
                EXIT_SERVER,
                Some(format!(
                    "the server sent an error and did not close within {} s: {}",
                    CLOSE_AFTER_ERROR.as_secs(),
                    error_line(e.code, "")
                )),
            )
        }
        End::Dropped => {
            let mut line = format!(
                "the connection ended without a close frame ({})",
                code_text(1006)
            );
            if let Some(e) = error {
                line.push_str(&format!("; the server's error: {}", error_line(e.code, "")));
            }
            (EXIT_SERVER, Some(line))
        }
        End::Binary => (
            EXIT_SERVER,
            Some("unexpected message type (binary; the Graph API sends text)".into()),
        ),
        End::BadJson(e) => (EXIT_SERVER, Some(format!("JSON unmarshal: {e}"))),
        End::TooBig(e) | End::Transport(e) => (EXIT_SERVER, Some(e.clone())),
    }
}
