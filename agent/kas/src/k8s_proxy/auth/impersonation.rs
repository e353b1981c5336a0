//! The identity the cluster sees: GitLab's kas's `construct…ImpersonationConfig`
//! in `internal/module/kubernetes_api/server/proxy.go`, from GitLab's answer about a
//! user or a CI job.

use podgate_agent::proto::kubernetes_api::{ExtraKeyVal, ImpersonationConfig};

use super::gitlab_api::{AllowedAgent, AllowedAgentsForJob, AuthorizeProxyUserResponse};

fn extra(key: &str, value: impl Into<String>) -> ExtraKeyVal {
    ExtraKeyVal {
        key: key.into(),
        val: vec![value.into()],
    }
}

/// `constructUserImpersonationConfig`, `impUserGroups`, `impUserExtra`.
pub(crate) fn user_impersonation(
    auth: &AuthorizeProxyUserResponse,
    access_type: &str,
) -> Option<ImpersonationConfig> {
    let user = auth.access_as.user.as_ref()?;
    let mut groups = vec!["gitlab:user".to_owned()];
    for p in &user.projects {
        for role in &p.roles {
            groups.push(format!("gitlab:project_role:{}:{role}", p.id));
        }
    }
    for g in &user.groups {
        for role in &g.roles {
            groups.push(format!("gitlab:group_role:{}:{role}", g.id));
        }
    }
    Some(ImpersonationConfig {
        username: format!("gitlab:user:{}", auth.user.username),
        groups,
        uid: String::new(),
        extra: vec![
            extra("agent.gitlab.com/id", auth.agent.id.to_string()),
            extra("agent.gitlab.com/username", auth.user.username.clone()),
            extra("agent.gitlab.com/access_type", access_type),
            extra(
                "agent.gitlab.com/config_project_id",
                auth.agent.config_project.id.to_string(),
            ),
        ],
    })
}

