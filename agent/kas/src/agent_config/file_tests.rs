use prost::Message as _;

use super::*;

/// Every field of GitLab's `ConfigurationFile`, as an operator writes it.
const FULL: &str = r#"
gitops:
  manifest_projects:
    - id: group/manifests
      default_namespace: apps
      paths:
        - glob: "/deploy/**/*.yaml"
      reconcile_timeout: 1h
      dry_run_strategy: server
      prune: false
      prune_timeout: 90s
      prune_propagation_policy: foreground
      inventory_policy: adopt_all
      ref:
        branch: main
observability:
  logging:
    level: debug
    grpc_level: warn
  google_profiler:
    enabled: true
    project_id: profiler-project
    credentials_file: /creds.json
    debug_logging: true
ci_access:
  projects:
    - id: group/app
      default_namespace: ci
      access_as:
        impersonate:
          username: deployer
          groups: [deployers]
          uid: "1000"
          extra:
            - key: team
              val: [platform]
      environments: [production, "review/*"]
  groups:
    - id: group
      access_as:
        ci_job: {}
user_access:
  access_as:
    user: {}
  projects:
    - id: group/app
  groups:
    - id: group
container_scanning:
  cadence: "0 0 * * *"
  vulnerability_report:
    namespaces: [default]
    filters:
      - namespaces: [kube-system]
        resources: [Deployment/coredns]
        containers: [coredns]
        kinds: [Deployment]
  resource_requirements:
    limits: {cpu: 500m, memory: 1Gi}
    requests: {cpu: 100m, memory: 128Mi}
remote_development:
  enabled: true
  dns_zone: workspaces.example.com
  partial_sync_interval: 10s
  full_sync_interval: 1.5s
  gitlab_workspaces_proxy:
    namespace: gitlab-workspaces
  network_policy:
    enabled: false
flux:
  webhook_receiver_url: http://receiver.flux-system
"#;

fn secs(seconds: i64, nanos: i32) -> Option<prost_types::Duration> {
    Some(prost_types::Duration { seconds, nanos })
}

#[test]
fn every_field_maps_to_gitlabs_protobuf_and_survives_the_wire() {
    // `1h` is not a protobuf duration: GitLab refuses it too.
    let err = parse(FULL).unwrap_err().to_string();
    assert!(
        err.contains("gitops.manifest_projects[0].reconcile_timeout") && err.contains("\"1h\""),
        "{err}"
    );
    let parsed = parse(&FULL.replace("reconcile_timeout: 1h", "reconcile_timeout: 3600s")).unwrap();
    let f = &parsed.file;

    let p = &f.gitops.as_ref().unwrap().manifest_projects[0];
    assert_eq!(p.id.as_deref(), Some("group/manifests"));
    assert_eq!(p.default_namespace, "apps");
    assert_eq!(p.paths[0].glob, "/deploy/**/*.yaml");
    assert_eq!(p.reconcile_timeout, secs(3600, 0));
    assert_eq!(p.dry_run_strategy, "server");
    assert_eq!(
        p.prune_oneof,
        Some(cfg::manifest_project_cf::PruneOneof::Prune(false))
    );
    assert_eq!(p.prune_timeout, secs(90, 0));
    assert_eq!(p.prune_propagation_policy, "foreground");
    assert_eq!(p.inventory_policy, "adopt_all");
    assert_eq!(
        p.r#ref.as_ref().unwrap().r#ref,
        Some(cfg::git_ref_cf::Ref::Branch("main".into()))
    );

    let o = f.observability.as_ref().unwrap();
    let logging = o.logging.as_ref().unwrap();
    assert_eq!(logging.level, cfg::LogLevelEnum::Debug as i32);
    assert_eq!(logging.grpc_level, Some(cfg::LogLevelEnum::Warn as i32));
    let g = o.google_profiler.as_ref().unwrap();
    assert!(g.enabled && g.debug_logging);
    assert_eq!(
        (g.project_id.as_str(), g.credentials_file.as_str()),
        ("profiler-project", "/creds.json")
    );

    let ci = f.ci_access.as_ref().unwrap();
    let project = &ci.projects[0];
    assert_eq!(
        (project.id.as_str(), project.default_namespace.as_str()),
        ("group/app", "ci")
    );
    assert_eq!(project.environments, ["production", "review/*"]);
    let Some(cfg::ci_access_as_cf::As::Impersonate(i)) = &project.access_as.as_ref().unwrap().r#as
    else {
        panic!("impersonate: {project:?}");
    };
    assert_eq!(
        (i.username.as_str(), i.uid.as_str(), i.groups.as_slice()),
        ("deployer", "1000", ["deployers".to_owned()].as_slice())
    );
    assert_eq!(
        (i.extra[0].key.as_str(), i.extra[0].val.as_slice()),
        ("team", ["platform".to_owned()].as_slice())
    );
    assert_eq!(ci.groups[0].id, "group");
    assert_eq!(
        ci.groups[0].access_as.as_ref().unwrap().r#as,
        Some(cfg::ci_access_as_cf::As::CiJob(cfg::CiAccessAsCiJobCf {}))
    );

    let u = f.user_access.as_ref().unwrap();
    assert_eq!(
        u.access_as.as_ref().unwrap().r#as,
        Some(cfg::user_access_as_cf::As::User(cfg::UserAccessAsUserCf {}))
    );
    assert_eq!(u.projects[0].id, "group/app");
    assert_eq!(u.groups[0].id, "group");

    let cs = f.container_scanning.as_ref().unwrap();
    assert_eq!(cs.cadence, "0 0 * * *");
    let report = cs.vulnerability_report.as_ref().unwrap();
    assert_eq!(report.namespaces, ["default"]);
    assert_eq!(report.filters[0].resources, ["Deployment/coredns"]);
    assert_eq!(report.filters[0].kinds, ["Deployment"]);
    let rr = cs.resource_requirements.as_ref().unwrap();
    assert_eq!(rr.limits.as_ref().unwrap().memory, "1Gi");
    assert_eq!(rr.requests.as_ref().unwrap().cpu, "100m");

    let rd = f.remote_development.as_ref().unwrap();
    assert!(rd.enabled);
    assert_eq!(rd.dns_zone, "workspaces.example.com");
    assert_eq!(rd.partial_sync_interval, secs(10, 0));
    assert_eq!(rd.full_sync_interval, secs(1, 500_000_000));
    assert_eq!(
        rd.gitlab_workspaces_proxy.as_ref().unwrap().namespace,
        "gitlab-workspaces"
    );
    assert_eq!(rd.network_policy.as_ref().unwrap().enabled, Some(false));

    assert_eq!(
        f.flux.as_ref().unwrap().webhook_receiver_url,
        "http://receiver.flux-system"
    );

    // The protobuf survives its own wire unchanged.
    let bytes = f.encode_to_vec();
    assert_eq!(
        &cfg::ConfigurationFile::decode(bytes.as_slice()).unwrap(),
        f
    );
    // And the JSON posted to GitLab is the file's.
    assert_eq!(
        parsed.json["remote_development"]["dns_zone"],
        "workspaces.example.com"
    );
}

