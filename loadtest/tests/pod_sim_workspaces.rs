//! GitLab's Workspaces side of the Pod simulator, driven over real HTTP as kas would
//! call it (`Gitlab-Kas-Api-Request` JWT + the agent token in `Authorization: Bearer`
//! or `Gitlab-Agentk-Api-Request`)
//! and through the control API: the behaviours of `workspaces.md` §8 that concern
//! Rails — 401 without the agent token (1), the exact empty full reconcile (3),
//! parameter validation (7, 8), actual states from agent infos (9–11),
//! RestartRequested → Running once Stopped (12), replicas by desired state (13),
//! labels and inventories (14), partial reconciles without the Secrets (18) — plus
//! the full/partial choice of workspaces, Terminated being final, the lifecycle
//! rules on a moved clock, agent configuration from kas and the prerequisites.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{Reply, call, json as send};
use podgate_loadtest::pod_sim::workspaces::WorkspaceSpec;
use podgate_loadtest::pod_sim::{AgentSpec, PodSim, PodSimConfig, sum_samples};
use podgate_tokens::{KeySet, MintRequest, PodId, TokenKind};
use serde_json::{Value, json};

const KAS_SECRET: &[u8; 32] = b"0123456789abcdef0123456789abcdef";
const AGENT_TOKEN: &str = "glagent-opaque-token-of-agent-1";
const RECONCILE: &str = "/api/v4/internal/kubernetes/modules/remote_development/reconcile";
const PREREQUISITES: &str = "/api/v4/internal/kubernetes/modules/remote_development/prerequisites";

fn hs256_keys() -> KeySet {
    let mut keys = KeySet::new();
    keys.add_hs256("jwt-1", &[9u8; 32], std::path::Path::new("test"))
        .unwrap();
    keys.set_signing("jwt-1").unwrap();
    keys
}

/// Pod 2 with agents 1 and 2, kas's secret, agent 1's opaque token and JWT keys.
async fn sim_with(f: impl FnOnce(&mut PodSimConfig)) -> PodSim {
    let mut config = PodSimConfig::new(PodId::new(2).unwrap(), "127.0.0.1:0".parse().unwrap());
    config.kas_secret = Some(KAS_SECRET.to_vec());
    config.keys = hs256_keys();
    config.agents = vec![
        AgentSpec::with_user_access(1, config.pod_id),
        AgentSpec::with_user_access(2, config.pod_id),
    ];
    config.agent_tokens = vec![(AGENT_TOKEN.into(), 1)];
    f(&mut config);
    PodSim::start(config).await.unwrap()
}

async fn sim() -> PodSim {
    sim_with(|_| {}).await
}

/// kas's `Gitlab-Kas-Api-Request` JWT (HS256, iss `gitlab-kas`, aud `gitlab`).
fn kas_jwt(secret: &[u8]) -> String {
    let now = podgate_tokens::unix_now();
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &json!({"iss": "gitlab-kas", "aud": "gitlab", "iat": now, "nbf": now - 5, "exp": now + 30}),
        &jsonwebtoken::EncodingKey::from_secret(secret),
    )
    .unwrap()
}

fn kas_header() -> String {
    format!("gitlab-kas-api-request: {}", kas_jwt(KAS_SECRET))
}

/// A reconcile request as kas forwards it for the agent holding `token`.
async fn reconcile_as(addr: SocketAddr, token: &str, body: Value) -> Reply {
    let kas = kas_header();
    let agent = format!("authorization: Bearer {token}");
    send(addr, "POST", RECONCILE, &[&kas, &agent], body).await
}

