//! The layout of an elastic topic (Swift's model, `docs/elastic.md`): 65,536 logical partitions,
//! grouped in fixed blocks into the partitions Kafka clients see (the *stable* partitions), and
//! ranges of stable partitions served together as *physical* partitions, the unit that splits,
//! merges and is placed on brokers.
//!
//! - A key's logical partition is a function of its murmur2 hash and the stable partition count
//!   `S` alone ([`ElasticLayout::logical_for_hash`]), chosen so that its stable partition is
//!   `hash % S`, the partition Kafka's default partitioner picks. So a Kafka producer, a
//!   RocketMQ producer sending in a message group and an HTTP produce with that key all write
//!   to the same stable partition, whatever the physical layout is.
//! - Stable partition `s` holds the logical partitions `[s·B, (s+1)·B)`, `B = 65536 / S` (`S`
//!   is a power of two). Each stable partition is one partition log of the topic, with its own
//!   offsets, so a split or a merge never changes where a key's records are or what an offset
//!   means: it changes which physical partition a stable partition belongs to, and so where its
//!   replicas live.
//! - Invariant ([`ElasticLayout::check`]): the active physical partitions' ranges are disjoint
//!   and cover `[0, S)`; every physical partition has a distinct id, never reused.

use serde::{Deserialize, Serialize};

/// The logical partitions of every elastic topic (Swift's).
pub const LOGICAL_PARTITIONS: i32 = 65_536;

/// Where a physical partition is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PhysicalState {
    /// Serves its range: its stable partitions' replicas are its replicas.
    Active,
    /// Replaced by a split or merge whose move is in progress: some stable partitions of its
    /// range are still being copied to their new physical partition's replicas, and are served
    /// from its replicas until then.
    Sealed,
    /// Replaced, and nothing of its range is served from its placement any more; kept so that
    /// the topic's history of splits and merges can be shown.
    Retired,
}

impl PhysicalState {
    pub fn name(self) -> &'static str {
        match self {
            PhysicalState::Active => "active",
            PhysicalState::Sealed => "sealed",
            PhysicalState::Retired => "retired",
        }
    }
}

/// One physical partition: a range of stable partitions placed and led together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhysicalPartition {
    /// Unique within the topic; never reused (a split's halves and a merge's result get new ids).
    pub id: i32,
    /// The first stable partition of its range.
    pub first: i32,
    /// One past the last stable partition of its range.
    pub end: i32,
    pub state: PhysicalState,
    /// The physical partitions it was split or merged from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parents: Vec<i32>,
    /// The physical partitions that replaced it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<i32>,
}

impl PhysicalPartition {
    /// Its stable partitions.
    pub fn stable_range(&self) -> std::ops::Range<i32> {
        self.first..self.end
    }
}

/// An elastic topic's stable partition count and physical partitions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElasticLayout {
    /// The partitions Kafka clients see: a power of two from 1 to [`LOGICAL_PARTITIONS`], fixed
    /// at creation (the topic's partition count).
    pub stable_partitions: i32,
    /// Every physical partition the topic has had, by id; the active ones tile the stable
    /// partitions.
    pub physical: Vec<PhysicalPartition>,
}

impl ElasticLayout {
    /// `physical` active physical partitions over `stable` stable partitions, ranges as even as
    /// they can be (`stable >= physical >= 1`).
    pub fn new(stable: i32, physical: i32) -> ElasticLayout {
        let physical = physical.clamp(1, stable.max(1));
        let bound = |p: i32| (i64::from(p) * i64::from(stable) / i64::from(physical)) as i32;
        ElasticLayout {
            stable_partitions: stable,
            physical: (0..physical)
                .map(|p| PhysicalPartition {
                    id: p,
                    first: bound(p),
                    end: bound(p + 1),
                    state: PhysicalState::Active,
                    parents: Vec::new(),
                    children: Vec::new(),
                })
                .collect(),
        }
    }

    /// Logical partitions per stable partition.
    pub fn block(&self) -> i32 {
        LOGICAL_PARTITIONS / self.stable_partitions.max(1)
    }

