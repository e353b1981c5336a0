//! Watch streams: newline-delimited JSON events, resumed from a `resourceVersion`
//! out of the store's history (or `410 Gone` when it is older), with `BOOKMARK`s when
//! the client allows them.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::http::{Body, error, status};
use super::resources::Kind;
use super::selector::parse_selector;
use super::store::{Shared, Stored};

impl Shared {
    /// Answer a `watch=true` list request with a stream that ends when the client
    /// goes away or the server stops.
    pub(super) fn watch(
        self: &Arc<Self>,
        k: Kind,
        version: &str,
        namespace: Option<&str>,
        q: &BTreeMap<String, String>,
    ) -> Response<Body> {
        if let Some(sel) = q.get("labelSelector")
            && let Err(e) = parse_selector(sel)
        {
            return error(StatusCode::BAD_REQUEST, "BadRequest", &e);
        }
        let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
        let from: Option<u64> = q
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .filter(|v| *v > 0);
        // Subscribe before reading history so nothing falls between the two.
        let mut live = self.events.subscribe();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(256);
        let bookmark_version = k.api_version(version);
        let version = version.to_owned();
        let line =
            |t: &str, o: &Value| Bytes::from(format!("{}\n", json!({"type": t, "object": o})));
        let stored_line = move |t: &str, o: &Stored| {
            Bytes::from(format!(
                "{{\"type\":\"{t}\",\"object\":{}}}\n",
                o.text_in(k, &version)
            ))
        };
        let mut backlog = Vec::new();
        let mut last;
        {
            let store = self.lock();
            match from {
                Some(rv) => {
                    let oldest = store.history.front().map_or(store.rv, |e| e.rv);
                    if rv + 1 < oldest {
                        let gone = status(
                            StatusCode::GONE,
                            "Expired",
                            &format!("too old resource version: {rv} ({})", oldest - 1),
                        );
                        backlog.push(line("ERROR", &gone));
                        last = u64::MAX;
                    } else {
                        for e in store
                            .history
                            .iter()
                            .filter(|e| e.rv > rv && e.resource == k)
                        {
                            if self
                                .matching(k, namespace, q, &e.object.index)
                                .unwrap_or(false)
                            {
                                backlog.push(stored_line(e.kind, &e.object));
                            }
                        }
                        last = store.rv;
                    }
                }
                None => {
                    // No resourceVersion: synthetic ADDED for everything, then changes.
                    for (_, o) in store.of(k) {
                        if self.matching(k, namespace, q, &o.index).unwrap_or(false) {
                            backlog.push(stored_line("ADDED", o));
                        }
                    }
                    last = store.rv;
                }
            }
        }
        let shared = self.clone();
        let namespace = namespace.map(str::to_owned);
        let q = q.clone();
        tokio::spawn(async move {
            for b in backlog {
                if tx.send(Ok(Frame::data(b))).await.is_err() {
                    return;
                }
            }
            if last == u64::MAX {
                return;
            }
            let mut tick = tokio::time::interval(shared.bookmark_every);
            loop {
                tokio::select! {
                    e = live.recv() => match e {
                        Ok(e) if e.rv > last && e.resource == k => {
                            last = e.rv;
                            if shared.matching(k, namespace.as_deref(), &q, &e.object.index).unwrap_or(false)
                                && tx.send(Ok(Frame::data(stored_line(e.kind, &e.object)))).await.is_err()
                            {
                                return;
                            }
                        }
                        Ok(_) => {}
                        Err(broadcast::error::RecvError::Lagged(_)) => {
                            let gone = status(StatusCode::GONE, "Expired", "watch fell behind");
                            let _ = tx.send(Ok(Frame::data(line("ERROR", &gone)))).await;
                            return;
                        }
                        Err(broadcast::error::RecvError::Closed) => return,
                    },
                    _ = tick.tick(), if bookmarks => {
                        let rv = shared.lock().rv;
                        let b = json!({"kind": k.kind, "apiVersion": bookmark_version, "metadata": {"resourceVersion": rv.to_string()}});
                        if tx.send(Ok(Frame::data(line("BOOKMARK", &b)))).await.is_err() {
                            return;
                        }
                    }
                    _ = tx.closed() => return,
                }
            }
        });
        let stream =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|f| (f, rx)) },
            );
        let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        r
    }
}
