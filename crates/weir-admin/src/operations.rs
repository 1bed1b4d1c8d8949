//! The everyday operator tasks (`rpk`'s and `kafka-*.sh`'s): the cluster's health, leader
//! elections, trimming partitions (DeleteRecords), offsets by time, generating reassignment
//! plans and decommissioning a broker. Every node answers for the whole cluster: the metadata is the
//! same everywhere, what only a leader knows (its followers' lag, where to trim) is asked of
//! it (`forward`), and changes go to the active controller through `Broker`.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::Json;
use weir_broker::cluster::election::ElectionType;
use weir_broker::cluster::reassignment::ReassignmentTarget;
use weir_broker::cluster::reassignment_plan::{self, PlanGoal, PlannedMove};
use weir_broker::metadata::{MetadataState, NO_LEADER};
use weir_broker::topic_config;
use weir_broker::{Broker, ErrorKind};

use crate::api::{
    ClusterHealth, Decommission, DeleteRecords, DeletedRecords, DeletedRecordsResult, DrainingBroker, ElectLeaders,
    ElectionResult, ElectionResults, GeneratePlan, GeneratedPlan, OffsetsAtTime, PartitionHealth, PartitionOffset,
    PlannedPartition, ReassignmentPlan, ReassignmentResult, UnregisteredBroker,
};
use crate::error::ApiError;
use crate::extract::{JsonBody, PathParams, QueryParams};
use crate::forward::{self, TrimPoint};
use crate::topics::require_topic;
use crate::SharedState;

/// `GET /v1/cluster/health`.
pub(crate) async fn health(State(state): State<SharedState>) -> Result<Json<ClusterHealth>, ApiError> {
    let core = state.core()?;
    let broker = &core.broker;
    let metadata = broker.metadata();
    let (lagging_followers, unanswered_brokers) = forward::lagging_followers(broker).await;
    let mut health = partition_health(broker, &metadata);
    health.fenced_brokers = metadata.brokers.values().filter(|b| b.fenced).map(|b| b.id).collect();
    health.lagging_followers = lagging_followers;
    health.unanswered_brokers = unanswered_brokers;
    health.healthy = health.fenced_brokers.is_empty()
        && health.unanswered_brokers.is_empty()
        && health.leaderless.is_empty()
        && health.under_replicated.is_empty()
        && health.under_min_isr.is_empty()
        && health.lagging_followers.is_empty();
    Ok(Json(health))
}

/// What the metadata alone says: the partitions without a leader, under-replicated or under
/// their `min.insync.replicas`, and the brokers replicas are moving off.
fn partition_health(broker: &Broker, metadata: &MetadataState) -> ClusterHealth {
    let mut health = ClusterHealth {
        healthy: false,
        fenced_brokers: Vec::new(),
        unanswered_brokers: Vec::new(),
        leaderless: Vec::new(),
        under_replicated: Vec::new(),
        under_min_isr: Vec::new(),
        lagging_followers: Vec::new(),
        draining_brokers: Vec::new(),
    };
    let mut draining: BTreeMap<i32, DrainingBroker> = BTreeMap::new();
    let defaults = broker.topic_defaults();
    for topic in metadata.topics.values() {
        let min_isr = topic_config::min_insync_replicas(&defaults, &topic.configs);
        for (index, p) in topic.assignments.iter().enumerate() {
            if p.replicas.is_empty() {
                continue;
            }
            let entry = || PartitionHealth {
                topic: topic.name.clone(),
                partition: i32::try_from(index).unwrap_or(i32::MAX),
                leader: p.leader,
                replicas: p.replicas.clone(),
                isr: p.isr.clone(),
                min_insync_replicas: min_isr,
            };
            if p.leader == NO_LEADER {
                health.leaderless.push(entry());
            }
            if p.isr.len() < p.replicas.len() {
                health.under_replicated.push(entry());
            }
            if (p.isr.len() as i64) < min_isr {
                health.under_min_isr.push(entry());
            }
            for removing in &p.removing_replicas {
                draining
                    .entry(*removing)
                    .or_insert(DrainingBroker { broker: *removing, replicas: 0, moving_off: 0 })
                    .moving_off += 1;
            }
        }
    }
    for (id, entry) in draining.iter_mut() {
        entry.replicas =
            metadata.topics.values().flat_map(|t| &t.assignments).filter(|p| p.replicas.contains(id)).count();
    }
    health.draining_brokers = draining.into_values().collect();
    health
}

