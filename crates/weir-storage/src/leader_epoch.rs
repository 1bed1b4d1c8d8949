//! The leader-epoch cache of a partition: at which offset each leader epoch began, persisted
//! beside the log as `leader-epoch-checkpoint` (Kafka's file and format: a version line `0`, a
//! count line, then `<epoch> <start offset>` lines).
//!
//! It answers OffsetForLeaderEpoch: "where did epoch E end?", which a follower or a former
//! leader asks to find where its log diverges from the leader's, and truncates there.
//!
//! Invariant: epochs and start offsets both strictly increase along the entries. An entry is
//! added only for an epoch newer than the latest; one that would start at or before an existing
//! entry's offset replaces the entries from there (the newer leader's history wins).
//!
//! Durability: the file is replaced atomically whenever the entries change, before a batch of a
//! new epoch is written, unless the cache holds a single entry starting at the log start: that
//! one is read back from the first batch's `partitionLeaderEpoch` when the file is missing, so a
//! partition that only ever had one epoch (every single-node partition) never writes the file.
//! A file left stale by a crash (entries before the log start or after the log end) is trimmed
//! when the log opens.

use std::path::{Path, PathBuf};

use crate::checkpoint::write_atomically;
use crate::error::{Result, StorageError};

pub const CHECKPOINT_FILE: &str = "leader-epoch-checkpoint";

/// An epoch and the first offset written in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochEntry {
    pub epoch: i32,
    pub start_offset: i64,
}

/// OffsetForLeaderEpoch's "undefined": no such epoch is known.
pub(crate) const UNDEFINED_EPOCH: i32 = -1;
pub(crate) const UNDEFINED_OFFSET: i64 = -1;

pub(crate) struct LeaderEpochCache {
    path: PathBuf,
    entries: Vec<EpochEntry>,
}

impl LeaderEpochCache {
    /// The empty cache of a log created just now: no checkpoint to read.
    pub(crate) fn empty(dir: &Path) -> LeaderEpochCache {
        LeaderEpochCache { path: dir.join(CHECKPOINT_FILE), entries: Vec::new() }
    }

