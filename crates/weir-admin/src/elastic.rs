//! Elastic topics (`docs/elastic.md`): their layout as `GET /v1/topics/{topic}` shows it, and
//! splitting and merging physical partitions.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::Json;
use weir_broker::elastic::ElasticOutcome;
use weir_broker::metadata::elastic::{ElasticLayout, PhysicalState};
use weir_broker::metadata::TopicMetadata;
use weir_broker::{Broker, ErrorKind};

use crate::api::{
    ElasticChanged, ElasticDescription, MergePhysical, PartitionInfo, PhysicalPartitionInfo, SplitPhysical,
};
use crate::error::ApiError;
use crate::extract::{JsonBody, PathParams};
use crate::SharedState;

/// How long a split or merge waits for its moves when the request does not say.
const DEFAULT_WAIT: Duration = Duration::from_secs(60);

/// `topic`'s layout, with each physical partition's placement and traffic summed from its
/// stable partitions' `partitions` (as their leaders reported them).
pub(crate) fn describe(
    topic: &TopicMetadata,
    layout: &ElasticLayout,
    partitions: &[PartitionInfo],
) -> ElasticDescription {
    let mut physical: Vec<PhysicalPartitionInfo> = layout
        .physical
        .iter()
        .map(|p| {
            let (logical_first, logical_last) = layout.logical_range(p.stable_range());
            let infos: Vec<&PartitionInfo> =
                partitions.iter().filter(|i| p.stable_range().contains(&i.partition)).collect();
            let mut leaders: Vec<i32> = infos.iter().map(|i| i.leader).collect();
            leaders.sort_unstable();
            leaders.dedup();
            let active = p.state == PhysicalState::Active;
            let moving =
                p.stable_range().filter(|s| topic.partition(*s).is_some_and(|state| state.is_reassigning())).collect();
            PhysicalPartitionInfo {
                id: p.id,
                state: p.state.name().to_string(),
                stable_first: p.first,
                stable_last: p.end - 1,
                logical_first,
                logical_last,
                parents: p.parents.clone(),
                children: p.children.clone(),
                replicas: topic.partition(p.first).map(|s| s.target_replicas()).unwrap_or_default(),
                leader: if active && leaders.len() == 1 { leaders[0] } else { -1 },
                leaders: if active { leaders.into_iter().filter(|l| *l >= 0).collect() } else { Vec::new() },
                moving: if p.state == PhysicalState::Retired { Vec::new() } else { moving },
                bytes_in_per_sec: if active { infos.iter().map(|i| i.bytes_in_per_sec).sum() } else { 0.0 },
                bytes_out_per_sec: if active { infos.iter().map(|i| i.bytes_out_per_sec).sum() } else { 0.0 },
                size_bytes: if active { infos.iter().map(|i| i.size_bytes).sum() } else { 0 },
            }
        })
        .collect();
    physical.sort_by_key(|p| (p.state != "active", p.stable_first, p.id));
    ElasticDescription {
        logical_partitions: weir_broker::metadata::elastic::LOGICAL_PARTITIONS,
        stable_partitions: layout.stable_partitions,
        physical,
    }
}

async fn answer(broker: &Arc<Broker>, topic: &str, outcome: ElasticOutcome) -> Result<Json<ElasticChanged>, ApiError> {
    let meta = crate::topics::require_topic(broker, topic)?;
    let layout =
        meta.elastic.clone().ok_or_else(|| ApiError::new(ErrorKind::InvalidRequest, "the topic is not elastic"))?;
    let partitions = crate::forward::partition_infos(broker, topic).await;
    Ok(Json(ElasticChanged {
        topic: topic.to_string(),
        created: outcome.change.created,
        replaced: outcome.change.replaced,
        moving: outcome.change.moving,
        new_leaders: outcome.change.new_leaders,
        in_force: outcome.in_force,
        elastic: describe(&meta, &layout, &partitions),
    }))
}

pub(crate) async fn split(
    State(state): State<SharedState>,
    PathParams(topic): PathParams<String>,
    JsonBody(request): JsonBody<SplitPhysical>,
) -> Result<Json<ElasticChanged>, ApiError> {
    let core = state.core()?;
    let wait = request.wait_ms.map_or(DEFAULT_WAIT, Duration::from_millis);
    let outcome = core.broker.split_physical(&topic, request.partition, wait).await?;
    answer(&core.broker, &topic, outcome).await
}

pub(crate) async fn merge(
    State(state): State<SharedState>,
    PathParams(topic): PathParams<String>,
    JsonBody(request): JsonBody<MergePhysical>,
) -> Result<Json<ElasticChanged>, ApiError> {
    let core = state.core()?;
    let wait = request.wait_ms.map_or(DEFAULT_WAIT, Duration::from_millis);
    let [a, b] = request.partitions;
    let outcome = core.broker.merge_physical(&topic, (a, b), wait).await?;
    answer(&core.broker, &topic, outcome).await
}

/// `GET /v1/cluster/balance`.
pub(crate) async fn balance(State(state): State<SharedState>) -> Result<Json<crate::api::BalanceReport>, ApiError> {
    let core = state.core()?;
    Ok(Json(core.broker.describe_balance().await?))
}