/// `POST /v1/elections`.
pub(crate) async fn elect(
    State(state): State<SharedState>,
    JsonBody(request): JsonBody<ElectLeaders>,
) -> Result<Json<ElectionResults>, ApiError> {
    let core = state.core()?;
    let broker = &core.broker;
    let kind = match request.election.as_str() {
        "preferred" => ElectionType::Preferred,
        "unclean" => ElectionType::Unclean,
        other => return Err(ApiError::invalid(format!("election type {other:?}: expected preferred or unclean"))),
    };
    let partitions = match request.partitions {
        None => None,
        Some(selectors) => {
            let mut list = Vec::new();
            for selector in selectors {
                let topic = require_topic(broker, &selector.topic)?;
                match selector.partition {
                    Some(index) if index < 0 || index >= topic.partitions => {
                        return Err(ApiError::unknown_partition(&topic.name, index))
                    }
                    Some(index) => list.push((topic.name.clone(), index)),
                    None => list.extend((0..topic.partitions).map(|i| (topic.name.clone(), i))),
                }
            }
            Some(list)
        }
    };
    let results = broker.elect_leaders(kind, partitions).await?;
    Ok(Json(ElectionResults {
        results: results
            .into_iter()
            .map(|(topic, partition, outcome)| match outcome {
                Ok(leader) => ElectionResult { topic, partition, leader: Some(leader), error: None },
                Err(e) => ElectionResult { topic, partition, leader: None, error: Some(ApiError::from(e).detail()) },
            })
            .collect(),
    }))
}

/// `POST /v1/topics/{topic}/delete-records`: each partition is trimmed at its leader; one
/// partition's failure does not stop the others.
pub(crate) async fn delete_records(
    State(state): State<SharedState>,
    PathParams(name): PathParams<String>,
    JsonBody(request): JsonBody<DeleteRecords>,
) -> Result<Json<DeletedRecords>, ApiError> {
    let core = state.core()?;
    let broker = &core.broker;
    let topic = require_topic(broker, &name)?;
    let point = match (request.offset, request.before_ms) {
        (Some(offset), None) if offset >= -1 => TrimPoint::Offset(offset),
        (Some(offset), None) => {
            return Err(ApiError::invalid(format!("offset {offset}: expected an offset, or -1 for the high watermark")))
        }
        (None, Some(before_ms)) => TrimPoint::Before(before_ms),
        _ => return Err(ApiError::invalid("give exactly one of `offset` and `before_ms`")),
    };
    let partitions = request.partitions.unwrap_or_else(|| (0..topic.partitions).collect());
    let mut results = Vec::with_capacity(partitions.len());
    for index in partitions {
        let outcome = if index < 0 || index >= topic.partitions {
            Err(ApiError::unknown_partition(&topic.name, index))
        } else {
            forward::delete_records(broker, &topic.name, index, point).await
        };
        results.push(match outcome {
            Ok(low) => DeletedRecordsResult { partition: index, low_watermark: Some(low), error: None },
            Err(e) => DeletedRecordsResult { partition: index, low_watermark: None, error: Some(e.detail()) },
        });
    }
    Ok(Json(DeletedRecords { topic: topic.name, results }))
}

/// `GET /v1/topics/{topic}/offsets?timestamp=MS`: where each partition reaches that time,
/// asked of its leader (what `weir consume --from-time` starts at).
pub(crate) async fn offsets_at_time(
    State(state): State<SharedState>,
    PathParams(name): PathParams<String>,
    query: QueryParams,
) -> Result<Json<OffsetsAtTime>, ApiError> {
    let core = state.core()?;
    let broker = &core.broker;
    let topic = require_topic(broker, &name)?;
    let Some(timestamp) = query.parse::<i64>("timestamp", "milliseconds since the epoch")? else {
        return Err(ApiError::invalid("give ?timestamp=MS"));
    };
    let mut offsets = Vec::with_capacity(usize::try_from(topic.partitions).unwrap_or(0));
    for partition in 0..topic.partitions {
        let offset = forward::offset_at(broker, &topic.name, partition, timestamp).await?;
        offsets.push(PartitionOffset { partition, offset });
    }
    Ok(Json(OffsetsAtTime { topic: topic.name, timestamp, offsets }))
}

