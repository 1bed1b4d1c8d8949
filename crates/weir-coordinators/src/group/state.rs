//! One classic group's state machine: Kafka's `GroupMetadata` plus the parts of its
//! `GroupCoordinator` that touch only one group. Pure and synchronous: no I/O, no locks, the
//! time passed in. The coordinator keeps every group under one mutex, calls these methods, and
//! appends to `__consumer_offsets` outside that mutex.
//!
//! States and transitions (Kafka's):
//! ```text
//! Empty ──join──► PreparingRebalance ──all joined / rebalance timeout──► CompletingRebalance
//!   ▲                  ▲        │ (no member left: Empty)                 │ leader's SyncGroup stored
//!   │                  │        ▼                                         ▼
//!   │                  └──── join, leave, expiry, metadata change ─── Stable
//!   └── delete / offsets expired ──► Dead (removed)
//! ```
//! Replies to JoinGroup and SyncGroup travel through one-shot channels held by the member
//! (`join_waiter`, `sync_waiter`): a reply is sent exactly when Kafka would invoke the response
//! callback, which may be long after the request arrived.
//!
//! Invariants (checked by `check_invariants` each time the coordinator lets go of the groups,
//! in debug builds):
//! - `leader` is `Some` exactly when there are members, and names one of them.
//! - `static_members` maps each instance id to the member holding it, and only those.
//! - A member awaiting a join reply exists only while the group is PreparingRebalance (or, for a
//!   superseded join, is answered at once); a member awaiting a sync reply only while
//!   CompletingRebalance.
//! - `join_deadline_ms` is set exactly while PreparingRebalance.

use std::collections::{BTreeMap, HashMap, HashSet};

use bytes::{Buf, Bytes};
use kafka_protocol::messages::ConsumerProtocolSubscription;
use kafka_protocol::protocol::Decodable;
use tokio::sync::oneshot;
use uuid::Uuid;
use weir_broker::config::MigrationPolicy;

use super::consumer::{ClassicMember, ClassicSeed, ConsumerGroup};
use super::consumer_api::encode_subscription;
use super::offsets::{GroupRecord, LoadedGroup};
use super::{
    ErrorKind, GroupDescription, GroupState, HeartbeatParams, JoinGroupParams, JoinGroupResult, JoinedMember,
    LeaveGroupResult, LeavingMember, MemberDescription, MemberLeaveResult, Protocol, SyncGroupParams, SyncGroupResult,
    NEW_MEMBER_JOIN_TIMEOUT_MS,
};

pub(crate) type JoinTx = oneshot::Sender<JoinGroupResult>;
pub(crate) type SyncTx = oneshot::Sender<SyncGroupResult>;

/// The broker settings a group obeys.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) initial_rebalance_delay_ms: i64,
    pub(crate) max_size: usize,
    /// `group.consumer.migration.policy`: whether a running group may change protocol.
    pub(crate) migration: MigrationPolicy,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CommittedOffset {
    pub(crate) offset: i64,
    pub(crate) leader_epoch: Option<i32>,
    pub(crate) metadata: String,
    pub(crate) commit_timestamp_ms: i64,
}

pub(crate) struct Member {
    pub(crate) member_id: String,
    pub(crate) group_instance_id: Option<String>,
    pub(crate) client_id: String,
    pub(crate) client_host: String,
    pub(crate) session_timeout_ms: i32,
    pub(crate) rebalance_timeout_ms: i32,
    pub(crate) protocol_type: String,
    pub(crate) protocols: Vec<Protocol>,
    pub(crate) assignment: Bytes,
    join_waiter: Option<JoinTx>,
    sync_waiter: Option<SyncTx>,
    /// Added in the current rebalance and not yet given a generation. A new member cannot
    /// heartbeat, so it is kept only NEW_MEMBER_JOIN_TIMEOUT_MS.
    is_new: bool,
    /// The member is removed when this passes without a heartbeat, unless it waits in a
    /// rebalance (see `expired`).
    session_deadline_ms: i64,
}

impl Member {
    fn awaiting_join(&self) -> bool {
        self.join_waiter.is_some()
    }

    fn awaiting_sync(&self) -> bool {
        self.sync_waiter.is_some()
    }

    fn metadata_for(&self, protocol: &str) -> Bytes {
        self.protocols.iter().find(|p| p.name == protocol).map(|p| p.metadata.clone()).unwrap_or_default()
    }

    fn supports(&self, protocol: &str) -> bool {
        self.protocols.iter().any(|p| p.name == protocol)
    }

    fn reply_join(&mut self, result: JoinGroupResult) -> bool {
        match self.join_waiter.take() {
            Some(tx) => {
                // The requester may be gone (connection closed); nothing to do then.
                let _ = tx.send(result);
                true
            }
            None => false,
        }
    }

    fn reply_sync(&mut self, result: SyncGroupResult) -> bool {
        match self.sync_waiter.take() {
            Some(tx) => {
                let _ = tx.send(result);
                true
            }
            None => false,
        }
    }

    /// A heartbeat (or anything that proves the member alive) restarts its session.
    fn touch(&mut self, now_ms: i64) {
        if !self.is_new {
            self.session_deadline_ms = now_ms + i64::from(self.session_timeout_ms);
        }
    }

    /// Members waiting in a rebalance are alive by definition, except new members whose first
    /// join never completes.
    fn can_expire(&self) -> bool {
        self.is_new || !(self.awaiting_join() || self.awaiting_sync())
    }

    fn expired(&self, now_ms: i64) -> bool {
        now_ms >= self.session_deadline_ms && self.can_expire()
    }
}

/// What a SyncGroup leaves for the coordinator to do.
pub(crate) enum SyncOutcome {
    Done,
    /// The leader sent the assignment of `generation`: store the group record, then call
    /// [`Group::complete_sync`].
    Store {
        generation: i32,
        assignments: HashMap<String, Bytes>,
    },
}

