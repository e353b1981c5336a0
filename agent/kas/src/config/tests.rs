//! Unit tests of `kas.toml`: every bad field named, defaults, sections.

use super::*;

#[test]
fn every_bad_field_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short");
    std::fs::write(&short, "c2hvcnQ=").unwrap();
    let file: KasFileConfig = toml::from_str(&format!(
        r#"agent_listen = "nowhere"
           external_listen = "127.0.0.1:1"
           internal_listen = "127.0.0.1:x"
           external_secret_file = "{s}"
           internal_secret_file = "/does/not/exist"
           issuer = ""
           observability_listen = "everywhere"
           metrics_token_file = "/does/not/exist/either"
           max_wait = "0s"
           [agent_info]
           url = "gitlab.example.com"
           negative_ttl = "0s""#,
        s = short.display()
    ))
    .unwrap();
    let err = file.validate("kas.toml").unwrap_err().to_string();
    for field in [
        "kas.toml",
        "agent_listen",
        "internal_listen",
        "external_secret_file",
        "internal_secret_file",
        "issuer",
        "observability_listen",
        "metrics_token_file",
        "max_wait",
        "agent_info.url",
        "agent_info.negative_ttl",
    ] {
        assert!(err.contains(field), "{field}: {err}");
    }
    assert!(!err.contains("external_listen"), "{err}");
    assert!(!err.contains("positive_ttl"), "{err}");
}

fn with_secrets(dir: &Path, rest: &str) -> KasFileConfig {
    let (a, b) = (dir.join("a"), dir.join("b"));
    std::fs::write(&a, "YWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWE=").unwrap();
    std::fs::write(&b, "YmJiYmJiYmJiYmJiYmJiYmJiYmJiYmJiYmJiYmJiYmI=").unwrap();
    toml::from_str(&format!(
        r#"agent_listen = "127.0.0.1:0"
           external_listen = "127.0.0.1:0"
           internal_listen = "127.0.0.1:0"
           external_secret_file = "{}"
           internal_secret_file = "{}"
           {rest}"#,
        a.display(),
        b.display()
    ))
    .unwrap()
}

#[test]
fn k8s_proxy_defaults_and_normalisation() {
    let dir = tempfile::tempdir().unwrap();
    let file = with_secrets(
        dir.path(),
        r#"[agent_info]
           url = "http://gitlab:8080"
           [k8s_proxy]
           listen = "127.0.0.1:8154"
           url_prefix = "/-/kubernetes-agent/k8s-proxy"
           allowed_origins = ["https://gitlab.example.com"]"#,
    );
    let (config, _) = file.validate("kas.toml").unwrap();
    let p = config.k8s_proxy.unwrap();
    assert_eq!(p.url_prefix, "/-/kubernetes-agent/k8s-proxy/");
    assert_eq!(p.gitlab_url, "http://gitlab:8080");
    assert_eq!(p.positive_ttl, std::time::Duration::from_secs(60));
    assert_eq!(p.negative_ttl, std::time::Duration::from_secs(10));
    assert_eq!(p.max_request_body, 16 << 20);
    let default_prefix = with_secrets(
        dir.path(),
        "[k8s_proxy]\nlisten = \"127.0.0.1:0\"\ngitlab_url = \"http://g\"",
    );
    let (config, _) = default_prefix.validate("kas.toml").unwrap();
    assert_eq!(config.k8s_proxy.unwrap().url_prefix, "/k8s-proxy/");
}

#[test]
fn workspaces_defaults_and_bad_fields() {
    let dir = tempfile::tempdir().unwrap();
    let file = with_secrets(
        dir.path(),
        "[gitlab]\nurl = \"http://gitlab:8080\"\n[workspaces]\nlisten = \"127.0.0.1:8160\"",
    );
    let (config, _) = file.validate("kas.toml").unwrap();
    let w = config.workspaces.unwrap();
    assert_eq!(w.listen.port(), 8160);
    assert_eq!(w.gitlab_url, "http://gitlab:8080");
    assert_eq!(w.user_ttl, std::time::Duration::from_secs(30));
    assert_eq!(w.max_request_body, 16 << 20);
    let file = with_secrets(
        dir.path(),
        "[workspaces]\nlisten = \"nowhere\"\ntimeout = \"0s\"\nmax_request_body = 0",
    );
    let err = file.validate("kas.toml").unwrap_err().to_string();
    for needle in [
        "workspaces.listen",
        "workspaces.gitlab_url: required",
        "workspaces.timeout",
        "workspaces.max_request_body",
    ] {
        assert!(err.contains(needle), "{needle} missing: {err}");
    }
}