    /// The logical partition of a key whose murmur2 hash is `hash` (sign bit cleared, as
    /// Kafka's `toPositive`): its stable partition is `hash % S`, the one Kafka's partitioner
    /// picks; the hash's higher part places it within that stable partition's block.
    pub fn logical_for_hash(&self, hash: i32) -> i32 {
        let positive = hash & 0x7fff_ffff;
        let stable = self.stable_partitions.max(1);
        (positive % stable) * self.block() + (positive / stable) % self.block()
    }

    /// The stable partition that holds logical partition `logical` (in `0..65536`).
    pub fn stable_for_logical(&self, logical: i32) -> i32 {
        logical / self.block()
    }

    /// The logical partitions of stable partitions `range`, as `(first, last)` inclusive.
    pub fn logical_range(&self, range: std::ops::Range<i32>) -> (i32, i32) {
        (range.start * self.block(), range.end * self.block() - 1)
    }

    pub fn physical(&self, id: i32) -> Option<&PhysicalPartition> {
        self.physical.iter().find(|p| p.id == id)
    }

    /// The active physical partitions, by range.
    pub fn active(&self) -> Vec<&PhysicalPartition> {
        let mut active: Vec<&PhysicalPartition> =
            self.physical.iter().filter(|p| p.state == PhysicalState::Active).collect();
        active.sort_by_key(|p| p.first);
        active
    }

    /// The active physical partition serving stable partition `stable`.
    pub fn owner(&self, stable: i32) -> Option<&PhysicalPartition> {
        self.physical.iter().find(|p| p.state == PhysicalState::Active && p.stable_range().contains(&stable))
    }

    /// The id the next new physical partition gets.
    pub fn next_id(&self) -> i32 {
        self.physical.iter().map(|p| p.id + 1).max().unwrap_or(0)
    }

    /// Checks the layout's invariants; the first broken one, described.
    pub fn check(&self) -> Result<(), String> {
        let stable = self.stable_partitions;
        if !(1..=LOGICAL_PARTITIONS).contains(&stable) || stable.count_ones() != 1 {
            return Err(format!("{stable} stable partitions: not a power of two from 1 to {LOGICAL_PARTITIONS}"));
        }
        let mut ids: Vec<i32> = self.physical.iter().map(|p| p.id).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err(format!("physical partition ids {ids:?} repeat"));
        }
        let mut next = 0;
        for p in self.active() {
            if p.first != next || p.end <= p.first {
                return Err(format!(
                    "active physical partition {} covers [{}, {}) where [{next}, ..) was due",
                    p.id, p.first, p.end
                ));
            }
            next = p.end;
        }
        if next != stable {
            return Err(format!("the active physical partitions cover [0, {next}) of [0, {stable})"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keys_stable_partition_is_the_one_kafkas_partitioner_picks() {
        for stable in [1, 2, 16, 64, 1024, 65_536] {
            let layout = ElasticLayout::new(stable, 1);
            for hash in [0, 1, 7, -1, i32::MIN, i32::MAX, 123_456_789, -987_654_321] {
                let logical = layout.logical_for_hash(hash);
                assert!((0..LOGICAL_PARTITIONS).contains(&logical), "{hash} → {logical}");
                assert_eq!(layout.stable_for_logical(logical), (hash & 0x7fff_ffff) % stable);
            }
        }
    }

    #[test]
    fn keys_spread_over_a_stable_partitions_block() {
        let layout = ElasticLayout::new(16, 4);
        let logical: std::collections::BTreeSet<i32> = (0..1000).map(|h| layout.logical_for_hash(h * 16 + 3)).collect();
        assert!(logical.len() > 900, "{} distinct", logical.len());
        assert!(logical.iter().all(|l| layout.stable_for_logical(*l) == 3));
        assert_eq!(layout.logical_range(3..4), (3 * 4096, 4 * 4096 - 1));
    }

    #[test]
    fn a_new_layout_tiles_the_stable_partitions() {
        for (stable, physical) in [(16, 1), (16, 3), (64, 64), (8, 5)] {
            let layout = ElasticLayout::new(stable, physical);
            assert_eq!(layout.check(), Ok(()));
            assert_eq!(layout.active().len() as i32, physical);
            assert_eq!(layout.owner(stable - 1).map(|p| p.id), Some(physical - 1));
        }
        let mut broken = ElasticLayout::new(16, 2);
        broken.physical[1].first = 9;
        assert!(broken.check().is_err());
        assert!(ElasticLayout::new(12, 2).check().is_err());
    }
}
