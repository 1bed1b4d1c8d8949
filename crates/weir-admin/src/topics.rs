//! Topics: list, describe, create, delete, configs, partitions.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use weir_broker::metadata::TopicMetadata;
use weir_broker::topic_config::{self, ConfigEdit, ConfigOp, ConfigSource};
use weir_broker::{Broker, BrokerError, ErrorKind, NewTopic};

use crate::api::{
    AlterConfigs, ConfigEntry, Configs, CreatePartitions, CreateTopic, CreatedTopic, DeletedTopic, PartitionCount,
    PartitionInfo, TopicDescription, TopicList, TopicSummary,
};
use crate::error::ApiError;
use crate::extract::{JsonBody, PathParams};
use crate::SharedState;

pub(crate) fn source_name(source: ConfigSource) -> &'static str {
    match source {
        ConfigSource::Topic => "topic",
        ConfigSource::BrokerDefault => "broker",
        ConfigSource::Default => "default",
    }
}

fn config_entries(broker: &Broker, overrides: &BTreeMap<String, String>) -> Vec<ConfigEntry> {
    topic_config::describe(&broker.topic_defaults(), overrides)
        .into_iter()
        .map(|e| ConfigEntry { name: e.name, value: e.value, source: source_name(e.source).to_string() })
        .collect()
}

/// The topic's metadata, or 404 naming it.
pub(crate) fn require_topic(broker: &Broker, name: &str) -> Result<TopicMetadata, ApiError> {
    broker.metadata().topic(name).cloned().ok_or_else(|| ApiError::unknown_topic(name))
}

/// A broker error about `topic`, with "does not exist" phrased the same everywhere.
fn topic_error(topic: &str, e: BrokerError) -> ApiError {
    if e.kind == ErrorKind::UnknownTopicOrPartition {
        ApiError::unknown_topic(topic)
    } else {
        e.into()
    }
}

pub(crate) async fn list(State(state): State<SharedState>) -> Result<Json<TopicList>, ApiError> {
    let core = state.core()?;
    let topics = core
        .broker
        .metadata()
        .topics
        .values()
        .map(|t| TopicSummary {
            name: t.name.clone(),
            id: t.id.to_string(),
            partitions: t.partitions,
            internal: t.internal,
        })
        .collect();
    Ok(Json(TopicList { topics }))
}

pub(crate) async fn describe(
    State(state): State<SharedState>,
    PathParams(name): PathParams<String>,
) -> Result<Json<TopicDescription>, ApiError> {
    let core = state.core()?;
    let topic = require_topic(&core.broker, &name)?;
    Ok(Json(describe_topic(&core.broker, &topic).await))
}

/// A topic and every partition, asking the brokers that lead them (see `forward`).
async fn describe_topic(broker: &std::sync::Arc<Broker>, topic: &TopicMetadata) -> TopicDescription {
    let partitions = crate::forward::partition_infos(broker, &topic.name).await;
    let elastic = topic.elastic.as_ref().map(|layout| crate::elastic::describe(topic, layout, &partitions));
    TopicDescription {
        elastic,
        name: topic.name.clone(),
        id: topic.id.to_string(),
        internal: topic.internal,
        replication_factor: topic.replication_factor(),
        size_bytes: partitions.iter().map(|p| p.size_bytes).sum(),
        partitions,
        configs: config_entries(broker, &topic.configs),
    }
}

pub(crate) async fn create(
    State(state): State<SharedState>,
    JsonBody(request): JsonBody<CreateTopic>,
) -> Result<(StatusCode, Json<CreatedTopic>), ApiError> {
    let core = state.core()?;
    let broker = &core.broker;
    let new = NewTopic {
        name: request.name.clone(),
        partitions: request.partitions.unwrap_or(-1),
        replication_factor: request.replication_factor.unwrap_or(-1),
        assignments: Vec::new(),
        configs: request.configs,
    };
    let outcome = if request.elastic {
        Some(broker.create_elastic_topic(new, request.stable_partitions, request.validate_only).await)
    } else if request.stable_partitions.is_some() {
        return Err(ApiError::new(
            ErrorKind::InvalidRequest,
            "stable_partitions is for an elastic topic (\"elastic\": true)",
        ));
    } else {
        broker.create_topics(vec![new], request.validate_only).await.pop()
    };
    let created = match outcome {
        Some(Ok(created)) => created,
        Some(Err(e)) if e.kind == ErrorKind::TopicExists => {
            return Err(ApiError::new(e.kind, format!("topic '{}' already exists", request.name)))
        }
        Some(Err(e)) => return Err(e.into()),
        None => return Err(ApiError::internal("the broker returned no result")),
    };
    let status = if request.validate_only { StatusCode::OK } else { StatusCode::CREATED };
    Ok((
        status,
        Json(CreatedTopic {
            name: created.topic.name.clone(),
            id: created.topic.id.to_string(),
            partitions: created.topic.partitions,
            replication_factor: created.replication_factor,
            configs: config_entries(broker, &created.topic.configs),
            validate_only: request.validate_only,
            physical_partitions: created.topic.elastic.as_ref().map(|layout| layout.active().len() as i32),
        }),
    ))
}

