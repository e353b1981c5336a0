//! Fully populated values of every message podgate speaks on GitLab's wire, built
//! once by a macro over a type tree, so the same values exist in the tests'
//! transcription of GitLab's protobufs ([`reference`]) and in podgate's product
//! types ([`product`]). The golden tests encode one and decode the other.
//!
//! Every field is set to a non-default value, and every oneof variant appears in some
//! value, so a field that one side lacks, numbers differently or types differently
//! changes the bytes. Maps hold one entry each: a map's encoding follows its
//! iteration order, which two `HashMap`s need not share.

/// Builds `mod $name` whose functions return the fixture values, with every type
/// taken under `$root` (a module holding `gitlab::agent::…` and `google::rpc`).
macro_rules! fixtures {
    ($name:ident, $($root:ident)::+) => {
        pub mod $name {
            #![allow(clippy::too_many_lines)]
            use std::collections::HashMap;

            use prost_types::{Any, Duration, Timestamp};

            use $($root)::+::gitlab::agent::{
                agent_configuration::rpc as config, agent_registrar::rpc as registrar,
                agent_tracker, agentcfg as cfg, entity, event, gitlab_access::rpc as gitlab_access,
                grpctool, kubernetes_api::rpc as kubernetes_api, notifications::rpc as notifications,
                prototool, reverse_tunnel::info, reverse_tunnel::rpc as tunnel,
            };
            use $($root)::+::google::rpc::Status;

            fn values(v: &[&str]) -> prototool::Values {
                prototool::Values { value: v.iter().map(|s| (*s).to_owned()).collect() }
            }

            fn one(key: &str, v: &[&str]) -> HashMap<String, prototool::Values> {
                HashMap::from([(key.to_owned(), values(v))])
            }

            pub fn agent_meta() -> entity::AgentMeta {
                entity::AgentMeta {
                    version: "v16.5.0".into(),
                    commit_id: "a1b2c3d4".into(),
                    pod_namespace: "gitlab-agent".into(),
                    pod_name: "agentk-7d9f-x2x".into(),
                    kubernetes_version: Some(entity::KubernetesVersion {
                        major: "1".into(),
                        minor: "32".into(),
                        git_version: "v1.32.0".into(),
                        platform: "linux/amd64".into(),
                    }),
                }
            }

            fn duration(seconds: i64) -> Option<Duration> {
                Some(Duration { seconds, nanos: 5 })
            }

            fn manifest_project(r: cfg::git_ref_cf::Ref, prune: bool) -> cfg::ManifestProjectCf {
                cfg::ManifestProjectCf {
                    id: Some("group/manifests".into()),
                    default_namespace: "apps".into(),
                    paths: vec![cfg::PathCf { glob: "/**/*.yaml".into() }],
                    reconcile_timeout: duration(60),
                    dry_run_strategy: "server".into(),
                    prune_oneof: Some(cfg::manifest_project_cf::PruneOneof::Prune(prune)),
                    prune_timeout: duration(30),
                    prune_propagation_policy: "foreground".into(),
                    inventory_policy: "adopt_all".into(),
                    r#ref: Some(cfg::GitRefCf { r#ref: Some(r) }),
                }
            }

            fn impersonate() -> cfg::CiAccessAsImpersonateCf {
                cfg::CiAccessAsImpersonateCf {
                    username: "ci".into(),
                    groups: vec!["ci-group".into()],
                    uid: "uid-1".into(),
                    extra: vec![cfg::ExtraKeyValCf { key: "k".into(), val: vec!["v".into()] }],
                }
            }

            fn ci_access() -> cfg::CiAccessCf {
                use cfg::ci_access_as_cf::As;
                let access_as = |a: As| Some(cfg::CiAccessAsCf { r#as: Some(a) });
                cfg::CiAccessCf {
                    projects: vec![
                        cfg::CiAccessProjectCf {
                            id: "group/app".into(),
                            default_namespace: "app".into(),
                            access_as: access_as(As::Agent(cfg::CiAccessAsAgentCf {})),
                            environments: vec!["production".into()],
                        },
                        cfg::CiAccessProjectCf {
                            id: "group/other".into(),
                            default_namespace: "other".into(),
                            access_as: access_as(As::CiJob(cfg::CiAccessAsCiJobCf {})),
                            environments: vec!["review/*".into()],
                        },
                    ],
                    groups: vec![cfg::CiAccessGroupCf {
                        id: "group".into(),
                        default_namespace: "grp".into(),
                        access_as: access_as(As::Impersonate(impersonate())),
                        environments: vec!["staging".into()],
                    }],
                }
            }

            fn observability() -> cfg::ObservabilityCf {
                cfg::ObservabilityCf {
                    logging: Some(cfg::LoggingCf {
                        level: cfg::LogLevelEnum::Debug as i32,
                        grpc_level: Some(cfg::LogLevelEnum::Warn as i32),
                    }),
                    google_profiler: Some(cfg::GoogleProfilerCf {
                        enabled: true,
                        project_id: "profiler".into(),
                        credentials_file: "/creds.json".into(),
                        debug_logging: true,
                    }),
                }
            }

            fn container_scanning() -> cfg::ContainerScanningCf {
                let resource = |cpu: &str| Some(cfg::Resource { cpu: cpu.into(), memory: "256Mi".into() });
                cfg::ContainerScanningCf {
                    vulnerability_report: Some(cfg::VulnerabilityReport {
                        namespaces: vec!["default".into()],
                        filters: vec![cfg::ContainerScanningFilter {
                            namespaces: vec!["ns".into()],
                            resources: vec!["deploy".into()],
                            containers: vec!["app".into()],
                            kinds: vec!["Deployment".into()],
                        }],
                    }),
                    cadence: "0 0 * * *".into(),
                    resource_requirements: Some(cfg::ResourceRequirements {
                        limits: resource("500m"),
                        requests: resource("100m"),
                    }),
                }
            }

            fn remote_development() -> cfg::RemoteDevelopmentCf {
                cfg::RemoteDevelopmentCf {
                    enabled: true,
                    dns_zone: "workspaces.example.com".into(),
                    partial_sync_interval: duration(10),
                    full_sync_interval: duration(3600),
                    gitlab_workspaces_proxy: Some(cfg::GitLabWorkspacesProxy { namespace: "proxy".into() }),
                    network_policy: Some(cfg::WorkspaceNetworkPolicy { enabled: Some(false) }),
                }
            }

            fn gitops() -> cfg::GitopsCf {
                use cfg::git_ref_cf::Ref;
                cfg::GitopsCf {
                    manifest_projects: vec![
                        manifest_project(Ref::Tag("v1".into()), true),
                        manifest_project(Ref::Branch("main".into()), false),
                        manifest_project(Ref::Commit("0123abcd".into()), true),
                    ],
                }
            }

            fn flux() -> cfg::FluxCf {
                cfg::FluxCf { webhook_receiver_url: "http://flux/hook".into() }
            }

            pub fn agent_configuration() -> cfg::AgentConfiguration {
                cfg::AgentConfiguration {
                    gitops: Some(gitops()),
                    observability: Some(observability()),
                    agent_id: 42,
                    project_id: 7,
                    ci_access: Some(ci_access()),
                    container_scanning: Some(container_scanning()),
                    project_path: "group/agents".into(),
                    remote_development: Some(remote_development()),
                    flux: Some(flux()),
                    gitlab_external_url: "https://gitlab.example.com".into(),
                }
            }

            pub fn configuration_file() -> cfg::ConfigurationFile {
                use cfg::user_access_as_cf::As;
                let user_access = |a: As| cfg::UserAccessCf {
                    access_as: Some(cfg::UserAccessAsCf { r#as: Some(a) }),
                    projects: vec![cfg::UserAccessProjectCf { id: "group/app".into() }],
                    groups: vec![cfg::UserAccessGroupCf { id: "group".into() }],
                };
                cfg::ConfigurationFile {
                    gitops: Some(gitops()),
                    observability: Some(observability()),
                    ci_access: Some(ci_access()),
                    container_scanning: Some(container_scanning()),
                    user_access: Some(user_access(As::Agent(cfg::UserAccessAsAgentCf {}))),
                    remote_development: Some(remote_development()),
                    flux: Some(flux()),
                }
            }

            pub fn user_access_as_user() -> cfg::UserAccessAsCf {
                cfg::UserAccessAsCf {
                    r#as: Some(cfg::user_access_as_cf::As::User(cfg::UserAccessAsUserCf {})),
                }
            }

            pub fn configuration_request() -> config::ConfigurationRequest {
                config::ConfigurationRequest {
                    commit_id: "f00dfeed".into(),
                    agent_meta: Some(agent_meta()),
                    skip_register: true,
                }
            }

            pub fn configuration_response() -> config::ConfigurationResponse {
                config::ConfigurationResponse {
                    configuration: Some(agent_configuration()),
                    commit_id: "deadbeef".into(),
                }
            }

            pub fn register_request() -> registrar::RegisterRequest {
                registrar::RegisterRequest { agent_meta: Some(agent_meta()), pod_id: -9_000_000_000 }
            }

            pub fn agent_descriptor() -> info::AgentDescriptor {
                info::AgentDescriptor {
                    services: vec![
                        info::Service {
                            name: "gitlab.agent.kubernetes_api.rpc.KubernetesApi".into(),
                            methods: vec![info::Method { name: "MakeRequest".into() }],
                        },
                        info::Service {
                            name: "example.Svc".into(),
                            methods: vec![info::Method { name: "A".into() }, info::Method { name: "B".into() }],
                        },
                    ],
                }
            }

            pub fn status() -> Status {
                Status {
                    code: 14,
                    message: "unavailable".into(),
                    details: vec![Any { type_url: "type.googleapis.com/x.Y".into(), value: vec![8, 1] }],
                }
            }

            /// One `ConnectRequest` per oneof variant, in the order agentk sends them.
            pub fn connect_requests() -> Vec<tunnel::ConnectRequest> {
                use tunnel::connect_request::Msg;
                [
                    Msg::Descriptor(tunnel::Descriptor { agent_descriptor: Some(agent_descriptor()) }),
                    Msg::Header(tunnel::Header { meta: one("content-type", &["application/grpc", "x"]) }),
                    Msg::Message(tunnel::Message { data: vec![0, 1, 2, 255] }),
                    Msg::Trailer(tunnel::Trailer { meta: one("grpc-status", &["0"]) }),
                    Msg::Error(tunnel::Error { status: Some(status()) }),
                ]
                .into_iter()
                .map(|m| tunnel::ConnectRequest { msg: Some(m) })
                .collect()
            }

            /// One `ConnectResponse` per oneof variant, in the order kas sends them.
            pub fn connect_responses() -> Vec<tunnel::ConnectResponse> {
                use tunnel::connect_response::Msg;
                [
                    Msg::RequestInfo(tunnel::RequestInfo {
                        method_name: "/gitlab.agent.kubernetes_api.rpc.KubernetesApi/MakeRequest".into(),
                        meta: one("authorization", &["Bearer x"]),
                    }),
                    Msg::Message(tunnel::Message { data: b"payload".to_vec() }),
                    Msg::CloseSend(tunnel::CloseSend {}),
                ]
                .into_iter()
                .map(|m| tunnel::ConnectResponse { msg: Some(m) })
                .collect()
            }

            pub fn kubernetes_header_extra() -> kubernetes_api::HeaderExtra {
                kubernetes_api::HeaderExtra {
                    imp_config: Some(kubernetes_api::ImpersonationConfig {
                        username: "gitlab:user:jane".into(),
                        groups: vec!["gitlab:user".into(), "gitlab:project_role:7:developer".into()],
                        uid: "gitlab-uid".into(),
                        extra: vec![kubernetes_api::ExtraKeyVal {
                            key: "agent.gitlab.com/id".into(),
                            val: vec!["42".into()],
                        }],
                    }),
                }
            }

            pub fn gitlab_access_header_extra() -> gitlab_access::HeaderExtra {
                gitlab_access::HeaderExtra { module_name: "remote_development".into() }
            }

            /// One `grpctool.HttpRequest` per oneof variant (`content_length` both
            /// unknown, -1, and a size).
            pub fn http_requests(extra: Any) -> Vec<grpctool::HttpRequest> {
                use grpctool::http_request::{Data, Header, Message, Trailer, UpgradeData};
                let header = |content_length| Header {
                    request: Some(prototool::HttpRequest {
                        method: "POST".into(),
                        header: one("Upgrade", &["websocket"]),
                        url_path: "/api/v1/namespaces/default/pods/p/exec".into(),
                        query: one("command", &["sh", "-c"]),
                    }),
                    extra: Some(extra.clone()),
                    content_length,
                };
                [
                    Message::Header(header(Some(-1))),
                    Message::Header(header(Some(1024))),
                    Message::Data(Data { data: b"body".to_vec() }),
                    Message::Trailer(Trailer {}),
                    Message::UpgradeData(UpgradeData { data: vec![1, 0, 2] }),
                ]
                .into_iter()
                .map(|m| grpctool::HttpRequest { message: Some(m) })
                .collect()
            }

            /// One `grpctool.HttpResponse` per oneof variant.
            pub fn http_responses() -> Vec<grpctool::HttpResponse> {
                use grpctool::http_response::{Data, Header, Message, Trailer, UpgradeData};
                [
                    Message::Header(Header {
                        response: Some(prototool::HttpResponse {
                            status_code: 101,
                            status: "101 Switching Protocols".into(),
                            header: one("Sec-Websocket-Protocol", &["v5.channel.k8s.io"]),
                        }),
                    }),
                    Message::Data(Data { data: b"{}".to_vec() }),
                    Message::Trailer(Trailer {}),
                    Message::UpgradeData(UpgradeData { data: vec![3, 4] }),
                ]
                .into_iter()
                .map(|m| grpctool::HttpResponse { message: Some(m) })
                .collect()
            }

            pub fn connected_agent_info() -> agent_tracker::ConnectedAgentInfo {
                agent_tracker::ConnectedAgentInfo {
                    agent_meta: Some(agent_meta()),
                    connected_at: Some(Timestamp { seconds: 1_700_000_000, nanos: 123 }),
                    connection_id: 987_654_321_012,
                    agent_id: 42,
                    project_id: 7,
                }
            }

            pub fn get_connected_agents_requests() -> Vec<agent_tracker::rpc::GetConnectedAgentsRequest> {
                use agent_tracker::rpc::get_connected_agents_request::Request;
                [Request::ProjectId(7), Request::AgentId(42)]
                    .into_iter()
                    .map(|r| agent_tracker::rpc::GetConnectedAgentsRequest { request: Some(r) })
                    .collect()
            }

            pub fn get_connected_agents_response() -> agent_tracker::rpc::GetConnectedAgentsResponse {
                agent_tracker::rpc::GetConnectedAgentsResponse {
                    agents: vec![connected_agent_info(), connected_agent_info()],
                }
            }

            pub fn git_push_event_request() -> notifications::GitPushEventRequest {
                notifications::GitPushEventRequest {
                    event: Some(event::GitPushEvent {
                        project: Some(event::Project { id: 7, full_path: "group/agents".into() }),
                    }),
                }
            }
        }
    };
}

fixtures!(reference, crate::gitlab_wire::proto);
fixtures!(product, podgate_agent::proto);
