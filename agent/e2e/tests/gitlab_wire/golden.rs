//! Golden-byte tests: every message podgate speaks on GitLab's wire, fully populated
//! ([`super::fixtures`]), encodes to the same bytes in the tests' transcription of
//! GitLab's protobufs and in podgate's product types, and each side decodes the
//! other's bytes to the same value; `Any` type URLs and gRPC method paths agree.
//!
//! The transcription is checked against GitLab's files by
//! `scripts/check-gitlab-protos.sh`, so a difference here is a mistake in podgate's
//! `agent/proto/`.

use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use prost::Message;

use super::fixtures::{product, reference};
use super::proto::gitlab::agent as gl;

/// Both encodings equal, each side decodes the other's bytes to its own value, and
/// re-encoding what it decoded gives the same bytes (nothing lands in unknown fields).
#[track_caller]
fn same_wire<R, P>(what: &str, reference: &R, product: &P)
where
    R: Message + Default + PartialEq + Debug,
    P: Message + Default + PartialEq + Debug,
{
    let r = reference.encode_to_vec();
    let p = product.encode_to_vec();
    assert!(!r.is_empty(), "{what}: the fixture encodes to nothing");
    assert_eq!(
        r, p,
        "{what}: GitLab's encoding (left) and podgate's (right) differ"
    );
    let p_from_r = P::decode(r.as_slice())
        .unwrap_or_else(|e| panic!("{what}: podgate decodes GitLab's bytes: {e}"));
    assert_eq!(
        &p_from_r, product,
        "{what}: podgate's decoding of GitLab's bytes"
    );
    assert_eq!(
        p_from_r.encode_to_vec(),
        r,
        "{what}: podgate re-encodes GitLab's bytes"
    );
    let r_from_p = R::decode(p.as_slice())
        .unwrap_or_else(|e| panic!("{what}: GitLab decodes podgate's bytes: {e}"));
    assert_eq!(
        &r_from_p, reference,
        "{what}: GitLab's decoding of podgate's bytes"
    );
}

#[track_caller]
fn same_wire_all<R, P>(what: &str, reference: &[R], product: &[P])
where
    R: Message + Default + PartialEq + Debug,
    P: Message + Default + PartialEq + Debug,
{
    assert_eq!(reference.len(), product.len(), "{what}: fixture counts");
    for (i, (r, p)) in reference.iter().zip(product).enumerate() {
        same_wire(&format!("{what}[{i}]"), r, p);
    }
}

#[test]
fn entity_messages_match() {
    same_wire(
        "AgentMeta",
        &reference::agent_meta(),
        &product::agent_meta(),
    );
}

#[test]
fn agentcfg_messages_match() {
    same_wire(
        "AgentConfiguration",
        &reference::agent_configuration(),
        &product::agent_configuration(),
    );
    same_wire(
        "ConfigurationFile",
        &reference::configuration_file(),
        &product::configuration_file(),
    );
    same_wire(
        "UserAccessAsCF",
        &reference::user_access_as_user(),
        &product::user_access_as_user(),
    );
}

#[test]
fn configuration_and_registrar_messages_match() {
    same_wire(
        "ConfigurationRequest",
        &reference::configuration_request(),
        &product::configuration_request(),
    );
    same_wire(
        "ConfigurationResponse",
        &reference::configuration_response(),
        &product::configuration_response(),
    );
    same_wire(
        "RegisterRequest",
        &reference::register_request(),
        &product::register_request(),
    );
}

#[test]
fn reverse_tunnel_messages_match() {
    same_wire_all(
        "ConnectRequest",
        &reference::connect_requests(),
        &product::connect_requests(),
    );
    same_wire_all(
        "ConnectResponse",
        &reference::connect_responses(),
        &product::connect_responses(),
    );
    same_wire(
        "AgentDescriptor",
        &reference::agent_descriptor(),
        &product::agent_descriptor(),
    );
    same_wire(
        "google.rpc.Status",
        &reference::status(),
        &product::status(),
    );
}

