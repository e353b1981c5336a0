//! The in-process Kubernetes API server of tests: a [`KubeSim`]
//! on a free loopback port, stopped when dropped.

use std::net::SocketAddr;

use serde_json::Value;
use tokio::net::TcpListener;

use podgate_kube_sim::KubeSim;

/// The test API server. Dropping it stops it (open watches end too).
pub struct KubeTestServer {
    addr: SocketAddr,
    sim: KubeSim,
    task: tokio::task::JoinHandle<()>,
}

impl KubeTestServer {
    /// Serve on a free loopback port. At most `history_limit` events are kept for
    /// watch resumption.
    pub async fn start(history_limit: usize) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let sim = KubeSim::new(history_limit);
        let s = sim.clone();
        let task = tokio::spawn(async move { s.serve(listener, std::future::pending()).await });
        Ok(KubeTestServer { addr, sim, task })
    }

    /// The simulated cluster behind this server.
    pub fn sim(&self) -> &KubeSim {
        &self.sim
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig pointing at this server (no auth, plain HTTP).
    pub fn kubeconfig(&self) -> String {
        podgate_kube_sim::kubeconfig(&self.url())
    }

    /// A kube-rs client of this server, configured from [`Self::kubeconfig`].
    pub async fn client(&self) -> ::kube::Client {
        let kubeconfig =
            ::kube::config::Kubeconfig::from_yaml(&self.kubeconfig()).expect("kubeconfig");
        let config = ::kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("config");
        ::kube::Client::try_from(config).expect("client")
    }

    /// Create or replace an object directly (as another client would).
    pub fn put(&self, plural: &str, namespace: &str, object: Value) -> Value {
        self.sim.put(plural, namespace, object)
    }

    /// Delete an object directly.
    pub fn delete(&self, plural: &str, namespace: &str, name: &str) -> bool {
        self.sim.delete(plural, namespace, name)
    }

    /// An object, if present.
    pub fn get(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        self.sim.get(plural, namespace, name)
    }

    /// Stop serving and wait until it has stopped: every connection (kept-alive
    /// ones and watches included) is closed when this returns. Dropping the server
    /// only asks for that.
    pub async fn stop(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.sim.resource_version()
    }
}

impl Drop for KubeTestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The installed `kubectl`, pointed at a [`KubeTestServer`] by a kubeconfig file of
/// its own (and a `HOME` with no discovery cache from elsewhere).
pub struct Kubectl {
    /// The kubeconfig, and kubectl's `HOME` (its discovery cache): this test's
    /// alone, never one an earlier run left behind.
    dir: tempfile::TempDir,
    config: std::path::PathBuf,
}

impl Kubectl {
    /// For `server`.
    pub fn new(server: &KubeTestServer) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let config = dir.path().join("kubeconfig");
        std::fs::write(&config, server.kubeconfig()).expect("writing the kubeconfig");
        Kubectl { dir, config }
    }

    /// `kubectl --kubeconfig <ours> ARGS…`, not started.
    pub fn command(&self, args: &[&str]) -> std::process::Command {
        let mut c = std::process::Command::new("kubectl");
        c.arg("--kubeconfig").arg(&self.config).args(args);
        c.env("HOME", self.dir.path());
        c
    }

    /// Run to completion with `stdin` as its input: (success, stdout, stderr).
    /// It blocks: call it from `tokio::task::block_in_place` in async tests.
    pub fn run(&self, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
        use std::io::Write as _;
        use std::process::Stdio;
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl is installed");
        let mut stdin_pipe = child.stdin.take().expect("a stdin pipe");
        if let Some(input) = stdin {
            stdin_pipe
                .write_all(input.as_bytes())
                .expect("writing kubectl's input");
        }
        drop(stdin_pipe);
        let out = child.wait_with_output().expect("kubectl ends");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// [`Kubectl::run`] that must succeed (inside `block_in_place`: a multi-thread
    /// runtime): its stdout.
    #[track_caller]
    pub fn ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let (ok, out, err) = tokio::task::block_in_place(|| self.run(args, stdin));
        assert!(ok, "kubectl {args:?}: {out}\n{err}");
        out
    }

    /// [`Kubectl::run`] that must fail (inside `block_in_place`): its stderr.
    #[track_caller]
    pub fn fails(&self, args: &[&str], stdin: Option<&str>) -> String {
        let (ok, out, err) = tokio::task::block_in_place(|| self.run(args, stdin));
        assert!(!ok, "kubectl {args:?} succeeded: {out}");
        err
    }
}
