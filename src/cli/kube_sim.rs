//! `podgate kube-sim --listen ADDR [--seed FILE.yaml] [--objects N [--gen-seed S]]
//! [--churn PER_S] [--deny GROUP/RESOURCE]… [--controllers auto|on|off]
//! [--pod-start-delay D] [--pod-stop-delay D] [--namespace-delete-delay D]
//! [--progress-deadline-factor F] [--refuse RESOURCE:NAME_REGEX:MESSAGE]…`: a
//! simulated Kubernetes API server that `kubectl` and agentk accept, until
//! SIGTERM/SIGINT.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use podgate_kube_sim::{self as kube_sim, KubeSim};

/// Flags of `podgate kube-sim`.
#[derive(Debug, Args)]
pub(crate) struct KubeSimArgs {
    /// Where to listen (port 0: a free port, printed at start).
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Objects to load at start: a multi-document YAML file (`---` between
    /// documents) of any served kind (`kubectl api-resources` lists them).
    #[arg(long, value_name = "FILE.yaml")]
    seed: Option<PathBuf>,
    /// Generate a cluster of exactly this many objects (Nodes and classes;
    /// namespaces with apps: ConfigMaps, Secrets, ServiceAccounts, Services,
    /// Deployments → ReplicaSets → Pods; Ingresses, StatefulSets, CronJobs; Flux
    /// Kustomizations, HelmReleases and their sources), after the seed file.
    #[arg(long, value_name = "N")]
    objects: Option<usize>,
    /// The seed number of `--objects` and `--churn`: the same number, the same
    /// cluster and the same changes.
    #[arg(long, value_name = "S", default_value_t = 1)]
    gen_seed: u64,
    /// Change the cluster this many times a second (Deployments scaled with their
    /// Pods, ConfigMaps and Pods created, labels, annotations, specs and statuses
    /// updated, Pods and ConfigMaps deleted).
    #[arg(long, value_name = "PER_S")]
    churn: Option<f64>,
    /// Answer get, list and watch of this resource with `403 Forbidden`, as missing
    /// RBAC does: `apps/deployments`, `/pods` or `core/pods` for the core group.
    /// Repeatable.
    #[arg(long, value_name = "GROUP/RESOURCE", value_parser = parse_deny)]
    deny: Vec<(String, String)>,
    /// Authenticate and authorize every request as kube-apiserver's RBAC does:
    /// ServiceAccount token Secrets and the bound Roles and ClusterRoles decide.
    /// Serves HTTPS with a self-signed certificate (client-go sends tokens over
    /// TLS only); the kubeconfig written trusts it and holds a fresh administrator
    /// token (group `system:masters`), for the operator who installs the roles.
    #[arg(long)]
    enforce_rbac: bool,
    /// Write the kubeconfig here (default: a temporary file, removed at exit).
    #[arg(long, value_name = "PATH")]
    kubeconfig_out: Option<PathBuf>,
    /// Changes kept for watches resuming from a resourceVersion; older ones get
    /// `410 Gone`.
    #[arg(long, default_value_t = 10_000)]
    history: usize,
    /// Run the controllers (Deployments get ReplicaSets, Pods and a moving status;
    /// Services of available Deployments get backend servers and Endpoints).
    /// `auto`: on, unless `--objects` or `--churn` make their own ReplicaSets and
    /// Pods.
    #[arg(long, value_enum, default_value_t = Controllers::Auto)]
    controllers: Controllers,
    /// From a Pod's creation to it running (and ready, unless an image's tag is
    /// `crashloop`).
    #[arg(long, value_name = "DURATION", default_value = "300ms", value_parser = kube_sim::parse_duration)]
    pod_start_delay: Duration,
    /// From a Pod's deletion (a scale-down) to it being gone.
    #[arg(long, value_name = "DURATION", default_value = "200ms", value_parser = kube_sim::parse_duration)]
    pod_stop_delay: Duration,
    /// How long a deleted namespace stays Terminating before its contents, then
    /// itself, are deleted.
    #[arg(long, value_name = "DURATION", default_value = "200ms", value_parser = kube_sim::parse_duration)]
    namespace_delete_delay: Duration,
    /// Multiply Deployments' `progressDeadlineSeconds` (600 by default) by this
    /// before `ProgressDeadlineExceeded`: 0.01 makes the default 6 s.
    #[arg(long, value_name = "F", default_value_t = 1.0)]
    progress_deadline_factor: f64,
    /// Refuse creates, updates and patches of RESOURCE named to match NAME_REGEX,
    /// as an admission webhook denying them with MESSAGE: `deployments:^bad-:no`.
    /// Repeatable.
    #[arg(long, value_name = "RESOURCE:NAME_REGEX:MESSAGE", value_parser = parse_refuse)]
    refuse: Vec<(String, String, String)>,
}

/// Whether `podgate kube-sim` runs its controllers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Controllers {
    /// On unless `--objects` or `--churn` is given.
    Auto,
    /// Always.
    On,
    /// Never.
    Off,
}

/// `deployments:^bad-:policy says no` → (resource, pattern, message).
fn parse_refuse(s: &str) -> Result<(String, String, String), String> {
    let mut it = s.splitn(3, ':');
    match (it.next(), it.next(), it.next()) {
        (Some(r), Some(p), Some(m)) if !r.is_empty() && !m.is_empty() => {
            Ok((r.to_owned(), p.to_owned(), m.to_owned()))
        }
        _ => Err(format!(
            "{s:?}: expected RESOURCE:NAME_REGEX:MESSAGE, such as deployments:^bad-:denied by policy"
        )),
    }
}