#[test]
fn an_empty_file_is_the_empty_configuration() {
    for empty in ["", "\n", "# nothing yet\n", "~\n", "null"] {
        let parsed = parse(empty).unwrap();
        assert_eq!(parsed.file, cfg::ConfigurationFile::default(), "{empty:?}");
        assert_eq!(parsed.json, serde_json::json!({}));
    }
}

#[test]
fn what_protojson_refuses_is_refused() {
    let refused = |yaml: &str, says: &str| {
        let e = parse(yaml).unwrap_err().to_string();
        assert!(e.contains(says), "{yaml:?}: {e}");
    };
    refused("- a\n- b\n", "must be a mapping");
    refused("a: [unclosed\n", "YAMLToJSON");
    refused("gitopz: {}\n", "unknown field `gitopz`");
    // Only GitLab's snake_case json_names.
    refused(
        "remote_development:\n  dnsZone: x\n",
        "unknown field `dnsZone`",
    );
    refused("remote_development:\n  enabled: yes please\n", "protojson");
    // No coercion from numbers to strings.
    refused("ci_access:\n  projects:\n    - id: 42\n", "protojson");
    refused(
        "observability:\n  logging:\n    level: loud\n",
        "unknown log level",
    );
    refused(
        "ci_access:\n  projects:\n    - id: a\n      access_as: {agent: {}, ci_job: {}}\n",
        "exactly one of agent, impersonate, ci_job",
    );
    refused(
        "user_access:\n  access_as: {}\n",
        "exactly one of agent, user",
    );
    refused(
        "remote_development:\n  full_sync_interval: 0s\n",
        "full_sync_interval: must be greater than 0s",
    );
    refused(
        "gitops:\n  manifest_projects:\n    - dry_run_strategy: maybe\n",
        "dry_run_strategy",
    );
    refused(
        "container_scanning: {}\n",
        "container_scanning.cadence: must not be empty",
    );
    // Every broken rule at once.
    let e = parse("ci_access:\n  projects:\n    - id: \"\"\n  groups:\n    - id: \"\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ci_access.projects[0].id") && e.contains("ci_access.groups[0].id"),
        "{e}"
    );
}

#[test]
fn nulls_are_defaults_and_enums_take_numbers() {
    let parsed = parse(
        "remote_development:\n  enabled: null\n  dns_zone: ~\nobservability:\n  logging:\n    level: 3\n",
    )
    .unwrap();
    let rd = parsed.file.remote_development.unwrap();
    assert!(!rd.enabled && rd.dns_zone.is_empty());
    assert_eq!(
        parsed.file.observability.unwrap().logging.unwrap().level,
        cfg::LogLevelEnum::Error as i32
    );
}

#[test]
fn durations_are_protobuf_json_durations() {
    let mut bad = Vec::new();
    assert_eq!(duration("d", "0.000000001s", &mut bad), secs(0, 1));
    assert_eq!(duration("d", "-2.5s", &mut bad), secs(-2, -500_000_000));
    assert!(bad.is_empty());
    for wrong in ["10", "1m", "1.s", ".5s", "1.0000000001s", "s", "+1s"] {
        assert_eq!(duration("d", wrong, &mut bad), None, "{wrong}");
    }
    assert_eq!(bad.len(), 7);
}
