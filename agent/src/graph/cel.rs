//! CEL programs of a Graph API request (docs/graph-api.md §4): compiled once per request,
//! evaluated per group/version/resource (resource expressions) or per object (object,
//! namespace and root expressions).
//!
//! Variables, as GitLab's design document lists them:
//!
//! | expression | variables |
//! |---|---|
//! | `resource_selector_expression` | `group`, `version`, `resource` (strings), `namespaced` (bool) |
//! | object / namespace / roots expressions | `obj` (the object), `group`, `version`, `resource`, `namespace`, `name` (strings), `labels`, `annotations` (maps from `obj.metadata`) |
//!
//! The standard library of the `cel` crate is enabled: `in` on lists and maps, `has()`,
//! the macros `all`, `exists`, `exists_one`, `map`, `filter`, `size`, string functions
//! (`startsWith`, `endsWith`, `contains`, `matches`), conversions; and its extension
//! libraries: strings, lists, math, base64.
//!
//! Compiling checks what can be checked without a type checker (the crate has none):
//! the source parses; it names no variable outside the table above; its outermost
//! operation is not one that can only yield a non-bool (arithmetic, a literal, a
//! list or map); and it yields a bool, or fails at run time, on a sample binding. A
//! run-time error on the sample (a missing key: `obj.status.ready == 'true'` on an
//! object without `status`) is accepted: real objects may have the key.
//!
//! Evaluation starts a root context from the shared standard environment (cheap: an
//! `Arc` clone) and binds the variables through a
//! [`::cel::context::VariableResolver`] over the borrowed object: `obj`, `labels` and
//! `annotations` are views of the JSON (see `cel_json`), strings are borrowed, so
//! nothing is copied up front and an expression pays only for what it reads.

use std::sync::{Arc, LazyLock};

use ::cel::common::types::{CelBool, CelString};
use ::cel::common::value::CowVal;
use ::cel::common::value::Val;
use ::cel::context::VariableResolver;
use ::cel::{Context, Env, ExecutionError, Program, Value};
use serde_json::Value as Json;

use super::cel_json::{JsonVal, to_val};
use super::cel_syntax::{
    MAX_NESTING, NAMESPACE_IDENT, escape_namespace, free_variables, nesting, never_bool,
};

/// The environment, built once: every evaluation starts a cheap root context from
/// it. The standard library plus the extension libraries cel-go ships and
/// Kubernetes' CEL enables (strings: `lowerAscii`, `split`, `replace`, …; lists;
/// math; base64), since which ones agentk enables is not public (docs/graph-api.md §4).
static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| {
    let mut env = Env::stdlib();
    for ext in [
        ::cel::extensions::strings as fn(&mut Env) -> _,
        ::cel::extensions::lists,
        ::cel::extensions::math,
        ::cel::extensions::encoders,
    ] {
        env.add_extension(ext)
            .expect("the cel crate's own extensions do not conflict");
    }
    Arc::new(env)
});

/// Names that are always in scope: CEL's type identifiers (`type(x) == string`).
const TYPE_NAMES: &[&str] = &[
    "bool",
    "int",
    "uint",
    "double",
    "string",
    "bytes",
    "list",
    "map",
    "null_type",
    "type",
    "dyn",
];

/// The variables of a `resource_selector_expression`.
pub const RESOURCE_VARIABLES: &[&str] = &["group", "version", "resource", "namespaced"];

/// The variables of an object, namespace or roots expression.
pub const OBJECT_VARIABLES: &[&str] = &[
    "obj",
    "group",
    "version",
    "resource",
    "namespace",
    "name",
    "labels",
    "annotations",
];

/// Which variables an expression sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// `resource_selector_expression`: [`RESOURCE_VARIABLES`].
    Resource,
    /// Object, namespace and roots expressions: [`OBJECT_VARIABLES`].
    Object,
}

/// A compiled CEL expression. Cheap to clone; `Send + Sync`, so one compiled request
/// serves every watcher task.
#[derive(Debug, Clone)]
pub struct Expr {
    source: Arc<str>,
    program: Arc<Program>,
    scope: Scope,
}

// Shared by watcher tasks through `Arc<Compiled>`.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Expr>();
};

