//! Parsing and validating a request into its [`Compiled`] form.
//!
//! Validation (docs/graph-api.md §3 "Validation errors"; GitLab's messages are not public,
//! these are podgate's). Every problem found is reported, each naming its field:
//!
//! 1. not JSON, not an object, an unknown field or a field of the wrong type;
//! 2. `queries` missing or empty;
//! 3. a query with both or neither of `include` / `exclude`;
//! 4. an empty or invalid `resource_selector_expression`;
//! 5. an invalid object, namespace or roots expression;
//! 6. a malformed `label_selector` / `field_selector`;
//! 7. a malformed `json_path`;
//! 8. `namespaces.names` with an empty or invalid name, or together with
//!    `label_selector` / `field_selector`;
//! 9. an empty string in `roots.object_selector_expressions`;
//! 10. `roots.ignore_arc_direction` with something other than `or`, `r`, `t`, or a
//!     type twice.

use std::fmt;

use serde_json::Value;

use super::super::cel::{Expr, Scope};
use super::super::decode::{locate, non_object};
use super::super::jsonpath::JsonPath;
use super::{ArcType, Compiled, CompiledNamespaces, CompiledQuery, CompiledRoots, GraphRequest};
use crate::selector::{FieldSelector, LabelSelector};

/// One problem with a request: the field (`queries[1].include.json_path`) and what
/// is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Path of the field, e.g. `queries[0].include.resource_selector_expression`;
    /// `request` for the document itself.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Why a request was refused (kas closes with 1007). Not retryable: the request must
/// change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// Every problem found, in document order (at least one).
    #[error("{}", join(.0))]
    Invalid(Vec<FieldError>),
}

impl RequestError {
    /// The problems found.
    pub fn errors(&self) -> &[FieldError] {
        match self {
            RequestError::Invalid(e) => e,
        }
    }
}

