//! `weir consume --group`: a member of a classic consumer group, as Kafka's consumers are.
//!
//! The protocol, in the order a member lives it:
//! 1. FindCoordinator names the group's coordinator; everything below goes there.
//! 2. JoinGroup with protocol type `consumer` and the `range` assignor, whose metadata is a
//!    `ConsumerProtocolSubscription` (version 0: the topics), each prefixed by its version
//!    as Kafka's consumer encodes it. The first join of a new member is answered
//!    MEMBER_ID_REQUIRED with an id to join again with (KIP-394).
//! 3. SyncGroup: the leader (the member the coordinator chose) sends every member's
//!    assignment, computed with Kafka's range assignor over the members' subscriptions;
//!    the others send none. Each gets its `ConsumerProtocolAssignment` back.
//! 4. Heartbeat every [`HEARTBEAT_INTERVAL`] while consuming: REBALANCE_IN_PROGRESS means
//!    another member came or went, so the member commits what it printed and joins again;
//!    ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID mean it was dropped and joins as new.
//! 5. OffsetCommit with the generation and member id, after each batch printed.
//! 6. LeaveGroup on the way out (the count reached, the idle timeout, Ctrl-C), so the others
//!    take its partitions at once instead of after the session timeout.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition as AssignedPartition;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    ConsumerProtocolAssignment, ConsumerProtocolSubscription, GroupId, HeartbeatRequest, JoinGroupRequest,
    LeaveGroupRequest, OffsetCommitRequest, OffsetFetchRequest, SyncGroupRequest,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use weir_client::Cluster;

use super::{check, codes, failure, topic_name};

/// How long the coordinator keeps a member it does not hear from. Short, so partitions of a
/// `weir consume` killed without leaving go to the others soon (Kafka's consumer: 45 s).
const SESSION_TIMEOUT_MS: i32 = 10_000;
/// How long the coordinator waits for every member to join again in a rebalance.
const REBALANCE_TIMEOUT_MS: i32 = 30_000;
/// How often a member says it is alive: well within the session timeout.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);
/// The assignor this member offers, the one every Kafka client implements.
const ASSIGNOR: &str = "range";
/// Newest consumer-protocol version this decoder knows; newer ones only append fields, so
/// they decode at this version.
const CONSUMER_PROTOCOL_VERSION_MAX: i16 = 3;
/// How long joining may take before the command gives up: the coordinator's rebalance timeout,
/// plus a broker session timeout for a coordinator that died to be replaced.
const JOIN_WAIT_MAX: Duration = Duration::from_secs(45);
/// The pause before asking again a coordinator that is loading, moving or gone.
const COORDINATOR_RETRY_PAUSE: Duration = Duration::from_millis(200);

/// What a heartbeat or a commit says of the membership.
#[derive(Debug, PartialEq, Eq)]
pub enum Standing {
    /// Still a member of the generation.
    Member,
    /// A rebalance began: commit and join again.
    Rejoin,
}

/// One membership of `group`, consuming `topic`.
pub struct Member {
    group: String,
    topic: String,
    coordinator: i32,
    /// The coordinator said it no longer is one (it moved, or stopped): find it again before
    /// joining again.
    coordinator_moved: bool,
    member_id: String,
    generation: i32,
    /// The partitions of `topic` this member owns in this generation.
    pub assigned: Vec<i32>,
    last_heartbeat: Instant,
}

impl Member {
    /// A member of `group` about to join (with [`Member::rejoin`]), its coordinator found.
    pub fn new(cluster: &mut Cluster, group: &str, topic: &str) -> anyhow::Result<Member> {
        let coordinator = cluster.coordinator(group).map_err(failure)?;
        let member = Member {
            group: group.to_string(),
            topic: topic.to_string(),
            coordinator,
            coordinator_moved: false,
            member_id: String::new(),
            generation: -1,
            assigned: Vec::new(),
            last_heartbeat: Instant::now(),
        };
        Ok(member)
    }

    /// The coordinator is to be found again before the next join (it did not answer).
    pub fn find_coordinator_again(&mut self) {
        self.coordinator_moved = true;
    }

