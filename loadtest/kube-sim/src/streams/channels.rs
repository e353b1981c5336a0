//! `exec` and `attach` over WebSocket: the channel protocol kubectl (1.30 and
//! later) speaks first, `v5.channel.k8s.io` (or `v4.channel.k8s.io`). Every
//! binary message starts with its channel: 0 stdin, 1 stdout, 2 stderr, 3 the
//! error channel (one `metav1.Status` when the process ends), 4 terminal resize;
//! in v5 the message `[255, channel]` closes a channel (stdin's end of input).
//! The server writes the status and closes the connection normally, which ends
//! every stream at the client (client-go `tools/remotecommand/websocket.go`,
//! `v4.go`, `v5.go`; the apiserver's `wsstream/conn.go`). Statuses are the
//! kubelet's (`k8s.io/kubelet/pkg/cri/streaming/remotecommand/exec.go`): `Success`, a
//! `NonZeroExitCode` failure whose `ExitCode` cause carries the status (kubectl
//! exits with it), or an `InternalError` for a command that could not start.

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, oneshot};

use super::containers::{Container, Output};
use super::pipe::Pipe;
use super::shell::{self, Env, Io, Outcome};

/// The subprotocols served, preferred first.
pub(super) const PROTOCOLS: &[&str] = &["v5.channel.k8s.io", "v4.channel.k8s.io"];

const STDIN: u8 = 0;
/// The stdout channel.
pub(super) const STDOUT: u8 = 1;
/// The stderr channel.
pub(super) const STDERR: u8 = 2;
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

/// Serve one session over a WebSocket until the process ends (exec), the
/// container's main process ends (attach), or the client goes: the status on
/// the error channel, then a normal close.
pub(super) async fn serve(mut pipe: Pipe, streams: Streams, work: Work) {
    let (stdin_tx, stdin_rx) = mpsc::channel::<Bytes>(16);
    let (out_tx, mut out_rx) = mpsc::channel::<(u8, Bytes)>(64);
    let (gone_tx, gone_rx) = oneshot::channel::<()>();
    let frame = |channel: u8, data: &[u8]| {
        let mut b = BytesMut::with_capacity(1 + data.len());
        b.put_u8(channel);
        b.extend_from_slice(data);
        b.freeze()
    };
    // The client's messages: stdin, v5's close of stdin; resize (4) is ignored,
    // as a simulated terminal has no size.
    let mut from_client = pipe.rx;
    tokio::spawn(async move {
        let mut stdin = Some(stdin_tx);
        while let Some(b) = from_client.recv().await {
            match b.first() {
                Some(&STDIN) if b.len() > 1 => {
                    if let Some(tx) = &stdin
                        && tx.send(b.slice(1..)).await.is_err()
                    {
                        stdin = None;
                    }
                }
                Some(&CLOSE) if b[..] == [CLOSE, STDIN] => stdin = None,
                _ => {}
            }
        }
        let _ = gone_tx.send(());
    });
    let to_client = pipe.tx.clone();
    let writer = tokio::spawn(async move {
        while let Some((channel, data)) = out_rx.recv().await {
            if to_client.send(frame(channel, &data)).await.is_err() {
                return;
            }
        }
    });
    let status = run(streams, work, stdin_rx, out_tx, async {
        let _ = gone_rx.await;
    })
    .await;
    let _ = writer.await;
    if let Some(status) = status {
        let _ = pipe
            .tx
            .send(frame(ERROR, status.to_string().as_bytes()))
            .await;
    }
    drop(pipe.tx);
    let _ = tokio::time::timeout(Duration::from_secs(5), &mut pipe.closed).await;
}

/// How long an exec's process takes to start, as a container runtime's does.
const EXEC_START: Duration = Duration::from_millis(20);

/// Run `work` with the client's `stdin`, writing `(channel, bytes)` to `out`
/// (stdout 1, stderr 2): the status to report, or `None` when the client went
/// away (`gone`) before an attached process ended.
pub(super) async fn run(
    streams: Streams,
    work: Work,
    stdin: mpsc::Receiver<Bytes>,
    out: mpsc::Sender<(u8, Bytes)>,
    gone: impl std::future::Future<Output = ()>,
) -> Option<Value> {
    let stderr_channel = if streams.tty { STDOUT } else { STDERR };
    let forward = |channel: u8, wanted: bool| {
        let (tx, mut rx) = mpsc::channel::<Bytes>(64);
        let out = out.clone();
        let task = tokio::spawn(async move {
            while let Some(chunk) = rx.recv().await {
                if wanted && out.send((channel, chunk)).await.is_err() {
                    break;
                }
            }
        });
        (tx, task)
    };
    match work {
        Work::Exec { argv, env } => {
            let (stdout, out_task) = forward(STDOUT, streams.stdout);
            let (stderr, err_task) = forward(stderr_channel, streams.stderr || streams.tty);
            let mut io = Io {
                stdin: streams.stdin.then_some(stdin),
                stdout,
                stderr,
            };
            // A kubelet's exec starts a process in the container before it writes
            // anything; kube-sim's shell would write at once. client-go's WebSocket
            // executor starts reading before it has created its streams
            // (`client-go/tools/remotecommand/websocket.go`, "Unknown stream id …,
            // discarding message"), so output sent in that gap is lost to kubectl.
            tokio::time::sleep(EXEC_START).await;
            let outcome = shell::run(&argv, &env, &mut io).await;
            drop(io);
            let _ = out_task.await;
            let _ = err_task.await;
            Some(exec_status(&argv, outcome))
        }
        Work::Attach { container, env } => {
            let mut output = container.subscribe();
            if streams.stdin {
                let main = container.main_stdin(env);
                let mut stdin = stdin;
                tokio::spawn(async move {
                    while let Some(chunk) = stdin.recv().await {
                        if main.send(chunk).await.is_err() {
                            break;
                        }
                    }
                });
            }
            tokio::pin!(gone);
            loop {
                tokio::select! {
                    o = output.recv() => match o {
                        Ok(Output::Line(line)) => {
                            if streams.stdout && out.send((STDOUT, line)).await.is_err() {
                                return None;
                            }
                        }
                        Ok(Output::Exit) | Err(broadcast::error::RecvError::Closed) => break,
                        Err(broadcast::error::RecvError::Lagged(_)) => {}
                    },
                    () = &mut gone => return None,
                }
            }
            Some(json!({"metadata": {}, "status": "Success"}))
        }
    }
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