/// The variables of a resource expression.
#[derive(Debug, Clone, Copy)]
pub struct ResourceVars<'a> {
    /// API group, `""` for core.
    pub group: &'a str,
    /// Version, e.g. `v1`.
    pub version: &'a str,
    /// Resource (plural), e.g. `deployments`.
    pub resource: &'a str,
    /// Whether the resource is namespaced.
    pub namespaced: bool,
}

/// The variables of an object expression; `labels` and `annotations` are taken from
/// `obj.metadata`.
#[derive(Debug, Clone, Copy)]
pub struct ObjectVars<'a> {
    /// The whole object.
    pub obj: &'a Json,
    /// API group, `""` for core.
    pub group: &'a str,
    /// Version, e.g. `v1`.
    pub version: &'a str,
    /// Resource (plural), e.g. `pods`.
    pub resource: &'a str,
    /// Namespace, `""` for cluster-scoped objects.
    pub namespace: &'a str,
    /// Name.
    pub name: &'a str,
}

impl Expr {
    /// Compile an object, namespace or roots expression ([`Scope::Object`]).
    pub fn compile(src: &str) -> Result<Expr, String> {
        Self::compile_in(src, Scope::Object)
    }

    /// Compile a `resource_selector_expression` ([`Scope::Resource`]).
    pub fn compile_resource(src: &str) -> Result<Expr, String> {
        Self::compile_in(src, Scope::Resource)
    }

    /// Compile `src` for `scope`, refusing what can be seen not to work (module docs).
    pub fn compile_in(src: &str, scope: Scope) -> Result<Expr, String> {
        if src.trim().is_empty() {
            return Err("expression is empty".into());
        }
        // Before the parser, whose recursion is bounded only for brackets.
        if nesting(src) > MAX_NESTING {
            return Err(format!(
                "expression recursion limit exceeded: {MAX_NESTING}"
            ));
        }
        let program = ENV.compile(&escape_namespace(src)).map_err(|e| {
            // The parser quotes the source it was given: show the user's spelling.
            let e = e.to_string().replace(NAMESPACE_IDENT, "namespace");
            format!("does not parse: {}", e.trim())
        })?;
        let allowed = match scope {
            Scope::Resource => RESOURCE_VARIABLES,
            Scope::Object => OBJECT_VARIABLES,
        };
        let mut unknown = Vec::new();
        free_variables(program.expression(), &mut Vec::new(), &mut |name| {
            let name = if name == NAMESPACE_IDENT {
                "namespace"
            } else {
                name
            };
            if !allowed.contains(&name) && !TYPE_NAMES.contains(&name) && !unknown.contains(&name) {
                unknown.push(name);
            }
        });
        if !unknown.is_empty() {
            unknown.sort_unstable();
            return Err(format!(
                "undeclared reference to {} (variables: {})",
                unknown
                    .iter()
                    .map(|n| format!("'{n}'"))
                    .collect::<Vec<_>>()
                    .join(", "),
                allowed.join(", ")
            ));
        }
        if let Some(what) = never_bool(&program.expression().expr) {
            return Err(format!("must evaluate to a boolean, not {what}"));
        }
        let expr = Expr {
            source: src.into(),
            program: Arc::new(program),
            scope,
        };
        let sample = match scope {
            Scope::Resource => expr.run(&ResourceResolver::new(&SAMPLE_RESOURCE)),
            Scope::Object => expr.run(&ObjectResolver::new(&sample_object())),
        };
        match sample {
            Ok(Ok(_)) => Ok(expr),
            Ok(Err(t)) => Err(format!("must evaluate to a boolean, got {t} on a sample")),
            Err(ExecutionError::UndeclaredReference(name)) => {
                Err(format!("undeclared reference to '{name}'"))
            }
            // A run-time error on the sample (e.g. a missing key): fine, real objects
            // may have what the sample lacks.
            Err(_) => Ok(expr),
        }
    }

    /// The source text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Which variables the expression was compiled for.
    pub fn scope(&self) -> Scope {
        self.scope
    }

    /// Evaluate a resource expression. An error is a run-time error or a non-bool
    /// result.
    pub fn eval_resource(&self, v: &ResourceVars<'_>) -> Result<bool, String> {
        to_bool(self.run(&ResourceResolver::new(v)))
    }

    /// Evaluate an object expression. An error is a run-time error (e.g. a missing
    /// key) or a non-bool result.
    pub fn eval_object(&self, v: &ObjectVars<'_>) -> Result<bool, String> {
        to_bool(self.run(&ObjectResolver::new(v)))
    }

