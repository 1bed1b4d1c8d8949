//! Errors of the admin API: Kafka's error code as a SCREAMING_SNAKE_CASE name, a readable message
//! and the HTTP status that fits the code. The mapping from [`ErrorCode`] to a status is made
//! here, once.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use weir_broker::{BrokerError, ErrorCode};

use crate::api::{ErrorBody, ErrorDetail};

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: String,
    pub message: String,
}

impl ApiError {
    /// An error with a Kafka code; the status follows from the code.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError { status: status_for(code), code: error_name(code), message: message.into() }
    }

    /// An error outside Kafka's vocabulary (no such endpoint, wrong method).
    pub fn http(status: StatusCode, code: &str, message: impl Into<String>) -> ApiError {
        ApiError { status, code: code.to_string(), message: message.into() }
    }

    /// 400 INVALID_REQUEST: a malformed body, query parameter or path.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorCode::InvalidRequest, message)
    }

    pub fn unknown_topic(topic: &str) -> ApiError {
        ApiError::new(ErrorCode::UnknownTopicOrPartition, format!("topic '{topic}' does not exist"))
    }

    pub fn unknown_partition(topic: &str, partition: i32) -> ApiError {
        ApiError::new(ErrorCode::UnknownTopicOrPartition, format!("topic '{topic}' has no partition {partition}"))
    }

    pub fn unknown_group(group: &str) -> ApiError {
        ApiError::new(ErrorCode::GroupIdNotFound, format!("group '{group}' does not exist"))
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorCode::UnknownServerError, message)
    }

    pub fn detail(&self) -> ErrorDetail {
        ErrorDetail { code: self.code.clone(), message: self.message.clone() }
    }
}

impl From<BrokerError> for ApiError {
    fn from(e: BrokerError) -> ApiError {
        ApiError::new(e.code, e.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(code = %self.code, message = %self.message, "admin API request failed");
        }
        (self.status, Json(ErrorBody { error: self.detail() })).into_response()
    }
}

/// Kafka's name of `code`: `UnknownTopicOrPartition` → `UNKNOWN_TOPIC_OR_PARTITION`, as in
/// Kafka's `Errors` enum.
pub fn error_name(code: ErrorCode) -> String {
    if let ErrorCode::Unknown(n) = code {
        return format!("UNKNOWN_ERROR_CODE_{n}");
    }
    let camel = code.to_string();
    let mut out = String::with_capacity(camel.len() + 8);
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// The HTTP status of a Kafka error: 404 for what does not exist, 400 for what the request got
/// wrong, 409 for a conflict with the current state, 413 for size limits, 503 for what is
/// retriable once the broker is ready, 500 for the rest.
pub fn status_for(code: ErrorCode) -> StatusCode {
    use ErrorCode as E;
    match code {
        E::UnknownTopicOrPartition | E::UnknownTopicId | E::GroupIdNotFound => StatusCode::NOT_FOUND,
        E::TopicAlreadyExists
        | E::NonEmptyGroup
        | E::GroupSubscribedToTopic
        | E::RebalanceInProgress
        | E::UnknownMemberId
        | E::IllegalGeneration
        | E::FencedInstanceId => StatusCode::CONFLICT,
        E::InvalidTopicException
        | E::InvalidPartitions
        | E::InvalidReplicationFactor
        | E::InvalidReplicaAssignment
        | E::InvalidConfig
        | E::InvalidRequest
        | E::InvalidRecord
        | E::CorruptMessage
        | E::InvalidTimestamp
        | E::InvalidGroupId
        | E::InvalidCommitOffsetSize
        | E::OffsetMetadataTooLarge
        | E::OffsetOutOfRange
        | E::InvalidRequiredAcks
        | E::PolicyViolation
        | E::UnsupportedForMessageFormat => StatusCode::BAD_REQUEST,
        E::TopicDeletionDisabled => StatusCode::FORBIDDEN,
        E::MessageTooLarge | E::RecordListTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        E::BrokerNotAvailable
        | E::CoordinatorNotAvailable
        | E::CoordinatorLoadInProgress
        | E::NotCoordinator
        | E::LeaderNotAvailable
        | E::NotLeaderOrFollower
        | E::NotEnoughReplicas
        | E::NotEnoughReplicasAfterAppend
        | E::RequestTimedOut => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_kafkas() {
        assert_eq!(error_name(ErrorCode::UnknownTopicOrPartition), "UNKNOWN_TOPIC_OR_PARTITION");
        assert_eq!(error_name(ErrorCode::InvalidTopicException), "INVALID_TOPIC_EXCEPTION");
        assert_eq!(error_name(ErrorCode::KafkaStorageError), "KAFKA_STORAGE_ERROR");
        assert_eq!(error_name(ErrorCode::NonEmptyGroup), "NON_EMPTY_GROUP");
        assert_eq!(error_name(ErrorCode::Unknown(9999)), "UNKNOWN_ERROR_CODE_9999");
    }

    #[test]
    fn statuses_fit_the_codes() {
        assert_eq!(status_for(ErrorCode::UnknownTopicOrPartition), StatusCode::NOT_FOUND);
        assert_eq!(status_for(ErrorCode::GroupIdNotFound), StatusCode::NOT_FOUND);
        assert_eq!(status_for(ErrorCode::TopicAlreadyExists), StatusCode::CONFLICT);
        assert_eq!(status_for(ErrorCode::NonEmptyGroup), StatusCode::CONFLICT);
        assert_eq!(status_for(ErrorCode::InvalidConfig), StatusCode::BAD_REQUEST);
        assert_eq!(status_for(ErrorCode::MessageTooLarge), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(status_for(ErrorCode::KafkaStorageError), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
