//! Rails' `POST /jobs/request` (Workhorse's long poll in front of it is
//! `workhorse.rs`) and its job payload, and `PUT /jobs/:id` (`lib/api/ci/runner.rb`,
//! `resource :jobs`).
//!
//! The payload follows `API::Entities::Ci::JobRequest::Response`: `git_info.repo_url`
//! is `Ci::Build#repo_url` (`http(s)://gitlab-ci-token:<job token>@<host>/<path>.git`)
//! naming this Pod's real repository and commit; `variables` are the predefined CI
//! variables GitLab always sends (`Ci::Build#variables`, see the "Predefined CI/CD
//! variables" documentation); `dependencies[].token` is the running job's token
//! (feature `ci_expose_running_job_token_for_artifacts`), and `artifacts_file` is
//! there only when the dependency has artifacts (`if: job.available_artifacts?`).

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use serde_json::{Map, Value, json};

use super::super::Shared;
use super::super::params::{self, Declared};
use super::super::repo::{self, BRANCH};
use super::super::state::{Job, JobState, Owner, Pick, Update};
use super::{
    Body, Declare, authenticate_runner, authenticated_job, empty, job_status, job_token, message,
    read, read_declared, reply, runner_token,
};

/// Rails' `POST /jobs/request` (`lib/api/ci/runner.rb`; newer GitLab:
/// `acquire_ci_job!` in `lib/api/ci/helpers/runner.rb`), behind Workhorse
/// (`workhorse.rs`): `authenticate_runner!`; a paused runner gets 204 with its
/// current queue value; a `last_update` equal to the runner's queue value
/// (`runner_queue_value_latest?`) gets 204 with it (`build_not_found_cached`); else
/// `new_update = ensure_runner_queue_value` and `Ci::RegisterJobService`: a job the
/// runner matches (201, `build_found`), none (204 with `new_update`,
/// `build_not_found`) or a simulated race (409, `build_invalid`).
pub(crate) async fn request(shared: &Shared, req: Request<Full<Bytes>>) -> Response<Body> {
    let parsed = match read(shared, req).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    // `use :request_job_params` (lib/api/ci/helpers/job_request.rb).
    let declared = Declare {
        required: &["token"],
        strings: &["last_update", "system_id"],
        hashes: &["info", "session"],
    };
    if let Err(r) = declared.check(&parsed.params) {
        return r;
    }
    let token = runner_token(&parsed.params);
    let runner = match authenticate_runner(shared, &token) {
        Ok(id) => id,
        Err(r) => return r,
    };
    super::runners::ensure_manager(shared, runner, &parsed.params);
    let event = |e: &str| {
        shared
            .metrics
            .rails_job_requests
            .with_label_values(&[e])
            .inc();
    };
    let queues = shared.state.queues();
    let no_content = |value: &str| {
        let mut r = empty(StatusCode::NO_CONTENT);
        if let Ok(v) = HeaderValue::from_str(value) {
            r.headers_mut().insert("x-gitlab-last-update", v);
        }
        r
    };
    if shared
        .state
        .runner_info(runner)
        .is_some_and(|r| r.spec.paused)
    {
        event("inactive");
        return no_content(&queues.ensure(&token));
    }
    let last_update = match params::string(&parsed.params, "last_update") {
        Ok(Declared::Value(s)) => Some(s),
        _ => None,
    };
    if queues.latest(&token, last_update.as_deref()) {
        event("build_not_found_cached");
        return no_content(last_update.as_deref().unwrap_or_default());
    }
    let new_update = queues.ensure(&token);
    match shared.state.pick(runner) {
        Pick::Job(job) => {
            event("build_found");
            shared.metrics.queued.set(shared.state.queued() as i64);
            reply(StatusCode::CREATED, payload(shared, &job))
        }
        Pick::Conflict => {
            event("build_invalid");
            message(StatusCode::CONFLICT, "409 Conflict")
        }
        Pick::Empty => {
            event("build_not_found");
            no_content(&new_update)
        }
    }
}

