//! Rails' Topology Service calls, as gitlabhq/gitlabhq makes them:
//! `lib/gitlab/topology_service_client/claim_service.rb` (the calls),
//! `app/models/cells/transaction_record.rb` (one `BeginUpdate` inside the database
//! transaction, deadline 0.3 s, then `CommitUpdate` after the commit or
//! `RollbackUpdate` after a rollback), `app/models/concerns/cells/claimable.rb`
//! (a record's claimed attributes as `Metadata`: bucket, subject, source),
//! `app/models/concerns/cells/serialization.rb` (an integer primary key as 8 bytes,
//! big-endian), `cell_service.rb` (`GetCell` of its own id), `health_service.rb`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use podgate_topology_service::proto::gitlab::cells::topology_service as ts;
use podgate_topology_service::proto::grpc::health::v1 as health;
use tonic::{Code, Request, Status};
use ts::claims::v1::{self as cv1, claim_service_client::ClaimServiceClient};
use ts::types::v1::{Claim, Uuid, claim};

type Claims = ClaimServiceClient<tonic::transport::Channel>;

/// A top-level namespace's route as `Route` claims it: bucket `ROUTES`, subject
/// the namespace, source the `routes` row (`rails_primary_key_id` big-endian).
fn route(path: &str, route_id: u64, namespace_id: i64) -> cv1::Metadata {
    cv1::Metadata {
        bucket: Some(cv1::Bucket {
            r#type: cv1::bucket::Type::Routes as i32,
            value: path.into(),
        }),
        subject: Some(cv1::Subject {
            r#type: cv1::subject::Type::Namespace as i32,
            id: namespace_id,
        }),
        source: Some(cv1::Source {
            r#type: cv1::source::Type::RailsTableRoutes as i32,
            rails_primary_key_id: route_id.to_be_bytes().to_vec(),
        }),
        user_data: None,
        claim: None,
    }
}

/// `BeginUpdate` as `TransactionRecord#before_committed!` sends it: deadline
/// 0.3 s, retried once after 0.1 s on `DEADLINE_EXCEEDED` or `UNAVAILABLE`.
async fn begin(
    c: &mut Claims,
    cell_id: i64,
    create: Vec<cv1::Metadata>,
    destroy: Vec<cv1::Metadata>,
) -> Result<String, Status> {
    let mut last = None;
    for attempt in 0..2 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut req = Request::new(cv1::BeginUpdateRequest {
            create_records: create.clone(),
            destroy_records: destroy.clone(),
            cell_id,
            organization_id: 0,
        });
        req.set_timeout(Duration::from_millis(300));
        match c.begin_update(req).await {
            Ok(r) => {
                let r = r.into_inner();
                assert_eq!(r.cell_id, cell_id);
                return Ok(r.lease_uuid.unwrap().value);
            }
            Err(s) if matches!(s.code(), Code::DeadlineExceeded | Code::Unavailable) => {
                last = Some(s);
            }
            Err(s) => return Err(s),
        }
    }
    Err(last.unwrap())
}

async fn commit(c: &mut Claims, cell_id: i64, lease: &str) -> Result<(), Status> {
    let mut req = Request::new(cv1::CommitUpdateRequest {
        cell_id,
        lease_uuid: Some(Uuid {
            value: lease.into(),
        }),
    });
    req.set_timeout(Duration::from_millis(300));
    c.commit_update(req).await.map(|_| ())
}

async fn rollback(c: &mut Claims, cell_id: i64, lease: &str) -> Result<(), Status> {
    let mut req = Request::new(cv1::RollbackUpdateRequest {
        cell_id,
        lease_uuid: Some(Uuid {
            value: lease.into(),
        }),
    });
    req.set_timeout(Duration::from_millis(300));
    c.rollback_update(req).await.map(|_| ())
}

