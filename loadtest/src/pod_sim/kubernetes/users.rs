//! The Pod's users (members of its group at a role), their personal access tokens
//! and their browser sessions.

use serde::Serialize;

use super::{KubeAccess, access_level};

/// A user.
#[derive(Clone, Debug, Serialize)]
pub struct SimUser {
    /// User id.
    pub id: u64,
    /// User name.
    pub username: String,
    /// Their access level in the Pod's group (and so its project); 0: not a member.
    pub access_level: u8,
}

/// A personal access token.
#[derive(Clone, Debug)]
pub struct Pat {
    /// Token id.
    pub id: u64,
    /// Its user.
    pub user_id: u64,
    /// Its scopes (`k8s_proxy`, `read_api`, …).
    pub scopes: Vec<String>,
    /// Revoked tokens authenticate nobody.
    pub revoked: bool,
}

/// What a personal access token authenticates ([`KubeAccess::pat_user`]).
#[derive(Clone, Debug)]
pub enum PatUser {
    /// This user, with the token's scopes.
    User(SimUser, Vec<String>),
    /// A revoked token.
    Revoked,
    /// Not a token of this Pod.
    Unknown,
}

impl KubeAccess {
    /// Add a user with `role` in the Pod's group (`None`: not a member): their id.
    pub fn add_user(&self, username: &str, role: Option<&str>) -> Result<u64, String> {
        let level = match role {
            None => 0,
            Some(r) => access_level(r).ok_or_else(|| format!("role {r:?}: not a GitLab role"))?,
        };
        let mut inner = self.lock();
        if inner.users.values().any(|u| u.username == username) {
            return Err(format!("username {username:?} is taken"));
        }
        let id = inner.users.keys().next_back().copied().unwrap_or(0) + 1;
        inner.users.insert(
            id,
            SimUser {
                id,
                username: username.to_owned(),
                access_level: level,
            },
        );
        Ok(id)
    }

    /// The users.
    pub fn users(&self) -> Vec<SimUser> {
        self.lock().users.values().cloned().collect()
    }

    /// The user called `username`.
    pub fn user_by_name(&self, username: &str) -> Option<SimUser> {
        self.lock()
            .users
            .values()
            .find(|u| u.username == username)
            .cloned()
    }

    /// Record `token` (issued by the caller, routable here) for `user_id` with
    /// `scopes`: its id.
    pub fn add_pat(&self, token: String, user_id: u64, scopes: Vec<String>) -> Result<u64, String> {
        let mut inner = self.lock();
        if !inner.users.contains_key(&user_id) {
            return Err(format!("user {user_id}: no such user"));
        }
        inner.next_pat += 1;
        let id = inner.next_pat;
        inner.pats.insert(
            token,
            Pat {
                id,
                user_id,
                scopes,
                revoked: false,
            },
        );
        Ok(id)
    }

    /// Revoke personal access token `id`: whether there was one.
    pub fn revoke_pat(&self, id: u64) -> bool {
        let mut inner = self.lock();
        match inner.pats.values_mut().find(|p| p.id == id) {
            Some(p) => {
                p.revoked = true;
                true
            }
            None => false,
        }
    }

    /// What personal access token `token` authenticates for GitLab's general API
    /// (`find_user_from_access_token` in `lib/gitlab/auth/auth_finders.rb`): its
    /// user and scopes; revoked and unknown tokens authenticate nobody.
    pub fn pat_user(&self, token: &str) -> PatUser {
        let inner = self.lock();
        let Some(pat) = inner.pats.get(token) else {
            return PatUser::Unknown;
        };
        if pat.revoked {
            return PatUser::Revoked;
        }
        match inner.users.get(&pat.user_id) {
            Some(u) => PatUser::User(u.clone(), pat.scopes.clone()),
            None => PatUser::Unknown,
        }
    }

    /// Whether `token` is one of this Pod's personal access tokens.
    pub fn is_pat(&self, token: &str) -> bool {
        self.lock().pats.contains_key(token)
    }

    /// Sign `username` in: a new browser session (`_gitlab_kas` cookie value) and
    /// its CSRF token, both 64 random hex digits.
    pub fn sign_in(&self, username: &str) -> Result<(String, String), String> {
        let user = self
            .user_by_name(username)
            .ok_or_else(|| format!("user {username:?}: no such user"))?;
        let (session, csrf) = (random_hex(), random_hex());
        self.add_session(user.id, session.clone(), csrf.clone())?;
        Ok((session, csrf))
    }

    /// Open a browser session for `user_id`: the public session id (the
    /// `_gitlab_kas` cookie's value) and its CSRF token are the caller's random
    /// strings.
    pub fn add_session(&self, user_id: u64, session: String, csrf: String) -> Result<(), String> {
        let mut inner = self.lock();
        if !inner.users.contains_key(&user_id) {
            return Err(format!("user {user_id}: no such user"));
        }
        inner.sessions.insert(session, (user_id, csrf));
        Ok(())
    }
}

/// 32 random bytes as hex.
fn random_hex() -> String {
    podgate_tokens::gitlab::random_bytes()
        .iter()
        .chain(podgate_tokens::gitlab::random_bytes().iter())
        .map(|b| format!("{b:02x}"))
        .collect()
}
