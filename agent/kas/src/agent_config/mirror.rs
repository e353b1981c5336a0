//! GitLab's `agentcfg.ConfigurationFile` as serde types with protobuf's JSON rules
//! (every field optional, unknown fields refused), and their conversion into the
//! generated protobuf with GitLab's validation rules ([`super`] explains why these
//! are written by hand).

use podgate_agent::proto::gitlab::agent::agentcfg as cfg;
use serde::Deserialize;

use super::{duration, items_non_empty, non_empty, one_of, positive};

/// A log level by name or number (`log_level_enum`).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum LogLevel {
    Name(String),
    Number(i32),
}

impl LogLevel {
    fn to_proto(&self, field: &str, bad: &mut Vec<String>) -> i32 {
        let known = match self {
            LogLevel::Name(n) => cfg::LogLevelEnum::from_str_name(n),
            LogLevel::Number(n) => cfg::LogLevelEnum::try_from(*n).ok(),
        };
        known.map_or_else(
            || {
                bad.push(format!("{field}: unknown log level {self:?}"));
                0
            },
            |l| l as i32,
        )
    }
}

macro_rules! mirror {
    ($(#[$doc:meta] $name:ident { $($field:ident: $ty:ty),* $(,)? })*) => {$(
        #[$doc]
        #[derive(Clone, Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub(super) struct $name { $($field: Option<$ty>),* }
    )*};
}