/// A reconcile for agent 1 that must succeed: the payload.
async fn reconcile(addr: SocketAddr, body: Value) -> Value {
    let r = reconcile_as(addr, AGENT_TOKEN, body).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

fn partial(infos: Value) -> Value {
    json!({"update_type": "partial", "workspace_agent_infos": infos})
}

fn full() -> Value {
    json!({"update_type": "full", "workspace_agent_infos": []})
}

/// Enable workspaces for `agent` through the control API.
async fn enable(addr: SocketAddr, agent: i64) {
    let r = send(
        addr,
        "PUT",
        &format!("/-/podsim/agents/{agent}/workspaces_config"),
        &[],
        json!({"enabled": true, "dns_zone": "workspaces.example.dev"}),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.json());
}

/// Create a workspace for agent 1: its view.
async fn create(addr: SocketAddr, body: Value) -> Value {
    let r = try_create(addr, body).await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    r.json()
}

async fn show(addr: SocketAddr, id: u64) -> Value {
    let r = call(addr, "GET", &format!("/-/podsim/workspaces/{id}"), &[], b"").await;
    assert_eq!(r.status, 200);
    r.json()
}

/// Field `key` of workspace `ws`'s view.
async fn field(addr: SocketAddr, ws: &Value, key: &str) -> Value {
    show(addr, ws["id"].as_u64().unwrap()).await[key].clone()
}

/// Create a workspace through the control API: the whole reply (for refusals).
async fn try_create(addr: SocketAddr, body: Value) -> Reply {
    send(addr, "POST", "/-/podsim/workspaces", &[], body).await
}

/// Register agent `agent`'s opaque `token` through the control API.
async fn add_token(addr: SocketAddr, agent: i64, token: &str) -> Reply {
    send(
        addr,
        "POST",
        &format!("/-/podsim/agents/{agent}/tokens"),
        &[],
        json!({ "token": token }),
    )
    .await
}

/// From the simulator's `/metrics`: the sum of the samples of `family` whose
/// labels include every one of `labels`, and the whole text.
async fn samples(addr: SocketAddr, family: &str, labels: &[&str]) -> (u64, String) {
    let text = String::from_utf8(call(addr, "GET", "/metrics", &[], b"").await.body).unwrap();
    let sum = sum_samples(&text, &format!("{family}{{"), |l| {
        labels.iter().all(|label| l.contains(label))
    });
    (sum, text)
}

async fn set_desired(addr: SocketAddr, id: u64, state: &str) -> Reply {
    send(
        addr,
        "PATCH",
        &format!("/-/podsim/workspaces/{id}"),
        &[],
        json!({ "desired_state": state }),
    )
    .await
}

/// An agent info with a Deployment of `replicas` (`available` of them available)
/// whose Progressing and Available reasons are given.
fn info(
    ws: &Value,
    version: &str,
    replicas: u32,
    available: u32,
    progressing: &str,
    available_reason: &str,
) -> Value {
    json!({"name": ws["name"], "namespace": ws["namespace"], "latest_k8s_deployment_info": {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": ws["name"], "namespace": ws["namespace"], "resourceVersion": version},
        "spec": {"replicas": replicas},
        "status": {"availableReplicas": available, "conditions": [
            {"type": "Progressing", "status": "True", "reason": progressing},
            {"type": "Available", "status": "True", "reason": available_reason}]}}})
}

fn running(ws: &Value, version: &str) -> Value {
    info(
        ws,
        version,
        1,
        1,
        "NewReplicaSetAvailable",
        "MinimumReplicasAvailable",
    )
}

fn stopped(ws: &Value, version: &str) -> Value {
    info(
        ws,
        version,
        0,
        0,
        "NewReplicaSetAvailable",
        "MinimumReplicasAvailable",
    )
}

/// The `workspace_rails_infos` entry for `ws`.
fn rails_info<'a>(payload: &'a Value, ws: &Value) -> &'a Value {
    payload["workspace_rails_infos"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == ws["name"])
        .unwrap_or_else(|| panic!("{} not in {payload}", ws["name"]))
}

fn names(payload: &Value) -> Vec<String> {
    payload["workspace_rails_infos"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap().to_owned())
        .collect()
}

/// The objects of a `config_to_apply` YAML stream.
fn objects(config: &Value) -> Vec<Value> {
    let text = config.as_str().unwrap();
    text.split("---\n")
        .filter(|d| !d.trim().is_empty())
        .map(|d| serde_yaml::from_str::<Value>(d).unwrap())
        .collect()
}

