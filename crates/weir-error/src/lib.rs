//! Weir's errors, in its own terms: what every layer below the front-ends (metadata,
//! controller, data path, coordinators, messaging) reports.
//!
//! A failure a client can see is a [`BrokerError`]: an [`ErrorKind`] (what went wrong) and a
//! message for people. Each front-end maps the kind to its protocol once, in one function:
//! `weir_kafka::errors` to Kafka error codes, `weir_admin::error` to HTTP statuses and names, and
//! the RocketMQ front-end to its status codes. Nothing here knows those codes.
//!
//! The kinds are as fine as a client's reaction needs: two failures a client handles differently
//! (retry, refresh its metadata, rejoin its group, give up) are two kinds. A kind is added when a
//! front-end needs to tell it apart, and every front-end's mapping must then place it (the
//! matches there are exhaustive on purpose).
#![deny(unsafe_code)]

use weir_storage::{BatchError, ProducerError, StorageError};

/// The name among `names` nearest to `name`, if it is close enough to be a slip of the keyboard:
/// at most one edit per four characters (`log.retension.ms` → `log.retention.ms`). What every
/// "did you mean" of settings, topic configs and group configs offers.
pub fn closest_name<'a>(name: &str, names: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let edits_max = (name.len() / 4).max(1);
    names
        .into_iter()
        .map(|candidate| (strsim::levenshtein(name, candidate), candidate))
        .filter(|(edits, _)| *edits <= edits_max)
        .min_by_key(|(edits, _)| *edits)
        .map(|(_, candidate)| candidate)
}

