//! Tests of the workspace store: create, update and lifecycle per agent.

use super::*;

pub(crate) fn enabled(agent_id: i64) -> WorkspacesAgentConfig {
    WorkspacesAgentConfig {
        agent_id,
        enabled: true,
        dns_zone: "workspaces.example.dev".into(),
        ..Default::default()
    }
}

fn new(agent_id: i64, user_id: u64) -> NewWorkspace {
    NewWorkspace {
        agent_id,
        user_id,
        spec: WorkspaceSpec::default(),
    }
}

#[test]
fn create_names_and_places_the_workspace_as_gitlab_does() {
    let store = WorkspaceStore::new(Clock::manual(1_000_000));
    store.put_agent_config(enabled(7));
    let ws = store.create(new(7, 3), "project-1").unwrap();
    let random = ws.name.strip_prefix("workspace-7-3-").unwrap();
    assert_eq!(random.len(), 6);
    assert!(
        random
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    );
    assert_eq!(ws.namespace, format!("gl-rd-ns-7-3-{random}"));
    assert_eq!(
        ws.url,
        format!(
            "https://60001-{}.workspaces.example.dev/?folder=%2Fprojects%2Fproject-1",
            ws.name
        )
    );
    assert_eq!(
        (ws.desired_state, ws.actual_state),
        (DesiredState::Running, ActualState::CreationRequested)
    );
    assert_eq!(ws.responded_to_agent_at, None);
    assert_eq!(ws.desired_state_updated_at, ws.created_at);

    let mut shared = enabled(8);
    shared.shared_namespace = "workspaces".into();
    store.put_agent_config(shared);
    assert_eq!(
        store.create(new(8, 3), "p").unwrap().namespace,
        "workspaces"
    );
    // Stamps never tie, even on a clock that stands still.
    let a = store.list();
    assert!(a[1].created_at > a[0].created_at);
}

#[test]
fn create_refusals_are_worded_as_rails() {
    let store = WorkspaceStore::new(Clock::manual(1));
    assert_eq!(
        store.create(new(1, 1), "p").unwrap_err().to_string(),
        "Workspace create failed: Agent must have an associated workspaces agent config"
    );
    store.put_agent_config(WorkspacesAgentConfig {
        agent_id: 1,
        ..Default::default()
    });
    assert_eq!(
        store.create(new(1, 1), "p").unwrap_err().to_string(),
        "Workspace create failed: Agent must have the 'enabled' flag set to true"
    );
    let mut c = enabled(1);
    c.workspaces_per_user_quota = 1;
    c.workspaces_quota = 2;
    store.put_agent_config(c);
    let first = store.create(new(1, 1), "p").unwrap();
    assert_eq!(
        store.create(new(1, 1), "p").unwrap_err().to_string(),
        "Workspace create failed: You cannot create a workspace because you already have '1' \
             existing workspaces for the given agent which has a per user quota of '1' workspaces"
    );
    store.create(new(1, 2), "p").unwrap();
    assert_eq!(
        store.create(new(1, 3), "p").unwrap_err().to_string(),
        "Workspace create failed: You cannot create a workspace because there are already '2' \
             existing workspaces for the given agent which has a quota of '2' workspaces"
    );
    // A terminated workspace no longer counts.
    store
        .set_desired_state(first.id, DesiredState::Terminated)
        .unwrap();
    store.create(new(1, 1), "p").unwrap();
}

#[test]
fn terminated_is_final() {
    let store = WorkspaceStore::new(Clock::manual(1));
    store.put_agent_config(enabled(1));
    let ws = store.create(new(1, 1), "p").unwrap();
    let stopped = store
        .set_desired_state(ws.id, DesiredState::Stopped)
        .unwrap();
    assert!(stopped.desired_state_updated_at > ws.desired_state_updated_at);
    // Setting the same state changes nothing.
    let again = store
        .set_desired_state(ws.id, DesiredState::Stopped)
        .unwrap();
    assert_eq!(
        again.desired_state_updated_at,
        stopped.desired_state_updated_at
    );
    store
        .set_desired_state(ws.id, DesiredState::Terminated)
        .unwrap();
    assert_eq!(
        store
            .set_desired_state(ws.id, DesiredState::Running)
            .unwrap_err()
            .to_string(),
        "Workspace update failed: Desired state is 'Terminated', and cannot be updated. \
             Create a new workspace instead."
    );
    assert_eq!(
        store.get(ws.id).unwrap().desired_state,
        DesiredState::Terminated
    );
    assert_eq!(
        store.set_desired_state(99, DesiredState::Running),
        Err(StoreError::NotFound(99))
    );
}

#[test]
fn the_clock_moves() {
    let c = Clock::manual(5);
    c.advance(Duration::from_secs(1));
    assert_eq!(c.now(), 1_000_005);
    let s = Clock::system();
    let before = s.now();
    s.advance(Duration::from_secs(3600));
    assert!(s.now() >= before + 3_600_000_000);
}