    /// Loads the checkpoint in `dir`; a missing file gives an empty cache (the log then seeds it
    /// from its first batch, see [`LeaderEpochCache::seed`]).
    pub(crate) fn load(dir: &Path) -> Result<LeaderEpochCache> {
        let path = dir.join(CHECKPOINT_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(LeaderEpochCache { path, entries: Vec::new() });
            }
            Err(e) => return Err(StorageError::io(&path, e)),
        };
        let entries = parse(&text).map_err(|why| {
            StorageError::io(
                &path,
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("malformed leader-epoch checkpoint: {why}"),
                ),
            )
        })?;
        Ok(LeaderEpochCache { path, entries })
    }

    /// With no entry yet, records that `epoch` began at `start_offset` (the log's first batch)
    /// without writing the file: the batch itself says so at the next open.
    pub(crate) fn seed(&mut self, epoch: i32, start_offset: i64) {
        if self.entries.is_empty() && epoch >= 0 {
            self.entries.push(EpochEntry { epoch, start_offset });
        }
    }

    pub(crate) fn entries(&self) -> &[EpochEntry] {
        &self.entries
    }

    pub(crate) fn latest(&self) -> Option<EpochEntry> {
        self.entries.last().copied()
    }

    /// Records that `epoch` begins at `start_offset` if it is newer than the latest epoch (an
    /// older or equal one changes nothing), and persists the change (see the module doc).
    /// Returns whether the cache changed.
    pub(crate) fn assign(&mut self, epoch: i32, start_offset: i64, log_start_offset: i64) -> Result<bool> {
        if epoch < 0 || self.latest().is_some_and(|latest| latest.epoch >= epoch) {
            return Ok(false);
        }
        // A newer epoch that starts where earlier ones start overrides them.
        self.entries.retain(|e| e.start_offset < start_offset);
        self.entries.push(EpochEntry { epoch, start_offset });
        self.persist(log_start_offset)?;
        Ok(true)
    }

    /// For a replicated batch stamped `epoch` at `start_offset`, older than the latest epoch
    /// here: when every newer epoch begins at or after the batch (none holds a batch before
    /// it: an epoch this replica recorded when it led, without writing), they are dropped and
    /// `epoch` goes on at the batch, as Kafka's cache drops conflicting entries, so that the
    /// cache keeps describing the batches in the log. Without this, the replica would name an
    /// epoch its last batch does not carry, the leader would find it diverged at every fetch,
    /// and it would truncate and fetch the same batch again forever. Returns the newer epoch
    /// holding batches before this one when there is one (the batch is out of order: nothing
    /// changes).
    pub(crate) fn assign_older(
        &mut self,
        epoch: i32,
        start_offset: i64,
        log_start_offset: i64,
    ) -> Result<Option<EpochEntry>> {
        if let Some(conflict) = self.entries.iter().find(|e| e.epoch > epoch && e.start_offset < start_offset) {
            return Ok(Some(*conflict));
        }
        self.entries.retain(|e| e.epoch <= epoch && e.start_offset <= start_offset);
        if self.latest().is_none_or(|latest| latest.epoch < epoch) {
            self.entries.push(EpochEntry { epoch, start_offset });
        }
        self.persist(log_start_offset)?;
        Ok(None)
    }

    /// After the log was truncated to `end_offset`: drops the epochs that began at or after it.
    pub(crate) fn truncate_from_end(&mut self, end_offset: i64, log_start_offset: i64) -> Result<()> {
        let before = self.entries.len();
        self.entries.retain(|e| e.start_offset < end_offset);
        if self.entries.len() != before {
            self.persist(log_start_offset)?;
        }
        Ok(())
    }

    /// After the log start moved to `start_offset`: the epochs that ended before it are gone;
    /// the one it falls in now begins there.
    pub(crate) fn truncate_from_start(&mut self, start_offset: i64) -> Result<()> {
        let covering = self.entries.iter().rposition(|e| e.start_offset <= start_offset);
        let Some(covering) = covering else { return Ok(()) };
        if covering == 0 && self.entries[0].start_offset == start_offset {
            return Ok(());
        }
        self.entries.drain(..covering);
        self.entries[0].start_offset = start_offset;
        self.persist(start_offset)
    }

    /// Empties the cache (the log restarts empty).
    pub(crate) fn clear(&mut self) -> Result<()> {
        self.entries.clear();
        self.persist(0)
    }

    /// Writes the entries, or removes the file when the log's first batch says all it would
    /// (no entry, or one starting at the log start).
    fn persist(&self, log_start_offset: i64) -> Result<()> {
        self.debug_check();
        let derivable = match self.entries.as_slice() {
            [] => true,
            [only] => only.start_offset <= log_start_offset,
            _ => false,
        };
        if !derivable {
            return self.write();
        }
        match std::fs::remove_file(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StorageError::io(&self.path, e)),
        }
    }

    /// Where `epoch` ended: (the largest known epoch at or below it, the start offset of the
    /// first epoch after it), with `log_end_offset` for the latest epoch. Kafka's
    /// `LeaderEpochFileCache.endOffsetFor`: an epoch newer than every known one is undefined;
    /// one older than every known one ends where the first known one begins.
    pub(crate) fn end_offset_for(&self, epoch: i32, log_end_offset: i64) -> (i32, i64) {
        let Some(latest) = self.latest() else { return (UNDEFINED_EPOCH, UNDEFINED_OFFSET) };
        if epoch < 0 {
            return (UNDEFINED_EPOCH, UNDEFINED_OFFSET);
        }
        if epoch == latest.epoch {
            return (epoch, log_end_offset);
        }
        let Some(higher) = self.entries.iter().find(|e| e.epoch > epoch) else {
            return (UNDEFINED_EPOCH, UNDEFINED_OFFSET);
        };
        match self.entries.iter().rev().find(|e| e.epoch <= epoch) {
            Some(floor) => (floor.epoch, higher.start_offset),
            None => (epoch, higher.start_offset),
        }
    }

    /// The epoch `offset` was written in: the last one starting at or before it.
    pub(crate) fn epoch_for(&self, offset: i64) -> Option<i32> {
        self.entries.iter().rev().find(|e| e.start_offset <= offset).map(|e| e.epoch)
    }

    fn write(&self) -> Result<()> {
        let mut text = format!("0\n{}\n", self.entries.len());
        for e in &self.entries {
            text.push_str(&format!("{} {}\n", e.epoch, e.start_offset));
        }
        write_atomically(&self.path, text.as_bytes())
    }

    fn debug_check(&self) {
        debug_assert!(
            self.entries.windows(2).all(|w| w[0].epoch < w[1].epoch && w[0].start_offset < w[1].start_offset),
            "leader epochs and their start offsets must strictly increase: {:?}",
            self.entries
        );
    }
}