/// `constructJobImpersonationConfig`, `impCiJobGroups`, `impCiJobExtra`.
pub(crate) fn job_impersonation(
    job: &AllowedAgentsForJob,
    agent: &AllowedAgent,
) -> Option<ImpersonationConfig> {
    let access_as = agent.configuration.as_ref()?.access_as.as_ref()?;
    if let Some(i) = &access_as.impersonate {
        return Some(ImpersonationConfig {
            username: i.username.clone(),
            groups: i.groups.clone(),
            uid: i.uid.clone(),
            extra: i
                .extra
                .iter()
                .map(|kv| ExtraKeyVal {
                    key: kv.key.clone(),
                    val: kv.val.clone(),
                })
                .collect(),
        });
    }
    access_as.ci_job.as_ref()?;
    let mut groups = vec!["gitlab:ci_job".to_owned()];
    for g in &job.project.groups {
        groups.push(format!("gitlab:group:{}", g.id));
        if let Some(env) = &job.environment {
            groups.push(format!("gitlab:group_env_tier:{}:{}", g.id, env.tier));
        }
    }
    groups.push(format!("gitlab:project:{}", job.project.id));
    if let Some(env) = &job.environment {
        groups.push(format!(
            "gitlab:project_env:{}:{}",
            job.project.id, env.slug
        ));
        groups.push(format!(
            "gitlab:project_env_tier:{}:{}",
            job.project.id, env.tier
        ));
    }
    let mut extras = vec![
        extra("agent.gitlab.com/id", agent.id.to_string()),
        extra(
            "agent.gitlab.com/config_project_id",
            agent.config_project.id.to_string(),
        ),
        extra("agent.gitlab.com/project_id", job.project.id.to_string()),
        extra(
            "agent.gitlab.com/ci_pipeline_id",
            job.pipeline.id.to_string(),
        ),
        extra("agent.gitlab.com/ci_job_id", job.job.id.to_string()),
        extra("agent.gitlab.com/username", job.user.username.clone()),
    ];
    if let Some(env) = &job.environment {
        extras.push(extra("agent.gitlab.com/environment_slug", env.slug.clone()));
        extras.push(extra("agent.gitlab.com/environment_tier", env.tier.clone()));
    }
    Some(ImpersonationConfig {
        username: format!("gitlab:ci_job:{}", job.job.id),
        groups,
        uid: String::new(),
        extra: extras,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_access_impersonates_with_roles_and_extra() {
        let auth: AuthorizeProxyUserResponse = serde_json::from_value(serde_json::json!({
            "agent": {"id": 3, "config_project": {"id": 1001}},
            "user": {"id": 1, "username": "root"},
            "access_as": {"user": {
                "projects": [{"id": 1001, "roles": ["guest", "developer"]}],
                "groups": [{"id": 100, "roles": ["owner"]}]
            }}
        }))
        .unwrap();
        let imp = user_impersonation(&auth, "personal_access_token").unwrap();
        assert_eq!(imp.username, "gitlab:user:root");
        assert_eq!(
            imp.groups,
            [
                "gitlab:user",
                "gitlab:project_role:1001:guest",
                "gitlab:project_role:1001:developer",
                "gitlab:group_role:100:owner"
            ]
        );
        let extra: Vec<(String, Vec<String>)> =
            imp.extra.into_iter().map(|e| (e.key, e.val)).collect();
        assert_eq!(
            extra,
            [
                ("agent.gitlab.com/id".into(), vec!["3".into()]),
                ("agent.gitlab.com/username".into(), vec!["root".into()]),
                (
                    "agent.gitlab.com/access_type".into(),
                    vec!["personal_access_token".into()]
                ),
                (
                    "agent.gitlab.com/config_project_id".into(),
                    vec!["1001".into()]
                ),
            ]
        );
        let agent: AuthorizeProxyUserResponse = serde_json::from_value(serde_json::json!({
            "agent": {"id": 3, "config_project": {"id": 1001}},
            "user": {"id": 1, "username": "root"},
            "access_as": {"agent": {}}
        }))
        .unwrap();
        assert!(user_impersonation(&agent, "session_cookie").is_none());
    }

    fn job(access_as: serde_json::Value, env: bool) -> AllowedAgentsForJob {
        let mut v = serde_json::json!({
            "allowed_agents": [{"id": 3, "config_project": {"id": 1001},
                                "configuration": {"access_as": access_as}}],
            "job": {"id": 77}, "pipeline": {"id": 7},
            "project": {"id": 1001, "groups": [{"id": 100}]},
            "user": {"id": 1, "username": "root", "roles_in_project": ["owner"]}
        });
        if env {
            v["environment"] = serde_json::json!({"slug": "prod", "tier": "production"});
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn ci_access_as_agent_ci_job_or_impersonate() {
        let j = job(serde_json::json!({"agent": {}}), false);
        assert!(job_impersonation(&j, &j.allowed_agents[0]).is_none());
        let j = job(serde_json::Value::Null, false);
        assert!(job_impersonation(&j, &j.allowed_agents[0]).is_none());

        let j = job(serde_json::json!({"ci_job": {}}), true);
        let imp = job_impersonation(&j, &j.allowed_agents[0]).unwrap();
        assert_eq!(imp.username, "gitlab:ci_job:77");
        assert_eq!(
            imp.groups,
            [
                "gitlab:ci_job",
                "gitlab:group:100",
                "gitlab:group_env_tier:100:production",
                "gitlab:project:1001",
                "gitlab:project_env:1001:prod",
                "gitlab:project_env_tier:1001:production"
            ]
        );
        let keys: Vec<&str> = imp.extra.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "agent.gitlab.com/id",
                "agent.gitlab.com/config_project_id",
                "agent.gitlab.com/project_id",
                "agent.gitlab.com/ci_pipeline_id",
                "agent.gitlab.com/ci_job_id",
                "agent.gitlab.com/username",
                "agent.gitlab.com/environment_slug",
                "agent.gitlab.com/environment_tier"
            ]
        );

        let j = job(
            serde_json::json!({"impersonate": {"username": "deployer", "groups": ["ops"],
                "uid": "u1", "extra": [{"key": "k", "val": ["a", "b"]}]}}),
            false,
        );
        let imp = job_impersonation(&j, &j.allowed_agents[0]).unwrap();
        assert_eq!(
            (imp.username.as_str(), imp.groups, imp.uid.as_str()),
            ("deployer", vec!["ops".to_owned()], "u1")
        );
        assert_eq!(imp.extra[0].val, ["a", "b"]);
    }
}