pub(crate) struct Group {
    pub(crate) id: String,
    pub(crate) state: GroupState,
    /// Set by the first member to join; kept while Empty (ListGroups shows it).
    pub(crate) protocol_type: Option<String>,
    /// The protocol selected for the current generation; `None` while Empty.
    pub(crate) protocol_name: Option<String>,
    pub(crate) generation: i32,
    leader: Option<String>,
    /// By member id (so the leader's member list comes out in a stable order).
    members: BTreeMap<String, Member>,
    /// group.instance.id → the member id holding it.
    static_members: HashMap<String, String>,
    /// KIP-394: member ids handed out with MEMBER_ID_REQUIRED and not joined yet, with the time
    /// they are forgotten. They hold up the join phase like members that have not rejoined.
    pending_members: HashMap<String, i64>,
    /// Members of the current generation that have not sent SyncGroup yet; removed (and the
    /// group rebalanced) if still there at `sync_deadline_ms`.
    pending_sync: HashSet<String>,
    sync_deadline_ms: Option<i64>,
    /// End of the join phase (rebalance timeout, or the initial delay of an Empty group).
    join_deadline_ms: Option<i64>,
    /// While the first rebalance of an Empty group waits `group.initial.rebalance.delay.ms` for
    /// more members: how much of the rebalance timeout is left to extend that wait.
    initial_delay_remaining_ms: Option<i64>,
    /// A member joined during the initial delay of a new group: wait another delay.
    new_member_added: bool,
    /// Topics the members subscribe to (consumer protocol), for OffsetDelete; `None` when
    /// unknown (then every topic counts as subscribed).
    subscribed_topics: Option<HashSet<String>>,
    pub(crate) offsets: HashMap<(String, i32), CommittedOffset>,
    /// When the group last became Empty: committed offsets of an Empty group expire
    /// `offsets.retention.minutes` after this or their commit, whichever is later.
    pub(crate) empty_since_ms: i64,
    /// A group record of this group is in the log (deleting the group needs a tombstone).
    pub(crate) persisted: bool,
    /// Set while the group is a consumer-protocol group (KIP-848): its members, epochs and
    /// assignment. Then the classic fields above have no members, and `state` mirrors the
    /// consumer group's state (see `sync_consumer_state`).
    pub(crate) consumer: Option<ConsumerGroup>,
    /// The group was a consumer-protocol group whose record is still in the log: the next
    /// classic group record goes with a tombstone for it, so a reload finds a classic group.
    pub(crate) stale_consumer_record: bool,
}

impl Group {
    pub(crate) fn new(id: String, now_ms: i64) -> Group {
        Group {
            id,
            state: GroupState::Empty,
            protocol_type: None,
            protocol_name: None,
            generation: 0,
            leader: None,
            members: BTreeMap::new(),
            static_members: HashMap::new(),
            pending_members: HashMap::new(),
            pending_sync: HashSet::new(),
            sync_deadline_ms: None,
            join_deadline_ms: None,
            initial_delay_remaining_ms: None,
            new_member_added: false,
            subscribed_topics: None,
            offsets: HashMap::new(),
            empty_since_ms: now_ms,
            persisted: false,
            consumer: None,
            stale_consumer_record: false,
        }
    }

    /// A group as the log left it: Empty, its members gone.
    pub(crate) fn from_loaded(id: String, loaded: LoadedGroup) -> Group {
        let mut group = Group::new(id, 0);
        if let Some(record) = loaded.record {
            group.generation = record.generation;
            group.protocol_type = Some(record.protocol_type);
            // The group was last seen non-empty when this record was written; committed offsets
            // of its members are more recent if they still consumed.
            group.empty_since_ms = record.timestamp_ms;
            group.persisted = true;
        }
        group.offsets = loaded.offsets;
        group
    }

    /// The record stored when a rebalance completes.
    pub(crate) fn record(&self, now_ms: i64) -> GroupRecord {
        GroupRecord {
            generation: self.generation,
            protocol_type: self.protocol_type.clone().unwrap_or_default(),
            protocol_name: self.protocol_name.clone(),
            timestamp_ms: now_ms,
        }
    }

    /// Nothing left to keep: no members, no pending members, no offsets.
    pub(crate) fn is_vacant(&self) -> bool {
        self.state == GroupState::Empty
            && self.members.is_empty()
            && self.consumer.as_ref().is_none_or(ConsumerGroup::is_empty)
            && self.pending_members.is_empty()
            && self.offsets.is_empty()
    }

    pub(crate) fn has_members(&self) -> bool {
        !self.members.is_empty() || self.consumer.as_ref().is_some_and(|c| !c.is_empty())
    }

    pub(crate) fn is_consumer_group(&self) -> bool {
        self.protocol_type.as_deref() == Some("consumer")
    }

    pub(crate) fn is_subscribed_to(&self, topic: &str) -> bool {
        if let Some(consumer) = &self.consumer {
            return consumer.subscribed_names().contains(topic);
        }
        self.subscribed_topics.as_ref().is_none_or(|topics| topics.contains(topic))
    }

    /// Hands a Stable classic group of consumers over to the consumer protocol: its members,
    /// each with its subscription and current assignment, and the generation. `None` (and the
    /// group untouched) unless it is Stable, of protocol type `consumer`, and every member's
    /// subscription and assignment decode.
    pub(crate) fn take_members_for_migration(&mut self) -> Option<(i32, Vec<ClassicSeed>)> {
        if self.state != GroupState::Stable || !self.is_consumer_group() || !self.pending_sync.is_empty() {
            return None;
        }
        let protocol = self.protocol_name.clone()?;
        let mut seeds = Vec::with_capacity(self.members.len());
        for m in self.members.values() {
            let (subscribed, _) = decode_subscription(&m.metadata_for(&protocol))?;
            let assigned = decode_assignment(&m.assignment)?;
            seeds.push(ClassicSeed {
                member_id: m.member_id.clone(),
                instance_id: m.group_instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                rebalance_timeout_ms: m.rebalance_timeout_ms,
                classic: ClassicMember {
                    session_timeout_ms: m.session_timeout_ms,
                    protocol_names: m.protocols.iter().map(|p| p.name.clone()).collect(),
                },
                subscribed,
                assigned,
            });
        }
        self.members.clear();
        self.static_members.clear();
        self.leader = None;
        self.pending_members.clear();
        self.sync_deadline_ms = None;
        Some((self.generation, seeds))
    }

