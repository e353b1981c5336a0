//! The gRPC services: GitLab's `ClassifyService`, `CellService` and
//! `claims.v1.ClaimService`, and gRPC's `Health`, over one [`TopologyService`].
//! Every call is authorised first ([`crate::access`]).

use std::pin::Pin;
use std::sync::Arc;

use futures_util::{Stream, StreamExt as _};
use tonic::{Request, Response, Status};

use crate::access::{self, Caller};
use crate::cells::Cells;
use crate::claims::{self, Key, LeaseCursor, RecordFilter, Store};
use crate::classify::{self, ClassifyRequest};
use crate::metrics::counted;
use crate::proto::gitlab::cells::topology_service::claims::v1 as cv1;
use crate::proto::gitlab::cells::topology_service::types::v1::Uuid;
use crate::proto::gitlab::cells::topology_service::{
    self as ts, ClassifyResponse, GetCellRequest, GetCellResponse, GetCellsRequest,
    GetCellsResponse,
};
use crate::proto::grpc::health::v1::{
    HealthCheckRequest, HealthCheckResponse, health_check_response::ServingStatus,
};

const CLASSIFY: &str = "/gitlab.cells.topology_service.ClassifyService/Classify";
const CLAIMS: &str = "/gitlab.cells.topology_service.claims.v1.ClaimService/";

/// The Topology Service's state: its Cells and their claims.
pub struct TopologyService {
    cells: Cells,
    claims: Store,
    /// Who a request without a certificate's identity is: `Admin` on a listener
    /// without TLS; `None` (refused) with mTLS.
    anonymous: Option<Caller>,
}

impl TopologyService {
    /// A service for `cells` keeping claims in `claims`, every caller without an
    /// identity taken as `anonymous`.
    pub fn new(cells: Cells, claims: Store, anonymous: Option<Caller>) -> Arc<Self> {
        Arc::new(TopologyService {
            cells,
            claims,
            anonymous,
        })
    }

    /// The Cells.
    pub fn cells(&self) -> &Cells {
        &self.cells
    }

    fn caller<T>(&self, req: &Request<T>) -> Option<Caller> {
        self.caller_in(req.extensions())
    }

    /// The caller a request's extensions name: its client certificate's
    /// ([`crate::tls::CallerInfo`]), or on a listener without TLS the anonymous one.
    pub fn caller_in(&self, extensions: &http::Extensions) -> Option<Caller> {
        match extensions.get::<crate::tls::CallerInfo>() {
            Some(crate::tls::CallerInfo(c)) => *c,
            None => self.anonymous,
        }
    }

    /// `Classify`, authorised for `caller`: what both the gRPC method and the REST
    /// mapping answer.
    pub async fn classify(
        &self,
        caller: Option<Caller>,
        req: &ClassifyRequest,
    ) -> Result<ClassifyResponse, Status> {
        access::authorize(CLASSIFY, caller, None)?;
        let mut owners: Vec<Option<i64>> = Vec::new();
        for claim in classify::chain(req) {
            let owner = match Key::of_claim(claim) {
                Some(k) => self.claims.owner(&k).await.map_err(status)?,
                None => None,
            };
            // The first claimed one decides: no need to ask about the rest.
            let found = owner.is_some_and(|id| self.cells.by_id(id).is_some());
            owners.push(owner);
            if found {
                break;
            }
        }
        classify::classify(req, &self.cells, &owners).map_err(|e| match e {
            classify::Error::InvalidArgument(m) => Status::invalid_argument(m),
            classify::Error::NotFound(m) => Status::not_found(m),
        })
    }

    /// The caller on a request made outside gRPC (the REST mapping).
    pub fn anonymous(&self) -> Option<Caller> {
        self.anonymous
    }
}

fn status(e: claims::Error) -> Status {
    match e {
        claims::Error::AlreadyExists(m) => {
            Status::already_exists(format!("{m} is already claimed"))
        }
        claims::Error::NotFound(m) => Status::not_found(m),
        claims::Error::FailedPrecondition(m) => Status::failed_precondition(m),
        claims::Error::InvalidArgument(m) => Status::invalid_argument(m),
        claims::Error::PermissionDenied(m) => Status::permission_denied(m),
        claims::Error::Unavailable(m) => Status::unavailable(m),
    }
}

fn lease_uuid(u: Option<&Uuid>) -> Result<&str, Status> {
    u.map(|u| u.value.as_str())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| Status::invalid_argument("lease_uuid: required"))
}

fn get_cells(s: &TopologyService) -> GetCellsResponse {
    GetCellsResponse {
        cells: s.cells.all().to_vec(),
    }
}

/// `ClassifyService` on a shared [`TopologyService`].
#[derive(Clone)]
pub struct Classify(pub Arc<TopologyService>);

#[tonic::async_trait]
impl ts::classify_service_server::ClassifyService for Classify {
    async fn get_cells(
        &self,
        req: Request<GetCellsRequest>,
    ) -> Result<Response<GetCellsResponse>, Status> {
        counted(
            "GetCells",
            async {
                access::authorize(
                    "/gitlab.cells.topology_service.ClassifyService/GetCells",
                    self.0.caller(&req),
                    None,
                )?;
                Ok(Response::new(get_cells(&self.0)))
            }
            .await,
        )
    }