fn parse(text: &str) -> std::result::Result<Vec<EpochEntry>, String> {
    let mut lines = text.lines();
    if lines.next() != Some("0") {
        return Err("unknown version".into());
    }
    let count: usize = lines.next().and_then(|l| l.trim().parse().ok()).ok_or("bad entry count")?;
    let mut entries = Vec::with_capacity(count.min(1024));
    for line in lines.take(count) {
        let mut parts = line.split_whitespace();
        let epoch = parts.next().and_then(|p| p.parse().ok()).ok_or_else(|| format!("bad line {line:?}"))?;
        let start_offset = parts.next().and_then(|p| p.parse().ok()).ok_or_else(|| format!("bad line {line:?}"))?;
        entries.push(EpochEntry { epoch, start_offset });
    }
    if entries.len() != count {
        return Err("fewer entries than announced".into());
    }
    if !entries.windows(2).all(|w| w[0].epoch < w[1].epoch && w[0].start_offset < w[1].start_offset) {
        return Err("entries out of order".into());
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(dir: &Path, entries: &[(i32, i64)]) -> LeaderEpochCache {
        let mut cache = LeaderEpochCache::load(dir).unwrap();
        for (epoch, start) in entries {
            cache.assign(*epoch, *start, 0).unwrap();
        }
        cache
    }

    #[test]
    fn end_offsets_follow_kafkas_rules() {
        let dir = tempfile::tempdir().unwrap();
        let cache = cache(dir.path(), &[(1, 0), (3, 100), (4, 250)]);
        assert_eq!(cache.end_offset_for(4, 300), (4, 300), "the latest epoch ends at the log end");
        assert_eq!(cache.end_offset_for(3, 300), (3, 250));
        assert_eq!(cache.end_offset_for(2, 300), (1, 100), "an unknown epoch between: the one before it");
        assert_eq!(cache.end_offset_for(0, 300), (0, 0), "older than all: where the first begins");
        assert_eq!(cache.end_offset_for(5, 300), (UNDEFINED_EPOCH, UNDEFINED_OFFSET), "newer than all");
        assert_eq!(cache.end_offset_for(-1, 300), (UNDEFINED_EPOCH, UNDEFINED_OFFSET));
        let empty = LeaderEpochCache::load(tempfile::tempdir().unwrap().path()).unwrap();
        assert_eq!(empty.end_offset_for(0, 10), (UNDEFINED_EPOCH, UNDEFINED_OFFSET));
    }

    #[test]
    fn the_checkpoint_survives_reopen_and_is_not_written_for_a_first_epoch_at_the_log_start() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = LeaderEpochCache::load(dir.path()).unwrap();
        assert!(first.assign(0, 0, 0).unwrap());
        assert!(!dir.path().join(CHECKPOINT_FILE).exists(), "derivable from the first batch");
        assert!(!first.assign(0, 50, 0).unwrap(), "the same epoch again changes nothing");
        assert!(first.assign(2, 50, 0).unwrap());
        assert!(dir.path().join(CHECKPOINT_FILE).exists());
        let reopened = LeaderEpochCache::load(dir.path()).unwrap();
        assert_eq!(
            reopened.entries(),
            &[EpochEntry { epoch: 0, start_offset: 0 }, EpochEntry { epoch: 2, start_offset: 50 }]
        );
    }

    #[test]
    fn truncation_from_either_end_keeps_the_entries_consistent() {
        let dir = tempfile::tempdir().unwrap();
        let mut cache = cache(dir.path(), &[(1, 0), (3, 100), (4, 250)]);
        cache.truncate_from_start(120).unwrap();
        assert_eq!(cache.entries()[0], EpochEntry { epoch: 3, start_offset: 120 });
        cache.truncate_from_end(250, 120).unwrap();
        assert_eq!(cache.latest(), Some(EpochEntry { epoch: 3, start_offset: 120 }));
        // A newer epoch starting at an older entry's offset overrides it.
        cache.assign(7, 120, 0).unwrap();
        assert_eq!(cache.entries(), &[EpochEntry { epoch: 7, start_offset: 120 }]);
        cache.assign(8, 130, 120).unwrap();
        assert_eq!(LeaderEpochCache::load(dir.path()).unwrap().entries(), cache.entries());
        // Back to one epoch at the log start: the file goes, the first batch will say it.
        cache.truncate_from_start(130).unwrap();
        assert!(!dir.path().join(CHECKPOINT_FILE).exists());
    }

    #[test]
    fn a_malformed_checkpoint_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        for text in ["1\n0\n", "0\n2\n1 0\n", "0\n2\n3 10\n2 20\n", "0\n1\nx y\n"] {
            std::fs::write(dir.path().join(CHECKPOINT_FILE), text).unwrap();
            let err = LeaderEpochCache::load(dir.path()).err().expect(text).to_string();
            assert!(err.contains(CHECKPOINT_FILE), "{err}");
        }
    }
}
