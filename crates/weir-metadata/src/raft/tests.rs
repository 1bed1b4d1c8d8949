//! The quorum of one voter against a real directory: proposals, restarts with and without
//! snapshots, and the Raft log store's own operations.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::storage::RaftLogStorage;
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, RaftLogReader};
use uuid::Uuid;
use weir_storage::SystemClock;

use super::log_store::RaftLogStore;
use super::network::NoPeers;
use super::*;

fn config(snapshot_interval: u64) -> QuorumConfig {
    QuorumConfig {
        node_id: 1,
        voters: [(1, String::new())].into_iter().collect(),
        election_timeout_ms: 200,
        snapshot_interval,
        commit_timeout_ms: 5000,
    }
}

fn create(name: &str) -> MetadataRecord {
    MetadataRecord::CreateTopic {
        name: name.into(),
        id: Uuid::new_v4(),
        partitions: 1,
        configs: BTreeMap::new(),
        internal: false,
        assignments: vec![vec![1]],
    }
}

async fn started(dir: &std::path::Path, snapshot_interval: u64) -> Quorum {
    let quorum = Quorum::start(dir, config(snapshot_interval), Arc::new(NoPeers), Arc::new(SystemClock)).await.unwrap();
    let _ = quorum.raft().trigger().elect().await;
    assert_eq!(quorum.wait_for_leader(Duration::from_secs(10)).await.unwrap(), 1);
    quorum
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_records_survive_restarts_with_and_without_snapshots() {
    for snapshot_interval in [1000, 3] {
        let dir = tempfile::tempdir().unwrap();
        let expected = {
            let quorum = started(dir.path(), snapshot_interval).await;
            let mut last = 0;
            for i in 0..10 {
                let index = quorum.propose(vec![create(&format!("topic-{i}"))]).await.unwrap();
                assert!(index > last, "indexes grow");
                last = index;
                assert_eq!(quorum.applied().applied_offset, index as i64, "applied before the answer");
            }
            let state = (*quorum.applied()).clone();
            // A crash, not a shutdown: the Raft log and vote must be enough.
            drop(quorum);
            state
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let quorum = started(dir.path(), snapshot_interval).await;
        let reopened = quorum
            .raft()
            .wait(Some(Duration::from_secs(10)))
            .metrics(|m| m.last_applied.map(|l| l.index as i64) >= Some(expected.applied_offset), "re-applied")
            .await;
        assert!(reopened.is_ok(), "interval {snapshot_interval}: {reopened:?}");
        let state = quorum.applied();
        assert_eq!(state.topics, expected.topics, "interval {snapshot_interval}");
        assert_eq!(state.topics.len(), 10);
        assert_eq!(
            dir.path().join("snapshot.json").exists(),
            snapshot_interval == 3,
            "a snapshot only when the interval was reached"
        );
        quorum.shutdown().await;
    }
}

fn entry(term: u64, index: u64) -> Entry<MetadataRaft> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
        payload: EntryPayload::Normal(MetadataCommand { records: vec![create(&format!("t{index}"))] }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_store_truncates_purges_and_reopens_by_raft_index() {
    let dir = tempfile::tempdir().unwrap();
    let clock: Arc<SystemClock> = Arc::new(SystemClock);
    let mut store = RaftLogStore::open(dir.path(), clock.clone()).unwrap();
    let written: Vec<Entry<MetadataRaft>> = (0..8).map(|i| entry(1 + i / 4, i)).collect();
    for entry in &written {
        store.append_for_tests(entry.clone());
    }
    assert_eq!(store.try_get_log_entries(2..5).await.unwrap(), written[2..5].to_vec());
    assert_eq!(store.get_log_state().await.unwrap().last_log_id, Some(written[7].log_id));

    // A new leader's entries replace a diverged tail: everything from index 6 goes, 0..6 stays.
    store.truncate(written[6].log_id).await.unwrap();
    assert_eq!(store.try_get_log_entries(0..100).await.unwrap(), written[..6].to_vec());
    store.append_for_tests(entry(3, 6));
    // Entries up to 2 are in a snapshot: purged, and their last id is remembered.
    store.purge(written[2].log_id).await.unwrap();
    let state = store.get_log_state().await.unwrap();
    assert_eq!((state.last_purged_log_id, state.last_log_id), (Some(written[2].log_id), Some(entry(3, 6).log_id)));
    assert_eq!(store.try_get_log_entries(0..100).await.unwrap().first().map(|e| e.log_id.index), Some(3));
    drop(store);

    let mut reopened = RaftLogStore::open(dir.path(), clock).unwrap();
    let state = reopened.get_log_state().await.unwrap();
    assert_eq!((state.last_purged_log_id, state.last_log_id), (Some(written[2].log_id), Some(entry(3, 6).log_id)));
    // A snapshot past the log's end (a follower far behind): the log starts after it.
    reopened.purge(LogId::new(CommittedLeaderId::new(4, 1), 20)).await.unwrap();
    reopened.append_for_tests(entry(4, 21));
    let state = reopened.get_log_state().await.unwrap();
    assert_eq!(state.last_log_id.map(|l| l.index), Some(21));
    assert_eq!(reopened.try_get_log_entries(0..100).await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_larger_than_one_entry_may_be_is_refused_and_the_quorum_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    let quorum = started(dir.path(), 1000).await;
    // Over 1 MiB (Kafka's max.message.bytes, which once bounded the metadata log's batches and
    // stopped the quorum) but within an entry: committed.
    let wide = |name: String| match create(&name) {
        MetadataRecord::CreateTopic { name, id, partitions, internal, assignments, .. } => {
            MetadataRecord::CreateTopic {
                name,
                id,
                partitions,
                configs: BTreeMap::from([("weir.test.padding".to_string(), "x".repeat(4000))]),
                internal,
                assignments,
            }
        }
        other => other,
    };
    // About 4 KiB a topic.
    let big: Vec<MetadataRecord> = (0..400).map(|i| wide(format!("big-{i}"))).collect();
    let index = quorum.propose(big).await.expect("a change of about 1.6 MiB fits one entry");
    assert_eq!(quorum.applied().applied_offset, index as i64);
    // Past MAX_ENTRY_BYTES: refused before it is in the log, and the quorum still commits.
    let huge: Vec<MetadataRecord> = (0..3000).map(|i| wide(format!("huge-{i}"))).collect();
    let refused = quorum.propose(huge).await.expect_err("too large for one entry");
    assert_eq!(refused.kind, ErrorKind::InvalidRequest, "{refused}");
    assert!(refused.message.contains("smaller steps"), "{}", refused.message);
    quorum.propose(vec![create("after")]).await.expect("the quorum carries on");
    assert!(quorum.applied().topic("after").is_some());
}