mirror! {
    /// `ConfigurationFile`.
    FileCf { gitops: GitopsCf, observability: ObservabilityCf, ci_access: CiAccessCf,
        container_scanning: ContainerScanningCf, user_access: UserAccessCf,
        remote_development: RemoteDevelopmentCf, flux: FluxCf }
    /// `GitopsCF`.
    GitopsCf { manifest_projects: Vec<ManifestProjectCf> }
    /// `ManifestProjectCF`.
    ManifestProjectCf { id: String, default_namespace: String, paths: Vec<PathCf>,
        reconcile_timeout: String, dry_run_strategy: String, prune: bool,
        prune_timeout: String, prune_propagation_policy: String,
        inventory_policy: String, r#ref: GitRefCf }
    /// `PathCF`.
    PathCf { glob: String }
    /// `GitRefCF` (a oneof: one of the three).
    GitRefCf { tag: String, branch: String, commit: String }
    /// `ObservabilityCF`.
    ObservabilityCf { logging: LoggingCf, google_profiler: GoogleProfilerCf }
    /// `LoggingCF`.
    LoggingCf { level: LogLevel, grpc_level: LogLevel }
    /// `GoogleProfilerCF`.
    GoogleProfilerCf { enabled: bool, project_id: String, credentials_file: String,
        debug_logging: bool }
    /// `CiAccessCF`.
    CiAccessCf { projects: Vec<CiAccessEntryCf>, groups: Vec<CiAccessEntryCf> }
    /// `CiAccessProjectCF` and `CiAccessGroupCF` (the same fields).
    CiAccessEntryCf { id: String, default_namespace: String, access_as: CiAccessAsCf,
        environments: Vec<String> }
    /// `CiAccessAsCF` (a required oneof).
    CiAccessAsCf { agent: Empty, impersonate: ImpersonateCf, ci_job: Empty }
    /// `CiAccessAsImpersonateCF`.
    ImpersonateCf { username: String, groups: Vec<String>, uid: String,
        extra: Vec<ExtraKeyValCf> }
    /// `ExtraKeyValCF`.
    ExtraKeyValCf { key: String, val: Vec<String> }
    /// `UserAccessCF`.
    UserAccessCf { access_as: UserAccessAsCf, projects: Vec<IdCf>, groups: Vec<IdCf> }
    /// `UserAccessProjectCF` and `UserAccessGroupCF`.
    IdCf { id: String }
    /// `UserAccessAsCF` (a required oneof).
    UserAccessAsCf { agent: Empty, user: Empty }
    /// `ContainerScanningCF`.
    ContainerScanningCf { vulnerability_report: VulnerabilityReportCf, cadence: String,
        resource_requirements: ResourceRequirementsCf }
    /// `VulnerabilityReport`.
    VulnerabilityReportCf { namespaces: Vec<String>, filters: Vec<FilterCf> }
    /// `ContainerScanningFilter`.
    FilterCf { namespaces: Vec<String>, resources: Vec<String>, containers: Vec<String>,
        kinds: Vec<String> }
    /// `ResourceRequirements`.
    ResourceRequirementsCf { limits: ResourceCf, requests: ResourceCf }
    /// `Resource`.
    ResourceCf { cpu: String, memory: String }
    /// `RemoteDevelopmentCF`.
    RemoteDevelopmentCf { enabled: bool, dns_zone: String, partial_sync_interval: String,
        full_sync_interval: String, gitlab_workspaces_proxy: WorkspacesProxyCf,
        network_policy: NetworkPolicyCf }
    /// `GitLabWorkspacesProxy`.
    WorkspacesProxyCf { namespace: String }
    /// `WorkspaceNetworkPolicy`.
    NetworkPolicyCf { enabled: bool }
    /// `FluxCF`.
    FluxCf { webhook_receiver_url: String }
}

/// A message without fields (`{}`), refusing any.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Empty {}

/// How many of a oneof's members are set.
fn members(set: &[bool]) -> usize {
    set.iter().filter(|s| **s).count()
}

impl FileCf {
    pub(super) fn into_proto(self, bad: &mut Vec<String>) -> cfg::ConfigurationFile {
        cfg::ConfigurationFile {
            gitops: self.gitops.map(|g| cfg::GitopsCf {
                manifest_projects: g
                    .manifest_projects
                    .unwrap_or_default()
                    .into_iter()
                    .enumerate()
                    .map(|(i, p)| p.into_proto(&format!("gitops.manifest_projects[{i}]"), bad))
                    .collect(),
            }),
            observability: self.observability.map(|o| cfg::ObservabilityCf {
                logging: o.logging.map(|l| cfg::LoggingCf {
                    level: l
                        .level
                        .map_or(0, |v| v.to_proto("observability.logging.level", bad)),
                    grpc_level: l
                        .grpc_level
                        .map(|v| v.to_proto("observability.logging.grpc_level", bad)),
                }),
                google_profiler: o.google_profiler.map(|g| cfg::GoogleProfilerCf {
                    enabled: g.enabled.unwrap_or_default(),
                    project_id: g.project_id.unwrap_or_default(),
                    credentials_file: g.credentials_file.unwrap_or_default(),
                    debug_logging: g.debug_logging.unwrap_or_default(),
                }),
            }),
            ci_access: self.ci_access.map(|c| cfg::CiAccessCf {
                projects: c
                    .projects
                    .unwrap_or_default()
                    .into_iter()
                    .enumerate()
                    .map(|(i, e)| {
                        let (id, default_namespace, access_as, environments) =
                            e.into_parts(&format!("ci_access.projects[{i}]"), bad);
                        cfg::CiAccessProjectCf {
                            id,
                            default_namespace,
                            access_as,
                            environments,
                        }
                    })
                    .collect(),
                groups: c
                    .groups
                    .unwrap_or_default()
                    .into_iter()
                    .enumerate()
                    .map(|(i, e)| {
                        let (id, default_namespace, access_as, environments) =
                            e.into_parts(&format!("ci_access.groups[{i}]"), bad);
                        cfg::CiAccessGroupCf {
                            id,
                            default_namespace,
                            access_as,
                            environments,
                        }
                    })
                    .collect(),
            }),
            container_scanning: self.container_scanning.map(|c| c.into_proto(bad)),
            user_access: self.user_access.map(|u| u.into_proto(bad)),
            remote_development: self.remote_development.map(|r| r.into_proto(bad)),
            flux: self.flux.map(|f| cfg::FluxCf {
                webhook_receiver_url: f.webhook_receiver_url.unwrap_or_default(),
            }),
        }
    }
}

impl ManifestProjectCf {
    fn into_proto(self, at: &str, bad: &mut Vec<String>) -> cfg::ManifestProjectCf {
        if let Some(id) = &self.id {
            non_empty(&format!("{at}.id"), id, bad);
        }
        let dry_run_strategy = self.dry_run_strategy.unwrap_or_default();
        one_of(
            &format!("{at}.dry_run_strategy"),
            &dry_run_strategy,
            &["", "none", "client", "server"],
            bad,
        );
        let prune_propagation_policy = self.prune_propagation_policy.unwrap_or_default();
        one_of(
            &format!("{at}.prune_propagation_policy"),
            &prune_propagation_policy,
            &["", "orphan", "background", "foreground"],
            bad,
        );
        let inventory_policy = self.inventory_policy.unwrap_or_default();
        one_of(
            &format!("{at}.inventory_policy"),
            &inventory_policy,
            &["", "must_match", "adopt_if_no_inventory", "adopt_all"],
            bad,
        );
        let paths = self
            .paths
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                let glob = p.glob.unwrap_or_default();
                non_empty(&format!("{at}.paths[{i}].glob"), &glob, bad);
                cfg::PathCf { glob }
            })
            .collect();
        let r#ref = self.r#ref.map(|r| {
            use cfg::git_ref_cf::Ref;
            let field = format!("{at}.ref");
            if members(&[r.tag.is_some(), r.branch.is_some(), r.commit.is_some()]) != 1 {
                bad.push(format!("{field}: exactly one of tag, branch, commit"));
            }
            let (name, value) = match (r.tag, r.branch, r.commit) {
                (Some(t), _, _) => ("tag", Ref::Tag(t)),
                (_, Some(b), _) => ("branch", Ref::Branch(b)),
                (_, _, Some(c)) => ("commit", Ref::Commit(c)),
                _ => return cfg::GitRefCf { r#ref: None },
            };
            let (Ref::Tag(s) | Ref::Branch(s) | Ref::Commit(s)) = &value;
            non_empty(&format!("{field}.{name}"), s, bad);
            cfg::GitRefCf { r#ref: Some(value) }
        });
        cfg::ManifestProjectCf {
            id: self.id,
            default_namespace: self.default_namespace.unwrap_or_default(),
            paths,
            reconcile_timeout: self
                .reconcile_timeout
                .and_then(|d| duration(&format!("{at}.reconcile_timeout"), &d, bad)),
            dry_run_strategy,
            prune_timeout: self
                .prune_timeout
                .and_then(|d| duration(&format!("{at}.prune_timeout"), &d, bad)),
            prune_propagation_policy,
            inventory_policy,
            r#ref,
            prune_oneof: self.prune.map(cfg::manifest_project_cf::PruneOneof::Prune),
        }
    }
}

