//! Errors of the admin API: a name in SCREAMING_SNAKE_CASE, a readable message and the HTTP
//! status that fits. The mapping from the core's [`ErrorKind`] to a status is made here, once
//! ([`status_for`]); the names ([`error_name`]) are Kafka's error names where Kafka has the error
//! (`UNKNOWN_TOPIC_OR_PARTITION`), taken from the Kafka front-end's one mapping, so that they read
//! the same as the Kafka clients'.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use weir_broker::{BrokerError, ErrorKind};

use crate::api::{ErrorBody, ErrorDetail};

#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) code: String,
    pub(crate) message: String,
}

impl ApiError {
    /// An error of the core's kind; its name and status follow from the kind.
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> ApiError {
        ApiError { status: status_for(kind), code: error_name(kind), message: message.into() }
    }

    /// An error outside the core's vocabulary (no such endpoint, wrong method).
    pub(crate) fn http(status: StatusCode, code: &str, message: impl Into<String>) -> ApiError {
        ApiError { status, code: code.to_string(), message: message.into() }
    }

    /// 400 INVALID_REQUEST: a malformed body, query parameter or path.
    pub(crate) fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::InvalidRequest, message)
    }

    pub(crate) fn unknown_topic(topic: &str) -> ApiError {
        ApiError::new(ErrorKind::UnknownTopicOrPartition, format!("topic '{topic}' does not exist"))
    }

    pub(crate) fn unknown_partition(topic: &str, partition: i32) -> ApiError {
        ApiError::new(ErrorKind::UnknownTopicOrPartition, format!("topic '{topic}' has no partition {partition}"))
    }

    pub(crate) fn unknown_group(group: &str) -> ApiError {
        ApiError::new(ErrorKind::UnknownGroup, format!("group '{group}' does not exist"))
    }

    pub(crate) fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::Internal, message)
    }

    pub(crate) fn detail(&self) -> ErrorDetail {
        ErrorDetail { code: self.code.clone(), message: self.message.clone() }
    }
}

