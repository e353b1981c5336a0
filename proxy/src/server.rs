//! Start the proxy: load keys, build the pingora server and its services, serve.
//!
//! Everything runs on runtimes pingora owns and stops: the proxy and admin
//! listeners, and five background services:
//!
//! - **registry**: opens the registry (memory or Redis) on its own runtime, where the
//!   registry's background tasks (topology watch and resync, refresh, GC) and its
//!   Redis connections then live; publishes it through a [`RegistryHandle`];
//! - **upstreams**: the per-(Pod, pool) load balancers, following the topology and
//!   re-resolving names ([`crate::upstreams`]);
//! - **health checks** of web and kas upstreams ([`crate::health`]);
//! - **edge polls**: the watches on opted-in Pods' runner queue keys
//!   ([`crate::edge_poll`]), unless `edge_poll_hold_secs = 0`;
//! - **connection hand-over**: idle client connections to and from the process
//!   that replaces this one, or that this one replaces ([`crate::handover`]).
//!
//! The listeners depend on the first two (pingora service dependencies), so the proxy
//! accepts its first connection only with a topology and resolved upstreams in place.

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use pingora::apps::HttpServerOptions;
use pingora::listeners::tls::TlsSettings;
use pingora::listeners::{DEFAULT_L4_WRITE_BUFFER_SIZE, L4BufferSettings, ListenerConfig};
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::{Server, ShutdownWatch};
use pingora::services::ServiceReadyNotifier;
use pingora::services::background::{BackgroundService, background_service};
use pingora::services::listening::Service;
use podgate_registry::{MemoryBackend, Registry, Topology, TopologyFile};
use podgate_tokens::{Classifier, KeySet};
use tokio::sync::Notify;

use crate::admin::Admin;
use crate::config::{Error, ProxyConfig};
use crate::edge_poll::{EdgePolls, EdgePollsService};
use crate::fast::{FastPath, FastPathSettings};
use crate::handover::{self, Handover, HandoverService};
use crate::service::PodGate;
use crate::upstreams::discovery::SystemResolver;
use crate::upstreams::{Upstreams, UpstreamsService};

/// The registry, once the registry service has opened it. Cheap to clone; reading
/// the topology is one lock-free load.
#[derive(Clone, Debug, Default)]
pub struct RegistryHandle {
    inner: Arc<HandleInner>,
}

#[derive(Debug, Default)]
struct HandleInner {
    registry: OnceLock<Registry>,
    opened: Notify,
}

/// What [`RegistryHandle::topology`] answers before the registry is open: nothing.
static EMPTY: std::sync::LazyLock<Arc<Topology>> =
    std::sync::LazyLock::new(|| Arc::new(Topology::default()));

impl RegistryHandle {
    /// A handle already holding `registry` (tests, embedding).
    pub fn of(registry: Registry) -> Self {
        let h = RegistryHandle::default();
        h.set(registry);
        h
    }

    /// Publish the opened registry (the first one wins).
    pub fn set(&self, registry: Registry) {
        let _ = self.inner.registry.set(registry);
        self.inner.opened.notify_waiters();
    }

    /// The registry, if open.
    pub fn get(&self) -> Option<&Registry> {
        self.inner.registry.get()
    }

    /// The registry, once open.
    pub async fn wait(&self) -> Registry {
        loop {
            let opened = self.inner.opened.notified();
            if let Some(r) = self.get() {
                return r.clone();
            }
            opened.await;
        }
    }

    /// The current topology; empty until the registry is open (the listeners start
    /// after it is, so requests never see that).
    pub fn topology(&self) -> Arc<Topology> {
        match self.get() {
            Some(r) => r.topology(),
            None => EMPTY.clone(),
        }
    }
}

/// Opens the registry on its runtime and keeps it (and its tasks) there until
/// shutdown.
struct RegistryService {
    config: ProxyConfig,
    handle: RegistryHandle,
}

