//! The simulated Pod's Git repository over smart HTTP (`git http-backend`), cloned
//! with real `git` from the URL a job's payload names: authenticated by
//! `gitlab-ci-token:<job token>`, 401 with GitLab's challenge without credentials
//! (the first request `git` makes), 403 and a misroute for another Pod's job token,
//! no pushes.

use crate::common;

use std::path::Path;
use std::process::Output;

use base64::Engine as _;
use common::{call, json, register, sim, take_job};
use serde_json::json;

async fn git(args: &[&str], cwd: &Path) -> Output {
    tokio::process::Command::new("git")
        .args(args)
        .current_dir(cwd)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("HOME", cwd)
        .output()
        .await
        .expect("git runs")
}

fn basic(user: &str, password: &str) -> String {
    format!(
        "authorization: Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_clones_its_repository_with_real_git() {
    let pod = sim(2).await;
    let runner = register(&pod).await;
    let job = take_job(&pod, &runner, json!({})).await;
    let repo_url = job["git_info"]["repo_url"].as_str().unwrap().to_owned();
    let sha = job["git_info"]["sha"].as_str().unwrap().to_owned();
    assert_eq!(Some(sha.as_str()), pod.commit_sha());

    let dir = tempfile::tempdir().unwrap();
    let out = git(&["clone", &repo_url, "project"], dir.path()).await;
    assert!(
        out.status.success(),
        "git clone: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let work = dir.path().join("project");
    let out = git(&["checkout", "-f", &sha], &work).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let head = git(&["rev-parse", "HEAD"], &work).await;
    assert_eq!(String::from_utf8_lossy(&head.stdout).trim(), sha);
    let readme = std::fs::read_to_string(work.join("README.md")).unwrap();
    assert!(readme.contains("Pod 2"), "{readme}");
    // The clone went through the Git endpoints of this Pod.
    let metrics = pod.metrics().render();
    for endpoint in ["git_info_refs", "git_upload_pack"] {
        assert!(
            metrics.contains(&format!(
                "podsim_requests_total{{endpoint=\"{endpoint}\",status=\"200\",pod=\"2\"}}"
            )),
            "{metrics}"
        );
    }

    // Without credentials, git is refused (and does not prompt).
    let anonymous = format!("{}/{}.git", pod.external_url(), pod.project_path());
    let out = git(&["clone", &anonymous, "anon"], dir.path()).await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Authentication failed")
            || String::from_utf8_lossy(&out.stderr).contains("could not read Username"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Once the job is finished its token no longer clones.
    let token = job["token"].as_str().unwrap();
    let r = json(
        pod.addr(),
        "PUT",
        &format!("/api/v4/jobs/{}", job["id"]),
        &[],
        json!({"token": token, "state": "success"}),
    )
    .await;
    assert_eq!(r.status, 200);
    let out = git(&["clone", &repo_url, "late"], dir.path()).await;
    assert!(
        !out.status.success(),
        "a finished job's token clones nothing"
    );
    assert_eq!(pod.metrics().misrouted.get(), 0);
}

#[tokio::test]
async fn git_http_authenticates_like_gitlab() {
    let pod = sim(2).await;
    let other = sim(3).await;
    let a = pod.addr();
    let runner = register(&pod).await;
    let job = take_job(&pod, &runner, json!({})).await;
    let token = job["token"].as_str().unwrap();
    let refs = format!(
        "/{}.git/info/refs?service=git-upload-pack",
        pod.project_path()
    );

    // No credentials: GitLab's challenge, not a misroute.
    let r = call(a, "GET", &refs, &[], b"").await;
    assert_eq!(r.status, 401);
    assert_eq!(r.header("www-authenticate"), Some("Basic realm=\"GitLab\""));
    assert_eq!(r.body, b"HTTP Basic: Access denied\n");
    // A wrong token, or the right token for another user name: 401 too.
    for auth in [
        basic("gitlab-ci-token", "glcbt-wrong"),
        basic("root", token),
    ] {
        let r = call(a, "GET", &refs, &[&auth], b"").await;
        assert_eq!(r.status, 401, "{auth}");
    }
    // The job token: the refs advertisement from git http-backend.
    let r = call(a, "GET", &refs, &[&basic("gitlab-ci-token", token)], b"").await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-type"),
        Some("application/x-git-upload-pack-advertisement")
    );
    let sha = pod.commit_sha().unwrap();
    assert!(String::from_utf8_lossy(&r.body).contains(sha));
    // Pushing is not allowed with a job token.
    let push = format!(
        "/{}.git/info/refs?service=git-receive-pack",
        pod.project_path()
    );
    let r = call(a, "GET", &push, &[&basic("gitlab-ci-token", token)], b"").await;
    assert_eq!(r.status, 403);
    // Another project of this Pod: 404.
    let r = call(
        a,
        "GET",
        "/group/project-9.git/info/refs?service=git-upload-pack",
        &[&basic("gitlab-ci-token", token)],
        b"",
    )
    .await;
    assert_eq!(r.status, 404);
    assert_eq!(pod.metrics().misrouted.get(), 0);

    // A job token of Pod 3 at Pod 2: 403, counted.
    let other_runner = register(&other).await;
    let foreign = take_job(&other, &other_runner, json!({})).await;
    let r = call(
        a,
        "GET",
        &refs,
        &[&basic(
            "gitlab-ci-token",
            foreign["token"].as_str().unwrap(),
        )],
        b"",
    )
    .await;
    assert_eq!(r.status, 403);
    assert_eq!(pod.metrics().misrouted.get(), 1);
}
