//! Running a job as gitlab-runner does: the running update (part of `requestJob` in
//! `commands/multi.go`, under the request slot), then trace patches, an artifact upload
//! and the final update (the build itself, in the worker).

use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::Method;
use serde_json::{Value, json};

use super::Shared;
use super::scheduler::Runner;

/// A job handed out by `jobs/request`.
pub(super) struct Job {
    id: u64,
    token: String,
}

impl Job {
    fn path(&self) -> String {
        format!("/api/v4/jobs/{}", self.id)
    }
}

/// The `JOB-TOKEN` header, unless the runner is old (token in the body only).
fn job_headers<'a>(
    runner: &Runner,
    header: &'a [(&'a str, &'a str); 1],
) -> &'a [(&'a str, &'a str)] {
    if runner.old { &[] } else { header }
}

/// The running update (`UpdateJob` with state `running`). `None`: the job is not run
/// (no id or token, or GitLab said 403/404: `UpdateAbort` in `network/gitlab.go`).
pub(super) async fn start(shared: &Shared, runner: &Runner, job: Value) -> Option<Job> {
    let job = Job {
        id: job["id"].as_u64()?,
        token: job["token"].as_str()?.to_owned(),
    };
    let header = [("job-token", job.token.as_str())];
    let headers = job_headers(runner, &header);
    let body = json!({"token": job.token, "state": "running"});
    let answer = shared
        .call(runner.n, "jobs_update", &[200], || {
            shared.json_request(Method::PUT, &job.path(), headers, &body)
        })
        .await;
    match answer.map(|a| a.status.as_u16()) {
        Some(403 | 404) => None,
        _ => Some(job),
    }
}

/// The rest of the job: trace patches, the artifact, the final update (sent again while
/// GitLab answers 202, as the runner does).
pub(super) async fn finish(shared: &Shared, runner: &Runner, job: Job) {
    let config = &shared.config;
    let path = job.path();
    let token = job.token.as_str();
    let header = [("job-token", token)];
    let headers = job_headers(runner, &header);
    let mut sent = 0usize;
    for i in 0..config.trace_patches {
        let chunk = format!(
            "\x1b[32m$ step {i} of job {}\x1b[0m\nsimulated output line {i}\n",
            job.id
        );
        let range = format!("{sent}-{}", sent + chunk.len() - 1);
        let trace_path = format!("{path}/trace");
        let answer = shared
            .call(runner.n, "jobs_trace", &[202], || {
                shared.request(
                    Method::PATCH,
                    &trace_path,
                    &[
                        ("job-token", token),
                        ("content-range", &range),
                        ("content-type", "text/plain"),
                    ],
                    Bytes::from(chunk.clone()),
                )
            })
            .await;
        if answer.is_some_and(|a| a.status.as_u16() == 202) {
            sent += chunk.len();
        }
    }
    if config.artifact_bytes > 0 {
        let boundary = format!("fleet-{}", job.id);
        let mut form = Vec::with_capacity(config.artifact_bytes + 512);
        if runner.old {
            form.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"token\"\r\n\r\n{token}\r\n").as_bytes());
        }
        form.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"artifacts.zip\"\r\nContent-Type: application/zip\r\n\r\n").as_bytes());
        form.extend((0..config.artifact_bytes).map(|i| (i % 251) as u8));
        form.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let form = Bytes::from(form);
        let ct = format!("multipart/form-data; boundary={boundary}");
        let mut h = vec![("content-type", ct.as_str())];
        if !runner.old {
            h.push(("job-token", token));
        }
        let upload = format!("{path}/artifacts?artifact_format=zip&artifact_type=archive");
        shared
            .call(runner.n, "jobs_artifacts_upload", &[201], || {
                shared.request(Method::POST, &upload, &h, form.clone())
            })
            .await;
    }
    let body = json!({"token": token, "state": "success", "exit_code": 0, "output": {"checksum": "crc32:0", "bytesize": sent}});
    for _ in 0..5 {
        let answer = shared
            .call(runner.n, "jobs_update", &[200, 202], || {
                shared.json_request(Method::PUT, &path, headers, &body)
            })
            .await;
        match answer.map(|a| a.status.as_u16()) {
            Some(200) => {
                shared.progress.jobs.fetch_add(1, Ordering::Relaxed);
                shared.report.lock().expect("report lock").jobs_done += 1;
                shared.count_job(runner.n, |c| c.done += 1);
                return;
            }
            Some(202) => continue,
            // Cut by the end of the run: still in flight, not failed.
            None if shared.stop.load(Ordering::SeqCst) => return,
            _ => break,
        }
    }
    shared.count_job(runner.n, |c| c.failed += 1);
}
