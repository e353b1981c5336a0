//! The HTTP Router's REST classify (`POST /v1/classify`, JSON; GitLab's
//! `doc/development/cells/http_router.md`: a session cookie's `cell-<n>` as
//! `SESSION_PREFIX`, a routable token's Cell as `CELL_ID`, a top-level path as a
//! route claim), and mail room's classification (`Cells::Mailroom::CellRouter` in
//! gitlabhq/gitlabhq: `FIRST_CELL` for the default Cell, claims by project,
//! namespace or route, `NOT_FOUND` as "unknown").

use podgate_topology_service::classify::ClassifyRequest;
use podgate_topology_service::proto::gitlab::cells::topology_service as ts;
use serde_json::{Value, json};
use tonic::Code;
use ts::claims::v1::{self as cv1, claim_service_client::ClaimServiceClient};
use ts::types::v1::{Claim, claim};

use crate::common::request;

async fn post(port: u16, body: &Value) -> (u16, Value) {
    let r = request(
        port,
        "POST /v1/classify HTTP/1.1\r\ncontent-type: application/json",
        body.to_string().as_bytes(),
    )
    .await;
    assert_eq!(
        r.headers.get("content-type").map(String::as_str),
        Some("application/json")
    );
    (r.status, serde_json::from_slice(&r.body).unwrap())
}

async fn claim_namespace(t: &super::Ts, cell_id: i64, path: &str, namespace_id: i64) {
    let mut c = ClaimServiceClient::new(t.channel().await);
    let bucket = |r#type: cv1::bucket::Type, value: String| cv1::Metadata {
        bucket: Some(cv1::Bucket {
            r#type: r#type as i32,
            value,
        }),
        source: Some(cv1::Source {
            r#type: cv1::source::Type::RailsTableNamespaces as i32,
            rails_primary_key_id: (namespace_id as u64).to_be_bytes().to_vec(),
        }),
        ..Default::default()
    };
    super::commit(
        &mut c,
        cell_id,
        vec![
            bucket(cv1::bucket::Type::Routes, path.into()),
            bucket(cv1::bucket::Type::NamespaceIds, namespace_id.to_string()),
        ],
    )
    .await;
}

super::on_every_backend! {
    the_http_routers_rest_classify => rest_classify;
    mail_room_classifies_by_first_cell_and_by_ids => mail_room;
}

async fn rest_classify(t: &super::Ts) {
    claim_namespace(t, 3, "gitlab-org", 9970).await;
    let port = t.addr.port();

    let (status, body) = post(port, &json!({"type": "SESSION_PREFIX", "value": "cell-2"})).await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({"action": "PROXY", "proxy": {"address": "cell-2.example.com:443"}})
    );

    let (status, body) = post(port, &json!({"type": "CELL_ID", "value": "3"})).await;
    assert_eq!(
        (status, &body["proxy"]["address"]),
        (200, &json!("cell-3.example.com"))
    );

    // The chain: an unclaimed path first, then the claimed group; the answer names
    // the claim that matched.
    let (status, body) = post(
        port,
        &json!({"claims": [{"route": "nobody"}, {"route": "gitlab-org"}]}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({"action": "PROXY", "proxy": {"address": "cell-3.example.com"}, "matchedClaim": {"route": "gitlab-org"}})
    );

    // Unknown: 404 with the gateway's error body; a bad request: 400.
    let (status, body) = post(
        port,
        &json!({"type": "SESSION_PREFIX", "value": "junk_value"}),
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(
        body,
        json!({"code": 5, "message": "cell not found: \"junk_value\"", "details": []})
    );
    let (status, body) = post(port, &json!({})).await;
    assert_eq!((status, &body["code"]), (400, &json!(3)));
    assert_eq!(body["message"], "invalid type: \"UNSPECIFIED\"");
    let r = request(port, "POST /v1/classify HTTP/1.1", b"{not json").await;
    assert_eq!(r.status, 400);
}

/// Mail room: `FIRST_CELL` for mail no claim places, claims by project id or
/// namespace id (int64s), `NOT_FOUND` as "unknown to the Topology Service".
async fn mail_room(t: &super::Ts) {
    claim_namespace(t, 2, "mailers", 4242).await;
    let mut c = ts::classify_service_client::ClassifyServiceClient::new(t.channel().await);
    let first = c
        .classify(ClassifyRequest {
            r#type: ts::ClassifyType::FirstCell as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.proxy.unwrap().address, "cell-1.example.com:443");
    assert_eq!(first.matched_claim, None);

    let by_namespace = c
        .classify(ClassifyRequest {
            claims: vec![
                Claim {
                    claim: Some(claim::Claim::ProjectId(1)),
                },
                Claim {
                    claim: Some(claim::Claim::NamespaceId(4242)),
                },
            ],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        by_namespace.proxy.unwrap().address,
        "cell-2.example.com:443"
    );
    assert_eq!(
        by_namespace.matched_claim.unwrap().claim,
        Some(claim::Claim::NamespaceId(4242))
    );
    let unknown = c
        .classify(ClassifyRequest {
            claims: vec![Claim {
                claim: Some(claim::Claim::ProjectId(77)),
            }],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
}
