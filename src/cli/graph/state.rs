//! The graph as the client sees it (actions applied in order, as glab's
//! `graphBuilder.applyActions` does), the one-line text form of each action, and the
//! summary `podgate graph` prints at the end.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use podgate_agent::graph::wire::{Action, ArcAttrs, Message, Vertex, Warning};

/// An arc's identity: source, destination, type.
type ArcKey = (Vertex, Vertex, String);

/// The graph built from the messages so far, and what the summary reports.
#[derive(Debug, Default)]
pub(crate) struct GraphState {
    vertices: BTreeSet<Vertex>,
    arcs: BTreeMap<ArcKey, ArcAttrs>,
    /// (type, message with its attributes) → times received.
    warnings: BTreeMap<(String, String), u64>,
    messages: u64,
    bytes: u64,
    connect: Option<Duration>,
    first_message: Option<Duration>,
}

impl GraphState {
    /// A state for a connection that took `connect` to open.
    pub(crate) fn new(connect: Duration) -> Self {
        GraphState {
            connect: Some(connect),
            ..Default::default()
        }
    }

    /// Count a received text message of `len` bytes, `since_request` after the
    /// request was sent.
    pub(crate) fn received(&mut self, len: usize, since_request: Duration) {
        self.messages += 1;
        self.bytes += len as u64;
        self.first_message.get_or_insert(since_request);
    }

    /// Whether any message arrived.
    pub(crate) fn any_message(&self) -> bool {
        self.messages > 0
    }

    /// Apply `msg`'s actions in order and record its warnings.
    pub(crate) fn apply(&mut self, msg: &Message) {
        for w in &msg.warnings {
            *self
                .warnings
                .entry((w.t.clone(), warning_text(w)))
                .or_default() += 1;
        }
        for a in &msg.actions {
            match a {
                Action::Svx { vx, .. } => {
                    self.vertices.insert(vx.clone());
                }
                Action::Dvx { vx } => {
                    self.vertices.remove(vx);
                }
                Action::Sarc { s, d, t, a } => {
                    self.arcs
                        .insert((s.clone(), d.clone(), t.clone()), a.unwrap_or_default());
                }
                Action::Darc { s, d, t } => {
                    self.arcs.remove(&(s.clone(), d.clone(), t.clone()));
                }
            }
        }
    }

    /// The summary, several lines, each ending in `\n`.
    pub(crate) fn summary(&self) -> String {
        let mut s = String::new();
        let warnings: u64 = self.warnings.values().sum();
        let _ = write!(
            s,
            "summary: {} vertices, {} arcs, {} warnings; {} messages, {} bytes received",
            self.vertices.len(),
            self.arcs.len(),
            warnings,
            self.messages,
            self.bytes
        );
        if let Some(c) = self.connect {
            let _ = write!(s, "; connected in {} ms", c.as_millis());
        }
        match self.first_message {
            Some(d) => {
                let _ = writeln!(s, ", first message {} ms after the request", d.as_millis());
            }
            None => s.push_str(", no message received\n"),
        }

        let mut by_gr: BTreeMap<String, usize> = BTreeMap::new();
        for v in &self.vertices {
            *by_gr.entry(group_resource(v)).or_default() += 1;
        }
        s.push_str("vertices:");
        if by_gr.is_empty() {
            s.push_str(" none");
        }
        for (i, (gr, n)) in by_gr.iter().enumerate() {
            let _ = write!(s, "{} {gr} {n}", if i == 0 { "" } else { "," });
        }
        s.push('\n');

        let mut by_type: BTreeMap<&str, usize> = [("or", 0), ("r", 0), ("t", 0)].into();
        let mut missing = 0;
        for ((_, _, t), a) in &self.arcs {
            *by_type.entry(t.as_str()).or_default() += 1;
            missing += usize::from(a.e);
        }
        s.push_str("arcs:");
        // The three known types first, in the order GitLab's design lists them
        // (docs/graph-api.md §6), then any other.
        let known = ["or", "r", "t"];
        let order = known
            .iter()
            .copied()
            .chain(by_type.keys().copied().filter(|t| !known.contains(t)));
        for (i, t) in order.enumerate() {
            let _ = write!(s, "{} {t} {}", if i == 0 { "" } else { "," }, by_type[t]);
        }
        let _ = writeln!(s, "; with e {missing}");

        let mut by_type: BTreeMap<&str, u64> = BTreeMap::new();
        for ((t, _), n) in &self.warnings {
            *by_type.entry(t.as_str()).or_default() += n;
        }
        s.push_str("warnings:");
        if by_type.is_empty() {
            s.push_str(" none");
        }
        for (i, (t, n)) in by_type.iter().enumerate() {
            let _ = write!(s, "{} {t} {n}", if i == 0 { "" } else { "," });
        }
        s.push('\n');
        for ((t, text), n) in &self.warnings {
            let _ = write!(s, "  {t}: {text}");
            if *n > 1 {
                let _ = write!(s, " (x{n})");
            }
            s.push('\n');
        }
        s
    }
}

/// `apps/deployments`, or `pods` for the core group.
fn group_resource(v: &Vertex) -> String {
    if v.g.is_empty() {
        v.r.clone()
    } else {
        format!("{}/{}", v.g, v.r)
    }
}

