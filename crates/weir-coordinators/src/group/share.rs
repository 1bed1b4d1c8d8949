//! One Kafka share group (KIP-932): its members, their epochs and the assignment, driven by
//! ShareGroupHeartbeat. Pure and synchronous like `consumer`: time and the topics' metadata are
//! passed in.
//!
//! A share group differs from a consumer group in what an assignment means: it says which
//! partitions a member fetches from, not which it owns. The records themselves are handed out
//! one by one under acquisition locks by the invisible-time engine (`weir-messaging`'s `pop/`),
//! so several members may fetch from one partition and nothing is revoked: a member moves to a
//! new assignment at once.
//!
//! Epochs: the group epoch goes up whenever what the assignment depends on changes (a member
//! joins or leaves, a subscription changes, a subscribed topic gains partitions); the
//! assignment is then computed again (the assignment epoch catches up) and every member moves
//! to it with its next heartbeat.
//!
//! Invariants (checked by `check_invariants`): a member's epoch never exceeds the assignment
//! epoch, which never exceeds the group epoch; every assigned partition exists in the catalog
//! the assignment was computed from and belongs to a topic the member subscribes to.

use std::collections::{BTreeMap, BTreeSet};

use uuid::Uuid;

use super::consumer::{Catalog, LEAVE_EPOCH};
use super::{ErrorKind, GroupState};

/// The assignor share groups use: Kafka's name for it.
pub const SHARE_ASSIGNOR: &str = "simple";

/// Partitions by topic id.
pub type ShareAssignment = BTreeMap<Uuid, BTreeSet<i32>>;

/// The settings one share group obeys: the broker's `group.share.*`, overridden by the group's
/// `share.*` configs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShareLimits {
    pub(crate) session_timeout_ms: i32,
    pub(crate) heartbeat_interval_ms: i32,
    pub(crate) max_size: usize,
}

/// A ShareGroupHeartbeat. `subscribed_topic_names` is `None` when unchanged.
#[derive(Debug, Clone)]
pub struct ShareHeartbeatParams {
    pub group_id: String,
    pub member_id: String,
    pub member_epoch: i32,
    pub rack_id: Option<String>,
    pub subscribed_topic_names: Option<Vec<String>>,
    pub client_id: String,
    pub client_host: String,
}

#[derive(Debug, Clone)]
pub struct ShareHeartbeatResult {
    pub error: Option<ErrorKind>,
    pub member_id: Option<String>,
    pub member_epoch: i32,
    pub heartbeat_interval_ms: i32,
    /// The member's whole assignment when it or the epoch changed since the member was last
    /// told; `None` means unchanged.
    pub assignment: Option<ShareAssignment>,
}

impl ShareHeartbeatResult {
    pub(crate) fn error(kind: ErrorKind) -> ShareHeartbeatResult {
        ShareHeartbeatResult {
            error: Some(kind),
            member_id: None,
            member_epoch: 0,
            heartbeat_interval_ms: 0,
            assignment: None,
        }
    }
}

/// ShareGroupDescribe's view of a group.
#[derive(Debug, Clone)]
pub struct ShareGroupDescription {
    pub group_id: String,
    pub error: Option<ErrorKind>,
    pub state: GroupState,
    pub group_epoch: i32,
    pub assignment_epoch: i32,
    pub assignor_name: String,
    pub members: Vec<ShareMemberDescription>,
}

#[derive(Debug, Clone)]
pub struct ShareMemberDescription {
    pub member_id: String,
    pub rack_id: Option<String>,
    pub member_epoch: i32,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topic_names: Vec<String>,
    /// (topic id, topic name, partitions).
    pub assignment: Vec<(Uuid, String, Vec<i32>)>,
}

/// One member. Stored in the group record without its session deadline (a loaded member gets
/// a whole session from the load) and what it was last told (a loaded member is told again).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct ShareMember {
    member_epoch: i32,
    rack_id: Option<String>,
    client_id: String,
    client_host: String,
    subscribed: BTreeSet<String>,
    assigned: ShareAssignment,
    #[serde(skip)]
    session_deadline_ms: i64,
    /// The (epoch, assignment) the member was last told.
    #[serde(skip)]
    sent: Option<(i32, ShareAssignment)>,
}

