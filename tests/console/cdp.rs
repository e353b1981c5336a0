//! A Chrome DevTools Protocol client, enough to drive one page of Debian's
//! headless `chromium`: launch it on a private profile, open a page, evaluate
//! JavaScript, take screenshots, and collect everything the page reported as an
//! error (uncaught exceptions, `console.error`/`console.assert`, and the browser's
//! own log entries at level error: failed loads, refused WebSockets, CSP
//! violations).
//!
//! Protocol: JSON messages over the browser's WebSocket; `Target.attachToTarget`
//! with `flatten` gives a session id that page commands and events carry
//! (<https://chromedevtools.github.io/devtools-protocol/>).

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>;

/// A running headless Chromium; killed when dropped.
pub(crate) struct Browser {
    _child: tokio::process::Child,
    _profile: tempfile::TempDir,
    out: mpsc::UnboundedSender<Message>,
    next: AtomicU64,
    pending: Pending,
    /// Every event, in order of arrival.
    events: Arc<Mutex<Vec<Value>>>,
}

/// One page (a target attached with a flat session).
pub(crate) struct Page<'a> {
    browser: &'a Browser,
    session: String,
}

/// Where Debian installs it (`scripts/lib/deps.sh` installs the package).
pub(crate) const CHROMIUM: &str = "/usr/bin/chromium";

impl Browser {
    /// Start `chromium --headless` and connect to its DevTools endpoint.
    pub(crate) async fn launch() -> Browser {
        assert!(
            Path::new(CHROMIUM).is_file(),
            "{CHROMIUM} is missing: scripts/test.sh installs Debian's chromium package"
        );
        let profile = tempfile::tempdir().unwrap();
        let mut child = tokio::process::Command::new(CHROMIUM)
            .args([
                "--headless",
                // Root in a container has no user namespace for the sandbox.
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--no-default-browser-check",
                "--window-size=1400,1900",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut seen = String::new();
        let url = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if let Some(u) = line.strip_prefix("DevTools listening on ") {
                    return u.trim().to_owned();
                }
                seen.push_str(&line);
                seen.push('\n');
            }
            panic!("chromium exited before listening:\n{seen}");
        })
        .await
        .expect("chromium's DevTools endpoint within 60 s");
        // Keep draining its stderr so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let (ws, _) = tokio_tungstenite::connect_async(url.as_str())
            .await
            .unwrap();
        let (mut sink, mut stream) = ws.split();
        let (out, mut rx) = mpsc::unbounded_channel::<Message>();
        tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                if sink.send(m).await.is_err() {
                    return;
                }
            }
        });
        let pending: Pending = Arc::default();
        let events: Arc<Mutex<Vec<Value>>> = Arc::default();
        let (p, e) = (pending.clone(), events.clone());
        tokio::spawn(async move {
            while let Some(Ok(msg)) = stream.next().await {
                let Message::Text(text) = msg else { continue };
                let Ok(v) = serde_json::from_str::<Value>(&text) else {
                    continue;
                };
                match v["id"].as_u64() {
                    Some(id) => {
                        if let Some(tx) = p.lock().unwrap().remove(&id) {
                            let _ = tx.send(v);
                        }
                    }
                    None => e.lock().unwrap().push(v),
                }
            }
        });
        Browser {
            _child: child,
            _profile: profile,
            out,
            next: AtomicU64::new(1),
            pending,
            events,
        }
    }

    /// Send a command (to a page when `session` is given); its `result`, or the
    /// protocol's error as `Err`.
    pub(crate) async fn call(
        &self,
        session: Option<&str>,
        method: &str,
        params: Value,
    ) -> Result<Value, String> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(id, tx);
        self.out.send(Message::text(msg.to_string())).unwrap();
        let reply = tokio::time::timeout(Duration::from_secs(60), rx)
            .await
            .unwrap_or_else(|_| panic!("{method}: no answer in 60 s"))
            .unwrap();
        match reply.get("error") {
            Some(e) => Err(format!("{method}: {e}")),
            None => Ok(reply["result"].clone()),
        }
    }

    /// A new page, with the Runtime, Log and Page domains enabled.
    pub(crate) async fn page(&self) -> Page<'_> {
        let target = self
            .call(None, "Target.createTarget", json!({"url": "about:blank"}))
            .await
            .unwrap();
        let attached = self
            .call(
                None,
                "Target.attachToTarget",
                json!({"targetId": target["targetId"], "flatten": true}),
            )
            .await
            .unwrap();
        let page = Page {
            browser: self,
            session: attached["sessionId"].as_str().unwrap().to_owned(),
        };
        for domain in ["Runtime.enable", "Log.enable", "Page.enable"] {
            page.call(domain, json!({})).await.unwrap();
        }
        page
    }
}

impl Page<'_> {
    /// A command to this page.
    pub(crate) async fn call(&self, method: &str, params: Value) -> Result<Value, String> {
        self.browser.call(Some(&self.session), method, params).await
    }

    /// Load `url`.
    pub(crate) async fn navigate(&self, url: &str) {
        let r = self
            .call("Page.navigate", json!({"url": url}))
            .await
            .unwrap();
        assert!(r.get("errorText").is_none(), "loading {url}: {r}");
    }

    /// The value of a JavaScript expression (awaited if a promise); a thrown
    /// exception is an `Err`.
    pub(crate) async fn eval(&self, expression: &str) -> Result<Value, String> {
        let r = self
            .call(
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
            )
            .await?;
        if let Some(e) = r.get("exceptionDetails") {
            return Err(format!("{expression}: {e}"));
        }
        Ok(r["result"]["value"].clone())
    }

    /// A PNG of the whole page into `path`.
    pub(crate) async fn screenshot(&self, path: &Path) {
        use base64::Engine as _;
        let r = self
            .call(
                "Page.captureScreenshot",
                json!({"format": "png", "captureBeyondViewport": true}),
            )
            .await
            .unwrap();
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().unwrap())
            .unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }

    /// What this page reported as errors so far, one line each.
    pub(crate) fn errors(&self) -> Vec<String> {
        let events = self.browser.events.lock().unwrap();
        events
            .iter()
            .filter(|e| e["sessionId"].as_str() == Some(self.session.as_str()))
            .filter_map(|e| {
                let p = &e["params"];
                match e["method"].as_str()? {
                    "Runtime.exceptionThrown" => Some(format!(
                        "exception: {}",
                        p["exceptionDetails"]["exception"]["description"]
                            .as_str()
                            .unwrap_or_else(|| p["exceptionDetails"]["text"]
                                .as_str()
                                .unwrap_or("?"))
                    )),
                    "Runtime.consoleAPICalled"
                        if matches!(p["type"].as_str(), Some("error" | "assert")) =>
                    {
                        Some(format!("console.{}: {}", p["type"], p["args"]))
                    }
                    "Log.entryAdded" if p["entry"]["level"] == "error" => Some(format!(
                        "log ({}): {} {}",
                        p["entry"]["source"], p["entry"]["text"], p["entry"]["url"]
                    )),
                    _ => None,
                }
            })
            .collect()
    }
}
