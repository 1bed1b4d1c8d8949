//! `GET /v1/cluster`: the nodes of the cluster, their roles, the controller, which brokers are
//! fenced and how far each node has applied the metadata; `/v1/reassignments`: partition
//! reassignments.

use axum::extract::State;
use axum::Json;

use weir_broker::cluster::reassignment::ReassignmentTarget;
use weir_broker::throttle;
use weir_broker::topic_config::{ConfigEdit, ConfigOp};
use weir_broker::ErrorKind;

use crate::api::{
    ClusterStatus, ReassignmentPlan, ReassignmentResult, ReassignmentResults, Reassignments, ReplicationThrottle,
};
use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::SharedState;

/// Answers within about a second even when nodes are down: they are listed as unreachable
/// (see `weir_broker::cluster::status`).
pub(crate) async fn info(State(state): State<SharedState>) -> Result<Json<ClusterStatus>, ApiError> {
    let core = state.core()?;
    Ok(Json(core.broker.cluster_status().await))
}

/// `GET /v1/reassignments`: the partition reassignments in progress.
pub(crate) async fn reassignments(State(state): State<SharedState>) -> Result<Json<Reassignments>, ApiError> {
    let core = state.core()?;
    Ok(Json(Reassignments { reassignments: core.broker.list_partition_reassignments(None) }))
}

/// `POST /v1/reassignments`: starts, replaces or cancels reassignments (Kafka's plan format).
/// 200 with one result per partition; a partition's error does not fail the others.
pub(crate) async fn reassign(
    State(state): State<SharedState>,
    JsonBody(plan): JsonBody<ReassignmentPlan>,
) -> Result<Json<ReassignmentResults>, ApiError> {
    let core = state.core()?;
    if plan.version != 1 {
        return Err(ApiError::new(
            ErrorKind::InvalidRequest,
            format!("reassignment plan version {} is not supported (1 is)", plan.version),
        ));
    }
    let targets = plan
        .partitions
        .into_iter()
        .map(|p| ReassignmentTarget { topic: p.topic, partition: p.partition, replicas: p.replicas })
        .collect();
    let results = core.broker.alter_partition_reassignments(targets, plan.allow_replication_factor_change).await?;
    Ok(Json(ReassignmentResults {
        results: results
            .into_iter()
            .map(|(topic, partition, outcome)| ReassignmentResult {
                topic,
                partition,
                error: outcome.err().map(|e| ApiError::from(e).detail()),
            })
            .collect(),
    }))
}

/// `GET /v1/replication-throttle`: the cluster-wide follower rate (both are set together here).
pub(crate) async fn throttle(State(state): State<SharedState>) -> Result<Json<ReplicationThrottle>, ApiError> {
    let core = state.core()?;
    let every = core.broker.dynamic_broker_configs("");
    let rate = every.get(throttle::FOLLOWER_RATE).or_else(|| every.get(throttle::LEADER_RATE));
    let bytes_per_second = rate.and_then(|v| v.parse::<u64>().ok()).filter(|r| *r < throttle::UNLIMITED);
    Ok(Json(ReplicationThrottle { bytes_per_second }))
}

/// `PUT /v1/replication-throttle`: sets (or, with `null`, removes) both cluster-wide rates.
pub(crate) async fn set_throttle(
    State(state): State<SharedState>,
    JsonBody(request): JsonBody<ReplicationThrottle>,
) -> Result<Json<ReplicationThrottle>, ApiError> {
    let core = state.core()?;
    let ops = [throttle::LEADER_RATE, throttle::FOLLOWER_RATE]
        .into_iter()
        .map(|name| match request.bytes_per_second {
            Some(rate) => ConfigOp::Set { name: name.to_string(), value: rate.to_string() },
            None => ConfigOp::Delete { name: name.to_string() },
        })
        .collect();
    core.broker.alter_broker_configs(String::new(), false, ConfigEdit::Apply(ops)).await?;
    Ok(Json(request))
}
