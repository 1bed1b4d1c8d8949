//! `GET /v1/cluster`: the nodes of the cluster, their roles, the controller, which brokers are
//! fenced and how far each node has applied the metadata.

use axum::extract::State;
use axum::Json;

use crate::api::ClusterStatus;
use crate::error::ApiError;
use crate::SharedState;

/// Answers within about a second even when nodes are down: they are listed as unreachable
/// (see `weir_broker::cluster::status`).
pub async fn info(State(state): State<SharedState>) -> Result<Json<ClusterStatus>, ApiError> {
    let core = state.core()?;
    Ok(Json(core.broker.cluster_status().await))
}