#[async_trait]
impl BackgroundService for RegistryService {
    async fn start_with_ready_notifier(
        &self,
        mut shutdown: ShutdownWatch,
        ready: ServiceReadyNotifier,
    ) {
        let opened = match &self.config.topology {
            Some(t) => {
                Registry::with_memory(
                    MemoryBackend::new(t.to_topology(1)),
                    self.config.registry.clone(),
                )
                .await
            }
            None => Registry::connect(self.config.registry.clone()).await,
        };
        let registry = match opened {
            Ok(r) => r,
            Err(e) => {
                // Checked before the server started as far as possible (see
                // `check_registry`); what is left (a Redis Cluster that cannot be
                // reached) is a run-time failure: exit code 1, as `podgate` gives
                // them (2 is for usage and configuration errors).
                tracing::error!(error = %e, "opening the registry");
                eprintln!("podgate: opening the registry: {e}");
                std::process::exit(1);
            }
        };
        // Served on this process's /metrics (the default registry). A second proxy
        // in one process (tests) keeps the first one's.
        if let Err(e) = registry.register_metrics(prometheus::default_registry()) {
            tracing::debug!(error = %e, "registry metrics already registered");
        }
        self.handle.set(registry.clone());
        ready.notify_ready();
        while shutdown.changed().await.is_ok() && !*shutdown.borrow() {}
        let _ = registry.shutdown().await;
    }
}

/// What opening the registry could refuse, checked before anything starts so that
/// `podgate proxy` fails with the reason and exit code of any configuration error.
fn check_registry(config: &ProxyConfig) -> Result<(), Error> {
    config.registry.validate()?;
    if config.topology.is_none()
        && let Some(path) = &config.registry.topology_file
    {
        TopologyFile::load(path)?;
    }
    Ok(())
}

/// How the process starts.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunOptions {
    /// Take the listening sockets over from a running `podgate proxy` through
    /// `upgrade_sock` (send the old process SIGQUIT) instead of binding them.
    pub upgrade: bool,
}