    /// JoinGroup then SyncGroup, again until a generation is complete.
    pub fn rejoin(&mut self, cluster: &mut Cluster) -> anyhow::Result<()> {
        let deadline = Instant::now() + JOIN_WAIT_MAX;
        while Instant::now() < deadline {
            if std::mem::take(&mut self.coordinator_moved) {
                std::thread::sleep(COORDINATOR_RETRY_PAUSE);
                self.coordinator = cluster.coordinator(&self.group).map_err(failure)?;
            }
            let Some(joined) = self.join_once(cluster)? else { continue };
            if let Some(assigned) = self.sync(cluster, joined)? {
                self.assigned = assigned;
                self.last_heartbeat = Instant::now();
                return Ok(());
            }
        }
        anyhow::bail!(
            "could not join group '{}' within {} s: it kept rebalancing or had no coordinator",
            self.group,
            JOIN_WAIT_MAX.as_secs()
        )
    }

    /// Sends `request` to the coordinator; `None` when it does not answer (its broker died or
    /// is unreachable): the group then moves to another broker, found again before the next
    /// join.
    fn ask_coordinator<R: kafka_protocol::protocol::Request>(
        &mut self,
        cluster: &mut Cluster,
        versions: std::ops::RangeInclusive<i16>,
        request: &R,
    ) -> anyhow::Result<Option<R::Response>> {
        match cluster.send_to(self.coordinator, versions, request) {
            Ok((_, response)) => Ok(Some(response)),
            Err(e) if e.is_unreachable() => {
                self.coordinator_moved = true;
                Ok(None)
            }
            Err(e) => Err(failure(e)),
        }
    }

