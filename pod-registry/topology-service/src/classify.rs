//! `ClassifyService/Classify`: which Cell serves a request, by an ordered chain of
//! claims (the first claimed one wins) or by type (`FIRST_CELL`, `SESSION_PREFIX`,
//! `CELL_ID`).
//!
//! GitLab's Topology Service reserves the request's field 4 (`claim`, one claim)
//! since it took `claims` (field 5, the chain); gitlab-shell at
//! `gitlabhq/gitlab-shell` `internal/topology/client.go` still sends field 4. This
//! service reads both: field 4 as a chain of one when `claims` is empty.

use crate::cells::Cells;
use crate::claims::Key;
use crate::proto::gitlab::cells::topology_service::types::v1::Claim;
use crate::proto::gitlab::cells::topology_service::{
    ClassifyAction, ClassifyResponse, ClassifyType, ProxyInfo,
};

/// `gitlab.cells.topology_service.ClassifyRequest` as the newest schema has it,
/// and the retired field 4 besides. The generated stubs use this type
/// (`build.rs`, `extern_path`); its encoding of fields 2, 3 and 5 is the schema's.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct ClassifyRequest {
    /// `ClassifyType`.
    #[prost(
        enumeration = "crate::proto::gitlab::cells::topology_service::ClassifyType",
        tag = "2"
    )]
    pub r#type: i32,
    /// The type's value: a session prefix, a Cell id.
    #[prost(string, tag = "3")]
    pub value: ::prost::alloc::string::String,
    /// The retired single claim (`oneof classification_key { Claim claim = 4; }`).
    #[prost(message, optional, tag = "4")]
    pub claim: ::core::option::Option<Claim>,
    /// The claims, in the order they are tried.
    #[prost(message, repeated, tag = "5")]
    pub claims: ::prost::alloc::vec::Vec<Claim>,
}

/// Why a request could not be classified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// `INVALID_ARGUMENT`, with the Topology Service's message (`invalid type:
    /// "UNSPECIFIED"`).
    #[error("{0}")]
    InvalidArgument(String),
    /// `NOT_FOUND`: no Cell for it (`cell not found: "<value>"`).
    #[error("{0}")]
    NotFound(String),
}

/// The claims a request asks about, in order: `claims`, else the retired `claim`.
pub fn chain(req: &ClassifyRequest) -> Vec<&Claim> {
    if req.claims.is_empty() {
        req.claim.iter().collect()
    } else {
        req.claims.iter().collect()
    }
}

/// Classifies `req`: by its claims, each looked up in `owners` (the owning Cell of
/// each claim of [`chain`], in the same order; `None`: unclaimed), else by type.
pub fn classify(
    req: &ClassifyRequest,
    cells: &Cells,
    owners: &[Option<i64>],
) -> Result<ClassifyResponse, Error> {
    let claims = chain(req);
    if !claims.is_empty() {
        for (claim, owner) in claims.iter().zip(owners) {
            if let Some(cell) = owner.and_then(|id| cells.by_id(id)) {
                return Ok(proxy(&cell.address, Some((*claim).clone())));
            }
        }
        let asked: Vec<String> = claims
            .iter()
            .map(|c| Key::of_claim(c).map_or_else(|| "an empty claim".into(), |k| k.to_string()))
            .collect();
        return Err(Error::NotFound(format!(
            "no cell claims {}",
            asked.join(", ")
        )));
    }
    let not_found = || Error::NotFound(format!("cell not found: {:?}", req.value));
    let cell = match ClassifyType::try_from(req.r#type) {
        Ok(ClassifyType::FirstCell) => cells.first().ok_or_else(not_found)?,
        Ok(ClassifyType::SessionPrefix) => {
            cells.by_session_prefix(&req.value).ok_or_else(not_found)?
        }
        Ok(ClassifyType::CellId) => req
            .value
            .parse::<i64>()
            .ok()
            .and_then(|id| cells.by_id(id))
            .ok_or_else(not_found)?,
        Ok(ClassifyType::Unspecified) => {
            return Err(Error::InvalidArgument(
                "invalid type: \"UNSPECIFIED\"".into(),
            ));
        }
        Err(_) => {
            return Err(Error::InvalidArgument(format!(
                "invalid type: \"{}\"",
                req.r#type
            )));
        }
    };
    Ok(proxy(&cell.address, None))
}