fn kinds_and_names(objects: &[Value]) -> Vec<(String, String)> {
    objects
        .iter()
        .map(|o| {
            (
                o["kind"].as_str().unwrap().to_owned(),
                o["metadata"]["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn replicas(objects: &[Value]) -> u64 {
    objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("a Deployment")["spec"]["replicas"]
        .as_u64()
        .unwrap()
}

/// §8.1 and §8.3: kas's JWT, then the agent token; the exact answer to an empty
/// full reconcile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kas_and_agent_authentication_and_the_empty_full_reconcile() {
    let sim = sim().await;
    let a = sim.addr();
    let agent = format!("authorization: Bearer {AGENT_TOKEN}");

    // No kas JWT, or one signed with another secret.
    let r = send(a, "POST", RECONCILE, &[&agent], full()).await;
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "KAS JWT authentication invalid"}))
    );
    let forged = format!("gitlab-kas-api-request: {}", kas_jwt(&[1u8; 32]));
    let r = send(a, "POST", RECONCILE, &[&forged, &agent], full()).await;
    assert_eq!(r.status, 401);
    // Issuer and audience are checked; exp only when present (Rails' own specs
    // send a JWT without one).
    let jwt = |claims: Value| {
        let token = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(KAS_SECRET),
        )
        .unwrap();
        format!("gitlab-kas-api-request: {token}")
    };
    let now = podgate_tokens::unix_now();
    for (claims, status) in [
        (
            json!({"iss": "gitlab-kas", "aud": "other", "exp": now + 30}),
            401,
        ),
        (
            json!({"iss": "someone", "aud": "gitlab", "exp": now + 30}),
            401,
        ),
        (
            json!({"iss": "gitlab-kas", "aud": "gitlab", "exp": now - 600}),
            401,
        ),
        (json!({"iss": "gitlab-kas", "aud": "gitlab"}), 201),
    ] {
        let r = send(
            a,
            "POST",
            RECONCILE,
            &[&jwt(claims.clone()), &agent],
            full(),
        )
        .await;
        assert_eq!(r.status, status, "{claims}");
    }

    // kas's JWT but no agent token, or one naming no agent: 401.
    let kas = kas_header();
    let r = send(a, "POST", RECONCILE, &[&kas], full()).await;
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "401 Unauthorized"}))
    );
    let r = reconcile_as(a, "glagent-NONEXISTENT", full()).await;
    assert_eq!(r.status, 401);
    let r = call(a, "GET", PREREQUISITES, &[&kas], b"").await;
    assert_eq!(r.status, 401);

    // The agent token in the newer kas's header is taken too; a podgate-only
    // header is not.
    let newer = format!("gitlab-agentk-api-request: {AGENT_TOKEN}");
    let r = send(a, "POST", RECONCILE, &[&kas, &newer], full()).await;
    assert_eq!(r.status, 201);
    let unknown = format!("gitlab-agent-api-request: {AGENT_TOKEN}");
    let r = send(a, "POST", RECONCILE, &[&kas, &unknown], full()).await;
    assert_eq!(r.status, 401);

    // §8.3: nothing to return.
    let r = reconcile_as(a, AGENT_TOKEN, full()).await;
    assert_eq!(r.status, 201);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        String::from_utf8(r.body).unwrap(),
        r#"{"workspace_rails_infos":[],"settings":{"full_reconciliation_interval_seconds":3600,"partial_reconciliation_interval_seconds":10}}"#
    );

    // JWT agent tokens the Pod's keys verify: of this Pod and a registered agent
    // only; another Pod's is a misroute.
    let keys = hs256_keys();
    let jwt = |pod: u64, agent: u64| {
        let mut req = MintRequest::new(TokenKind::Agent, PodId::new(pod).unwrap(), 3600);
        req.agent = Some(agent);
        req.prefix = Some("glagent-".into());
        podgate_tokens::mint(
            &req,
            keys.signing_key().unwrap(),
            podgate_tokens::unix_now(),
        )
        .unwrap()
    };
    assert_eq!(reconcile_as(a, &jwt(2, 2), full()).await.status, 201);
    assert_eq!(reconcile_as(a, &jwt(2, 9), full()).await.status, 401);
    let before = sim.metrics().misrouted.get();
    assert_eq!(reconcile_as(a, &jwt(3, 1), full()).await.status, 401);
    assert_eq!(sim.metrics().misrouted.get(), before + 1);

    // Tokens registered through the control API.
    let r = add_token(a, 2, "glagent-two").await;
    assert_eq!((r.status, r.json()), (201, json!({"agent_id": 2})));
    assert_eq!(reconcile_as(a, "glagent-two", full()).await.status, 201);
    let r = add_token(a, 77, "x").await;
    assert_eq!(r.status, 404);

    // Unlicensed: 403 after authentication.
    let unlicensed = sim_with(|c| c.workspaces.licensed = false).await;
    let r = reconcile_as(unlicensed.addr(), AGENT_TOKEN, full()).await;
    assert_eq!(
        (r.status, r.json()),
        (
            403,
            json!({"message": "403 Forbidden - \"remote_development\" licensed feature is not available"})
        )
    );

    let (n, text) = samples(
        a,
        "podsim_workspace_reconciles_total",
        &[r#"status="201""#, r#"update_type="full""#],
    )
    .await;
    // Four with the agent token in `Authorization: Bearer`, one in
    // `Gitlab-Agentk-Api-Request`.
    assert_eq!(n, 5, "{text}");
}

