//! Tests of the objects, their inclusion, the YAML and the max-resources digest.

use std::collections::BTreeSet;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

use super::super::model::{
    ActualState, DesiredState, EgressRule, ImagePullSecret, Workspace, WorkspaceSpec,
    WorkspacesAgentConfig,
};
use super::max_resources::{ruby_inspect, ruby_string, ruby_symbol};
use super::*;

fn workspace(desired: DesiredState) -> Workspace {
    let mut spec = WorkspaceSpec {
        ports: vec![3000, 8080],
        ..WorkspaceSpec::default()
    };
    spec.env.insert("GREETING".into(), "hello".into());
    spec.files
        .insert("config.json".into(), "{\"a\": 1}\n".into());
    Workspace {
        id: 7,
        name: "workspace-1-2-abcdef".into(),
        namespace: "gl-rd-ns-1-2-abcdef".into(),
        agent_id: 1,
        user_id: 2,
        spec,
        url: "https://60001-workspace-1-2-abcdef.workspaces.example.dev/".into(),
        desired_state: desired,
        desired_state_updated_at: 1_000,
        actual_state: ActualState::Running,
        actual_state_updated_at: 1_000,
        responded_to_agent_at: None,
        deployment_resource_version: None,
        force_include_all_resources: false,
        created_at: 1_000,
    }
}

fn agent() -> WorkspacesAgentConfig {
    let mut a = WorkspacesAgentConfig {
        agent_id: 1,
        enabled: true,
        dns_zone: "workspaces.example.dev".into(),
        max_resources_per_workspace: json!({
            "requests": {"memory": "1Gi", "cpu": "1"},
            "limits": {"memory": "4Gi", "cpu": "2"},
        }),
        image_pull_secrets: vec![ImagePullSecret {
            name: "registry-creds".into(),
            namespace: "default".into(),
        }],
        ..WorkspacesAgentConfig::default()
    };
    a.labels.insert("team".into(), "dev".into());
    a.annotations.insert("owner".into(), "platform".into());
    a
}

fn kinds(objects: &[Value]) -> Vec<String> {
    objects
        .iter()
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect()
}

fn find<'v>(objects: &'v [Value], kind: &str) -> &'v Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
}

const N: &str = "workspace-1-2-abcdef";

#[test]
fn replicas_follow_the_desired_state() {
    // §8 behaviour 13.
    for (desired, replicas) in [
        (DesiredState::Running, 1),
        (DesiredState::Stopped, 0),
        (DesiredState::RestartRequested, 0),
        (DesiredState::Terminated, 0),
    ] {
        for inclusion in [Inclusion::Partial, Inclusion::All] {
            let objects = desired_config(&workspace(desired), &agent(), inclusion);
            let d = find(&objects, "Deployment");
            assert_eq!(d["spec"]["replicas"], replicas, "{desired:?} {inclusion:?}");
        }
    }
}

#[test]
fn labels_and_owning_inventories() {
    // §8 behaviour 14.
    let objects = desired_config(&workspace(DesiredState::Running), &agent(), Inclusion::All);
    assert_eq!(objects.len(), 10, "{:?}", kinds(&objects));
    for o in &objects {
        let md = &o["metadata"];
        let name = md["name"].as_str().unwrap();
        assert_eq!(md["labels"][LABEL_AGENT_ID], "1", "{name}");
        assert_eq!(md["labels"]["team"], "dev", "{name}");
        assert_eq!(md["annotations"]["owner"], "platform", "{name}");
        assert_eq!(md["namespace"], "gl-rd-ns-1-2-abcdef", "{name}");
        assert_eq!(md["annotations"][WORKSPACE_ID_KEY], "7", "{name}");
        assert_eq!(
            md["annotations"][ANNOTATION_HOST_TEMPLATE],
            format!("{{{{.port}}}}-{N}.workspaces.example.dev"),
        );
        let inventory = md["labels"].get(LABEL_INVENTORY_ID);
        let owner = md["annotations"].get(ANNOTATION_OWNING_INVENTORY);
        if o["kind"] == "ConfigMap" {
            assert_eq!(inventory.and_then(Value::as_str), Some(name));
            assert!(owner.is_none(), "{name} is an inventory");
        } else {
            assert!(inventory.is_none(), "{name}");
            let want = if o["kind"] == "Secret" {
                format!("{N}{SECRETS_INVENTORY_SUFFIX}")
            } else {
                format!("{N}{WORKSPACE_INVENTORY_SUFFIX}")
            };
            assert_eq!(owner.and_then(Value::as_str), Some(want.as_str()), "{name}");
        }
    }
}

