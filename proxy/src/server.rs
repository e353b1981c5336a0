//! Start the proxy: load keys, open the registry, build the pingora server, serve.

use std::sync::Arc;

use pingora::apps::HttpServerOptions;
use pingora::listeners::tls::TlsSettings;
use pingora::listeners::{DEFAULT_L4_WRITE_BUFFER_SIZE, L4BufferSettings, ListenerConfig};
use pingora::server::Server;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::services::listening::Service;
use podgate_registry::{MemoryBackend, Registry};
use podgate_tokens::{Classifier, KeySet};

use crate::admin::Admin;
use crate::config::{Error, ProxyConfig};
use crate::health::{self, Health};
use crate::rules;
use crate::service::PodGate;

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
pub fn run(config: ProxyConfig, options: RunOptions) -> Result<(), Error> {
    // The registry's background tasks (refresh, topology watch) get a small runtime
    // of their own; pingora runs its own per-thread runtimes for requests.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("podgate-registry")
        .enable_all()
        .build()
        .map_err(Error::Runtime)?;
    let registry = rt.block_on(async {
        match &config.topology {
            Some(t) => {
                Registry::with_memory(
                    MemoryBackend::new(t.to_topology(1)),
                    config.registry.clone(),
                )
                .await
            }
            None => Registry::connect(config.registry.clone()).await,
        }
    })?;
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
    let health = Arc::new(Health::default());
    if config.health.enabled {
        rt.spawn(health::run(
            health.clone(),
            registry.clone(),
            config.health.clone(),
        ));
    }
    let rules = config.rules.clone().unwrap_or_else(rules::builtin);
    let pod_gate = PodGate::new(
        rules,
        classifier.clone(),
        registry.clone(),
        config.on_invalid,
    )
    .with_health(health);

    let conf = ServerConf {
        threads: config.threads,
        grace_period_seconds: Some(config.grace_period_secs),
        // After the grace period, tasks still running are dropped; this only bounds
        // how long the runtimes may take to wind down.
        graceful_shutdown_timeout_seconds: Some(1),
        upgrade_sock: config.upgrade_sock.display().to_string(),
        ..ServerConf::default()
    };
    let opt = Opt {
        upgrade: options.upgrade,
        ..Opt::default()
    };
    let mut server = Server::new_with_opt_and_conf(opt, conf);
    server.bootstrap();
    let mut service = pingora::proxy::http_proxy_service(&server.configuration, pod_gate);
    if config.h2c
        && let Some(app) = service.app_logic_mut()
    {
        let mut options = HttpServerOptions::default();
        options.h2c = true;
        app.server_options = Some(options);
    }
    // Per-connection read buffer: pingora's default is 64 KiB, held for as long as the
    // connection lives (a long poll: minutes); see `read_buffer_bytes`.
    service.add_listener(ListenerConfig::tcp(config.listen.as_str()).l4_buffer(
        L4BufferSettings::new(config.read_buffer_bytes, DEFAULT_L4_WRITE_BUFFER_SIZE),
    ));
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
    server.add_service(service);
    if config.admin_listen != "off" {
        let mut admin = Service::new("podgate admin".into(), Admin::new(classifier, registry));
        admin.add_tcp(&config.admin_listen);
        server.add_service(admin);
    }
    tracing::info!(
        listen = %config.listen,
        tls = config.tls.as_ref().map_or("off", |t| t.listen.as_str()),
        admin = %config.admin_listen,
        upgrade = options.upgrade,
        "podgate proxy serving"
    );
    // `rt` lives as long as the process: run_forever never returns.
    let _registry_runtime = rt;
    server.run_forever()
}