    async fn classify(
        &self,
        req: Request<ClassifyRequest>,
    ) -> Result<Response<ClassifyResponse>, Status> {
        counted(
            "Classify",
            async {
                let caller = self.0.caller(&req);
                self.0
                    .classify(caller, req.get_ref())
                    .await
                    .map(Response::new)
            }
            .await,
        )
    }
}

/// `CellService` on a shared [`TopologyService`].
#[derive(Clone)]
pub struct CellService(pub Arc<TopologyService>);

#[tonic::async_trait]
impl ts::cell_service_server::CellService for CellService {
    async fn get_cell(
        &self,
        req: Request<GetCellRequest>,
    ) -> Result<Response<GetCellResponse>, Status> {
        counted(
            "GetCell",
            async {
                access::authorize(
                    "/gitlab.cells.topology_service.CellService/GetCell",
                    self.0.caller(&req),
                    None,
                )?;
                let id = req.get_ref().cell_id;
                let cell = self
                    .0
                    .cells
                    .by_id(id)
                    .ok_or_else(|| Status::not_found(format!("cell not found: {id}")))?;
                Ok(Response::new(GetCellResponse {
                    cell_info: Some(cell.clone()),
                }))
            }
            .await,
        )
    }
}

/// `claims.v1.ClaimService` on a shared [`TopologyService`].
#[derive(Clone)]
pub struct ClaimService(pub Arc<TopologyService>);

impl ClaimService {
    fn allow<T>(&self, method: &str, req: &Request<T>, cell_id: Option<i64>) -> Result<(), Status> {
        access::authorize(&format!("{CLAIMS}{method}"), self.0.caller(req), cell_id)
    }

    /// `CommitUpdate` (`commit`) or `RollbackUpdate` of `lease` by `cell_id`.
    async fn end_lease<T>(
        &self,
        method: &str,
        req: &Request<T>,
        cell_id: i64,
        lease: Option<&Uuid>,
        commit: bool,
    ) -> Result<(), Status> {
        self.allow(method, req, Some(cell_id))?;
        let lease = lease_uuid(lease)?;
        self.0
            .claims
            .end(cell_id, lease, commit)
            .await
            .map_err(status)
    }
}

/// The `Any` type URL of a `ListLeases` cursor. The cursor is opaque to clients
/// (Rails passes `next` back as it came).
const CURSOR_TYPE: &str = "type.googleapis.com/podgate.topology_service.LeaseCursor";

fn encode_cursor(c: &LeaseCursor) -> prost_types::Any {
    prost_types::Any {
        type_url: CURSOR_TYPE.into(),
        value: format!("{}:{}", c.created_at, c.uuid).into_bytes(),
    }
}

fn decode_cursor(a: &prost_types::Any) -> Result<LeaseCursor, Status> {
    let bad = || Status::invalid_argument("next: not a cursor this service returned");
    if a.type_url != CURSOR_TYPE {
        return Err(bad());
    }
    let text = std::str::from_utf8(&a.value).map_err(|_| bad())?;
    let (at, uuid) = text.split_once(':').ok_or_else(bad)?;
    Ok(LeaseCursor {
        created_at: at.parse().map_err(|_| bad())?,
        uuid: uuid.to_owned(),
    })
}

#[tonic::async_trait]
impl cv1::claim_service_server::ClaimService for ClaimService {
    async fn get_cells(
        &self,
        req: Request<GetCellsRequest>,
    ) -> Result<Response<GetCellsResponse>, Status> {
        counted(
            "GetCells",
            async {
                self.allow("GetCells", &req, None)?;
                Ok(Response::new(get_cells(&self.0)))
            }
            .await,
        )
    }

    async fn get_record(
        &self,
        req: Request<cv1::GetRecordRequest>,
    ) -> Result<Response<cv1::GetRecordResponse>, Status> {
        counted(
            "GetRecord",
            async {
                self.allow("GetRecord", &req, None)?;
                let r = req.get_ref();
                let key = match (&r.bucket, &r.claim) {
                    (Some(b), _) if b.r#type != 0 => Key::new(b.r#type, &b.value),
                    (_, Some(c)) => Key::of_claim(c)
                        .ok_or_else(|| Status::invalid_argument("claim: one of its fields"))?,
                    _ => return Err(Status::invalid_argument("bucket or claim: required")),
                };
                let record = self
                    .0
                    .claims
                    .get(&key)
                    .await
                    .map_err(status)?
                    .ok_or_else(|| Status::not_found(format!("{key} is not claimed")))?;
                let cell_info = self.0.cells.by_id(record.cell_id).cloned();
                Ok(Response::new(cv1::GetRecordResponse {
                    record: Some(record),
                    cell_info,
                }))
            }
            .await,
        )
    }

