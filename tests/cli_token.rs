//! `podgate token …` end to end: the binary's JSON output and exit codes.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

const VECTOR: &str = "glrt-AAAAAAAAAAAAAAAAAAAAAGM6MgpnOjlpeApvOjEKdToxNhI.01.1b0zz5pn1";

fn podgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_podgate"))
        .args(args)
        .output()
        .expect("podgate runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {}", stdout(o)))
}

#[test]
fn inspect_the_reference_vector() {
    let o = podgate(&["token", "inspect", VECTOR]);
    assert_eq!(o.status.code(), Some(0));
    let r = json(&o);
    assert_eq!(r["format"], "gitlab-v1");
    assert_eq!(r["status"], "routable");
    assert_eq!(r["pod"], 2);
    assert_eq!(r["kind"], "runner");
    assert_eq!(
        r["fields"],
        serde_json::json!({"c": 2, "g": 12345, "o": 1, "u": 42})
    );
    assert_eq!(r["reason"], Value::Null);
    assert!(
        !stdout(&o).contains("AAAAAAAAAAAAAAAAAAAAAG"),
        "random part printed"
    );
}

/// Characters of more than one byte anywhere in a token (its prefix, payload, CRC,
/// version or random part): an answer that names the token invalid or unroutable,
/// never a panic (exit 101) or a Pod.
#[test]
fn inspect_non_ascii_input_is_an_answer_not_a_panic() {
    let at = |i: usize| {
        let mut t = VECTOR.to_owned();
        t.replace_range(i..=i, "\u{e9}");
        t
    };
    let tokens = [
        at(2),
        at(10),
        at(VECTOR.len() - 16),
        at(VECTOR.len() - 11),
        at(VECTOR.len() - 1),
        "glrt-\u{1f600}".to_owned(),
        "\u{e9}".repeat(40),
    ];
    for token in &tokens {
        let o = podgate(&["token", "inspect", token]);
        let r = json(&o);
        assert!(
            matches!(o.status.code(), Some(0 | 1)),
            "{token:?}: exit {:?}, {r}",
            o.status
        );
        assert!(
            matches!(r["status"].as_str(), Some("invalid" | "unroutable")),
            "{token:?}: {r}"
        );
        assert_eq!(r["pod"], Value::Null, "{token:?}");
    }
}

