//! The Kafka names of the core's errors: every [`ErrorKind`] maps to exactly one Kafka error
//! code here, and nowhere else. Handlers put `code(&error)` (and the error's message, where the
//! response has a field for it) into their responses.

use kafka_protocol::ResponseError;
use weir_broker::{BrokerError, ErrorKind};

/// The Kafka error of a core error kind.
pub fn kafka_error(kind: ErrorKind) -> ResponseError {
    use ErrorKind as K;
    use ResponseError as E;
    match kind {
        K::UnknownTopicOrPartition => E::UnknownTopicOrPartition,
        K::UnknownTopicId => E::UnknownTopicId,
        K::TopicExists => E::TopicAlreadyExists,
        K::InvalidTopic => E::InvalidTopicException,
        K::InvalidPartitionCount => E::InvalidPartitions,
        K::InvalidReplicationFactor => E::InvalidReplicationFactor,
        K::InvalidReplicaAssignment => E::InvalidReplicaAssignment,
        K::InvalidConfig => E::InvalidConfig,
        K::TopicDeletionDisabled => E::TopicDeletionDisabled,
        K::NotLeader => E::NotLeaderOrFollower,
        K::LeaderNotAvailable => E::LeaderNotAvailable,
        K::FencedLeaderEpoch => E::FencedLeaderEpoch,
        K::UnknownLeaderEpoch => E::UnknownLeaderEpoch,
        K::NotEnoughReplicas => E::NotEnoughReplicas,
        K::NotEnoughReplicasAfterAppend => E::NotEnoughReplicasAfterAppend,
        K::ElectionNotNeeded => E::ElectionNotNeeded,
        K::PreferredLeaderNotAvailable => E::PreferredLeaderNotAvailable,
        K::EligibleLeadersNotAvailable => E::EligibleLeadersNotAvailable,
        K::NoReassignmentInProgress => E::NoReassignmentInProgress,
        K::OffsetOutOfRange => E::OffsetOutOfRange,
        K::OffsetMovedToTieredStorage => E::OffsetMovedToTieredStorage,
        K::TooLarge => E::MessageTooLarge,
        K::Corrupt => E::CorruptMessage,
        K::InvalidRecord => E::InvalidRecord,
        K::InvalidTimestamp => E::InvalidTimestamp,
        K::UnsupportedFormat => E::UnsupportedForMessageFormat,
        K::Storage => E::KafkaStorageError,
        K::OutOfOrderSequence => E::OutOfOrderSequenceNumber,
        K::InvalidProducerEpoch => E::InvalidProducerEpoch,
        K::UnknownProducer => E::UnknownProducerId,
        K::ProducerFenced => E::ProducerFenced,
        K::InvalidProducerIdMapping => E::InvalidProducerIdMapping,
        K::InvalidTransactionTimeout => E::InvalidTransactionTimeout,
        K::InvalidTransactionState => E::InvalidTxnState,
        K::ConcurrentTransactions => E::ConcurrentTransactions,
        K::NotAttempted => E::OperationNotAttempted,
        K::InvalidGroupId => E::InvalidGroupId,
        K::UnknownGroup => E::GroupIdNotFound,
        // Only the admin API creates groups with settings; Kafka has no code for it.
        K::GroupExists => E::InvalidRequest,
        K::GroupNotEmpty => E::NonEmptyGroup,
        K::GroupSubscribedToTopic => E::GroupSubscribedToTopic,
        K::UnknownMember => E::UnknownMemberId,
        K::WrongGeneration => E::IllegalGeneration,
        K::RebalanceInProgress => E::RebalanceInProgress,
        K::MemberIdRequired => E::MemberIdRequired,
        K::FencedInstance => E::FencedInstanceId,
        K::InconsistentGroupProtocol => E::InconsistentGroupProtocol,
        K::InvalidSessionTimeout => E::InvalidSessionTimeout,
        K::GroupFull => E::GroupMaxSizeReached,
        K::FencedMemberEpoch => E::FencedMemberEpoch,
        K::StaleMemberEpoch => E::StaleMemberEpoch,
        K::UnreleasedInstanceId => E::UnreleasedInstanceId,
        K::UnsupportedAssignor => E::UnsupportedAssignor,
        K::OffsetMetadataTooLarge => E::OffsetMetadataTooLarge,
        K::InvalidCommitOffsetSize => E::InvalidCommitOffsetSize,
        K::UnstableOffsetCommit => E::UnstableOffsetCommit,
        K::CoordinatorNotAvailable => E::CoordinatorNotAvailable,
        K::CoordinatorLoadInProgress => E::CoordinatorLoadInProgress,
        K::NotCoordinator => E::NotCoordinator,
        K::InvalidRequest => E::InvalidRequest,
        K::BrokerNotRegistered => E::BrokerIdNotRegistered,
        K::AuthenticationFailed => E::SaslAuthenticationFailed,
        K::UnsupportedSaslMechanism => E::UnsupportedSaslMechanism,
        K::UnacceptableCredential => E::UnacceptableCredential,
        K::ResourceNotFound => E::ResourceNotFound,
        K::DuplicateResource => E::DuplicateResource,
        K::TopicAuthorizationFailed => E::TopicAuthorizationFailed,
        K::GroupAuthorizationFailed => E::GroupAuthorizationFailed,
        K::ClusterAuthorizationFailed => E::ClusterAuthorizationFailed,
        K::TransactionalIdAuthorizationFailed => E::TransactionalIdAuthorizationFailed,
        K::Throttled => E::ThrottlingQuotaExceeded,
        K::Unavailable => E::BrokerNotAvailable,
        K::NotController => E::NotController,
        K::TimedOut => E::RequestTimedOut,
        K::Internal => E::UnknownServerError,
    }
}

