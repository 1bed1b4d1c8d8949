//! `weir server`: load the settings, open the data directory, serve the Kafka protocol until
//! SIGTERM/SIGINT, then shut down cleanly.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use weir_broker::config::{SETTINGS, TOPIC_DEFAULT_SETTINGS};
use weir_broker::group::GroupCoordinator;
use weir_broker::{Broker, BrokerConfig};
use weir_kafka::Ctx;

use crate::cli::ServerArgs;

/// Environment variables that are flags of their own, not settings.
const RESERVED_ENV: &[&str] = &["WEIR_CONFIG", "WEIR_LISTEN", "WEIR_DATA_DIR"];

/// Settings in priority order: file, environment, command line.
pub fn load_config(args: &ServerArgs) -> anyhow::Result<BrokerConfig> {
    let mut settings = BTreeMap::new();
    if let Some(path) = &args.config {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("cannot read config file {}", path.display()))?;
        settings.extend(BrokerConfig::settings_from_toml(&text, &path.display().to_string())?);
    }
    let known: Vec<&str> =
        SETTINGS.iter().map(|s| s.name).chain(TOPIC_DEFAULT_SETTINGS.iter().map(|(n, _, _)| *n)).collect();
    for (key, value) in std::env::vars() {
        let Some(rest) = key.strip_prefix("WEIR_") else { continue };
        if RESERVED_ENV.contains(&key.as_str()) {
            continue;
        }
        // WEIR_LOG_RETENTION_MS → log.retention.ms; other WEIR_* variables are not settings.
        let name = rest.to_ascii_lowercase().replace('_', ".");
        if let Some(setting) = known.iter().find(|k| **k == name) {
            settings.insert(setting.to_string(), value);
        }
    }
    if let Some(listen) = &args.listen {
        settings.insert("listeners".into(), listen.clone());
    }
    if let Some(dir) = &args.data_dir {
        settings.insert("log.dirs".into(), dir.display().to_string());
    }
    for (name, value) in &args.settings {
        settings.insert(name.clone(), value.clone());
    }
    Ok(BrokerConfig::from_settings(&settings)?)
}

pub fn run(args: &ServerArgs) -> anyhow::Result<()> {
    let mut config = load_config(args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("weir").build()?;
    runtime.block_on(async move {
        // Bind first: a busy port fails fast, before any recovery work.
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {} (the `listeners` setting)", config.listen))?;
        let bound = listener.local_addr()?;
        if config.advertised_port == 0 {
            config.advertised_port = bound.port();
        }
        let data_dir = config.data_dir.clone();
        let broker = tokio::task::spawn_blocking(move || Broker::open(config))
            .await?
            .map_err(|e| anyhow::anyhow!("cannot open the data directory {}: {}", data_dir.display(), e.message))?;
        let groups = {
            let broker = broker.clone();
            tokio::task::spawn_blocking(move || GroupCoordinator::start(broker))
                .await?
                .map_err(|e| anyhow::anyhow!("cannot load consumer groups: {}", e.message))?
        };
        let shown_dir = std::fs::canonicalize(&data_dir).unwrap_or(data_dir);
        println!("weir {} listening on {bound} (Kafka protocol), data in {}", env!("CARGO_PKG_VERSION"), shown_dir.display());
        tracing::info!(listen = %bound, data_dir = %shown_dir.display(), cluster_id = %broker.cluster_id(), "broker started");
        let ctx = Arc::new(Ctx { broker: broker.clone(), groups: groups.clone() });
        weir_kafka::serve(listener, ctx, shutdown_signal(), Broker::SHUTDOWN_GRACE).await;
        groups.shutdown();
        let closing = broker.clone();
        tokio::task::spawn_blocking(move || closing.shutdown()).await?.map_err(|e| anyhow::anyhow!("{}", e.message))?;
        tracing::info!("shut down cleanly");
        Ok::<(), anyhow::Error>(())
    })?;
    Ok(())
}

/// Completes on SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        tracing::error!("cannot install signal handlers; stop the broker with SIGKILL");
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
}
