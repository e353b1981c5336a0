//! Label and field selectors, as `list` and `watch` take them in `labelSelector` and
//! `fieldSelector`: the parser lives in [`podgate_agent::selector`]; kube-sim adds which fields
//! it can select on.

use podgate_agent::selector::FieldSelector;
pub(super) use podgate_agent::selector::{labels_match, parse_selector};

/// Field selectors: `metadata.name`, `metadata.namespace`, `status.phase` with `=`,
/// `==`, `!=`; `get` looks up a field of the object by that name.
pub(super) fn fields_match<'a>(
    selector: &str,
    get: impl Fn(&str) -> Option<&'a str>,
) -> Result<bool, String> {
    let sel = FieldSelector::parse(selector).map_err(|e| e.to_string())?;
    if let Some(r) = sel.requirements.iter().find(|r| {
        !matches!(
            r.field.as_str(),
            "metadata.name" | "metadata.namespace" | "status.phase"
        )
    }) {
        return Err(format!("field label not supported: {}", r.field));
    }
    Ok(sel.matches(get))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn only_the_served_fields_are_selectable() {
        let pod = json!({"metadata": {"name": "p1", "namespace": "default"}, "status": {"phase": "Running"}});
        let field = |f: &str| {
            pod.pointer(&format!("/{}", f.replace('.', "/")))
                .and_then(Value::as_str)
        };
        assert_eq!(
            fields_match("metadata.name=p1,status.phase!=Pending", field),
            Ok(true)
        );
        assert_eq!(fields_match("status.phase=Pending", field), Ok(false));
        assert!(fields_match("spec.nodeName=x", field).is_err());
        assert!(fields_match("metadata.name", field).is_err());
    }
}