    /// Kafka 4's online downgrade: a consumer group left with classic members only (its last
    /// consumer-protocol member left or was fenced) becomes a classic group again when
    /// `group.consumer.migration.policy` allows downgrades. The members keep their ids and
    /// sessions and are made to rejoin (a classic group's leader computes the assignment);
    /// committed offsets stay. Returns whether it converted.
    pub(crate) fn downgrade_if_only_classic(&mut self, now_ms: i64, limits: &Limits) -> bool {
        if !limits.migration.downgrades() {
            return false;
        }
        let Some(consumer) = &self.consumer else { return false };
        let Some(seeds) = consumer.classic_members_only() else { return false };
        if seeds.len() > limits.max_size {
            return false;
        }
        let generation = consumer.group_epoch;
        self.stale_consumer_record |= consumer.persisted_value.is_some();
        self.consumer = None;
        self.members.clear();
        self.static_members.clear();
        self.pending_members.clear();
        self.pending_sync.clear();
        self.generation = generation;
        self.protocol_type = Some("consumer".to_string());
        // The protocol every member has, in the first member's order of preference.
        self.protocol_name = seeds.first().and_then(|first| {
            first
                .classic
                .protocol_names
                .iter()
                .find(|name| seeds.iter().all(|s| s.classic.protocol_names.contains(name)))
                .cloned()
        });
        let mut subscribed = HashSet::new();
        for seed in seeds {
            let metadata = encode_subscription(&seed.subscribed, None);
            subscribed.extend(seed.subscribed.iter().cloned());
            if let Some(instance) = &seed.instance_id {
                self.static_members.insert(instance.clone(), seed.member_id.clone());
            }
            let protocols = seed
                .classic
                .protocol_names
                .iter()
                .map(|name| Protocol { name: name.clone(), metadata: metadata.clone() })
                .collect();
            self.members.insert(
                seed.member_id.clone(),
                Member {
                    member_id: seed.member_id,
                    group_instance_id: seed.instance_id,
                    client_id: seed.client_id,
                    client_host: seed.client_host,
                    session_timeout_ms: seed.classic.session_timeout_ms,
                    rebalance_timeout_ms: seed.rebalance_timeout_ms,
                    protocol_type: "consumer".to_string(),
                    protocols,
                    assignment: Bytes::new(),
                    join_waiter: None,
                    sync_waiter: None,
                    is_new: false,
                    session_deadline_ms: now_ms + i64::from(seed.classic.session_timeout_ms),
                },
            );
        }
        self.subscribed_topics = Some(subscribed);
        self.leader = self.members.keys().next().cloned();
        tracing::info!(group = %self.id, members = self.members.len(), generation, "converting a consumer group to the classic protocol");
        self.state = GroupState::Stable;
        self.prepare_rebalance(now_ms, limits, "downgraded to the classic protocol");
        true
    }

    /// Makes `state` follow the consumer group's (after any change to it).
    pub(crate) fn sync_consumer_state(&mut self, now_ms: i64) {
        if let Some(consumer) = &self.consumer {
            let state = consumer.state();
            if state == GroupState::Empty && self.state != GroupState::Empty {
                self.empty_since_ms = now_ms;
            }
            if self.state != GroupState::Dead {
                self.state = state;
            }
        }
    }

    fn num_awaiting_join(&self) -> usize {
        self.members.values().filter(|m| m.awaiting_join()).count()
    }

    fn all_members_joined(&self) -> bool {
        self.pending_members.is_empty() && self.members.values().all(Member::awaiting_join)
    }

    fn rebalance_timeout_ms(&self) -> i64 {
        self.members.values().map(|m| i64::from(m.rebalance_timeout_ms)).max().unwrap_or(0)
    }

    fn is_static_member_fenced(&self, group_instance_id: Option<&str>, member_id: &str) -> bool {
        group_instance_id
            .and_then(|instance| self.static_members.get(instance))
            .is_some_and(|holder| holder != member_id)
    }

    /// Kafka's `validateCurrentMember`: the instance id, if given, must map to `member_id`,
    /// and `member_id` must be a member.
    fn validate_current_member(&self, member_id: &str, group_instance_id: Option<&str>) -> Result<(), ErrorKind> {
        if self.is_static_member_fenced(group_instance_id, member_id) {
            return Err(ErrorKind::FencedInstance);
        }
        if !self.members.contains_key(member_id) {
            return Err(ErrorKind::UnknownMember);
        }
        Ok(())
    }

    /// Whether a joining member would fit under `group.max.size` (Kafka's
    /// `acceptJoiningMember`). Counting the members awaiting a join while PreparingRebalance
    /// means the last members to rejoin are the ones turned away when the limit was lowered.
    fn accept_joining_member(&self, member_id: &str, max_size: usize) -> bool {
        match self.state {
            GroupState::Empty | GroupState::Dead | GroupState::Assigning | GroupState::Reconciling => true,
            GroupState::PreparingRebalance => {
                self.members.get(member_id).is_some_and(Member::awaiting_join) || self.num_awaiting_join() < max_size
            }
            GroupState::CompletingRebalance | GroupState::Stable => {
                self.members.contains_key(member_id) || self.members.len() < max_size
            }
        }
    }

    /// An Empty group accepts any non-empty protocol list; otherwise the protocol type must
    /// match and one of the protocols must be supported by every member.
    fn supports_protocols(&self, protocol_type: &str, protocols: &[Protocol]) -> bool {
        if self.state == GroupState::Empty {
            return !protocol_type.is_empty() && !protocols.is_empty();
        }
        self.protocol_type.as_deref() == Some(protocol_type)
            && protocols.iter().any(|p| self.members.values().all(|m| m.supports(&p.name)))
    }

    /// The protocol for the next generation: among the protocols every member supports, each
    /// member votes for the one it prefers most; most votes wins, ties go to the leader's
    /// preference order.
    fn select_protocol(&self) -> Option<String> {
        let reference =
            self.leader.as_ref().and_then(|id| self.members.get(id)).or_else(|| self.members.values().next())?;
        let candidates: Vec<&str> = reference
            .protocols
            .iter()
            .map(|p| p.name.as_str())
            .filter(|name| self.members.values().all(|m| m.supports(name)))
            .collect();
        let mut votes = vec![0usize; candidates.len()];
        for member in self.members.values() {
            if let Some(i) = member.protocols.iter().find_map(|p| candidates.iter().position(|c| *c == p.name)) {
                votes[i] += 1;
            }
        }
        let mut best: Option<usize> = None;
        for (i, count) in votes.iter().enumerate() {
            if best.is_none_or(|b| *count > votes[b]) {
                best = Some(i);
            }
        }
        best.map(|i| candidates[i].to_string())
    }

    /// The consumer protocol's subscriptions: every version starts with the v0 layout
    /// (version, topics), so v0 decodes them all (as Kafka does).
    fn compute_subscribed_topics(&self) -> Option<HashSet<String>> {
        let protocol = self.protocol_name.as_deref()?;
        if !self.is_consumer_group() || self.members.is_empty() {
            return None;
        }
        let mut topics = HashSet::new();
        for member in self.members.values() {
            let mut buf = member.metadata_for(protocol);
            if buf.len() < 2 {
                return None;
            }
            buf.advance(2); // the version: v0 is a prefix of every version
            match ConsumerProtocolSubscription::decode(&mut buf, 0) {
                Ok(subscription) => topics.extend(subscription.topics.iter().map(|t| t.to_string())),
                Err(e) => {
                    tracing::warn!(group = %self.id, member = %member.member_id, error = %e, "cannot decode a consumer subscription");
                    return None;
                }
            }
        }
        Some(topics)
    }