    /// One JoinGroup; `None` when it must be sent again (a member id was handed out, or the
    /// group is rebalancing again).
    fn join_once(&mut self, cluster: &mut Cluster) -> anyhow::Result<Option<Joined>> {
        let request = JoinGroupRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(self.group.clone())))
            .with_session_timeout_ms(SESSION_TIMEOUT_MS)
            .with_rebalance_timeout_ms(REBALANCE_TIMEOUT_MS)
            .with_member_id(StrBytes::from_string(self.member_id.clone()))
            .with_protocol_type(StrBytes::from_static_str("consumer"))
            .with_protocols(vec![JoinGroupRequestProtocol::default()
                .with_name(StrBytes::from_static_str(ASSIGNOR))
                .with_metadata(subscription(&self.topic)?)]);
        let Some(response) = self.ask_coordinator(cluster, 4..=9, &request)? else { return Ok(None) };
        match response.error_code {
            codes::MEMBER_ID_REQUIRED => {
                self.member_id = response.member_id.to_string();
                return Ok(None);
            }
            codes::UNKNOWN_MEMBER_ID | codes::ILLEGAL_GENERATION => {
                self.member_id.clear();
                return Ok(None);
            }
            codes::REBALANCE_IN_PROGRESS => return Ok(None),
            codes::NOT_COORDINATOR | codes::COORDINATOR_NOT_AVAILABLE | codes::COORDINATOR_LOAD_IN_PROGRESS => {
                self.coordinator_moved = true;
                return Ok(None);
            }
            _ => {}
        }
        check(response.error_code, None, || format!("joining group '{}'", self.group))?;
        self.member_id = response.member_id.to_string();
        self.generation = response.generation_id;
        let leader = response.leader.as_str() == self.member_id;
        let subscriptions =
            response.members.iter().map(|m| (m.member_id.to_string(), subscribed_topics(&m.metadata))).collect();
        Ok(Some(Joined { leader, subscriptions }))
    }

    /// SyncGroup: the leader hands out the assignment. `None` when the group began another
    /// rebalance meanwhile.
    fn sync(&mut self, cluster: &mut Cluster, joined: Joined) -> anyhow::Result<Option<Vec<i32>>> {
        let assignments = if joined.leader { self.assign(cluster, &joined.subscriptions)? } else { Vec::new() };
        let request = SyncGroupRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(self.group.clone())))
            .with_generation_id(self.generation)
            .with_member_id(StrBytes::from_string(self.member_id.clone()))
            .with_assignments(assignments);
        let Some(response) = self.ask_coordinator(cluster, 0..=5, &request)? else { return Ok(None) };
        match response.error_code {
            codes::REBALANCE_IN_PROGRESS => return Ok(None),
            codes::NOT_COORDINATOR | codes::COORDINATOR_NOT_AVAILABLE | codes::COORDINATOR_LOAD_IN_PROGRESS => {
                self.coordinator_moved = true;
                return Ok(None);
            }
            codes::UNKNOWN_MEMBER_ID | codes::ILLEGAL_GENERATION => {
                self.member_id.clear();
                return Ok(None);
            }
            _ => {}
        }
        check(response.error_code, None, || format!("syncing group '{}'", self.group))?;
        let assigned = assigned_partitions(&response.assignment)
            .into_iter()
            .filter(|(topic, _)| *topic == self.topic)
            .flat_map(|(_, partitions)| partitions)
            .collect::<BTreeSet<i32>>();
        Ok(Some(assigned.into_iter().collect()))
    }

    /// The leader's work: every member's partitions by Kafka's range assignor, encoded.
    fn assign(
        &self,
        cluster: &mut Cluster,
        subscriptions: &BTreeMap<String, Vec<String>>,
    ) -> anyhow::Result<Vec<SyncGroupRequestAssignment>> {
        let topics: BTreeSet<String> = subscriptions.values().flatten().cloned().collect();
        let metadata = cluster.metadata(Some(&topics.iter().cloned().collect::<Vec<_>>())).map_err(failure)?;
        let counts: BTreeMap<String, i32> = metadata
            .topics
            .iter()
            // A topic answered with an error but its partitions (one without a leader during a
            // failover) still has them all: leaving it out would assign nothing.
            .filter(|t| t.error_code != codes::UNKNOWN_TOPIC_OR_PARTITION && !t.partitions.is_empty())
            .filter_map(|t| t.name.as_ref().map(|n| (n.to_string(), t.partitions.len() as i32)))
            .collect();
        let plan = range_assign(subscriptions, &counts);
        plan.into_iter()
            .map(|(member_id, topics)| {
                Ok(SyncGroupRequestAssignment::default()
                    .with_member_id(StrBytes::from_string(member_id))
                    .with_assignment(assignment_bytes(&topics)?))
            })
            .collect()
    }

    /// A heartbeat when one is due.
    pub fn heartbeat_if_due(&mut self, cluster: &mut Cluster) -> anyhow::Result<Standing> {
        if self.last_heartbeat.elapsed() < HEARTBEAT_INTERVAL {
            return Ok(Standing::Member);
        }
        let request = HeartbeatRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(self.group.clone())))
            .with_generation_id(self.generation)
            .with_member_id(StrBytes::from_string(self.member_id.clone()));
        let Some(response) = self.ask_coordinator(cluster, 0..=4, &request)? else { return Ok(Standing::Rejoin) };
        self.last_heartbeat = Instant::now();
        self.standing(response.error_code, "heartbeat")
    }

    fn standing(&mut self, code: i16, what: &str) -> anyhow::Result<Standing> {
        match code {
            0 => Ok(Standing::Member),
            codes::REBALANCE_IN_PROGRESS => Ok(Standing::Rejoin),
            codes::UNKNOWN_MEMBER_ID | codes::ILLEGAL_GENERATION => {
                self.member_id.clear();
                Ok(Standing::Rejoin)
            }
            // The group moved to another coordinator (a broker stopped or lost the group's
            // partition): its new coordinator knows the members from the log, and a rebalance
            // follows there.
            codes::NOT_COORDINATOR | codes::COORDINATOR_NOT_AVAILABLE | codes::COORDINATOR_LOAD_IN_PROGRESS => {
                self.coordinator_moved = true;
                Ok(Standing::Rejoin)
            }
            code => check(code, None, || format!("{what} of group '{}'", self.group)).map(|()| Standing::Member),
        }
    }

    /// The group's committed offsets of this member's partitions.
    pub fn committed(&self, cluster: &mut Cluster) -> anyhow::Result<BTreeMap<i32, i64>> {
        use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
        let request = OffsetFetchRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(self.group.clone())))
            .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                .with_name(topic_name(&self.topic))
                .with_partition_indexes(self.assigned.clone())]));
        let (_, response) = cluster.send_to(self.coordinator, 2..=7, &request).map_err(failure)?;
        check(response.error_code, None, || format!("offsets of group '{}'", self.group))?;
        let mut out = BTreeMap::new();
        for t in response.topics.iter().filter(|t| t.name.as_str() == self.topic) {
            for p in &t.partitions {
                check(p.error_code, None, || format!("offset of {}-{}", self.topic, p.partition_index))?;
                if p.committed_offset >= 0 {
                    out.insert(p.partition_index, p.committed_offset);
                }
            }
        }
        Ok(out)
    }

    /// Commits `offsets` (partition → next offset to read) as this generation's member.
    pub fn commit(&mut self, cluster: &mut Cluster, offsets: &[(i32, i64)]) -> anyhow::Result<Standing> {
        if offsets.is_empty() {
            return Ok(Standing::Member);
        }
        let request = OffsetCommitRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(self.group.clone())))
            .with_generation_id_or_member_epoch(self.generation)
            .with_member_id(StrBytes::from_string(self.member_id.clone()))
            .with_topics(vec![OffsetCommitRequestTopic::default().with_name(topic_name(&self.topic)).with_partitions(
                offsets
                    .iter()
                    .map(|&(p, o)| {
                        OffsetCommitRequestPartition::default().with_partition_index(p).with_committed_offset(o)
                    })
                    .collect(),
            )]);
        let Some(response) = self.ask_coordinator(cluster, 2..=8, &request)? else { return Ok(Standing::Rejoin) };
        let code = response.topics.iter().flat_map(|t| &t.partitions).map(|p| p.error_code).find(|&c| c != 0);
        self.standing(code.unwrap_or(0), "commit")
    }

    /// LeaveGroup, so the others take the partitions at once.
    pub fn leave(&self, cluster: &mut Cluster) -> anyhow::Result<()> {
        if self.member_id.is_empty() {
            return Ok(());
        }
        let request = LeaveGroupRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(self.group.clone())))
            .with_members(
                vec![MemberIdentity::default().with_member_id(StrBytes::from_string(self.member_id.clone()))],
            );
        let (_, response) = cluster.send_to(self.coordinator, 3..=5, &request).map_err(failure)?;
        check(response.error_code, None, || format!("leaving group '{}'", self.group))
    }
}

