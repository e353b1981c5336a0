//! `podgate up`'s web console: the proxy's own (`podgate_console`) on its
//! admin listener, with the three Pods and kas as sources, and a browser session
//! for the graph.
//!
//! The page's URL carries in its fragment where the Graph API is (the proxy's
//! Kubernetes API proxy path), the agent, and a session of Pod 1's `root` user
//! (the `_gitlab_kas` cookie GitLab would set at sign-in, and its CSRF token): the
//! browser opens `/graph` through the proxy to kas as GitLab's frontend does, and
//! kas lets it in because the console's origin is in its `allowed_origins`.

use std::net::SocketAddr;
use std::path::Path;

use podgate_loadtest::pod_sim::PodSim;

use super::up_graph::KubeSide;

/// The origin the console's page runs on (kas's `allowed_origins` entry).
pub(crate) fn origin(admin: SocketAddr) -> String {
    format!("http://{admin}")
}

/// The `[console]` section of the proxy's configuration: the Pods' and kas's
/// `/metrics` (kas's token in a 0600 file in `dir`), each kas labelled with its Pod
/// (`cell_kas`: the other Pods' kas), and the fleet's runner metrics.
pub(crate) fn config_section(
    sims: &[PodSim],
    kube: Option<&KubeSide>,
    cell_kas: &[(u64, SocketAddr)],
    runner_metrics: Option<SocketAddr>,
    dir: &Path,
) -> anyhow::Result<String> {
    let mut out = String::from("[console]\nenabled = true\ninterval_ms = 1000\n");
    for s in sims {
        out.push_str(&format!(
            "[[console.sources]]\nname = \"pod-{}\"\nurl = \"http://{}/metrics\"\n",
            s.state().pod(),
            s.addr()
        ));
    }
    if let Some(k) = kube {
        let token = dir.join("kas-metrics-token");
        super::up_prometheus::write_secret(&token, &k.metrics_token)?;
        out.push_str(&format!(
            "[[console.sources]]\nname = \"kas\"\nurl = \"http://{}/metrics\"\nbearer_token_file = \"{}\"\nlabels = {{ pod = \"1\" }}\n",
            k.kas_observability,
            token.display()
        ));
    }
    for (pod, addr) in cell_kas {
        out.push_str(&format!(
            "[[console.sources]]\nname = \"kas-pod-{pod}\"\nurl = \"http://{addr}/metrics\"\nlabels = {{ pod = \"{pod}\" }}\n"
        ));
    }
    if let Some(addr) = runner_metrics {
        out.push_str(&format!(
            "[[console.sources]]\nname = \"runners\"\nurl = \"http://{addr}/metrics\"\n"
        ));
    }
    Ok(out)
}

/// The console's URL; with the Kubernetes side, its fragment says where the
/// graph is and carries a fresh session of `root` on `gitlab` (Pod 1).
pub(crate) fn url(
    admin: SocketAddr,
    listen: SocketAddr,
    gitlab: Option<&PodSim>,
) -> anyhow::Result<String> {
    let base = format!("{}/console/", origin(admin));
    let Some(gitlab) = gitlab else {
        return Ok(base);
    };
    let (session, csrf) = gitlab.sign_in("root")?;
    Ok(format!(
        "{base}#graph=ws://{listen}{}graph&agent={}&session={session}&csrf={csrf}",
        super::up_graph::K8S_PROXY_PREFIX,
        super::up_graph::AGENT_ID
    ))
}
