//! What the store holds of a partition, and under which keys.
//!
//! A partition's objects are under `<topic>-<topic id>/<partition>/` (the topic id keeps a
//! deleted topic's objects apart from those of a new topic of the same name). Each uploaded
//! segment is named by its offsets, `<base>-<next>` with 20 digits each, as the local files
//! are: `.log`, `.index` and `.timeindex` are the local files' bytes, and `.manifest.json`
//! (this module's [`RemoteSegment`]) is written last. **Invariant: a segment is in the store
//! exactly when its manifest is.** An upload cut short leaves data objects without a manifest,
//! which the next upload of the same segment overwrites (same offsets, same key, same bytes:
//! nothing is stored twice); a delete removes the manifest first.
//!
//! A compacted topic's segments are compacted again in the store (`compact`): the new data
//! objects go under new names, `<base>-<next>.c<generation>.log` and so on, and the manifest,
//! rewritten last with the generation, switches readers over. The previous generation's
//! objects are removed at the next compaction pass, so a read that began before the switch
//! finishes on them.

use serde::{Deserialize, Serialize};
use uuid::Uuid;
use weir_storage::{AbortedTxn, EpochEntry};

/// The manifest's format; a reader refuses other versions instead of misreading them.
pub const MANIFEST_FORMAT: u32 = 1;
pub(crate) const MANIFEST_SUFFIX: &str = ".manifest.json";

/// One uploaded segment, as its manifest records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteSegment {
    pub format: u32,
    pub topic: String,
    pub topic_id: Uuid,
    pub partition: i32,
    pub base_offset: i64,
    /// Every offset of the segment is below this (the next segment's base).
    pub next_offset: i64,
    /// The largest batch timestamp and the base offset of its batch.
    pub max_timestamp: Option<(i64, i64)>,
    /// The data objects: `log`, `index`, `timeindex`.
    pub files: Vec<RemoteFile>,
    /// The leader epochs of the segment's batches: the epoch in force at `base_offset`, then
    /// each that starts inside the segment, as (epoch, start offset).
    pub leader_epochs: Vec<(i32, i64)>,
    /// Aborted transactions overlapping the segment, as (producer id, first offset, last
    /// offset, last stable offset): what a read_committed read of it must drop.
    pub aborted_transactions: Vec<(i64, i64, i64, i64)>,
    /// The broker that uploaded it, and when (milliseconds since the epoch).
    pub uploaded_by: i32,
    pub uploaded_at_ms: i64,
    /// How often the store compacted it (0: the bytes as uploaded); names its data objects.
    #[serde(default)]
    pub generation: u32,
}

/// One data object of a segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteFile {
    /// `log`, `index` or `timeindex`: the object's suffix.
    pub kind: String,
    pub size: u64,
    pub crc32c: u32,
}

impl RemoteSegment {
    /// The stem of its data objects' names: `<base>-<next>`, with `.c<generation>` once
    /// compacted in the store.
    pub(crate) fn data_stem(&self) -> String {
        data_stem(self.base_offset, self.next_offset, self.generation)
    }

    /// Bytes of the `.log` object.
    pub fn log_bytes(&self) -> u64 {
        self.files.iter().find(|f| f.kind == "log").map_or(0, |f| f.size)
    }
}

/// The stem of a segment's object names.
pub(crate) fn stem(base_offset: i64, next_offset: i64) -> String {
    format!("{base_offset:020}-{next_offset:020}")
}

/// [`RemoteSegment::data_stem`] of a segment at `generation`.
pub(crate) fn data_stem(base_offset: i64, next_offset: i64, generation: u32) -> String {
    match generation {
        0 => stem(base_offset, next_offset),
        g => format!("{}.c{g}", stem(base_offset, next_offset)),
    }
}

/// The generation a data object's name says (`suffix` as [`parse_name`] gives it), with its
/// kind: `.log` is (0, "log"), `.c3.index` is (3, "index"). `None` for a manifest or a name
/// of another form.
pub(crate) fn data_generation(suffix: &str) -> Option<(u32, &str)> {
    let rest = suffix.strip_prefix('.')?;
    let (generation, kind) = match rest.strip_prefix('c') {
        Some(numbered) => {
            let (number, kind) = numbered.split_once('.')?;
            (number.parse().ok()?, kind)
        }
        None => (0, rest),
    };
    matches!(kind, "log" | "index" | "timeindex").then_some((generation, kind))
}

/// The (base, next) offsets of an object name made by [`stem`], with what follows the stem.
pub(crate) fn parse_name(name: &str) -> Option<(i64, i64, &str)> {
    let (base, rest) = name.split_at_checked(20)?;
    let rest = rest.strip_prefix('-')?;
    let (next, suffix) = rest.split_at_checked(20)?;
    if !base.bytes().chain(next.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((base.parse().ok()?, next.parse().ok()?, suffix))
}

/// The epochs a segment of `[base, next)` needs from the log's whole cache (`entries`, by
/// start offset): the one in force at `base`, then those that start inside.
pub(crate) fn epochs_within(entries: &[EpochEntry], base: i64, next: i64) -> Vec<(i32, i64)> {
    let in_force = entries.iter().rev().find(|e| e.start_offset <= base);
    let inside = entries.iter().filter(|e| e.start_offset > base && e.start_offset < next);
    in_force.into_iter().chain(inside).map(|e| (e.epoch, e.start_offset)).collect()
}

pub(crate) fn aborted(txns: &[AbortedTxn]) -> Vec<(i64, i64, i64, i64)> {
    txns.iter().map(|t| (t.producer_id, t.first_offset, t.last_offset, t.last_stable_offset)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_others_do_not_parse() {
        let name = format!("{}.log", stem(0, 1_234));
        assert_eq!(parse_name(&name), Some((0, 1_234, ".log")));
        let manifest = format!("{}{MANIFEST_SUFFIX}", stem(99, 100));
        assert_eq!(parse_name(&manifest), Some((99, 100, MANIFEST_SUFFIX)));
        for bad in ["", "00000000000000000000.log", "0000000000000000000x-00000000000000000001.log", "é"] {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
        let compacted = format!("{}.index", data_stem(5, 9, 3));
        let (_, _, suffix) = parse_name(&compacted).expect("parses");
        assert_eq!(data_generation(suffix), Some((3, "index")));
        assert_eq!(data_generation(".log"), Some((0, "log")));
        assert_eq!(data_generation(MANIFEST_SUFFIX), None);
        assert_eq!(data_stem(5, 9, 0), stem(5, 9));
    }

    #[test]
    fn a_segment_keeps_the_epoch_in_force_at_its_base_and_those_inside() {
        let entries =
            [(0, 0), (3, 50), (4, 120), (7, 300)].map(|(epoch, start_offset)| EpochEntry { epoch, start_offset });
        assert_eq!(epochs_within(&entries, 100, 200), vec![(3, 50), (4, 120)]);
        assert_eq!(epochs_within(&entries, 120, 300), vec![(4, 120)]);
        assert_eq!(epochs_within(&entries, 0, 10), vec![(0, 0)]);
    }
}
