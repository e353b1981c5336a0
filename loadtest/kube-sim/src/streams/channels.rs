//! `exec` and `attach` over WebSocket: the channel protocol kubectl (1.30 and
//! later) speaks first, `v5.channel.k8s.io` (or `v4.channel.k8s.io`). Every
//! binary message starts with its channel: 0 stdin, 1 stdout, 2 stderr, 3 the
//! error channel (one `metav1.Status` when the process ends), 4 terminal resize;
//! in v5 the message `[255, channel]` closes a channel (stdin's end of input).
//! The server writes the status and closes the connection normally, which ends
//! every stream at the client (client-go `tools/remotecommand/websocket.go`,
//! `v4.go`, `v5.go`; the apiserver's `wsstream/conn.go`). Statuses are the
//! kubelet's (`pkg/kubelet/cri/streaming/remotecommand/exec.go`): `Success`, a
//! `NonZeroExitCode` failure whose `ExitCode` cause carries the status (kubectl
//! exits with it), or an `InternalError` for a command that could not start.

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::containers::{Container, Output};
use super::shell::{self, Env, Io, Outcome};

/// The subprotocols served, preferred first.
pub(super) const PROTOCOLS: &[&str] = &["v5.channel.k8s.io", "v4.channel.k8s.io"];

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const CLOSE: u8 = 255;

/// Which streams the client asked for (`stdin`, `stdout`, `stderr`, `tty`).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Streams {
    pub(super) stdin: bool,
    pub(super) stdout: bool,
    pub(super) stderr: bool,
    pub(super) tty: bool,
}

/// What the session runs.
pub(super) enum Work {
    /// A new process: its command line and environment.
    Exec { argv: Vec<String>, env: Env },
    /// The container's main process.
    Attach { container: Arc<Container>, env: Env },
}

/// Serve one session on an upgraded connection until the process ends (exec),
/// the container's main process ends (attach), or the client goes.
pub(super) async fn serve<S>(ws: WebSocketStream<S>, streams: Streams, work: Work)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut source) = ws.split();
    let (out_tx, mut out_rx) = mpsc::channel::<Message>(64);
    let writer = tokio::spawn(async move {
        while let Some(m) = out_rx.recv().await {
            let close = matches!(m, Message::Close(_));
            if sink.send(m).await.is_err() || close {
                break;
            }
        }
    });
    // The reader feeds stdin and ends when the client closes or goes away.
    let (stdin_tx, stdin_rx) = mpsc::channel::<Bytes>(16);
    let mut reader = tokio::spawn(async move {
        let mut stdin = Some(stdin_tx);
        while let Some(Ok(m)) = source.next().await {
            match m {
                Message::Binary(b) if b.first() == Some(&STDIN) => {
                    if let Some(tx) = &stdin
                        && b.len() > 1
                        && tx.send(b.slice(1..)).await.is_err()
                    {
                        stdin = None;
                    }
                }
                Message::Binary(b) if b[..] == [CLOSE, STDIN] => stdin = None,
                // Resize (4) and anything else: a simulated terminal has no size.
                Message::Close(_) => break,
                _ => {}
            }
        }
    });
    let frame = |channel: u8, data: &[u8]| {
        let mut b = BytesMut::with_capacity(1 + data.len());
        b.put_u8(channel);
        b.extend_from_slice(data);
        Message::Binary(b.freeze())
    };
    let stderr_channel = if streams.tty { STDOUT } else { STDERR };
    let forward = |channel: u8, wanted: bool| {
        let (tx, mut rx) = mpsc::channel::<Bytes>(64);
        let out = out_tx.clone();
        let task = tokio::spawn(async move {
            while let Some(chunk) = rx.recv().await {
                if wanted && out.send(frame(channel, &chunk)).await.is_err() {
                    break;
                }
            }
        });
        (tx, task)
    };
    let status = match work {
        Work::Exec { argv, env } => {
            let (stdout, out_task) = forward(STDOUT, streams.stdout);
            let (stderr, err_task) = forward(stderr_channel, streams.stderr || streams.tty);
            let mut io = Io {
                stdin: streams.stdin.then_some(stdin_rx),
                stdout,
                stderr,
            };
            let outcome = shell::run(&argv, &env, &mut io).await;
            drop(io);
            let _ = out_task.await;
            let _ = err_task.await;
            exec_status(&argv, outcome)
        }
        Work::Attach { container, env } => {
            let mut output = container.subscribe();
            if streams.stdin {
                let main = container.main_stdin(env);
                let mut stdin_rx = stdin_rx;
                tokio::spawn(async move {
                    while let Some(chunk) = stdin_rx.recv().await {
                        if main.send(chunk).await.is_err() {
                            break;
                        }
                    }
                });
            }
            loop {
                tokio::select! {
                    o = output.recv() => match o {
                        Ok(Output::Line(line)) => {
                            if streams.stdout && out_tx.send(frame(STDOUT, &line)).await.is_err() {
                                break;
                            }
                        }
                        Ok(Output::Exit) | Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    },
                    _ = &mut reader => {
                        // The client went away: nothing is left to write to.
                        drop(out_tx);
                        let _ = writer.await;
                        return;
                    }
                }
            }
            json!({"metadata": {}, "status": "Success"})
        }
    };
    let _ = out_tx
        .send(frame(ERROR, status.to_string().as_bytes()))
        .await;
    let _ = out_tx
        .send(Message::Close(Some(CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        })))
        .await;
    drop(out_tx);
    let _ = writer.await;
    // Let the client answer the close; it may also just go.
    let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
}

/// The kubelet's status for a finished exec.
pub(super) fn exec_status(argv: &[String], outcome: Outcome) -> Value {
    match outcome {
        Outcome::Exited(0) => json!({"metadata": {}, "status": "Success"}),
        Outcome::Exited(code) => json!({
            "metadata": {},
            "status": "Failure",
            "message": format!(
                "command terminated with non-zero exit code: error executing command {}, exit code {code}",
                go_slice(argv)
            ),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
        }),
        Outcome::NotFound(name) => {
            let cause = format!(
                "error executing command in container: failed to exec in container: failed to start exec: OCI runtime exec failed: exec failed: unable to start container process: exec: \"{name}\": executable file not found in $PATH: unknown"
            );
            json!({
                "metadata": {},
                "status": "Failure",
                "message": format!("Internal error occurred: {cause}"),
                "reason": "InternalError",
                "details": {"causes": [{"message": cause}]},
                "code": 500,
            })
        }
    }
}

/// `[a b c]`, as Go's `%v` prints a slice of strings.
fn go_slice(argv: &[String]) -> String {
    format!("[{}]", argv.join(" "))
}