    fn join_result_for(&self, member_id: &str) -> JoinGroupResult {
        let is_leader = self.leader.as_deref() == Some(member_id);
        JoinGroupResult {
            error: None,
            member_id: member_id.to_string(),
            generation_id: Some(self.generation),
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol_name.clone(),
            leader_id: self.leader.clone().unwrap_or_default(),
            skip_assignment: false,
            members: if is_leader { self.current_member_metadata() } else { Vec::new() },
        }
    }

    fn current_member_metadata(&self) -> Vec<JoinedMember> {
        let protocol = self.protocol_name.as_deref().unwrap_or("");
        self.members
            .values()
            .map(|m| JoinedMember {
                member_id: m.member_id.clone(),
                group_instance_id: m.group_instance_id.clone(),
                metadata: m.metadata_for(protocol),
            })
            .collect()
    }

    // ----- membership ---------------------------------------------------------------------

    fn add_member(&mut self, member: Member) {
        if self.members.is_empty() {
            self.protocol_type = Some(member.protocol_type.clone());
        }
        if self.leader.is_none() {
            self.leader = Some(member.member_id.clone());
        }
        if let Some(instance) = &member.group_instance_id {
            self.static_members.insert(instance.clone(), member.member_id.clone());
        }
        self.pending_members.remove(&member.member_id);
        self.members.insert(member.member_id.clone(), member);
    }

    /// Removes a member (or a pending member), answering its waiting requests with `code`.
    /// Returns whether it was a member.
    fn remove_member(&mut self, member_id: &str, code: ErrorKind) -> bool {
        self.pending_members.remove(member_id);
        self.pending_sync.remove(member_id);
        let Some(mut member) = self.members.remove(member_id) else { return false };
        member.reply_join(JoinGroupResult::error(member_id, code));
        member.reply_sync(SyncGroupResult::error(code));
        if let Some(instance) = &member.group_instance_id {
            if self.static_members.get(instance).map(String::as_str) == Some(member_id) {
                self.static_members.remove(instance);
            }
        }
        if self.leader.as_deref() == Some(member_id) {
            self.leader = self.members.keys().next().cloned();
        }
        true
    }

    /// Removes a member and rebalances the rest (Kafka's `removeMemberAndUpdateGroup`); in
    /// PreparingRebalance the join phase may now be complete, which `poll` notices.
    fn remove_member_and_update(&mut self, member_id: &str, now_ms: i64, limits: &Limits, why: &str) {
        if self.remove_member(member_id, ErrorKind::UnknownMember) {
            tracing::info!(group = %self.id, member = member_id, why, "member removed");
            if matches!(self.state, GroupState::Stable | GroupState::CompletingRebalance) {
                self.prepare_rebalance(now_ms, limits, why);
            }
        }
    }

    /// Hands `old_member_id`'s place (assignment, leadership) to `new_member_id`; requests the
    /// old id still waits on are answered FENCED_INSTANCE_ID.
    fn replace_static_member(&mut self, instance: &str, old_member_id: &str, new_member_id: &str) {
        let Some(mut member) = self.members.remove(old_member_id) else { return };
        member.reply_join(JoinGroupResult::error(old_member_id, ErrorKind::FencedInstance));
        member.reply_sync(SyncGroupResult::error(ErrorKind::FencedInstance));
        member.member_id = new_member_id.to_string();
        self.members.insert(new_member_id.to_string(), member);
        if self.leader.as_deref() == Some(old_member_id) {
            self.leader = Some(new_member_id.to_string());
        }
        if self.pending_sync.remove(old_member_id) {
            self.pending_sync.insert(new_member_id.to_string());
        }
        self.static_members.insert(instance.to_string(), new_member_id.to_string());
    }

    /// New protocols, timeouts and join request of an existing member. A join still waiting from
    /// the same member is superseded: it is answered REBALANCE_IN_PROGRESS so the (probably
    /// departed) requester rejoins if it is still there.
    fn update_member(&mut self, member_id: &str, params: &JoinGroupParams, reply: JoinTx) {
        let Some(member) = self.members.get_mut(member_id) else {
            let _ = reply.send(JoinGroupResult::error(member_id, ErrorKind::UnknownMember));
            return;
        };
        member.protocols = params.protocols.clone();
        member.rebalance_timeout_ms = params.rebalance_timeout_ms;
        member.session_timeout_ms = params.session_timeout_ms;
        if let Some(old) = member.join_waiter.replace(reply) {
            let _ = old.send(JoinGroupResult::error(member_id, ErrorKind::RebalanceInProgress));
        }
    }

    // ----- rebalancing --------------------------------------------------------------------

    fn maybe_prepare_rebalance(&mut self, now_ms: i64, limits: &Limits, why: &str) {
        if matches!(self.state, GroupState::Stable | GroupState::CompletingRebalance | GroupState::Empty) {
            self.prepare_rebalance(now_ms, limits, why);
        }
    }

    fn prepare_rebalance(&mut self, now_ms: i64, limits: &Limits, why: &str) {
        if self.state == GroupState::CompletingRebalance {
            self.reset_and_propagate_assignment_error(ErrorKind::RebalanceInProgress, now_ms);
        }
        self.sync_deadline_ms = None;
        self.pending_sync.clear();
        if self.state == GroupState::Empty {
            let delay = limits.initial_rebalance_delay_ms;
            self.initial_delay_remaining_ms = Some((self.rebalance_timeout_ms() - delay).max(0));
            self.join_deadline_ms = Some(now_ms + delay);
        } else {
            self.initial_delay_remaining_ms = None;
            self.join_deadline_ms = Some(now_ms + self.rebalance_timeout_ms());
        }
        tracing::info!(group = %self.id, generation = self.generation, from = self.state.as_str(), why, "preparing to rebalance");
        self.state = GroupState::PreparingRebalance;
    }

    /// Ends the join phase: members that did not rejoin leave (static members stay: they may
    /// come back without a rebalance), a leader that did not rejoin is replaced, and every
    /// joined member gets the new generation.
    fn complete_join(&mut self, now_ms: i64) {
        self.join_deadline_ms = None;
        self.initial_delay_remaining_ms = None;
        let not_rejoined: Vec<String> = self
            .members
            .values()
            .filter(|m| !m.awaiting_join() && m.group_instance_id.is_none())
            .map(|m| m.member_id.clone())
            .collect();
        for member_id in not_rejoined {
            tracing::info!(group = %self.id, member = %member_id, "removing a member that did not rejoin in time");
            self.remove_member(&member_id, ErrorKind::UnknownMember);
        }
        if self.state == GroupState::Dead {
            return;
        }
        if !self.maybe_elect_new_joined_leader() && !self.members.is_empty() {
            // Only static members that have not rejoined are left: wait for them another
            // rebalance timeout (their sessions expire meanwhile if they are gone).
            self.join_deadline_ms = Some(now_ms + self.rebalance_timeout_ms());
            return;
        }
        self.init_next_generation(now_ms);
        if self.state == GroupState::Empty {
            tracing::info!(group = %self.id, generation = self.generation, "group is now empty");
            return;
        }
        tracing::info!(
            group = %self.id,
            generation = self.generation,
            members = self.members.len(),
            protocol = self.protocol_name.as_deref().unwrap_or(""),
            "join phase complete"
        );
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in ids {
            let result = self.join_result_for(&id);
            if let Some(member) = self.members.get_mut(&id) {
                member.reply_join(result);
                member.is_new = false;
                member.touch(now_ms);
            }
        }
        self.sync_deadline_ms = Some(now_ms + self.rebalance_timeout_ms());
    }

