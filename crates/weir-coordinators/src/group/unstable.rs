//! Offsets a transaction has sent (TxnOffsetCommit) but not yet ended: what makes a committed
//! offset unstable for OffsetFetch's `RequireStable` (KIP-447, v7+).
//!
//! A read_committed consumer (librdkafka, the Java client) fetches its start offsets with
//! `RequireStable`. While a transaction that will move a partition's offset is open, the offset
//! stored now is about to change, so the coordinator answers that partition with
//! UNSTABLE_OFFSET_COMMIT and the client asks again, instead of starting from a position the
//! transaction is about to overwrite (and processing its records twice).
//!
//! The transaction's offsets themselves are kept by its transaction coordinator (replicated in
//! `__transaction_state`); this coordinator remembers which partitions of which group an open
//! transaction touches:
//! - noted when the group's coordinator accepts a TxnOffsetCommit, and written to the group's
//!   `__consumer_offsets` partition (a transaction offsets record, see `offsets`) before the
//!   TxnOffsetCommit is answered, so a coordinator that takes the group over loads the note;
//! - forgotten (and the record tombstoned) when the transaction commits (once its offsets are
//!   stored here) or aborts (its marker reaches this broker's `__consumer_offsets` partition);
//! - forgotten from memory when this broker stops coordinating the group's partition, and
//!   after `transaction.max.timeout.ms` (plus a margin) in any case: no transaction stays open
//!   longer, so an end nobody heard of cannot hold a consumer back for good.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use super::offsets::TransactionOffsetsNote;

/// How long past `transaction.max.timeout.ms` a note is kept when no end is heard of.
const MARGIN_MS: i64 = 60_000;

struct Note {
    group: String,
    partitions: BTreeSet<(String, i32)>,
    expires_ms: i64,
}

/// Open transactions' offset notes, by producer id (a producer has one transaction at a time).
#[derive(Default)]
pub(crate) struct UnstableOffsets {
    notes: Mutex<HashMap<i64, Vec<Note>>>,
}

impl UnstableOffsets {
    fn notes(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Vec<Note>>> {
        self.notes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The open transaction of `producer_id` will commit offsets of `partitions` for `group`.
    /// Returns what is noted for them now (this call's partitions with the transaction's
    /// earlier ones for the group): what the group's transaction offsets record holds.
    pub(crate) fn note(
        &self,
        producer_id: i64,
        group: &str,
        partitions: impl IntoIterator<Item = (String, i32)>,
        now_ms: i64,
        max_transaction_ms: i64,
    ) -> TransactionOffsetsNote {
        let expires_ms = now_ms.saturating_add(max_transaction_ms).saturating_add(MARGIN_MS);
        self.restore(producer_id, group, partitions, expires_ms)
    }

    /// Takes over a note as a predecessor wrote it (`expires_ms` as it set it).
    pub(crate) fn restore(
        &self,
        producer_id: i64,
        group: &str,
        partitions: impl IntoIterator<Item = (String, i32)>,
        expires_ms: i64,
    ) -> TransactionOffsetsNote {
        let mut notes = self.notes();
        let entry = notes.entry(producer_id).or_default();
        let note = match entry.iter().position(|n| n.group == group) {
            Some(i) => &mut entry[i],
            None => {
                entry.push(Note { group: group.to_string(), partitions: BTreeSet::new(), expires_ms });
                let last = entry.len() - 1;
                &mut entry[last]
            }
        };
        note.partitions.extend(partitions);
        note.expires_ms = expires_ms;
        TransactionOffsetsNote { expires_ms, partitions: note.partitions.iter().cloned().collect() }
    }

    /// The transaction of `producer_id` aborted: none of its offsets will come. Returns the
    /// groups it had noted offsets for.
    pub(crate) fn ended(&self, producer_id: i64) -> Vec<String> {
        self.notes().remove(&producer_id).map_or_else(Vec::new, |list| list.into_iter().map(|n| n.group).collect())
    }

    /// The transaction of `producer_id` committed and its offsets for `group` are stored (its
    /// other groups' may still be on their way).
    pub(crate) fn stored(&self, producer_id: i64, group: &str) {
        let mut notes = self.notes();
        if let Some(list) = notes.get_mut(&producer_id) {
            list.retain(|n| n.group != group);
            if list.is_empty() {
                notes.remove(&producer_id);
            }
        }
    }

    /// Forgets the groups this broker no longer coordinates.
    pub(crate) fn forget_groups(&self, gone: impl Fn(&str) -> bool) {
        let mut notes = self.notes();
        for list in notes.values_mut() {
            list.retain(|n| !gone(&n.group));
        }
        notes.retain(|_, list| !list.is_empty());
    }

    /// The partitions of `group` some open transaction is about to commit an offset for.
    pub(crate) fn of_group(&self, group: &str, now_ms: i64) -> BTreeSet<(String, i32)> {
        let mut notes = self.notes();
        for list in notes.values_mut() {
            list.retain(|n| n.expires_ms > now_ms);
        }
        notes.retain(|_, list| !list.is_empty());
        notes.values().flatten().filter(|n| n.group == group).flat_map(|n| n.partitions.iter().cloned()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(p: i32) -> (String, i32) {
        ("t".to_string(), p)
    }

    #[test]
    fn a_partition_is_unstable_from_the_transactions_offsets_until_it_ends_or_lapses() {
        let unstable = UnstableOffsets::default();
        unstable.note(7, "g", [tp(0), tp(1)], 1_000, 10_000);
        unstable.note(8, "g", [tp(1)], 1_000, 10_000);
        unstable.note(9, "other", [tp(2)], 1_000, 10_000);
        assert_eq!(unstable.of_group("g", 2_000), [tp(0), tp(1)].into());
        unstable.note(7, "h", [tp(3)], 1_000, 10_000);
        unstable.stored(7, "g");
        assert_eq!(unstable.of_group("h", 2_000), [tp(3)].into(), "group h's offsets are not stored yet");
        unstable.ended(7);
        assert!(unstable.of_group("h", 2_000).is_empty());
        assert_eq!(unstable.of_group("g", 2_000), [tp(1)].into(), "producer 8's transaction is still open");
        unstable.forget_groups(|g| g == "other");
        assert!(unstable.of_group("other", 2_000).is_empty());
        // Past transaction.max.timeout.ms and the margin, an end never heard of is assumed.
        assert!(unstable.of_group("g", 1_000 + 10_000 + MARGIN_MS + 1).is_empty());
    }
}