/// Build everything and serve until a signal:
///
/// - SIGTERM: stop accepting, give requests in flight `grace_period_secs` to finish,
///   exit.
/// - SIGQUIT: hand the listening sockets to the process started with
///   [`RunOptions::upgrade`], keep serving 5 s more while it starts (pingora's close
///   timeout), then stop accepting and finish as for SIGTERM.
/// - SIGINT: exit now.
///
/// Returns only on a start-up error.
pub fn run(config: ProxyConfig, run_options: RunOptions) -> Result<(), Error> {
    check_registry(&config)?;
    let keys = if config.keys.is_empty() {
        KeySet::new()
    } else {
        KeySet::load_all(&config.keys)?
    };
    let classifier = Arc::new(
        Classifier::new(config.classifier.clone(), keys).map_err(|e| Error::Invalid {
            origin: "classifier".into(),
            problems: vec![e.to_string()],
        })?,
    );
    let registry = RegistryHandle::default();
    let upstreams = Arc::new(Upstreams::new(
        config.health.clone(),
        config.upstreams.clone(),
        Arc::new(SystemResolver),
    ));
    let rules = config.rules()?;
    let mut pod_gate = PodGate::new(
        rules,
        classifier.clone(),
        registry.clone(),
        upstreams.clone(),
        config.on_invalid,
    )
    .with_body_lookahead(config.body_lookahead_bytes);
    let edge_polls = (config.edge_poll_hold_secs > 0).then(|| {
        Arc::new(EdgePolls::new(std::time::Duration::from_secs(
            config.edge_poll_hold_secs,
        )))
    });
    if let Some(e) = &edge_polls {
        pod_gate = pod_gate.with_edge_polls(e.clone());
    }
    if let Some(ts) = &config.topology_service {
        let router = crate::claims::PathRouter::new(ts.clone()).map_err(|e| Error::Invalid {
            origin: "topology_service".into(),
            problems: vec![e],
        })?;
        pod_gate = pod_gate.with_path_router(Arc::new(router));
    }

    let conf = ServerConf {
        threads: config.threads,
        work_stealing: config.work_stealing,
        grace_period_seconds: Some(config.grace_period_secs),
        // After the grace period, tasks still running are dropped; this only bounds
        // how long the runtimes may take to wind down.
        graceful_shutdown_timeout_seconds: Some(1),
        upgrade_sock: config.upgrade_sock.display().to_string(),
        ..ServerConf::default()
    };
    let opt = Opt {
        upgrade: run_options.upgrade,
        ..Opt::default()
    };
    // The running proxy's hand-over socket is connected to before pingora takes its
    // listeners over, and before this process's own takes the path.
    let handover_path = handover::path(&config.upgrade_sock);
    let predecessor = run_options
        .upgrade
        .then(|| handover::connect_predecessor(&handover_path))
        .flatten();
    let mut server = Server::new_with_opt_and_conf(opt, conf);
    server.bootstrap();
    let handover_listener = handover::listen(&handover_path)
        .inspect_err(|e| tracing::warn!(error = %e, "idle connections will not be handed over at an upgrade"))
        .ok();

    let registry_service = server.add_service(background_service(
        "registry",
        RegistryService {
            config: config.clone(),
            handle: registry.clone(),
        },
    ));
    let upstreams_service = server.add_service(background_service(
        "upstreams",
        UpstreamsService::new(upstreams.clone(), registry.clone()),
    ));
    upstreams_service.add_dependency(&registry_service);
    if let Some(e) = edge_polls {
        server
            .add_service(background_service(
                "edge polls",
                EdgePollsService::new(e, registry.clone()),
            ))
            .add_dependency(&registry_service);
    }
    for (pool, health) in upstreams.health_services() {
        server.add_service(background_service(&format!("{pool} health checks"), health));
    }

    let mut proxy = pingora::proxy::http_proxy(&server.configuration, pod_gate.clone());
    let head_timeout = std::time::Duration::from_millis(config.head_timeout_ms);
    proxy.server_options = Some(http_server_options(config.h2c, head_timeout));
    // Runner and job requests on the HTTP/1 fast path, the rest handed to
    // pingora-proxy on the same connection (`crate::fast`); with `fast_path = false`
    // every connection goes straight to pingora-proxy.
    // Per-connection read buffer: pingora's default is 64 KiB, held for as long as the
    // connection lives (a long poll: minutes); see `read_buffer_bytes`.
    let buffers = L4BufferSettings::new(config.read_buffer_bytes, DEFAULT_L4_WRITE_BUFFER_SIZE);
    let handover = Arc::new(Handover::default());
    let settings = FastPathSettings {
        enabled: config.fast_path,
        listener_buffers: buffers,
        handover: handover_listener.is_some().then(|| handover.clone()),
    };
    let fast = FastPath::new(pod_gate, proxy, &server.configuration, settings);
    let handover_service =
        HandoverService::new(handover, handover_listener, predecessor, fast.clone());
    let mut service = Service::new("podgate proxy".into(), fast);
    service.add_listener(ListenerConfig::tcp(config.listen.as_str()).l4_buffer(buffers));
    if let Some(tls) = &config.tls {
        let tls_error = |e: Box<pingora::Error>| Error::Invalid {
            origin: "tls".into(),
            problems: vec![format!("tls.cert/tls.key: {e}")],
        };
        let mut settings = TlsSettings::intermediate(
            &tls.cert.display().to_string(),
            &tls.key.display().to_string(),
        )
        .map_err(tls_error)?;
        settings.enable_h2();
        service.add_tls_with_settings(&tls.listen, None, settings);
    }
    let proxy_service = server.add_service(service);
    proxy_service.add_dependency(&registry_service);
    proxy_service.add_dependency(&upstreams_service);
    // A successor is told this process serves once its listener does.
    server
        .add_service(background_service("connection hand-over", handover_service))
        .add_dependency(&proxy_service);
    if config.admin_listen != "off" {
        let console = config.console.enabled.then(|| {
            let local = classifier.clone();
            let (console, handle) = podgate_console::Console::new(
                config.console.clone(),
                Box::new(move || crate::admin::render_metrics(&local)),
            );
            server.add_service(background_service("console scrapes", console));
            handle
        });
        let mut admin = Service::new(
            "podgate admin".into(),
            Admin::new(classifier, registry, console).checking_listener(&config.listen),
        );
        admin.add_tcp(&config.admin_listen);
        server.add_service(admin).add_dependency(&registry_service);
    }
    tracing::info!(
        listen = %config.listen,
        tls = config.tls.as_ref().map_or("off", |t| t.listen.as_str()),
        admin = %config.admin_listen,
        upgrade = run_options.upgrade,
        "podgate proxy serving"
    );
    server.run_forever()
}

/// pingora-proxy's options on the proxy listener: h2c as configured, and two
/// pingora patches of ours (`vendor/README.md`). A request head must be complete
/// within `head_timeout` of its first byte (a head trickled in one line at a
/// time would otherwise hold its connection forever), and HTTP/1 framing that
/// pingora would repair is refused as GitLab's NGINX refuses it
/// ([`crate::http1`]).
pub(crate) fn http_server_options(
    h2c: bool,
    head_timeout: std::time::Duration,
) -> HttpServerOptions {
    let mut options = HttpServerOptions::default();
    options.h2c = h2c;
    options.h1_header_deadline = Some(head_timeout);
    options.h1_strict_framing = true;
    options
}