/// §8.7 and §8.8: the JSON schema, worded as Rails words it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_parameters_are_400_with_rails_message() {
    let sim = sim().await;
    let a = sim.addr();
    let error = |r: &Reply| {
        r.json()["message"]["error"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };

    let r = reconcile_as(
        a,
        AGENT_TOKEN,
        json!({"update_type": "sometimes", "workspace_agent_infos": []}),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        error(&r),
        "Workspace reconcile params validation failed: property '/update_type' is not one of: [\"partial\", \"full\"]"
    );
    let r = reconcile_as(
        a,
        AGENT_TOKEN,
        partial(json!([{"name": "w", "namespace": "n", "termination_progress": "Gone"}])),
    )
    .await;
    assert_eq!(r.status, 400);
    assert!(error(&r).starts_with("Workspace reconcile params validation failed: property '/workspace_agent_infos/0/termination_progress'"), "{}", error(&r));
    let r = reconcile_as(
        a,
        AGENT_TOKEN,
        partial(json!([{"name": "w", "namespace": "n", "error_details": {"error_message": "x"}}])),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        error(&r),
        "Workspace reconcile params validation failed: property '/workspace_agent_infos/0/error_details' is missing required keys: error_type"
    );
    let r = reconcile_as(a, AGENT_TOKEN, json!({})).await;
    assert_eq!(
        error(&r),
        "Workspace reconcile params validation failed: root is missing required keys: update_type, workspace_agent_infos"
    );
    let (n, text) = samples(
        a,
        "podsim_workspace_reconciles_total",
        &[r#"status="400""#, r#"update_type="invalid""#],
    )
    .await;
    assert_eq!(n, 2, "{text}");
}

/// §8.9–§8.11: Rails computes the actual state from what the agent reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actual_states_from_agent_infos() {
    let sim = sim().await;
    let a = sim.addr();
    enable(a, 1).await;
    let mut ws = Vec::new();
    for _ in 0..9 {
        ws.push(create(a, json!({"agent_id": 1})).await);
    }
    let err = json!({"error_type": "applier", "error_message": "no owning inventory found"});
    let named = |w: &Value, extra: Value| {
        let mut i = json!({"name": w["name"], "namespace": w["namespace"]});
        for (k, v) in extra.as_object().unwrap() {
            i[k] = v.clone();
        }
        i
    };
    let infos = json!([
        running(&ws[0], "10"),
        stopped(&ws[1], "11"),
        info(
            &ws[2],
            "12",
            0,
            1,
            "ReplicaSetUpdated",
            "MinimumReplicasAvailable"
        ),
        info(
            &ws[3],
            "13",
            1,
            0,
            "ProgressDeadlineExceeded",
            "MinimumReplicasUnavailable"
        ),
        named(
            &ws[4],
            json!({"latest_k8s_deployment_info": {"metadata": {"resourceVersion": "14"}, "spec": {"replicas": 1}}})
        ),
        named(&ws[5], json!({"error_details": err})),
        named(
            &ws[6],
            json!({"error_details": err, "termination_progress": "Terminated"})
        ),
        named(
            &ws[7],
            json!({"error_details": err, "termination_progress": "Terminating"})
        ),
        named(&ws[8], json!({"termination_progress": "Terminating"})),
    ]);
    let payload = reconcile(a, partial(infos)).await;
    let want = [
        "Running",
        "Stopped",
        "Stopping",
        "Failed",
        "Unknown",
        "Error",
        "Terminated",
        "Error",
        "Terminating",
    ];
    for (w, state) in ws.iter().zip(want) {
        assert_eq!(field(a, w, "actual_state").await, state, "{}", w["name"]);
        assert_eq!(rails_info(&payload, w)["actual_state"], state);
    }
    // The reported resource versions are echoed (and kept when none is sent).
    assert_eq!(
        rails_info(&payload, &ws[0])["deployment_resource_version"],
        "10"
    );
    assert_eq!(
        rails_info(&payload, &ws[4])["deployment_resource_version"],
        "14"
    );
    assert_eq!(
        rails_info(&payload, &ws[5])["deployment_resource_version"],
        Value::Null
    );

    let (n, text) = samples(
        a,
        "podsim_workspaces",
        &[r#"desired_state="Running""#, r#"actual_state="Error""#],
    )
    .await;
    assert_eq!(n, 2, "{text}");
}

/// One workspace through its life: what each reconcile returns (§8.12–§8.14,
/// §8.18, full vs partial) and Terminated being final.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_through_its_life() {
    let sim = sim().await;
    let a = sim.addr();
    // No workspaces configuration for the agent: refused as Rails refuses.
    let r = try_create(a, json!({"agent_id": 1})).await;
    assert_eq!(
        (r.status, r.json()),
        (
            400,
            json!({"message": "Workspace create failed: Agent must have an associated workspaces agent config"})
        )
    );
    enable(a, 1).await;
    let ws = create(
        a,
        json!({"agent_id": 1, "user_id": 1, "ports": [3000], "env": {"GREETING": "hi"}}),
    )
    .await;
    let name = ws["name"].as_str().unwrap().to_owned();
    assert!(name.starts_with("workspace-1-1-"), "{name}");
    assert_eq!(
        ws["namespace"],
        format!("gl-rd-ns-1-1-{}", &name["workspace-1-1-".len()..])
    );
    assert_eq!(
        ws["url"],
        format!("https://60001-{name}.workspaces.example.dev/?folder=%2Fprojects%2Fproject-2")
    );
    assert_eq!(
        (ws["desired_state"].as_str(), ws["actual_state"].as_str()),
        (Some("Running"), Some("CreationRequested"))
    );
    assert_eq!(ws["responded_to_agent_at"], Value::Null);

    // The first partial carries it with everything (§8.13 replicas 1, §8.14).
    let payload = reconcile(a, partial(json!([]))).await;
    assert_eq!(names(&payload), vec![name.clone()]);
    let info = rails_info(&payload, &ws);
    assert_eq!(info["namespace"], ws["namespace"]);
    assert_eq!(info["deployment_resource_version"], Value::Null);
    assert_eq!(info["image_pull_secrets"], json!([]));
    let objs = objects(&info["config_to_apply"]);
    let kinds = kinds_and_names(&objs);
    for want in [
        (
            "ConfigMap".to_owned(),
            format!("{name}-workspace-inventory"),
        ),
        ("Deployment".to_owned(), name.clone()),
        ("Service".to_owned(), name.clone()),
        (
            "PersistentVolumeClaim".to_owned(),
            format!("{name}-gl-workspace-data"),
        ),
        ("ServiceAccount".to_owned(), name.clone()),
        ("NetworkPolicy".to_owned(), name.clone()),
        ("ConfigMap".to_owned(), format!("{name}-secrets-inventory")),
        ("Secret".to_owned(), format!("{name}-env-var")),
        ("Secret".to_owned(), format!("{name}-file")),
    ] {
        assert!(kinds.contains(&want), "{want:?} not in {kinds:?}");
    }
    assert_eq!(replicas(&objs), 1);
    for o in &objs {
        let meta = &o["metadata"];
        assert_eq!(
            meta["labels"]["agent.gitlab.com/id"], "1",
            "{}",
            meta["name"]
        );
        if meta["name"].as_str().unwrap().ends_with("-inventory") {
            assert_eq!(
                meta["labels"]["cli-utils.sigs.k8s.io/inventory-id"],
                meta["name"]
            );
        } else {
            assert!(
                meta["annotations"]["config.k8s.io/owning-inventory"]
                    .as_str()
                    .is_some_and(|i| i.ends_with("-inventory")),
                "{}",
                meta["name"]
            );
        }
    }
    let responded = field(a, &ws, "responded_to_agent_at").await;
    assert!(responded.is_string());

    // Idle partial: nothing. The agent reports it running: returned (named), its
    // version echoed.
    assert_eq!(
        names(&reconcile(a, partial(json!([]))).await),
        Vec::<String>::new()
    );
    let payload = reconcile(a, partial(json!([running(&ws, "100")]))).await;
    let info = rails_info(&payload, &ws);
    assert_eq!(
        (
            info["actual_state"].as_str(),
            info["deployment_resource_version"].as_str()
        ),
        (Some("Running"), Some("100"))
    );
    // Reported again, unchanged: returned without config.
    let payload = reconcile(a, partial(json!([running(&ws, "100")]))).await;
    assert_eq!(rails_info(&payload, &ws)["config_to_apply"], "");

    // Stop: the next partial carries replicas 0 and no secrets (§8.13, §8.18).
    let r = set_desired(a, ws["id"].as_u64().unwrap(), "Stopped").await;
    assert_eq!(
        (r.status, r.json()["desired_state"].as_str()),
        (200, Some("Stopped"))
    );
    let payload = reconcile(a, partial(json!([]))).await;
    let objs = objects(&rails_info(&payload, &ws)["config_to_apply"]);
    assert_eq!(replicas(&objs), 0);
    let kinds = kinds_and_names(&objs);
    assert!(
        kinds
            .iter()
            .all(|(k, n)| k != "Secret" && !n.ends_with("-secrets-inventory")),
        "{kinds:?}"
    );
    assert!(kinds.contains(&(
        "ConfigMap".to_owned(),
        format!("{name}-workspace-inventory")
    )));
    reconcile(a, partial(json!([stopped(&ws, "101")]))).await;
    assert_eq!(field(a, &ws, "actual_state").await, "Stopped");

    // Restart (§8.12): RestartRequested goes out with replicas 0; once Stopped is
    // reported the desired state is Running and the same answer carries replicas 1.
    reconcile(a, partial(json!([running(&ws, "102")]))).await;
    set_desired(a, ws["id"].as_u64().unwrap(), "RestartRequested").await;
    let payload = reconcile(a, partial(json!([]))).await;
    let info = rails_info(&payload, &ws);
    assert_eq!(info["desired_state"], "RestartRequested");
    assert_eq!(replicas(&objects(&info["config_to_apply"])), 0);
    let payload = reconcile(a, partial(json!([stopped(&ws, "103")]))).await;
    let info = rails_info(&payload, &ws);
    assert_eq!(
        (
            info["desired_state"].as_str(),
            info["actual_state"].as_str()
        ),
        (Some("Running"), Some("Stopped"))
    );
    assert_eq!(replicas(&objects(&info["config_to_apply"])), 1);
    assert_eq!(field(a, &ws, "desired_state").await, "Running");

    // A second workspace; a full returns both, with all their objects.
    let other = create(a, json!({"agent_id": 1})).await;
    reconcile(a, partial(json!([]))).await;
    let payload = reconcile(a, full()).await;
    assert_eq!(
        names(&payload),
        vec![name.clone(), other["name"].as_str().unwrap().to_owned()]
    );
    for w in [&ws, &other] {
        let kinds = kinds_and_names(&objects(&rails_info(&payload, w)["config_to_apply"]));
        assert!(kinds.iter().any(|(k, _)| k == "Secret"), "{kinds:?}");
    }
    // Another agent's reconcile sees none of them.
    let r = add_token(a, 2, "glagent-two").await;
    assert_eq!(r.status, 201);
    let r = reconcile_as(a, "glagent-two", full()).await;
    assert_eq!(r.json()["workspace_rails_infos"], json!([]));

    // Terminate: only the two inventories go out, on every partial until the agent
    // reports Terminated; the desired state can never change again.
    let id = ws["id"].as_u64().unwrap();
    assert_eq!(set_desired(a, id, "Terminated").await.status, 200);
    for _ in 0..2 {
        let payload = reconcile(a, partial(json!([]))).await;
        assert_eq!(names(&payload), vec![name.clone()]);
        let kinds = kinds_and_names(&objects(&rails_info(&payload, &ws)["config_to_apply"]));
        assert_eq!(
            kinds,
            vec![
                (
                    "ConfigMap".to_owned(),
                    format!("{name}-workspace-inventory")
                ),
                ("ConfigMap".to_owned(), format!("{name}-secrets-inventory")),
            ]
        );
    }
    let r = set_desired(a, id, "Running").await;
    assert_eq!(
        (r.status, r.json()),
        (
            400,
            json!({"message": "Workspace update failed: Desired state is 'Terminated', and cannot be updated. Create a new workspace instead."})
        )
    );
    let r = set_desired(a, id, "Paused").await;
    assert_eq!(r.status, 400);
    let gone = json!({"name": ws["name"], "namespace": ws["namespace"], "termination_progress": "Terminated"});
    let payload = reconcile(a, partial(json!([gone]))).await;
    assert_eq!(rails_info(&payload, &ws)["actual_state"], "Terminated");
    assert_eq!(
        names(&reconcile(a, partial(json!([]))).await),
        Vec::<String>::new()
    );
    assert_eq!(
        names(&reconcile(a, full()).await),
        vec![other["name"].as_str().unwrap().to_owned()]
    );

    let list = call(a, "GET", "/-/podsim/workspaces", &[], b"")
        .await
        .json();
    assert_eq!(list["workspaces"].as_array().unwrap().len(), 2);
    assert_eq!(
        call(a, "GET", "/-/podsim/workspaces/99", &[], b"")
            .await
            .status,
        404
    );
}