    fn maybe_elect_new_joined_leader(&mut self) -> bool {
        let Some(leader) = &self.leader else { return false };
        if self.members.get(leader).is_some_and(Member::awaiting_join) {
            return true;
        }
        match self.members.values().find(|m| m.awaiting_join()) {
            Some(joined) => {
                self.leader = Some(joined.member_id.clone());
                true
            }
            None => false,
        }
    }

    fn init_next_generation(&mut self, now_ms: i64) {
        self.generation += 1;
        if self.members.is_empty() {
            self.protocol_name = None;
            self.subscribed_topics = None;
            self.state = GroupState::Empty;
            self.empty_since_ms = now_ms;
            self.pending_sync.clear();
        } else {
            self.protocol_name = self.select_protocol();
            if self.protocol_name.is_none() {
                // supports_protocols keeps one protocol common to all members; not reachable.
                tracing::error!(group = %self.id, "no protocol common to all members");
            }
            self.subscribed_topics = self.compute_subscribed_topics();
            self.state = GroupState::CompletingRebalance;
            self.pending_sync = self.members.keys().cloned().collect();
        }
    }

    fn reset_and_propagate_assignment_error(&mut self, code: ErrorKind, now_ms: i64) {
        for member in self.members.values_mut() {
            member.assignment = Bytes::new();
            if member.reply_sync(SyncGroupResult::error(code)) {
                member.touch(now_ms);
            }
        }
    }

    fn set_and_propagate_assignment(&mut self, assignments: &HashMap<String, Bytes>, now_ms: i64) {
        let protocol_type = self.protocol_type.clone();
        let protocol_name = self.protocol_name.clone();
        for member in self.members.values_mut() {
            member.assignment = assignments.get(&member.member_id).cloned().unwrap_or_default();
            let result = SyncGroupResult {
                error: None,
                protocol_type: protocol_type.clone(),
                protocol_name: protocol_name.clone(),
                assignment: member.assignment.clone(),
            };
            // Restart the session of members that waited: their expiry was suspended meanwhile.
            if member.reply_sync(result) {
                member.touch(now_ms);
            }
        }
    }

    // ----- requests -----------------------------------------------------------------------

    /// JoinGroup (Kafka's `handleJoinGroup` once the group exists). The reply goes to `reply`,
    /// at once or when the join phase completes.
    pub(crate) fn join(&mut self, params: JoinGroupParams, reply: JoinTx, now_ms: i64, limits: &Limits) {
        if let Some(consumer) = &self.consumer {
            if !consumer.is_empty() {
                // Kafka answers a classic member of a (non-empty) consumer group so.
                let _ = reply.send(JoinGroupResult::error(params.member_id, ErrorKind::InconsistentGroupProtocol));
                return;
            }
            // An empty consumer group becomes a classic group again (whatever the migration
            // policy), keeping its committed offsets.
            self.stale_consumer_record |= consumer.persisted_value.is_some();
            self.consumer = None;
            self.state = GroupState::Empty;
        }
        // A restarting static member takes its own place back, so it never counts as one more.
        let known_instance =
            params.group_instance_id.as_ref().is_some_and(|instance| self.static_members.contains_key(instance));
        if !known_instance && !self.accept_joining_member(&params.member_id, limits.max_size) {
            let member_id = params.member_id.clone();
            self.remove_member_and_update(&member_id, now_ms, limits, "the group is full");
            let _ = reply.send(JoinGroupResult::error("", ErrorKind::GroupFull));
        } else if params.member_id.is_empty() {
            self.join_new_member(params, reply, now_ms, limits);
        } else {
            self.join_current_member(params, reply, now_ms, limits);
        }
        self.poll(now_ms, limits);
    }

    fn join_new_member(&mut self, params: JoinGroupParams, reply: JoinTx, now_ms: i64, limits: &Limits) {
        if self.state == GroupState::Dead {
            let _ = reply.send(JoinGroupResult::error("", ErrorKind::CoordinatorNotAvailable));
            return;
        }
        if !self.supports_protocols(&params.protocol_type, &params.protocols) {
            let _ = reply.send(JoinGroupResult::error("", ErrorKind::InconsistentGroupProtocol));
            return;
        }
        let prefix = params.group_instance_id.as_deref().unwrap_or(&params.client_id);
        let new_member_id = format!("{prefix}-{}", Uuid::new_v4());
        match params.group_instance_id.clone() {
            Some(instance) => match self.static_members.get(&instance).cloned() {
                Some(old_member_id) => {
                    self.update_static_member(&instance, &old_member_id, new_member_id, params, reply, now_ms, limits);
                }
                None => self.add_member_and_rebalance(new_member_id, params, reply, now_ms, limits),
            },
            None if params.require_known_member_id => {
                // KIP-394: the member learns its id first, so a join that times out on the
                // client does not leave an orphan member behind.
                let deadline = now_ms + i64::from(params.session_timeout_ms);
                self.pending_members.insert(new_member_id.clone(), deadline);
                let _ = reply.send(JoinGroupResult::error(new_member_id, ErrorKind::MemberIdRequired));
            }
            None => self.add_member_and_rebalance(new_member_id, params, reply, now_ms, limits),
        }
    }