#[test]
fn http_over_grpc_messages_match() {
    let extra = super::any(&reference::kubernetes_header_extra());
    same_wire_all(
        "grpctool.HttpRequest",
        &reference::http_requests(extra.clone()),
        &product::http_requests(extra),
    );
    same_wire_all(
        "grpctool.HttpResponse",
        &reference::http_responses(),
        &product::http_responses(),
    );
    same_wire(
        "kubernetes_api.HeaderExtra",
        &reference::kubernetes_header_extra(),
        &product::kubernetes_header_extra(),
    );
    same_wire(
        "gitlab_access.HeaderExtra",
        &reference::gitlab_access_header_extra(),
        &product::gitlab_access_header_extra(),
    );
}

#[test]
fn tracker_and_notification_messages_match() {
    same_wire(
        "ConnectedAgentInfo",
        &reference::connected_agent_info(),
        &product::connected_agent_info(),
    );
    same_wire_all(
        "GetConnectedAgentsRequest",
        &reference::get_connected_agents_requests(),
        &product::get_connected_agents_requests(),
    );
    same_wire(
        "GetConnectedAgentsResponse",
        &reference::get_connected_agents_response(),
        &product::get_connected_agents_response(),
    );
    same_wire(
        "GitPushEventRequest",
        &reference::git_push_event_request(),
        &product::git_push_event_request(),
    );
}

/// A few encodings written out by hand from the protobuf encoding rules, so the
/// transcription itself is pinned, not only its agreement with podgate's.
#[test]
fn hand_encoded_bytes() {
    use gl::agent_tracker::rpc::{
        GetConnectedAgentsRequest, get_connected_agents_request::Request,
    };
    use gl::reverse_tunnel::rpc::{CloseSend, ConnectResponse, connect_response::Msg};

    // pod_id = 2, varint 300 = ac 02.
    let register = gl::agent_registrar::rpc::RegisterRequest {
        agent_meta: None,
        pod_id: 300,
    };
    assert_eq!(register.encode_to_vec(), [0x10, 0xac, 0x02]);
    // agent_id = 2 of the oneof.
    let by_agent = GetConnectedAgentsRequest {
        request: Some(Request::AgentId(1)),
    };
    assert_eq!(by_agent.encode_to_vec(), [0x10, 0x01]);
    // close_send = 3, an empty message: tag 0x1a, length 0.
    let close = ConnectResponse {
        msg: Some(Msg::CloseSend(CloseSend {})),
    };
    assert_eq!(close.encode_to_vec(), [0x1a, 0x00]);
    // upgradeData = 4 holding data = 1 "x".
    let upgrade = gl::grpctool::HttpRequest {
        message: Some(gl::grpctool::http_request::Message::UpgradeData(
            gl::grpctool::http_request::UpgradeData {
                data: b"x".to_vec(),
            },
        )),
    };
    assert_eq!(upgrade.encode_to_vec(), [0x22, 0x03, 0x0a, 0x01, b'x']);
    // content_length = 3 is proto3 `optional`: an explicit 0 is on the wire.
    let header = gl::grpctool::http_request::Header {
        request: None,
        extra: None,
        content_length: Some(0),
    };
    assert_eq!(header.encode_to_vec(), [0x18, 0x00]);
}