/// `PUT /jobs/:id`: `requires :token` (the body or query `token`; the `JOB-TOKEN`
/// header counts only without one), then `authenticate_job!`. Answers with
/// `Job-Status` and GitLab's status text as the body.
pub(crate) async fn update(shared: &Shared, req: Request<Incoming>, id: &str) -> Response<Body> {
    let declared = Declare {
        required: &["token"],
        strings: &["state", "checksum", "failure_reason"],
        hashes: &["output", "info"],
    };
    let parsed = match read_declared(shared, req, &declared).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    let id = match authenticated_job(shared, &parsed, id) {
        Ok(id) => id,
        Err(r) => {
            refused_final(shared, &parsed, id);
            return r;
        }
    };
    let state = match parsed.params.get("state").and_then(Value::as_str) {
        Some("running") | None => JobState::Running,
        Some("success") => JobState::Success,
        Some("failed") => JobState::Failed,
        Some(_) => {
            return message(
                StatusCode::BAD_REQUEST,
                "400 Bad request - state is invalid",
            );
        }
    };
    let size = parsed
        .params
        .get("output")
        .and_then(|o| o.get("bytesize"))
        .and_then(|b| b.as_u64().or_else(|| b.as_str()?.parse().ok()));
    match shared.state.update(id, state, size) {
        Update::Ok => {
            let mut r = reply(StatusCode::OK, json!("200"));
            r.headers_mut().insert("job-status", job_status(state));
            r
        }
        Update::Accepted => {
            let mut r = reply(StatusCode::ACCEPTED, json!("202"));
            r.headers_mut()
                .insert("job-status", job_status(JobState::Running));
            r.headers_mut().insert(
                "x-gitlab-trace-update-interval",
                HeaderValue::from_static("1"),
            );
            r
        }
        Update::Forbidden(s) => {
            let mut r = message(StatusCode::FORBIDDEN, "403 Forbidden");
            r.headers_mut().insert("job-status", job_status(s));
            r
        }
        Update::NotFound => message(StatusCode::FORBIDDEN, "403 Forbidden"),
    }
}

/// A final state refused by `authenticate_job!` for a request with the job's own
/// token: the ledger's duplicate when the job had finished already.
fn refused_final(shared: &Shared, parsed: &params::Parsed, id: &str) {
    let state = match parsed.params.get("state").and_then(Value::as_str) {
        Some("success") => JobState::Success,
        Some("failed") => JobState::Failed,
        _ => return,
    };
    let Ok(id) = id.parse::<u64>() else {
        return;
    };
    let token = job_token(&parsed.params, &parsed.headers);
    if shared.state.job_by_token(&token) == Owner::Ours(id) {
        shared.state.final_refused(id, state);
    }
}

/// Used when `git` could not create the repository.
const NO_COMMIT: &str = "0000000000000000000000000000000000000001";
const ZERO_SHA: &str = "0000000000000000000000000000000000000000";
/// When the simulated pipeline and commit were made.
const CREATED_AT: &str = "2026-01-01T00:00:00Z";

/// The parts of [`PodSimConfig::external_url`](super::super::PodSimConfig) GitLab's
/// `CI_SERVER_*` variables name.
struct Server<'a> {
    url: &'a str,
    protocol: &'a str,
    host: &'a str,
    port: u16,
    /// `host[:port]`, the port only when not the scheme's default.
    fqdn: &'a str,
}

fn server(url: &str) -> Server<'_> {
    let (protocol, rest) = url.split_once("://").unwrap_or(("http", url));
    let authority = rest.split('/').next().unwrap_or(rest);
    let default_port = if protocol == "https" { 443 } else { 80 };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
            (h, p.parse().unwrap_or(default_port))
        }
        _ => (authority, default_port),
    };
    Server {
        url,
        protocol,
        host,
        port,
        fqdn: authority,
    }
}

/// `Ci::Build#repo_url`: the project's HTTP URL with `gitlab-ci-token:<token>@`.
fn repo_url(shared: &Shared, token: &str) -> String {
    let project = format!(
        "{}/{}.git",
        shared.external_url,
        repo::project_path(shared.state.pod())
    );
    match project.split_once("://") {
        Some((scheme, rest)) => format!("{scheme}://gitlab-ci-token:{token}@{rest}"),
        None => project,
    }
}

/// GitLab's slugs (`CI_COMMIT_REF_SLUG`, `CI_JOB_NAME_SLUG`): lower case, every run of
/// other characters a `-`, trimmed, at most 63 bytes.
fn slug(s: &str) -> String {
    let mut out = String::new();
    for c in s.to_ascii_lowercase().chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    out.truncate(63);
    out.trim_matches('-').to_owned()
}