/// `POST /v1/reassignments/generate`: a plan, not executed.
pub(crate) async fn generate_plan(
    State(state): State<SharedState>,
    JsonBody(request): JsonBody<GeneratePlan>,
) -> Result<Json<GeneratedPlan>, ApiError> {
    let core = state.core()?;
    let goal = match (request.remove_brokers.is_empty(), request.balance) {
        (false, false) => PlanGoal::RemoveBrokers(request.remove_brokers),
        (true, true) => PlanGoal::Balance,
        _ => return Err(ApiError::invalid("give either `remove_brokers` or `balance: true`")),
    };
    Ok(Json(generated(&core.broker.metadata(), &goal, request.topics.as_deref())?))
}

fn generated(metadata: &MetadataState, goal: &PlanGoal, topics: Option<&[String]>) -> Result<GeneratedPlan, ApiError> {
    let moves = reassignment_plan::plan(metadata, goal, topics)?;
    let plan_of = |replicas: fn(&PlannedMove) -> &Vec<i32>| ReassignmentPlan {
        version: 1,
        partitions: moves
            .iter()
            .map(|m| PlannedPartition {
                topic: m.topic.clone(),
                partition: m.partition,
                replicas: Some(replicas(m).clone()),
                log_dirs: None,
            })
            .collect(),
        allow_replication_factor_change: false,
    };
    Ok(GeneratedPlan { current: plan_of(|m| &m.current), proposed: plan_of(|m| &m.proposed) })
}

/// `DELETE /v1/brokers/{id}`: unregisters a broker that was decommissioned and stopped
/// (Kafka's UnregisterBroker): it leaves `GET /v1/cluster` and the health report. Refused (400)
/// while it runs or holds a replica; 404 when no broker has the id.
pub(crate) async fn unregister(
    State(state): State<SharedState>,
    PathParams(id): PathParams<i32>,
) -> Result<Json<UnregisteredBroker>, ApiError> {
    let core = state.core()?;
    core.broker.unregister_broker(id).await?;
    Ok(Json(UnregisteredBroker { broker: id }))
}

/// `POST /v1/brokers/{id}/decommission`: plans the moves of every replica off the broker and
/// starts them (throttled by the replication throttle in force). Once they complete, the
/// broker holds nothing and `GET /v1/cluster/health` no longer lists it as draining; it can
/// then be stopped. Asking again after a partial failure plans what is left.
pub(crate) async fn decommission(
    State(state): State<SharedState>,
    PathParams(id): PathParams<i32>,
) -> Result<Json<Decommission>, ApiError> {
    let core = state.core()?;
    let broker = &core.broker;
    if !broker.metadata().brokers.contains_key(&id) {
        return Err(ApiError::new(ErrorKind::InvalidRequest, format!("broker {id} is not registered")));
    }
    let plan = generated(&broker.metadata(), &PlanGoal::RemoveBrokers(vec![id]), None)?;
    let targets = plan
        .proposed
        .partitions
        .iter()
        .map(|p| ReassignmentTarget { topic: p.topic.clone(), partition: p.partition, replicas: p.replicas.clone() })
        .collect();
    let results = broker.alter_partition_reassignments(targets, false).await?;
    let results = results
        .into_iter()
        .map(|(topic, partition, outcome)| ReassignmentResult {
            topic,
            partition,
            error: outcome.err().map(|e| ApiError::from(e).detail()),
        })
        .collect();
    tracing::info!(broker = id, partitions = plan.proposed.partitions.len(), "decommissioning a broker");
    Ok(Json(Decommission { broker: id, plan, results }))
}