#[test]
fn inclusion_table() {
    let ws = workspace(DesiredState::Running);
    let a = agent();
    assert!(desired_config(&ws, &a, Inclusion::Nothing).is_empty());
    let partial = vec![
        format!("ConfigMap/{N}-workspace-inventory"),
        format!("Deployment/{N}"),
        format!("Service/{N}"),
        format!("PersistentVolumeClaim/{N}-gl-workspace-data"),
        format!("ServiceAccount/{N}"),
        format!("NetworkPolicy/{N}"),
    ];
    assert_eq!(kinds(&desired_config(&ws, &a, Inclusion::Partial)), partial);
    let mut all = partial.clone();
    all.extend([
        format!("ConfigMap/{N}-secrets-inventory"),
        format!("ResourceQuota/{N}"),
        format!("Secret/{N}-env-var"),
        format!("Secret/{N}-file"),
    ]);
    assert_eq!(kinds(&desired_config(&ws, &a, Inclusion::All)), all);
    let terminated = workspace(DesiredState::Terminated);
    assert_eq!(
        kinds(&desired_config(&terminated, &a, Inclusion::InventoriesOnly)),
        [
            format!("ConfigMap/{N}-workspace-inventory"),
            format!("ConfigMap/{N}-secrets-inventory"),
        ]
    );
    // The partial set is exactly what carries the partial-reconciliation mark.
    for o in desired_config(&ws, &a, Inclusion::All) {
        let marked = o["metadata"]["annotations"]
            .get(ANNOTATION_INCLUDE_IN_PARTIAL)
            .is_some();
        let name = format!(
            "{}/{}",
            o["kind"].as_str().unwrap(),
            o["metadata"]["name"].as_str().unwrap()
        );
        assert_eq!(marked, partial.contains(&name), "{name}");
    }
}

#[test]
fn optional_objects() {
    // §8 behaviour 18: a partial for a Stopped workspace carries neither the
    // secrets inventory (whose arrival without Secrets would prune them) nor
    // the Secrets.
    let stopped = workspace(DesiredState::Stopped);
    let partial = desired_config(&stopped, &agent(), Inclusion::Partial);
    assert!(partial.iter().all(|o| o["kind"] != "Secret"));
    assert!(partial.iter().all(|o| {
        !o["metadata"]["name"]
            .as_str()
            .unwrap()
            .ends_with(SECRETS_INVENTORY_SUFFIX)
    }));
    // No NetworkPolicy when disabled; no ResourceQuota without limits or in a
    // shared namespace.
    let mut a = agent();
    a.network_policy_enabled = false;
    a.max_resources_per_workspace = json!({});
    let objects = desired_config(&stopped, &a, Inclusion::All);
    assert!(
        objects
            .iter()
            .all(|o| o["kind"] != "NetworkPolicy" && o["kind"] != "ResourceQuota")
    );
    let mut shared = agent();
    shared.shared_namespace = "workspaces".into();
    let objects = desired_config(&stopped, &shared, Inclusion::All);
    assert!(objects.iter().all(|o| o["kind"] != "ResourceQuota"));
    // Shared namespace: the workspace id becomes a label, selected by the
    // Deployment, Service and NetworkPolicy.
    let d = find(&objects, "Deployment");
    assert_eq!(d["spec"]["selector"]["matchLabels"][WORKSPACE_ID_KEY], "7");
    assert_eq!(
        find(&objects, "Service")["spec"]["selector"][WORKSPACE_ID_KEY],
        "7"
    );
    assert_eq!(
        find(&objects, "NetworkPolicy")["spec"]["podSelector"],
        json!({"matchLabels": {WORKSPACE_ID_KEY: "7"}})
    );
}

