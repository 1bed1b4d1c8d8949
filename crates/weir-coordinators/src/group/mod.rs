//! Consumer groups: the classic group protocol's coordinator, the consumer group protocol's
//! (KIP-848), and the committed-offset store.
//!
//! Code map:
//! - `coordinator`: [`GroupCoordinator`], the entry point. Holds every group under one mutex,
//!   runs the timers (join phase, session expiry, pending syncs, offset retention), and does the
//!   log appends outside that mutex.
//! - `state`: one group's state machine (Kafka's `GroupMetadata` plus the per-group parts of its
//!   `GroupCoordinator`): pure, synchronous, time passed in.
//! - [`clients`]: consumers that receive by invisible time (RocketMQ's) instead of joining:
//!   who is connected, for describing a group.
//! - `offsets`: the on-disk encoding of `__consumer_offsets` records and their loading at start-up.
//! - `consumer`: one consumer-protocol group's state machine (epochs, target assignment,
//!   incremental reconciliation), kept in the classic `Group` record it shares offsets with;
//!   `consumer_api`: the coordinator's entry points for it; `assignor`: the server-side
//!   `uniform` and `range` assignors.
//! - `share`: one Kafka share group's membership and assignment (KIP-932, the `simple`
//!   assignor); `share_api`: the coordinator's entry points for it and the one namespace of
//!   group ids across group types.
//! - `unstable`: which partitions' offsets an open transaction is about to commit
//!   (OffsetFetch's `RequireStable`).
//!
//! The group protocol is carried by the clients: the broker picks a protocol every member
//! supports, elects a leader, hands the leader the members' metadata and hands every member the
//! assignment the leader sends back. Range, round-robin, cooperative-sticky and any other
//! assignor work without the broker knowing them.
//!
//! API boundary: nothing here names a wire-protocol type; results carry the core's
//! [`ErrorKind`], which each front-end maps to its protocol. `None` means success.
//!
//! Durability contract: a committed offset, a group deletion and the group record written when a
//! rebalance completes are acknowledged only after their append to `__consumer_offsets` is
//! fsynced. Classic group membership itself is not persisted: after a restart every classic group
//! is Empty (its members rejoin, as after a coordinator move in Kafka), with its committed
//! offsets, protocol type and generation intact. A consumer-protocol group and a share group
//! are persisted whole (one record, rewritten by every heartbeat that changes it, before the
//! answer), so their members carry on at their epochs.

mod assignor;
pub mod clients;
mod consumer;
mod consumer_api;
mod coordinator;
mod offsets;
mod share;
mod share_api;
mod state;
#[cfg(test)]
mod tests;
mod unstable;

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

pub use coordinator::GroupCoordinator;
pub use share::{
    ShareAssignment, ShareGroupDescription, ShareHeartbeatParams, ShareHeartbeatResult, ShareMemberDescription,
    SHARE_ASSIGNOR,
};
pub use share_api::GROUP_TYPE_SHARE;
pub use weir_broker::error::ErrorKind;

/// The internal topic holding committed offsets and group records.
pub use weir_broker::metadata::OFFSETS_TOPIC;
/// Longest commit metadata string accepted (Kafka's `offset.metadata.max.bytes` default).
pub(crate) const OFFSET_METADATA_MAX_BYTES: usize = 4096;
/// A joining member that never completes its first join is removed after this long (Kafka's
/// `GroupCoordinator.NewMemberJoinTimeoutMs`): its socket is muted while the join waits, so a
/// disconnect cannot be noticed otherwise.
pub(crate) const NEW_MEMBER_JOIN_TIMEOUT_MS: i64 = 300_000;

/// A group's state, with Kafka's names (ListGroups and DescribeGroups send them as strings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupState {
    /// No members; may still hold committed offsets.
    Empty,
    /// Waiting for the members to (re)join.
    PreparingRebalance,
    /// Joined; waiting for the leader's assignment.
    CompletingRebalance,
    Stable,
    /// Being deleted, or never existed (DescribeGroups of an unknown group).
    Dead,
    /// Consumer protocol: the target assignment is behind the group epoch.
    Assigning,
    /// Consumer protocol: some member has not reached the target assignment yet.
    Reconciling,
}

impl GroupState {
    pub fn as_str(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
            GroupState::Dead => "Dead",
            GroupState::Assigning => "Assigning",
            GroupState::Reconciling => "Reconciling",
        }
    }

    /// Parses a state name, ignoring case (ListGroups' states filter).
    pub fn parse(name: &str) -> Option<GroupState> {
        [
            GroupState::Empty,
            GroupState::PreparingRebalance,
            GroupState::CompletingRebalance,
            GroupState::Stable,
            GroupState::Dead,
            GroupState::Assigning,
            GroupState::Reconciling,
        ]
        .into_iter()
        .find(|s| s.as_str().eq_ignore_ascii_case(name))
    }
}

