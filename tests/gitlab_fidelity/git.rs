//! GitLab-fidelity cases: git.

use super::*;

pub(super) fn git(cases: &mut Vec<Case>) {
    let (j2, j3) = (gitlab_token("glcbt-", 2), gitlab_token("glcbt-", 3));
    let pat3 = gitlab_token("glpat-", 3);
    let dt2 = gitlab_token("gldt-", 2);
    let dt3 = gitlab_token("gldt-", 3);
    let ci = |t: &str| basic("gitlab-ci-token", t);
    let mut add = |name: &str, req: Req, expect: Expect, who: &str| {
        cases.push(Case::new(
            format!("git {name}"),
            format!("{who}. {GIT_AUTH}"),
            req,
            expect,
        ));
    };
    add(
        "info/refs upload-pack, Basic gitlab-ci-token Pod 3",
        Req::new(
            "GET",
            "/group/project.git/info/refs?service=git-upload-pack",
        )
        .header("authorization", &ci(&j3))
        .header("git-protocol", "version=2"),
        Expect::Pod(3),
        "GitLab authenticates the job token (Pod 3)",
    );
    add(
        "git-upload-pack POST, Basic gitlab-ci-token Pod 2",
        Req::new("POST", "/group/project.git/git-upload-pack")
            .header("authorization", &ci(&j2))
            .body(
                "application/x-git-upload-pack-request",
                b"0014command=ls-refs\n0001000csymrefs\n0000".to_vec(),
            ),
        Expect::Pod(2),
        "GitLab authenticates the job token (Pod 2)",
    );
    add(
        "git-receive-pack POST, Basic user:PAT Pod 3",
        Req::new("POST", "/group/sub/project.git/git-receive-pack")
            .header("authorization", &basic("jane", &pat3))
            .body("application/x-git-receive-pack-request", b"0000".to_vec()),
        Expect::Pod(3),
        "GitLab authenticates the PAT (Pod 3)",
    );
    add(
        "info/refs receive-pack, Basic deploy token Pod 2",
        Req::new(
            "GET",
            "/group/project.git/info/refs?service=git-receive-pack",
        )
        .header("authorization", &basic("gitlab+deploy-token-1", &dt2)),
        Expect::Pod(2),
        "GitLab authenticates the deploy token (Pod 2)",
    );
    add(
        "LFS batch, Basic gitlab-ci-token Pod 3 (JSON body without a token field)",
        Req::new("POST", "/group/project.git/info/lfs/objects/batch")
            .header("authorization", &ci(&j3))
            .header("accept", "application/vnd.git-lfs+json")
            .body(
                "application/vnd.git-lfs+json",
                br#"{"operation":"download","objects":[{"oid":"12","size":1}]}"#.to_vec(),
            ),
        Expect::Pod(3),
        "GitLab authenticates the job token (Pod 3); the LFS body is not a token source",
    );
    add(
        "/jwt/auth for the registry, Basic gitlab-ci-token Pod 2",
        Req::new(
            "GET",
            "/jwt/auth?service=container_registry&scope=repository:group/project:pull,push",
        )
        .header("authorization", &ci(&j2)),
        Expect::Pod(2),
        "app/controllers/jwt_controller.rb authenticates the job token (Pod 2)",
    );
    add(
        "generic package upload, JOB-TOKEN Pod 3",
        Req::new(
            "PUT",
            "/api/v4/projects/5/packages/generic/pkg/1.0.0/file.bin",
        )
        .header("job-token", &j3)
        .body("application/octet-stream", vec![0xAB; 3000]),
        Expect::Pod(3),
        "lib/api/generic_packages.rb (job_token_allowed): GitLab authenticates JOB-TOKEN (Pod 3)",
    );
    add(
        "Maven package download, Deploy-Token Pod 2",
        Req::new(
            "GET",
            "/api/v4/projects/5/packages/maven/com/acme/app/1.0/app-1.0.jar",
        )
        .header("deploy-token", &dt2),
        Expect::Pod(2),
        "deploy_token_allowed route: GitLab authenticates Deploy-Token (Pod 2)",
    );
    add(
        "PyPI package upload, Basic gitlab-ci-token Pod 3",
        Req::new("POST", "/api/v4/projects/5/packages/pypi")
            .header("authorization", &ci(&j3))
            .body(
                &mp_type(),
                multipart(&[field(":action", "file_upload"), file_part(300)]),
            ),
        Expect::Pod(3),
        "lib/api/pypi_packages.rb (job_token_allowed: :basic_auth): GitLab authenticates the job token (Pod 3)",
    );
    add(
        "info/refs without credentials",
        Req::new(
            "GET",
            "/group/project.git/info/refs?service=git-upload-pack",
        ),
        Expect::Pod(1),
        "no credentials: GitLab answers the anonymous request; the default Pod",
    );
    add(
        "info/refs, Basic user:password (no token)",
        Req::new(
            "GET",
            "/group/project.git/info/refs?service=git-upload-pack",
        )
        .header("authorization", &basic("jane", "correct-horse-battery")),
        Expect::Pod(1),
        "a password is unroutable: the default Pod",
    );
    add(
        "git-upload-pack, Basic gitlab-ci-token invalid",
        Req::new("POST", "/group/project.git/git-upload-pack")
            .header("authorization", &ci(&corrupt(&j2)))
            .body("application/x-git-upload-pack-request", b"0000".to_vec()),
        Expect::Refused(401, "401"),
        "an invalid token: refused",
    );
    add(
        "info/refs, Basic gitlab-ci-token Pod 2 + JOB-TOKEN Pod 3 (not read on Git routes)",
        Req::new(
            "GET",
            "/group/project.git/info/refs?service=git-upload-pack",
        )
        .header("authorization", &ci(&j2))
        .header("job-token", &j3),
        Expect::Pod(2),
        "GitLab authenticates Basic (Pod 2) and never reads JOB-TOKEN on Git routes \
         (app/controllers/repositories/git_http_client_controller.rb #authenticate_user: \
         Basic, Kerberos or anonymous only), so JOB-TOKEN is no source here",
    );
    add(
        "generic package, JOB-TOKEN Pod 2 + Deploy-Token Pod 3",
        Req::new(
            "GET",
            "/api/v4/projects/5/packages/generic/pkg/1.0.0/file.bin",
        )
        .header("job-token", &j2)
        .header("deploy-token", &dt3),
        Expect::Refused(400, "conflicting_tokens"),
        "GitLab authenticates the deploy token first (Pod 3, lib/api/api_guard.rb), JOB-TOKEN names Pod 2: refused",
    );
}
