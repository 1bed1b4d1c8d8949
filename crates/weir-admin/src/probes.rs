//! `/health` (liveness), `/ready` (readiness) and `/metrics` (Prometheus).

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::api::Status;
use crate::error::ApiError;
use crate::SharedState;

/// The Prometheus text exposition format's content type.
const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// 200 while the process serves HTTP at all, recovering or not.
pub(crate) async fn health() -> Json<Status> {
    Json(Status { status: "ok".into() })
}

/// 200 once the broker has recovered and serves; 503 while it starts or shuts down.
pub(crate) async fn ready(State(state): State<SharedState>) -> Response {
    let (status, text) = match state.core.get() {
        None => (StatusCode::SERVICE_UNAVAILABLE, "starting"),
        Some(core) if core.broker.is_shutting_down() => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
        Some(_) => (StatusCode::OK, "ready"),
    };
    (status, Json(Status { status: text.into() })).into_response()
}

pub(crate) async fn metrics(State(state): State<SharedState>) -> Result<Response, ApiError> {
    let core = state.core()?;
    let (broker, groups, messaging) = (core.broker.clone(), core.groups.clone(), core.messaging.clone());
    // Rendering may read log sizes and offsets: off the async workers. The layers above the
    // data path add their families in this order: groups, then messaging.
    let text =
        tokio::task::spawn_blocking(move || weir_broker::metrics::render_prometheus(&broker, &[&*groups, &*messaging]))
            .await
            .map_err(|e| ApiError::internal(format!("rendering metrics failed: {e}")))?;
    Ok(([(header::CONTENT_TYPE, PROMETHEUS_CONTENT_TYPE)], text).into_response())
}