/// What a JoinGroup answered: whether this member leads, and (for the leader) every member's
/// subscribed topics.
struct Joined {
    leader: bool,
    subscriptions: BTreeMap<String, Vec<String>>,
}

/// This member's JoinGroup metadata: version 0 of `ConsumerProtocolSubscription`, prefixed by
/// its version.
fn subscription(topic: &str) -> anyhow::Result<Bytes> {
    let mut out = BytesMut::new();
    out.put_i16(0);
    ConsumerProtocolSubscription::default()
        .with_topics(vec![StrBytes::from_string(topic.to_string())])
        .encode(&mut out, 0)?;
    Ok(out.freeze())
}

/// The topics a member's subscription names; none if it does not decode (a member of another
/// kind of client gets nothing rather than failing the group).
fn subscribed_topics(metadata: &Bytes) -> Vec<String> {
    let mut buf = metadata.clone();
    if buf.remaining() < 2 {
        return Vec::new();
    }
    let version = buf.get_i16();
    if version < 0 {
        return Vec::new();
    }
    ConsumerProtocolSubscription::decode(&mut buf, version.min(CONSUMER_PROTOCOL_VERSION_MAX))
        .map(|s| s.topics.iter().map(|t| t.to_string()).collect())
        .unwrap_or_default()
}

/// A `ConsumerProtocolAssignment` (version 0, prefixed by its version) of `topics`.
fn assignment_bytes(topics: &BTreeMap<String, Vec<i32>>) -> anyhow::Result<Bytes> {
    let mut out = BytesMut::new();
    out.put_i16(0);
    ConsumerProtocolAssignment::default()
        .with_assigned_partitions(
            topics
                .iter()
                .map(|(t, partitions)| {
                    AssignedPartition::default().with_topic(topic_name(t)).with_partitions(partitions.clone())
                })
                .collect(),
        )
        .encode(&mut out, 0)?;
    Ok(out.freeze())
}

