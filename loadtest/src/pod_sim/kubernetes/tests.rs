//! Tests of the users, tokens and agents behind kas's two endpoints, as Rails answers them.

use podgate_tokens::TokenKind;

use super::*;

fn pod() -> PodId {
    PodId::new(2).unwrap()
}

fn access() -> KubeAccess {
    let mut as_agent = AgentSpec::with_user_access(8, pod());
    as_agent.user_access.as_mut().unwrap().access_as =
        Some([("agent".to_owned(), json!({}))].into_iter().collect());
    as_agent.user_access.as_mut().unwrap().projects.clear();
    as_agent.user_access.as_mut().unwrap().groups = vec![PathRef { id: "group".into() }];
    let none = AgentSpec {
        id: 9,
        name: "no-user-access".into(),
        user_access: None,
        ci_access: Some(CiAccessConfig {
            projects: vec![CiAccessEntry {
                id: "group/project-2".into(),
                default_namespace: "ci".into(),
                access_as: Some(json!({"ci_job": {}})),
                environments: Vec::new(),
            }],
            groups: Vec::new(),
        }),
    };
    let a = KubeAccess::new(
        pod(),
        &[AgentSpec::with_user_access(7, pod()), as_agent, none],
    );
    a.add_pat("glpat-root".into(), 1, vec!["k8s_proxy".into()])
        .unwrap();
    a.add_pat("glpat-api".into(), 1, vec!["read_api".into()])
        .unwrap();
    let dev = a.add_user("dev", Some("developer")).unwrap();
    a.add_pat("glpat-dev".into(), dev, vec!["k8s_proxy".into()])
        .unwrap();
    let guest = a.add_user("guest", Some("reporter")).unwrap();
    a.add_pat("glpat-guest".into(), guest, vec!["k8s_proxy".into()])
        .unwrap();
    a.add_session(dev, "sess".into(), "csrf".into()).unwrap();
    a
}

#[test]
fn user_access_as_user_lists_roles() {
    let a = access();
    let v = a
        .authorize_proxy_user(7, "personal_access_token", "glpat-dev", None)
        .unwrap();
    assert_eq!(v["agent"], json!({"id": 7, "config_project": {"id": 1002}}));
    assert_eq!(v["user"]["username"], "dev");
    assert_eq!(
        v["access_as"]["user"]["projects"],
        json!([{"id": 1002, "roles": ["guest", "planner", "reporter", "developer"]}])
    );
    assert_eq!(v["access_as"]["user"]["groups"], json!([]));
    let v = a
        .authorize_proxy_user(8, "session_cookie", "sess", Some("csrf"))
        .unwrap();
    assert_eq!(v["access_as"], json!({"agent": {}}));
}

#[test]
fn refusals_as_rails_answers_them() {
    let a = access();
    let status = |r: Result<Value, Refusal>| r.unwrap_err().0;
    assert_eq!(
        status(a.authorize_proxy_user(7, "personal_access_token", "glpat-nope", None)),
        400
    );
    assert_eq!(
        status(a.authorize_proxy_user(7, "personal_access_token", "glpat-api", None)),
        403
    );
    assert_eq!(
        status(a.authorize_proxy_user(7, "personal_access_token", "glpat-guest", None)),
        403
    );
    assert_eq!(
        status(a.authorize_proxy_user(99, "personal_access_token", "glpat-dev", None)),
        404
    );
    assert_eq!(
        status(a.authorize_proxy_user(9, "personal_access_token", "glpat-dev", None)),
        403
    );
    assert_eq!(
        status(a.authorize_proxy_user(7, "session_cookie", "sess", Some("bad"))),
        401
    );
    assert_eq!(
        status(a.authorize_proxy_user(7, "session_cookie", "other", Some("csrf"))),
        401
    );
    assert!(a.revoke_pat(1));
    assert_eq!(
        status(a.authorize_proxy_user(7, "personal_access_token", "glpat-root", None)),
        401
    );
}

#[test]
fn agent_tokens_opaque_and_jwt() {
    use podgate_tokens::{MintRequest, mint};
    let mut keys = KeySet::new();
    keys.add_hs256("k", &[7u8; 32], std::path::Path::new("test"))
        .unwrap();
    let a = access().with_keys(keys.clone());
    assert!(a.add_agent_token("glagent-x".into(), 99).is_err());
    a.add_agent_token("glagent-seven".into(), 7).unwrap();
    assert_eq!(
        a.agent_for_token("glagent-seven"),
        AgentTokenOwner::Agent(7)
    );
    assert_eq!(a.agent_for_token("glagent-other"), AgentTokenOwner::Unknown);
    let jwt = |pod: u64, agent: Option<u64>, kind: TokenKind| {
        let mut req = MintRequest::new(kind, PodId::new(pod).unwrap(), 3600);
        req.agent = agent;
        req.prefix = Some("glagent-".into());
        let mut k = keys.clone();
        k.set_signing("k").unwrap();
        mint(&req, k.signing_key().unwrap(), podgate_tokens::unix_now()).unwrap()
    };
    assert_eq!(
        a.agent_for_token(&jwt(2, Some(8), TokenKind::Agent)),
        AgentTokenOwner::Agent(8)
    );
    // An agent this Pod does not have, another kind, another Pod.
    assert_eq!(
        a.agent_for_token(&jwt(2, Some(50), TokenKind::Agent)),
        AgentTokenOwner::Unknown
    );
    assert_eq!(
        a.agent_for_token(&jwt(2, Some(8), TokenKind::Runner)),
        AgentTokenOwner::Unknown
    );
    assert_eq!(
        a.agent_for_token(&jwt(3, Some(8), TokenKind::Agent)),
        AgentTokenOwner::Misrouted(PodId::new(3).unwrap())
    );
}

#[test]
fn allowed_agents_lists_every_agent_of_the_project_with_its_ci_access() {
    let v = access().allowed_agents(5);
    let agents = v["allowed_agents"].as_array().unwrap();
    assert_eq!(agents.len(), 3);
    assert_eq!(agents[0]["configuration"], json!({}));
    assert_eq!(agents[0]["config_project"]["id"], 1002);
    assert_eq!(
        agents[2]["configuration"],
        json!({"default_namespace": "ci", "access_as": {"ci_job": {}}})
    );
    assert_eq!(v["job"], json!({"id": 5}));
    assert_eq!(v["project"], json!({"id": 1002, "groups": [{"id": 100}]}));
    assert_eq!(v["user"]["username"], "root");
}