/// The `__consumer_offsets` partition that owns `group_id`: `abs(String.hashCode) % partitions`,
/// as Kafka computes it (Java's hash over UTF-16 code units; `abs(i32::MIN)` is 0).
pub(crate) fn partition_for(group_id: &str, partitions: i32) -> i32 {
    assert!(partitions > 0, "the offsets topic has at least one partition");
    let hash = group_id.encode_utf16().fold(0i32, |h, unit| h.wrapping_mul(31).wrapping_add(i32::from(unit)));
    let abs = if hash == i32::MIN { 0 } else { hash.abs() };
    abs % partitions
}

/// One protocol a joining member supports, in its order of preference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Protocol {
    pub name: String,
    pub metadata: Bytes,
}

#[derive(Debug, Clone)]
pub struct JoinGroupParams {
    pub group_id: String,
    /// Empty for a first join.
    pub member_id: String,
    /// `group.instance.id` of a static member (KIP-345).
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    pub protocols: Vec<Protocol>,
    /// KIP-394 (JoinGroup v4+): a first join without member id gets MEMBER_ID_REQUIRED and a
    /// member id to join with.
    pub require_known_member_id: bool,
    pub reason: Option<String>,
}

/// A member as the leader sees it in its JoinGroup response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinedMember {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    /// The member's metadata for the selected protocol.
    pub metadata: Bytes,
}

#[derive(Debug, Clone)]
pub struct JoinGroupResult {
    pub error: Option<ErrorKind>,
    /// The member's id: generated for a new member (also with MEMBER_ID_REQUIRED).
    pub member_id: String,
    /// `None` with an error.
    pub generation_id: Option<i32>,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    /// Empty with an error.
    pub leader_id: String,
    pub skip_assignment: bool,
    /// Every member with its metadata for the leader; empty for followers.
    pub members: Vec<JoinedMember>,
}

