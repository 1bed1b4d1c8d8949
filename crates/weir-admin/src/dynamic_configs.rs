//! `GET|PATCH /v1/cluster/configs[?broker=ID]`: the dynamic broker configs, those that change
//! while the cluster runs (Kafka's IncrementalAlterConfigs on the BROKER resource, the same
//! metadata). Without `broker` it is the cluster-wide default (Kafka's resource `""`); with
//! it, that broker's own values, which win over the default. Which configs are dynamic and how
//! a change is checked is the controller's (`weir_broker::throttle`): the replication
//! throttles' rates and the `log.*` topic defaults, which every broker applies to its topics
//! when it applies the change (`Broker::topic_defaults`).

use axum::extract::State;
use axum::Json;
use weir_broker::throttle::{is_dynamic, DYNAMIC_BROKER_CONFIGS, UNLIMITED};
use weir_broker::topic_config::ConfigEdit;
use weir_broker::topic_config::TOPIC_DEFAULT_SETTINGS;
use weir_broker::{Broker, ErrorKind};

use crate::api::{AlterConfigs, ConfigEntry, Configs};
use crate::error::ApiError;
use crate::extract::{JsonBody, QueryParams};
use crate::topics::edit_of;
use crate::SharedState;

/// The metadata's resource name: `""` for every broker, else a registered broker's id.
fn resource(broker: &Broker, query: &QueryParams) -> Result<String, ApiError> {
    match query.parse::<i32>("broker", "a broker id")? {
        None => Ok(String::new()),
        Some(id) if broker.metadata().brokers.contains_key(&id) => Ok(id.to_string()),
        Some(id) => Err(ApiError::new(ErrorKind::InvalidRequest, format!("broker {id} is not registered"))),
    }
}

/// Every dynamic config of `resource` with the value in force and where it comes from:
/// `broker` (this broker's own), `cluster` (the cluster-wide default), `static` (the broker's
/// settings; topic defaults only) or `default`. The throttles' rates come first, then the topic
/// defaults by their broker names (`log.retention.ms`).
fn entries(broker: &Broker, resource: &str) -> Vec<ConfigEntry> {
    let own = if resource.is_empty() { Default::default() } else { broker.dynamic_broker_configs(resource) };
    let every = broker.dynamic_broker_configs("");
    let rates = DYNAMIC_BROKER_CONFIGS.iter().map(|name| (*name, UNLIMITED.to_string(), "default"));
    let topic_defaults = TOPIC_DEFAULT_SETTINGS.iter().filter(|(name, _, _)| is_dynamic(name)).map(
        |(name, topic, default)| match broker.config.topic_defaults.get(*topic) {
            Some(set) => (*name, set.clone(), "static"),
            None => (*name, default.to_string(), "default"),
        },
    );
    rates
        .chain(topic_defaults)
        .map(|(name, fallback, fallback_source)| {
            let (value, source) = match (own.get(name), every.get(name)) {
                (Some(v), _) => (v.clone(), "broker"),
                (_, Some(v)) => (v.clone(), "cluster"),
                _ => (fallback, fallback_source),
            };
            ConfigEntry { name: name.to_string(), value, source: source.to_string() }
        })
        .collect()
}

pub(crate) async fn get(State(state): State<SharedState>, query: QueryParams) -> Result<Json<Configs>, ApiError> {
    let core = state.core()?;
    let resource = resource(&core.broker, &query)?;
    Ok(Json(Configs { configs: entries(&core.broker, &resource) }))
}

/// Incremental, as IncrementalAlterConfigs: `set` adds or replaces, `delete` falls back to the
/// cluster default (or, for the default, Kafka's). Answers the configs in force afterwards.
pub(crate) async fn alter(
    State(state): State<SharedState>,
    query: QueryParams,
    JsonBody(request): JsonBody<AlterConfigs>,
) -> Result<Json<Configs>, ApiError> {
    let core = state.core()?;
    let resource = resource(&core.broker, &query)?;
    let edit: ConfigEdit = edit_of(&request)?;
    core.broker.alter_broker_configs(resource.clone(), request.validate_only, edit).await?;
    Ok(Json(Configs { configs: entries(&core.broker, &resource) }))
}