fn proxy(address: &str, matched: Option<Claim>) -> ClassifyResponse {
    ClassifyResponse {
        action: ClassifyAction::Proxy as i32,
        proxy: Some(ProxyInfo {
            address: address.to_owned(),
        }),
        matched_claim: matched,
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;
    use crate::proto::gitlab::cells::topology_service::types::v1::claim::Claim as C;

    fn claim(c: C) -> Claim {
        Claim { claim: Some(c) }
    }

    /// The bytes GitLab's schema gives these requests: `claims` at field 5, the
    /// retired `claim` at 4 (gitlab-shell's), type and value at 2 and 3.
    #[test]
    fn the_request_encodes_as_gitlabs_schema_and_reads_field_4() {
        let request = ClassifyRequest {
            claims: vec![
                claim(C::Route("gitlab-org".into())),
                claim(C::ProjectId(278_964)),
            ],
            ..Default::default()
        };
        let mut want = vec![0x2a, 0x0c, 0x0a, 0x0a];
        want.extend_from_slice(b"gitlab-org");
        want.extend_from_slice(&[0x2a, 0x04, 0x30, 0xb4, 0x83, 0x11]);
        assert_eq!(request.encode_to_vec(), want);
        let mut legacy = vec![0x22, 0x0c, 0x0a, 0x0a];
        legacy.extend_from_slice(b"gitlab-org");
        let read = ClassifyRequest::decode(&legacy[..]).unwrap();
        assert_eq!(chain(&read), [&claim(C::Route("gitlab-org".into()))]);
        let mut typed = vec![0x10, 0x02, 0x1a, 0x06];
        typed.extend_from_slice(b"cell-1");
        let read = ClassifyRequest::decode(&typed[..]).unwrap();
        assert_eq!((read.r#type, read.value.as_str()), (2, "cell-1"));
        assert!(chain(&read).is_empty());
    }

    #[test]
    fn the_first_claimed_claim_wins_and_types_name_their_cell() {
        let cells = Cells::new(
            &crate::config::Config::parse(
                "listen = '127.0.0.1:0'\n[[cells]]\nid = 1\naddress = 'a:1'\nsession_prefix = 'cell-1'\n\
                 [[cells]]\nid = 2\naddress = 'b'\nsession_prefix = 'cell-2'",
                "t",
            )
            .unwrap()
            .cells,
        );
        let req = ClassifyRequest {
            claims: vec![
                claim(C::Route("x".into())),
                claim(C::Route("y".into())),
                claim(C::Route("z".into())),
            ],
            ..Default::default()
        };
        // The owner of a Cell no longer configured does not count.
        let r = classify(&req, &cells, &[None, Some(9), Some(2)]).unwrap();
        assert_eq!(r.proxy.unwrap().address, "b");
        assert_eq!(r.matched_claim, Some(claim(C::Route("z".into()))));
        assert!(matches!(
            classify(&req, &cells, &[None, None, None]),
            Err(Error::NotFound(_))
        ));
        let typed = |t: ClassifyType, v: &str| {
            classify(
                &ClassifyRequest {
                    r#type: t as i32,
                    value: v.into(),
                    ..Default::default()
                },
                &cells,
                &[],
            )
        };
        assert_eq!(
            typed(ClassifyType::FirstCell, "ignored")
                .unwrap()
                .proxy
                .unwrap()
                .address,
            "a:1"
        );
        assert_eq!(
            typed(ClassifyType::CellId, "2")
                .unwrap()
                .proxy
                .unwrap()
                .address,
            "b"
        );
        assert_eq!(
            typed(ClassifyType::SessionPrefix, "cell-3"),
            Err(Error::NotFound("cell not found: \"cell-3\"".into()))
        );
        assert_eq!(
            typed(ClassifyType::Unspecified, ""),
            Err(Error::InvalidArgument(
                "invalid type: \"UNSPECIFIED\"".into()
            ))
        );
    }
}
