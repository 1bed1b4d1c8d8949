//! Moves the broker-local invisible-time store of earlier versions into `__share_group_state`,
//! once.
//!
//! Before the state was replicated, each broker kept it in `<data>/rocketmq-pop/`: a snapshot
//! (`snapshot.jsonl`) and a journal (`journal.jsonl`) of lines that are, field for field, the
//! [`StateLine`]s of today without an epoch. At the first start of this version every state
//! there is written to its shard as a *migrated* line (which applies only to a queue that has
//! no state yet, so a crash in the middle and a second run change nothing), then the directory
//! is removed. Until then no queue of this broker loads ([`PopStore::set_ready`]), so no
//! consumer starts over from a queue's beginning meanwhile.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;
use std::sync::Arc;

use weir_broker::{Broker, BrokerError, ErrorKind};

use super::lines::{Queues, StateLine};
use super::shard::{StateShards, TOPIC};
use super::store::{PopStore, QueueKey, DIR};

fn storage(what: &str, path: &Path, e: impl std::fmt::Display) -> BrokerError {
    BrokerError::new(
        ErrorKind::Storage,
        format!("invisible-time state migration: cannot {what} {}: {e}", path.display()),
    )
}

/// Every state of the old store in `dir`: the snapshot, then the journal over it. A torn last
/// line (a crash mid-write) was never acknowledged and is skipped. Blocking.
pub(crate) fn read_legacy(dir: &Path) -> Result<Queues, BrokerError> {
    let mut queues = Queues::default();
    for name in ["snapshot.jsonl", "journal.jsonl"] {
        let path = dir.join(name);
        let file = match std::fs::File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(storage("open", &path, e)),
        };
        for line in std::io::BufReader::new(file).split(b'\n') {
            let line = line.map_err(|e| storage("read", &path, e))?;
            if let Ok(line) = serde_json::from_slice::<StateLine>(&line) {
                queues.apply(StateLine { epoch: 0, ..line });
            }
        }
    }
    Ok(queues)
}

/// Moves the old store of `broker`'s data directory, if there is one, trying again until it
/// is done or the broker shuts down; marks `store` ready after. Call within a tokio runtime.
pub(crate) fn spawn(broker: &Arc<Broker>, store: &Arc<PopStore>, states: &Arc<StateShards>) {
    if !broker.config.data_dir.join(DIR).is_dir() {
        store.set_ready();
        return;
    }
    let (store, states) = (store.clone(), states.clone());
    crate::state_topic::spawn_migration(broker, "invisible-time state", move |broker| {
        let (store, states) = (store.clone(), states.clone());
        async move {
            let moved = migrate(&broker, &store, &states).await?;
            store.set_ready();
            Ok(moved)
        }
    });
}

async fn migrate(broker: &Arc<Broker>, store: &PopStore, states: &Arc<StateShards>) -> Result<usize, BrokerError> {
    let dir = broker.config.data_dir.join(DIR);
    let queues = {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || read_legacy(&dir))
            .await
            .map_err(|e| BrokerError::internal(e.to_string()))??
    };
    let count = store.shard_count(broker).await?;
    let mut by_shard: BTreeMap<i32, Vec<StateLine>> = BTreeMap::new();
    for (id, queue) in queues.0 {
        for (consumer, state) in queue.states {
            let key = QueueKey { consumer, ..QueueKey::new(id.group.clone(), id.topic.clone(), id.partition) };
            let line = StateLine { migrated: true, ..StateLine::whole(key, 0, state) };
            by_shard.entry(id.shard(count)).or_default().push(line);
        }
    }
    let mut moved = 0;
    for (shard, lines) in by_shard {
        for chunk in lines.chunks(256) {
            crate::state_topic::at_leader(broker, TOPIC, shard, |node| {
                let (broker, lines, states) = (broker.clone(), chunk.to_vec(), states.clone());
                async move {
                    match node {
                        None => states.write_here(shard, lines).await,
                        Some(node) => {
                            let request = super::service::WriteRequest { shard, lines };
                            super::service::call_write(&broker, node, &request).await
                        }
                    }
                }
            })
            .await?;
            moved += chunk.len();
        }
    }
    match std::fs::remove_dir_all(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(storage("remove", &dir, e)),
        _ => Ok(moved),
    }
}
