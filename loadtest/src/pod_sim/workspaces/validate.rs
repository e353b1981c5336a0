//! The reconcile parameters' JSON schema, checked as Rails checks it
//! (`ee/lib/remote_development/workspace_operations/reconcile/input/params_validator.rb`,
//! `pavankalisetti009/gitlab` mirror): `update_type` (`partial` or `full`) and
//! `workspace_agent_infos` (an array) are required; an agent info's
//! `termination_progress` is `Terminating` or `Terminated`; its `error_details`
//! needs an `error_type` of `applier` or `kubernetes`, and `error_message` is a
//! string. Nothing else is checked: an agent info that is not an object, or an
//! `error_details` that is a string, passes (`properties` and `required` only apply
//! to objects).
//!
//! Rails runs JSONSchemer (json_schemer 2.x) and words every error with
//! `JSONSchemer::Errors.pretty` (`lib/json_schemer/errors.rb`): `root is missing
//! required keys: a, b`, `property '/x' is not of type: string`, `property '/x' is
//! not one of: ["partial", "full"]`, in the order json_schemer yields them (depth
//! first, keywords in the schema's order). The errors are joined with `". "` behind
//! the message class's humanised name (`Gitlab::Fp::MessageSupport`):
//! `Workspace reconcile params validation failed: <errors>`.

use serde_json::Value;

/// The message every validation failure starts with.
pub const PREFIX: &str = "Workspace reconcile params validation failed";

