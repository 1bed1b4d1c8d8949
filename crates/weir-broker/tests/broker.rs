//! The broker core against a real data directory: topics through the metadata state machine,
//! their logs, and what survives a reopen without a clean shutdown.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use weir_broker::topic_config::{ConfigEdit, ConfigOp};
use weir_broker::{Acks, Broker, BrokerConfig, ErrorKind, NewTopic};

fn config(dir: &Path, extra: &[(&str, &str)]) -> BrokerConfig {
    let mut settings: BTreeMap<String, String> =
        [("log.dirs".to_string(), dir.display().to_string())].into_iter().collect();
    for (k, v) in extra {
        settings.insert(k.to_string(), v.to_string());
    }
    BrokerConfig::from_settings(&settings).unwrap()
}

fn topic(name: &str, partitions: i32, configs: &[(&str, &str)]) -> NewTopic {
    NewTopic {
        name: name.into(),
        partitions,
        replication_factor: -1,
        assignments: Vec::new(),
        configs: configs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
    }
}

fn batch() -> bytes::BytesMut {
    let records = [weir_storage::testing::record(0, 1_700_000_000_000, None, Some(bytes::Bytes::from_static(b"v")))];
    bytes::BytesMut::from(&weir_storage::testing::encode(&records, weir_storage::Compression::None)[..])
}

/// A crash, as far as the files are concerned: a copy of the data directory taken while the
/// broker is running (the running broker keeps its directory locked).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else if entry.file_name() != ".lock" {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