fn join(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Parse and fully validate a request (module docs). The error's Display names each
/// bad field: `queries[1].include.resource_selector_expression: …`.
pub fn compile(json: &str) -> Result<Compiled, RequestError> {
    let req = parse(json)?;
    compile_request(&req)
}

/// Parse a request without validating its contents (only its JSON shape).
pub fn parse(json: &str) -> Result<GraphRequest, RequestError> {
    let fail = |field: &str, message: String| {
        RequestError::Invalid(vec![FieldError {
            field: field.into(),
            message,
        }])
    };
    let v: Value =
        serde_json::from_str(json).map_err(|e| fail("request", format!("invalid JSON: {e}")))?;
    // serde also decodes a struct from an array (`["true"]` as an `Include`): only
    // objects are accepted.
    if let Some((field, message)) = non_object(&v) {
        return Err(fail(&field, message));
    }
    match serde_json::from_value::<GraphRequest>(v.clone()) {
        Ok(r) => Ok(r),
        // Find the innermost part that does not decode, to name it.
        Err(e) => {
            let (field, message) = locate(&v).unwrap_or_else(|| ("request".into(), e.to_string()));
            Err(fail(&field, message))
        }
    }
}

/// Validate a parsed request and compile its expressions, selectors and templates.
pub fn compile_request(req: &GraphRequest) -> Result<Compiled, RequestError> {
    let mut errors = Vec::new();
    let mut err = |field: String, message: String| errors.push(FieldError { field, message });

    // Rules 2–7: the queries.
    if req.queries.is_empty() {
        err(
            "queries".into(),
            "required: at least one query (include or exclude)".into(),
        );
    }
    let mut queries = Vec::with_capacity(req.queries.len());
    for (i, q) in req.queries.iter().enumerate() {
        let path = format!("queries[{i}]");
        match (&q.include, &q.exclude) {
            (Some(inc), None) => {
                let p = format!("{path}.include");
                let resource = resource_expr(
                    &inc.resource_selector_expression,
                    &format!("{p}.resource_selector_expression"),
                    &mut err,
                );
                let f = inc.object.clone().unwrap_or_default();
                let p = format!("{p}.object");
                check_label_selector(&f.label_selector, &format!("{p}.label_selector"), &mut err);
                check_field_selector(&f.field_selector, &format!("{p}.field_selector"), &mut err);
                let object = optional_object_expr(
                    &f.object_selector_expression,
                    &format!("{p}.object_selector_expression"),
                    &mut err,
                );
                let json_path = if f.json_path.is_empty() {
                    Some(None)
                } else {
                    match JsonPath::parse(&f.json_path) {
                        Ok(j) => Some(Some(j)),
                        Err(e) => {
                            err(format!("{p}.json_path"), e);
                            None
                        }
                    }
                };
                if let (Some(resource), Some(object), Some(json_path)) =
                    (resource, object, json_path)
                {
                    queries.push(CompiledQuery::Include {
                        resource,
                        label_selector: f.label_selector.trim().to_owned(),
                        field_selector: f.field_selector.trim().to_owned(),
                        object,
                        json_path,
                    });
                }
            }
            (None, Some(exc)) => {
                if let Some(resource) = resource_expr(
                    &exc.resource_selector_expression,
                    &format!("{path}.exclude.resource_selector_expression"),
                    &mut err,
                ) {
                    queries.push(CompiledQuery::Exclude { resource });
                }
            }
            (Some(_), Some(_)) => err(
                path,
                "must have exactly one of include, exclude (has both)".into(),
            ),
            (None, None) => err(
                path,
                "must have exactly one of include, exclude (has neither)".into(),
            ),
        }
    }

    // Rules 5, 6, 8: namespaces.
    let ns = req.namespaces.clone().unwrap_or_default();
    for (i, n) in ns.names.iter().enumerate() {
        if n.is_empty() {
            err(
                format!("namespaces.names[{i}]"),
                "empty namespace name".into(),
            );
        } else if !is_dns_label(n) {
            err(
                format!("namespaces.names[{i}]"),
                format!(
                    "{n:?} is not a valid namespace name (at most 63 lowercase alphanumerics or '-', beginning and ending alphanumeric)"
                ),
            );
        }
    }
    if !ns.names.is_empty() {
        for (field, value) in [
            ("label_selector", &ns.label_selector),
            ("field_selector", &ns.field_selector),
        ] {
            if !value.trim().is_empty() {
                err(
                    format!("namespaces.{field}"),
                    "cannot be combined with names (names mode takes names and object_selector_expression only)".into(),
                );
            }
        }
    }
    check_label_selector(&ns.label_selector, "namespaces.label_selector", &mut err);
    check_field_selector(&ns.field_selector, "namespaces.field_selector", &mut err);
    let ns_object = optional_object_expr(
        &ns.object_selector_expression,
        "namespaces.object_selector_expression",
        &mut err,
    );

    // Rules 5, 9, 10: roots.
    let mut roots = None;
    if let Some(r) = &req.roots {
        let mut exprs = Vec::new();
        for (i, src) in r.object_selector_expressions.iter().enumerate() {
            let field = format!("roots.object_selector_expressions[{i}]");
            match Expr::compile_in(src, Scope::Object) {
                Ok(e) => exprs.push(e),
                Err(e) => err(field, e),
            }
        }
        let mut ignore = Vec::new();
        for (i, t) in r.ignore_arc_direction.iter().enumerate() {
            let field = format!("roots.ignore_arc_direction[{i}]");
            match ArcType::parse(t) {
                None => err(field, format!("unknown arc type {t:?} (expected or, r, t)")),
                Some(a) if ignore.contains(&a) => {
                    err(field, format!("arc type {t:?} given more than once"))
                }
                Some(a) => ignore.push(a),
            }
        }
        if !exprs.is_empty() {
            roots = Some(CompiledRoots {
                exprs,
                ignore_arc_direction: ignore,
            });
        }
    }

    if !errors.is_empty() {
        return Err(RequestError::Invalid(errors));
    }
    Ok(Compiled {
        queries,
        namespaces: CompiledNamespaces {
            names: ns.names,
            label_selector: ns.label_selector.trim().to_owned(),
            field_selector: ns.field_selector.trim().to_owned(),
            object: ns_object.flatten(),
        },
        roots,
    })
}

/// A required resource expression; `None` (and an error) when it is empty or bad.
fn resource_expr(src: &str, field: &str, err: &mut impl FnMut(String, String)) -> Option<Expr> {
    Expr::compile_in(src, Scope::Resource)
        .map_err(|e| err(field.to_owned(), e))
        .ok()
}

/// An optional object expression: `Some(None)` when empty, `None` when bad.
fn optional_object_expr(
    src: &str,
    field: &str,
    err: &mut impl FnMut(String, String),
) -> Option<Option<Expr>> {
    if src.is_empty() {
        return Some(None);
    }
    match Expr::compile_in(src, Scope::Object) {
        Ok(e) => Some(Some(e)),
        Err(e) => {
            err(field.to_owned(), e);
            None
        }
    }
}

fn check_label_selector(s: &str, field: &str, err: &mut impl FnMut(String, String)) {
    if let Err(e) = LabelSelector::parse(s) {
        err(field.to_owned(), e.to_string());
    }
}

fn check_field_selector(s: &str, field: &str, err: &mut impl FnMut(String, String)) {
    if let Err(e) = FieldSelector::parse(s) {
        err(field.to_owned(), e.to_string());
    }
}

/// An RFC 1123 label, what a namespace name must be.
fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}