    /// Evaluate with `resolver`: the bool, or the type name of a non-bool result, or
    /// the run-time error.
    fn run(&self, resolver: &dyn VariableResolver) -> Result<Result<bool, String>, ExecutionError> {
        let mut ctx = Context::with_env(Arc::clone(&ENV));
        ctx.set_variable_resolver(resolver);
        let v = Value::resolve_val(self.program.expression(), &ctx)?;
        Ok(match v.downcast_ref::<CelBool>() {
            Some(b) => Ok(*b.inner()),
            None => Err(v.get_type().name().to_owned()),
        })
    }
}

fn to_bool(r: Result<Result<bool, String>, ExecutionError>) -> Result<bool, String> {
    match r {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(t)) => Err(format!("must evaluate to a boolean, got {t}")),
        Err(e) => Err(e.to_string()),
    }
}

const SAMPLE_RESOURCE: ResourceVars<'static> = ResourceVars {
    group: "apps",
    version: "v1",
    resource: "deployments",
    namespaced: true,
};

static SAMPLE_OBJECT: LazyLock<Json> = LazyLock::new(|| {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "sample",
            "namespace": "default",
            "uid": "00000000-0000-0000-0000-000000000000",
            "resourceVersion": "1",
            "labels": {"app": "sample"},
            "annotations": {"example.com/note": "sample"}
        },
        "data": {"key": "value"}
    })
});

fn sample_object() -> ObjectVars<'static> {
    ObjectVars {
        obj: &SAMPLE_OBJECT,
        group: "",
        version: "v1",
        resource: "configmaps",
        namespace: "default",
        name: "sample",
    }
}

/// Resolves resource variables, each built once per evaluation.
struct ResourceResolver<'a> {
    group: CelString<'a>,
    version: CelString<'a>,
    resource: CelString<'a>,
    namespaced: CelBool,
}

impl<'a> ResourceResolver<'a> {
    fn new(v: &ResourceVars<'a>) -> Self {
        ResourceResolver {
            group: CelString::from(v.group),
            version: CelString::from(v.version),
            resource: CelString::from(v.resource),
            namespaced: CelBool::from(v.namespaced),
        }
    }
}

impl VariableResolver for ResourceResolver<'_> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        Some(CowVal::Borrowed(match variable {
            "group" => &self.group,
            "version" => &self.version,
            "resource" => &self.resource,
            "namespaced" => &self.namespaced,
            _ => return None,
        }))
    }
}

/// `{}`, for an object without labels or annotations.
static EMPTY_OBJECT: LazyLock<Json> = LazyLock::new(|| Json::Object(serde_json::Map::new()));

/// Resolves object variables: views of the borrowed object, nothing copied.
struct ObjectResolver<'a> {
    obj: Box<dyn Val + 'a>,
    labels: JsonVal<'a>,
    annotations: JsonVal<'a>,
    group: CelString<'a>,
    version: CelString<'a>,
    resource: CelString<'a>,
    namespace: CelString<'a>,
    name: CelString<'a>,
}

impl<'a> ObjectResolver<'a> {
    fn new(v: &ObjectVars<'a>) -> Self {
        let meta = |field: &str| {
            let m = v
                .obj
                .get("metadata")
                .and_then(|m| m.get(field))
                .filter(|m| m.is_object())
                .unwrap_or(&EMPTY_OBJECT);
            JsonVal::new(m)
        };
        ObjectResolver {
            obj: to_val(v.obj),
            labels: meta("labels"),
            annotations: meta("annotations"),
            group: CelString::from(v.group),
            version: CelString::from(v.version),
            resource: CelString::from(v.resource),
            namespace: CelString::from(v.namespace),
            name: CelString::from(v.name),
        }
    }
}

impl VariableResolver for ObjectResolver<'_> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        Some(CowVal::Borrowed(match variable {
            "obj" => self.obj.as_ref(),
            "labels" => &self.labels,
            "annotations" => &self.annotations,
            "group" => &self.group,
            "version" => &self.version,
            "resource" => &self.resource,
            NAMESPACE_IDENT => &self.namespace,
            "name" => &self.name,
            _ => return None,
        }))
    }
}

#[cfg(test)]
#[path = "cel_tests.rs"]
mod tests;