/// What went wrong. Serializable: an error crosses the cluster's internal RPCs as it is (a
/// request forwarded to the controller answers with the controller's error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ErrorKind {
    // ----- topics and partitions -------------------------------------------------------------
    /// The topic, or the partition of the topic, does not exist.
    UnknownTopicOrPartition,
    /// No topic has the given topic id.
    UnknownTopicId,
    TopicExists,
    /// A topic name breaks the naming rules, or the operation is not allowed on the topic (an
    /// internal topic written by a client).
    InvalidTopic,
    /// A partition count that is not allowed (below 1, above the limit, shrinking).
    InvalidPartitionCount,
    InvalidReplicationFactor,
    InvalidReplicaAssignment,
    InvalidConfig,
    TopicDeletionDisabled,

    // ----- replicas --------------------------------------------------------------------------
    /// This broker is not the partition's leader (any more): refresh metadata and retry there.
    NotLeader,
    /// The partition has no leader right now (its broker is fenced or moving): retry later.
    LeaderNotAvailable,
    /// The caller's leader epoch is older than the partition's: its metadata is stale.
    FencedLeaderEpoch,
    /// The caller's leader epoch is newer than the partition's: this broker is behind.
    UnknownLeaderEpoch,
    /// Fewer in-sync replicas than `min.insync.replicas`: nothing was written.
    NotEnoughReplicas,
    /// Written on the leader, but the in-sync replicas shrank below `min.insync.replicas` before
    /// it was acknowledged.
    NotEnoughReplicasAfterAppend,
    /// A leader election was asked for a partition that already has the leader it would elect.
    ElectionNotNeeded,
    /// The preferred replica cannot lead now (it is fenced or out of the ISR).
    PreferredLeaderNotAvailable,
    /// An unclean election found no live replica to lead.
    EligibleLeadersNotAvailable,
    /// A reassignment was cancelled where none is in progress.
    NoReassignmentInProgress,

    // ----- records ---------------------------------------------------------------------------
    /// An offset outside the log (`[log start, log end]`).
    OffsetOutOfRange,
    /// A replica asked for an offset of a tiered log that only the object store holds: it
    /// starts at the leader's local log start instead (KIP-405).
    OffsetMovedToTieredStorage,
    /// A batch, record or request beyond its size limit.
    TooLarge,
    /// Bytes that fail their checksum or do not parse.
    Corrupt,
    /// Well-formed records the broker refuses (a keyless record on a compacted topic, ...).
    InvalidRecord,
    /// A timestamp out of the accepted range.
    InvalidTimestamp,
    /// A record format this broker does not store (message format v0/v1).
    UnsupportedFormat,
    /// The disk or file system failed (also: disk full).
    Storage,

    // ----- producers and transactions ----------------------------------------------------------
    OutOfOrderSequence,
    InvalidProducerEpoch,
    UnknownProducer,
    /// A newer producer with the same transactional id took over.
    ProducerFenced,
    /// The producer id does not belong to the transactional id (or it has none yet).
    InvalidProducerIdMapping,
    InvalidTransactionTimeout,
    /// The request does not fit the transaction's state (commit without begin, ...).
    InvalidTransactionState,
    /// The previous transaction of the producer is still completing: retry.
    ConcurrentTransactions,
    /// Not attempted because another part of the same request failed.
    NotAttempted,

    // ----- consumer groups -------------------------------------------------------------------
    InvalidGroupId,
    UnknownGroup,
    /// The group already has settings (`weir group create` of a configured group).
    GroupExists,
    /// The group has members; the operation needs it empty.
    GroupNotEmpty,
    /// The group's members consume the topic the operation is about.
    GroupSubscribedToTopic,
    /// The member id is not (or no longer) a member of the group: rejoin.
    UnknownMember,
    /// The member's generation is not the group's current one: rejoin.
    WrongGeneration,
    RebalanceInProgress,
    /// A new member must join again with the member id it was just given (KIP-394).
    MemberIdRequired,
    /// Another member took over the static member's `group.instance.id` (KIP-345).
    FencedInstance,
    /// The member's protocol type or protocols do not match the group's.
    InconsistentGroupProtocol,
    InvalidSessionTimeout,
    /// The group has `group.max.size` members already.
    GroupFull,
    /// Consumer protocol (KIP-848): the member's epoch is not its current one; it must rejoin
    /// with epoch 0, giving up its partitions.
    FencedMemberEpoch,
    /// Consumer protocol: an offset commit names an epoch other than the member's current one.
    StaleMemberEpoch,
    /// Consumer protocol: a static member's `group.instance.id` is still held by a member that
    /// has not left.
    UnreleasedInstanceId,
    /// Consumer protocol: the member asked for a server-side assignor the broker lacks.
    UnsupportedAssignor,
    OffsetMetadataTooLarge,
    InvalidCommitOffsetSize,
    /// OffsetFetch with RequireStable: an open transaction is about to commit this partition's
    /// offset; ask again once it ends.
    UnstableOffsetCommit,
    /// The coordinator is starting, stopping or cannot write: retry.
    CoordinatorNotAvailable,
    /// This broker became the coordinator and is still reading the state from its log: retry.
    CoordinatorLoadInProgress,
    /// This broker is not the group's coordinator (any more): find it again.
    NotCoordinator,

    // ----- the cluster -------------------------------------------------------------------------
    /// No broker is registered under this id (Kafka's BROKER_ID_NOT_REGISTERED).
    BrokerNotRegistered,

    // ----- security ------------------------------------------------------------------------------
    /// A wrong user name or password, or a failed SASL exchange.
    AuthenticationFailed,
    /// The client asked for a SASL mechanism this listener does not enable.
    UnsupportedSaslMechanism,
    /// A SCRAM credential that cannot be stored (iterations out of range, no user name).
    UnacceptableCredential,
    /// The named resource (a user's credential) does not exist.
    ResourceNotFound,
    /// A request names the same resource twice.
    DuplicateResource,
    /// The authorizer refused an operation on a topic (its ACLs, `weir_security::acl`).
    TopicAuthorizationFailed,
    /// The authorizer refused an operation on a consumer group.
    GroupAuthorizationFailed,
    /// The authorizer refused an operation on the cluster.
    ClusterAuthorizationFailed,
    /// The authorizer refused an operation on a transactional id.
    TransactionalIdAuthorizationFailed,

    // ----- everything else -------------------------------------------------------------------
    /// The request itself is wrong (a field out of range, a missing value).
    InvalidRequest,
    /// The caller exceeded a quota and must slow down.
    Throttled,
    /// The broker is starting or shutting down: retry shortly.
    Unavailable,
    /// This node is not the active controller (the metadata quorum's leader), or the quorum has
    /// none right now: send the change to the controller, or retry.
    NotController,
    /// The operation did not finish in time (the metadata quorum could not commit it: a
    /// majority of the controllers may be down). It may still take effect.
    TimedOut,
    /// A bug or an unexpected failure inside the broker.
    Internal,
}

