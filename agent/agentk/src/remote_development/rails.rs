//! GitLab's `remote_development` module API through kas: [`KasRails`] implements
//! [`Rails`] with a [`ModuleClient`] (`GitlabAccess.MakeRequest`), as agentk's
//! reconciler calls `api.MakeGitLabRequest(ctx, "/reconcile",
//! WithRequestMethod(POST), WithJsonRequestBody(…))` (GitLab agentk
//! `internal/module/remote_development/agent/reconciler.go`); kas turns it into
//! `POST /api/v4/internal/kubernetes/modules/remote_development/reconcile`.

use http::Method;

use super::ports::{Rails, RailsAnswer};
use crate::gitlab_access::ModuleClient;

/// The module's name in GitLab's module API (`remote_development.ModuleName`).
pub const MODULE_NAME: &str = "remote_development";

/// GitLab, reached through kas as this agent.
#[derive(Clone, Debug)]
pub struct KasRails {
    client: ModuleClient,
}

impl KasRails {
    /// Requests through `client`.
    pub fn new(client: ModuleClient) -> KasRails {
        KasRails { client }
    }
}

impl Rails for KasRails {
    async fn reconcile(&self, body: Vec<u8>) -> Result<RailsAnswer, String> {
        let answer = self
            .client
            .request(MODULE_NAME, Method::POST, "/reconcile", Some(body))
            .await
            .map_err(|e| e.to_string())?;
        Ok(RailsAnswer {
            status: answer.status,
            body: answer.body,
        })
    }
}