/// The (topic, partitions) of an assignment; nothing for an empty or undecodable one.
pub(super) fn assigned_partitions(bytes: &Bytes) -> Vec<(String, Vec<i32>)> {
    let mut buf = bytes.clone();
    if buf.remaining() < 2 {
        return Vec::new();
    }
    let version = buf.get_i16();
    if version < 0 {
        return Vec::new();
    }
    ConsumerProtocolAssignment::decode(&mut buf, version.min(CONSUMER_PROTOCOL_VERSION_MAX))
        .map(|a| a.assigned_partitions.into_iter().map(|tp| (tp.topic.to_string(), tp.partitions)).collect())
        .unwrap_or_default()
}

/// Kafka's range assignor: for each topic, its subscribers sorted by member id each take a
/// contiguous range of partitions, the first `partitions % subscribers` one more than the
/// rest. Every member appears in the plan (with nothing, if it subscribes to nothing that
/// exists), so each gets an answer to its SyncGroup.
pub fn range_assign(
    subscriptions: &BTreeMap<String, Vec<String>>,
    partition_counts: &BTreeMap<String, i32>,
) -> BTreeMap<String, BTreeMap<String, Vec<i32>>> {
    let mut plan: BTreeMap<String, BTreeMap<String, Vec<i32>>> =
        subscriptions.keys().map(|m| (m.clone(), BTreeMap::new())).collect();
    for (topic, &count) in partition_counts {
        // BTreeMap keys: already sorted by member id.
        let subscribers: Vec<&String> =
            subscriptions.iter().filter(|(_, topics)| topics.contains(topic)).map(|(m, _)| m).collect();
        if subscribers.is_empty() || count <= 0 {
            continue;
        }
        let n = subscribers.len() as i32;
        let (per_member, extra) = (count / n, count % n);
        for (i, member) in subscribers.into_iter().enumerate() {
            let i = i as i32;
            let start = i * per_member + i.min(extra);
            let length = per_member + i32::from(i < extra);
            if length > 0 {
                plan.entry(member.clone()).or_default().insert(topic.clone(), (start..start + length).collect());
            }
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_assignor_gives_contiguous_ranges_the_first_members_one_more() {
        let subs: BTreeMap<String, Vec<String>> = [
            ("b".to_string(), vec!["t".to_string()]),
            ("a".to_string(), vec!["t".to_string(), "u".to_string()]),
            ("c".to_string(), vec!["v".to_string()]),
        ]
        .into();
        let counts: BTreeMap<String, i32> = [("t".to_string(), 5), ("u".to_string(), 1), ("w".to_string(), 3)].into();
        let plan = range_assign(&subs, &counts);
        assert_eq!(plan["a"]["t"], vec![0, 1, 2]);
        assert_eq!(plan["b"]["t"], vec![3, 4]);
        assert_eq!(plan["a"]["u"], vec![0]);
        assert!(plan["c"].is_empty(), "a member subscribed to nothing that exists still gets an answer");
        let every: usize = plan.values().flat_map(|t| t.values()).map(Vec::len).sum();
        assert_eq!(every, 6, "each partition of a subscribed topic exactly once");
    }

    #[test]
    fn subscriptions_and_assignments_round_trip_with_their_version_prefix() {
        assert_eq!(subscribed_topics(&subscription("orders").expect("encodes")), vec!["orders"]);
        let topics: BTreeMap<String, Vec<i32>> = [("orders".to_string(), vec![1, 2])].into();
        let bytes = assignment_bytes(&topics).expect("encodes");
        assert_eq!(assigned_partitions(&bytes), vec![("orders".to_string(), vec![1, 2])]);
        assert!(assigned_partitions(&Bytes::new()).is_empty(), "an empty assignment is nothing");
        assert!(subscribed_topics(&Bytes::from_static(&[0, 0, 0xff])).is_empty(), "garbage is nothing");
    }
}
