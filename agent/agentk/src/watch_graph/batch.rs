//! Batches: the actions and warnings of one flush split into
//! [`WatchGraphResponse`] messages, each small enough that kas's JSON text message
//! stays under the limit. The JSON kas writes for an action is its payload plus the
//! names and a fixed overhead, so the estimate below bounds it from above.

use prost::Message as _;

use podgate_agent::proto::kubernetes_api::{Action, Warning, WatchGraphResponse, action};

/// JSON overhead of one action beyond its names and payload (keys, quotes, braces).
const ACTION_OVERHEAD: usize = 160;

fn vertex_len(v: Option<&action::Vertex>) -> usize {
    v.map_or(0, |v| {
        v.group.len() + v.version.len() + v.resource.len() + v.namespace.len() + v.name.len()
    })
}

/// An upper bound of the JSON size of `a` in kas's message.
fn estimate(a: &Action) -> usize {
    ACTION_OVERHEAD
        + match &a.action {
            Some(action::Action::SetVertex(s)) => {
                vertex_len(s.vertex.as_ref()) + s.object_json.len() + s.json_path_json.len()
            }
            Some(action::Action::DeleteVertex(d)) => vertex_len(d.vertex.as_ref()),
            Some(action::Action::SetArc(s)) => {
                vertex_len(s.source.as_ref()) + vertex_len(s.destination.as_ref())
            }
            Some(action::Action::DeleteArc(d)) => {
                vertex_len(d.source.as_ref()) + vertex_len(d.destination.as_ref())
            }
            None => 0,
        }
}

fn warning_estimate(w: &Warning) -> usize {
    ACTION_OVERHEAD
        + w.message.len()
        + w.attributes
            .iter()
            .map(|(k, v)| k.len() + v.len() + 8)
            .sum::<usize>()
}

/// Split into encoded messages of at most `max_bytes` each (estimated as JSON).
/// A vertex whose payload alone would exceed it is sent without its payload and
/// with an `OBJECT_PROCESSING_FAILED` warning. Warnings go in the first message.
pub fn encode_batches(
    actions: Vec<Action>,
    mut warnings: Vec<Warning>,
    max_bytes: usize,
) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut current = WatchGraphResponse::default();
    let mut size = 64;
    let mut oversize = Vec::new();
    for mut a in actions {
        let mut est = estimate(&a);
        if est + 64 > max_bytes
            && let Some(action::Action::SetVertex(s)) = &mut a.action
        {
            s.object_json.clear();
            s.json_path_json.clear();
            if let Some(v) = &s.vertex {
                oversize.push(Warning {
                    r#type: "OBJECT_PROCESSING_FAILED".into(),
                    message: format!(
                        "object {}/{} is larger than a message may be ({max_bytes} bytes); sent without its contents",
                        v.resource, v.name
                    ),
                    attributes: [
                        ("g", &v.group),
                        ("v", &v.version),
                        ("r", &v.resource),
                        ("ns", &v.namespace),
                        ("n", &v.name),
                    ]
                    .into_iter()
                    .filter(|(_, x)| !x.is_empty())
                    .map(|(k, x)| (k.to_owned(), x.clone()))
                    .collect(),
                });
            }
            est = estimate(&a);
        }
        if size + est > max_bytes && !current.actions.is_empty() {
            out.push(std::mem::take(&mut current));
            size = 64;
        }
        size += est;
        current.actions.push(a);
    }
    warnings.extend(oversize);
    if !current.actions.is_empty() || out.is_empty() {
        out.push(current);
    }
    // Warnings: into the first message while it has room, else messages of their own.
    let mut first_size: usize = out[0].actions.iter().map(estimate).sum::<usize>() + 64;
    let mut extra: Vec<WatchGraphResponse> = Vec::new();
    for w in warnings {
        let est = warning_estimate(&w);
        if first_size + est <= max_bytes {
            first_size += est;
            out[0].warnings.push(w);
        } else {
            match extra.last_mut() {
                Some(m)
                    if m.warnings.iter().map(warning_estimate).sum::<usize>() + est
                        <= max_bytes =>
                {
                    m.warnings.push(w);
                }
                _ => extra.push(WatchGraphResponse {
                    actions: Vec::new(),
                    warnings: vec![w],
                }),
            }
        }
    }
    out.extend(extra);
    out.into_iter().map(|m| m.encode_to_vec()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svx(name: &str, bytes: usize) -> Action {
        Action {
            action: Some(action::Action::SetVertex(action::SetVertex {
                vertex: Some(action::Vertex {
                    group: String::new(),
                    version: "v1".into(),
                    resource: "configmaps".into(),
                    namespace: "ns".into(),
                    name: name.into(),
                }),
                object_json: vec![b' '; bytes],
                json_path_json: Vec::new(),
            })),
        }
    }

    #[test]
    fn batches_stay_under_the_limit_and_keep_order() {
        let actions: Vec<Action> = (0..100).map(|i| svx(&format!("cm{i}"), 10_000)).collect();
        let msgs = encode_batches(actions, Vec::new(), 100_000);
        assert!(msgs.len() >= 10, "{} messages", msgs.len());
        let mut names = Vec::new();
        for m in &msgs {
            let r = WatchGraphResponse::decode(m.as_slice()).expect("decodes");
            let est: usize = r.actions.iter().map(estimate).sum();
            assert!(est + 64 <= 100_000);
            for a in r.actions {
                if let Some(action::Action::SetVertex(s)) = a.action {
                    names.push(s.vertex.expect("vertex").name);
                }
            }
        }
        let want: Vec<String> = (0..100).map(|i| format!("cm{i}")).collect();
        assert_eq!(names, want);
    }

    #[test]
    fn an_oversized_object_is_sent_without_contents_and_warned() {
        let msgs = encode_batches(vec![svx("big", 2_000_000)], Vec::new(), 1024 * 1024);
        assert_eq!(msgs.len(), 1);
        let r = WatchGraphResponse::decode(msgs[0].as_slice()).expect("decodes");
        let Some(action::Action::SetVertex(s)) = &r.actions[0].action else {
            panic!("not a svx");
        };
        assert!(s.object_json.is_empty());
        assert_eq!(r.warnings[0].r#type, "OBJECT_PROCESSING_FAILED");
    }
}