pub(crate) async fn delete(
    State(state): State<SharedState>,
    PathParams(name): PathParams<String>,
) -> Result<Json<DeletedTopic>, ApiError> {
    let core = state.core()?;
    let deleted = core.broker.delete_topic(Some(name.clone()), None).await.map_err(|e| topic_error(&name, e))?;
    Ok(Json(DeletedTopic { name: deleted.name, id: deleted.id.to_string() }))
}

pub(crate) async fn configs(
    State(state): State<SharedState>,
    PathParams(name): PathParams<String>,
) -> Result<Json<Configs>, ApiError> {
    let core = state.core()?;
    let topic = require_topic(&core.broker, &name)?;
    Ok(Json(Configs { configs: config_entries(&core.broker, &topic.configs) }))
}

/// The edit a PATCH of configs asks for: its deletes, then its sets. Refuses an empty one and a
/// name both set and deleted.
pub(crate) fn edit_of(request: &AlterConfigs) -> Result<ConfigEdit, ApiError> {
    if request.set.is_empty() && request.delete.is_empty() {
        return Err(ApiError::invalid("nothing to change: give configs to `set` or `delete`"));
    }
    if let Some(both) = request.delete.iter().find(|c| request.set.contains_key(*c)) {
        return Err(ApiError::invalid(format!("config '{both}' is both set and deleted")));
    }
    let ops = request
        .delete
        .iter()
        .map(|name| ConfigOp::Delete { name: name.clone() })
        .chain(request.set.iter().map(|(name, value)| ConfigOp::Set { name: name.clone(), value: value.clone() }))
        .collect();
    Ok(ConfigEdit::Apply(ops))
}

/// Incremental: `set` adds or replaces overrides, `delete` removes them; the other overrides
/// stay. Answers the configs in force afterwards (with `validate_only`, as they would be).
pub(crate) async fn alter_configs(
    State(state): State<SharedState>,
    PathParams(name): PathParams<String>,
    JsonBody(request): JsonBody<AlterConfigs>,
) -> Result<Json<Configs>, ApiError> {
    let core = state.core()?;
    let broker = &core.broker;
    require_topic(broker, &name)?;
    for config in request.set.keys().chain(&request.delete) {
        if !topic_config::is_known(config) {
            return Err(ApiError::new(ErrorKind::InvalidConfig, topic_config::unknown_config(config).message));
        }
    }
    let edit = edit_of(&request)?;
    broker.alter_topic_configs(name.clone(), request.validate_only, edit).await.map_err(|e| topic_error(&name, e))?;
    let topic = require_topic(broker, &name)?;
    let mut overrides = topic.configs.clone();
    if request.validate_only {
        for name in &request.delete {
            overrides.remove(name);
        }
        overrides.extend(request.set);
    }
    Ok(Json(Configs { configs: config_entries(broker, &overrides) }))
}

pub(crate) async fn partitions(
    State(state): State<SharedState>,
    PathParams(name): PathParams<String>,
) -> Result<Json<Vec<PartitionInfo>>, ApiError> {
    let core = state.core()?;
    let topic = require_topic(&core.broker, &name)?;
    Ok(Json(crate::forward::partition_infos(&core.broker, &topic.name).await))
}

pub(crate) async fn create_partitions(
    State(state): State<SharedState>,
    PathParams(name): PathParams<String>,
    JsonBody(request): JsonBody<CreatePartitions>,
) -> Result<Json<PartitionCount>, ApiError> {
    let core = state.core()?;
    core.broker
        .create_partitions(name.clone(), request.count, None, request.validate_only)
        .await
        .map_err(|e| topic_error(&name, e))?;
    Ok(Json(PartitionCount { name, partitions: request.count, validate_only: request.validate_only }))
}