impl CiAccessEntryCf {
    fn into_parts(
        self,
        at: &str,
        bad: &mut Vec<String>,
    ) -> (String, String, Option<cfg::CiAccessAsCf>, Vec<String>) {
        let id = self.id.unwrap_or_default();
        non_empty(&format!("{at}.id"), &id, bad);
        let environments = self.environments.unwrap_or_default();
        items_non_empty(&format!("{at}.environments"), &environments, bad);
        let access_as = self.access_as.map(|a| {
            use cfg::ci_access_as_cf::As;
            let field = format!("{at}.access_as");
            if members(&[
                a.agent.is_some(),
                a.impersonate.is_some(),
                a.ci_job.is_some(),
            ]) != 1
            {
                bad.push(format!(
                    "{field}: exactly one of agent, impersonate, ci_job"
                ));
            }
            let r#as = match (a.agent, a.impersonate, a.ci_job) {
                (Some(_), _, _) => Some(As::Agent(cfg::CiAccessAsAgentCf {})),
                (_, Some(i), _) => Some(As::Impersonate(i.into_proto(&field, bad))),
                (_, _, Some(_)) => Some(As::CiJob(cfg::CiAccessAsCiJobCf {})),
                _ => None,
            };
            cfg::CiAccessAsCf { r#as }
        });
        (
            id,
            self.default_namespace.unwrap_or_default(),
            access_as,
            environments,
        )
    }
}

impl ImpersonateCf {
    fn into_proto(self, at: &str, bad: &mut Vec<String>) -> cfg::CiAccessAsImpersonateCf {
        let username = self.username.unwrap_or_default();
        non_empty(&format!("{at}.impersonate.username"), &username, bad);
        let groups = self.groups.unwrap_or_default();
        items_non_empty(&format!("{at}.impersonate.groups"), &groups, bad);
        let extra = self
            .extra
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(i, e)| {
                let field = format!("{at}.impersonate.extra[{i}]");
                let key = e.key.unwrap_or_default();
                non_empty(&format!("{field}.key"), &key, bad);
                let val = e.val.unwrap_or_default();
                if val.is_empty() {
                    bad.push(format!("{field}.val: at least one value"));
                }
                items_non_empty(&format!("{field}.val"), &val, bad);
                cfg::ExtraKeyValCf { key, val }
            })
            .collect();
        cfg::CiAccessAsImpersonateCf {
            username,
            groups,
            uid: self.uid.unwrap_or_default(),
            extra,
        }
    }
}