/// The `Any` type URLs GitLab's `anypb.New` gives the two `HeaderExtra`s, and
/// podgate's decoding of a `grpctool.HttpRequest` header carrying each.
#[test]
fn header_extra_type_urls() {
    let kube = super::any(&reference::kubernetes_header_extra());
    assert_eq!(
        kube.type_url,
        "type.googleapis.com/gitlab.agent.kubernetes_api.rpc.HeaderExtra"
    );
    let access = super::any(&reference::gitlab_access_header_extra());
    assert_eq!(
        access.type_url,
        "type.googleapis.com/gitlab.agent.gitlab_access.rpc.HeaderExtra"
    );
    for extra in [kube, access] {
        let bytes = reference::http_requests(extra.clone())[0].encode_to_vec();
        let decoded =
            podgate_agent::proto::gitlab::agent::grpctool::HttpRequest::decode(bytes.as_slice())
                .expect("podgate decodes the header");
        let Some(podgate_agent::proto::gitlab::agent::grpctool::http_request::Message::Header(h)) =
            decoded.message
        else {
            panic!("not a header: {decoded:?}");
        };
        assert_eq!(h.extra, Some(extra));
    }
}

/// Calls every method of every service with a client generated from one type tree,
/// over a transport that records the request path and fails the call.
macro_rules! method_paths {
    ($($root:ident)::+) => {{
        use $($root)::+::gitlab::agent as g;
        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        let channel = recorder(seen.clone());
        let _ = g::agent_configuration::rpc::agent_configuration_client::AgentConfigurationClient::new(channel.clone())
            .get_configuration(g::agent_configuration::rpc::ConfigurationRequest::default())
            .await;
        let _ = g::agent_registrar::rpc::agent_registrar_client::AgentRegistrarClient::new(channel.clone())
            .register(g::agent_registrar::rpc::RegisterRequest::default())
            .await;
        let _ = g::reverse_tunnel::rpc::reverse_tunnel_client::ReverseTunnelClient::new(channel.clone())
            .connect(none())
            .await;
        let _ = g::kubernetes_api::rpc::kubernetes_api_client::KubernetesApiClient::new(channel.clone())
            .make_request(none())
            .await;
        let _ = g::gitlab_access::rpc::gitlab_access_client::GitlabAccessClient::new(channel.clone())
            .make_request(none())
            .await;
        let _ = g::agent_tracker::rpc::agent_tracker_client::AgentTrackerClient::new(channel.clone())
            .get_connected_agents(g::agent_tracker::rpc::GetConnectedAgentsRequest::default())
            .await;
        let _ = g::notifications::rpc::notifications_client::NotificationsClient::new(channel)
            .git_push_event(g::notifications::rpc::GitPushEventRequest::default())
            .await;
        let paths = seen.lock().unwrap().clone();
        paths
    }};
}

/// An empty request stream of any message type.
fn none<T>() -> tokio_stream::Iter<std::vec::IntoIter<T>> {
    tokio_stream::iter(Vec::new())
}

type Recorder = tower::util::BoxCloneSyncService<
    http::Request<tonic::body::Body>,
    http::Response<tonic::body::Body>,
    std::io::Error,
>;

fn recorder(seen: Arc<Mutex<Vec<String>>>) -> Recorder {
    Recorder::new(tower::service_fn(
        move |req: http::Request<tonic::body::Body>| {
            seen.lock().unwrap().push(req.uri().path().to_owned());
            std::future::ready(Err(std::io::Error::other("recorded")))
        },
    ))
}

#[tokio::test]
async fn method_paths_match() {
    let reference = method_paths!(crate::gitlab_wire::proto);
    assert_eq!(
        reference,
        [
            "/gitlab.agent.agent_configuration.rpc.AgentConfiguration/GetConfiguration",
            "/gitlab.agent.agent_registrar.rpc.AgentRegistrar/Register",
            "/gitlab.agent.reverse_tunnel.rpc.ReverseTunnel/Connect",
            "/gitlab.agent.kubernetes_api.rpc.KubernetesApi/MakeRequest",
            "/gitlab.agent.gitlab_access.rpc.GitlabAccess/MakeRequest",
            "/gitlab.agent.agent_tracker.rpc.AgentTracker/GetConnectedAgents",
            "/gitlab.agent.notifications.rpc.Notifications/GitPushEvent",
        ]
    );
    let product = method_paths!(podgate_agent::proto);
    assert_eq!(product, reference);
}
