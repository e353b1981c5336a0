//! `podgate registry …` against a real redis-server and a topology file.

use std::process::{Command, Output};

use podgate_registry::testing::RedisServer;
use podgate_registry::{AgentConnection, BackendConfig, Registry, RegistryConfig};
use serde_json::Value;

fn podgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_podgate"))
        .args(args)
        .output()
        .expect("podgate runs")
}

fn ok_json(o: Output) -> Value {
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn pods_add_drain_list_rm_through_redis() {
    let server = RedisServer::start();
    let url = server.url();
    let r = |extra: &[&str]| {
        let mut args = vec!["registry", "--redis", url.as_str(), "--json"];
        args.extend_from_slice(extra);
        podgate(&args)
    };
    ok_json(r(&[
        "pods",
        "add",
        "--id",
        "1",
        "--name",
        "legacy",
        "--web",
        "127.0.0.1:8001",
        "--default",
    ]));
    ok_json(r(&[
        "pods",
        "add",
        "--id",
        "2",
        "--name",
        "pod-2",
        "--web",
        "127.0.0.1:8002",
        "--kas",
        "127.0.0.1:8152",
        "--label",
        "region=eu",
    ]));
    let t = ok_json(r(&["pods", "drain", "2"]));
    assert_eq!(t["default_pod"], 1);
    assert_eq!(t["pods"][1]["state"], "draining");
    assert_eq!(t["pods"][1]["labels"]["region"], "eu");

    // What the CLI wrote is in Redis, readable with redis-cli.
    let raw = server.cli(&["HGET", "podgate:{topology}", "pod:2"]);
    assert!(raw.contains("\"draining\""), "{raw}");

    let t = ok_json(r(&["pods", "list"]));
    assert_eq!(t["version"], 4);
    let t = ok_json(r(&["pods", "rm", "2"]));
    assert_eq!(t["pods"].as_array().unwrap().len(), 1);

    // Not there: a failure (1), not a usage error.
    let o = r(&["pods", "rm", "2"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no Pod with id 2"));
    let o = r(&["pods", "add", "--id", "3", "--name", "x", "--web", "nope"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("web[0]"));
}

#[test]
fn agents_by_agent_and_project() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let registry = rt.block_on(async {
        let r = Registry::connect(RegistryConfig {
            backend: BackendConfig::Redis { url: server.url() },
            ..RegistryConfig::default()
        })
        .await
        .unwrap();
        for (agent, conn) in [(3, 1), (3, 2), (4, 3)] {
            r.register_agent(AgentConnection {
                agent_id: agent,
                connection_id: conn,
                project_id: 42,
                version: "v17".into(),
                commit: "c".into(),
                pod_namespace: "ns".into(),
                pod_name: format!("agentk-{conn}"),
                kubernetes_version: None,
                connected_at_ms: 0,
                kas: "grpc://kas1:8155".into(),
            })
            .await
            .unwrap();
        }
        r
    });
    let url = server.url();
    let by_agent = ok_json(podgate(&[
        "registry",
        "--redis",
        &url,
        "--json",
        "agents",
        "--agent-id",
        "3",
    ]));
    assert_eq!(by_agent.as_array().unwrap().len(), 2);
    let by_project = ok_json(podgate(&[
        "registry",
        "--redis",
        &url,
        "--json",
        "agents",
        "--project-id",
        "42",
    ]));
    assert_eq!(by_project.as_array().unwrap().len(), 3);
    let table = podgate(&["registry", "--redis", &url, "agents", "--agent-id", "3"]);
    assert!(String::from_utf8_lossy(&table.stdout).contains("2 connection(s)"));
    drop(registry);
}

#[test]
fn topology_file_is_read_only_and_errors_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("topology.toml");
    std::fs::write(
        &file,
        "default_pod = 1\n[[pods]]\nid = 1\nname = \"legacy\"\nweb = [\"127.0.0.1:1\"]\n",
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let t = ok_json(podgate(&[
        "registry",
        "--topology",
        f,
        "--json",
        "pods",
        "list",
    ]));
    assert_eq!(t["pods"][0]["name"], "legacy");
    let o = podgate(&["registry", "--topology", f, "pods", "drain", "1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("static file"));

    let o = podgate(&["registry", "pods", "list"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--redis"));

    // Nothing listens on this port: a clear, prompt error.
    let port = podgate_registry::testing::free_port();
    let o = podgate(&[
        "registry",
        "--redis",
        &format!("redis://127.0.0.1:{port}"),
        "pods",
        "list",
    ]);
    // Redis unreachable is a run-time failure (1): the command was right.
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("registry backend error"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
