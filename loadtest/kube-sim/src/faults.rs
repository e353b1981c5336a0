//! What the API refuses: kube-apiserver's own validation of Services (a port
//! outside 1–65535 is `422 Invalid`, worded as `pkg/apis/core/validation`
//! words it), and refusals a test or `--refuse` sets up ([`super::KubeSim::refuse`]):
//! writes of a resource whose name matches a pattern are denied as a validating
//! admission webhook denies them (`k8s.io/apiserver/pkg/admission/plugin/webhook/errors`
//! `ToStatusErr`: `400`, `admission webhook "…" denied the request: <message>`).

use std::sync::{Mutex, MutexGuard};

use http::StatusCode;
use serde_json::{Value, json};

use super::http::status;
use super::resources::Kind;

/// The webhook a refusal is said to come from.
pub(super) const WEBHOOK: &str = "refuse.kube-sim.podgate.dev";

/// One refusal: writes of `resource` named to match `name`.
#[derive(Debug)]
struct Refusal {
    /// The store id of the kind: `deployments.apps`, `services`.
    resource: String,
    name: regex::Regex,
    message: String,
}

/// The refusals in force.
#[derive(Debug, Default)]
pub(super) struct Faults {
    refusals: Mutex<Vec<Refusal>>,
}

impl Faults {
    fn lock(&self) -> MutexGuard<'_, Vec<Refusal>> {
        self.refusals.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Refuse creates, updates and patches of `k` whose name matches `name`.
    pub(super) fn refuse(&self, k: Kind, name: regex::Regex, message: &str) {
        self.lock().push(Refusal {
            resource: k.id(),
            name,
            message: message.to_owned(),
        });
    }

    /// Lift every refusal of `k`.
    pub(super) fn clear(&self, k: Kind) {
        let id = k.id();
        self.lock().retain(|r| r.resource != id);
    }

    /// The `Status` refusing a write of `k` named `name`, if one applies.
    pub(super) fn refused(&self, k: Kind, name: &str) -> Option<Value> {
        let id = k.id();
        let refusals = self.lock();
        let r = refusals
            .iter()
            .find(|r| r.resource == id && r.name.is_match(name))?;
        let mut s = status(
            StatusCode::BAD_REQUEST,
            "",
            &format!(
                "admission webhook {WEBHOOK:?} denied the request: {}",
                r.message
            ),
        );
        if let Some(m) = s.as_object_mut() {
            m.remove("reason");
        }
        Some(s)
    }
}

/// kube-apiserver's validation of the objects kube-sim checks: a Service's ports
/// (`ValidateService`: `spec.ports[i].port` must be between 1 and 65535). The
/// error is `422 Invalid` with one cause a field, as `apierrors.NewInvalid` makes it.
pub(super) fn validate(k: Kind, o: &Value) -> Result<(), Value> {
    if !k.group.is_empty() || k.plural != "services" {
        return Ok(());
    }
    let mut causes = Vec::new();
    for (i, p) in o["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let port = &p["port"];
        let ok = port.as_i64().is_some_and(|n| (1..=65535).contains(&n));
        if !ok {
            causes.push((
                format!("spec.ports[{i}].port"),
                format!("Invalid value: {port}: must be between 1 and 65535, inclusive"),
            ));
        }
    }
    if causes.is_empty() {
        return Ok(());
    }
    let name = o["metadata"]["name"].as_str().unwrap_or("");
    let joined: Vec<String> = causes.iter().map(|(f, m)| format!("{f}: {m}")).collect();
    let message = if joined.len() == 1 {
        format!("{} {name:?} is invalid: {}", k.kind, joined[0])
    } else {
        format!("{} {name:?} is invalid: [{}]", k.kind, joined.join(", "))
    };
    let mut s = status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", &message);
    s["details"] = json!({
        "name": name,
        "kind": k.plural,
        "causes": causes.iter().map(|(f, m)| json!({"reason": "FieldValueInvalid", "message": m, "field": f})).collect::<Vec<_>>(),
    });
    Err(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::kind;

    #[test]
    fn service_ports_outside_the_range_are_invalid() {
        let svc = kind("services").unwrap();
        let ok = json!({"metadata": {"name": "x"}, "spec": {"ports": [{"port": 80}]}});
        assert!(validate(svc, &ok).is_ok());
        let bad =
            json!({"metadata": {"name": "x"}, "spec": {"ports": [{"port": 80}, {"port": 70000}]}});
        let s = validate(svc, &bad).unwrap_err();
        assert_eq!(s["code"], 422);
        assert_eq!(s["reason"], "Invalid");
        assert_eq!(
            s["message"],
            "Service \"x\" is invalid: spec.ports[1].port: Invalid value: 70000: must be between 1 and 65535, inclusive"
        );
        assert_eq!(s["details"]["causes"][0]["field"], "spec.ports[1].port");
        // Other kinds are not checked.
        assert!(validate(kind("configmaps").unwrap(), &bad).is_ok());
    }

    #[test]
    fn refusals_match_resource_and_name() {
        let f = Faults::default();
        let deploy = kind("deployments").unwrap();
        f.refuse(deploy, regex::Regex::new("^bad-").unwrap(), "no, thanks");
        assert!(f.refused(deploy, "good").is_none());
        assert!(f.refused(kind("pods").unwrap(), "bad-1").is_none());
        let s = f.refused(deploy, "bad-1").unwrap();
        assert_eq!(s["code"], 400);
        assert_eq!(
            s["message"],
            "admission webhook \"refuse.kube-sim.podgate.dev\" denied the request: no, thanks"
        );
        f.clear(deploy);
        assert!(f.refused(deploy, "bad-1").is_none());
    }
}