impl UserAccessCf {
    fn into_proto(self, bad: &mut Vec<String>) -> cfg::UserAccessCf {
        let ids = |list: Option<Vec<IdCf>>, field: &str, bad: &mut Vec<String>| {
            list.unwrap_or_default()
                .into_iter()
                .enumerate()
                .map(|(i, p)| {
                    let id = p.id.unwrap_or_default();
                    non_empty(&format!("user_access.{field}[{i}].id"), &id, bad);
                    id
                })
                .collect::<Vec<_>>()
        };
        let projects = ids(self.projects, "projects", bad)
            .into_iter()
            .map(|id| cfg::UserAccessProjectCf { id })
            .collect();
        let groups = ids(self.groups, "groups", bad)
            .into_iter()
            .map(|id| cfg::UserAccessGroupCf { id })
            .collect();
        let access_as = self.access_as.map(|a| {
            use cfg::user_access_as_cf::As;
            if members(&[a.agent.is_some(), a.user.is_some()]) != 1 {
                bad.push("user_access.access_as: exactly one of agent, user".to_owned());
            }
            let r#as = match (a.agent, a.user) {
                (Some(_), _) => Some(As::Agent(cfg::UserAccessAsAgentCf {})),
                (_, Some(_)) => Some(As::User(cfg::UserAccessAsUserCf {})),
                _ => None,
            };
            cfg::UserAccessAsCf { r#as }
        });
        cfg::UserAccessCf {
            access_as,
            projects,
            groups,
        }
    }
}

impl ContainerScanningCf {
    fn into_proto(self, bad: &mut Vec<String>) -> cfg::ContainerScanningCf {
        let cadence = self.cadence.unwrap_or_default();
        non_empty("container_scanning.cadence", &cadence, bad);
        let resource = |r: ResourceCf| cfg::Resource {
            cpu: r.cpu.unwrap_or_default(),
            memory: r.memory.unwrap_or_default(),
        };
        cfg::ContainerScanningCf {
            vulnerability_report: self.vulnerability_report.map(|v| cfg::VulnerabilityReport {
                namespaces: v.namespaces.unwrap_or_default(),
                filters: v
                    .filters
                    .unwrap_or_default()
                    .into_iter()
                    .map(|f| cfg::ContainerScanningFilter {
                        namespaces: f.namespaces.unwrap_or_default(),
                        resources: f.resources.unwrap_or_default(),
                        containers: f.containers.unwrap_or_default(),
                        kinds: f.kinds.unwrap_or_default(),
                    })
                    .collect(),
            }),
            cadence,
            resource_requirements: self
                .resource_requirements
                .map(|r| cfg::ResourceRequirements {
                    limits: r.limits.map(resource),
                    requests: r.requests.map(resource),
                }),
        }
    }
}

impl RemoteDevelopmentCf {
    fn into_proto(self, bad: &mut Vec<String>) -> cfg::RemoteDevelopmentCf {
        let at = "remote_development";
        let partial = self
            .partial_sync_interval
            .and_then(|d| duration(&format!("{at}.partial_sync_interval"), &d, bad));
        positive(&format!("{at}.partial_sync_interval"), partial, bad);
        let full = self
            .full_sync_interval
            .and_then(|d| duration(&format!("{at}.full_sync_interval"), &d, bad));
        positive(&format!("{at}.full_sync_interval"), full, bad);
        cfg::RemoteDevelopmentCf {
            enabled: self.enabled.unwrap_or_default(),
            dns_zone: self.dns_zone.unwrap_or_default(),
            partial_sync_interval: partial,
            full_sync_interval: full,
            gitlab_workspaces_proxy: self.gitlab_workspaces_proxy.map(|p| {
                cfg::GitLabWorkspacesProxy {
                    namespace: p.namespace.unwrap_or_default(),
                }
            }),
            network_policy: self
                .network_policy
                .map(|n| cfg::WorkspaceNetworkPolicy { enabled: n.enabled }),
        }
    }
}
