//! RocketMQ status codes: the one mapping of the core's [`ErrorKind`]s to them, and the
//! statuses this front-end answers with.

use weir_broker::{BrokerError, ErrorKind};

use crate::proto::{Code, Status};

/// The name of a status code as the RocketMQ protocol spells it (`TOPIC_NOT_FOUND`);
/// `CODE_<n>` for a code it does not define. The metrics' `error` label, and what tools print.
pub fn code_name(code: i32) -> String {
    Code::try_from(code).map_or_else(|_| format!("CODE_{code}"), |c| c.as_str_name().to_string())
}

/// `OK`.
pub(crate) fn ok() -> Status {
    Status { code: Code::Ok as i32, message: "OK".into() }
}

/// A status with `code` and a message for people.
pub(crate) fn status(code: Code, message: impl Into<String>) -> Status {
    Status { code: code as i32, message: message.into() }
}

/// The status of a call answered per entry (a send of several messages, an ack of several
/// handles): OK when every entry is, the entries' status when all failed (the first's), else
/// `MULTIPLE_RESULTS` saying what to look at.
pub(crate) fn overall<'a>(entries: impl IntoIterator<Item = &'a Status>, what_failed: &str) -> Status {
    let (mut total, mut failed, mut first) = (0, 0, None);
    for entry in entries {
        total += 1;
        if entry.code != Code::Ok as i32 {
            failed += 1;
            first.get_or_insert(entry);
        }
    }
    match first {
        None => ok(),
        Some(first) if failed == total => first.clone(),
        Some(_) => status(Code::MultipleResults, format!("{what_failed}; see each entry")),
    }
}

/// The status a client gets for a core error.
pub(crate) fn of_error(error: &BrokerError) -> Status {
    status(code_of(error.kind), error.message.clone())
}

/// The RocketMQ code for each kind. RocketMQ's clients retry a send on another queue whatever
/// the code, and a receive after a back-off, so what matters is that the code names the cause:
/// a missing topic, a bad request, a body too large, or the server's side.
pub(crate) fn code_of(kind: ErrorKind) -> Code {
    use ErrorKind::*;
    match kind {
        UnknownTopicOrPartition | UnknownTopicId => Code::TopicNotFound,
        InvalidTopic => Code::IllegalTopic,
        TooLarge => Code::MessageBodyTooLarge,
        UnknownGroup => Code::ConsumerGroupNotFound,
        InvalidGroupId => Code::IllegalConsumerGroup,
        OffsetOutOfRange | OffsetMovedToTieredStorage => Code::IllegalOffset,
        Throttled => Code::TooManyRequests,
        TimedOut => Code::ProxyTimeout,
        // Another broker leads, or none does right now: the client's next route points
        // elsewhere.
        NotLeader | LeaderNotAvailable | FencedLeaderEpoch | UnknownLeaderEpoch => Code::HaNotAvailable,
        NotEnoughReplicas | NotEnoughReplicasAfterAppend => Code::SlavePersistenceTimeout,
        Corrupt | InvalidRecord | InvalidTimestamp | UnsupportedFormat => Code::MessageCorrupted,
        AuthenticationFailed => Code::Unauthorized,
        TopicAuthorizationFailed
        | GroupAuthorizationFailed
        | ClusterAuthorizationFailed
        | TransactionalIdAuthorizationFailed => Code::Forbidden,
        UnsupportedSaslMechanism | UnacceptableCredential | ResourceNotFound | DuplicateResource => Code::BadRequest,
        InvalidRequest
        | BrokerNotRegistered
        | InvalidConfig
        | InvalidPartitionCount
        | InvalidReplicationFactor
        | InvalidReplicaAssignment
        | TopicExists
        | GroupExists
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
        | UnstableOffsetCommit
        | NotAttempted => Code::BadRequest,
        GroupNotEmpty
        | GroupSubscribedToTopic
        | UnknownMember
        | WrongGeneration
        | RebalanceInProgress
        | MemberIdRequired
        | FencedInstance
        | InconsistentGroupProtocol
        | GroupFull
        | FencedMemberEpoch
        | StaleMemberEpoch
        | UnreleasedInstanceId
        | UnsupportedAssignor => Code::BadRequest,
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

    #[test]
    fn a_call_answered_per_entry_is_ok_failed_or_multiple() {
        let bad = status(Code::InvalidReceiptHandle, "stale");
        assert_eq!(overall([&ok(), &ok()], "x").code, Code::Ok as i32);
        assert_eq!(overall([&bad, &bad], "x"), bad);
        assert_eq!(overall([&ok(), &bad], "some acks failed").message, "some acks failed; see each entry");
        assert_eq!(overall([&ok(), &bad], "x").code, Code::MultipleResults as i32);
    }
}