impl From<BrokerError> for ApiError {
    fn from(e: BrokerError) -> ApiError {
        ApiError::new(e.kind, e.message)
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

/// The admin API's name of an error kind: Kafka's name of the kind's Kafka error, from the one
/// mapping in `weir_kafka::errors`, so that the names read the same as the Kafka clients'.
/// Kafka has no code for a group that already exists (the Kafka front-end answers
/// INVALID_REQUEST, as only this API creates groups): here it has its own name.
pub(crate) fn error_name(kind: ErrorKind) -> String {
    match kind {
        ErrorKind::GroupExists => "GROUP_ALREADY_EXISTS".to_string(),
        kind => weir_kafka::errors::error_name(i32::from(weir_kafka::errors::kafka_error(kind).code())),
    }
}

/// The HTTP status of an error kind: 404 for what does not exist, 400 for what the request got
/// wrong, 409 for a conflict with the current state, 413 for size limits, 429 for quotas, 503
/// for what is retriable once the broker (or the partition's leader) is ready, 504 for what the
/// metadata quorum did not commit in time, 500 for the rest.
pub(crate) fn status_for(kind: ErrorKind) -> StatusCode {
    use ErrorKind as K;
    match kind {
        K::UnknownTopicOrPartition | K::UnknownTopicId | K::UnknownGroup => StatusCode::NOT_FOUND,
        K::TopicExists
        | K::GroupExists
        | K::GroupNotEmpty
        | K::GroupSubscribedToTopic
        | K::RebalanceInProgress
        | K::UnknownMember
        | K::WrongGeneration
        | K::FencedInstance
        | K::MemberIdRequired
        | K::InconsistentGroupProtocol
        | K::GroupFull
        | K::FencedMemberEpoch
        | K::StaleMemberEpoch
        | K::UnreleasedInstanceId
        | K::OutOfOrderSequence
        | K::InvalidProducerEpoch
        | K::UnknownProducer
        | K::ProducerFenced
        | K::InvalidProducerIdMapping
        | K::InvalidTransactionState
        | K::ConcurrentTransactions
        | K::UnstableOffsetCommit => StatusCode::CONFLICT,
        K::InvalidTopic
        | K::InvalidPartitionCount
        | K::InvalidReplicationFactor
        | K::InvalidReplicaAssignment
        | K::InvalidConfig
        | K::InvalidRequest
        | K::InvalidRecord
        | K::Corrupt
        | K::InvalidTimestamp
        | K::InvalidGroupId
        | K::InvalidCommitOffsetSize
        | K::InvalidSessionTimeout
        | K::UnsupportedAssignor
        | K::InvalidTransactionTimeout
        | K::OffsetMetadataTooLarge
        | K::OffsetOutOfRange
        | K::OffsetMovedToTieredStorage
        | K::FencedLeaderEpoch
        | K::UnknownLeaderEpoch
        | K::NotAttempted
        | K::UnsupportedFormat => StatusCode::BAD_REQUEST,
        K::TopicDeletionDisabled
        | K::TopicAuthorizationFailed
        | K::GroupAuthorizationFailed
        | K::ClusterAuthorizationFailed
        | K::TransactionalIdAuthorizationFailed => StatusCode::FORBIDDEN,
        K::BrokerNotRegistered | K::ResourceNotFound => StatusCode::NOT_FOUND,
        K::AuthenticationFailed => StatusCode::UNAUTHORIZED,
        K::UnsupportedSaslMechanism | K::UnacceptableCredential | K::DuplicateResource => StatusCode::BAD_REQUEST,
        K::ElectionNotNeeded | K::NoReassignmentInProgress => StatusCode::CONFLICT,
        K::PreferredLeaderNotAvailable | K::EligibleLeadersNotAvailable => StatusCode::SERVICE_UNAVAILABLE,
        K::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        K::Throttled => StatusCode::TOO_MANY_REQUESTS,
        K::Unavailable
        | K::NotController
        | K::CoordinatorNotAvailable
        | K::CoordinatorLoadInProgress
        | K::NotCoordinator
        | K::LeaderNotAvailable
        | K::NotLeader
        | K::NotEnoughReplicas
        | K::NotEnoughReplicasAfterAppend => StatusCode::SERVICE_UNAVAILABLE,
        K::TimedOut => StatusCode::GATEWAY_TIMEOUT,
        K::Storage | K::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_kafkas_where_kafka_has_the_error() {
        assert_eq!(error_name(ErrorKind::UnknownTopicOrPartition), "UNKNOWN_TOPIC_OR_PARTITION");
        assert_eq!(error_name(ErrorKind::InvalidTopic), "INVALID_TOPIC_EXCEPTION");
        assert_eq!(error_name(ErrorKind::Storage), "KAFKA_STORAGE_ERROR");
        assert_eq!(error_name(ErrorKind::GroupNotEmpty), "NON_EMPTY_GROUP");
        assert_eq!(error_name(ErrorKind::InvalidTransactionState), "INVALID_TXN_STATE");
        assert_eq!(error_name(ErrorKind::GroupExists), "GROUP_ALREADY_EXISTS");
    }

    #[test]
    fn statuses_fit_the_kinds() {
        assert_eq!(status_for(ErrorKind::UnknownTopicOrPartition), StatusCode::NOT_FOUND);
        assert_eq!(status_for(ErrorKind::UnknownGroup), StatusCode::NOT_FOUND);
        assert_eq!(status_for(ErrorKind::TopicExists), StatusCode::CONFLICT);
        assert_eq!(status_for(ErrorKind::GroupNotEmpty), StatusCode::CONFLICT);
        assert_eq!(status_for(ErrorKind::InvalidConfig), StatusCode::BAD_REQUEST);
        assert_eq!(status_for(ErrorKind::TooLarge), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(status_for(ErrorKind::Storage), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(status_for(ErrorKind::NotLeader), StatusCode::SERVICE_UNAVAILABLE);
    }
}
