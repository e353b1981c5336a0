//! Who may call what: GitLab's Topology Service names three caller roles (a Cell,
//! the HTTP Router, an administrator) and gives each method its rules in a method
//! option of its schema (`access_control`, field 90000 of `MethodOptions`, in
//! `proto/autz.proto`). [`RULES`] is that option, method by method, as the
//! descriptors carry it (`scripts/check-topology-protos.sh` prints them).

use tonic::{Code, Status};

/// The caller of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// A Cell's Rails, gitlab-shell or mail room, with the Cell's id.
    Cell(i64),
    /// The HTTP Router.
    Router,
    /// An operator's tools; on a listener without TLS, every caller (loopback
    /// only, as podgate's other demo listeners).
    Admin,
}

/// `gitlab.cells.topology_service.AuthorizationRule`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// `RULE_ALLOW_ANY_AUTHENTICATED`.
    AnyAuthenticated,
    /// `RULE_ALLOW_ANY_CELL`.
    AnyCell,
    /// `RULE_ALLOW_MATCHING_CELL_ONLY`: a Cell, for its own `cell_id` only.
    MatchingCellOnly,
    /// `RULE_ALLOW_ANY_ROUTER`.
    AnyRouter,
    /// `RULE_ALLOW_ANY_ADMIN`.
    AnyAdmin,
}

use Rule::{AnyAdmin, AnyAuthenticated, AnyCell, AnyRouter, MatchingCellOnly};

/// Each method's rules, any one of which admits a caller.
pub const RULES: &[(&str, &[Rule])] = &[
    (
        "/gitlab.cells.topology_service.ClassifyService/GetCells",
        &[AnyAuthenticated],
    ),
    (
        "/gitlab.cells.topology_service.ClassifyService/Classify",
        &[AnyCell, AnyRouter, AnyAdmin],
    ),
    (
        "/gitlab.cells.topology_service.CellService/GetCell",
        &[AnyAuthenticated],
    ),
    (
        "/gitlab.cells.topology_service.claims.v1.ClaimService/GetCells",
        &[AnyAuthenticated],
    ),
    (
        "/gitlab.cells.topology_service.claims.v1.ClaimService/GetRecord",
        &[AnyAdmin],
    ),
    (
        "/gitlab.cells.topology_service.claims.v1.ClaimService/BeginUpdate",
        &[MatchingCellOnly, AnyAdmin],
    ),
    (
        "/gitlab.cells.topology_service.claims.v1.ClaimService/CommitUpdate",
        &[MatchingCellOnly, AnyAdmin],
    ),
    (
        "/gitlab.cells.topology_service.claims.v1.ClaimService/RollbackUpdate",
        &[MatchingCellOnly, AnyAdmin],
    ),
    (
        "/gitlab.cells.topology_service.claims.v1.ClaimService/ListLeases",
        &[MatchingCellOnly, AnyAdmin],
    ),
    (
        "/gitlab.cells.topology_service.claims.v1.ClaimService/ListRecords",
        &[MatchingCellOnly, AnyAdmin],
    ),
];

/// Whether `caller` may call `method` (its full path) for `cell_id` (the
/// request's, where it has one): `PERMISSION_DENIED` if not, `UNAUTHENTICATED`
/// without a caller.
pub fn authorize(method: &str, caller: Option<Caller>, cell_id: Option<i64>) -> Result<(), Status> {
    let caller =
        caller.ok_or_else(|| Status::new(Code::Unauthenticated, "no client certificate"))?;
    let rules = RULES
        .iter()
        .find(|(m, _)| *m == method)
        .map_or(&[][..], |(_, r)| *r);
    let admitted = rules.iter().any(|rule| match (rule, caller) {
        (AnyAuthenticated, _)
        | (AnyCell, Caller::Cell(_))
        | (AnyRouter, Caller::Router)
        | (AnyAdmin, Caller::Admin) => true,
        (MatchingCellOnly, Caller::Cell(id)) => cell_id == Some(id),
        _ => false,
    });
    if admitted {
        Ok(())
    } else {
        Err(Status::permission_denied(format!(
            "{caller:?} may not call {method}{}",
            cell_id.map_or(String::new(), |c| format!(" for Cell {c}"))
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_role_gets_what_the_schema_gives_it() {
        let classify = "/gitlab.cells.topology_service.ClassifyService/Classify";
        let begin = "/gitlab.cells.topology_service.claims.v1.ClaimService/BeginUpdate";
        let record = "/gitlab.cells.topology_service.claims.v1.ClaimService/GetRecord";
        let cells = "/gitlab.cells.topology_service.CellService/GetCell";
        for c in [Caller::Cell(1), Caller::Router, Caller::Admin] {
            assert!(authorize(classify, Some(c), None).is_ok(), "{c:?}");
            assert!(authorize(cells, Some(c), None).is_ok(), "{c:?}");
        }
        assert!(authorize(begin, Some(Caller::Cell(2)), Some(2)).is_ok());
        assert_eq!(
            authorize(begin, Some(Caller::Cell(2)), Some(1))
                .unwrap_err()
                .code(),
            Code::PermissionDenied
        );
        assert!(authorize(begin, Some(Caller::Router), Some(1)).is_err());
        assert!(authorize(begin, Some(Caller::Admin), Some(1)).is_ok());
        assert!(authorize(record, Some(Caller::Cell(1)), None).is_err());
        assert_eq!(
            authorize(classify, None, None).unwrap_err().code(),
            Code::Unauthenticated
        );
        assert!(authorize("/x.Y/Z", Some(Caller::Admin), None).is_err());
    }
}