/// The lifecycle rules, on the store's clock moved forward (not real time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_rules_on_a_moved_clock() {
    let sim = sim().await;
    let a = sim.addr();
    let r = send(
        a,
        "PUT",
        "/-/podsim/agents/1/workspaces_config",
        &[],
        json!({"enabled": true, "dns_zone": "workspaces.example.dev", "max_active_hours_before_stop": 2, "max_stopped_hours_before_termination": 3}),
    )
    .await;
    assert_eq!(r.status, 200);
    let ws = create(
        a,
        json!({"agent_id": 1, "max_hours_before_termination": 100}),
    )
    .await;
    // Created through the library, as `podgate up` would.
    let young = sim
        .create_workspace(1, 1, WorkspaceSpec::default())
        .unwrap();
    let young = json!({"id": young.id, "name": young.name, "namespace": young.namespace});
    assert_eq!(
        sum_samples(&sim.metrics().render(), "podsim_workspaces{", |l| {
            l.contains(r#"actual_state="CreationRequested""#)
        }),
        2
    );
    reconcile(a, partial(json!([running(&ws, "1"), running(&young, "1")]))).await;

    let clock = sim.workspaces().clock();
    clock.advance(Duration::from_secs(2 * 3600 + 1));
    // Only reported workspaces are looked at.
    reconcile(a, partial(json!([running(&ws, "1")]))).await;
    assert_eq!(field(a, &ws, "desired_state").await, "Stopped");
    assert_eq!(field(a, &young, "desired_state").await, "Running");
    // Stopped for more than 3 h: terminated.
    clock.advance(Duration::from_secs(3 * 3600 + 1));
    reconcile(a, partial(json!([stopped(&ws, "2")]))).await;
    assert_eq!(field(a, &ws, "desired_state").await, "Terminated");
    // Older than its 24 h max_hours_before_termination: terminated first.
    clock.advance(Duration::from_secs(24 * 3600));
    let payload = reconcile(a, partial(json!([running(&young, "1")]))).await;
    assert_eq!(rails_info(&payload, &young)["desired_state"], "Terminated");
}

