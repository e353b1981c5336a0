//! Tests of the graph's actions: `e`, deletions, recreations, unchanged payloads and roots.

use super::*;

fn gvrs() -> Arc<[Gvr]> {
    let g = |group: &str, resource: &str, kind: &str| Gvr {
        group: group.into(),
        version: "v1".into(),
        resource: resource.into(),
        kind: kind.into(),
        namespaced: true,
        query: 0,
    };
    vec![
        g("", "pods", "Pod"),
        g("apps", "replicasets", "ReplicaSet"),
        g("apps", "deployments", "Deployment"),
        g("", "configmaps", "ConfigMap"),
    ]
    .into()
}

fn key(gvr: u16, name: &str) -> VertexKey {
    VertexKey::new(gvr, "ns".into(), name)
}

fn node(root: bool, out: Vec<OutArc>) -> Node {
    Node {
        payload: Payload::Object(b"{}".to_vec().into()),
        root,
        out: out.into(),
        watch: 0,
        generation: 0,
    }
}

fn arc(to: VertexKey, arc: ArcType) -> OutArc {
    OutArc {
        to,
        arc,
        flags: OwnerFlags::default(),
    }
}

/// Actions as short strings: `svx pods/p`, `sarc pods/p->configmaps/c r e`.
fn show(actions: &[Action]) -> Vec<String> {
    let v = |x: &Option<action::Vertex>| {
        let x = x.as_ref().expect("vertex");
        format!("{}/{}", x.resource, x.name)
    };
    actions
        .iter()
        .map(|a| match a.action.as_ref().expect("action") {
            action::Action::SetVertex(s) => format!("svx {}", v(&s.vertex)),
            action::Action::DeleteVertex(d) => format!("dvx {}", v(&d.vertex)),
            action::Action::SetArc(s) => format!(
                "sarc {}->{} {}{}{}{}",
                v(&s.source),
                v(&s.destination),
                s.r#type,
                if s.controller { " c" } else { "" },
                if s.block_owner_deletion { " b" } else { "" },
                if s.destination_does_not_exist {
                    " e"
                } else {
                    ""
                }
            ),
            action::Action::DeleteArc(d) => {
                format!("darc {}->{} {}", v(&d.source), v(&d.destination), d.r#type)
            }
        })
        .collect()
}

#[test]
fn e_is_set_while_the_destination_is_missing_and_cleared_when_it_appears() {
    let mut g = Graph::new(gvrs(), None);
    g.upsert(
        key(0, "p"),
        node(false, vec![arc(key(3, "cm"), ArcType::Reference)]),
    );
    assert_eq!(
        show(&g.flush()),
        ["svx pods/p", "sarc pods/p->configmaps/cm r e"]
    );
    g.upsert(key(3, "cm"), node(false, vec![]));
    assert_eq!(
        show(&g.flush()),
        ["svx configmaps/cm", "sarc pods/p->configmaps/cm r"]
    );
    // Deleted again: the vertex goes, the arc comes back with `e`.
    g.remove(&key(3, "cm"));
    assert_eq!(
        show(&g.flush()),
        ["dvx configmaps/cm", "sarc pods/p->configmaps/cm r e"]
    );
    assert!(g.flush().is_empty(), "nothing left to send");
}

#[test]
fn deleting_a_source_sends_darc_then_dvx() {
    let mut g = Graph::new(gvrs(), None);
    let mut owner = arc(key(1, "rs"), ArcType::OwnerReference);
    owner.flags.controller = true;
    g.upsert(key(1, "rs"), node(false, vec![]));
    g.upsert(key(0, "p"), node(false, vec![owner]));
    let first = show(&g.flush());
    assert!(
        first.contains(&"sarc pods/p->replicasets/rs or c".to_owned()),
        "{first:?}"
    );
    g.remove(&key(0, "p"));
    assert_eq!(
        show(&g.flush()),
        ["darc pods/p->replicasets/rs or", "dvx pods/p"]
    );
}

#[test]
fn deleted_and_recreated_within_a_batch_is_sent_again() {
    let mut g = Graph::new(gvrs(), None);
    g.upsert(key(3, "cm"), node(false, vec![]));
    g.flush();
    g.remove(&key(3, "cm"));
    let mut n = node(false, vec![]);
    n.payload = Payload::Object(b"{\"v\":2}".to_vec().into());
    g.upsert(key(3, "cm"), n);
    assert_eq!(show(&g.flush()), ["svx configmaps/cm"]);
}

#[test]
fn unchanged_objects_send_nothing_and_changed_payloads_resend_svx() {
    let mut g = Graph::new(gvrs(), None);
    g.upsert(key(3, "cm"), node(false, vec![]));
    g.flush();
    assert!(
        matches!(g.nodes[&key(3, "cm")].payload, Payload::Sent(_)),
        "without roots only a digest of a sent payload is kept"
    );
    g.upsert(key(3, "cm"), node(false, vec![]));
    assert!(g.flush().is_empty());
    let mut n = node(false, vec![]);
    n.payload = Payload::Object(b"{\"a\":1}".to_vec().into());
    g.upsert(key(3, "cm"), n);
    assert_eq!(show(&g.flush()), ["svx configmaps/cm"]);
}

#[test]
fn roots_follow_arc_direction_unless_ignored() {
    // Pod -> RS -> Deployment (owner references point up); Deployment is root.
    let build = |ignore: &[ArcType]| {
        let mut g = Graph::new(gvrs(), Some(ignore));
        g.upsert(key(2, "web"), node(true, vec![]));
        g.upsert(
            key(1, "rs"),
            node(false, vec![arc(key(2, "web"), ArcType::OwnerReference)]),
        );
        g.upsert(
            key(0, "p"),
            node(false, vec![arc(key(1, "rs"), ArcType::OwnerReference)]),
        );
        g
    };
    let mut g = build(&[]);
    assert_eq!(show(&g.flush()), ["svx deployments/web"]);
    let mut g2 = build(&[ArcType::OwnerReference]);
    let mut got = show(&g2.flush());
    got.sort();
    assert_eq!(
        got,
        [
            "sarc pods/p->replicasets/rs or",
            "sarc replicasets/rs->deployments/web or",
            "svx deployments/web",
            "svx pods/p",
            "svx replicasets/rs",
        ]
    );
    // The root stops being one: everything it made visible leaves.
    g2.upsert(key(2, "web"), node(false, vec![]));
    let mut got = show(&g2.flush());
    got.sort();
    assert_eq!(
        got,
        [
            "darc pods/p->replicasets/rs or",
            "darc replicasets/rs->deployments/web or",
            "dvx deployments/web",
            "dvx pods/p",
            "dvx replicasets/rs",
        ]
    );
}