/// One share group's membership.
#[derive(Debug, Clone, Default)]
pub(crate) struct ShareGroup {
    pub(crate) group_epoch: i32,
    pub(crate) assignment_epoch: i32,
    members: BTreeMap<String, ShareMember>,
    /// Partition counts of the subscribed topics when the assignment was last computed: a
    /// topic that grows bumps the group epoch.
    partitions_seen: BTreeMap<Uuid, i32>,
    /// The group record last stored in `__consumer_offsets` (`None`: none yet), so that only
    /// a heartbeat that changes the group writes one.
    pub(crate) persisted_value: Option<bytes::Bytes>,
}

/// What `__consumer_offsets` keeps of a share group (see [`ShareMember`] for what of a member).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct ShareGroupSnapshot {
    group_epoch: i32,
    assignment_epoch: i32,
    members: BTreeMap<String, ShareMember>,
    partitions_seen: BTreeMap<Uuid, i32>,
}

impl ShareGroup {
    pub(crate) fn snapshot(&self) -> ShareGroupSnapshot {
        ShareGroupSnapshot {
            group_epoch: self.group_epoch,
            assignment_epoch: self.assignment_epoch,
            members: self.members.clone(),
            partitions_seen: self.partitions_seen.clone(),
        }
    }

    /// The group as a coordinator loads it: every member with a whole session from `now_ms`.
    pub(crate) fn from_snapshot(
        snapshot: ShareGroupSnapshot,
        persisted_value: bytes::Bytes,
        now_ms: i64,
        session_timeout_ms: i32,
    ) -> ShareGroup {
        let deadline = now_ms.saturating_add(i64::from(session_timeout_ms));
        let mut members = snapshot.members;
        for member in members.values_mut() {
            member.session_deadline_ms = deadline;
            member.sent = None;
        }
        ShareGroup {
            group_epoch: snapshot.group_epoch,
            assignment_epoch: snapshot.assignment_epoch,
            members,
            partitions_seen: snapshot.partitions_seen,
            persisted_value: Some(persisted_value),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    pub(crate) fn state(&self) -> GroupState {
        if self.members.is_empty() {
            GroupState::Empty
        } else {
            GroupState::Stable
        }
    }

    pub(crate) fn has_member(&self, member_id: &str) -> bool {
        self.members.contains_key(member_id)
    }

    /// Every topic name some member subscribes to, or `extra` names.
    pub(crate) fn subscribed_names(&self) -> BTreeSet<String> {
        self.members.values().flat_map(|m| m.subscribed.iter().cloned()).collect()
    }

    /// Removes the members whose session ran out; true if any was.
    pub(crate) fn expire(&mut self, now_ms: i64) -> bool {
        let before = self.members.len();
        self.members.retain(|_, m| m.session_deadline_ms > now_ms);
        let expired = self.members.len() != before;
        if expired {
            self.group_epoch += 1;
        }
        expired
    }

    /// One heartbeat: join (epoch 0), heartbeat, or leave (epoch -1).
    pub(crate) fn heartbeat(
        &mut self,
        params: &ShareHeartbeatParams,
        catalog: &Catalog,
        now_ms: i64,
        limits: &ShareLimits,
    ) -> ShareHeartbeatResult {
        let interval = limits.heartbeat_interval_ms;
        if params.member_epoch == LEAVE_EPOCH {
            if self.members.remove(&params.member_id).is_some() {
                self.group_epoch += 1;
                self.refresh(catalog);
            }
            return ShareHeartbeatResult {
                error: None,
                member_id: Some(params.member_id.clone()),
                member_epoch: LEAVE_EPOCH,
                heartbeat_interval_ms: 0,
                assignment: None,
            };
        }
        if params.member_epoch < 0 {
            return ShareHeartbeatResult::error(ErrorKind::InvalidRequest);
        }
        let member_id = if params.member_id.is_empty() { Uuid::new_v4().to_string() } else { params.member_id.clone() };
        if params.member_epoch == 0 {
            // A join, or a member that lost its epoch rejoining: it starts afresh.
            let Some(names) = params.subscribed_topic_names.as_ref() else {
                return ShareHeartbeatResult::error(ErrorKind::InvalidRequest);
            };
            if !self.members.contains_key(&member_id) && self.members.len() >= limits.max_size {
                return ShareHeartbeatResult::error(ErrorKind::GroupFull);
            }
            self.members.remove(&member_id);
            self.members.insert(
                member_id.clone(),
                ShareMember {
                    member_epoch: 0,
                    rack_id: params.rack_id.clone(),
                    client_id: params.client_id.clone(),
                    client_host: params.client_host.clone(),
                    subscribed: names.iter().cloned().collect(),
                    assigned: ShareAssignment::new(),
                    session_deadline_ms: 0,
                    sent: None,
                },
            );
            self.group_epoch += 1;
        } else {
            let Some(member) = self.members.get_mut(&member_id) else {
                return ShareHeartbeatResult::error(ErrorKind::UnknownMember);
            };
            if params.member_epoch != member.member_epoch {
                return ShareHeartbeatResult::error(ErrorKind::FencedMemberEpoch);
            }
            if let Some(names) = params.subscribed_topic_names.as_ref() {
                let names: BTreeSet<String> = names.iter().cloned().collect();
                if names != member.subscribed {
                    member.subscribed = names;
                    self.group_epoch += 1;
                }
            }
            if params.rack_id.is_some() && params.rack_id != member.rack_id {
                member.rack_id = params.rack_id.clone();
            }
        }
        self.refresh(catalog);
        let epoch = self.assignment_epoch;
        let Some(member) = self.members.get_mut(&member_id) else {
            return ShareHeartbeatResult::error(ErrorKind::Internal);
        };
        member.session_deadline_ms = now_ms.saturating_add(i64::from(limits.session_timeout_ms));
        member.member_epoch = epoch;
        // Sent again with every new epoch, so a member always knows the assignment of its epoch.
        let changed = member.sent.as_ref().is_none_or(|(at, sent)| *at != epoch || *sent != member.assigned);
        let assignment = changed.then(|| member.assigned.clone());
        if changed {
            member.sent = Some((epoch, member.assigned.clone()));
        }
        ShareHeartbeatResult {
            error: None,
            member_id: Some(member_id),
            member_epoch: epoch,
            heartbeat_interval_ms: interval,
            assignment,
        }
    }

    /// Bumps the group epoch if a subscribed topic changed its partitions, then computes the
    /// assignment again if the group epoch is ahead of it.
    pub(crate) fn refresh(&mut self, catalog: &Catalog) {
        let subscribed = self.subscribed_names();
        let seen: BTreeMap<Uuid, i32> = catalog
            .iter()
            .filter(|(_, t)| subscribed.contains(&t.name))
            .map(|(id, t)| (*id, t.spec.partitions))
            .collect();
        if seen != self.partitions_seen {
            self.partitions_seen = seen;
            self.group_epoch += 1;
        }
        if self.assignment_epoch == self.group_epoch {
            return;
        }
        let subscriptions: BTreeMap<&str, &BTreeSet<String>> =
            self.members.iter().map(|(id, m)| (id.as_str(), &m.subscribed)).collect();
        let mut assignment = assign(&subscriptions, catalog);
        for (id, member) in self.members.iter_mut() {
            member.assigned = assignment.remove(id.as_str()).unwrap_or_default();
        }
        self.assignment_epoch = self.group_epoch;
        self.check_invariants(catalog);
    }

    pub(crate) fn describe(&self, group_id: &str, name_of: &dyn Fn(Uuid) -> Option<String>) -> ShareGroupDescription {
        let members = self
            .members
            .iter()
            .map(|(id, m)| ShareMemberDescription {
                member_id: id.clone(),
                rack_id: m.rack_id.clone(),
                member_epoch: m.member_epoch,
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                subscribed_topic_names: m.subscribed.iter().cloned().collect(),
                assignment: m
                    .assigned
                    .iter()
                    .filter_map(|(topic, ps)| name_of(*topic).map(|n| (*topic, n, ps.iter().copied().collect())))
                    .collect(),
            })
            .collect();
        ShareGroupDescription {
            group_id: group_id.to_string(),
            error: None,
            state: self.state(),
            group_epoch: self.group_epoch,
            assignment_epoch: self.assignment_epoch,
            assignor_name: SHARE_ASSIGNOR.to_string(),
            members,
        }
    }

    /// Whether `member_id` is assigned `partition` of `topic`.
    #[cfg(test)]
    pub(crate) fn is_assigned(&self, member_id: &str, topic: Uuid, partition: i32) -> bool {
        self.members.get(member_id).is_some_and(|m| m.assigned.get(&topic).is_some_and(|p| p.contains(&partition)))
    }

    fn check_invariants(&self, catalog: &Catalog) {
        if !cfg!(debug_assertions) {
            return;
        }
        assert!(self.assignment_epoch <= self.group_epoch, "{} > {}", self.assignment_epoch, self.group_epoch);
        for (id, m) in &self.members {
            assert!(m.member_epoch <= self.assignment_epoch, "{id}: {} > {}", m.member_epoch, self.assignment_epoch);
            for (topic, partitions) in &m.assigned {
                let info = catalog.get(topic).unwrap_or_else(|| panic!("{id}: unknown topic {topic}"));
                assert!(m.subscribed.contains(&info.name), "{id}: not subscribed to {}", info.name);
                assert!(partitions.iter().all(|p| (0..info.spec.partitions).contains(p)), "{id}: {partitions:?}");
            }
        }
    }
}

/// The simple assignor (Kafka's share groups' `simple`): every partition of a subscribed topic
/// goes to at least one of the members subscribed to it. With at least as many partitions as
/// members they are dealt out in turn (member i of n gets partitions i, i + n, ...); with fewer,
/// every member gets every partition and they share them, record by record.
pub(crate) fn assign(
    subscriptions: &BTreeMap<&str, &BTreeSet<String>>,
    catalog: &Catalog,
) -> BTreeMap<String, ShareAssignment> {
    let mut out: BTreeMap<String, ShareAssignment> = BTreeMap::new();
    for (topic_id, info) in catalog {
        let members: Vec<&str> =
            subscriptions.iter().filter(|(_, names)| names.contains(&info.name)).map(|(id, _)| *id).collect();
        if members.is_empty() || info.spec.partitions <= 0 {
            continue;
        }
        let partitions = info.spec.partitions;
        let count = members.len() as i32;
        for (i, member) in members.iter().enumerate() {
            let mine: BTreeSet<i32> = if partitions < count {
                (0..partitions).collect()
            } else {
                (0..partitions).filter(|p| p % count == i as i32).collect()
            };
            out.entry(member.to_string()).or_default().insert(*topic_id, mine);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::assignor::TopicSpec;
    use super::super::consumer::TopicInfo;
    use super::*;

    const LIMITS: ShareLimits = ShareLimits { session_timeout_ms: 45_000, heartbeat_interval_ms: 5_000, max_size: 10 };

    fn catalog(topics: &[(u128, &str, i32)]) -> Catalog {
        topics
            .iter()
            .map(|(id, name, partitions)| {
                (
                    Uuid::from_u128(*id),
                    TopicInfo {
                        name: name.to_string(),
                        spec: TopicSpec { partitions: *partitions, racks: Vec::new() },
                    },
                )
            })
            .collect()
    }

    fn join(member: &str, topics: &[&str]) -> ShareHeartbeatParams {
        ShareHeartbeatParams {
            group_id: "g".into(),
            member_id: member.into(),
            member_epoch: 0,
            rack_id: None,
            subscribed_topic_names: Some(topics.iter().map(|t| t.to_string()).collect()),
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
        }
    }

    fn beat(member: &str, epoch: i32) -> ShareHeartbeatParams {
        ShareHeartbeatParams { member_epoch: epoch, subscribed_topic_names: None, ..join(member, &[]) }
    }

    fn partitions(result: &ShareHeartbeatResult, topic: u128) -> Vec<i32> {
        let assignment = result.assignment.as_ref().expect("an assignment");
        assignment.get(&Uuid::from_u128(topic)).map(|p| p.iter().copied().collect()).unwrap_or_default()
    }

    #[test]
    fn given_fewer_partitions_than_members_when_they_join_every_member_gets_every_partition() {
        let catalog = catalog(&[(1, "t", 2)]);
        let mut group = ShareGroup::default();
        let a = group.heartbeat(&join("a", &["t"]), &catalog, 0, &LIMITS);
        assert_eq!((a.error, partitions(&a, 1)), (None, vec![0, 1]));
        let first = a.member_epoch;
        assert!(first > 0);
        let b = group.heartbeat(&join("b", &["t"]), &catalog, 0, &LIMITS);
        assert_eq!(partitions(&b, 1), [1], "two members, two partitions: one each");
        let c = group.heartbeat(&join("c", &["t"]), &catalog, 0, &LIMITS);
        assert_eq!((c.member_epoch, partitions(&c, 1)), (first + 2, vec![0, 1]), "three members share two partitions");
        // a catches up with the new epoch and gets the whole topic again.
        let a = group.heartbeat(&beat("a", first), &catalog, 10, &LIMITS);
        assert_eq!((a.member_epoch, partitions(&a, 1)), (first + 2, vec![0, 1]));
        let again = group.heartbeat(&beat("a", first + 2), &catalog, 20, &LIMITS);
        assert!(again.assignment.is_none(), "an unchanged assignment is not sent again");
        assert_eq!(group.state(), GroupState::Stable);
    }

    #[test]
    fn given_a_member_when_it_leaves_or_its_session_ends_the_others_take_its_partitions() {
        let catalog = catalog(&[(1, "t", 4)]);
        let mut group = ShareGroup::default();
        let first = group.heartbeat(&join("a", &["t"]), &catalog, 0, &LIMITS).member_epoch;
        let b = group.heartbeat(&join("b", &["t"]), &catalog, 0, &LIMITS);
        assert_eq!(partitions(&b, 1), [1, 3]);
        let left = group.heartbeat(&beat("b", LEAVE_EPOCH), &catalog, 1, &LIMITS);
        assert_eq!((left.error, left.member_epoch), (None, LEAVE_EPOCH));
        let a = group.heartbeat(&beat("a", first + 1), &catalog, 2, &LIMITS);
        assert_eq!(a.error, Some(ErrorKind::FencedMemberEpoch), "a never saw the epoch b joined at");
        let a = group.heartbeat(&beat("a", first), &catalog, 2, &LIMITS);
        assert_eq!((a.member_epoch, partitions(&a, 1)), (first + 2, vec![0, 1, 2, 3]));

        group.heartbeat(&join("c", &["t"]), &catalog, 2, &LIMITS);
        assert!(!group.expire(LIMITS.session_timeout_ms as i64 + 1), "both heartbeated at 2");
        assert!(group.expire(LIMITS.session_timeout_ms as i64 + 2));
        assert!(group.is_empty());
        assert_eq!(group.state(), GroupState::Empty);
    }

    #[test]
    fn given_a_heartbeat_of_an_unknown_member_or_a_join_without_topics_it_is_refused() {
        let catalog = catalog(&[(1, "t", 1)]);
        let mut group = ShareGroup::default();
        assert_eq!(group.heartbeat(&beat("x", 3), &catalog, 0, &LIMITS).error, Some(ErrorKind::UnknownMember));
        assert_eq!(group.heartbeat(&beat("x", 0), &catalog, 0, &LIMITS).error, Some(ErrorKind::InvalidRequest));
        let small = ShareLimits { max_size: 1, ..LIMITS };
        assert_eq!(group.heartbeat(&join("a", &["t"]), &catalog, 0, &small).error, None);
        assert_eq!(group.heartbeat(&join("b", &["t"]), &catalog, 0, &small).error, Some(ErrorKind::GroupFull));
        // A member with no id gets one.
        let fresh = group.heartbeat(&join("", &["t"]), &catalog, 0, &LIMITS);
        assert!(fresh.member_id.is_some_and(|id| !id.is_empty()));
    }

    #[test]
    fn given_a_topic_that_grows_or_a_changed_subscription_the_assignment_follows() {
        let mut group = ShareGroup::default();
        let small = catalog(&[(1, "t", 1), (2, "u", 1)]);
        let a = group.heartbeat(&join("a", &["t"]), &small, 0, &LIMITS);
        assert_eq!(partitions(&a, 1), [0]);
        let grown = catalog(&[(1, "t", 3), (2, "u", 1)]);
        let a = group.heartbeat(&beat("a", a.member_epoch), &grown, 1, &LIMITS);
        assert_eq!(partitions(&a, 1), [0, 1, 2]);
        let moved =
            ShareHeartbeatParams { subscribed_topic_names: Some(vec!["u".into()]), ..beat("a", a.member_epoch) };
        let a = group.heartbeat(&moved, &grown, 2, &LIMITS);
        assert_eq!((partitions(&a, 1), partitions(&a, 2)), (vec![], vec![0]));
        assert!(group.is_assigned("a", Uuid::from_u128(2), 0));
        assert!(!group.is_assigned("a", Uuid::from_u128(1), 0));
    }
}