/// kas's `agent_configuration` post stores the agent's workspaces configuration;
/// the prerequisites endpoint needs one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_configuration_from_kas_and_prerequisites() {
    let sim = sim().await;
    let a = sim.addr();
    let kas = kas_header();
    let agent = format!("gitlab-agentk-api-request: {AGENT_TOKEN}");
    let r = call(a, "GET", PREREQUISITES, &[&kas, &agent], b"").await;
    assert_eq!(r.status, 406);
    assert_eq!(
        r.json()["message"],
        "The remote development workspaces config for the agent is invalid. Please see https://docs.gitlab.com/user/workspace/settings/#configuration-reference"
    );

    const PATH: &str = "/api/v4/internal/kubernetes/agent_configuration";
    let config = json!({"agent_id": 1, "agent_config": {"ci_access": {}, "remote_development": {
        "enabled": true, "dns_zone": "ws.kas.test", "shared_namespace": "workspaces",
        "image_pull_secrets": [{"name": "regcred", "namespace": "default"}]}}});
    assert_eq!(send(a, "POST", PATH, &[], config.clone()).await.status, 401);
    let r = send(a, "POST", PATH, &[&kas], config).await;
    assert_eq!((r.status, r.body.len()), (204, 0));
    let r = send(a, "POST", PATH, &[&kas], json!({})).await;
    assert_eq!(
        (r.status, r.json()),
        (
            400,
            json!({"error": "agent_id is missing, agent_config is missing"})
        )
    );
    let r = send(
        a,
        "POST",
        PATH,
        &[&kas],
        json!({"agent_id": 42, "agent_config": {}}),
    )
    .await;
    assert_eq!(
        (r.status, r.json()),
        (404, json!({"message": "404 Not found"}))
    );

    let r = call(a, "GET", PREREQUISITES, &[&kas, &agent], b"").await;
    assert_eq!(
        (r.status, r.json()),
        (200, json!({"shared_namespace": "workspaces"}))
    );

    // The stored configuration is what workspaces are made with.
    let ws = create(a, json!({"agent_id": 1})).await;
    assert_eq!(ws["namespace"], "workspaces");
    assert!(ws["url"].as_str().unwrap().contains(".ws.kas.test/"));
    let payload = reconcile(a, partial(json!([]))).await;
    assert_eq!(
        rails_info(&payload, &ws)["image_pull_secrets"],
        json!([{"name": "regcred", "namespace": "default"}])
    );

    // A configuration without remote_development keys leaves it; disabling it
    // stops new workspaces.
    let r = send(
        a,
        "POST",
        PATH,
        &[&kas],
        json!({"agent_id": 1, "agent_config": {"ci_access": {}}}),
    )
    .await;
    assert_eq!(r.status, 204);
    create(a, json!({"agent_id": 1})).await;
    let off = json!({"agent_id": 1, "agent_config": {"remote_development": {"enabled": false, "dns_zone": "ws.kas.test"}}});
    assert_eq!(send(a, "POST", PATH, &[&kas], off).await.status, 204);
    let r = try_create(a, json!({"agent_id": 1})).await;
    assert_eq!(
        (r.status, r.json()),
        (
            400,
            json!({"message": "Workspace create failed: Agent must have the 'enabled' flag set to true"})
        )
    );
}
