//! CEL programs of a Graph API request (graph-api.md §4): compiled once per request,
//! evaluated per group/version/resource (resource expressions) or per object (object,
//! namespace and root expressions).
//!
//! Variables, as the seed lists them:
//!
//! | expression | variables |
//! |---|---|
//! | `resource_selector_expression` | `group`, `version`, `resource` (strings), `namespaced` (bool) |
//! | object / namespace / roots expressions | `obj` (the object), `group`, `version`, `resource`, `namespace`, `name` (strings), `labels`, `annotations` (maps from `obj.metadata`) |
//!
//! The standard library of the `cel` crate is enabled: `in` on lists and maps, `has()`,
//! the macros `all`, `exists`, `exists_one`, `map`, `filter`, `size`, string functions
//! (`startsWith`, `endsWith`, `contains`, `matches`), conversions.
//!
//! Compiling checks what can be checked without a type checker (the crate has none):
//! the source parses; it names no variable outside the table above; its outermost
//! operation is not one that can only yield a non-bool (arithmetic, a literal, a
//! list or map); and it yields a bool, or fails at run time, on a sample binding. A
//! run-time error on the sample (a missing key: `obj.status.ready == 'true'` on an
//! object without `status`) is accepted: real objects may have the key.
//!
//! Evaluation binds the variables through a [`::cel::context::VariableResolver`] over
//! the borrowed object, so nothing is converted up front; `obj` is converted to a CEL
//! value only when an expression reads it, and only once per evaluation.

use std::sync::{Arc, LazyLock};

use ::cel::common::ast::{EntryExpr, Expr as Ast, IdedExpr};
use ::cel::common::value::CowVal;
use ::cel::context::VariableResolver;
use ::cel::objects::Map as CelMap;
use ::cel::{Context, Env, ExecutionError, Program, Value};
use serde_json::Value as Json;

/// The standard environment, built once: every evaluation starts a cheap root
/// context from it.
static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| Arc::new(Env::stdlib()));

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
        let program = ENV.compile(src).map_err(|e| {
            let e = e.to_string();
            format!("does not parse: {}", e.trim())
        })?;
        let allowed = match scope {
            Scope::Resource => RESOURCE_VARIABLES,
            Scope::Object => OBJECT_VARIABLES,
        };
        let mut unknown = Vec::new();
        free_variables(program.expression(), &mut Vec::new(), &mut |name| {
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
            Scope::Resource => expr.run(&ResourceResolver(&SAMPLE_RESOURCE)),
            Scope::Object => expr.run(&ObjectResolver::new(&sample_object())),
        };
        match sample {
            Ok(Value::Bool(_)) => Ok(expr),
            Ok(v) => Err(format!(
                "must evaluate to a boolean, got {} on a sample",
                v.type_of()
            )),
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
        to_bool(self.run(&ResourceResolver(v)))
    }

    /// Evaluate an object expression. An error is a run-time error (e.g. a missing
    /// key) or a non-bool result.
    pub fn eval_object(&self, v: &ObjectVars<'_>) -> Result<bool, String> {
        to_bool(self.run(&ObjectResolver::new(v)))
    }

    fn run(&self, resolver: &dyn VariableResolver) -> Result<Value, ExecutionError> {
        let mut ctx = Context::with_env(Arc::clone(&ENV));
        ctx.set_variable_resolver(resolver);
        self.program.execute(&ctx)
    }
}

