//! One group of the consumer group protocol (KIP-848): the broker computes the assignment and
//! hands it out incrementally through ConsumerGroupHeartbeat. Pure and synchronous like
//! `state` (the classic machine): time and the topics' metadata are passed in.
//!
//! Epochs:
//! - the group epoch goes up whenever what the assignment depends on changes (a member joins or
//!   leaves, a subscription, rack or assignor changes, a subscribed topic gains partitions);
//! - the target assignment is recomputed, at the next heartbeat, when the group epoch is ahead
//!   of the assignment epoch, which then catches up;
//! - each member moves to the assignment epoch on its own: first it gives up (revokes) the
//!   partitions the target takes from it, then it gets the target's partitions that no other
//!   member still holds.
//!
//! Classic members (a converted classic group's, or classic consumers joining later) are
//! members like the others, driven through `classic_join`, `classic_sync` and
//! `classic_heartbeat`: they acknowledge revocations by rejoining with what they still own, and
//! are told to rejoin (REBALANCE_IN_PROGRESS) whenever their assignment must change.
//!
//! Invariants (checked by `check_invariants`):
//! - no partition is held (assigned or being revoked) by two members at once: a partition is
//!   handed to a member only once its previous holder acknowledged giving it up;
//! - a member's epoch never exceeds the assignment epoch, which never exceeds the group epoch;
//! - `static_members` maps each instance id to the member holding it, and only those.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::assignor::{self, Assignment, MemberSpec, TopicSpec};
use super::{
    ConsumerGroupDescription, ConsumerHeartbeatParams, ConsumerHeartbeatResult, ConsumerMemberDescription, ErrorKind,
    GroupState,
};

/// Member epoch of a leave request; of a static member leaving for a restart.
pub(crate) const LEAVE_EPOCH: i32 = -1;
pub(crate) const STATIC_LEAVE_EPOCH: i32 = -2;

/// The broker settings a consumer group obeys.
#[derive(Debug, Clone)]
pub(crate) struct ConsumerLimits {
    pub(crate) session_timeout_ms: i32,
    pub(crate) heartbeat_interval_ms: i32,
    pub(crate) max_size: usize,
    /// `group.consumer.assignors`; the first is the default.
    pub(crate) assignors: Vec<String>,
}

/// A topic as the consumer group sees it (from the cluster metadata).
#[derive(Debug, Clone)]
pub(crate) struct TopicInfo {
    pub(crate) name: String,
    pub(crate) spec: TopicSpec,
}

/// The topics a heartbeat may involve, by id: those the group's subscriptions name or match.
pub(crate) type Catalog = BTreeMap<Uuid, TopicInfo>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum MemberState {
    /// At its epoch's assignment, or waiting for nothing.
    Stable,
    /// Must give up `revoking` (acknowledged by a heartbeat that no longer owns them) before it
    /// moves to the assignment epoch.
    UnrevokedPartitions,
    /// At the assignment epoch, but some target partitions are still held by other members.
    UnreleasedPartitions,
}

#[derive(Debug, Clone)]
pub(crate) struct ConsumerMember {
    pub(crate) member_id: String,
    pub(crate) instance_id: Option<String>,
    rack_id: Option<String>,
    client_id: String,
    client_host: String,
    rebalance_timeout_ms: i32,
    subscribed_topic_names: Vec<String>,
    subscribed_topic_regex: Option<String>,
    server_assignor: Option<String>,
    pub(crate) member_epoch: i32,
    previous_member_epoch: i32,
    state: MemberState,
    /// What the member has been told it owns.
    pub(crate) assigned: Assignment,
    /// Taken from it, not yet acknowledged; still its own until then.
    revoking: Assignment,
    session_deadline_ms: i64,
    /// While partitions are being revoked: fenced if they are not by then.
    revocation_deadline_ms: Option<i64>,
    /// A static member that left for a restart (epoch -2): keeps its assignment for a while.
    left_temporarily: bool,
    /// (epoch, assignment) last sent, so an unchanged assignment is not sent again.
    sent: Option<(i32, Assignment)>,
    /// Set for a member that speaks the classic protocol (JoinGroup, SyncGroup, Heartbeat) in
    /// this group, as after a running classic group was converted.
    classic: Option<ClassicMember>,
}

/// What a classic-protocol member of a consumer group keeps of its JoinGroup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ClassicMember {
    pub(crate) session_timeout_ms: i32,
    /// Its protocols (assignors) in preference order; the first is the one it is told.
    pub(crate) protocol_names: Vec<String>,
}

/// A classic group's member as the conversion to a consumer group takes it over.
#[derive(Debug, Clone)]
pub(crate) struct ClassicSeed {
    pub(crate) member_id: String,
    pub(crate) instance_id: Option<String>,
    pub(crate) client_id: String,
    pub(crate) client_host: String,
    pub(crate) rebalance_timeout_ms: i32,
    pub(crate) classic: ClassicMember,
    pub(crate) subscribed: Vec<String>,
    /// Its current assignment, by topic name.
    pub(crate) assigned: Vec<(String, Vec<i32>)>,
}

