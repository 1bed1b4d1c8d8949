//! RocketMQ status codes: the one mapping of the core's [`ErrorKind`]s to them, and the
//! statuses this front-end answers with.

use weir_broker::{BrokerError, ErrorKind};

use crate::proto::{Code, Status};

/// `OK`.
pub fn ok() -> Status {
    Status { code: Code::Ok as i32, message: "OK".into() }
}

/// A status with `code` and a message for people.
pub fn status(code: Code, message: impl Into<String>) -> Status {
    Status { code: code as i32, message: message.into() }
}

/// The status a client gets for a core error.
pub fn of_error(error: &BrokerError) -> Status {
    status(code_of(error.kind), error.message.clone())
}

/// The RocketMQ code for each kind. RocketMQ's clients retry a send on another queue whatever
/// the code, and a receive after a back-off, so what matters is that the code names the cause:
/// a missing topic, a bad request, a body too large, or the server's side.
pub fn code_of(kind: ErrorKind) -> Code {
    use ErrorKind::*;
    match kind {
        UnknownTopicOrPartition | UnknownTopicId => Code::TopicNotFound,
        InvalidTopic => Code::IllegalTopic,
        TooLarge => Code::MessageBodyTooLarge,
        UnknownGroup => Code::ConsumerGroupNotFound,
        InvalidGroupId => Code::IllegalConsumerGroup,
        OffsetOutOfRange => Code::IllegalOffset,
        Throttled => Code::TooManyRequests,
        TimedOut => Code::ProxyTimeout,
        // Another broker leads, or none does right now: the client's next route points
        // elsewhere.
        NotLeader | LeaderNotAvailable | FencedLeaderEpoch | UnknownLeaderEpoch => Code::HaNotAvailable,
        NotEnoughReplicas | NotEnoughReplicasAfterAppend => Code::SlavePersistenceTimeout,
        Corrupt | InvalidRecord | InvalidTimestamp | UnsupportedFormat => Code::MessageCorrupted,
        InvalidRequest
        | InvalidConfig
        | InvalidPartitionCount
        | InvalidReplicationFactor
        | InvalidReplicaAssignment
        | TopicExists
        | TopicDeletionDisabled
        | ElectionNotNeeded
        | PreferredLeaderNotAvailable
        | EligibleLeadersNotAvailable
        | NoReassignmentInProgress
        | OffsetMetadataTooLarge
        | InvalidCommitOffsetSize
        | InvalidSessionTimeout => Code::BadRequest,
        OutOfOrderSequence
        | InvalidProducerEpoch
        | UnknownProducer
        | ProducerFenced
        | InvalidProducerIdMapping
        | InvalidTransactionTimeout
        | InvalidTransactionState
        | ConcurrentTransactions
        | NotAttempted => Code::BadRequest,
        GroupNotEmpty
        | GroupSubscribedToTopic
        | UnknownMember
        | WrongGeneration
        | RebalanceInProgress
        | MemberIdRequired
        | FencedInstance
        | InconsistentGroupProtocol
        | GroupFull => Code::BadRequest,
        CoordinatorNotAvailable | CoordinatorLoadInProgress | NotCoordinator | Unavailable | NotController => {
            Code::InternalServerError
        }
        Storage | Internal => Code::InternalError,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_causes_clients_tell_apart_have_their_own_codes() {
        assert_eq!(code_of(ErrorKind::UnknownTopicOrPartition), Code::TopicNotFound);
        assert_eq!(code_of(ErrorKind::InvalidTopic), Code::IllegalTopic);
        assert_eq!(code_of(ErrorKind::TooLarge), Code::MessageBodyTooLarge);
        assert_eq!(code_of(ErrorKind::NotLeader), Code::HaNotAvailable);
        let status = of_error(&BrokerError::new(ErrorKind::Internal, "disk on fire"));
        assert_eq!((status.code, status.message.as_str()), (Code::InternalError as i32, "disk on fire"));
    }
}