fn to_bool(r: Result<Value, ExecutionError>) -> Result<bool, String> {
    match r {
        Ok(Value::Bool(b)) => Ok(b),
        Ok(v) => Err(format!("must evaluate to a boolean, got {}", v.type_of())),
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

/// What the outermost operation of `e` yields when it can never be a bool.
fn never_bool(e: &Ast) -> Option<&'static str> {
    use ::cel::common::ast::LiteralValue as L;
    match e {
        Ast::Literal(L::Boolean(_)) => None,
        Ast::Literal(_) => Some("a literal of another type"),
        Ast::List(_) => Some("a list"),
        Ast::Map(_) => Some("a map"),
        Ast::Call(c) => match c.func_name.as_str() {
            "_+_" | "_-_" | "_*_" | "_/_" | "_%_" | "-_" => Some("an arithmetic result"),
            "size" | "int" | "uint" | "double" | "string" | "bytes" | "type" => {
                Some("a non-bool conversion")
            }
            _ => None,
        },
        _ => None,
    }
}

/// Call `found` for every identifier of `e` not bound by an enclosing comprehension
/// (`x` in `labels.all(x, …)`).
fn free_variables<'e>(e: &'e IdedExpr, bound: &mut Vec<&'e str>, found: &mut impl FnMut(&'e str)) {
    match &e.expr {
        Ast::Ident(name) => {
            if !name.starts_with('@') && !bound.contains(&name.as_str()) {
                found(name);
            }
        }
        Ast::Call(call) => {
            if let Some(t) = &call.target {
                free_variables(t, bound, found);
            }
            for a in &call.args {
                free_variables(a, bound, found);
            }
        }
        Ast::Comprehension(c) => {
            free_variables(&c.iter_range, bound, found);
            free_variables(&c.accu_init, bound, found);
            let depth = bound.len();
            bound.push(&c.iter_var);
            if let Some(v) = &c.iter_var2 {
                bound.push(v);
            }
            bound.push(&c.accu_var);
            free_variables(&c.loop_cond, bound, found);
            free_variables(&c.loop_step, bound, found);
            free_variables(&c.result, bound, found);
            bound.truncate(depth);
        }
        Ast::List(l) => {
            for x in &l.elements {
                free_variables(x, bound, found);
            }
        }
        Ast::Map(m) => entries(&m.entries, bound, found),
        Ast::Struct(s) => entries(&s.entries, bound, found),
        Ast::Select(s) => free_variables(&s.operand, bound, found),
        Ast::Literal(_) | Ast::Unspecified => {}
    }
}

fn entries<'e>(
    entries: &'e [::cel::common::ast::IdedEntryExpr],
    bound: &mut Vec<&'e str>,
    found: &mut impl FnMut(&'e str),
) {
    for entry in entries {
        match &entry.expr {
            EntryExpr::StructField(f) => free_variables(&f.value, bound, found),
            EntryExpr::MapEntry(m) => {
                free_variables(&m.key, bound, found);
                free_variables(&m.value, bound, found);
            }
        }
    }
}

struct ResourceResolver<'a>(&'a ResourceVars<'a>);

impl VariableResolver for ResourceResolver<'_> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        let v = self.0;
        let value = match variable {
            "group" => Value::from(v.group),
            "version" => Value::from(v.version),
            "resource" => Value::from(v.resource),
            "namespaced" => Value::Bool(v.namespaced),
            _ => return None,
        };
        value.try_into().ok().map(CowVal::Owned)
    }
}

/// Resolves object variables on demand; `obj` is converted once, when first read.
struct ObjectResolver<'a> {
    vars: &'a ObjectVars<'a>,
    obj: std::sync::OnceLock<Value>,
}

impl<'a> ObjectResolver<'a> {
    fn new(vars: &'a ObjectVars<'a>) -> Self {
        ObjectResolver {
            vars,
            obj: std::sync::OnceLock::new(),
        }
    }

    fn string_map(&self, field: &str) -> Value {
        let map = self
            .vars
            .obj
            .get("metadata")
            .and_then(|m| m.get(field))
            .and_then(Json::as_object);
        let entries: std::collections::HashMap<String, Value> = map
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.clone(), Value::from(v.as_str()?))))
            .collect();
        Value::Map(CelMap::from(entries))
    }
}

impl VariableResolver for ObjectResolver<'_> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        let v = self.vars;
        let value = match variable {
            "obj" => self.obj.get_or_init(|| json_to_cel(v.obj)).clone(),
            "group" => Value::from(v.group),
            "version" => Value::from(v.version),
            "resource" => Value::from(v.resource),
            "namespace" => Value::from(v.namespace),
            "name" => Value::from(v.name),
            "labels" => self.string_map("labels"),
            "annotations" => self.string_map("annotations"),
            _ => return None,
        };
        value.try_into().ok().map(CowVal::Owned)
    }
}

/// A JSON value as a CEL value: objects become maps with string keys, integers `int`
/// (or `uint` above `i64::MAX`), other numbers `double`.
pub(crate) fn json_to_cel(v: &Json) -> Value {
    match v {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::Int(i)
            } else if let Some(u) = n.as_u64() {
                Value::UInt(u)
            } else {
                Value::Float(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(a) => Value::List(Arc::new(a.iter().map(json_to_cel).collect())),
        Json::Object(o) => {
            let entries: std::collections::HashMap<String, Value> =
                o.iter().map(|(k, v)| (k.clone(), json_to_cel(v))).collect();
            Value::Map(CelMap::from(entries))
        }
    }
}
