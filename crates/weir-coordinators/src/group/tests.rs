//! Group coordinator tests on a real broker in a temporary directory: the classic protocol's
//! state machine driven the way clients drive it, and committed offsets across a crash.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::task::JoinHandle;

use super::*;
use weir_broker::{Broker, BrokerConfig, NewTopic};

const TOPIC: &str = "t";
const WAIT: Duration = Duration::from_secs(10);

fn config(dir: &Path, extra: &[(&str, &str)]) -> BrokerConfig {
    let mut map: BTreeMap<String, String> = BTreeMap::new();
    map.insert("log.dirs".into(), dir.display().to_string());
    map.insert("group.initial.rebalance.delay.ms".into(), "0".into());
    map.insert("group.min.session.timeout.ms".into(), "10".into());
    map.insert("offsets.topic.num.partitions".into(), "4".into());
    map.insert("log.cleaner.enable".into(), "false".into());
    for (k, v) in extra {
        map.insert(k.to_string(), v.to_string());
    }
    BrokerConfig::from_settings(&map).unwrap()
}

async fn open(dir: &Path, extra: &[(&str, &str)]) -> (Arc<Broker>, Arc<GroupCoordinator>) {
    let config = config(dir, extra);
    tokio::task::spawn_blocking(move || {
        let broker = Broker::open(config).unwrap();
        for name in [TOPIC, "other"] {
            if broker.metadata().topic(name).is_none() {
                let topic = NewTopic {
                    name: name.into(),
                    partitions: 4,
                    replication_factor: -1,
                    assignments: Vec::new(),
                    configs: BTreeMap::new(),
                };
                broker.create_topics_blocking(vec![topic], false).pop().unwrap().unwrap();
            }
        }
        let groups = GroupCoordinator::start(broker.clone()).unwrap();
        (broker, groups)
    })
    .await
    .unwrap()
}

/// A ConsumerProtocolSubscription v0: version, topics, null user data.
fn subscription(topics: &[&str]) -> Bytes {
    let mut buf = BytesMut::new();
    buf.put_i16(0);
    buf.put_i32(topics.len() as i32);
    for topic in topics {
        buf.put_i16(topic.len() as i16);
        buf.put_slice(topic.as_bytes());
    }
    buf.put_i32(-1);
    buf.freeze()
}

fn join_params(group: &str, member_id: &str, instance: Option<&str>) -> JoinGroupParams {
    JoinGroupParams {
        group_id: group.into(),
        member_id: member_id.into(),
        group_instance_id: instance.map(String::from),
        client_id: "client".into(),
        client_host: "/127.0.0.1".into(),
        session_timeout_ms: 10_000,
        rebalance_timeout_ms: 10_000,
        protocol_type: "consumer".into(),
        protocols: vec![
            Protocol { name: "range".into(), metadata: subscription(&[TOPIC]) },
            Protocol { name: "roundrobin".into(), metadata: subscription(&[TOPIC]) },
        ],
        require_known_member_id: true,
        reason: None,
    }
}

fn spawn_join(groups: &Arc<GroupCoordinator>, params: JoinGroupParams) -> JoinHandle<JoinGroupResult> {
    let groups = groups.clone();
    tokio::spawn(async move { groups.join_group(params).await })
}

fn spawn_sync(
    groups: &Arc<GroupCoordinator>,
    group: &str,
    generation: i32,
    member: &str,
    assignments: Vec<(String, Bytes)>,
) -> JoinHandle<SyncGroupResult> {
    let groups = groups.clone();
    let params = SyncGroupParams {
        group_id: group.into(),
        generation_id: generation,
        member_id: member.into(),
        group_instance_id: None,
        protocol_type: Some("consumer".into()),
        protocol_name: None,
        assignments,
    };
    tokio::spawn(async move { groups.sync_group(params).await })
}