/// The Cell a route is classified to, or the status.
async fn owner(ch: &tonic::transport::Channel, path: &str) -> Result<String, Status> {
    let mut c = ts::classify_service_client::ClassifyServiceClient::new(ch.clone());
    let r = c
        .classify(podgate_topology_service::classify::ClassifyRequest {
            claims: vec![Claim {
                claim: Some(claim::Claim::Route(path.into())),
            }],
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok(r.proxy.unwrap().address)
}

fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    let d = t.duration_since(UNIX_EPOCH).unwrap();
    prost_types::Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

super::on_every_backend! {
    a_claim_counts_from_its_commit_and_a_taken_one_is_already_exists => lifecycle;
    list_records_pages_by_the_big_endian_source_key => paging;
}

async fn lifecycle(t: &super::Ts) {
    let ch = t.channel().await;
    let mut c = ClaimServiceClient::new(ch.clone());

    // Boot warm-up: nothing created an hour from now (5 s deadline).
    let mut warm = Request::new(cv1::ListLeasesRequest {
        cell_id: 1,
        next: None,
        limit: Some(1),
        created_after: Some(timestamp(SystemTime::now() + Duration::from_secs(3600))),
    });
    warm.set_timeout(Duration::from_secs(5));
    assert!(
        c.list_leases(warm)
            .await
            .unwrap()
            .into_inner()
            .leases
            .is_empty()
    );

    // Cell 2 creates a group: leased, not yet routable.
    let lease = begin(&mut c, 2, vec![route("Gitlab-Org", 10, 100)], vec![])
        .await
        .unwrap();
    assert_eq!(
        owner(&ch, "gitlab-org").await.unwrap_err().code(),
        Code::NotFound
    );
    // Cell 3 wants the same path (case-insensitively): taken, and nothing of its
    // batch is kept.
    let taken = begin(
        &mut c,
        3,
        vec![route("free-path", 11, 101), route("gitlab-org", 12, 102)],
        vec![],
    )
    .await
    .unwrap_err();
    assert_eq!(taken.code(), Code::AlreadyExists, "{taken:?}");
    assert!(taken.message().contains("gitlab-org"), "{taken:?}");
    assert_eq!(
        owner(&ch, "free-path").await.unwrap_err().code(),
        Code::NotFound
    );
    let again = begin(&mut c, 3, vec![route("free-path", 11, 101)], vec![])
        .await
        .unwrap();
    rollback(&mut c, 3, &again).await.unwrap();

    // The outstanding lease is listed for reconciliation; another Cell may not end it.
    let leases = c
        .list_leases(cv1::ListLeasesRequest {
            cell_id: 2,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .leases;
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0].uuid.as_ref().unwrap().value, lease);
    assert_eq!(
        commit(&mut c, 3, &lease).await.unwrap_err().code(),
        Code::PermissionDenied
    );

    // Committed: routable to Cell 2, whatever the case; committing again is no error.
    commit(&mut c, 2, &lease).await.unwrap();
    commit(&mut c, 2, &lease).await.unwrap();
    assert_eq!(
        owner(&ch, "gitlab-org").await.unwrap(),
        "cell-2.example.com:443"
    );
    assert_eq!(
        owner(&ch, "GITLAB-ORG").await.unwrap(),
        "cell-2.example.com:443"
    );

    // A rolled-back transaction leaves nothing; a rename destroys the old path and
    // creates the new one in one lease.
    let rolled = begin(&mut c, 2, vec![route("never", 13, 103)], vec![])
        .await
        .unwrap();
    rollback(&mut c, 2, &rolled).await.unwrap();
    rollback(&mut c, 2, &rolled).await.unwrap();
    assert_eq!(
        owner(&ch, "never").await.unwrap_err().code(),
        Code::NotFound
    );
    let rename = begin(
        &mut c,
        2,
        vec![route("gitlab-com", 14, 100)],
        vec![route("gitlab-org", 10, 100)],
    )
    .await
    .unwrap();
    // Until the commit the old path still routes, the new one not yet.
    assert_eq!(
        owner(&ch, "gitlab-org").await.unwrap(),
        "cell-2.example.com:443"
    );
    assert_eq!(
        owner(&ch, "gitlab-com").await.unwrap_err().code(),
        Code::NotFound
    );
    // Another Cell cannot destroy what it does not own.
    let foreign = begin(&mut c, 1, vec![], vec![route("gitlab-com", 14, 100)]).await;
    assert!(foreign.is_err());
    commit(&mut c, 2, &rename).await.unwrap();
    assert_eq!(
        owner(&ch, "gitlab-org").await.unwrap_err().code(),
        Code::NotFound
    );
    assert_eq!(
        owner(&ch, "gitlab-com").await.unwrap(),
        "cell-2.example.com:443"
    );

    // An administrator reads the record with its Cell.
    let rec = c
        .get_record(cv1::GetRecordRequest {
            bucket: Some(cv1::Bucket {
                r#type: cv1::bucket::Type::Routes as i32,
                value: "gitlab-com".into(),
            }),
            claim: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rec.record.as_ref().unwrap().cell_id, 2);
    assert_eq!(
        rec.record.unwrap().status,
        cv1::record::Status::Active as i32
    );
    assert_eq!(rec.cell_info.unwrap().id, 2);

    // Every call counted by method and code.
    let metrics = crate::common::request(t.addr.port(), "GET /metrics HTTP/1.1", b"").await;
    let text = String::from_utf8_lossy(&metrics.body);
    for line in [
        "podgate_topology_service_requests_total{code=\"ALREADY_EXISTS\",method=\"BeginUpdate\"} 1",
        "podgate_topology_service_requests_total{code=\"PERMISSION_DENIED\",method=\"CommitUpdate\"} 1",
        "podgate_topology_service_requests_total{code=\"NOT_FOUND\",method=\"Classify\"}",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
}

/// The verification job's loop: pages of `ListRecords` by `(source_id_gt,
/// source_id_lte]` on the encoded primary key, continuing from the last record's
/// key while `truncated`, until the cursor stops.
async fn paging(t: &super::Ts) {
    let ch = t.channel().await;
    let mut c = ClaimServiceClient::new(ch);
    // 2,300 routes of Cell 1 (ids 1..=2300, written out of order) and a few of Cell 2.
    let ids: Vec<u64> = (1..=2300).rev().collect();
    for batch in ids.chunks(500) {
        let create = batch
            .iter()
            .map(|&i| route(&format!("ns-{i}"), i, i as i64))
            .collect();
        let lease = begin(&mut c, 1, create, vec![]).await.unwrap();
        commit(&mut c, 1, &lease).await.unwrap();
    }
    let lease = begin(&mut c, 2, vec![route("other", 5000, 1)], vec![])
        .await
        .unwrap();
    commit(&mut c, 2, &lease).await.unwrap();

    let mut seen: Vec<u64> = Vec::new();
    let mut gt: Vec<u8> = Vec::new();
    let mut pages = 0;
    loop {
        let page = c
            .list_records(cv1::ListRecordsRequest {
                cell_id: 1,
                source_type: cv1::source::Type::RailsTableRoutes as i32,
                bucket_types: vec![cv1::bucket::Type::Routes as i32],
                source_id_gt: gt.clone(),
                source_id_lte: u64::MAX.to_be_bytes().to_vec(),
                claim_types: vec![],
            })
            .await
            .unwrap()
            .into_inner();
        pages += 1;
        let keys: Vec<Vec<u8>> = page
            .records
            .iter()
            .map(|r| {
                r.metadata
                    .as_ref()
                    .unwrap()
                    .source
                    .as_ref()
                    .unwrap()
                    .rails_primary_key_id
                    .clone()
            })
            .collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "ascending");
        seen.extend(
            keys.iter()
                .map(|k| u64::from_be_bytes(k[..].try_into().unwrap())),
        );
        if !page.truncated {
            break;
        }
        let last = keys.last().unwrap().clone();
        assert!(last > gt, "the cursor advances");
        gt = last;
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, (1..=2300).collect::<Vec<_>>());
    // An upper bound: (100, 200].
    let bounded = c
        .list_records(cv1::ListRecordsRequest {
            cell_id: 1,
            source_id_gt: 100u64.to_be_bytes().to_vec(),
            source_id_lte: 200u64.to_be_bytes().to_vec(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(bounded.records.len(), 100);
    assert!(!bounded.truncated);
}

#[tokio::test]
async fn get_cell_and_health_as_rails_reads_them() {
    let t = super::start();
    let ch = t.channel().await;
    let mut cells = ts::cell_service_client::CellServiceClient::new(ch.clone());
    let cell = cells
        .get_cell(ts::GetCellRequest { cell_id: 2 })
        .await
        .unwrap()
        .into_inner()
        .cell_info
        .unwrap();
    assert_eq!(cell.session_prefix, "cell-2");
    assert_eq!(cell.sequence_ranges[0].minval, 1_000_000_000_000);
    assert_eq!(cell.sequence_range, Some(cell.sequence_ranges[0]));
    let missing = cells
        .get_cell(ts::GetCellRequest { cell_id: 99 })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);

    let all = ts::classify_service_client::ClassifyServiceClient::new(ch.clone())
        .get_cells(ts::GetCellsRequest {})
        .await
        .unwrap()
        .into_inner()
        .cells;
    assert_eq!(all.iter().map(|c| c.id).collect::<Vec<_>>(), [1, 2, 3]);

    let mut h = health::health_client::HealthClient::new(ch);
    let status = h
        .check(health::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(
        status,
        health::health_check_response::ServingStatus::Serving as i32
    );
    let unknown = h
        .check(health::HealthCheckRequest {
            service: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
}