    fn join_current_member(&mut self, params: JoinGroupParams, reply: JoinTx, now_ms: i64, limits: &Limits) {
        let member_id = params.member_id.clone();
        let instance = params.group_instance_id.as_deref();
        let error = |code| JoinGroupResult::error(member_id.clone(), code);
        if self.state == GroupState::Dead {
            let _ = reply.send(error(ErrorKind::CoordinatorNotAvailable));
        } else if !self.supports_protocols(&params.protocol_type, &params.protocols) {
            let _ = reply.send(error(ErrorKind::InconsistentGroupProtocol));
        } else if self.pending_members.contains_key(&member_id) {
            if instance.is_some() {
                // Pending ids are only handed to dynamic members.
                self.pending_members.remove(&member_id);
                let _ = reply.send(error(ErrorKind::UnknownMember));
            } else {
                self.add_member_and_rebalance(member_id.clone(), params, reply, now_ms, limits);
            }
        } else if self.is_static_member_fenced(instance, &member_id) {
            let _ = reply.send(error(ErrorKind::FencedInstance));
        } else if !self.members.contains_key(&member_id)
            || instance.is_some_and(|i| !self.static_members.contains_key(i))
        {
            let _ = reply.send(error(ErrorKind::UnknownMember));
        } else {
            let is_leader = self.leader.as_deref() == Some(member_id.as_str());
            let unchanged = self.members.get(&member_id).is_some_and(|m| m.protocols == params.protocols);
            match self.state {
                GroupState::PreparingRebalance => {
                    self.update_member(&member_id, &params, reply);
                }
                GroupState::CompletingRebalance if unchanged => {
                    // A repeated join (the first reply was lost): the current generation again.
                    let _ = reply.send(self.join_result_for(&member_id));
                }
                GroupState::Stable if unchanged && !is_leader => {
                    // A follower without changes may simply sync again.
                    let _ = reply.send(self.join_result_for(&member_id));
                }
                GroupState::CompletingRebalance | GroupState::Stable => {
                    // Changed metadata, or the leader asking for a rebalance (e.g. the topics it
                    // subscribes to by pattern changed).
                    self.update_member(&member_id, &params, reply);
                    let why = if is_leader { "the leader rejoined" } else { "a member's metadata changed" };
                    self.maybe_prepare_rebalance(now_ms, limits, why);
                }
                GroupState::Empty | GroupState::Dead | GroupState::Assigning | GroupState::Reconciling => {
                    let _ = reply.send(error(ErrorKind::UnknownMember));
                }
            }
        }
    }

    fn add_member_and_rebalance(
        &mut self,
        member_id: String,
        params: JoinGroupParams,
        reply: JoinTx,
        now_ms: i64,
        limits: &Limits,
    ) {
        if self.state == GroupState::PreparingRebalance && self.generation == 0 {
            self.new_member_added = true;
        }
        self.add_member(Member {
            member_id: member_id.clone(),
            group_instance_id: params.group_instance_id,
            client_id: params.client_id,
            client_host: params.client_host,
            session_timeout_ms: params.session_timeout_ms,
            rebalance_timeout_ms: params.rebalance_timeout_ms,
            protocol_type: params.protocol_type,
            protocols: params.protocols,
            assignment: Bytes::new(),
            join_waiter: Some(reply),
            sync_waiter: None,
            is_new: true,
            session_deadline_ms: now_ms + NEW_MEMBER_JOIN_TIMEOUT_MS,
        });
        tracing::info!(group = %self.id, member = %member_id, "member joining");
        self.maybe_prepare_rebalance(now_ms, limits, "a member joined");
    }

    /// KIP-345: a static member restarted (same instance id, no member id). It takes the old
    /// member's place under a new member id; the group rebalances only if that changes
    /// something.
    #[allow(clippy::too_many_arguments)]
    fn update_static_member(
        &mut self,
        instance: &str,
        old_member_id: &str,
        new_member_id: String,
        params: JoinGroupParams,
        reply: JoinTx,
        now_ms: i64,
        limits: &Limits,
    ) {
        let current_leader = self.leader.clone().unwrap_or_default();
        let unchanged = self.members.get(old_member_id).is_some_and(|m| m.protocols == params.protocols);
        // With the same protocols the selection cannot change either.
        let keeps_protocol = unchanged && self.select_protocol() == self.protocol_name;
        self.replace_static_member(instance, old_member_id, &new_member_id);
        if let Some(member) = self.members.get_mut(&new_member_id) {
            member.client_id = params.client_id.clone();
            member.client_host = params.client_host.clone();
            member.session_timeout_ms = params.session_timeout_ms;
            member.rebalance_timeout_ms = params.rebalance_timeout_ms;
            member.touch(now_ms);
        }
        tracing::info!(group = %self.id, instance, old = old_member_id, new = %new_member_id, "static member rejoined");
        match self.state {
            GroupState::Stable if keeps_protocol => {
                // No rebalance: the member gets the current generation and syncs to fetch its
                // assignment. It is told the *old* leader id, so that even a replaced leader
                // does not compute an assignment that a Stable group would not hand out.
                let _ = reply.send(JoinGroupResult {
                    error: None,
                    member_id: new_member_id,
                    generation_id: Some(self.generation),
                    protocol_type: self.protocol_type.clone(),
                    protocol_name: self.protocol_name.clone(),
                    leader_id: current_leader,
                    skip_assignment: false,
                    members: Vec::new(),
                });
            }
            GroupState::CompletingRebalance => {
                // The leader may already be assigning to the old member id: start over.
                self.update_member(&new_member_id, &params, reply);
                self.prepare_rebalance(now_ms, limits, "a static member rejoined during CompletingRebalance");
            }
            _ => {
                self.update_member(&new_member_id, &params, reply);
                self.maybe_prepare_rebalance(now_ms, limits, "a static member rejoined with changed metadata");
            }
        }
    }

    /// SyncGroup. A follower's reply waits for the leader's assignment; the leader's
    /// assignment must be stored before anyone gets it ([`SyncOutcome::Store`]).
    pub(crate) fn sync(&mut self, params: SyncGroupParams, reply: SyncTx, now_ms: i64) -> SyncOutcome {
        let fail = |reply: SyncTx, code| {
            let _ = reply.send(SyncGroupResult::error(code));
            SyncOutcome::Done
        };
        if self.state == GroupState::Dead {
            return fail(reply, ErrorKind::CoordinatorNotAvailable);
        }
        if let Err(code) = self.validate_current_member(&params.member_id, params.group_instance_id.as_deref()) {
            return fail(reply, code);
        }
        if params.generation_id != self.generation {
            return fail(reply, ErrorKind::WrongGeneration);
        }
        let type_differs = params.protocol_type.as_ref().is_some_and(|t| Some(t) != self.protocol_type.as_ref());
        let name_differs = params.protocol_name.as_ref().is_some_and(|n| Some(n) != self.protocol_name.as_ref());
        if type_differs || name_differs {
            return fail(reply, ErrorKind::InconsistentGroupProtocol);
        }
        match self.state {
            GroupState::Empty | GroupState::Dead | GroupState::Assigning | GroupState::Reconciling => {
                fail(reply, ErrorKind::UnknownMember)
            }
            GroupState::PreparingRebalance => fail(reply, ErrorKind::RebalanceInProgress),
            GroupState::CompletingRebalance => {
                self.pending_sync.remove(&params.member_id);
                let is_leader = self.leader.as_deref() == Some(params.member_id.as_str());
                let Some(member) = self.members.get_mut(&params.member_id) else {
                    return fail(reply, ErrorKind::UnknownMember);
                };
                if let Some(old) = member.sync_waiter.replace(reply) {
                    let _ = old.send(SyncGroupResult::error(ErrorKind::RebalanceInProgress));
                }
                if !is_leader {
                    return SyncOutcome::Done;
                }
                tracing::info!(group = %self.id, generation = self.generation, members = self.members.len(), "assignment received from the leader");
                let assignments = params.assignments.into_iter().collect();
                SyncOutcome::Store { generation: self.generation, assignments }
            }
            GroupState::Stable => {
                self.pending_sync.remove(&params.member_id);
                let protocol_type = self.protocol_type.clone();
                let protocol_name = self.protocol_name.clone();
                let Some(member) = self.members.get_mut(&params.member_id) else {
                    return fail(reply, ErrorKind::UnknownMember);
                };
                member.touch(now_ms);
                let _ = reply.send(SyncGroupResult {
                    error: None,
                    protocol_type,
                    protocol_name,
                    assignment: member.assignment.clone(),
                });
                SyncOutcome::Done
            }
        }
    }

