//! The client's request (the first WebSocket message; GitLab's Graph API design,
//! "Client request"): its serde model, and [`compile`], which parses and validates it
//! into CEL programs, selectors and JSONPath templates ready to evaluate.
//!
//! Validation (graph-api.md §3 "Validation errors"; GitLab's messages are not public,
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

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::cel::{Expr, Scope};
use super::decode::{locate, non_object};
use super::jsonpath::JsonPath;
use crate::selector::{FieldSelector, LabelSelector};

/// The request JSON.
#[derive(Deserialize, Serialize, Default, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GraphRequest {
    /// Which group/version/resources to watch; the first matching query decides.
    #[serde(default)]
    pub queries: Vec<Query>,
    /// Which namespaces to watch; absent: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<Namespaces>,
    /// Root selection; absent: every object is visible.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roots: Option<Roots>,
}

/// One query: exactly one of `include` and `exclude` is set.
#[derive(Deserialize, Serialize, Default, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Query {
    /// Watch the matching group/version/resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include: Option<Include>,
    /// Skip the matching group/version/resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude: Option<Exclude>,
}

/// An `include` query.
#[derive(Deserialize, Serialize, Default, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Include {
    /// CEL over `group`, `version`, `resource`, `namespaced`.
    #[serde(default)]
    pub resource_selector_expression: String,
    /// How to filter the objects and what of them to send.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<ObjectFilter>,
}

/// An `exclude` query.
#[derive(Deserialize, Serialize, Default, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Exclude {
    /// CEL over `group`, `version`, `resource`, `namespaced`.
    #[serde(default)]
    pub resource_selector_expression: String,
}

/// `include.object`: per-object filters and the JSONPath of what to send.
#[derive(Deserialize, Serialize, Default, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ObjectFilter {
    /// Label selector, applied by the API server.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub label_selector: String,
    /// Field selector, applied by the API server.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub field_selector: String,
    /// CEL over the object's variables, applied by agentk.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub object_selector_expression: String,
    /// kubectl JSONPath template: send `j` (its results) instead of `o`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub json_path: String,
}

/// `namespaces`: a list of names, or all namespaces filtered by selectors; CEL on top
/// of either.
#[derive(Deserialize, Serialize, Default, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Namespaces {
    /// Watch exactly these namespaces ("names" mode).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    /// Label selector on Namespace objects ("all namespaces" mode only).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub label_selector: String,
    /// Field selector on Namespace objects ("all namespaces" mode only).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub field_selector: String,
    /// CEL over the Namespace object's variables.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub object_selector_expression: String,
}

/// `roots`: objects from which visible objects are reachable.
#[derive(Deserialize, Serialize, Default, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Roots {
    /// CEL expressions, OR-ed in order; empty: no root filtering.
    #[serde(default)]
    pub object_selector_expressions: Vec<String>,
    /// Arc types walked in both directions: `or`, `r`, `t`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignore_arc_direction: Vec<String>,
}

/// A validated request, ready to evaluate. `Send + Sync`: watcher tasks share it
/// through an `Arc`.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The queries, in order.
    pub queries: Vec<CompiledQuery>,
    /// Namespace selection (all namespaces, unfiltered, when the request had none).
    pub namespaces: CompiledNamespaces,
    /// Root selection; `None`: no root filtering (no `roots`, or no expressions).
    pub roots: Option<CompiledRoots>,
}

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Compiled>();
};

/// A compiled query.
#[derive(Debug, Clone)]
pub enum CompiledQuery {
    /// Watch what `resource` matches.
    Include {
        /// The `resource_selector_expression`.
        resource: Expr,
        /// Label selector for list/watch (validated; `""` for none).
        label_selector: String,
        /// Field selector for list/watch (validated; `""` for none).
        field_selector: String,
        /// The `object_selector_expression`, if any.
        object: Option<Expr>,
        /// The `json_path`, if any: send `j` instead of `o`.
        json_path: Option<JsonPath>,
    },
    /// Skip what `resource` matches.
    Exclude {
        /// The `resource_selector_expression`.
        resource: Expr,
    },
}

impl CompiledQuery {
    /// The resource expression of either kind of query.
    pub fn resource(&self) -> &Expr {
        match self {
            CompiledQuery::Include { resource, .. } | CompiledQuery::Exclude { resource } => {
                resource
            }
        }
    }
}

/// Compiled namespace selection.
#[derive(Debug, Clone, Default)]
pub struct CompiledNamespaces {
    /// "names" mode when not empty.
    pub names: Vec<String>,
    /// Label selector on Namespaces (`""` for none; never with `names`).
    pub label_selector: String,
    /// Field selector on Namespaces (`""` for none; never with `names`).
    pub field_selector: String,
    /// CEL over each Namespace object.
    pub object: Option<Expr>,
}

impl CompiledNamespaces {
    /// Whether every namespace is selected without any filter, so cluster-wide
    /// watches serve (seed: "if no filtering is used, agent will establish
    /// cluster-wide watch").
    pub fn is_unfiltered(&self) -> bool {
        self.names.is_empty()
            && self.label_selector.is_empty()
            && self.field_selector.is_empty()
            && self.object.is_none()
    }
}

/// Compiled root selection.
#[derive(Debug, Clone)]
pub struct CompiledRoots {
    /// The root expressions, in order (at least one).
    pub exprs: Vec<Expr>,
    /// Arc types walked in both directions.
    pub ignore_arc_direction: Vec<ArcType>,
}

/// The type of an arc.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ArcType {
    /// `or`: an owner reference.
    OwnerReference,
    /// `r`: a reference the object uses itself.
    Reference,
    /// `t`: a reference the object passes on (e.g. a Deployment's pod template).
    Transitive,
}

impl ArcType {
    /// The wire name: `or`, `r`, `t`.
    pub fn as_str(self) -> &'static str {
        match self {
            ArcType::OwnerReference => "or",
            ArcType::Reference => "r",
            ArcType::Transitive => "t",
        }
    }

    /// The type of a wire name.
    pub fn parse(s: &str) -> Option<ArcType> {
        match s {
            "or" => Some(ArcType::OwnerReference),
            "r" => Some(ArcType::Reference),
            "t" => Some(ArcType::Transitive),
            _ => None,
        }
    }
}

impl fmt::Display for ArcType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

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

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