/// `apps/deployments` → (`apps`, `deployments`); `/pods` and `core/pods` name the
/// core group. The resource must be served.
fn parse_deny(s: &str) -> Result<(String, String), String> {
    let (group, resource) = s.split_once('/').ok_or_else(|| {
        format!("{s:?}: expected GROUP/RESOURCE, such as apps/deployments or /pods")
    })?;
    let group = if group == "core" { "" } else { group };
    if !KubeSim::serves(group, resource) {
        return Err(format!(
            "{s:?}: kube-sim serves no resource {resource:?} in group {group:?} (`kubectl api-resources` lists them)"
        ));
    }
    Ok((group.to_owned(), resource.to_owned()))
}

pub(crate) fn run(args: KubeSimArgs) -> anyhow::Result<ExitCode> {
    if let Some(per_s) = args.churn
        && !(per_s.is_finite() && per_s >= 0.0)
    {
        return Err(super::usage(format!(
            "--churn {per_s}: expected a number of changes a second, 0 or more"
        )));
    }
    let sim = KubeSim::new(args.history);
    sim.set_settings(kube_sim::Settings {
        pod_start_delay: args.pod_start_delay,
        pod_stop_delay: args.pod_stop_delay,
        namespace_delete_delay: args.namespace_delete_delay,
        progress_deadline_factor: args.progress_deadline_factor,
    })
    .context("--progress-deadline-factor")?;
    for (resource, pattern, message) in &args.refuse {
        sim.refuse(resource, pattern, message)
            .with_context(|| format!("--refuse {resource}:{pattern}:{message}"))?;
        println!("kube-sim: refusing writes of {resource} named like /{pattern}/: {message}");
    }
    for (group, resource) in &args.deny {
        sim.deny(group, resource);
        println!("kube-sim: denying get, list and watch of {resource} in group {group:?}");
    }
    if let Some(path) = &args.seed {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading --seed {}", path.display()))?;
        let n = sim
            .load_seed(&text)
            .with_context(|| format!("loading --seed {}", path.display()))?;
        println!("kube-sim: loaded {n} objects from {}", path.display());
    }
    if let Some(objects) = args.objects {
        let n = sim.generate(objects, args.gen_seed);
        println!(
            "kube-sim: generated {n} objects (--gen-seed {})",
            args.gen_seed
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        let mut addr = listener.local_addr()?;
        // A kubeconfig needs an address to dial, not a wildcard.
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
            });
        }
        let tls = args
            .enforce_rbac
            .then(kube_sim::Tls::self_signed)
            .transpose()
            .context("making kube-sim's TLS certificate")?;
        let url = match tls {
            Some(_) => format!("https://{addr}"),
            None => format!("http://{addr}"),
        };
        let admin = args.enforce_rbac.then(|| {
            let token = format!("{:032x}", rand::random::<u128>());
            sim.add_token(&token, "kube-sim:admin", &["system:masters"]);
            sim.enforce_rbac(true);
            token
        });
        let config = kube_sim::kubeconfig_with(
            &url,
            admin.as_deref(),
            tls.as_ref().map(kube_sim::Tls::ca_pem),
        );
        // Held until exit: a temporary kubeconfig is removed when it drops.
        let (_temp, path) = match &args.kubeconfig_out {
            Some(path) => {
                std::fs::write(path, &config)
                    .with_context(|| format!("writing --kubeconfig-out {}", path.display()))?;
                (None, path.clone())
            }
            None => {
                let file = tempfile::Builder::new()
                    .prefix("podgate-kube-sim-")
                    .suffix(".kubeconfig")
                    .tempfile()
                    .context("creating a temporary kubeconfig")?;
                std::fs::write(file.path(), &config).context("writing the kubeconfig")?;
                let path = file.path().to_owned();
                (Some(file), path)
            }
        };
        println!("kube-sim: Kubernetes API on {url}");
        if admin.is_some() {
            println!(
                "kube-sim: RBAC enforced; the kubeconfig's user is kube-sim:admin (system:masters)"
            );
        }
        println!("kube-sim: kubeconfig {}", path.display());
        println!(
            "kube-sim: try `kubectl --kubeconfig {} get pods -A`",
            path.display()
        );
        let controllers = match args.controllers {
            Controllers::On => true,
            Controllers::Off => false,
            Controllers::Auto => args.objects.is_none() && args.churn.is_none(),
        };
        // Held while serving: dropping them stops them.
        let _controllers = controllers.then(|| {
            println!(
                "kube-sim: controllers on (pods start in {:?}, stop in {:?}; namespaces go after {:?}; progress deadlines x{})",
                args.pod_start_delay,
                args.pod_stop_delay,
                args.namespace_delete_delay,
                args.progress_deadline_factor
            );
            sim.start_controllers()
        });
        // Held while serving: dropping it stops the churn.
        let _churn = args.churn.filter(|c| *c > 0.0).map(|per_s| {
            println!(
                "kube-sim: churning {per_s} changes a second (--gen-seed {})",
                args.gen_seed
            );
            sim.start_churn(per_s, args.gen_seed)
        });
        match tls {
            Some(tls) => sim.serve_tls(listener, tls, super::shutdown_signal()).await,
            None => sim.serve(listener, super::shutdown_signal()).await,
        }
        println!("kube-sim: stopping");
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::parse_refuse;

    #[test]
    fn refusals_are_resource_pattern_and_message() {
        assert_eq!(
            parse_refuse("deployments:^bad-:denied: by policy").unwrap(),
            (
                "deployments".to_owned(),
                "^bad-".to_owned(),
                "denied: by policy".to_owned()
            )
        );
        assert!(parse_refuse("deployments:^bad-").is_err());
        assert!(parse_refuse(":x:y").is_err());
    }
}