/// `apps/v1/deployments myns/name`, `v1/pods myns/name`, `v1/namespaces name`.
pub(crate) fn vertex_text(v: &Vertex) -> String {
    let gvr = if v.g.is_empty() {
        format!("{}/{}", v.v, v.r)
    } else {
        format!("{}/{}/{}", v.g, v.v, v.r)
    };
    if v.ns.is_empty() {
        format!("{gvr} {}", v.n)
    } else {
        format!("{gvr} {}/{}", v.ns, v.n)
    }
}

/// The message and attributes of a warning: `text (g=apps ns=myns …)`.
fn warning_text(w: &Warning) -> String {
    if w.a.is_empty() {
        return w.m.clone();
    }
    let attrs: Vec<String> = w.a.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{} ({})", w.m, attrs.join(" "))
}

/// One line per warning, then one per action, in the message's order.
pub(crate) fn message_lines(msg: &Message) -> Vec<String> {
    let mut lines = Vec::with_capacity(msg.warnings.len() + msg.actions.len());
    for w in &msg.warnings {
        lines.push(format!("warning {}: {}", w.t, warning_text(w)));
    }
    for a in &msg.actions {
        lines.push(action_text(a));
    }
    lines
}

/// `svx apps/v1/deployments ns/name`, `sarc v1/pods ns/p -> apps/v1/replicasets ns/r or c b`.
pub(crate) fn action_text(a: &Action) -> String {
    match a {
        Action::Svx { vx, j, .. } => {
            let mut line = format!("svx {}", vertex_text(vx));
            if let Some(j) = j {
                let j = serde_json::to_string(j).unwrap_or_default();
                let _ = write!(line, " j={j}");
            }
            line
        }
        Action::Dvx { vx } => format!("dvx {}", vertex_text(vx)),
        Action::Sarc { s, d, t, a } => {
            let mut line = format!("sarc {} -> {} {t}", vertex_text(s), vertex_text(d));
            let a = a.unwrap_or_default();
            for (on, letter) in [(a.c, " c"), (a.b, " b"), (a.e, " e")] {
                if on {
                    line.push_str(letter);
                }
            }
            line
        }
        Action::Darc { s, d, t } => {
            format!("darc {} -> {} {t}", vertex_text(s), vertex_text(d))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(json: &str) -> Message {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn lines_and_summary() {
        let m = msg(r#"{"actions":[
                {"svx":{"vx":{"g":"apps","v":"v1","r":"deployments","ns":"myns","n":"d"},"o":{}}},
                {"svx":{"vx":{"v":"v1","r":"namespaces","n":"myns"},"j":["myns"]}},
                {"sarc":{"s":{"g":"","v":"v1","r":"pods","ns":"myns","n":"p"},"d":{"g":"apps","v":"v1","r":"deployments","ns":"myns","n":"d"},"t":"or","a":{"c":true,"b":true}}},
                {"sarc":{"s":{"g":"","v":"v1","r":"pods","ns":"myns","n":"p"},"d":{"g":"","v":"v1","r":"configmaps","ns":"myns","n":"c"},"t":"r","a":{"e":true}}}
            ],"warnings":[{"t":"DISCOVERY_FAILED","m":"partial"}]}"#);
        assert_eq!(
            message_lines(&m),
            [
                "warning DISCOVERY_FAILED: partial",
                "svx apps/v1/deployments myns/d",
                r#"svx v1/namespaces myns j=["myns"]"#,
                "sarc v1/pods myns/p -> apps/v1/deployments myns/d or c b",
                "sarc v1/pods myns/p -> v1/configmaps myns/c r e",
            ]
        );
        let mut st = GraphState::new(Duration::from_millis(3));
        st.received(100, Duration::from_millis(7));
        st.apply(&m);
        let s = st.summary();
        assert!(s.starts_with("summary: 2 vertices, 2 arcs, 1 warnings; 1 messages, 100 bytes received; connected in 3 ms, first message 7 ms after the request\n"), "{s}");
        assert!(
            s.contains("\nvertices: apps/deployments 1, namespaces 1\n"),
            "{s}"
        );
        assert!(s.contains("\narcs: or 1, r 1, t 0; with e 1\n"), "{s}");
        assert!(
            s.contains("\nwarnings: DISCOVERY_FAILED 1\n  DISCOVERY_FAILED: partial\n"),
            "{s}"
        );

        // A later e-less sarc replaces the arc; darc and dvx remove.
        st.apply(&msg(
            r#"{"actions":[
                {"sarc":{"s":{"g":"","v":"v1","r":"pods","ns":"myns","n":"p"},"d":{"g":"","v":"v1","r":"configmaps","ns":"myns","n":"c"},"t":"r"}},
                {"darc":{"s":{"g":"","v":"v1","r":"pods","ns":"myns","n":"p"},"d":{"g":"apps","v":"v1","r":"deployments","ns":"myns","n":"d"},"t":"or"}},
                {"dvx":{"vx":{"g":"apps","v":"v1","r":"deployments","ns":"myns","n":"d"}}}
            ]}"#,
        ));
        let s = st.summary();
        assert!(s.contains("\nvertices: namespaces 1\n"), "{s}");
        assert!(s.contains("\narcs: or 0, r 1, t 0; with e 0\n"), "{s}");
    }
}