#[test]
fn k8s_proxy_bad_fields_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = with_secrets(
        dir.path(),
        r#"[k8s_proxy]
           listen = "nowhere"
           url_prefix = "k8s"
           allowed_origins = ["https://ok.example.com", "https://x.example.com/path"]
           negative_ttl = "0s"
           max_request_body = 0"#,
    );
    let err = file.validate("kas.toml").unwrap_err().to_string();
    for field in [
        "k8s_proxy.listen",
        "k8s_proxy.url_prefix",
        "k8s_proxy.allowed_origins[1]",
        "k8s_proxy.gitlab_url: required",
        "k8s_proxy.negative_ttl",
        "k8s_proxy.max_request_body",
    ] {
        assert!(err.contains(field), "{field}: {err}");
    }
    assert!(!err.contains("allowed_origins[0]"), "{err}");
}

#[test]
fn gitlab_and_agent_configuration_sections() {
    let dir = tempfile::tempdir().unwrap();
    let agents = dir.path().join("agents");
    std::fs::create_dir(&agents).unwrap();
    let file = with_secrets(
        dir.path(),
        &format!(
            r#"[gitlab]
               url = "http://gitlab:8080"
               [agent_configuration]
               dir = "{}"
               [agent_info]
               [k8s_proxy]
               listen = "127.0.0.1:0""#,
            agents.display()
        ),
    );
    let (config, _) = file.validate("kas.toml").unwrap();
    assert_eq!(config.gitlab_url.as_deref(), Some("http://gitlab:8080"));
    let source = config.agent_config.unwrap();
    assert_eq!(source.dir, agents);
    assert_eq!(source.poll, std::time::Duration::from_secs(20));
    // Both default to [gitlab] url.
    assert_eq!(config.agent_info.unwrap().url, "http://gitlab:8080");
    assert_eq!(config.k8s_proxy.unwrap().gitlab_url, "http://gitlab:8080");

    let bad = with_secrets(
        dir.path(),
        r#"[gitlab]
           url = "gitlab:8080"
           [agent_configuration]
           dir = "/does/not/exist"
           poll = "0s""#,
    );
    let err = bad.validate("kas.toml").unwrap_err().to_string();
    for field in [
        "gitlab.url",
        "agent_configuration.dir",
        "agent_configuration.poll",
    ] {
        assert!(err.contains(field), "{field}: {err}");
    }
    let no_url = with_secrets(dir.path(), "[agent_info]\npositive_ttl = \"1m\"");
    let err = no_url.validate("kas.toml").unwrap_err().to_string();
    assert!(err.contains("agent_info.url: required"), "{err}");
}

#[test]
fn any_issuer_unless_one_is_set() {
    let dir = tempfile::tempdir().unwrap();
    let (config, _) = with_secrets(dir.path(), "").validate("kas.toml").unwrap();
    assert_eq!(config.issuer, "", "no issuer: any, as GitLab's kas");
    let (config, _) = with_secrets(dir.path(), r#"issuer = "gitlab.example.com""#)
        .validate("kas.toml")
        .unwrap();
    assert_eq!(config.issuer, "gitlab.example.com");
}

#[test]
fn gitlab_external_url_is_optional() {
    let dir = tempfile::tempdir().unwrap();
    let file = with_secrets(
        dir.path(),
        "[gitlab]\nurl = \"http://gitlab:8080\"\nexternal_url = \"https://gitlab.example.com\"",
    );
    let (config, _) = file.validate("kas.toml").unwrap();
    assert_eq!(
        config.gitlab_external_url.as_deref(),
        Some("https://gitlab.example.com")
    );
    let file = with_secrets(dir.path(), "[gitlab]\nurl = \"http://gitlab:8080\"");
    assert_eq!(
        file.validate("kas.toml").unwrap().0.gitlab_external_url,
        None
    );
}

#[test]
fn job_router_defaults_and_bad_fields() {
    let dir = tempfile::tempdir().unwrap();
    let file = with_secrets(
        dir.path(),
        "[gitlab]\nurl = \"http://gitlab:8080\"\n[job_router]\nrunner_queue_redis = \"redis://redis:6379\"",
    );
    let (config, _) = file.validate("kas.toml").unwrap();
    let j = config.job_router.unwrap();
    assert!(j.enabled);
    assert_eq!(j.runner_queue_redis.as_deref(), Some("redis://redis:6379"));
    assert_eq!(j.hold, crate::job_router::DEFAULT_HOLD);
    assert_eq!(j.max_held, crate::job_router::DEFAULT_MAX_HELD);
    assert_eq!(
        j.max_held_per_runner,
        crate::job_router::DEFAULT_MAX_HELD_PER_RUNNER
    );
    let (config, _) = with_secrets(dir.path(), "").validate("kas.toml").unwrap();
    assert!(config.job_router.is_none(), "off unless configured");
    let file = with_secrets(
        dir.path(),
        "[job_router]\nrunner_queue_redis = \"redis.example:6379\"\nhold = \"0s\"\nmax_held = 0\nmax_held_per_runner = 0",
    );
    let err = file.validate("kas.toml").unwrap_err().to_string();
    for needle in [
        "job_router: needs [gitlab] url",
        "job_router.runner_queue_redis",
        "job_router.hold",
        "job_router.max_held:",
        "job_router.max_held_per_runner",
    ] {
        assert!(err.contains(needle), "{needle} missing: {err}");
    }
}
