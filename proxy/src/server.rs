//! Start the proxy: load keys, open the registry, build the pingora server, serve.

use std::sync::Arc;

use pingora::server::Server;
use pingora::server::configuration::{Opt, ServerConf};
use podgate_registry::{MemoryBackend, Registry};
use podgate_tokens::{Classifier, KeySet};

use crate::config::{Error, ProxyConfig};
use crate::rules;
use crate::service::PodGate;

/// Build everything and serve until SIGTERM/SIGINT (pingora then drains for the
/// grace period and exits the process). Returns only on a start-up error.
pub fn run(config: ProxyConfig) -> Result<(), Error> {
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
    let rules = config.rules.clone().unwrap_or_else(rules::builtin);
    let pod_gate = PodGate::new(rules, classifier, registry, config.on_invalid);

    let conf = ServerConf {
        threads: config.threads,
        grace_period_seconds: Some(config.grace_period_secs),
        graceful_shutdown_timeout_seconds: Some(config.grace_period_secs.max(1)),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(Opt::default(), conf);
    server.bootstrap();
    let mut service = pingora::proxy::http_proxy_service(&server.configuration, pod_gate);
    service.add_tcp(&config.listen);
    server.add_service(service);
    tracing::info!(listen = %config.listen, "podgate proxy serving");
    // `rt` lives as long as the process: run_forever never returns.
    let _registry_runtime = rt;
    server.run_forever()
}