#[test]
fn deployment_shape() {
    let mut a = agent();
    a.default_resources_per_workspace_container =
        json!({"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "250m"}});
    let objects = desired_config(&workspace(DesiredState::Running), &a, Inclusion::All);
    let d = find(&objects, "Deployment");
    let pod = &d["spec"]["template"];
    // The Service selects what the pod template is labelled with.
    let svc = find(&objects, "Service");
    assert_eq!(svc["spec"]["selector"], pod["metadata"]["labels"]);
    assert_eq!(
        d["spec"]["selector"]["matchLabels"],
        pod["metadata"]["labels"]
    );
    assert_eq!(d["spec"]["strategy"]["type"], "Recreate");
    assert_eq!(d["metadata"]["creationTimestamp"], Value::Null);
    let spec = &pod["spec"];
    assert_eq!(spec["serviceAccountName"], N);
    assert_eq!(
        spec["securityContext"],
        json!({"runAsNonRoot": true, "runAsUser": 5001, "fsGroup": 0, "fsGroupChangePolicy": "OnRootMismatch"})
    );
    assert!(spec.get("hostUsers").is_none());
    let main = &spec["containers"][0];
    assert_eq!(main["image"], WorkspaceSpec::default().image);
    assert_eq!(
        main["envFrom"],
        json!([{"secretRef": {"name": format!("{N}-env-var")}}])
    );
    let ports: Vec<(&str, u64)> = main["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap(),
                p["containerPort"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        ports,
        [
            ("http-3000", 3000),
            ("http-8080", 8080),
            ("editor-server", 60001),
            ("ssh-server", 60022)
        ]
    );
    let svc_ports: Vec<(&str, u64, u64)> = svc["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap(),
                p["port"].as_u64().unwrap(),
                p["targetPort"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        svc_ports,
        [
            ("http-3000", 3000, 3000),
            ("http-8080", 8080, 8080),
            ("editor-server", 60001, 60001),
            ("ssh-server", 60022, 60022)
        ]
    );
    // Every container, init containers too: security context, mounts, envFrom,
    // default resources under the container's own.
    let init = &spec["initContainers"][0];
    for c in [main, init] {
        assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
        assert_eq!(c["securityContext"]["privileged"], false);
        assert_eq!(c["securityContext"]["runAsUser"], 5001);
        assert_eq!(c["volumeMounts"][1]["name"], "gl-workspace-variables");
        assert_eq!(
            c["volumeMounts"][1]["mountPath"],
            "/.workspace-data/variables/file"
        );
        assert_eq!(c["envFrom"][0]["secretRef"]["name"], format!("{N}-env-var"));
    }
    assert_eq!(
        main["resources"],
        a.default_resources_per_workspace_container
    );
    assert_eq!(
        init["resources"],
        json!({"limits": {"cpu": "500m", "memory": "512Mi"}, "requests": {"cpu": "100m", "memory": "256Mi"}})
    );
    let volumes = spec["volumes"].as_array().unwrap();
    assert_eq!(
        volumes[0]["persistentVolumeClaim"]["claimName"],
        format!("{N}-gl-workspace-data")
    );
    assert_eq!(
        volumes[1]["projected"],
        json!({"defaultMode": 508, "sources": [{"secret": {"name": format!("{N}-file")}}]})
    );
    // The PVC: spec.storage.
    assert_eq!(
        find(&objects, "PersistentVolumeClaim")["spec"]["resources"]["requests"]["storage"],
        "15Gi"
    );
    // Privilege escalation and user namespaces from the agent.
    a.allow_privilege_escalation = true;
    a.use_kubernetes_user_namespaces = true;
    let objects = desired_config(&workspace(DesiredState::Running), &a, Inclusion::Partial);
    let spec = &find(&objects, "Deployment")["spec"]["template"]["spec"];
    assert_eq!(
        spec["containers"][0]["securityContext"]["allowPrivilegeEscalation"],
        true
    );
    assert_eq!(spec["hostUsers"], true);
}

#[test]
fn duplicate_and_out_of_range_ports() {
    let mut ws = workspace(DesiredState::Running);
    ws.spec.ports = vec![3000, 60001, 3000, 60022, 70000];
    let objects = desired_config(&ws, &agent(), Inclusion::Partial);
    let names: Vec<&str> = find(&objects, "Service")["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["http-3000", "http-70000", "editor-server", "ssh-server"]
    );
}

#[test]
fn other_objects() {
    let objects = desired_config(&workspace(DesiredState::Running), &agent(), Inclusion::All);
    let sa = find(&objects, "ServiceAccount");
    assert_eq!(sa["automountServiceAccountToken"], false);
    assert_eq!(sa["imagePullSecrets"], json!([{"name": "registry-creds"}]));
    let np = find(&objects, "NetworkPolicy");
    assert_eq!(np["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    assert_eq!(
        np["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "gitlab-workspaces"
    );
    assert_eq!(
        np["spec"]["egress"][1]["to"][0]["ipBlock"],
        json!({"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]})
    );
    assert_eq!(np["spec"]["podSelector"], json!({}));
    let rq = find(&objects, "ResourceQuota");
    assert_eq!(
        rq["spec"]["hard"],
        json!({"limits.cpu": "2", "limits.memory": "4Gi", "requests.cpu": "1", "requests.memory": "1Gi"})
    );
    let env = objects
        .iter()
        .find(|o| o["metadata"]["name"] == format!("{N}-env-var"))
        .unwrap();
    assert_eq!(env["data"], json!({"GREETING": "aGVsbG8="}));
    let file = objects
        .iter()
        .find(|o| o["metadata"]["name"] == format!("{N}-file"))
        .unwrap();
    assert_eq!(
        file["data"],
        json!({"config.json": BASE64.encode("{\"a\": 1}\n"), RECONCILED_ACTUAL_STATE_FILE: "UnVubmluZw=="})
    );
    // Custom egress rules, one without exceptions.
    let mut a = agent();
    a.network_policy_egress = vec![EgressRule {
        allow: "10.1.0.0/16".into(),
        except: vec![],
    }];
    let objects = desired_config(&workspace(DesiredState::Running), &a, Inclusion::Partial);
    assert_eq!(
        find(&objects, "NetworkPolicy")["spec"]["egress"][1],
        json!({"to": [{"ipBlock": {"cidr": "10.1.0.0/16", "except": []}}]})
    );
}

#[test]
fn max_resources_digest_is_rubys() {
    // SHA-256 of "{}" (Rails' value for an agent without limits).
    assert_eq!(
        max_resources_sha256(&json!({})),
        "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    );
    let text = ruby_inspect(&deep_sort(&json!({
        "requests": {"memory": "1Gi", "cpu": "1"},
        "limits": {"memory": "4Gi", "cpu": 2},
    })));
    assert_eq!(
        text,
        r#"{:limits=>{:cpu=>2, :memory=>"4Gi"}, :requests=>{:cpu=>"1", :memory=>"1Gi"}}"#
    );
    assert_eq!(ruby_symbol("limits.cpu"), r#":"limits.cpu""#);
    assert_eq!(ruby_string("a\"#{b}\n"), r#""a\"\#{b}\n""#);
    // A change in limits changes the annotation (and so restarts the workspace).
    let mut a = agent();
    let before = desired_config(&workspace(DesiredState::Running), &a, Inclusion::Partial);
    a.max_resources_per_workspace["limits"]["cpu"] = json!("3");
    let after = desired_config(&workspace(DesiredState::Running), &a, Inclusion::Partial);
    let sha = |o: &[Value]| {
        find(o, "Deployment")["metadata"]["annotations"][ANNOTATION_MAX_RESOURCES_SHA256].clone()
    };
    assert_ne!(sha(&before), sha(&after));
}

#[test]
fn inclusion_for_workspace() {
    let mut ws = workspace(DesiredState::Running);
    // Never responded: everything, partial or full.
    assert_eq!(Inclusion::for_workspace(&ws, false), Inclusion::All);
    ws.responded_to_agent_at = Some(2_000);
    // Nothing changed since: nothing on a partial, everything on a full.
    assert_eq!(Inclusion::for_workspace(&ws, false), Inclusion::Nothing);
    assert_eq!(Inclusion::for_workspace(&ws, true), Inclusion::All);
    // Changed at the very moment of the response: not later, so not sent.
    ws.desired_state_updated_at = 2_000;
    assert_eq!(Inclusion::for_workspace(&ws, false), Inclusion::Nothing);
    // Desired state changed since: the partial set.
    ws.desired_state = DesiredState::Stopped;
    ws.desired_state_updated_at = 2_001;
    assert_eq!(Inclusion::for_workspace(&ws, false), Inclusion::Partial);
    // Actual state changed since: everything (the file Secret carries it).
    ws.actual_state_updated_at = 2_002;
    assert_eq!(Inclusion::for_workspace(&ws, false), Inclusion::All);
    ws.actual_state_updated_at = 1_000;
    ws.desired_state_updated_at = 1_000;
    ws.force_include_all_resources = true;
    assert_eq!(Inclusion::for_workspace(&ws, false), Inclusion::All);
    ws.force_include_all_resources = false;
    // Desired Terminated: the inventories, on every reconcile until terminated.
    ws.desired_state = DesiredState::Terminated;
    assert_eq!(
        Inclusion::for_workspace(&ws, false),
        Inclusion::InventoriesOnly
    );
    assert_eq!(
        Inclusion::for_workspace(&ws, true),
        Inclusion::InventoriesOnly
    );
    ws.actual_state = ActualState::Terminated;
    assert_eq!(Inclusion::for_workspace(&ws, false), Inclusion::Nothing);
    assert_eq!(
        Inclusion::for_workspace(&ws, true),
        Inclusion::InventoriesOnly
    );
}

#[test]
fn yaml_stream_round_trips() {
    let objects = desired_config(&workspace(DesiredState::Running), &agent(), Inclusion::All);
    let text = yaml_stream(&objects);
    assert!(text.starts_with("---\n"));
    assert_eq!(text.matches("---\n").count(), objects.len(), "{text}");
    let back: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .collect::<Vec<serde_yaml::Value>>()
        .into_iter()
        .map(|v| serde_json::to_value(v).unwrap())
        .collect();
    assert_eq!(back, objects);
    assert_eq!(yaml_stream(&[]), "");
}

#[test]
fn yaml_documents_are_deep_sorted_in_psych_shape() {
    let objects = desired_config(
        &workspace(DesiredState::Running),
        &agent(),
        Inclusion::Partial,
    );
    let text = yaml_stream(&objects[..1]);
    let want = format!(
        "---
apiVersion: v1
kind: ConfigMap
metadata:
  annotations:
    owner: platform
    workspaces.gitlab.com/host-template: '{{{{.port}}}}-{N}.workspaces.example.dev'
    workspaces.gitlab.com/id: '7'
    workspaces.gitlab.com/include-in-partial-reconciliation: 'true'
    workspaces.gitlab.com/max-resources-per-workspace-sha256: {sha}
  labels:
    agent.gitlab.com/id: '1'
    cli-utils.sigs.k8s.io/inventory-id: {N}-workspace-inventory
    team: dev
  name: {N}-workspace-inventory
  namespace: gl-rd-ns-1-2-abcdef
",
        sha = max_resources_sha256(&agent().max_resources_per_workspace)
    );
    assert_eq!(text, want);
    // Keys sorted at every depth (inside arrays too); arrays keep their order.
    let d = yaml_stream(&[find(&objects, "Deployment").clone()]);
    let top: Vec<&str> = d.lines().filter(|l| !l.starts_with(' ')).collect();
    assert_eq!(
        top,
        [
            "---",
            "apiVersion: apps/v1",
            "kind: Deployment",
            "metadata:",
            "spec:",
            "status: {}"
        ]
    );
    let container_keys: Vec<&str> = d
        .lines()
        .skip_while(|l| !l.starts_with("    spec:"))
        .skip(2)
        .take_while(|l| !l.starts_with("      initContainers:"))
        .filter(|l| l.len() > 8 && l.as_bytes()[8] != b' ' && l.as_bytes()[8] != b'-')
        .map(|l| {
            l.trim_start()
                .trim_start_matches("- ")
                .split(':')
                .next()
                .unwrap()
        })
        .collect();
    let mut sorted = container_keys.clone();
    sorted.sort();
    let distinct: BTreeSet<&str> = container_keys.iter().copied().collect();
    assert!(distinct.len() > 5, "{container_keys:?}\n{d}");
    assert_eq!(container_keys, sorted, "{d}");
}
