//! Tests of the served kinds and the discovery documents.

use serde_json::json;

use super::*;

#[test]
fn groups_are_discovered_with_their_preferred_version() {
    let list = discovery("/apis").unwrap();
    let example = list["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == EXAMPLE_GROUP)
        .unwrap();
    assert_eq!(
        example["versions"],
        json!([
            {"groupVersion": "example.podgate.dev/v1", "version": "v1"},
            {"groupVersion": "example.podgate.dev/v1beta1", "version": "v1beta1"},
        ])
    );
    assert_eq!(example["preferredVersion"]["version"], "v1");
    let apps = discovery("/apis/apps/v1").unwrap();
    assert_eq!(apps["groupVersion"], "apps/v1");
    let names: Vec<&str> = apps["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "deployments",
            "deployments/scale",
            "deployments/status",
            "replicasets",
            "replicasets/scale",
            "statefulsets",
            "statefulsets/scale",
            "daemonsets",
            "daemonsets/status"
        ]
    );
    assert!(discovery("/apis/apps/v2").is_none());
    assert!(discovery("/apis/example.podgate.dev/v1beta1").is_some());
    assert!(discovery("/openapi/v3/apis/apps/v1").is_some());
    assert_eq!(kind("deployments").unwrap().group, "apps");
    assert_eq!(kind("widgets.example.podgate.dev").unwrap().kind, "Widget");
    assert!(kind_named("example.podgate.dev/v1beta1", "Widget").is_some());
    assert!(kind_named("apps/v1beta1", "Deployment").is_none());
    assert!(kind_at("apps", "v1", "pods").is_none());
    // A plural served by two groups: the bare plural is the core one.
    assert_eq!(kind("events").unwrap().group, "");
    assert_eq!(kind("events.events.k8s.io").unwrap().group, "events.k8s.io");
    // The kinds Workspaces need, in discovery.
    for (gv, plural) in [
        ("/apis/coordination.k8s.io/v1", "leases"),
        ("/apis/networking.k8s.io/v1", "networkpolicies"),
        ("/api/v1", "resourcequotas"),
        ("/api/v1", "endpoints"),
        ("/apis/discovery.k8s.io/v1", "endpointslices"),
    ] {
        let list = discovery(gv).unwrap();
        assert!(
            list["resources"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["name"] == plural),
            "{gv} {plural}"
        );
    }
    assert!(
        discovery("/apis")
            .unwrap()
            .to_string()
            .contains("coordination.k8s.io/v1")
    );
}