/// The job as `jobs/request` answers it. `job_info.project_id` and `CI_PROJECT_ID`
/// name the job's project; every project of a Pod shares the Pod's one repository,
/// so the project path, name and `git_info` are the same for all.
pub(crate) fn payload(shared: &Shared, job: &Job) -> Value {
    let pod = shared.state.pod();
    let sha = shared
        .repo
        .as_ref()
        .map_or(NO_COMMIT, |r| r.sha.as_str())
        .to_owned();
    let repo_url = repo_url(shared, &job.token);
    let deps: Vec<Value> = shared
        .state
        .dependencies(job.id)
        .into_iter()
        .map(|d| {
            let mut dep = Map::new();
            dep.insert("id".into(), json!(d.id));
            dep.insert("name".into(), json!(d.name));
            dep.insert("token".into(), json!(job.token));
            if let Some(a) = &d.artifact {
                dep.insert(
                    "artifacts_file".into(),
                    json!({ "filename": a.filename, "size": a.size }),
                );
            }
            Value::Object(dep)
        })
        .collect();
    let artifacts = if job.artifact_paths.is_empty() {
        Value::Null
    } else {
        json!([{
            "name": "artifacts",
            "untracked": false,
            "paths": job.artifact_paths,
            "when": "on_success",
            "artifact_type": "archive",
            "artifact_format": "zip",
            "expire_in": "1 day",
        }])
    };
    let image = match &job.image {
        Some(name) => json!({ "name": name, "entrypoint": null, "ports": [] }),
        None => Value::Null,
    };
    json!({
        "id": job.id,
        "token": job.token,
        "allow_git_fetch": true,
        "job_info": {
            "id": job.id,
            "name": job.name,
            "stage": job.stage,
            "project_id": job.project,
            "project_name": format!("project-{pod}"),
            "time_in_queue_seconds": 0.1,
            "project_jobs_running_on_instance_runners_count": "+Inf",
        },
        "git_info": {
            "repo_url": repo_url,
            "ref": BRANCH,
            "sha": sha,
            "before_sha": ZERO_SHA,
            "ref_type": "branch",
            "refspecs": [format!("+refs/heads/{BRANCH}:refs/remotes/origin/{BRANCH}")],
            "depth": 20,
            "repo_object_format": "sha1",
        },
        "runner_info": { "timeout": 3600, "runner_session_url": null },
        "variables": variables(shared, job, &sha, &repo_url),
        "steps": [{
            "name": "script",
            "script": job.script,
            "timeout": 3600,
            "when": "on_success",
            "allow_failure": false,
        }],
        "image": image,
        "services": [],
        "artifacts": artifacts,
        "cache": [],
        "credentials": [],
        "dependencies": deps,
        "features": { "trace_sections": true, "failure_reasons": ["script_failure"] },
    })
}