impl ErrorKind {
    /// True when the same request may succeed if retried as it is (after a metadata refresh
    /// where the kind says so), as clients of every protocol treat such errors.
    pub fn is_retriable(self) -> bool {
        use ErrorKind::*;
        matches!(
            self,
            UnknownTopicOrPartition
                | NotLeader
                | LeaderNotAvailable
                | FencedLeaderEpoch
                | UnknownLeaderEpoch
                | NotEnoughReplicas
                | NotEnoughReplicasAfterAppend
                | Corrupt
                | Storage
                | ConcurrentTransactions
                | RebalanceInProgress
                | UnstableOffsetCommit
                | CoordinatorNotAvailable
                | CoordinatorLoadInProgress
                | NotCoordinator
                | Throttled
                | Unavailable
                | NotController
                | TimedOut
        )
    }

    /// A short description, for logs and error messages.
    pub fn describe(self) -> &'static str {
        use ErrorKind::*;
        match self {
            UnknownTopicOrPartition => "unknown topic or partition",
            UnknownTopicId => "unknown topic id",
            TopicExists => "topic already exists",
            InvalidTopic => "invalid topic",
            InvalidPartitionCount => "invalid partition count",
            InvalidReplicationFactor => "invalid replication factor",
            InvalidReplicaAssignment => "invalid replica assignment",
            InvalidConfig => "invalid config",
            TopicDeletionDisabled => "topic deletion disabled",
            NotLeader => "not the leader",
            LeaderNotAvailable => "leader not available",
            FencedLeaderEpoch => "fenced leader epoch",
            UnknownLeaderEpoch => "unknown leader epoch",
            NotEnoughReplicas => "not enough replicas",
            NotEnoughReplicasAfterAppend => "not enough replicas after append",
            ElectionNotNeeded => "election not needed",
            PreferredLeaderNotAvailable => "preferred leader not available",
            EligibleLeadersNotAvailable => "eligible leaders not available",
            NoReassignmentInProgress => "no reassignment in progress",
            OffsetOutOfRange => "offset out of range",
            OffsetMovedToTieredStorage => "offset moved to tiered storage",
            TooLarge => "too large",
            Corrupt => "corrupt",
            InvalidRecord => "invalid record",
            InvalidTimestamp => "invalid timestamp",
            UnsupportedFormat => "unsupported record format",
            Storage => "storage error",
            OutOfOrderSequence => "out of order sequence",
            InvalidProducerEpoch => "invalid producer epoch",
            UnknownProducer => "unknown producer",
            ProducerFenced => "producer fenced",
            InvalidProducerIdMapping => "invalid producer id mapping",
            InvalidTransactionTimeout => "invalid transaction timeout",
            InvalidTransactionState => "invalid transaction state",
            ConcurrentTransactions => "concurrent transactions",
            NotAttempted => "not attempted",
            InvalidGroupId => "invalid group id",
            UnknownGroup => "unknown group",
            GroupExists => "group already exists",
            GroupNotEmpty => "group not empty",
            GroupSubscribedToTopic => "group subscribed to topic",
            UnknownMember => "unknown member",
            WrongGeneration => "wrong generation",
            RebalanceInProgress => "rebalance in progress",
            MemberIdRequired => "member id required",
            FencedInstance => "fenced instance id",
            InconsistentGroupProtocol => "inconsistent group protocol",
            InvalidSessionTimeout => "invalid session timeout",
            GroupFull => "group full",
            FencedMemberEpoch => "fenced member epoch",
            StaleMemberEpoch => "stale member epoch",
            UnreleasedInstanceId => "unreleased instance id",
            UnsupportedAssignor => "unsupported assignor",
            OffsetMetadataTooLarge => "offset metadata too large",
            InvalidCommitOffsetSize => "invalid commit offset size",
            UnstableOffsetCommit => "unstable offset commit (a transaction is open)",
            CoordinatorNotAvailable => "coordinator not available",
            CoordinatorLoadInProgress => "coordinator loading",
            NotCoordinator => "not the coordinator",
            BrokerNotRegistered => "broker not registered",
            AuthenticationFailed => "authentication failed",
            UnsupportedSaslMechanism => "unsupported SASL mechanism",
            UnacceptableCredential => "unacceptable credential",
            ResourceNotFound => "resource not found",
            DuplicateResource => "duplicate resource",
            TopicAuthorizationFailed => "not authorized on the topic",
            GroupAuthorizationFailed => "not authorized on the group",
            ClusterAuthorizationFailed => "not authorized on the cluster",
            TransactionalIdAuthorizationFailed => "not authorized on the transactional id",
            InvalidRequest => "invalid request",
            Throttled => "throttled",
            Unavailable => "unavailable",
            NotController => "not the controller",
            TimedOut => "timed out",
            Internal => "internal error",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}

/// A failure of a broker operation: what went wrong and a message that says it to a person
/// (front-ends send it to the client where their protocol has room for it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[error("{kind}: {message}")]
pub struct BrokerError {
    pub kind: ErrorKind,
    pub message: String,
    /// For an append refused because of some of its records: which ones, and why (Kafka's
    /// KIP-467 record errors). Empty otherwise.
    #[serde(default)]
    pub record_errors: Vec<RecordError>,
}

/// One refused record of an append: its index among the records of the request's batches, in
/// order, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RecordError {
    pub index: i32,
    pub message: String,
}