impl ConsumerMember {
    fn holds(&self, topic: &Uuid, partition: i32) -> bool {
        self.assigned.get(topic).is_some_and(|p| p.contains(&partition))
            || self.revoking.get(topic).is_some_and(|p| p.contains(&partition))
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct ConsumerGroup {
    pub(crate) group_epoch: i32,
    pub(crate) assignment_epoch: i32,
    pub(crate) members: BTreeMap<String, ConsumerMember>,
    static_members: HashMap<String, String>,
    target: BTreeMap<String, Assignment>,
    /// Partition counts of the subscribed topics when the target was computed: a change bumps
    /// the group epoch.
    subscribed_metadata: BTreeMap<Uuid, i32>,
    /// The assignor of the current target.
    assignor: String,
    /// The group record last written to `__consumer_offsets` (see `offsets`): a heartbeat that
    /// changes the group writes it again before it is answered.
    pub(crate) persisted_value: Option<Bytes>,
}

/// What `__consumer_offsets` keeps of a consumer group: everything but the timers (sessions
/// restart when the group is loaded) and what was last sent to each member.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ConsumerGroupSnapshot {
    group_epoch: i32,
    assignment_epoch: i32,
    assignor: String,
    subscribed_metadata: BTreeMap<Uuid, i32>,
    target: BTreeMap<String, Assignment>,
    members: Vec<MemberSnapshot>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct MemberSnapshot {
    member_id: String,
    instance_id: Option<String>,
    rack_id: Option<String>,
    client_id: String,
    client_host: String,
    rebalance_timeout_ms: i32,
    subscribed_topic_names: Vec<String>,
    subscribed_topic_regex: Option<String>,
    server_assignor: Option<String>,
    member_epoch: i32,
    previous_member_epoch: i32,
    state: MemberState,
    assigned: Assignment,
    revoking: Assignment,
    left_temporarily: bool,
    #[serde(default)]
    classic: Option<ClassicMember>,
}

fn minus(a: &Assignment, b: &Assignment) -> Assignment {
    let mut out = Assignment::new();
    for (topic, partitions) in a {
        let rest: BTreeSet<i32> = match b.get(topic) {
            Some(other) => partitions.difference(other).copied().collect(),
            None => partitions.clone(),
        };
        if !rest.is_empty() {
            out.insert(*topic, rest);
        }
    }
    out
}

fn intersect(a: &Assignment, b: &Assignment) -> Assignment {
    let mut out = Assignment::new();
    for (topic, partitions) in a {
        if let Some(other) = b.get(topic) {
            let both: BTreeSet<i32> = partitions.intersection(other).copied().collect();
            if !both.is_empty() {
                out.insert(*topic, both);
            }
        }
    }
    out
}

fn is_subset(a: &Assignment, b: &Assignment) -> bool {
    minus(a, b).is_empty()
}

/// Compiles a subscription pattern: it must match a whole topic name, as Java's
/// `Pattern.matcher().matches()` does.
pub(crate) fn compile_regex(pattern: &str) -> Result<regex::Regex, ErrorKind> {
    regex::Regex::new(&format!("^(?:{pattern})$")).map_err(|_| ErrorKind::InvalidRequest)
}

impl ConsumerGroup {
    pub(crate) fn snapshot(&self) -> ConsumerGroupSnapshot {
        ConsumerGroupSnapshot {
            group_epoch: self.group_epoch,
            assignment_epoch: self.assignment_epoch,
            assignor: self.assignor.clone(),
            subscribed_metadata: self.subscribed_metadata.clone(),
            target: self.target.clone(),
            members: self
                .members
                .values()
                .map(|m| MemberSnapshot {
                    member_id: m.member_id.clone(),
                    instance_id: m.instance_id.clone(),
                    rack_id: m.rack_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    subscribed_topic_names: m.subscribed_topic_names.clone(),
                    subscribed_topic_regex: m.subscribed_topic_regex.clone(),
                    server_assignor: m.server_assignor.clone(),
                    member_epoch: m.member_epoch,
                    previous_member_epoch: m.previous_member_epoch,
                    state: m.state,
                    assigned: m.assigned.clone(),
                    revoking: m.revoking.clone(),
                    left_temporarily: m.left_temporarily,
                    classic: m.classic.clone(),
                })
                .collect(),
        }
    }

    /// The group as its record left it, loaded by a (new) coordinator at `now_ms`: every
    /// member's session starts again, as does the rebalance timeout of a member revoking.
    /// A record that breaks an invariant (only by a bug) loads as an empty group, whose
    /// members then rejoin.
    pub(crate) fn from_snapshot(
        snapshot: ConsumerGroupSnapshot,
        value: Bytes,
        now_ms: i64,
        limits: &ConsumerLimits,
    ) -> ConsumerGroup {
        let mut group = ConsumerGroup {
            group_epoch: snapshot.group_epoch,
            assignment_epoch: snapshot.assignment_epoch,
            assignor: snapshot.assignor,
            subscribed_metadata: snapshot.subscribed_metadata,
            target: snapshot.target,
            persisted_value: Some(value),
            ..ConsumerGroup::default()
        };
        for m in snapshot.members {
            if let Some(instance) = &m.instance_id {
                group.static_members.insert(instance.clone(), m.member_id.clone());
            }
            let revocation_deadline_ms =
                (!m.revoking.is_empty()).then(|| now_ms + i64::from(m.rebalance_timeout_ms.max(0)));
            let session_ms = m.classic.as_ref().map_or(limits.session_timeout_ms, |c| c.session_timeout_ms);
            group.members.insert(
                m.member_id.clone(),
                ConsumerMember {
                    member_id: m.member_id,
                    instance_id: m.instance_id,
                    rack_id: m.rack_id,
                    client_id: m.client_id,
                    client_host: m.client_host,
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    subscribed_topic_names: m.subscribed_topic_names,
                    subscribed_topic_regex: m.subscribed_topic_regex,
                    server_assignor: m.server_assignor,
                    member_epoch: m.member_epoch,
                    previous_member_epoch: m.previous_member_epoch,
                    state: m.state,
                    assigned: m.assigned,
                    revoking: m.revoking,
                    session_deadline_ms: now_ms + i64::from(session_ms),
                    revocation_deadline_ms,
                    left_temporarily: m.left_temporarily,
                    sent: None,
                    classic: m.classic,
                },
            );
        }
        if let Some(violation) = group.invariant_violation() {
            tracing::error!(violation, "a stored consumer group breaks an invariant; loading it empty");
            return ConsumerGroup {
                group_epoch: group.group_epoch,
                assignment_epoch: group.assignment_epoch.min(group.group_epoch),
                ..ConsumerGroup::default()
            };
        }
        group
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Kafka's consumer group states: Empty, Assigning (the target lags the group epoch),
    /// Reconciling (some member is not at the target yet), Stable.
    pub(crate) fn state(&self) -> GroupState {
        if self.members.is_empty() {
            GroupState::Empty
        } else if self.assignment_epoch < self.group_epoch {
            GroupState::Assigning
        } else if self
            .members
            .values()
            .any(|m| m.member_epoch != self.assignment_epoch || m.state != MemberState::Stable)
        {
            GroupState::Reconciling
        } else {
            GroupState::Stable
        }
    }

    /// Every topic name the members subscribe to, and their patterns, with `extra` (the
    /// subscription of the heartbeat being handled): what the catalog must cover.
    pub(crate) fn subscriptions<'a>(
        &'a self,
        extra: &'a ConsumerHeartbeatParams,
    ) -> (BTreeSet<&'a str>, BTreeSet<&'a str>) {
        let mut names: BTreeSet<&str> = BTreeSet::new();
        let mut patterns: BTreeSet<&str> = BTreeSet::new();
        for m in self.members.values() {
            names.extend(m.subscribed_topic_names.iter().map(String::as_str));
            patterns.extend(m.subscribed_topic_regex.as_deref());
        }
        names.extend(extra.subscribed_topic_names.iter().flatten().map(String::as_str));
        patterns.extend(extra.subscribed_topic_regex.as_deref().filter(|p| !p.is_empty()));
        (names, patterns)
    }

    /// The topic ids a member subscribes to (names that exist, and names its pattern matches).
    fn member_topics(member: &ConsumerMember, catalog: &Catalog) -> BTreeSet<Uuid> {
        let regex = member.subscribed_topic_regex.as_deref().and_then(|p| compile_regex(p).ok());
        catalog
            .iter()
            .filter(|(_, t)| {
                member.subscribed_topic_names.contains(&t.name) || regex.as_ref().is_some_and(|r| r.is_match(&t.name))
            })
            .map(|(id, _)| *id)
            .collect()
    }

    fn bump(&mut self, why: &str) {
        self.group_epoch += 1;
        tracing::debug!(epoch = self.group_epoch, why, "consumer group epoch bumped");
    }

    /// The assignor the members asked for most (ties to the configured order); the default
    /// when none asked.
    fn pick_assignor(&self, limits: &ConsumerLimits) -> String {
        let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
        for m in self.members.values() {
            if let Some(a) = m.server_assignor.as_deref() {
                *votes.entry(a).or_default() += 1;
            }
        }
        limits
            .assignors
            .iter()
            .enumerate()
            .max_by_key(|(i, a)| (votes.get(a.as_str()).copied().unwrap_or(0), std::cmp::Reverse(*i)))
            .map(|(_, a)| a.clone())
            .unwrap_or_else(|| assignor::UNIFORM.to_string())
    }

    /// Bumps the group epoch once if `changed` or the subscribed topics' partition counts
    /// changed, then recomputes the target assignment if it is behind the group epoch.
    fn refresh_target(&mut self, catalog: &Catalog, limits: &ConsumerLimits, mut changed: bool) {
        let mut metadata = BTreeMap::new();
        let mut specs: BTreeMap<String, MemberSpec> = BTreeMap::new();
        for (id, m) in &self.members {
            let subscribed = Self::member_topics(m, catalog);
            for t in &subscribed {
                metadata.insert(*t, catalog[t].spec.partitions);
            }
            let current = self.target.get(id).cloned().unwrap_or_default();
            specs.insert(id.clone(), MemberSpec { subscribed, rack: m.rack_id.clone(), current });
        }
        if metadata != self.subscribed_metadata {
            self.subscribed_metadata = metadata.clone();
            changed = true;
        }
        if changed {
            self.bump("members, subscriptions or subscribed topics changed");
        }
        if self.assignment_epoch >= self.group_epoch {
            return;
        }
        let topics: BTreeMap<Uuid, TopicSpec> = metadata.keys().map(|t| (*t, catalog[t].spec.clone())).collect();
        let name = self.pick_assignor(limits);
        let target = assignor::assign(&name, &specs, &topics).unwrap_or_else(|| assignor::uniform(&specs, &topics));
        self.target = target;
        self.assignor = name;
        self.assignment_epoch = self.group_epoch;
    }

    /// Moves `member_id` towards the target (Kafka's `CurrentAssignmentBuilder`). `owned` is
    /// what the member reported holding, if it did.
    fn reconcile(&mut self, member_id: &str, owned: Option<&Assignment>, now_ms: i64) {
        let Some(member) = self.members.get(member_id) else { return };
        if member.left_temporarily {
            return;
        }
        let mut member = member.clone();
        if member.state == MemberState::UnrevokedPartitions {
            let acknowledged = owned.is_some_and(|o| intersect(o, &member.revoking).is_empty());
            if !acknowledged {
                return;
            }
            member.revoking.clear();
            member.revocation_deadline_ms = None;
            member.state = MemberState::Stable;
        }
        let target = self.target.get(member_id).cloned().unwrap_or_default();
        if member.member_epoch != self.assignment_epoch || member.state == MemberState::Stable {
            let kept = intersect(&member.assigned, &target);
            let revoke = minus(&member.assigned, &target);
            if !revoke.is_empty() {
                member.assigned = kept;
                member.revoking = revoke;
                member.state = MemberState::UnrevokedPartitions;
                member.revocation_deadline_ms = Some(now_ms + i64::from(member.rebalance_timeout_ms.max(0)));
                self.members.insert(member_id.to_string(), member);
                return;
            }
        }
        // Take every target partition no other member holds.
        let wanted = minus(&target, &member.assigned);
        let mut unreleased = false;
        for (topic, partitions) in &wanted {
            for p in partitions {
                let held = self.members.values().any(|o| o.member_id != member_id && o.holds(topic, *p));
                if held {
                    unreleased = true;
                } else {
                    member.assigned.entry(*topic).or_default().insert(*p);
                }
            }
        }
        if member.member_epoch != self.assignment_epoch {
            member.previous_member_epoch = member.member_epoch;
            member.member_epoch = self.assignment_epoch;
        }
        member.state = if unreleased { MemberState::UnreleasedPartitions } else { MemberState::Stable };
        self.members.insert(member_id.to_string(), member);
    }

    fn remove_member(&mut self, member_id: &str, why: &str) {
        if let Some(m) = self.members.remove(member_id) {
            if let Some(instance) = &m.instance_id {
                if self.static_members.get(instance).map(String::as_str) == Some(member_id) {
                    self.static_members.remove(instance);
                }
            }
            self.target.remove(member_id);
            tracing::info!(member = member_id, why, "consumer group member removed");
            self.bump(why);
        }
    }

    /// ConsumerGroupHeartbeat, after the coordinator checked it is the coordinator and built the
    /// catalog of the topics the subscriptions involve.
    pub(crate) fn heartbeat(
        &mut self,
        params: &ConsumerHeartbeatParams,
        catalog: &Catalog,
        now_ms: i64,
        limits: &ConsumerLimits,
    ) -> ConsumerHeartbeatResult {
        let fail = |code| ConsumerHeartbeatResult::error(code);
        let epoch = params.member_epoch;
        if let Some(a) = params.server_assignor.as_deref() {
            if !limits.assignors.iter().any(|x| x == a) {
                return fail(ErrorKind::UnsupportedAssignor);
            }
        }
        if let Some(pattern) = params.subscribed_topic_regex.as_deref().filter(|p| !p.is_empty()) {
            if compile_regex(pattern).is_err() {
                return fail(ErrorKind::InvalidRequest);
            }
        }
        if epoch == LEAVE_EPOCH || epoch == STATIC_LEAVE_EPOCH {
            return self.leave(params, epoch, now_ms);
        }
        let mut changed = false;
        let member_id = if epoch == 0 {
            match self.join(params, limits, now_ms) {
                Ok((id, new)) => {
                    changed = new;
                    id
                }
                Err(code) => return fail(code),
            }
        } else {
            let Some(member) = self.members.get(&params.member_id).filter(|m| m.classic.is_none()) else {
                return fail(ErrorKind::UnknownMember);
            };
            if let Some(instance) = params.instance_id.as_deref() {
                if self.static_members.get(instance) != Some(&params.member_id) {
                    return fail(ErrorKind::FencedInstance);
                }
            }
            let owned_ok = params.owned.as_ref().is_some_and(|o| is_subset(o, &member.assigned));
            let current = epoch == member.member_epoch;
            let lost_response = epoch == member.previous_member_epoch && owned_ok;
            if epoch > member.member_epoch || !(current || lost_response) || member.left_temporarily {
                return fail(ErrorKind::FencedMemberEpoch);
            }
            params.member_id.clone()
        };
        // Subscription, rack and assignor changes (null fields mean unchanged).
        if let Some(member) = self.members.get_mut(&member_id) {
            member.session_deadline_ms = now_ms + i64::from(limits.session_timeout_ms);
            member.client_id = params.client_id.clone();
            member.client_host = params.client_host.clone();
            if params.rebalance_timeout_ms > 0 {
                member.rebalance_timeout_ms = params.rebalance_timeout_ms;
            }
            if let Some(names) = &params.subscribed_topic_names {
                let mut names = names.clone();
                names.sort();
                names.dedup();
                if names != member.subscribed_topic_names {
                    member.subscribed_topic_names = names;
                    changed = true;
                }
            }
            // An empty pattern clears the member's (it subscribes by names only).
            if let Some(pattern) = &params.subscribed_topic_regex {
                let pattern = (!pattern.is_empty()).then(|| pattern.clone());
                if pattern != member.subscribed_topic_regex {
                    member.subscribed_topic_regex = pattern;
                    changed = true;
                }
            }
            if params.rack_id.is_some() && params.rack_id != member.rack_id {
                member.rack_id = params.rack_id.clone();
                changed = true;
            }
            if params.server_assignor.is_some() && params.server_assignor != member.server_assignor {
                member.server_assignor = params.server_assignor.clone();
                changed = true;
            }
        }
        self.refresh_target(catalog, limits, changed);
        self.reconcile(&member_id, params.owned.as_ref(), now_ms);
        let full = epoch == 0 || params.owned.is_some();
        let Some(member) = self.members.get_mut(&member_id) else { return fail(ErrorKind::UnknownMember) };
        let now_sent = (member.member_epoch, member.assigned.clone());
        let assignment = if full || member.sent.as_ref() != Some(&now_sent) {
            member.sent = Some(now_sent);
            Some(member.assigned.clone())
        } else {
            None
        };
        ConsumerHeartbeatResult {
            error: None,
            member_id: Some(member_id),
            member_epoch: member.member_epoch,
            heartbeat_interval_ms: limits.heartbeat_interval_ms,
            assignment,
        }
    }

    /// A heartbeat with epoch 0: a new member, a member rejoining after it was fenced (it gave
    /// up its partitions), or a static member coming back. Returns the member id.
    /// Returns the member id and whether the member is new to the group.
    fn join(
        &mut self,
        params: &ConsumerHeartbeatParams,
        limits: &ConsumerLimits,
        now_ms: i64,
    ) -> Result<(String, bool), ErrorKind> {
        if params.rebalance_timeout_ms <= 0 {
            return Err(ErrorKind::InvalidRequest);
        }
        let has_subscription = params.subscribed_topic_names.is_some()
            || params.subscribed_topic_regex.as_deref().is_some_and(|p| !p.is_empty());
        let member_id = if params.member_id.is_empty() {
            if params.version >= 1 {
                // v1: the client generates its member id (KIP-1082).
                return Err(ErrorKind::InvalidRequest);
            }
            Uuid::new_v4().to_string()
        } else {
            params.member_id.clone()
        };
        if let Some(instance) = params.instance_id.as_deref() {
            if let Some(holder) = self.static_members.get(instance).cloned() {
                let gone = self.members.get(&holder).is_none_or(|m| m.left_temporarily);
                if holder != member_id && !gone {
                    return Err(ErrorKind::UnreleasedInstanceId);
                }
                if holder != member_id {
                    // The restarted static member takes its predecessor's place and partitions.
                    self.replace_static_member(instance, &holder, &member_id, |_| {});
                    return Ok((member_id, false));
                }
            }
        }
        if let Some(member) = self.members.get_mut(&member_id) {
            // Rejoining with epoch 0 (after FENCED_MEMBER_EPOCH): it dropped everything.
            member.assigned.clear();
            member.revoking.clear();
            member.revocation_deadline_ms = None;
            member.state = MemberState::Stable;
            member.member_epoch = 0;
            member.previous_member_epoch = 0;
            member.sent = None;
            member.left_temporarily = false;
            return Ok((member_id, false));
        }
        if !has_subscription {
            return Err(ErrorKind::InvalidRequest);
        }
        if self.members.len() >= limits.max_size {
            return Err(ErrorKind::GroupFull);
        }
        let member = ConsumerMember {
            member_id: member_id.clone(),
            instance_id: params.instance_id.clone(),
            rack_id: None,
            client_id: params.client_id.clone(),
            client_host: params.client_host.clone(),
            rebalance_timeout_ms: params.rebalance_timeout_ms,
            subscribed_topic_names: Vec::new(),
            subscribed_topic_regex: None,
            server_assignor: None,
            member_epoch: 0,
            previous_member_epoch: 0,
            state: MemberState::Stable,
            assigned: Assignment::new(),
            revoking: Assignment::new(),
            session_deadline_ms: now_ms + i64::from(limits.session_timeout_ms),
            revocation_deadline_ms: None,
            left_temporarily: false,
            sent: None,
            classic: None,
        };
        if let Some(instance) = &params.instance_id {
            self.static_members.insert(instance.clone(), member_id.clone());
        }
        self.members.insert(member_id.clone(), member);
        Ok((member_id, true))
    }

    fn leave(&mut self, params: &ConsumerHeartbeatParams, epoch: i32, now_ms: i64) -> ConsumerHeartbeatResult {
        let member_id = match params.instance_id.as_deref().and_then(|i| self.static_members.get(i)) {
            Some(holder) if params.member_id.is_empty() || *holder == params.member_id => holder.clone(),
            Some(_) => return ConsumerHeartbeatResult::error(ErrorKind::FencedInstance),
            None => params.member_id.clone(),
        };
        let Some(member) = self.members.get_mut(&member_id) else {
            return ConsumerHeartbeatResult::error(ErrorKind::UnknownMember);
        };
        if epoch == STATIC_LEAVE_EPOCH && member.instance_id.is_some() {
            // Keeps its partitions for its successor until the session times out.
            member.left_temporarily = true;
            member.session_deadline_ms = member.session_deadline_ms.max(now_ms);
        } else {
            self.remove_member(&member_id, "the member left the group");
        }
        ConsumerHeartbeatResult {
            error: None,
            member_id: Some(member_id),
            member_epoch: epoch,
            heartbeat_interval_ms: 0,
            assignment: None,
        }
    }

    /// The members, when every one of them speaks the classic protocol (the group's last
    /// consumer-protocol member is gone): what a downgrade to a classic group takes over. Their
    /// assignments are left out: the classic group's leader computes new ones at the rejoin.
    pub(crate) fn classic_members_only(&self) -> Option<Vec<ClassicSeed>> {
        if self.members.is_empty() {
            return None;
        }
        self.members
            .values()
            .map(|m| {
                Some(ClassicSeed {
                    member_id: m.member_id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    classic: m.classic.clone()?,
                    subscribed: m.subscribed_topic_names.clone(),
                    assigned: Vec::new(),
                })
            })
            .collect()
    }

    /// Takes over a Stable classic group's members (Kafka 4's migration, policy
    /// `bidirectional` or `upgrade`): each keeps its assignment at the classic generation, which becomes the
    /// group and assignment epoch; the members then reconcile like any other.
    pub(crate) fn from_classic(
        generation: i32,
        seeds: Vec<ClassicSeed>,
        catalog: &Catalog,
        now_ms: i64,
    ) -> ConsumerGroup {
        let by_name: HashMap<&str, Uuid> = catalog.iter().map(|(id, t)| (t.name.as_str(), *id)).collect();
        let mut group = ConsumerGroup {
            group_epoch: generation,
            assignment_epoch: generation,
            assignor: assignor::UNIFORM.to_string(),
            ..ConsumerGroup::default()
        };
        for seed in seeds {
            let mut assigned = Assignment::new();
            for (topic, partitions) in &seed.assigned {
                if let Some(id) = by_name.get(topic.as_str()) {
                    for p in partitions {
                        // A partition two classic members both claim (a leader's bug) stays
                        // with the first; the second is told to rejoin and gets its share.
                        if !group.members.values().any(|m| m.holds(id, *p)) {
                            assigned.entry(*id).or_default().insert(*p);
                        }
                    }
                }
            }
            if let Some(instance) = &seed.instance_id {
                group.static_members.insert(instance.clone(), seed.member_id.clone());
            }
            group.target.insert(seed.member_id.clone(), assigned.clone());
            let mut subscribed = seed.subscribed;
            subscribed.sort();
            subscribed.dedup();
            group.members.insert(
                seed.member_id.clone(),
                ConsumerMember {
                    member_id: seed.member_id,
                    instance_id: seed.instance_id,
                    rack_id: None,
                    client_id: seed.client_id,
                    client_host: seed.client_host,
                    rebalance_timeout_ms: seed.rebalance_timeout_ms,
                    subscribed_topic_names: subscribed,
                    subscribed_topic_regex: None,
                    server_assignor: None,
                    member_epoch: generation,
                    previous_member_epoch: generation,
                    state: MemberState::Stable,
                    assigned,
                    revoking: Assignment::new(),
                    session_deadline_ms: now_ms + i64::from(seed.classic.session_timeout_ms),
                    revocation_deadline_ms: None,
                    left_temporarily: false,
                    sent: None,
                    classic: Some(seed.classic),
                },
            );
        }
        group
    }

    /// The member `holder` of static `instance` goes on as `member_id`: same partitions,
    /// epochs and target, told its assignment again; `adjust` makes it the new kind of member.
    fn replace_static_member(
        &mut self,
        instance: &str,
        holder: &str,
        member_id: &str,
        adjust: impl FnOnce(&mut ConsumerMember),
    ) {
        if let Some(mut member) = self.members.remove(holder) {
            member.member_id = member_id.to_string();
            member.left_temporarily = false;
            member.sent = None;
            adjust(&mut member);
            if let Some(target) = self.target.remove(holder) {
                self.target.insert(member_id.to_string(), target);
            }
            self.members.insert(member_id.to_string(), member);
        }
        self.static_members.insert(instance.to_string(), member_id.to_string());
    }

    /// Topic names and patterns of every member, owned (for building a catalog).
    pub(crate) fn subscribed_sets(&self) -> (BTreeSet<String>, BTreeSet<String>) {
        let names = self.members.values().flat_map(|m| m.subscribed_topic_names.iter().cloned()).collect();
        let patterns = self.members.values().filter_map(|m| m.subscribed_topic_regex.clone()).collect();
        (names, patterns)
    }

    /// Whether a classic member must rejoin: it is not at the target yet, or holds partitions
    /// it has not been told about.
    fn classic_needs_rejoin(&self, member: &ConsumerMember) -> bool {
        member.member_epoch != self.assignment_epoch
            || member.state != MemberState::Stable
            || member.sent.as_ref().is_none_or(|(e, a)| *e != member.member_epoch || *a != member.assigned)
    }

    /// JoinGroup of a classic member into this consumer group: answered at once, with the
    /// member's epoch as generation and no member list (the broker assigns). `subscribed` and
    /// `owned` come from its subscription metadata; an eager member owns nothing when it joins.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn classic_join(
        &mut self,
        member_id: &str,
        params: &super::JoinGroupParams,
        subscribed: Vec<String>,
        owned: Assignment,
        catalog: &Catalog,
        now_ms: i64,
        limits: &ConsumerLimits,
    ) -> Result<(i32, String), ErrorKind> {
        let mut changed = false;
        let classic = || ClassicMember {
            session_timeout_ms: params.session_timeout_ms,
            protocol_names: params.protocols.iter().map(|p| p.name.clone()).collect(),
        };
        // A static member (KIP-345) joining under a new member id, as a restarted consumer
        // does, takes its instance's member over as it is (partitions, epoch, subscription):
        // no rebalance. The old member id is fenced from then on.
        if let Some(instance) = params.group_instance_id.as_deref() {
            match self.static_members.get(instance).cloned() {
                Some(holder) if holder == member_id => {}
                Some(_) if !params.member_id.is_empty() => return Err(ErrorKind::FencedInstance),
                Some(holder) => {
                    self.replace_static_member(instance, &holder, member_id, |m| m.classic = Some(classic()));
                }
                None => {}
            }
        }
        match self.members.get(member_id) {
            Some(m) if m.classic.is_none() => return Err(ErrorKind::UnknownMember),
            Some(_) => {}
            None => {
                if self.members.len() >= limits.max_size {
                    return Err(ErrorKind::GroupFull);
                }
                self.members.insert(
                    member_id.to_string(),
                    ConsumerMember {
                        member_id: member_id.to_string(),
                        instance_id: params.group_instance_id.clone(),
                        rack_id: None,
                        client_id: params.client_id.clone(),
                        client_host: params.client_host.clone(),
                        rebalance_timeout_ms: params.rebalance_timeout_ms,
                        subscribed_topic_names: Vec::new(),
                        subscribed_topic_regex: None,
                        server_assignor: None,
                        member_epoch: 0,
                        previous_member_epoch: 0,
                        state: MemberState::Stable,
                        assigned: Assignment::new(),
                        revoking: Assignment::new(),
                        session_deadline_ms: now_ms,
                        revocation_deadline_ms: None,
                        left_temporarily: false,
                        sent: None,
                        classic: None,
                    },
                );
                if let Some(instance) = &params.group_instance_id {
                    self.static_members.insert(instance.clone(), member_id.to_string());
                }
                changed = true;
            }
        }
        let mut subscribed = subscribed;
        subscribed.sort();
        subscribed.dedup();
        if let Some(m) = self.members.get_mut(member_id) {
            m.classic = Some(classic());
            m.session_deadline_ms = now_ms + i64::from(params.session_timeout_ms);
            m.rebalance_timeout_ms = params.rebalance_timeout_ms;
            if m.subscribed_topic_names != subscribed {
                m.subscribed_topic_names = subscribed;
                changed = true;
            }
            // What it says it still owns is all it holds (an eager member gave everything up).
            m.assigned = intersect(&m.assigned, &owned);
            m.revoking = intersect(&m.revoking, &owned);
            if m.revoking.is_empty() {
                m.revocation_deadline_ms = None;
            }
        }
        self.refresh_target(catalog, limits, changed);
        self.reconcile(member_id, Some(&owned), now_ms);
        let Some(m) = self.members.get(member_id) else { return Err(ErrorKind::UnknownMember) };
        let protocol = params.protocols.first().map(|p| p.name.clone()).unwrap_or_default();
        Ok((m.member_epoch, protocol))
    }

    /// SyncGroup of a classic member: its assignment of the generation it joined.
    pub(crate) fn classic_sync(&mut self, member_id: &str, generation: i32) -> Result<Assignment, ErrorKind> {
        let m = self.members.get_mut(member_id).filter(|m| m.classic.is_some()).ok_or(ErrorKind::UnknownMember)?;
        if generation != m.member_epoch {
            return Err(ErrorKind::WrongGeneration);
        }
        m.sent = Some((m.member_epoch, m.assigned.clone()));
        Ok(m.assigned.clone())
    }

    /// Heartbeat of a classic member: REBALANCE_IN_PROGRESS when it must rejoin to move on.
    pub(crate) fn classic_heartbeat(&mut self, member_id: &str, generation: i32, now_ms: i64) -> Result<(), ErrorKind> {
        let m = self.members.get_mut(member_id).filter(|m| m.classic.is_some()).ok_or(ErrorKind::UnknownMember)?;
        if generation != m.member_epoch {
            return Err(ErrorKind::WrongGeneration);
        }
        let session = m.classic.as_ref().map_or(0, |c| c.session_timeout_ms);
        m.session_deadline_ms = now_ms + i64::from(session);
        self.reconcile(member_id, None, now_ms);
        match self.members.get(member_id) {
            Some(m) if self.classic_needs_rejoin(m) => Err(ErrorKind::RebalanceInProgress),
            Some(_) => Ok(()),
            None => Err(ErrorKind::UnknownMember),
        }
    }

    /// LeaveGroup of a classic member.
    pub(crate) fn classic_leave(&mut self, member_id: &str) -> Result<(), ErrorKind> {
        if self.members.get(member_id).is_none_or(|m| m.classic.is_none()) {
            return Err(ErrorKind::UnknownMember);
        }
        self.remove_member(member_id, "the member left the group");
        Ok(())
    }

    /// An offset commit's (or fetch's) member check: the member exists and names its current
    /// epoch. Without member (an admin's commit) only while the group has no members.
    pub(crate) fn validate_commit(&self, member_id: &str, member_epoch: Option<i32>) -> Result<(), ErrorKind> {
        if member_id.is_empty() && member_epoch.is_none_or(|e| e < 0) {
            return if self.members.is_empty() { Ok(()) } else { Err(ErrorKind::UnknownMember) };
        }
        let member = self.members.get(member_id).ok_or(ErrorKind::UnknownMember)?;
        if member_epoch != Some(member.member_epoch) {
            return Err(ErrorKind::StaleMemberEpoch);
        }
        Ok(())
    }

    /// OffsetFetch v9's member check (Kafka's `validateOffsetFetch`): a fetch naming no epoch
    /// (-1: an admin, or a client outside the group) reads freely; otherwise the member exists
    /// and names its current epoch, so a member that missed a rebalance does not resume from
    /// offsets read under an assignment it no longer holds.
    pub(crate) fn validate_fetch(&self, member_id: &str, member_epoch: i32) -> Result<(), ErrorKind> {
        if member_epoch < 0 {
            return Ok(());
        }
        let member = self.members.get(member_id).ok_or(ErrorKind::UnknownMember)?;
        match member_epoch.cmp(&member.member_epoch) {
            std::cmp::Ordering::Equal => Ok(()),
            std::cmp::Ordering::Less => Err(ErrorKind::StaleMemberEpoch),
            std::cmp::Ordering::Greater => Err(ErrorKind::FencedMemberEpoch),
        }
    }

    /// Removes members whose session expired and fences members that did not revoke in time.
    pub(crate) fn poll(&mut self, now_ms: i64) {
        let expired: Vec<String> =
            self.members.values().filter(|m| m.session_deadline_ms <= now_ms).map(|m| m.member_id.clone()).collect();
        for id in expired {
            self.remove_member(&id, "session timeout expired");
        }
        let slow: Vec<String> = self
            .members
            .values()
            .filter(|m| m.revocation_deadline_ms.is_some_and(|d| d <= now_ms))
            .map(|m| m.member_id.clone())
            .collect();
        for id in slow {
            self.remove_member(&id, "did not revoke its partitions within the rebalance timeout");
        }
    }

    pub(crate) fn next_deadline_ms(&self) -> Option<i64> {
        self.members.values().flat_map(|m| std::iter::once(m.session_deadline_ms).chain(m.revocation_deadline_ms)).min()
    }

    /// Topic names of an assignment, through the catalog (ids it does not know are skipped).
    fn named(a: &Assignment, name_of: &dyn Fn(Uuid) -> Option<String>) -> Vec<(Uuid, String, Vec<i32>)> {
        a.iter().filter_map(|(t, ps)| name_of(*t).map(|n| (*t, n, ps.iter().copied().collect()))).collect()
    }

    pub(crate) fn describe(
        &self,
        group_id: &str,
        name_of: &dyn Fn(Uuid) -> Option<String>,
    ) -> ConsumerGroupDescription {
        ConsumerGroupDescription {
            group_id: group_id.to_string(),
            error: None,
            state: self.state(),
            group_epoch: self.group_epoch,
            assignment_epoch: self.assignment_epoch,
            assignor_name: self.assignor.clone(),
            members: self
                .members
                .values()
                .map(|m| ConsumerMemberDescription {
                    member_id: m.member_id.clone(),
                    instance_id: m.instance_id.clone(),
                    rack_id: m.rack_id.clone(),
                    member_epoch: m.member_epoch,
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    subscribed_topic_names: m.subscribed_topic_names.clone(),
                    subscribed_topic_regex: m.subscribed_topic_regex.clone(),
                    assignment: Self::named(&m.assigned, name_of),
                    target_assignment: Self::named(
                        &self.target.get(&m.member_id).cloned().unwrap_or_default(),
                        name_of,
                    ),
                })
                .collect(),
        }
    }

    /// Topic names the members subscribe to by name (OffsetDelete's check; patterns are not
    /// expanded here, so a group subscribing by pattern protects no topic by name).
    pub(crate) fn subscribed_names(&self) -> BTreeSet<String> {
        self.members.values().flat_map(|m| m.subscribed_topic_names.iter().cloned()).collect()
    }

    /// Asserts the invariants of the module doc.
    pub(crate) fn check_invariants(&self) {
        if let Some(violation) = self.invariant_violation() {
            panic!("consumer group invariant broken: {violation}");
        }
    }

    fn invariant_violation(&self) -> Option<String> {
        if self.assignment_epoch > self.group_epoch {
            return Some("assignment epoch ahead of group epoch".into());
        }
        let mut held: BTreeSet<(Uuid, i32)> = BTreeSet::new();
        for m in self.members.values() {
            if m.member_epoch > self.assignment_epoch {
                return Some(format!("{} epoch ahead", m.member_id));
            }
            for a in [&m.assigned, &m.revoking] {
                for (t, ps) in a {
                    for p in ps {
                        if !held.insert((*t, *p)) {
                            return Some(format!("{t}:{p} held twice ({})", m.member_id));
                        }
                    }
                }
            }
        }
        for (instance, id) in &self.static_members {
            if self.members.get(id).and_then(|m| m.instance_id.as_deref()) != Some(instance.as_str()) {
                return Some(format!("static member {instance} maps to {id}, which does not hold it"));
            }
        }
        let statics = self.members.values().filter(|m| m.instance_id.is_some()).count();
        if statics != self.static_members.len() {
            return Some("static members out of step".into());
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ConsumerLimits {
        ConsumerLimits {
            session_timeout_ms: 45_000,
            heartbeat_interval_ms: 5_000,
            max_size: 10,
            assignors: vec!["uniform".into(), "range".into()],
        }
    }

    fn catalog(partitions: i32) -> (Uuid, Catalog) {
        let id = Uuid::from_u128(42);
        let info = TopicInfo { name: "t".into(), spec: TopicSpec { partitions, racks: vec![] } };
        (id, BTreeMap::from([(id, info)]))
    }

    /// A classic consumer's JoinGroup into group "g".
    fn classic_join_params(member_id: &str, instance: Option<&str>) -> crate::group::JoinGroupParams {
        crate::group::JoinGroupParams {
            group_id: "g".into(),
            member_id: member_id.into(),
            group_instance_id: instance.map(str::to_string),
            client_id: "c".into(),
            client_host: "/h".into(),
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 30_000,
            protocol_type: "consumer".into(),
            protocols: vec![],
            require_known_member_id: false,
            reason: None,
        }
    }

    fn hb(member: &str, epoch: i32, owned: Option<Assignment>) -> ConsumerHeartbeatParams {
        ConsumerHeartbeatParams {
            group_id: "g".into(),
            member_id: member.into(),
            member_epoch: epoch,
            instance_id: None,
            rack_id: None,
            rebalance_timeout_ms: 30_000,
            subscribed_topic_names: if epoch == 0 { Some(vec!["t".into()]) } else { None },
            subscribed_topic_regex: None,
            server_assignor: None,
            owned,
            client_id: "c".into(),
            client_host: "/h".into(),
            version: 1,
        }
    }

    fn count(a: &Option<Assignment>) -> usize {
        a.as_ref().map_or(0, |a| a.values().map(BTreeSet::len).sum())
    }

    #[test]
    fn second_member_gets_partitions_only_after_the_first_revokes_them() {
        let (_, cat) = catalog(4);
        let mut g = ConsumerGroup::default();
        let l = limits();
        let a = g.heartbeat(&hb("a", 0, None), &cat, 0, &l);
        assert_eq!((a.member_epoch, count(&a.assignment)), (1, 4));
        let owned_a = a.assignment.clone();
        let b = g.heartbeat(&hb("b", 0, None), &cat, 10, &l);
        // Everything is still a's: b is at the new epoch but waits.
        assert_eq!((b.member_epoch, count(&b.assignment)), (2, 0));
        g.check_invariants();
        // a is asked to give up two partitions, at its old epoch.
        let a2 = g.heartbeat(&hb("a", 1, owned_a), &cat, 20, &l);
        assert_eq!((a2.member_epoch, count(&a2.assignment)), (1, 2));
        let b2 = g.heartbeat(&hb("b", 2, None), &cat, 30, &l);
        assert!(b2.assignment.is_none(), "nothing released yet");
        // a acknowledges; then b gets them.
        let a3 = g.heartbeat(&hb("a", 1, a2.assignment.clone()), &cat, 40, &l);
        assert_eq!(a3.member_epoch, 2);
        let b3 = g.heartbeat(&hb("b", 2, None), &cat, 50, &l);
        assert_eq!(count(&b3.assignment), 2);
        assert_eq!(g.state(), GroupState::Stable);
        g.check_invariants();
    }

    #[test]
    fn errors_for_unknown_fenced_and_unreleased_members() {
        let (_, cat) = catalog(2);
        let mut g = ConsumerGroup::default();
        let l = limits();
        assert_eq!(g.heartbeat(&hb("x", 3, None), &cat, 0, &l).error, Some(ErrorKind::UnknownMember));
        g.heartbeat(&hb("a", 0, None), &cat, 0, &l);
        assert_eq!(g.heartbeat(&hb("a", 7, None), &cat, 0, &l).error, Some(ErrorKind::FencedMemberEpoch));
        let mut s = hb("s1", 0, None);
        s.instance_id = Some("i".into());
        assert!(g.heartbeat(&s, &cat, 0, &l).error.is_none());
        let mut s2 = hb("s2", 0, None);
        s2.instance_id = Some("i".into());
        assert_eq!(g.heartbeat(&s2, &cat, 0, &l).error, Some(ErrorKind::UnreleasedInstanceId));
        // After a temporary leave the successor takes over.
        let mut leave = hb("s1", STATIC_LEAVE_EPOCH, None);
        leave.instance_id = Some("i".into());
        assert_eq!(g.heartbeat(&leave, &cat, 0, &l).member_epoch, STATIC_LEAVE_EPOCH);
        assert!(g.heartbeat(&s2, &cat, 0, &l).error.is_none());
        let mut bad = hb("z", 0, None);
        bad.server_assignor = Some("sticky".into());
        assert_eq!(g.heartbeat(&bad, &cat, 0, &l).error, Some(ErrorKind::UnsupportedAssignor));
        g.check_invariants();
    }

    #[test]
    fn expired_and_slow_members_are_removed() {
        let (_, cat) = catalog(2);
        let mut g = ConsumerGroup::default();
        let l = limits();
        g.heartbeat(&hb("a", 0, None), &cat, 0, &l);
        g.poll(44_999);
        assert_eq!(g.members.len(), 1);
        g.poll(45_000);
        assert!(g.is_empty());
        // A member that never acknowledges a revocation is fenced at its rebalance timeout.
        let a = g.heartbeat(&hb("a", 0, None), &cat, 50_000, &l);
        g.heartbeat(&hb("b", 0, None), &cat, 50_000, &l);
        let a2 = g.heartbeat(&hb("a", a.member_epoch, a.assignment), &cat, 51_000, &l);
        assert_eq!(count(&a2.assignment), 1);
        g.heartbeat(&hb("b", 4, None), &cat, 60_000, &l);
        g.poll(81_000);
        assert!(!g.members.contains_key("a"));
        g.check_invariants();
    }

    #[test]
    fn a_lost_response_is_forgiven_and_a_rejoin_starts_over() {
        let (_, cat) = catalog(2);
        let mut g = ConsumerGroup::default();
        let l = limits();
        let a = g.heartbeat(&hb("a", 0, None), &cat, 0, &l);
        assert_eq!(a.member_epoch, 1);
        g.heartbeat(&hb("b", 0, None), &cat, 0, &l);
        // a is told to revoke one partition, then moves to epoch 2...
        let a2 = g.heartbeat(&hb("a", 1, a.assignment.clone()), &cat, 0, &l);
        let a3 = g.heartbeat(&hb("a", 1, a2.assignment.clone()), &cat, 0, &l);
        assert_eq!(a3.member_epoch, 2);
        // ...but that response was lost: a heartbeat at epoch 1 owning a subset is accepted.
        let again = g.heartbeat(&hb("a", 1, a2.assignment.clone()), &cat, 0, &l);
        assert_eq!((again.error, again.member_epoch), (None, 2));
        // Epoch 1 owning more than it has is fenced; a rejoin with epoch 0 starts over.
        assert_eq!(
            g.heartbeat(&hb("a", 1, a.assignment.clone()), &cat, 0, &l).error,
            Some(ErrorKind::FencedMemberEpoch)
        );
        let rejoined = g.heartbeat(&hb("a", 0, None), &cat, 0, &l);
        assert_eq!(rejoined.error, None);
        assert_eq!(count(&rejoined.assignment), 1);
        g.check_invariants();
    }

    #[test]
    fn an_empty_pattern_clears_the_members_regex() {
        let (_, cat) = catalog(2);
        let mut g = ConsumerGroup::default();
        let l = limits();
        let mut join = hb("a", 0, None);
        join.subscribed_topic_names = None;
        join.subscribed_topic_regex = Some("t.*".into());
        let a = g.heartbeat(&join, &cat, 0, &l);
        assert_eq!(count(&a.assignment), 2);
        let mut clear = hb("a", a.member_epoch, a.assignment.clone());
        clear.subscribed_topic_regex = Some(String::new());
        let cleared = g.heartbeat(&clear, &cat, 0, &l);
        // Subscribed to nothing now: everything is to be revoked.
        assert_eq!(count(&cleared.assignment), 0);
        let mut bad = hb("b", 0, None);
        bad.subscribed_topic_regex = Some("(".into());
        assert_eq!(g.heartbeat(&bad, &cat, 0, &l).error, Some(ErrorKind::InvalidRequest));
        g.check_invariants();
    }

    #[test]
    fn a_snapshot_loads_back_to_the_same_group() {
        let (_, cat) = catalog(3);
        let mut g = ConsumerGroup::default();
        let l = limits();
        let a = g.heartbeat(&hb("a", 0, None), &cat, 0, &l);
        g.heartbeat(&hb("b", 0, None), &cat, 0, &l);
        g.heartbeat(&hb("a", 1, a.assignment), &cat, 0, &l);
        let snapshot = g.snapshot();
        let loaded = ConsumerGroup::from_snapshot(snapshot.clone(), Bytes::new(), 1_000, &l);
        assert_eq!(loaded.snapshot(), snapshot);
        assert_eq!(loaded.state(), g.state());
        // a is revoking: its rebalance timeout restarts at the load, before its session ends.
        assert_eq!(loaded.next_deadline_ms(), Some(1_000 + 30_000));
        loaded.check_invariants();
    }

    #[test]
    fn a_converted_classic_member_revokes_through_rejoins_before_the_new_member_gets_partitions() {
        let (t, cat) = catalog(4);
        let l = limits();
        let seed = ClassicSeed {
            member_id: "c1".into(),
            instance_id: None,
            client_id: "c".into(),
            client_host: "/h".into(),
            rebalance_timeout_ms: 30_000,
            classic: ClassicMember { session_timeout_ms: 10_000, protocol_names: vec!["cooperative-sticky".into()] },
            subscribed: vec!["t".into()],
            assigned: vec![("t".into(), vec![0, 1, 2, 3])],
        };
        let mut g = ConsumerGroup::from_classic(5, vec![seed], &cat, 0);
        assert_eq!(g.state(), GroupState::Stable);
        let m = g.heartbeat(&hb("m", 0, None), &cat, 0, &l);
        assert_eq!((m.member_epoch, count(&m.assignment)), (6, 0));
        assert_eq!(g.classic_heartbeat("c1", 5, 0), Err(ErrorKind::RebalanceInProgress));
        let join = classic_join_params("c1", None);
        let all: Assignment = [(t, (0..4).collect())].into();
        // Still owning everything: it is told its kept half at its old generation.
        let (generation, _) = g.classic_join("c1", &join, vec!["t".into()], all, &cat, 0, &l).unwrap();
        assert_eq!(generation, 5);
        let kept = g.classic_sync("c1", 5).unwrap();
        assert_eq!(kept.values().map(BTreeSet::len).sum::<usize>(), 2);
        assert!(g.heartbeat(&hb("m", 6, None), &cat, 0, &l).assignment.is_none(), "nothing released yet");
        // It rejoins owning only the kept half: the other half goes to m.
        let (generation, _) = g.classic_join("c1", &join, vec!["t".into()], kept.clone(), &cat, 0, &l).unwrap();
        assert_eq!(generation, 6);
        assert_eq!(g.classic_sync("c1", 6).unwrap(), kept);
        assert_eq!(g.classic_heartbeat("c1", 6, 0), Ok(()));
        assert_eq!(count(&g.heartbeat(&hb("m", 6, None), &cat, 0, &l).assignment), 2);
        assert_eq!(g.state(), GroupState::Stable);
        g.check_invariants();
    }

    #[test]
    fn a_restarted_static_classic_member_takes_its_partitions_over_without_a_rebalance() {
        let (t, cat) = catalog(4);
        let l = limits();
        let mut g = ConsumerGroup::default();
        assert!(g.heartbeat(&hb("m", 0, None), &cat, 0, &l).error.is_none());
        let join = |member_id: &str| classic_join_params(member_id, Some("instance-1"));
        let none = Assignment::new();
        g.classic_join("c1", &join(""), vec!["t".into()], none.clone(), &cat, 0, &l).unwrap();
        // m gives half up; c1 rejoins until it holds its half.
        for _ in 0..4 {
            let epoch = g.members["m"].member_epoch;
            let owned = g.members["m"].assigned.clone();
            g.heartbeat(&hb("m", epoch, Some(owned)), &cat, 0, &l);
            let held = g.members["c1"].assigned.clone();
            g.classic_join("c1", &join("c1"), vec!["t".into()], held, &cat, 0, &l).unwrap();
        }
        let held = g.members["c1"].assigned.clone();
        assert_eq!(held.get(&t).map_or(0, BTreeSet::len), 2, "c1 holds its half");
        let epoch = g.group_epoch;
        // c1's process restarts: it joins as c2 with the same instance id and owns nothing yet.
        let (generation, _) = g.classic_join("c2", &join(""), vec!["t".into()], held.clone(), &cat, 0, &l).unwrap();
        assert_eq!(g.group_epoch, epoch, "no rebalance");
        assert!(!g.members.contains_key("c1"));
        assert_eq!(g.members["c2"].assigned, held);
        assert_eq!(g.classic_sync("c2", generation).unwrap(), held);
        // The old instance, still running somewhere, is fenced.
        assert_eq!(
            g.classic_join("c1", &join("c1"), vec!["t".into()], held, &cat, 0, &l),
            Err(ErrorKind::FencedInstance)
        );
        g.check_invariants();
    }

    #[test]
    fn commits_need_the_current_epoch() {
        let (_, cat) = catalog(1);
        let mut g = ConsumerGroup::default();
        assert_eq!(g.validate_commit("", None), Ok(()));
        g.heartbeat(&hb("a", 0, None), &cat, 0, &limits());
        assert_eq!(g.validate_commit("a", Some(1)), Ok(()));
        assert_eq!(g.validate_commit("a", Some(0)), Err(ErrorKind::StaleMemberEpoch));
        assert_eq!(g.validate_commit("b", Some(1)), Err(ErrorKind::UnknownMember));
        assert_eq!(g.validate_commit("", None), Err(ErrorKind::UnknownMember));
    }

    #[test]
    fn offset_fetches_by_a_member_need_its_current_epoch_and_others_read_freely() {
        let (_, cat) = catalog(1);
        let mut g = ConsumerGroup::default();
        g.heartbeat(&hb("a", 0, None), &cat, 0, &limits());
        assert_eq!(g.validate_fetch("a", 1), Ok(()));
        assert_eq!(g.validate_fetch("a", 0), Err(ErrorKind::StaleMemberEpoch));
        assert_eq!(g.validate_fetch("a", 2), Err(ErrorKind::FencedMemberEpoch));
        assert_eq!(g.validate_fetch("b", 1), Err(ErrorKind::UnknownMember));
        assert_eq!(g.validate_fetch("", -1), Ok(()), "an admin's fetch, with members present");
    }
}