    /// The group record of `generation` was stored (or not): hand out the assignment and become
    /// Stable, unless the group moved on meanwhile (then its members were already told).
    pub(crate) fn complete_sync(
        &mut self,
        generation: i32,
        assignments: &HashMap<String, Bytes>,
        stored: Result<(), ErrorKind>,
        now_ms: i64,
        limits: &Limits,
    ) {
        if self.state != GroupState::CompletingRebalance || self.generation != generation {
            return;
        }
        match stored {
            Ok(()) => {
                self.persisted = true;
                self.set_and_propagate_assignment(assignments, now_ms);
                self.state = GroupState::Stable;
                tracing::info!(group = %self.id, generation, "group is stable");
            }
            Err(code) => {
                self.reset_and_propagate_assignment_error(code, now_ms);
                self.maybe_prepare_rebalance(now_ms, limits, "storing the group failed");
            }
        }
        self.poll(now_ms, limits);
    }

    pub(crate) fn heartbeat(&mut self, params: &HeartbeatParams, now_ms: i64) -> Result<(), ErrorKind> {
        if self.state == GroupState::Dead {
            return Err(ErrorKind::CoordinatorNotAvailable);
        }
        self.validate_current_member(&params.member_id, params.group_instance_id.as_deref())?;
        let state = self.state;
        let generation = self.generation;
        let Some(member) = self.members.get_mut(&params.member_id) else { return Err(ErrorKind::UnknownMember) };
        match state {
            GroupState::Empty | GroupState::Dead | GroupState::Assigning | GroupState::Reconciling => {
                Err(ErrorKind::UnknownMember)
            }
            // Consumers may heartbeat as soon as their JoinGroup returns.
            GroupState::CompletingRebalance => {
                member.touch(now_ms);
                Ok(())
            }
            GroupState::PreparingRebalance => {
                member.touch(now_ms);
                Err(ErrorKind::RebalanceInProgress)
            }
            GroupState::Stable if params.generation_id != generation => Err(ErrorKind::WrongGeneration),
            GroupState::Stable => {
                member.touch(now_ms);
                Ok(())
            }
        }
    }

    pub(crate) fn leave(&mut self, leaving: Vec<LeavingMember>, now_ms: i64, limits: &Limits) -> LeaveGroupResult {
        if self.state == GroupState::Dead {
            return LeaveGroupResult { error: Some(ErrorKind::CoordinatorNotAvailable), members: Vec::new() };
        }
        let mut results = Vec::with_capacity(leaving.len());
        for member in leaving {
            let error = if member.member_id.is_empty() {
                // Administrative removal of a static member by instance id.
                match member.group_instance_id.as_ref().and_then(|i| self.static_members.get(i)).cloned() {
                    Some(current) => {
                        self.remove_member_and_update(&current, now_ms, limits, "static member removed by instance id");
                        None
                    }
                    None => Some(ErrorKind::UnknownMember),
                }
            } else if self.pending_members.remove(&member.member_id).is_some() {
                None
            } else {
                match self.validate_current_member(&member.member_id, member.group_instance_id.as_deref()) {
                    Ok(()) => {
                        let why = member.reason.as_deref().unwrap_or("the member left the group");
                        self.remove_member_and_update(&member.member_id, now_ms, limits, why);
                        None
                    }
                    Err(code) => Some(code),
                }
            };
            results.push(MemberLeaveResult {
                member_id: member.member_id,
                group_instance_id: member.group_instance_id,
                error,
            });
        }
        self.poll(now_ms, limits);
        LeaveGroupResult { error: None, members: results }
    }

    /// Kafka's `validateOffsetCommit` plus its state rules. A commit without generation, member
    /// id or instance id is a "simple" commit, allowed only while the group has no members.
    pub(crate) fn validate_commit(
        &mut self,
        generation_id: Option<i32>,
        member_id: &str,
        group_instance_id: Option<&str>,
        now_ms: i64,
    ) -> Result<(), ErrorKind> {
        if self.state == GroupState::Dead {
            return Err(ErrorKind::CoordinatorNotAvailable);
        }
        if let Some(consumer) = &self.consumer {
            // The consumer protocol: the generation is the member's epoch (OffsetCommit v9).
            return consumer.validate_commit(member_id, generation_id);
        }
        if generation_id.is_some() || !member_id.is_empty() || group_instance_id.is_some() {
            self.validate_current_member(member_id, group_instance_id)?;
            if generation_id != Some(self.generation) {
                return Err(ErrorKind::WrongGeneration);
            }
        } else if self.state != GroupState::Empty {
            return Err(ErrorKind::UnknownMember);
        }
        match self.state {
            GroupState::Empty => Ok(()),
            // Allowed while preparing: the heartbeat tells the member about the rebalance.
            GroupState::Stable | GroupState::PreparingRebalance => {
                if let Some(member) = self.members.get_mut(member_id) {
                    member.touch(now_ms);
                }
                Ok(())
            }
            // The member has the new generation but no assignment yet.
            GroupState::CompletingRebalance => Err(ErrorKind::RebalanceInProgress),
            GroupState::Dead => Err(ErrorKind::CoordinatorNotAvailable),
            // Consumer-protocol states: handled above.
            GroupState::Assigning | GroupState::Reconciling => Err(ErrorKind::UnknownMember),
        }
    }

    pub(crate) fn describe(&self) -> GroupDescription {
        let stable = self.state == GroupState::Stable;
        let protocol = if stable { self.protocol_name.clone().unwrap_or_default() } else { String::new() };
        GroupDescription {
            group_id: self.id.clone(),
            error: None,
            state: self.state,
            protocol_type: self.protocol_type.clone().unwrap_or_default(),
            consumer: None,
            protocol_data: protocol.clone(),
            members: self
                .members
                .values()
                .map(|m| MemberDescription {
                    member_id: m.member_id.clone(),
                    group_instance_id: m.group_instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    metadata: if stable { m.metadata_for(&protocol) } else { Bytes::new() },
                    assignment: if stable { m.assignment.clone() } else { Bytes::new() },
                })
                .collect(),
        }
    }

