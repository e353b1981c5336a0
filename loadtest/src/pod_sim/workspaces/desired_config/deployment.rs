//! The Deployment the devfile gem makes of the processed devfile, as
//! `devfile_resource_modifier.rb` leaves it: the main container and the tools
//! injector init container, their security context, default resources, volumes and
//! `envFrom` the env-var Secret.

use serde_json::{Value, json};

use super::super::model::DesiredState;
use super::context::Context;
use super::{
    DATA_VOLUME_NAME, DATA_VOLUME_PATH, ENV_VAR_SECRET_SUFFIX, FILE_SECRET_SUFFIX, MAIN_CONTAINER,
    RUN_AS_USER, SSH_PORT, TOOLS_IMAGE, TOOLS_INJECTOR_CONTAINER, VARIABLES_VOLUME_DEFAULT_MODE,
    VARIABLES_VOLUME_NAME, VARIABLES_VOLUME_PATH,
};

impl Context<'_> {
    /// The main container's ports: the devfile's endpoints (podgate: `spec.ports`,
    /// named `http-<port>`), then `editor-server` and `ssh-server`. A port given
    /// twice is listed once (the Kubernetes API refuses duplicate Service ports);
    /// ports outside 1–65535 are kept, for the API to refuse.
    pub(super) fn ports(&self) -> Vec<(String, u32)> {
        let spec = &self.ws.spec;
        let editor = u32::from(spec.editor_port);
        let mut out: Vec<(String, u32)> = Vec::new();
        for &p in &spec.ports {
            if p != editor && p != SSH_PORT && !out.iter().any(|(_, q)| *q == p) {
                out.push((format!("http-{p}"), p));
            }
        }
        out.push(("editor-server".into(), editor));
        out.push(("ssh-server".into(), SSH_PORT));
        out
    }

    /// A container as `devfile_resource_modifier.rb` leaves it: security context,
    /// default resources (the container's own values win), the variables volume
    /// mount and `envFrom` the env-var Secret.
    fn container(&self, mut c: Value, own_resources: Value) -> Value {
        c["resources"] = merge_defaults(
            own_resources,
            &self.agent.default_resources_per_workspace_container,
        );
        c["securityContext"] = json!({
            "allowPrivilegeEscalation": self.agent.allow_privilege_escalation,
            "privileged": false,
            "runAsNonRoot": true,
            "runAsUser": RUN_AS_USER,
        });
        c["volumeMounts"] = json!([
            {"mountPath": DATA_VOLUME_PATH, "name": DATA_VOLUME_NAME},
            {"name": VARIABLES_VOLUME_NAME, "mountPath": VARIABLES_VOLUME_PATH},
        ]);
        c["envFrom"] = json!([
            {"secretRef": {"name": format!("{}{ENV_VAR_SECRET_SUFFIX}", self.ws.name)}}
        ]);
        c
    }

    pub(super) fn deployment(&self) -> Value {
        let ws = self.ws;
        let annotations = self.workspace_partial_annotations();
        // config_to_apply_builder.rb's update_spec_replicas: 1 only for desired
        // Running (the older generator's get_workspace_replicas looked for Running
        // or CreationRequested in desired_state, which never holds the latter).
        let replicas = u32::from(ws.desired_state == DesiredState::Running);
        let ports: Vec<Value> = self
            .ports()
            .into_iter()
            .map(|(name, port)| json!({"containerPort": port, "name": name, "protocol": "TCP"}))
            .collect();
        let main = self.container(
            json!({
                "name": MAIN_CONTAINER,
                "image": ws.spec.image,
                "imagePullPolicy": "Always",
                "command": ["/bin/sh", "-c"],
                "args": ["${GL_TOOLS_DIR}/init_tools.sh"],
                "env": [
                    {"name": "GL_TOOLS_DIR", "value": "/projects/.gl-tools"},
                    {"name": "GL_EDITOR_LOG_LEVEL", "value": "info"},
                    {"name": "GL_EDITOR_PORT", "value": ws.spec.editor_port.to_string()},
                    {"name": "GL_SSH_PORT", "value": SSH_PORT.to_string()},
                    {"name": "GL_EDITOR_ENABLE_MARKETPLACE", "value": "false"},
                    {"name": "PROJECTS_ROOT", "value": DATA_VOLUME_PATH},
                    {"name": "PROJECT_SOURCE", "value": DATA_VOLUME_PATH},
                ],
                "ports": ports,
            }),
            json!({}),
        );
        let tools = self.container(
            json!({
                "name": TOOLS_INJECTOR_CONTAINER,
                "image": TOOLS_IMAGE,
                "imagePullPolicy": "Always",
                "env": [
                    {"name": "GL_TOOLS_DIR", "value": "/projects/.gl-tools"},
                    {"name": "PROJECTS_ROOT", "value": DATA_VOLUME_PATH},
                    {"name": "PROJECT_SOURCE", "value": DATA_VOLUME_PATH},
                ],
            }),
            json!({
                "limits": {"cpu": "500m", "memory": "512Mi"},
                "requests": {"cpu": "100m", "memory": "256Mi"},
            }),
        );
        let mut pod_spec = json!({
            "containers": [main],
            "initContainers": [tools],
            "securityContext": {
                "runAsNonRoot": true,
                "runAsUser": RUN_AS_USER,
                "fsGroup": 0,
                "fsGroupChangePolicy": "OnRootMismatch",
            },
            "serviceAccountName": ws.name,
            "volumes": [
                {
                    "name": DATA_VOLUME_NAME,
                    "persistentVolumeClaim": {"claimName": format!("{}-{DATA_VOLUME_NAME}", ws.name)},
                },
                {
                    "name": VARIABLES_VOLUME_NAME,
                    "projected": {
                        "defaultMode": VARIABLES_VOLUME_DEFAULT_MODE,
                        "sources": [{"secret": {"name": format!("{}{FILE_SECRET_SUFFIX}", ws.name)}}],
                    },
                },
            ],
        });
        // set_host_users: only written when the agent enables user namespaces, and
        // then with that (true) value, as Rails does.
        if self.agent.use_kubernetes_user_namespaces {
            pod_spec["hostUsers"] = Value::Bool(true);
        }
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": self.devfile_metadata(&ws.name, &annotations),
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": self.labels},
                "strategy": {"type": "Recreate"},
                "template": {
                    "metadata": self.devfile_metadata(&ws.name, &annotations),
                    "spec": pod_spec,
                },
            },
            "status": {},
        })
    }
}

/// `own.deep_merge(defaults) { |_, own, _| own }`: the defaults fill what the
/// container does not set.
fn merge_defaults(own: Value, defaults: &Value) -> Value {
    match (own, defaults) {
        (Value::Object(mut own), Value::Object(defaults)) => {
            for (k, d) in defaults {
                let merged = match own.remove(k) {
                    Some(o) => merge_defaults(o, d),
                    None => d.clone(),
                };
                own.insert(k.clone(), merged);
            }
            Value::Object(own)
        }
        (own, _) => own,
    }
}