/// One JSON-schema keyword of the few Rails' schema uses, in schema order.
enum Keyword {
    Type(&'static str),
    Enum(&'static [&'static str]),
    Required(&'static [&'static str]),
    Properties(Vec<(&'static str, Schema)>),
    Items(Box<Schema>),
}

/// A schema: its keywords in the order Rails' Hash literal lists them.
struct Schema(Vec<Keyword>);

/// Rails' schema, keyword by keyword.
fn schema() -> Schema {
    use Keyword::*;
    let error_details = Schema(vec![
        Required(&["error_type"]),
        Properties(vec![
            (
                "error_type",
                Schema(vec![Type("string"), Enum(&["applier", "kubernetes"])]),
            ),
            ("error_message", Schema(vec![Type("string")])),
        ]),
    ]);
    let agent_info = Schema(vec![Properties(vec![
        (
            "termination_progress",
            Schema(vec![Type("string"), Enum(&["Terminating", "Terminated"])]),
        ),
        ("error_details", error_details),
    ])]);
    Schema(vec![
        Type("object"),
        Required(&["update_type", "workspace_agent_infos"]),
        Properties(vec![
            (
                "update_type",
                Schema(vec![Type("string"), Enum(&["partial", "full"])]),
            ),
            (
                "workspace_agent_infos",
                Schema(vec![Type("array"), Items(Box::new(agent_info))]),
            ),
        ]),
    ])
}

/// JSON Schema's type test (`integer` accepts `1.0`, as json_schemer does).
fn has_type(v: &Value, ty: &str) -> bool {
    match ty {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "number" => v.is_number(),
        "integer" => v.as_f64().is_some_and(|f| f.fract() == 0.0),
        "string" => v.is_string(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        _ => true,
    }
}

/// Ruby's `Array#to_s` of strings: `["a", "b"]`.
fn ruby_array(items: &[&str]) -> String {
    let inner: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", inner.join(", "))
}

/// A JSON pointer token (`~` → `~0`, `/` → `~1`).
fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// Check `instance` at `pointer` against `schema`, adding `JSONSchemer::Errors.pretty`
/// messages in json_schemer's order.
fn check(schema: &Schema, instance: &Value, pointer: &str, errors: &mut Vec<String>) {
    let location = if pointer.is_empty() {
        "root".to_owned()
    } else {
        format!("property '{pointer}'")
    };
    for keyword in &schema.0 {
        match keyword {
            Keyword::Type(ty) => {
                if !has_type(instance, ty) {
                    errors.push(format!("{location} is not of type: {ty}"));
                }
            }
            Keyword::Enum(options) => {
                if !instance.as_str().is_some_and(|s| options.contains(&s)) {
                    errors.push(format!("{location} is not one of: {}", ruby_array(options)));
                }
            }
            Keyword::Required(keys) => {
                if let Some(o) = instance.as_object() {
                    let missing: Vec<&str> = keys
                        .iter()
                        .copied()
                        .filter(|k| !o.contains_key(*k))
                        .collect();
                    if !missing.is_empty() {
                        errors.push(format!(
                            "{location} is missing required keys: {}",
                            missing.join(", ")
                        ));
                    }
                }
            }
            Keyword::Properties(properties) => {
                if let Some(o) = instance.as_object() {
                    for (name, sub) in properties {
                        if let Some(v) = o.get(*name) {
                            check(sub, v, &format!("{pointer}/{}", escape(name)), errors);
                        }
                    }
                }
            }
            Keyword::Items(sub) => {
                if let Some(items) = instance.as_array() {
                    for (i, v) in items.iter().enumerate() {
                        check(sub, v, &format!("{pointer}/{i}"), errors);
                    }
                }
            }
        }
    }
}

/// The schema errors of reconcile `params`, worded as JSONSchemer words them, in
/// its order (empty: valid).
pub fn errors(params: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    check(&schema(), params, "", &mut errors);
    errors
}

/// `Ok` when reconcile `params` are valid; else Rails' whole message,
/// `Workspace reconcile params validation failed: <errors joined by ". ">`.
pub fn validate(params: &Value) -> Result<(), String> {
    let errors = errors(params);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(format!("{PREFIX}: {}", errors.join(". ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn what_agentk_sends_is_valid() {
        for body in [
            json!({"update_type": "full", "workspace_agent_infos": []}),
            json!({"update_type": "partial", "workspace_agent_infos": [
                {"name": "w", "namespace": "n", "latest_k8s_deployment_info": {"a": 1}},
                {"name": "w", "namespace": "n", "termination_progress": "Terminating"},
                {"name": "w", "namespace": "n", "termination_progress": "Terminated"},
                {"name": "w", "namespace": "n", "error_details": {"error_type": "applier", "error_message": "x"}},
                {"name": "w", "namespace": "n", "error_details": {"error_type": "kubernetes"}},
            ]}),
            // Unknown keys are allowed; so are infos that are not objects.
            json!({"update_type": "full", "workspace_agent_infos": ["x"], "extra": 1}),
        ] {
            assert_eq!(validate(&body), Ok(()), "{body}");
        }
    }

    #[test]
    fn errors_are_worded_and_ordered_as_jsonschemer_does() {
        let cases = [
            (
                json!({}),
                "Workspace reconcile params validation failed: root is missing required keys: update_type, workspace_agent_infos",
            ),
            (
                json!({"update_type": "sometimes", "workspace_agent_infos": []}),
                "Workspace reconcile params validation failed: property '/update_type' is not one of: [\"partial\", \"full\"]",
            ),
            (
                json!({"update_type": 5, "workspace_agent_infos": {}}),
                "Workspace reconcile params validation failed: property '/update_type' is not of type: string. \
                 property '/update_type' is not one of: [\"partial\", \"full\"]. \
                 property '/workspace_agent_infos' is not of type: array",
            ),
            (
                json!({"update_type": "full", "workspace_agent_infos": [
                    {"name": "a", "termination_progress": "Gone"},
                    {"name": "b", "error_details": {"error_message": "m"}},
                    {"name": "c", "error_details": {"error_type": "other", "error_message": 3}},
                ]}),
                "Workspace reconcile params validation failed: \
                 property '/workspace_agent_infos/0/termination_progress' is not one of: [\"Terminating\", \"Terminated\"]. \
                 property '/workspace_agent_infos/1/error_details' is missing required keys: error_type. \
                 property '/workspace_agent_infos/2/error_details/error_type' is not one of: [\"applier\", \"kubernetes\"]. \
                 property '/workspace_agent_infos/2/error_details/error_message' is not of type: string",
            ),
            (
                json!({"workspace_agent_infos": []}),
                "Workspace reconcile params validation failed: root is missing required keys: update_type",
            ),
        ];
        for (body, want) in cases {
            assert_eq!(validate(&body), Err(want.to_owned()), "{body}");
        }
    }
}