impl JoinGroupResult {
    pub(crate) fn error(member_id: impl Into<String>, code: ErrorKind) -> JoinGroupResult {
        JoinGroupResult {
            error: Some(code),
            member_id: member_id.into(),
            generation_id: None,
            protocol_type: None,
            protocol_name: None,
            leader_id: String::new(),
            skip_assignment: false,
            members: Vec::new(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct SyncGroupParams {
    pub group_id: String,
    pub generation_id: i32,
    pub member_id: String,
    pub group_instance_id: Option<String>,
    /// SyncGroup v5+: checked against the group's when given.
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    /// The leader's assignment, member id → assignment bytes; empty from followers.
    pub assignments: Vec<(String, Bytes)>,
}

#[derive(Debug, Clone)]
pub struct SyncGroupResult {
    pub error: Option<ErrorKind>,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignment: Bytes,
}

impl SyncGroupResult {
    pub(crate) fn error(code: ErrorKind) -> SyncGroupResult {
        SyncGroupResult { error: Some(code), protocol_type: None, protocol_name: None, assignment: Bytes::new() }
    }
}

#[derive(Debug, Clone)]
pub struct HeartbeatParams {
    pub group_id: String,
    pub generation_id: i32,
    pub member_id: String,
    pub group_instance_id: Option<String>,
}

/// A member to remove (LeaveGroup). An empty member id with an instance id removes the static
/// member holding that instance id (administrative removal, KIP-345).
#[derive(Debug, Clone)]
pub struct LeavingMember {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub reason: Option<String>,
}

#[derive(Debug, Clone)]
pub struct LeaveGroupResult {
    /// Group-level error; when set, `members` is empty.
    pub error: Option<ErrorKind>,
    /// One entry per leaving member, in request order.
    pub members: Vec<MemberLeaveResult>,
}

#[derive(Debug, Clone)]
pub struct MemberLeaveResult {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub error: Option<ErrorKind>,
}

#[derive(Debug, Clone)]
pub struct CommitParams {
    pub group_id: String,
    /// The committing member's generation. `None` with an empty member id is a "simple" commit:
    /// a standalone consumer's, outside the group's generations, allowed only while the group
    /// is Empty. `None` with a member id fails as a stale generation would.
    pub generation_id: Option<i32>,
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub offsets: Vec<OffsetToCommit>,
}

#[derive(Debug, Clone)]
pub struct OffsetToCommit {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// The leader epoch the consumer read the offset at, when it knows it.
    pub leader_epoch: Option<i32>,
    /// `None` is stored as the empty string, as Kafka does.
    pub metadata: Option<String>,
}

/// A per-partition outcome, in request order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionResult {
    pub topic: String,
    pub partition: i32,
    pub error: Option<ErrorKind>,
}

/// A committed offset as OffsetFetch returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedOffset {
    pub topic: String,
    pub partition: i32,
    /// `None` when nothing is committed (then `leader_epoch` is `None` and `metadata` empty).
    pub offset: Option<i64>,
    pub leader_epoch: Option<i32>,
    pub metadata: String,
    pub error: Option<ErrorKind>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupListing {
    pub group_id: String,
    /// Empty for a group that only ever had simple commits.
    pub protocol_type: String,
    pub state: GroupState,
    /// "consumer" for a group of the consumer protocol (KIP-848), else "classic".
    pub group_type: &'static str,
}

/// GroupType names of ListGroups v5 and DescribeGroups.
pub const GROUP_TYPE_CLASSIC: &str = "classic";
pub const GROUP_TYPE_CONSUMER: &str = "consumer";

/// A ConsumerGroupHeartbeat (KIP-848). Fields that are `None` are unchanged since the last
/// heartbeat.
#[derive(Debug, Clone)]
pub struct ConsumerHeartbeatParams {
    pub group_id: String,
    /// Empty only in a v0 join, where the broker generates it.
    pub member_id: String,
    /// 0 joins, -1 leaves, -2 leaves for a restart (static members), else the member's epoch.
    pub member_epoch: i32,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    /// -1 when unchanged.
    pub rebalance_timeout_ms: i32,
    pub subscribed_topic_names: Option<Vec<String>>,
    /// `Some("")` clears the member's pattern.
    pub subscribed_topic_regex: Option<String>,
    pub server_assignor: Option<String>,
    /// The partitions the member holds, when it reports them.
    pub owned: Option<BTreeMap<uuid::Uuid, BTreeSet<i32>>>,
    pub client_id: String,
    pub client_host: String,
    /// The request's version (v0 lets the broker generate member ids).
    pub version: i16,
}

#[derive(Debug, Clone)]
pub struct ConsumerHeartbeatResult {
    pub error: Option<ErrorKind>,
    pub member_id: Option<String>,
    pub member_epoch: i32,
    pub heartbeat_interval_ms: i32,
    /// The member's whole assignment, when it changed (or the member asked with its owned
    /// partitions); `None` means unchanged.
    pub assignment: Option<BTreeMap<uuid::Uuid, BTreeSet<i32>>>,
}

impl ConsumerHeartbeatResult {
    pub(crate) fn error(code: ErrorKind) -> ConsumerHeartbeatResult {
        ConsumerHeartbeatResult {
            error: Some(code),
            member_id: None,
            member_epoch: -1,
            heartbeat_interval_ms: 0,
            assignment: None,
        }
    }
}

/// ConsumerGroupDescribe's view of a group.
#[derive(Debug, Clone)]
pub struct ConsumerGroupDescription {
    pub group_id: String,
    pub error: Option<ErrorKind>,
    pub state: GroupState,
    pub group_epoch: i32,
    pub assignment_epoch: i32,
    pub assignor_name: String,
    pub members: Vec<ConsumerMemberDescription>,
}

#[derive(Debug, Clone)]
pub struct ConsumerMemberDescription {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub member_epoch: i32,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topic_names: Vec<String>,
    pub subscribed_topic_regex: Option<String>,
    /// (topic id, topic name, partitions).
    pub assignment: Vec<(uuid::Uuid, String, Vec<i32>)>,
    pub target_assignment: Vec<(uuid::Uuid, String, Vec<i32>)>,
}

/// A group's committed offsets, copied for metrics (consumer lag is computed from them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GroupOffsets {
    pub(crate) group_id: String,
    pub(crate) state: GroupState,
    /// (topic, partition, committed offset), sorted.
    pub(crate) offsets: Vec<(String, i32, i64)>,
}

#[derive(Debug, Clone)]
pub struct GroupDescription {
    pub group_id: String,
    pub error: Option<ErrorKind>,
    /// `Dead` for a group that does not exist.
    pub state: GroupState,
    pub protocol_type: String,
    /// The selected protocol while Stable, else empty.
    pub protocol_data: String,
    pub members: Vec<MemberDescription>,
    /// A consumer-protocol group's epochs and assignments (KIP-848); `None` for classic groups.
    pub consumer: Option<ConsumerGroupDescription>,
}

#[derive(Debug, Clone)]
pub struct MemberDescription {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    /// Metadata for the selected protocol and the current assignment: only while Stable (as
    /// Kafka), else empty.
    pub metadata: Bytes,
    pub assignment: Bytes,
}

#[cfg(test)]
mod unit_tests {
    use super::*;

    #[test]
    fn partition_for_matches_java_string_hash_code() {
        // "my-group".hashCode() == -1906497762 in Java; 1906497762 % 50 == 12.
        assert_eq!(partition_for("my-group", 50), 12);
        assert_eq!(partition_for("", 50), 0);
        // "polygenelubricants".hashCode() == Integer.MIN_VALUE; Kafka's Utils.abs maps it to 0.
        assert_eq!(partition_for("polygenelubricants", 50), 0);
        // A non-BMP character hashes as its two UTF-16 surrogates: "😀" = \uD83D\uDE00,
        // 0xD83D * 31 + 0xDE00 = 1772899.
        assert_eq!(partition_for("😀", 1_000_000_007), 1_772_899);
    }

    #[test]
    fn state_names_round_trip_ignoring_case() {
        for state in
            [GroupState::Empty, GroupState::PreparingRebalance, GroupState::CompletingRebalance, GroupState::Stable]
        {
            assert_eq!(GroupState::parse(&state.as_str().to_lowercase()), Some(state));
        }
        assert_eq!(GroupState::parse("Unknown"), None);
    }
}