    // ----- time ---------------------------------------------------------------------------

    /// Runs whatever is due at `now_ms`: forgotten pending members, expired sessions, members
    /// that never synced, the end of the join phase. Call after every change and on timer
    /// ticks; cheap when nothing is due.
    pub(crate) fn poll(&mut self, now_ms: i64, limits: &Limits) {
        if let Some(consumer) = &mut self.consumer {
            consumer.poll(now_ms);
            self.sync_consumer_state(now_ms);
            if !self.downgrade_if_only_classic(now_ms, limits) {
                return;
            }
        }
        let forgotten: Vec<String> = self
            .pending_members
            .iter()
            .filter(|(_, deadline)| **deadline <= now_ms)
            .map(|(id, _)| id.clone())
            .collect();
        for id in forgotten {
            tracing::debug!(group = %self.id, member = %id, "pending member expired");
            self.pending_members.remove(&id);
        }
        let expired: Vec<String> =
            self.members.values().filter(|m| m.expired(now_ms)).map(|m| m.member_id.clone()).collect();
        for id in expired {
            self.remove_member_and_update(&id, now_ms, limits, "session timeout expired");
        }
        if self.sync_deadline_ms.is_some_and(|d| d <= now_ms) {
            self.sync_deadline_ms = None;
            if matches!(self.state, GroupState::CompletingRebalance | GroupState::Stable)
                && !self.pending_sync.is_empty()
            {
                let missing: Vec<String> = self.pending_sync.drain().collect();
                for id in &missing {
                    tracing::info!(group = %self.id, member = %id, "removing a member that did not sync in time");
                    self.remove_member(id, ErrorKind::UnknownMember);
                }
                self.prepare_rebalance(now_ms, limits, "members did not sync in time");
            }
        }
        if self.state != GroupState::PreparingRebalance {
            return;
        }
        if self.join_deadline_ms.is_some_and(|d| d <= now_ms) {
            match self.initial_delay_remaining_ms {
                Some(remaining) if self.new_member_added && remaining > 0 => {
                    // More members came during the initial delay: wait for more, within the
                    // rebalance timeout.
                    let configured = limits.initial_rebalance_delay_ms;
                    self.new_member_added = false;
                    self.join_deadline_ms = Some(now_ms + configured.min(remaining));
                    self.initial_delay_remaining_ms = Some((remaining - configured).max(0));
                }
                _ => self.complete_join(now_ms),
            }
        } else if self.initial_delay_remaining_ms.is_none() && self.all_members_joined() {
            self.complete_join(now_ms);
        }
    }

    /// The next time `poll` has something to do, if any.
    pub(crate) fn next_deadline_ms(&self) -> Option<i64> {
        if let Some(consumer) = &self.consumer {
            return consumer.next_deadline_ms();
        }
        let sessions = self.members.values().filter(|m| m.can_expire()).map(|m| m.session_deadline_ms);
        let join = if self.state == GroupState::PreparingRebalance { self.join_deadline_ms } else { None };
        sessions.chain(self.pending_members.values().copied()).chain(join).chain(self.sync_deadline_ms).min()
    }

    /// Answers every waiting request with `code` (broker shutdown).
    pub(crate) fn fail_waiters(&mut self, code: ErrorKind) {
        for member in self.members.values_mut() {
            member.reply_join(JoinGroupResult::error(member.member_id.clone(), code));
            member.reply_sync(SyncGroupResult::error(code));
        }
    }

    /// Asserts the invariants of the module doc. Run by the coordinator whenever it lets go of
    /// the groups in debug builds (see `coordinator::Groups`).
    pub(crate) fn check_invariants(&self) {
        if let Some(consumer) = &self.consumer {
            consumer.check_invariants();
            assert!(self.members.is_empty(), "a consumer group has no classic members");
        }
        assert_eq!(self.leader.is_some(), !self.members.is_empty(), "leader iff members in {}", self.id);
        if let Some(leader) = &self.leader {
            assert!(self.members.contains_key(leader), "leader {leader} is a member");
        }
        for (instance, member_id) in &self.static_members {
            let member = self.members.get(member_id).expect("static member exists");
            assert_eq!(member.group_instance_id.as_deref(), Some(instance.as_str()));
        }
        let statics = self.members.values().filter(|m| m.group_instance_id.is_some()).count();
        assert_eq!(statics, self.static_members.len());
        assert_eq!(self.join_deadline_ms.is_some(), self.state == GroupState::PreparingRebalance, "join deadline");
        for member in self.members.values() {
            if member.awaiting_join() {
                assert_eq!(self.state, GroupState::PreparingRebalance, "{} awaits a join", member.member_id);
            }
            if member.awaiting_sync() {
                assert_eq!(self.state, GroupState::CompletingRebalance, "{} awaits a sync", member.member_id);
            }
        }
    }
}

/// Partitions by topic name, as the classic consumer protocol's bytes carry them.
pub(crate) type NamedPartitions = Vec<(String, Vec<i32>)>;

/// A ConsumerProtocolSubscription (any version): its topics and, from v1, the partitions the
/// member owns (by topic name).
pub(crate) fn decode_subscription(metadata: &Bytes) -> Option<(Vec<String>, NamedPartitions)> {
    let mut buf = metadata.clone();
    if buf.len() < 2 {
        return None;
    }
    let version = buf.get_i16().clamp(0, 3);
    let subscription = ConsumerProtocolSubscription::decode(&mut buf, version).ok()?;
    let topics = subscription.topics.iter().map(|t| t.to_string()).collect();
    let owned = subscription.owned_partitions.iter().map(|tp| (tp.topic.to_string(), tp.partitions.clone())).collect();
    Some((topics, owned))
}

/// A ConsumerProtocolAssignment (any version: they all start with v0's layout), by topic name.
/// Empty bytes are an empty assignment.
pub(crate) fn decode_assignment(assignment: &Bytes) -> Option<NamedPartitions> {
    let mut buf = assignment.clone();
    if buf.is_empty() {
        return Some(Vec::new());
    }
    if buf.len() < 2 {
        return None;
    }
    buf.advance(2);
    let decoded = kafka_protocol::messages::ConsumerProtocolAssignment::decode(&mut buf, 0).ok()?;
    Some(decoded.assigned_partitions.iter().map(|tp| (tp.topic.to_string(), tp.partitions.clone())).collect())
}