fn open(dir: &Path, extra: &[(&str, &str)]) -> Arc<Broker> {
    Broker::open(config(dir, extra)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_configs_and_data_survive_a_reopen_without_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let after_crash = tempfile::tempdir().unwrap();
    // A tiny snapshot interval exercises snapshot + replay too.
    let settings = [("metadata.snapshot.interval.records", "2")];
    let (cluster_id, ids) = {
        let broker = open(dir.path(), &settings);
        let results = broker
            .create_topics(
                vec![topic("a", 3, &[("retention.ms", "1000")]), topic("b", 1, &[]), topic("c", 2, &[])],
                false,
            )
            .await;
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
        broker.create_partitions("b".into(), 4, None, false).await.unwrap();
        broker.delete_topic(Some("c".into()), None).await.unwrap();
        broker
            .alter_topic_configs(
                "a".into(),
                false,
                ConfigEdit::Apply(vec![ConfigOp::Set { name: "cleanup.policy".into(), value: "compact".into() }]),
            )
            .await
            .unwrap();
        let partition = broker.require_partition("b", 3).unwrap();
        let info = broker.append(partition, batch(), Acks::Leader).await.unwrap();
        assert_eq!(info.first_offset, 0);
        let state = broker.metadata();
        let ids: Vec<_> = ["a", "b"].iter().map(|n| state.topic(n).unwrap().id).collect();
        copy_dir(dir.path(), after_crash.path());
        (broker.cluster_id(), ids)
    };
    let crashed = after_crash.path();
    assert!(!crashed.join(".weir_clean_shutdown").exists());
    let broker = open(crashed, &settings);
    let state = broker.metadata();
    assert_eq!(broker.cluster_id(), cluster_id);
    assert_eq!(state.topics.keys().collect::<Vec<_>>(), vec!["a", "b"]);
    assert_eq!(state.topic("a").unwrap().id, ids[0]);
    assert_eq!(state.topic("b").unwrap().id, ids[1]);
    assert_eq!(state.topic("b").unwrap().partitions, 4);
    let a = state.topic("a").unwrap();
    assert_eq!(a.configs.get("cleanup.policy").map(String::as_str), Some("compact"));
    assert_eq!(a.configs.get("retention.ms").map(String::as_str), Some("1000"));
    // The storage config follows the metadata.
    assert!(broker.require_partition("a", 0).unwrap().log.config().cleanup_policy.compact);
    assert_eq!(broker.require_partition("b", 3).unwrap().log.log_end_offset(), 1);
    assert!(broker.partition("c", 0).is_none());
    assert!(!crashed.join("c-0").exists(), "the deleted topic's log is gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_deleted_and_created_again_starts_empty() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path(), &[]);
    broker.create_topics(vec![topic("t", 1, &[])], false).await.pop().unwrap().unwrap();
    broker.append(broker.require_partition("t", 0).unwrap(), batch(), Acks::Leader).await.unwrap();
    let old = broker.delete_topic(Some("t".into()), None).await.unwrap();
    let created = broker.create_topics(vec![topic("t", 1, &[])], false).await.pop().unwrap().unwrap();
    assert_ne!(created.topic.id, old.id);
    assert_eq!(broker.require_partition("t", 0).unwrap().log.log_end_offset(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_requests_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path(), &[("max.partitions.per.topic", "8")]);
    let before = broker.metadata();
    let cases = [
        (topic("bad/name", 1, &[]), ErrorKind::InvalidTopic),
        (topic("x", 0, &[]), ErrorKind::InvalidPartitionCount),
        (topic("x", 9, &[]), ErrorKind::InvalidPartitionCount),
        (topic("x", 1, &[("retention.mss", "1")]), ErrorKind::InvalidConfig),
        (NewTopic { replication_factor: 3, ..topic("x", 1, &[]) }, ErrorKind::InvalidReplicationFactor),
    ];
    for (request, expected) in cases {
        let name = request.name.clone();
        let err = broker.create_topics(vec![request], false).await.pop().unwrap().unwrap_err();
        assert_eq!(err.kind, expected, "{name}: {}", err.message);
        assert!(!err.message.is_empty());
    }
    // validate_only checks everything and creates nothing.
    broker.create_topics(vec![topic("ok", 2, &[])], true).await.pop().unwrap().unwrap();
    assert_eq!(broker.metadata().topics, before.topics);
    let err = broker.create_partitions("missing".into(), 2, None, false).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::UnknownTopicOrPartition);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compacted_topics_refuse_records_without_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path(), &[]);
    broker
        .create_topics(vec![topic("compacted", 1, &[("cleanup.policy", "compact")])], false)
        .await
        .pop()
        .unwrap()
        .unwrap();
    let err =
        broker.append(broker.require_partition("compacted", 0).unwrap(), batch(), Acks::Leader).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidRecord);
    assert_eq!(broker.require_partition("compacted", 0).unwrap().log.log_end_offset(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_all_follows_min_insync_replicas_through_config_changes() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path(), &[]);
    broker
        .create_topics(vec![topic("strict", 1, &[("min.insync.replicas", "2")])], false)
        .await
        .pop()
        .unwrap()
        .unwrap();
    let partition = broker.require_partition("strict", 0).unwrap();
    let err = broker.append(partition.clone(), batch(), Acks::All).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::NotEnoughReplicas);
    broker.append(partition.clone(), batch(), Acks::Leader).await.unwrap();
    broker.alter_topic_configs("strict".into(), false, ConfigEdit::Replace(BTreeMap::new())).await.unwrap();
    broker.append(partition, batch(), Acks::All).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_cannot_append_to_internal_topics_whatever_their_protocol() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path(), &[]);
    // The topic the group coordinator keeps, created as it creates it.
    let internal = weir_broker::metadata::OFFSETS_TOPIC;
    broker.ensure_internal_topic(internal, 1, BTreeMap::new()).await.unwrap();
    let offsets = broker.require_partition(internal, 0).unwrap();
    for acks in [Acks::Leader, Acks::All] {
        let err = broker.append(offsets.clone(), batch(), acks).await.unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidTopic, "{err}");
    }
    assert_eq!(offsets.log.log_end_offset(), 0, "nothing was written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_partition_has_its_replicas_leader_and_epoch_in_the_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let node = 7;
    let broker = open(dir.path(), &[("node.id", "7")]);
    broker.create_topics(vec![topic("placed", 3, &[])], false).await.pop().unwrap().unwrap();
    broker.create_partitions("placed".into(), 5, None, false).await.unwrap();
    let metadata = broker.metadata();
    let placed = metadata.topic("placed").unwrap();
    assert_eq!(placed.assignments.len(), 5);
    for (index, state) in placed.assignments.iter().enumerate() {
        assert_eq!((state.replicas.as_slice(), state.isr.as_slice(), state.leader), (&[node][..], &[node][..], node));
        assert_eq!(state.leader_epoch, 0);
        let partition = broker.require_partition("placed", index as i32).unwrap();
        assert_eq!(*partition.state(), *state, "the partition reads the metadata's state");
    }
    // A manual assignment naming a broker that does not exist is refused.
    let mut manual = topic("manual", -1, &[]);
    manual.replication_factor = -1;
    manual.assignments = vec![(0, vec![node]), (1, vec![8])];
    let err = broker.create_topics(vec![manual], false).await.pop().unwrap().unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidReplicaAssignment, "{err}");
    let err = broker.create_partitions("placed".into(), 6, Some(vec![vec![9]]), false).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidReplicaAssignment, "{err}");
    // The only broker cannot hold two replicas.
    let mut two = topic("two", 1, &[]);
    two.replication_factor = 2;
    let err = broker.create_topics(vec![two], false).await.pop().unwrap().unwrap_err();
    assert!(err.message.contains("only 1 broker(s)"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_parks_until_an_append_and_returns_empty_at_its_deadline() {
    use std::time::Duration;
    use weir_broker::fetch::{FetchPartition, FetchRequest, Isolation};
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path(), &[]);
    broker.create_topics(vec![topic("polled", 1, &[])], false).await.pop().unwrap().unwrap();
    let partition = broker.require_partition("polled", 0).unwrap();
    let request = |max_wait: Duration, current_leader_epoch: Option<i32>| FetchRequest {
        partitions: vec![FetchPartition {
            partition: partition.clone(),
            offset: 0,
            max_bytes: 1 << 20,
            current_leader_epoch,
            last_fetched_epoch: None,
        }],
        max_bytes: 1 << 20,
        min_bytes: 1,
        max_wait,
        isolation: Isolation::HighWatermark,
        replica_id: None,
        follower_reads: false,
        client_rack: None,
        session_heartbeat: None,
    };

    let started = std::time::Instant::now();
    let empty = broker.fetch(request(Duration::from_millis(200), None)).await.unwrap();
    assert!(empty[0].slice.is_none() && empty[0].error.is_none());
    assert!(started.elapsed() >= Duration::from_millis(200), "it waited out max_wait");

    // Parked with a long deadline; the append wakes it.
    let parked = {
        let (broker, request) = (broker.clone(), request(Duration::from_secs(60), Some(0)));
        tokio::spawn(async move { broker.fetch(request).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    broker.append(partition.clone(), batch(), Acks::Leader).await.unwrap();
    let woken =
        tokio::time::timeout(Duration::from_secs(30), parked).await.expect("woken, not timed out").unwrap().unwrap();
    let slice = woken[0].slice.as_ref().expect("the appended batch");
    assert_eq!((slice.first_offset, slice.next_offset, woken[0].offsets.map(|o| o.high_watermark)), (0, 1, Some(1)));
    assert_eq!(partition.metrics.bytes_out.get(), slice.len, "what a fetch returns counts as bytes out");

    // A leader epoch newer than the partition's is an error of that partition, answered at once.
    let fenced = broker.fetch(request(Duration::from_secs(60), Some(7))).await.unwrap();
    assert_eq!(fenced[0].error.as_ref().map(|e| e.kind), Some(ErrorKind::UnknownLeaderEpoch));
}