impl BrokerError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> BrokerError {
        BrokerError { kind, message: message.into(), record_errors: Vec::new() }
    }

    pub fn unknown_partition(topic: &str, partition: i32) -> BrokerError {
        BrokerError::new(ErrorKind::UnknownTopicOrPartition, format!("This server does not host {topic}-{partition}."))
    }

    pub fn internal(message: impl Into<String>) -> BrokerError {
        BrokerError::new(ErrorKind::Internal, message)
    }
}

impl From<StorageError> for BrokerError {
    fn from(e: StorageError) -> BrokerError {
        let kind = match &e {
            StorageError::Batch(BatchError::Corrupt(_)) => ErrorKind::Corrupt,
            StorageError::Batch(BatchError::Invalid(_)) => ErrorKind::InvalidRecord,
            StorageError::Batch(BatchError::TooLarge { .. }) => ErrorKind::TooLarge,
            StorageError::Batch(BatchError::UnsupportedMagic(_)) => ErrorKind::UnsupportedFormat,
            StorageError::OffsetOutOfRange { .. } => ErrorKind::OffsetOutOfRange,
            StorageError::InvalidConfig { .. } => ErrorKind::InvalidConfig,
            StorageError::InvalidArgument(_) => ErrorKind::InvalidRequest,
            // A closed log belongs to a partition this broker no longer serves.
            StorageError::Closed(_) | StorageError::StaleLeaderEpoch { .. } => ErrorKind::NotLeader,
            StorageError::Producer(p) => match p {
                ProducerError::OutOfOrderSequence(_) => ErrorKind::OutOfOrderSequence,
                ProducerError::InvalidProducerEpoch(_) => ErrorKind::InvalidProducerEpoch,
                ProducerError::UnknownProducerId(_) => ErrorKind::UnknownProducer,
                ProducerError::Invalid(_) => ErrorKind::InvalidRecord,
            },
            StorageError::CorruptSegment { .. } | StorageError::DirectoryLocked(_) | StorageError::Io { .. } => {
                ErrorKind::Storage
            }
        };
        BrokerError::new(kind, e.to_string())
    }
}