/// The Kafka error code of a core error, as a response carries it.
pub(crate) fn code(error: &BrokerError) -> i16 {
    kafka_error(error.kind).code()
}

/// The error code of an optional error kind (`None`: success, code 0).
pub(crate) fn code_of(kind: Option<ErrorKind>) -> i16 {
    kind.map_or(0, |k| kafka_error(k).code())
}

/// Kafka's name of an error code, as its documentation and `Errors` enum spell it:
/// `UNKNOWN_TOPIC_OR_PARTITION`; `NONE` for 0, `UNKNOWN_CODE_<n>` for a code Kafka does not
/// define. The `error` label of the Kafka request metrics, and what tools print.
pub fn error_name(code: i32) -> String {
    let known = i16::try_from(code).ok().and_then(ResponseError::try_from_code);
    match known {
        None if code == 0 => "NONE".to_string(),
        None | Some(ResponseError::Unknown(_)) => format!("UNKNOWN_CODE_{code}"),
        Some(error) => {
            let camel = error.to_string();
            let mut snake = String::with_capacity(camel.len() + 8);
            for (i, c) in camel.chars().enumerate() {
                if c.is_ascii_uppercase() && i > 0 {
                    snake.push('_');
                }
                snake.push(c.to_ascii_uppercase());
            }
            snake
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_names_are_kafkas() {
        assert_eq!(error_name(3), "UNKNOWN_TOPIC_OR_PARTITION");
        assert_eq!(error_name(-1), "UNKNOWN_SERVER_ERROR");
        assert_eq!(error_name(17), "INVALID_TOPIC_EXCEPTION");
        assert_eq!(error_name(56), "KAFKA_STORAGE_ERROR");
        assert_eq!(error_name(0), "NONE");
        assert_eq!(error_name(31_000), "UNKNOWN_CODE_31000");
        assert_eq!(error_name(100_000), "UNKNOWN_CODE_100000");
    }

    #[test]
    fn retriable_kinds_map_to_retriable_kafka_errors() {
        // Kafka clients retry on the error code alone: a kind the core calls retriable must not
        // become a code they give up on, and the other way round.
        for kind in [
            ErrorKind::UnknownTopicOrPartition,
            ErrorKind::NotLeader,
            ErrorKind::NotEnoughReplicas,
            ErrorKind::CoordinatorNotAvailable,
            ErrorKind::CoordinatorLoadInProgress,
            ErrorKind::NotCoordinator,
            ErrorKind::Storage,
            ErrorKind::Corrupt,
            ErrorKind::TooLarge,
            ErrorKind::InvalidRecord,
            ErrorKind::UnknownGroup,
        ] {
            assert_eq!(kind.is_retriable(), kafka_error(kind).is_retriable(), "{kind:?}");
        }
    }
}
