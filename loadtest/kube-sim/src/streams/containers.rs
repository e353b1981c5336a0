//! Containers' logs and main processes. A container's log is what its main
//! process wrote plus what [`crate::KubeSim::container_log`] appends; `logs`
//! serves it and follows it, `attach` streams it. The main process is the
//! built-in shell reading commands from stdin, one a line (started on the first
//! `attach -i`); `exit N`, or [`crate::KubeSim::end_container`], ends it: every
//! follower and attached client sees the end, and the next `attach -i` starts a
//! fresh one, as the kubelet restarts a container whose restart policy is
//! `Always`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use tokio::sync::{broadcast, mpsc};

use super::shell::{self, Env, Io};

/// Lines kept per container (older ones are dropped, as log rotation would).
const KEPT_LINES: usize = 10_000;

/// What a container's output stream carries.
#[derive(Clone, Debug)]
pub(super) enum Output {
    /// One line, with its newline.
    Line(Bytes),
    /// The main process ended.
    Exit,
}

/// Every container kube-sim has seen a log or a process of, by namespace, Pod
/// and container name.
#[derive(Default)]
pub(crate) struct Containers {
    map: Mutex<HashMap<(String, String, String), Arc<Container>>>,
}

impl Containers {
    /// The container, made on first use.
    pub(crate) fn get(&self, ns: &str, pod: &str, container: &str) -> Arc<Container> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.entry((ns.to_owned(), pod.to_owned(), container.to_owned()))
            .or_insert_with(|| Arc::new(Container::new()))
            .clone()
    }
}

/// One container: its log and its main process.
pub(crate) struct Container {
    state: Mutex<State>,
    output: broadcast::Sender<Output>,
}

struct State {
    log: VecDeque<Bytes>,
    /// The running main process's stdin, and its generation (so an ended
    /// process's late exit is not reported twice).
    main: Option<(u64, mpsc::Sender<Bytes>)>,
    generation: u64,
}

impl Container {
    fn new() -> Self {
        Container {
            state: Mutex::new(State {
                log: VecDeque::new(),
                main: None,
                generation: 0,
            }),
            output: broadcast::channel(1024).0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Append output: each line is kept and sent to followers.
    pub(crate) fn append(&self, text: &[u8]) {
        let mut st = self.lock();
        for line in text.split_inclusive(|b| *b == b'\n') {
            let mut line = line.to_vec();
            if line.last() != Some(&b'\n') {
                line.push(b'\n');
            }
            let line = Bytes::from(line);
            if st.log.len() == KEPT_LINES {
                st.log.pop_front();
            }
            st.log.push_back(line.clone());
            let _ = self.output.send(Output::Line(line));
        }
    }

    /// The last `tail` lines (all without a limit) and a subscription to what
    /// follows them, taken together so no line falls between.
    pub(super) fn follow(&self, tail: Option<usize>) -> (Vec<Bytes>, broadcast::Receiver<Output>) {
        let st = self.lock();
        let skip = tail.map_or(0, |t| st.log.len().saturating_sub(t));
        (
            st.log.iter().skip(skip).cloned().collect(),
            self.output.subscribe(),
        )
    }

    /// A subscription to output from now on.
    pub(super) fn subscribe(&self) -> broadcast::Receiver<Output> {
        self.output.subscribe()
    }

    /// End the main process (if one runs, its stdin closes).
    pub(crate) fn exit(&self) {
        let mut st = self.lock();
        st.main = None;
        st.generation += 1;
        let _ = self.output.send(Output::Exit);
    }

    /// The running main process's stdin, starting the process if none runs.
    pub(super) fn main_stdin(self: &Arc<Self>, env: Env) -> mpsc::Sender<Bytes> {
        let mut st = self.lock();
        if let Some((_, tx)) = &st.main {
            return tx.clone();
        }
        let (tx, rx) = mpsc::channel(64);
        let generation = st.generation;
        st.main = Some((generation, tx.clone()));
        drop(st);
        let this = self.clone();
        tokio::spawn(async move {
            let (out_tx, mut out_rx) = mpsc::channel::<Bytes>(64);
            let mut io = Io {
                stdin: Some(rx),
                stdout: out_tx.clone(),
                stderr: out_tx,
            };
            let logger = this.clone();
            let copy = tokio::spawn(async move {
                while let Some(chunk) = out_rx.recv().await {
                    logger.append(&chunk);
                }
            });
            shell::run(&["sh".to_owned()], &env, &mut io).await;
            drop(io);
            let _ = copy.await;
            let mut st = this.lock();
            if st.generation == generation {
                st.main = None;
                st.generation += 1;
                let _ = this.output.send(Output::Exit);
            }
        });
        tx
    }
}