#[test]
fn inspect_exit_codes() {
    let bad = VECTOR.replace("GM6Mg", "GM6Mw");
    let o = podgate(&["token", "inspect", &bad]);
    assert_eq!(o.status.code(), Some(1));
    let r = json(&o);
    assert_eq!(r["status"], "invalid");
    assert_eq!(r["reason_code"], "bad_crc");
    assert!(r["reason"].as_str().unwrap().contains("CRC"));
    assert_eq!(r["pod"], Value::Null);

    let o = podgate(&["token", "inspect", "glrt-t1_legacyRandomValue"]);
    assert_eq!(o.status.code(), Some(0));
    let r = json(&o);
    assert_eq!(
        (r["format"].as_str(), r["status"].as_str()),
        (Some("opaque"), Some("unroutable"))
    );
    assert_eq!(r["kind"], "runner");
    assert!(r["reason"].is_string());

    assert_eq!(
        podgate(&["token", "inspect"]).status.code(),
        Some(2),
        "missing TOKEN"
    );
    assert_eq!(podgate(&["token", "frobnicate"]).status.code(), Some(2));
    let o = podgate(&["token", "inspect", "--keys", "/nonexistent/keys", VECTOR]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/keys"));
}

fn keygen(dir: &Path, alg: &str, kid: &str) -> Value {
    let o = podgate(&[
        "token",
        "keygen",
        "--alg",
        alg,
        "--kid",
        kid,
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    json(&o)
}

#[test]
fn keygen_mint_inspect_for_every_algorithm() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (alg, kid) in [
        ("ed25519", "ed"),
        ("es256", "es"),
        ("rs256", "rs"),
        ("hs256", "hs"),
    ] {
        let k = keygen(d, alg, kid);
        let private = k["private"].as_str().unwrap().to_owned();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&private).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "{private} readable by others");
        }
        let o = podgate(&[
            "token",
            "mint",
            "--kind",
            "job",
            "--pod",
            "7",
            "--ttl",
            "10m",
            "--key",
            &private,
            "--project",
            "99",
            "--prefix",
            "auto",
        ]);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let token = stdout(&o).trim().to_owned();
        assert!(token.starts_with("glcbt-eyJ"), "{token}");

        let o = podgate(&["token", "inspect", "--keys", d.to_str().unwrap(), &token]);
        assert_eq!(o.status.code(), Some(0), "{alg}: {}", stdout(&o));
        let r = json(&o);
        assert_eq!(r["format"], "jwt");
        assert_eq!(r["status"], "routable");
        assert_eq!(r["pod"], 7);
        assert_eq!(r["kind"], "job");
        assert_eq!(r["fields"]["c"], 7);
        assert_eq!(r["fields"]["p"], 99);
        assert_eq!(r["header"]["kid"], kid);

        // Without the keys the same token cannot be verified.
        let o = podgate(&["token", "inspect", &token]);
        assert_eq!(o.status.code(), Some(1));
        assert_eq!(json(&o)["reason_code"], "no_keys");
    }
    // keygen refuses to overwrite.
    let o = podgate(&[
        "token",
        "keygen",
        "--alg",
        "ed25519",
        "--kid",
        "ed",
        "--out",
        d.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn mint_gitlab_reproduces_the_vector_and_reads_stdin() {
    let o = podgate(&[
        "token",
        "mint-gitlab",
        "--prefix",
        "glrt-",
        "--cell",
        "2",
        "--org",
        "1",
        "--group",
        "12345",
        "--user",
        "42",
        "--random-hex",
        "00000000000000000000000000000000",
    ]);
    assert_eq!(stdout(&o).trim(), VECTOR);

    use std::io::Write as _;
    let mut child = Command::new(env!("CARGO_BIN_EXE_podgate"))
        .args(["token", "inspect", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{VECTOR}\n").as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(json(&o)["pod"], 2);
}

#[test]
fn demo_runs() {
    let o = podgate(&["token", "demo"]);
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    assert!(out.contains("4 of 7 tokens routable"), "{out}");
}

/// A `--log` filter that does not parse is a usage error naming the flag, not a quiet
/// fall-back to `warn`; `PODGATE_LOG` is checked the same way.
#[test]
fn a_bad_log_filter_is_a_usage_error() {
    let o = podgate(&["--log", "podgate=[", "token", "inspect", VECTOR]);
    assert_eq!(o.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("--log \"podgate=[\""), "{stderr}");
    assert!(o.stdout.is_empty(), "the command did not run");
    let o = Command::new(env!("CARGO_BIN_EXE_podgate"))
        .args(["token", "inspect", VECTOR])
        .env("PODGATE_LOG", "warn,=bogus=")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("PODGATE_LOG"));
    // A good one runs the command.
    assert_eq!(
        podgate(&["--log", "podgate=debug,warn", "token", "inspect", VECTOR])
            .status
            .code(),
        Some(0)
    );
}

/// `podgate proxy`: a configuration it cannot use exits 2 naming the field; one it
/// can use but cannot run (its address is taken) exits 1.
#[test]
fn proxy_configuration_errors_exit_2_and_run_failures_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("proxy.toml");
    // An inline topology and a Redis registry both say where Pods are.
    std::fs::write(
        &file,
        r#"
        listen = "127.0.0.1:0"
        admin_listen = "127.0.0.1:0"
        [registry.backend]
        kind = "redis"
        url = "redis://127.0.0.1:6379"
        [topology]
        default_pod = 1
        [[topology.pods]]
        id = 1
        name = "legacy"
        web = ["127.0.0.1:9001"]
        "#,
    )
    .unwrap();
    let o = podgate(&["proxy", "--config", file.to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("topology: an inline [topology] and a Redis registry.backend"),
        "{stderr}"
    );

    // Valid, but its Redis Cluster cannot be reached: a run-time failure.
    let port = podgate_registry::testing::free_port();
    std::fs::write(
        &file,
        format!(
            r#"
            listen = "127.0.0.1:0"
            admin_listen = "127.0.0.1:0"
            [registry.backend]
            kind = "redis-cluster"
            nodes = ["redis://127.0.0.1:{port}"]
            "#
        ),
    )
    .unwrap();
    let o = podgate(&["proxy", "--config", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("opening the registry"), "{stderr}");
}
