//! Label and field selectors, as `list` and `watch` take them in `labelSelector` and
//! `fieldSelector`.

/// One requirement of a label selector.
#[derive(Debug, PartialEq)]
pub(super) enum Requirement {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// Parse a label selector (`a=b,c!=d,e in (f,g),h notin (i),j,!k`).
pub(super) fn parse_selector(s: &str) -> Result<Vec<Requirement>, String> {
    let mut reqs = Vec::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        // Split at the next comma outside parentheses.
        let mut depth = 0;
        let end = rest
            .char_indices()
            .find(|&(_, c)| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                c == ',' && depth == 0
            })
            .map_or(rest.len(), |(i, _)| i);
        let term = rest[..end].trim();
        rest = rest[end..].trim_start_matches(',').trim();
        let set = |inner: &str| -> Vec<String> {
            inner
                .trim()
                .trim_start_matches('(')
                .trim_end_matches(')')
                .split(',')
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
                .collect()
        };
        let req = if let Some((k, v)) = term.split_once("!=") {
            Requirement::NotEq(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = term.split_once("==") {
            Requirement::Eq(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = term.split_once('=') {
            Requirement::Eq(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = term.split_once(" notin ") {
            Requirement::NotIn(k.trim().into(), set(v))
        } else if let Some((k, v)) = term.split_once(" in ") {
            Requirement::In(k.trim().into(), set(v))
        } else if let Some(k) = term.strip_prefix('!') {
            Requirement::NotExists(k.trim().into())
        } else if !term.is_empty() && !term.contains(char::is_whitespace) {
            Requirement::Exists(term.into())
        } else {
            return Err(format!("unable to parse requirement: {term:?}"));
        };
        reqs.push(req);
    }
    Ok(reqs)
}

/// Whether an object's labels (`get` looks one up) meet every requirement.
pub(super) fn labels_match<'a>(
    reqs: &[Requirement],
    get: impl Fn(&str) -> Option<&'a str>,
) -> bool {
    reqs.iter().all(|r| match r {
        Requirement::Eq(k, v) => get(k) == Some(v.as_str()),
        Requirement::NotEq(k, v) => get(k) != Some(v.as_str()),
        Requirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
        Requirement::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
        Requirement::Exists(k) => get(k).is_some(),
        Requirement::NotExists(k) => get(k).is_none(),
    })
}

/// Field selectors: `metadata.name`, `metadata.namespace`, `status.phase` with `=`,
/// `==`, `!=`; `get` looks up a field of the object by that name.
pub(super) fn fields_match<'a>(
    selector: &str,
    get: impl Fn(&str) -> Option<&'a str>,
) -> Result<bool, String> {
    for term in selector.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (field, want, negate) = if let Some((f, v)) = term.split_once("!=") {
            (f, v, true)
        } else if let Some((f, v)) = term.split_once("==") {
            (f, v, false)
        } else if let Some((f, v)) = term.split_once('=') {
            (f, v, false)
        } else {
            return Err(format!("invalid field selector: {term:?}"));
        };
        let field = match field.trim() {
            f @ ("metadata.name" | "metadata.namespace" | "status.phase") => f,
            other => return Err(format!("field label not supported: {other}")),
        };
        let have = get(field).unwrap_or("");
        if (have == want.trim()) == negate {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn label_selectors_parse_and_match() {
        let labels = json!({"app": "web", "tier": "front", "env": "prod"});
        for (sel, want) in [
            ("app=web", true),
            ("app==web,tier=front", true),
            ("app!=web", false),
            ("env in (prod, staging)", true),
            ("env notin (prod)", false),
            ("tier", true),
            ("!tier", false),
            ("!missing,app in (web),env notin (dev,qa)", true),
            ("missing", false),
        ] {
            assert_eq!(
                labels_match(&parse_selector(sel).unwrap(), |k| labels
                    .get(k)
                    .and_then(Value::as_str)),
                want,
                "{sel}"
            );
        }
        assert!(parse_selector("a b").is_err());
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
    }
}
