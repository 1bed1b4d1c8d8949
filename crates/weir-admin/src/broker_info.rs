//! `GET /v1/broker` and `GET /v1/broker/configs`.

use axum::extract::State;
use axum::Json;

use crate::api::{BrokerInfo, ConfigEntry, Configs, Listeners};
use crate::error::ApiError;
use crate::SharedState;

pub(crate) async fn info(State(state): State<SharedState>) -> Result<Json<BrokerInfo>, ApiError> {
    let core = state.core()?;
    let broker = &core.broker;
    let config = &broker.config;
    let metadata = broker.metadata();
    let data_dir = std::fs::canonicalize(&config.data_dir).unwrap_or_else(|_| config.data_dir.clone());
    Ok(Json(BrokerInfo {
        node_id: config.node_id,
        cluster_id: metadata.cluster_id.clone(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        listeners: Listeners {
            kafka: state.kafka_listener.map(|a| a.to_string()).unwrap_or_default(),
            kafka_advertised: format!("{}:{}", config.advertised_host, config.advertised_port),
            admin: state.admin_listener.map(|a| a.to_string()).unwrap_or_default(),
        },
        data_dir: data_dir.display().to_string(),
        uptime_ms: u64::try_from(state.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        topics: metadata.topics.len(),
        partitions: metadata.topics.values().map(|t| u64::try_from(t.partitions).unwrap_or(0)).sum(),
    }))
}

/// Every broker setting with its value; `static` when set explicitly, else `default`.
pub(crate) async fn configs(State(state): State<SharedState>) -> Result<Json<Configs>, ApiError> {
    let core = state.core()?;
    let configs = core
        .broker
        .config
        .describe()
        .into_iter()
        .map(|(name, value, explicit)| ConfigEntry {
            name,
            value,
            source: if explicit { "static" } else { "default" }.to_string(),
        })
        .collect();
    Ok(Json(Configs { configs }))
}
