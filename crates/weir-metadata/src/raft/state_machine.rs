//! The metadata quorum's state machine: [`MetadataState`] with the committed records applied in
//! log order, published to the broker through a watch channel after every applied batch.
//!
//! Snapshots are JSON files (`snapshot.json` beside the log: the snapshot's meta and the state),
//! replaced atomically. At start-up the newest snapshot is the state; openraft re-applies the
//! committed entries after it.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::{CommandResult, MetadataRaft, NodeId};
use crate::MetadataState;

const SNAPSHOT_FILE: &str = "snapshot.json";

type StoreResult<T> = Result<T, StorageError<NodeId>>;

#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, BasicNode>,
    state: MetadataState,
}

/// What the state machine holds; cloned into a snapshot builder.
#[derive(Clone)]
struct Applied {
    state: MetadataState,
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, BasicNode>,
}

pub(crate) struct MetadataStateMachine {
    dir: PathBuf,
    applied: Applied,
    publish: watch::Sender<Arc<MetadataState>>,
    snapshots_built: u64,
}

impl MetadataStateMachine {
    /// The state machine as the newest snapshot in `dir` left it, and the receiving end of its
    /// published states. Blocking (reads the snapshot).
    pub fn open(dir: &Path) -> Result<(MetadataStateMachine, watch::Receiver<Arc<MetadataState>>), std::io::Error> {
        let applied = match read_snapshot(dir)? {
            Some(stored) => {
                let mut state = stored.state;
                state.upgrade_loaded();
                Applied { state, last_applied: stored.meta.last_log_id, membership: stored.meta.last_membership }
            }
            None => {
                Applied { state: MetadataState::new(), last_applied: None, membership: StoredMembership::default() }
            }
        };
        let (publish, receiver) = watch::channel(Arc::new(applied.state.clone()));
        Ok((MetadataStateMachine { dir: dir.to_path_buf(), applied, publish, snapshots_built: 0 }, receiver))
    }
}

fn read_snapshot(dir: &Path) -> std::io::Result<Option<StoredSnapshot>> {
    match std::fs::read(dir.join(SNAPSHOT_FILE)) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(std::io::Error::other),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn write_snapshot(dir: &Path, stored: &StoredSnapshot) -> StoreResult<Vec<u8>> {
    let bytes = serde_json::to_vec(stored)
        .map_err(|e| StorageError::IO { source: StorageIOError::write_snapshot(Some(stored.meta.signature()), &e) })?;
    weir_storage::write_atomically(&dir.join(SNAPSHOT_FILE), &bytes)
        .map_err(|e| StorageError::IO { source: StorageIOError::write_snapshot(Some(stored.meta.signature()), &e) })?;
    Ok(bytes)
}

/// Builds a snapshot from a copy of the state taken when openraft asked for a builder.
pub(crate) struct SnapshotBuilder {
    dir: PathBuf,
    applied: Applied,
    id: u64,
}

impl RaftSnapshotBuilder<MetadataRaft> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> StoreResult<Snapshot<MetadataRaft>> {
        let last = self.applied.last_applied;
        let snapshot_id = match last {
            Some(last) => format!("{}-{}-{}", last.leader_id, last.index, self.id),
            None => format!("--{}", self.id),
        };
        let meta = SnapshotMeta { last_log_id: last, last_membership: self.applied.membership.clone(), snapshot_id };
        let stored = StoredSnapshot { meta: meta.clone(), state: self.applied.state.clone() };
        let dir = self.dir.clone();
        let bytes = tokio::task::spawn_blocking(move || write_snapshot(&dir, &stored))
            .await
            .map_err(|e| StorageError::IO { source: StorageIOError::write_snapshot(None, &e) })??;
        tracing::debug!(index = last.map(|l| l.index), "wrote a metadata snapshot");
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(bytes)) })
    }
}

impl RaftStateMachine<MetadataRaft> for MetadataStateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> StoreResult<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>)> {
        Ok((self.applied.last_applied, self.applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StoreResult<Vec<CommandResult>>
    where
        I: IntoIterator<Item = Entry<MetadataRaft>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut results = Vec::new();
        for entry in entries {
            self.applied.last_applied = Some(entry.log_id);
            let index = entry.log_id.index as i64;
            match entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(command) => {
                    for record in &command.records {
                        self.applied.state.apply(index, record);
                    }
                }
                EntryPayload::Membership(membership) => {
                    self.applied.membership = StoredMembership::new(Some(entry.log_id), membership);
                }
            }
            // Every entry moves the applied offset, blank ones too: a broker waiting for an
            // index is not left waiting by an entry without records.
            self.applied.state.applied_offset = index;
            results.push(CommandResult { index: entry.log_id.index });
        }
        self.publish.send_replace(Arc::new(self.applied.state.clone()));
        Ok(results)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.snapshots_built += 1;
        SnapshotBuilder { dir: self.dir.clone(), applied: self.applied.clone(), id: self.snapshots_built }
    }

    async fn begin_receiving_snapshot(&mut self) -> StoreResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StoreResult<()> {
        let bytes = snapshot.into_inner();
        let stored: StoredSnapshot = serde_json::from_slice(&bytes)
            .map_err(|e| StorageError::IO { source: StorageIOError::read_snapshot(Some(meta.signature()), &e) })?;
        let mut state = stored.state;
        state.upgrade_loaded();
        let dir = self.dir.clone();
        let to_write = StoredSnapshot { meta: meta.clone(), state: state.clone() };
        tokio::task::spawn_blocking(move || write_snapshot(&dir, &to_write))
            .await
            .map_err(|e| StorageError::IO { source: StorageIOError::write_snapshot(None, &e) })??;
        self.applied = Applied { state, last_applied: meta.last_log_id, membership: meta.last_membership.clone() };
        self.publish.send_replace(Arc::new(self.applied.state.clone()));
        tracing::info!(index = meta.last_log_id.map(|l| l.index), "installed a metadata snapshot from the leader");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StoreResult<Option<Snapshot<MetadataRaft>>> {
        let dir = self.dir.clone();
        let stored = tokio::task::spawn_blocking(move || read_snapshot(&dir))
            .await
            .map_err(|e| StorageError::IO { source: StorageIOError::read_snapshot(None, &e) })?
            .map_err(|e| StorageError::IO { source: StorageIOError::read_snapshot(None, &e) })?;
        Ok(stored.map(|s| {
            let meta = s.meta.clone();
            let bytes = serde_json::to_vec(&s).unwrap_or_default();
            Snapshot { meta, snapshot: Box::new(Cursor::new(bytes)) }
        }))
    }
}