/// Spawns the join of a new member and waits until the coordinator has it, so that whatever
/// comes next comes after it.
async fn spawn_join_first(groups: &Arc<GroupCoordinator>, params: JoinGroupParams) -> JoinHandle<JoinGroupResult> {
    let (group, member) = (params.group_id.clone(), params.member_id.clone());
    let handle = spawn_join(groups, params);
    let started = std::time::Instant::now();
    while !describe(groups, &group).await.members.iter().any(|m| m.member_id == member) {
        assert!(started.elapsed() < WAIT, "{member} never reached the coordinator");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    handle
}

async fn finish<T>(handle: JoinHandle<T>) -> T {
    tokio::time::timeout(WAIT, handle).await.expect("request completes").unwrap()
}

/// The generation a successful join hands out.
fn generation_of(joined: &JoinGroupResult) -> i32 {
    joined.generation_id.expect("a successful join has a generation")
}

/// KIP-394: the first join only hands out a member id.
async fn member_id(groups: &Arc<GroupCoordinator>, group: &str) -> String {
    let result = groups.join_group(join_params(group, "", None)).await;
    assert_eq!(result.error, Some(ErrorKind::MemberIdRequired));
    assert!(result.member_id.starts_with("client-"), "{}", result.member_id);
    result.member_id
}

async fn heartbeat(
    groups: &Arc<GroupCoordinator>,
    group: &str,
    generation: i32,
    member: &str,
) -> Result<(), ErrorKind> {
    let params = HeartbeatParams {
        group_id: group.into(),
        generation_id: generation,
        member_id: member.into(),
        group_instance_id: None,
    };
    groups.heartbeat(params).await
}

async fn describe(groups: &GroupCoordinator, group: &str) -> GroupDescription {
    groups.describe_groups(&[group.to_string()]).await.pop().unwrap()
}

/// Every member of `members` joins at once; returns the generation and leader all agree on.
/// `others` joined already and are in the generation too.
async fn rebalance(
    groups: &Arc<GroupCoordinator>,
    group: &str,
    members: &[String],
    others: &[String],
) -> (i32, String) {
    let handles: Vec<_> = members.iter().map(|m| spawn_join(groups, join_params(group, m, None))).collect();
    let mut results = Vec::new();
    for handle in handles {
        results.push(finish(handle).await);
    }
    let generation = generation_of(&results[0]);
    let leader = results[0].leader_id.clone();
    for (member, result) in members.iter().zip(&results) {
        assert_eq!(result.error, None, "{member}");
        assert_eq!(&result.member_id, member);
        assert_eq!(result.generation_id, Some(generation));
        assert_eq!(result.leader_id, leader);
        assert_eq!(result.protocol_name.as_deref(), Some("range"));
        if *member == leader {
            let mut got: Vec<String> = result.members.iter().map(|m| m.member_id.clone()).collect();
            let mut want: Vec<String> = members.iter().chain(others).cloned().collect();
            got.sort();
            want.sort();
            assert_eq!(got, want, "the leader sees every member");
            assert!(result.members.iter().all(|m| m.metadata == subscription(&[TOPIC])));
        } else {
            assert!(result.members.is_empty(), "followers get no member list");
        }
    }
    groups.check_invariants();
    (generation, leader)
}

/// Followers sync first and wait; the leader's sync hands everyone exactly its assignment.
async fn sync_all(groups: &Arc<GroupCoordinator>, group: &str, generation: i32, leader: &str, members: &[String]) {
    let assignment = |m: &str| Bytes::from(format!("assignment-of-{m}"));
    let followers: Vec<_> = members
        .iter()
        .filter(|m| *m != leader)
        .map(|m| (m.clone(), spawn_sync(groups, group, generation, m, Vec::new())))
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    for (member, handle) in &followers {
        assert!(!handle.is_finished(), "{member}'s sync waits for the leader");
    }
    assert_eq!(describe(groups, group).await.state, GroupState::CompletingRebalance);
    let all: Vec<(String, Bytes)> = members.iter().map(|m| (m.clone(), assignment(m))).collect();
    let result = finish(spawn_sync(groups, group, generation, leader, all)).await;
    assert_eq!(result.error, None);
    assert_eq!(result.assignment, assignment(leader));
    for (member, handle) in followers {
        let result = finish(handle).await;
        assert_eq!(result.error, None, "{member}");
        assert_eq!(result.assignment, assignment(&member), "{member} gets its own assignment");
    }
    let description = describe(groups, group).await;
    assert_eq!(description.state, GroupState::Stable);
    assert_eq!(description.members.len(), members.len());
    for m in &description.members {
        assert_eq!(m.assignment, assignment(&m.member_id));
    }
    groups.check_invariants();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_three_members_when_a_fourth_joins_and_one_leaves_then_each_change_is_one_new_generation() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, groups) = open(dir.path(), &[]).await;
    let g = "g";

    // The first member forms generation 1 at once (initial delay 0).
    let a = member_id(&groups, g).await;
    let (generation, leader) = rebalance(&groups, g, std::slice::from_ref(&a), &[]).await;
    assert_eq!((generation, leader.as_str()), (1, a.as_str()));
    sync_all(&groups, g, generation, &leader, std::slice::from_ref(&a)).await;

    // Two more join: each time the existing members learn of the rebalance by heartbeat.
    let mut members = vec![a.clone()];
    let mut generation = generation;
    for _ in 0..2 {
        let new = member_id(&groups, g).await;
        let joining = spawn_join_first(&groups, join_params(g, &new, None)).await;
        assert!(!joining.is_finished(), "the join waits for the existing members");
        assert_eq!(describe(&groups, g).await.state, GroupState::PreparingRebalance);
        for m in &members {
            assert_eq!(heartbeat(&groups, g, generation, m).await, Err(ErrorKind::RebalanceInProgress));
        }
        let (next, leader) = rebalance(&groups, g, &members, std::slice::from_ref(&new)).await;
        members.push(new);
        let joined = finish(joining).await;
        assert_eq!(joined.generation_id, Some(next));
        assert_eq!(next, generation + 1);
        assert_eq!(leader, a, "the leader stays while it rejoins");
        generation = next;
        sync_all(&groups, g, generation, &leader, &members).await;
        for m in &members {
            assert_eq!(heartbeat(&groups, g, generation, m).await, Ok(()));
        }
    }
    assert_eq!(members.len(), 3);

    // A fourth member.
    let d = member_id(&groups, g).await;
    let joining = spawn_join_first(&groups, join_params(g, &d, None)).await;
    let (next, leader) = rebalance(&groups, g, &members, std::slice::from_ref(&d)).await;
    assert_eq!(finish(joining).await.generation_id, Some(next));
    assert_eq!(next, generation + 1);
    generation = next;
    members.push(d.clone());
    sync_all(&groups, g, generation, &leader, &members).await;

    // The leader leaves: the others rejoin, one of them leads generation + 1.
    let left = groups
        .leave_group(g, vec![LeavingMember { member_id: a.clone(), group_instance_id: None, reason: None }])
        .await;
    assert_eq!(left.error, None);
    assert_eq!(left.members[0].error, None);
    members.retain(|m| *m != a);
    assert_eq!(heartbeat(&groups, g, generation, &a).await, Err(ErrorKind::UnknownMember));
    let (next, leader) = rebalance(&groups, g, &members, &[]).await;
    assert_eq!(next, generation + 1);
    assert!(members.contains(&leader));
    sync_all(&groups, g, next, &leader, &members).await;

    // Everyone leaves: the group is Empty with a new generation.
    let leaving = members.iter().map(|m| LeavingMember { member_id: m.clone(), group_instance_id: None, reason: None });
    let left = groups.leave_group(g, leaving.collect()).await;
    assert!(left.members.iter().all(|m| m.error.is_none()));
    let description = describe(&groups, g).await;
    assert_eq!(description.state, GroupState::Empty);
    assert!(description.members.is_empty());
    groups.check_invariants();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_a_silent_member_when_its_session_expires_then_it_is_removed_and_the_group_rebalances() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, groups) = open(dir.path(), &[]).await;
    let g = "g";
    let a = member_id(&groups, g).await;
    let b = member_id(&groups, g).await;
    let short = |m: &str| JoinGroupParams { session_timeout_ms: 1000, ..join_params(g, m, None) };
    // a forms generation 1 alone; then both join generation 2.
    assert_eq!(finish(spawn_join(&groups, short(&a))).await.generation_id, Some(1));
    let members = vec![a.clone(), b.clone()];
    let handles = vec![spawn_join_first(&groups, short(&b)).await, spawn_join(&groups, short(&a))];
    let mut generation = 0;
    let mut leader = String::new();
    for h in handles {
        let r = finish(h).await;
        assert_eq!(r.error, None);
        generation = generation_of(&r);
        leader = r.leader_id;
    }
    sync_all(&groups, g, generation, &leader, &members).await;

    // a heartbeats, b is silent: b is gone after its 1 s session.
    let started = std::time::Instant::now();
    loop {
        match heartbeat(&groups, g, generation, &a).await {
            Ok(()) => {}
            Err(ErrorKind::RebalanceInProgress) => break,
            Err(e) => panic!("unexpected {e:?}"),
        }
        assert!(started.elapsed() < WAIT, "b never expired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(started.elapsed() >= Duration::from_millis(800), "expired after {:?}", started.elapsed());
    assert_eq!(heartbeat(&groups, g, generation, &b).await, Err(ErrorKind::UnknownMember));
    let r = finish(spawn_join(&groups, short(&a))).await;
    assert_eq!(r.generation_id, Some(generation + 1));
    assert_eq!(r.leader_id, a);
    assert_eq!(r.members.len(), 1);
    groups.check_invariants();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_a_rebalance_when_a_member_does_not_rejoin_in_time_then_it_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, groups) = open(dir.path(), &[]).await;
    let g = "g";
    let quick = |m: &str| JoinGroupParams { rebalance_timeout_ms: 300, ..join_params(g, m, None) };
    let a = member_id(&groups, g).await;
    let b = member_id(&groups, g).await;
    finish(spawn_join(&groups, quick(&a))).await;
    let jb = spawn_join_first(&groups, quick(&b)).await;
    let ja = spawn_join(&groups, quick(&a));
    let (ra, rb) = (finish(ja).await, finish(jb).await);
    assert_eq!(ra.generation_id, Some(2));
    assert_eq!(rb.generation_id, Some(2));
    let members = vec![a.clone(), b.clone()];
    sync_all(&groups, g, 2, &ra.leader_id, &members).await;

    // c joins; only a rejoins; b (whose session is still fine) is dropped at the rebalance timeout.
    let c = member_id(&groups, g).await;
    let started = std::time::Instant::now();
    let jc = spawn_join_first(&groups, quick(&c)).await;
    let ja = spawn_join(&groups, quick(&a));
    let (ra, rc) = (finish(ja).await, finish(jc).await);
    assert!(started.elapsed() >= Duration::from_millis(250), "waited {:?}", started.elapsed());
    assert_eq!(ra.generation_id, Some(3));
    assert_eq!(rc.generation_id, Some(3));
    let leader_result = if ra.leader_id == a { &ra } else { &rc };
    let mut seen: Vec<String> = leader_result.members.iter().map(|m| m.member_id.clone()).collect();
    seen.sort();
    let mut want = vec![a.clone(), c.clone()];
    want.sort();
    assert_eq!(seen, want);
    assert_eq!(heartbeat(&groups, g, 2, &b).await, Err(ErrorKind::UnknownMember));
    groups.check_invariants();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_a_static_member_when_it_restarts_unchanged_then_no_rebalance_and_the_old_id_is_fenced() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, groups) = open(dir.path(), &[]).await;
    let g = "g";
    // Static members skip MEMBER_ID_REQUIRED.
    let first = finish(spawn_join(&groups, join_params(g, "", Some("instance-a")))).await;
    assert_eq!(first.error, None);
    let a = first.member_id.clone();
    assert!(a.starts_with("instance-a-"));
    let b = member_id(&groups, g).await;
    let jb = spawn_join_first(&groups, join_params(g, &b, None)).await;
    let ja = spawn_join(&groups, join_params(g, &a, Some("instance-a")));
    let (ra, rb) = (finish(ja).await, finish(jb).await);
    assert_eq!((ra.error, rb.error), (None, None));
    let generation = generation_of(&ra);
    assert_eq!(ra.leader_id, a);
    let members = vec![a.clone(), b.clone()];
    sync_all(&groups, g, generation, &a, &members).await;

    // a restarts: same instance id, no member id, same protocols.
    let restarted = finish(spawn_join(&groups, join_params(g, "", Some("instance-a")))).await;
    assert_eq!(restarted.error, None);
    let a2 = restarted.member_id.clone();
    assert_ne!(a2, a);
    assert_eq!(restarted.generation_id, Some(generation), "no new generation");
    assert_eq!(restarted.leader_id, a, "told the old leader id, so it does not assign");
    assert_eq!(describe(&groups, g).await.state, GroupState::Stable);
    let mut sync = SyncGroupParams {
        group_id: g.into(),
        generation_id: generation,
        member_id: a2.clone(),
        group_instance_id: Some("instance-a".into()),
        protocol_type: None,
        protocol_name: None,
        assignments: Vec::new(),
    };
    let synced = groups.sync_group(sync.clone()).await;
    assert_eq!(synced.error, None);
    assert_eq!(synced.assignment, Bytes::from(format!("assignment-of-{a}")), "the old member's assignment");
    assert_eq!(heartbeat(&groups, g, generation, &b).await, Ok(()), "b saw no rebalance");

    // The old member id is fenced everywhere.
    let old = HeartbeatParams {
        group_id: g.into(),
        generation_id: generation,
        member_id: a.clone(),
        group_instance_id: Some("instance-a".into()),
    };
    assert_eq!(groups.heartbeat(old.clone()).await, Err(ErrorKind::FencedInstance));
    sync.member_id = a.clone();
    assert_eq!(groups.sync_group(sync).await.error, Some(ErrorKind::FencedInstance));
    let commit = CommitParams {
        group_id: g.into(),
        generation_id: Some(generation),
        member_id: a.clone(),
        group_instance_id: Some("instance-a".into()),
        offsets: vec![OffsetToCommit {
            topic: TOPIC.into(),
            partition: 0,
            offset: 1,
            leader_epoch: None,
            metadata: None,
        }],
    };
    assert_eq!(groups.commit_offsets(commit).await[0].error, Some(ErrorKind::FencedInstance));
    let rejoin = groups.join_group(join_params(g, &a, Some("instance-a"))).await;
    assert_eq!(rejoin.error, Some(ErrorKind::FencedInstance));
    assert_eq!(groups.heartbeat(HeartbeatParams { member_id: a2.clone(), ..old }).await, Ok(()));

    // Restarting with different metadata does rebalance.
    let mut changed = join_params(g, "", Some("instance-a"));
    changed.protocols[0].metadata = subscription(&[TOPIC, "other"]);
    let ja3 = spawn_join(&groups, changed);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(describe(&groups, g).await.state, GroupState::PreparingRebalance);
    assert_eq!(heartbeat(&groups, g, generation, &b).await, Err(ErrorKind::RebalanceInProgress));
    let rb = finish(spawn_join(&groups, join_params(g, &b, None))).await;
    let ra3 = finish(ja3).await;
    assert_eq!(rb.generation_id, Some(generation + 1));
    assert_eq!(ra3.generation_id, Some(generation + 1));
    groups.check_invariants();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_and_validation_errors_follow_kafkas_rules() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, groups) = open(dir.path(), &[("group.max.size", "2")]).await;
    let g = "g";

    assert_eq!(groups.join_group(join_params("", "", None)).await.error, Some(ErrorKind::InvalidGroupId));
    let bad_session = JoinGroupParams { session_timeout_ms: 5, ..join_params(g, "", None) };
    assert_eq!(groups.join_group(bad_session).await.error, Some(ErrorKind::InvalidSessionTimeout));
    let too_long = JoinGroupParams { session_timeout_ms: 1_800_001, ..join_params(g, "", None) };
    assert_eq!(groups.join_group(too_long).await.error, Some(ErrorKind::InvalidSessionTimeout));
    assert_eq!(groups.join_group(join_params(g, "nobody", None)).await.error, Some(ErrorKind::UnknownMember));
    let no_protocols = JoinGroupParams { protocols: Vec::new(), ..join_params(g, "", None) };
    assert_eq!(groups.join_group(no_protocols).await.error, Some(ErrorKind::InconsistentGroupProtocol));
    assert!(groups.list_groups(&[]).await.unwrap().is_empty(), "failed joins leave no group behind");

    let a = member_id(&groups, g).await;
    let ra = finish(spawn_join(&groups, join_params(g, &a, None))).await;
    let generation = generation_of(&ra);

    // While CompletingRebalance: commits are refused, heartbeats accepted.
    let commit = |generation_id: Option<i32>, member_id: &str| CommitParams {
        group_id: g.into(),
        generation_id,
        member_id: member_id.into(),
        group_instance_id: None,
        offsets: vec![OffsetToCommit {
            topic: TOPIC.into(),
            partition: 0,
            offset: 5,
            leader_epoch: Some(3),
            metadata: None,
        }],
    };
    assert_eq!(
        groups.commit_offsets(commit(Some(generation), &a)).await[0].error,
        Some(ErrorKind::RebalanceInProgress)
    );
    assert_eq!(heartbeat(&groups, g, generation, &a).await, Ok(()));
    sync_all(&groups, g, generation, &a, std::slice::from_ref(&a)).await;

    assert_eq!(heartbeat(&groups, g, generation + 1, &a).await, Err(ErrorKind::WrongGeneration));
    assert_eq!(heartbeat(&groups, g, generation, "nobody").await, Err(ErrorKind::UnknownMember));
    assert_eq!(heartbeat(&groups, "unknown-group", 1, &a).await, Err(ErrorKind::UnknownMember));
    let stale = finish(spawn_sync(&groups, g, generation - 1, &a, Vec::new())).await;
    assert_eq!(stale.error, Some(ErrorKind::WrongGeneration));
    let wrong_type = SyncGroupParams {
        group_id: g.into(),
        generation_id: generation,
        member_id: a.clone(),
        group_instance_id: None,
        protocol_type: Some("connect".into()),
        protocol_name: None,
        assignments: Vec::new(),
    };
    assert_eq!(groups.sync_group(wrong_type).await.error, Some(ErrorKind::InconsistentGroupProtocol));
    assert_eq!(
        groups.commit_offsets(commit(Some(generation + 1), &a)).await[0].error,
        Some(ErrorKind::WrongGeneration)
    );
    assert_eq!(
        groups.commit_offsets(commit(Some(generation), "nobody")).await[0].error,
        Some(ErrorKind::UnknownMember)
    );
    assert_eq!(
        groups.commit_offsets(commit(None, "")).await[0].error,
        Some(ErrorKind::UnknownMember),
        "simple commit to a live group"
    );
    let unknown_topic = CommitParams {
        offsets: vec![OffsetToCommit {
            topic: "missing".into(),
            partition: 0,
            offset: 1,
            leader_epoch: None,
            metadata: None,
        }],
        ..commit(Some(generation), &a)
    };
    assert_eq!(groups.commit_offsets(unknown_topic).await[0].error, Some(ErrorKind::UnknownTopicOrPartition));
    let big = CommitParams {
        offsets: vec![OffsetToCommit {
            topic: TOPIC.into(),
            partition: 1,
            offset: 1,
            leader_epoch: None,
            metadata: Some("x".repeat(OFFSET_METADATA_MAX_BYTES + 1)),
        }],
        ..commit(Some(generation), &a)
    };
    assert_eq!(groups.commit_offsets(big).await[0].error, Some(ErrorKind::OffsetMetadataTooLarge));
    assert_eq!(groups.commit_offsets(commit(Some(generation), &a)).await[0].error, None);
    let fetched = groups.fetch_offsets(g, Some(vec![(TOPIC.into(), 0), (TOPIC.into(), 1)]), false).await.unwrap();
    assert_eq!((fetched[0].offset, fetched[0].leader_epoch), (Some(5), Some(3)));
    assert_eq!((fetched[1].offset, fetched[1].leader_epoch), (None, None), "nothing committed");

    // group.max.size = 2: a third member is turned away.
    let b = member_id(&groups, g).await;
    let jb = spawn_join_first(&groups, join_params(g, &b, None)).await;
    let ja = spawn_join(&groups, join_params(g, &a, None));
    let (ra, rb) = (finish(ja).await, finish(jb).await);
    assert_eq!((ra.error, rb.error), (None, None));
    let rc = groups.join_group(join_params(g, "", None)).await;
    assert_eq!(rc.error, Some(ErrorKind::GroupFull));
    assert_eq!(rc.member_id, "");
    assert_eq!(describe(&groups, g).await.members.len(), 2);

    // A full group still takes back a restarting static member.
    let f = "full";
    let s1 = finish(spawn_join(&groups, join_params(f, "", Some("s1")))).await;
    let x = member_id(&groups, f).await;
    let jx = spawn_join_first(&groups, join_params(f, &x, None)).await;
    let rs = finish(spawn_join(&groups, join_params(f, &s1.member_id, Some("s1")))).await;
    let rx = finish(jx).await;
    assert_eq!((rs.error, rx.error, rs.generation_id), (None, None, Some(2)));
    sync_all(&groups, f, 2, &rs.leader_id, &[s1.member_id.clone(), x.clone()]).await;
    let restarted = groups.join_group(join_params(f, "", Some("s1"))).await;
    assert_eq!((restarted.error, restarted.generation_id), (None, Some(2)));
    assert_eq!(groups.join_group(join_params(f, "", Some("s2"))).await.error, Some(ErrorKind::GroupFull));

    // Leaving with a wrong instance id, or an unknown member, fails per member.
    let left = groups
        .leave_group(
            g,
            vec![
                LeavingMember { member_id: "nobody".into(), group_instance_id: None, reason: None },
                LeavingMember { member_id: String::new(), group_instance_id: Some("nope".into()), reason: None },
            ],
        )
        .await;
    assert_eq!(left.members[0].error, Some(ErrorKind::UnknownMember));
    assert_eq!(left.members[1].error, Some(ErrorKind::UnknownMember));
    groups.check_invariants();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_an_initial_delay_when_members_arrive_together_then_one_generation_holds_them_all() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, groups) = open(dir.path(), &[("group.initial.rebalance.delay.ms", "300")]).await;
    let g = "g";
    let ids = [member_id(&groups, g).await, member_id(&groups, g).await, member_id(&groups, g).await];
    let started = std::time::Instant::now();
    let (generation, leader) = rebalance(&groups, g, &ids, &[]).await;
    assert!(started.elapsed() >= Duration::from_millis(250), "waited the initial delay");
    assert_eq!(generation, 1);
    sync_all(&groups, g, generation, &leader, &ids).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_waiting_joins_when_the_coordinator_shuts_down_then_they_return() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, groups) = open(dir.path(), &[]).await;
    let g = "g";
    let a = member_id(&groups, g).await;
    let ra = finish(spawn_join(&groups, join_params(g, &a, None))).await;
    let follower_sync = {
        let b = member_id(&groups, "h").await;
        let rb = finish(spawn_join(&groups, join_params("h", &b, None))).await;
        let c = member_id(&groups, "h").await;
        let jc = spawn_join_first(&groups, join_params("h", &c, None)).await;
        let jb = spawn_join(&groups, join_params("h", &b, None));
        let (rb2, rc) = (finish(jb).await, finish(jc).await);
        assert_eq!(generation_of(&rb2), generation_of(&rb) + 1);
        let follower = if rb2.leader_id == b { c } else { b };
        spawn_sync(&groups, "h", generation_of(&rc), &follower, Vec::new())
    };
    sync_all(&groups, g, generation_of(&ra), &a, std::slice::from_ref(&a)).await;
    let b = member_id(&groups, g).await;
    let waiting = spawn_join(&groups, join_params(g, &b, None));
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!waiting.is_finished());
    assert!(!follower_sync.is_finished());
    groups.shutdown();
    assert_eq!(finish(waiting).await.error, Some(ErrorKind::CoordinatorNotAvailable));
    assert_eq!(finish(follower_sync).await.error, Some(ErrorKind::CoordinatorNotAvailable));
    assert_eq!(groups.join_group(join_params(g, "", None)).await.error, Some(ErrorKind::CoordinatorNotAvailable));
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// kill -9 of `broker` and `groups` (no shutdown), then a broker and coordinator on a copy of
/// what its directory `dir` held: what was durable is what survives.
async fn after_a_crash(
    dir: &Path,
    broker: Arc<Broker>,
    groups: Arc<GroupCoordinator>,
) -> (tempfile::TempDir, Arc<Broker>, Arc<GroupCoordinator>) {
    drop(groups);
    drop(broker);
    let copy = tempfile::tempdir().unwrap();
    copy_dir(dir, copy.path());
    let (broker, groups) = open(copy.path(), &[]).await;
    (copy, broker, groups)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_committed_offsets_when_the_broker_crashes_and_restarts_then_they_are_all_there() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, groups) = open(dir.path(), &[]).await;

    // A consumer group: committed by a member of a stable generation.
    let g = "consumers";
    let a = member_id(&groups, g).await;
    let ra = finish(spawn_join(&groups, join_params(g, &a, None))).await;
    sync_all(&groups, g, generation_of(&ra), &a, std::slice::from_ref(&a)).await;
    let offsets: Vec<OffsetToCommit> = (0..4)
        .map(|p| OffsetToCommit {
            topic: TOPIC.into(),
            partition: p,
            offset: 100 + i64::from(p),
            leader_epoch: Some(7),
            metadata: Some(format!("meta-{p}")),
        })
        .collect();
    let commit = CommitParams {
        group_id: g.into(),
        generation_id: ra.generation_id,
        member_id: a.clone(),
        group_instance_id: None,
        offsets: offsets.clone(),
    };
    assert!(groups.commit_offsets(commit.clone()).await.iter().all(|r| r.error.is_none()));
    // A later commit overwrites one of them.
    let again = CommitParams { offsets: vec![OffsetToCommit { offset: 555, ..offsets[0].clone() }], ..commit.clone() };
    assert!(groups.commit_offsets(again).await.iter().all(|r| r.error.is_none()));

    // A standalone consumer's simple commits to a group without members.
    let simple = CommitParams {
        group_id: "standalone".into(),
        generation_id: None,
        member_id: String::new(),
        group_instance_id: None,
        offsets: vec![OffsetToCommit {
            topic: "other".into(),
            partition: 2,
            offset: 9,
            leader_epoch: None,
            metadata: None,
        }],
    };
    assert!(groups.commit_offsets(simple).await.iter().all(|r| r.error.is_none()));

    // A group whose offsets are deleted must stay deleted.
    let doomed = CommitParams { group_id: "doomed".into(), ..commit.clone() };
    let doomed = CommitParams { generation_id: None, member_id: String::new(), ..doomed };
    assert!(groups.commit_offsets(doomed).await.iter().all(|r| r.error.is_none()));
    let deleted = groups.delete_groups(vec!["doomed".into()]).await;
    assert_eq!(deleted, vec![("doomed".to_string(), None)]);

    let before_consumers = groups.fetch_offsets(g, None, false).await.unwrap();
    let before_standalone = groups.fetch_offsets("standalone", None, false).await.unwrap();
    assert_eq!(before_consumers.len(), 4);
    assert_eq!(before_consumers[0].offset, Some(555));
    assert_eq!(before_consumers[1].metadata, "meta-1");
    assert_eq!(before_standalone.len(), 1);

    // kill -9: no shutdown; what is on disk is what survives.
    let (_copy, _broker, groups) = after_a_crash(dir.path(), broker, groups).await;

    assert_eq!(groups.fetch_offsets(g, None, false).await.unwrap(), before_consumers);
    assert_eq!(groups.fetch_offsets("standalone", None, false).await.unwrap(), before_standalone);
    assert!(groups.fetch_offsets("doomed", None, false).await.unwrap().is_empty());
    let listed = groups.list_groups(&[]).await.unwrap();
    assert_eq!(
        listed,
        vec![
            GroupListing {
                group_id: g.into(),
                protocol_type: "consumer".into(),
                state: GroupState::Empty,
                group_type: "classic",
            },
            GroupListing {
                group_id: "standalone".into(),
                protocol_type: String::new(),
                state: GroupState::Empty,
                group_type: "classic",
            },
        ]
    );
    let description = describe(&groups, g).await;
    assert_eq!((description.state, description.protocol_type.as_str()), (GroupState::Empty, "consumer"));

    // The restarted group continues its generations; the old member id is unknown.
    assert_eq!(heartbeat(&groups, g, generation_of(&ra), &a).await, Err(ErrorKind::UnknownMember));
    let b = member_id(&groups, g).await;
    let rb = finish(spawn_join(&groups, join_params(g, &b, None))).await;
    assert_eq!(generation_of(&rb), generation_of(&ra) + 1);
    groups.check_invariants();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_groups_and_offset_delete_follow_kafkas_rules() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, groups) = open(dir.path(), &[]).await;
    let g = "g";
    let a = member_id(&groups, g).await;
    let ra = finish(spawn_join(&groups, join_params(g, &a, None))).await;
    sync_all(&groups, g, generation_of(&ra), &a, std::slice::from_ref(&a)).await;
    let commit = CommitParams {
        group_id: g.into(),
        generation_id: ra.generation_id,
        member_id: a.clone(),
        group_instance_id: None,
        offsets: vec![
            OffsetToCommit { topic: TOPIC.into(), partition: 0, offset: 1, leader_epoch: None, metadata: None },
            OffsetToCommit { topic: "other".into(), partition: 0, offset: 2, leader_epoch: None, metadata: None },
        ],
    };
    assert!(groups.commit_offsets(commit).await.iter().all(|r| r.error.is_none()));

    assert_eq!(
        groups.delete_groups(vec![g.into(), "unknown".into()]).await,
        vec![(g.to_string(), Some(ErrorKind::GroupNotEmpty)), ("unknown".to_string(), Some(ErrorKind::UnknownGroup))]
    );
    // Stable and subscribed to TOPIC (not to "other").
    let results = groups
        .delete_offsets(g.into(), vec![(TOPIC.into(), 0), ("other".into(), 0), ("missing".into(), 0)])
        .await
        .unwrap();
    let errors: Vec<Option<ErrorKind>> = results.iter().map(|r| r.error).collect();
    assert_eq!(errors, vec![Some(ErrorKind::GroupSubscribedToTopic), None, Some(ErrorKind::UnknownTopicOrPartition)]);
    let left = groups.fetch_offsets(g, None, false).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].topic, TOPIC);
    assert_eq!(groups.delete_offsets("unknown".into(), vec![]).await, Err(ErrorKind::UnknownGroup));

    groups.leave_group(g, vec![LeavingMember { member_id: a.clone(), group_instance_id: None, reason: None }]).await;
    assert_eq!(groups.delete_groups(vec![g.into()]).await, vec![(g.to_string(), None)]);
    assert!(groups.list_groups(&[]).await.unwrap().is_empty());
    assert_eq!(describe(&groups, g).await.state, GroupState::Dead);
    assert!(groups.fetch_offsets(g, None, false).await.unwrap().is_empty());

    // Deleting all offsets of an Empty group deletes the group.
    let simple = CommitParams {
        group_id: "s".into(),
        generation_id: None,
        member_id: String::new(),
        group_instance_id: None,
        offsets: vec![OffsetToCommit {
            topic: TOPIC.into(),
            partition: 3,
            offset: 1,
            leader_epoch: None,
            metadata: None,
        }],
    };
    assert!(groups.commit_offsets(simple).await.iter().all(|r| r.error.is_none()));
    let results = groups.delete_offsets("s".into(), vec![(TOPIC.into(), 3)]).await.unwrap();
    assert_eq!(results[0].error, None);
    assert!(groups.list_groups(&[]).await.unwrap().is_empty());

    let (_copy, _broker, groups) = after_a_crash(dir.path(), broker, groups).await;
    assert!(groups.list_groups(&[]).await.unwrap().is_empty(), "deletions are durable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_an_empty_group_when_its_offsets_outlive_the_retention_then_they_expire() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, groups) = open(dir.path(), &[("offsets.retention.minutes", "1")]).await;
    let commit = |group: &str, partition: i32| CommitParams {
        group_id: group.into(),
        generation_id: None,
        member_id: String::new(),
        group_instance_id: None,
        offsets: vec![OffsetToCommit { topic: TOPIC.into(), partition, offset: 1, leader_epoch: None, metadata: None }],
    };
    groups.commit_offsets(commit("old", 0)).await;
    let now = weir_broker::Broker::now_ms(&_broker);
    groups.expire_offsets_at(now + 30_000);
    assert_eq!(groups.fetch_offsets("old", None, false).await.unwrap().len(), 1, "not yet");

    // A group with members keeps its offsets however old.
    let a = member_id(&groups, "live").await;
    let ra = finish(spawn_join(&groups, join_params("live", &a, None))).await;
    sync_all(&groups, "live", generation_of(&ra), &a, std::slice::from_ref(&a)).await;
    let member_commit = CommitParams { generation_id: ra.generation_id, member_id: a.clone(), ..commit("live", 1) };
    groups.commit_offsets(member_commit).await;

    groups.expire_offsets_at(now + 61_000);
    assert!(groups.fetch_offsets("old", None, false).await.unwrap().is_empty());
    let listed: Vec<String> = groups.list_groups(&[]).await.unwrap().into_iter().map(|l| l.group_id).collect();
    assert_eq!(listed, vec!["live".to_string()], "the emptied group is gone");
    assert_eq!(groups.fetch_offsets("live", None, false).await.unwrap().len(), 1);
    let states = groups.list_groups(&[GroupState::Empty]).await.unwrap();
    assert!(states.is_empty());
    let stable = groups.list_groups(&[GroupState::Stable]).await.unwrap();
    assert_eq!(stable.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_a_group_rebalancing_when_a_follower_never_syncs_then_it_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, groups) = open(dir.path(), &[]).await;
    let g = "g";
    let quick = |m: &str| JoinGroupParams { rebalance_timeout_ms: 300, ..join_params(g, m, None) };
    let a = member_id(&groups, g).await;
    let b = member_id(&groups, g).await;
    finish(spawn_join(&groups, quick(&a))).await;
    let jb = spawn_join_first(&groups, quick(&b)).await;
    let ra = finish(spawn_join(&groups, quick(&a))).await;
    let rb = finish(jb).await;
    assert_eq!(ra.generation_id, rb.generation_id);
    let (leader, follower) = if ra.leader_id == a { (a.clone(), b.clone()) } else { (b.clone(), a.clone()) };
    let assignments = vec![(leader.clone(), Bytes::from_static(b"l")), (follower.clone(), Bytes::from_static(b"f"))];
    let synced = finish(spawn_sync(&groups, g, generation_of(&ra), &leader, assignments)).await;
    assert_eq!(synced.assignment, Bytes::from_static(b"l"));
    // The follower never syncs: after the rebalance timeout it is removed and the group
    // rebalances without it.
    let started = std::time::Instant::now();
    loop {
        if heartbeat(&groups, g, generation_of(&ra), &leader).await == Err(ErrorKind::RebalanceInProgress) {
            break;
        }
        assert!(started.elapsed() < WAIT);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(heartbeat(&groups, g, generation_of(&ra), &follower).await, Err(ErrorKind::UnknownMember));
    let r = finish(spawn_join(&groups, quick(&leader))).await;
    assert_eq!(r.members.len(), 1);
}

fn consumer_heartbeat(group: &str, member: &str, epoch: i32) -> ConsumerHeartbeatParams {
    ConsumerHeartbeatParams {
        group_id: group.into(),
        member_id: member.into(),
        member_epoch: epoch,
        instance_id: None,
        rack_id: None,
        rebalance_timeout_ms: if epoch == 0 { 30_000 } else { -1 },
        subscribed_topic_names: (epoch == 0).then(|| vec![TOPIC.to_string()]),
        subscribed_topic_regex: None,
        server_assignor: None,
        owned: None,
        client_id: "c".into(),
        client_host: "/127.0.0.1".into(),
        version: 1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_a_consumer_protocol_group_when_the_broker_crashes_then_it_carries_on_with_its_epochs() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, groups) = open(dir.path(), &[]).await;
    let g = "kip848";
    let a = groups.consumer_heartbeat(consumer_heartbeat(g, "a", 0)).await;
    assert_eq!((a.error, a.member_epoch), (None, 1));
    let b = groups.consumer_heartbeat(consumer_heartbeat(g, "b", 0)).await;
    assert_eq!((b.error, b.member_epoch), (None, 2));
    // a gives up half of its partitions, then b gets them.
    let mut a_hb = consumer_heartbeat(g, "a", 1);
    a_hb.owned = a.assignment.clone();
    let a2 = groups.consumer_heartbeat(a_hb.clone()).await;
    a_hb.owned = a2.assignment.clone();
    let a3 = groups.consumer_heartbeat(a_hb).await;
    assert_eq!(a3.member_epoch, 2);
    let b2 = groups.consumer_heartbeat(consumer_heartbeat(g, "b", 2)).await;
    assert_eq!(b2.assignment.as_ref().map(|x| x.values().map(|p| p.len()).sum::<usize>()), Some(2));
    let before = groups.consumer_group_describe(&[g.to_string()]).await;
    assert_eq!(before[0].state, GroupState::Stable);

    let (_copy, _broker, groups) = after_a_crash(dir.path(), broker, groups).await;

    let after = groups.consumer_group_describe(&[g.to_string()]).await;
    assert_eq!((after[0].group_epoch, after[0].assignment_epoch), (2, 2));
    let members = |d: &ConsumerGroupDescription| {
        d.members.iter().map(|m| (m.member_id.clone(), m.member_epoch, m.assignment.clone())).collect::<Vec<_>>()
    };
    assert_eq!(members(&after[0]), members(&before[0]));
    // The members heartbeat at their epochs as if nothing happened.
    let b3 = groups.consumer_heartbeat(consumer_heartbeat(g, "b", 2)).await;
    assert_eq!((b3.error, b3.member_epoch), (None, 2));
    let listed = groups.list_groups(&[]).await.unwrap();
    assert!(listed.iter().any(|l| l.group_id == g && l.group_type == GROUP_TYPE_CONSUMER));
    groups.check_invariants();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_a_classic_member_in_a_consumer_group_when_the_broker_crashes_then_it_carries_on_as_a_member() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, groups) = open(dir.path(), &[]).await;
    let g = "mixed";
    let a = groups.consumer_heartbeat(consumer_heartbeat(g, "a", 0)).await;
    assert_eq!((a.error, a.member_epoch), (None, 1));
    // A classic consumer joins the consumer group: the broker assigns, answered at once.
    let joined = groups.join_group(join_params(g, "", None)).await;
    assert_eq!(joined.error, None);
    let classic = joined.member_id.clone();
    let generation = generation_of(&joined);
    let synced = finish(spawn_sync(&groups, g, generation, &classic, Vec::new())).await;
    assert_eq!(synced.error, None);
    let before = groups.consumer_group_describe(&[g.to_string()]).await;
    assert!(before[0].members.iter().any(|m| m.member_id == classic), "{:?}", before[0].members);

    // kill -9 right after the classic member's answers: nothing else wrote the group since.
    let (copy, _broker, groups) = after_a_crash(dir.path(), broker, groups).await;

    let after = groups.consumer_group_describe(&[g.to_string()]).await;
    let ids = |d: &ConsumerGroupDescription| d.members.iter().map(|m| m.member_id.clone()).collect::<BTreeSet<_>>();
    assert_eq!(ids(&after[0]), ids(&before[0]), "the classic member survives the crash");
    // It heartbeats at its generation as if nothing happened (UNKNOWN_MEMBER_ID before the fix).
    let beat = heartbeat(&groups, g, generation, &classic).await;
    assert!(beat != Err(ErrorKind::UnknownMember), "{beat:?}");
    // Its leave is durable too.
    let leaving = vec![LeavingMember { member_id: classic.clone(), group_instance_id: None, reason: None }];
    assert_eq!(groups.leave_group(g, leaving).await.error, None);
    drop(groups);
    let again = tempfile::tempdir().unwrap();
    copy_dir(copy.path(), again.path());
    let (_broker, groups) = open(again.path(), &[]).await;
    let last = groups.consumer_group_describe(&[g.to_string()]).await;
    assert_eq!(ids(&last[0]), BTreeSet::from(["a".to_string()]));
    groups.check_invariants();
}
