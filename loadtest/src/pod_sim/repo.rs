//! The Git repository a simulated Pod serves: created at start with real `git` in
//! the simulator's temporary directory, one commit on `main`, at
//! `<root>/group/project-<pod>.git` (served over smart HTTP by `http/git.rs`).

use std::path::{Path, PathBuf};

use podgate_tokens::PodId;
use tokio::process::Command;

use super::Error;

/// The branch jobs build.
pub const BRANCH: &str = "main";

/// A bare repository with one commit.
#[derive(Clone, Debug)]
pub(crate) struct Repo {
    /// `GIT_PROJECT_ROOT` for `git http-backend`.
    pub(crate) root: PathBuf,
    /// The commit `main` points at.
    pub(crate) sha: String,
}

/// The project path of Pod `pod`'s repository.
pub(crate) fn project_path(pod: PodId) -> String {
    format!("group/project-{pod}")
}

/// Create the repository under `dir`.
pub(crate) async fn create(dir: &Path, pod: PodId) -> Result<Repo, Error> {
    let project_path = project_path(pod);
    let work = dir.join("work");
    let root = dir.join("repositories");
    let bare = root.join(format!("{project_path}.git"));
    tokio::fs::create_dir_all(&work).await?;
    tokio::fs::write(
        work.join("README.md"),
        format!("# project-{pod}\n\nThe repository simulated Pod {pod} serves to its CI jobs.\n"),
    )
    .await?;
    tokio::fs::write(
        work.join("build.sh"),
        format!("#!/bin/sh\necho \"built on Pod {pod}\"\n"),
    )
    .await?;
    git(dir, &work, &["init", "-q", "-b", BRANCH, "."]).await?;
    git(dir, &work, &["add", "-A"]).await?;
    git(dir, &work, &["commit", "-q", "-m", "Initial commit"]).await?;
    let bare_arg = bare.to_string_lossy().into_owned();
    git(dir, &work, &["clone", "-q", "--bare", ".", &bare_arg]).await?;
    let sha = git(dir, &bare, &["rev-parse", BRANCH]).await?;
    let _ = tokio::fs::remove_dir_all(&work).await;
    Ok(Repo {
        root,
        sha: sha.trim().to_owned(),
    })
}

/// Run `git args` in `cwd`, isolated from the user's and system's configuration;
/// its standard output.
async fn git(home: &Path, cwd: &Path, args: &[&str]) -> Result<String, Error> {
    let out = Command::new("git")
        .args(args)
        .current_dir(cwd)
        .env("HOME", home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "Pod Simulator")
        .env("GIT_AUTHOR_EMAIL", "pod-sim@example.com")
        .env("GIT_AUTHOR_DATE", "2026-01-01T00:00:00Z")
        .env("GIT_COMMITTER_NAME", "Pod Simulator")
        .env("GIT_COMMITTER_EMAIL", "pod-sim@example.com")
        .env("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z")
        .output()
        .await
        .map_err(|e| Error::Git(format!("running git {}: {e}", args.join(" "))))?;
    if !out.status.success() {
        return Err(Error::Git(format!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