    async fn begin_update(
        &self,
        req: Request<cv1::BeginUpdateRequest>,
    ) -> Result<Response<cv1::BeginUpdateResponse>, Status> {
        counted(
            "BeginUpdate",
            async {
                let cell_id = req.get_ref().cell_id;
                self.allow("BeginUpdate", &req, Some(cell_id))?;
                if self.0.cells.by_id(cell_id).is_none() {
                    return Err(Status::not_found(format!("cell not found: {cell_id}")));
                }
                let r = req.get_ref();
                let uuid = self
                    .0
                    .claims
                    .begin(cell_id, &r.create_records, &r.destroy_records)
                    .await
                    .map_err(status)?;
                Ok(Response::new(cv1::BeginUpdateResponse {
                    cell_id,
                    lease_uuid: Some(Uuid { value: uuid }),
                }))
            }
            .await,
        )
    }

    async fn commit_update(
        &self,
        req: Request<cv1::CommitUpdateRequest>,
    ) -> Result<Response<cv1::CommitUpdateResponse>, Status> {
        let r = req.get_ref();
        let ended = self
            .end_lease("CommitUpdate", &req, r.cell_id, r.lease_uuid.as_ref(), true)
            .await;
        counted(
            "CommitUpdate",
            ended.map(|()| Response::new(cv1::CommitUpdateResponse {})),
        )
    }

    async fn rollback_update(
        &self,
        req: Request<cv1::RollbackUpdateRequest>,
    ) -> Result<Response<cv1::RollbackUpdateResponse>, Status> {
        let r = req.get_ref();
        let ended = self
            .end_lease(
                "RollbackUpdate",
                &req,
                r.cell_id,
                r.lease_uuid.as_ref(),
                false,
            )
            .await;
        counted(
            "RollbackUpdate",
            ended.map(|()| Response::new(cv1::RollbackUpdateResponse {})),
        )
    }

    async fn list_leases(
        &self,
        req: Request<cv1::ListLeasesRequest>,
    ) -> Result<Response<cv1::ListLeasesResponse>, Status> {
        counted(
            "ListLeases",
            async {
                let r = req.get_ref();
                self.allow("ListLeases", &req, Some(r.cell_id))?;
                let cursor = r.next.as_ref().map(decode_cursor).transpose()?;
                let limit = match r.limit {
                    Some(n) if n <= 0 => {
                        return Err(Status::invalid_argument("limit: must be positive"));
                    }
                    Some(n) => usize::try_from(n).unwrap_or(claims::LEASES_PAGE),
                    None => claims::LEASES_PAGE,
                };
                let page = self
                    .0
                    .claims
                    .leases(r.cell_id, cursor.as_ref(), limit, r.created_after.as_ref())
                    .await
                    .map_err(status)?;
                Ok(Response::new(cv1::ListLeasesResponse {
                    leases: page.leases,
                    next: page.next.as_ref().map(encode_cursor),
                }))
            }
            .await,
        )
    }

    async fn list_records(
        &self,
        req: Request<cv1::ListRecordsRequest>,
    ) -> Result<Response<cv1::ListRecordsResponse>, Status> {
        counted(
            "ListRecords",
            async {
                let r = req.get_ref();
                self.allow("ListRecords", &req, Some(r.cell_id))?;
                let (records, truncated) = self
                    .0
                    .claims
                    .records(&RecordFilter {
                        cell_id: r.cell_id,
                        source_type: r.source_type,
                        bucket_types: r.bucket_types.clone(),
                        claim_types: r.claim_types.clone(),
                        source_id_gt: r.source_id_gt.clone(),
                        source_id_lte: r.source_id_lte.clone(),
                    })
                    .await
                    .map_err(status)?;
                Ok(Response::new(cv1::ListRecordsResponse {
                    records,
                    truncated,
                }))
            }
            .await,
        )
    }
}

/// gRPC's health service: `SERVING` for the whole server (`""`) and each of the
/// Topology Service's services, `NOT_FOUND` for any other name.
#[derive(Clone)]
pub struct Health;

const SERVICES: &[&str] = &[
    "",
    "gitlab.cells.topology_service.ClassifyService",
    "gitlab.cells.topology_service.CellService",
    "gitlab.cells.topology_service.claims.v1.ClaimService",
];

fn serving(service: &str) -> Result<HealthCheckResponse, Status> {
    if SERVICES.contains(&service) {
        Ok(HealthCheckResponse {
            status: ServingStatus::Serving as i32,
        })
    } else {
        Err(Status::not_found(format!("unknown service {service:?}")))
    }
}

#[tonic::async_trait]
impl crate::proto::grpc::health::v1::health_server::Health for Health {
    async fn check(
        &self,
        req: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        counted(
            "health:Check",
            async { serving(&req.get_ref().service).map(Response::new) }.await,
        )
    }

    type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

    async fn watch(
        &self,
        req: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        // The status never changes while the process serves: send it, then hold the
        // stream open as the health protocol's watchers expect.
        let first = serving(&req.get_ref().service);
        let stream = futures_util::stream::iter([first]).chain(futures_util::stream::pending());
        Ok(Response::new(Box::pin(stream)))
    }
}