/// The predefined variables GitLab sends with every job, in GitLab's order
/// (`Ci::Build#variables`; `spec/models/ci/build_spec.rb` lists them), plus
/// `CI_POD_ID`, this simulator's own.
fn variables(shared: &Shared, job: &Job, sha: &str, repo_url: &str) -> Value {
    let pod = shared.state.pod();
    let srv = server(&shared.external_url);
    let project_path = repo::project_path(pod);
    let project_url = format!("{}/{project_path}", srv.url);
    let pipeline = 1u64;
    let public =
        |k: &str, v: String| json!({ "key": k, "value": v, "public": true, "masked": false });
    let secret = |k: &str, v: String, masked: bool| json!({ "key": k, "value": v, "public": false, "masked": masked });
    let token = job.token.clone();
    let mut vars = vec![
        public("CI_PIPELINE_ID", pipeline.to_string()),
        public(
            "CI_PIPELINE_URL",
            format!("{project_url}/-/pipelines/{pipeline}"),
        ),
        public("CI_JOB_ID", job.id.to_string()),
        public("CI_JOB_URL", format!("{project_url}/-/jobs/{}", job.id)),
        secret("CI_JOB_TOKEN", token.clone(), true),
        public("CI_JOB_STARTED_AT", iso8601_now()),
        public("CI_REGISTRY_USER", "gitlab-ci-token".into()),
        secret("CI_REGISTRY_PASSWORD", token, true),
        secret("CI_REPOSITORY_URL", repo_url.to_owned(), false),
        public("CI_JOB_NAME", job.name.clone()),
        public("CI_JOB_NAME_SLUG", slug(&job.name)),
        public("CI_JOB_STAGE", job.stage.clone()),
        public("CI_NODE_TOTAL", "1".into()),
        public("CI", "true".into()),
        public("GITLAB_CI", "true".into()),
        public("CI_SERVER", "yes".into()),
        public("CI_SERVER_FQDN", srv.fqdn.into()),
        public("CI_SERVER_URL", srv.url.into()),
        public("CI_SERVER_HOST", srv.host.into()),
        public("CI_SERVER_PORT", srv.port.to_string()),
        public("CI_SERVER_PROTOCOL", srv.protocol.into()),
        public("CI_SERVER_SHELL_SSH_HOST", srv.host.into()),
        public("CI_SERVER_SHELL_SSH_PORT", "22".into()),
        public("CI_SERVER_NAME", "GitLab".into()),
        public("CI_SERVER_VERSION", "18.0.0".into()),
        public("CI_SERVER_VERSION_MAJOR", "18".into()),
        public("CI_SERVER_VERSION_MINOR", "0".into()),
        public("CI_SERVER_VERSION_PATCH", "0".into()),
        public("CI_SERVER_REVISION", "podsim".into()),
        public("GITLAB_FEATURES", String::new()),
        public("CI_PROJECT_ID", job.project.to_string()),
        public("CI_PROJECT_NAME", format!("project-{pod}")),
        public("CI_PROJECT_TITLE", format!("project-{pod}")),
        public("CI_PROJECT_DESCRIPTION", String::new()),
        public("CI_PROJECT_PATH", project_path.clone()),
        public("CI_PROJECT_PATH_SLUG", slug(&project_path)),
        public("CI_PROJECT_NAMESPACE", "group".into()),
        public("CI_PROJECT_NAMESPACE_ID", "100".into()),
        public("CI_PROJECT_NAMESPACE_SLUG", "group".into()),
        public("CI_PROJECT_ROOT_NAMESPACE", "group".into()),
        public("CI_PROJECT_URL", project_url.clone()),
        public("CI_PROJECT_VISIBILITY", "private".into()),
        public("CI_PROJECT_REPOSITORY_LANGUAGES", "shell".into()),
        public("CI_PROJECT_CLASSIFICATION_LABEL", String::new()),
        public("CI_DEFAULT_BRANCH", BRANCH.into()),
        public("CI_CONFIG_PATH", ".gitlab-ci.yml".into()),
        public("CI_API_V4_URL", format!("{}/api/v4", srv.url)),
        public("CI_API_GRAPHQL_URL", format!("{}/api/graphql", srv.url)),
        public("CI_PIPELINE_IID", pipeline.to_string()),
        public("CI_PIPELINE_SOURCE", "push".into()),
        public("CI_PIPELINE_CREATED_AT", CREATED_AT.into()),
        public("CI_COMMIT_SHA", sha.to_owned()),
        public("CI_COMMIT_SHORT_SHA", sha[..8].to_owned()),
        public("CI_COMMIT_BEFORE_SHA", ZERO_SHA.into()),
        public("CI_COMMIT_REF_NAME", BRANCH.into()),
        public("CI_COMMIT_REF_SLUG", slug(BRANCH)),
        public("CI_COMMIT_BRANCH", BRANCH.into()),
        public("CI_COMMIT_MESSAGE", "Initial commit\n".into()),
        public("CI_COMMIT_TITLE", "Initial commit".into()),
        public("CI_COMMIT_DESCRIPTION", String::new()),
        public("CI_COMMIT_REF_PROTECTED", "true".into()),
        public("CI_COMMIT_TIMESTAMP", CREATED_AT.into()),
        public(
            "CI_COMMIT_AUTHOR",
            "Pod Simulator <pod-sim@example.com>".into(),
        ),
        public("GITLAB_USER_ID", "1".into()),
        public("GITLAB_USER_EMAIL", "admin@example.com".into()),
        public("GITLAB_USER_LOGIN", "root".into()),
        public("GITLAB_USER_NAME", "Administrator".into()),
    ];
    if let Some(runner) = job.runner {
        vars.push(public("CI_RUNNER_ID", runner.to_string()));
    }
    vars.push(public("CI_POD_ID", pod.to_string()));
    Value::Array(vars)
}

/// Now as `YYYY-MM-DDTHH:MM:SSZ` (UTC).
fn iso8601_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_parts_and_slugs() {
        let s = server("http://127.0.0.1:8080");
        assert_eq!(
            (s.protocol, s.host, s.port, s.fqdn),
            ("http", "127.0.0.1", 8080, "127.0.0.1:8080")
        );
        let s = server("https://gitlab.example.com/gitlab");
        assert_eq!(
            (s.host, s.port, s.fqdn),
            ("gitlab.example.com", 443, "gitlab.example.com")
        );
        assert_eq!(slug("Build: Linux/x86_64"), "build-linux-x86-64");
        assert_eq!(slug("group/project-2"), "group-project-2");
        let now = iso8601_now();
        assert_eq!((now.len(), &now[10..11], &now[19..]), (20, "T", "Z"));
    }
}
