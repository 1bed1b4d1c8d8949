//! The records of `__share_group_state`: what engines write about queue states, and how a
//! state shard applies them.
//!
//! A record's value is one or more [`StateLine`]s, one JSON object per line. A line names a
//! queue state ([`QueueKey`]), the leader epoch of its partition on the engine that wrote it,
//! and either what one change did to the state (a [`Change`]) or the whole state (after a
//! reset, in a compaction, in a migration), or neither: a new leader of the partition took
//! the queue over (a load), which fences the one before.
//!
//! Fencing: a queue ([`QueueId`], every consumer's state of it together) belongs to the engine
//! of the highest leader epoch that loaded or wrote it. A line of a lower epoch is refused when
//! written and skipped when replayed, so a deposed leader (paused, cut off) cannot undo what
//! its successor did. A migrated line applies only to a queue without any state.

use std::collections::BTreeMap;

use super::state::{Inflight, QueueState};
use super::store::QueueKey;

/// One queue of one group (every broadcasting consumer's state of it too): the unit that
/// loads, fences and shards together.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub(crate) struct QueueId {
    pub(crate) group: String,
    pub(crate) topic: String,
    pub(crate) partition: i32,
}

impl QueueKey {
    pub(crate) fn id(&self) -> QueueId {
        QueueId { group: self.group.clone(), topic: self.topic.clone(), partition: self.partition }
    }
}

impl QueueId {
    /// The shard of this queue among `count` (stable: one queue's states are in one place).
    pub(crate) fn shard(&self, count: i32) -> i32 {
        let name = format!("{}\u{0}{}", self.group, self.topic);
        crate::state_topic::shard_of(&name, self.partition, count)
    }
}

/// What one update did to a queue's state. Written as [`ChangeRuns`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Change {
    pub(crate) done_below: i64,
    pub(crate) next: i64,
    /// In-flight entries added or changed.
    pub(crate) set: Vec<(i64, Inflight)>,
    /// In-flight entries gone.
    pub(crate) removed: Vec<i64>,
}

/// A [`Change`] as a line holds it: consecutive offsets whose entries are alike as one run,
/// so a receive or an ack of hundreds of messages writes a few numbers rather than an entry
/// each. Lines of earlier versions list every entry (`set`, `removed`); both forms read.
#[derive(serde::Serialize, serde::Deserialize)]
struct ChangeRuns {
    done_below: i64,
    next: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    set: Vec<(i64, Inflight)>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    removed: Vec<i64>,
    /// (first offset, last offset, the entry each offset of the run has).
    #[serde(rename = "set_runs", default, skip_serializing_if = "Vec::is_empty")]
    set_runs: Vec<(i64, i64, Inflight)>,
    /// (first offset, last offset).
    #[serde(rename = "removed_runs", default, skip_serializing_if = "Vec::is_empty")]
    removed_runs: Vec<(i64, i64)>,
}

impl ChangeRuns {
    fn of(change: &Change) -> ChangeRuns {
        let mut set_runs: Vec<(i64, i64, Inflight)> = Vec::new();
        for (offset, inflight) in &change.set {
            match set_runs.last_mut() {
                Some((_, last, like)) if *last + 1 == *offset && like == inflight => *last = *offset,
                _ => set_runs.push((*offset, *offset, *inflight)),
            }
        }
        let mut removed_runs: Vec<(i64, i64)> = Vec::new();
        for offset in &change.removed {
            match removed_runs.last_mut() {
                Some((_, last)) if *last + 1 == *offset => *last = *offset,
                _ => removed_runs.push((*offset, *offset)),
            }
        }
        ChangeRuns {
            done_below: change.done_below,
            next: change.next,
            set: Vec::new(),
            removed: Vec::new(),
            set_runs,
            removed_runs,
        }
    }
}

impl From<ChangeRuns> for Change {
    fn from(runs: ChangeRuns) -> Change {
        let ChangeRuns { done_below, next, mut set, mut removed, set_runs, removed_runs } = runs;
        // (A run is at most what a line could name one by one: a made-up huge run is cut short
        // rather than filling memory. No engine hands out more than this at once.)
        const RUN_MAX: i64 = 1 << 20;
        for (first, last, inflight) in set_runs {
            set.extend((first..=last.min(first.saturating_add(RUN_MAX))).map(|offset| (offset, inflight)));
        }
        for (first, last) in removed_runs {
            removed.extend(first..=last.min(first.saturating_add(RUN_MAX)));
        }
        Change { done_below, next, set, removed }
    }
}

impl serde::Serialize for Change {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        ChangeRuns::of(self).serialize(serializer)
    }
}

impl<'de> serde::Deserialize<'de> for Change {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Change, D::Error> {
        ChangeRuns::deserialize(deserializer).map(Change::from)
    }
}

impl Change {
    /// What turned `before` into `after` (the store takes what a change touched instead,
    /// `QueueState::take_change`).
    #[cfg(test)]
    pub(crate) fn between(before: &QueueState, after: &QueueState) -> Change {
        let set = after
            .inflight
            .iter()
            .filter(|(offset, inflight)| before.inflight.get(offset) != Some(inflight))
            .map(|(o, i)| (*o, *i))
            .collect();
        let removed = before.inflight.keys().filter(|o| !after.inflight.contains_key(o)).copied().collect();
        Change { done_below: after.done_below, next: after.next, set, removed }
    }

    pub(crate) fn apply(self, state: &mut QueueState) {
        for offset in self.removed {
            state.inflight.remove(&offset);
        }
        state.inflight.extend(self.set);
        state.done_below = self.done_below;
        state.next = self.next;
    }
}

/// One line of a record of `__share_group_state`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct StateLine {
    #[serde(rename = "q")]
    pub(crate) key: QueueKey,
    /// The leader epoch of the queue's partition on the engine that wrote the line (0 in the
    /// journal lines of earlier versions, which had none).
    #[serde(rename = "e", default)]
    pub(crate) epoch: i32,
    /// What one update changed (applied over the state, or over an empty one).
    #[serde(rename = "d", default, skip_serializing_if = "Option::is_none")]
    pub(crate) change: Option<Change>,
    /// The whole state.
    #[serde(rename = "s", default, skip_serializing_if = "Option::is_none")]
    pub(crate) state: Option<QueueState>,
    /// Moved from the local store of an earlier version: applies only to a queue that has no
    /// state yet, and fences nobody.
    #[serde(rename = "m", default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) migrated: bool,
}

impl StateLine {
    pub(crate) fn change(key: QueueKey, epoch: i32, change: Change) -> StateLine {
        StateLine { key, epoch, change: Some(change), state: None, migrated: false }
    }

    pub(crate) fn whole(key: QueueKey, epoch: i32, state: QueueState) -> StateLine {
        StateLine { key, epoch, change: None, state: Some(state), migrated: false }
    }

    /// A new leader (of `epoch`) took the queue of `key` over.
    pub(crate) fn took_over(key: QueueKey, epoch: i32) -> StateLine {
        StateLine { key, epoch, change: None, state: None, migrated: false }
    }
}

/// Every consumer's state of one queue, and who may change them.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct QueueStates {
    /// The highest leader epoch that loaded or wrote the queue (`i32::MIN`: none yet).
    pub(crate) epoch: i32,
    /// By broadcasting consumer (`None`: the group's own, clustering state).
    pub(crate) states: BTreeMap<Option<String>, QueueState>,
}

/// Every queue of a shard, as its lines made them.
#[derive(Debug, Default)]
pub(crate) struct Queues(pub(crate) std::collections::HashMap<QueueId, QueueStates>);

impl Queues {
    /// Whether `line` would apply (not fenced; a migrated one only to a queue without state).
    pub(crate) fn accepts(&self, line: &StateLine) -> bool {
        let queue = self.0.get(&line.key.id());
        if line.migrated {
            return queue.is_none_or(|q| q.states.is_empty());
        }
        queue.is_none_or(|q| line.epoch >= q.epoch)
    }

    /// Applies `line` if it [`Queues::accepts`] it; returns whether it did.
    pub(crate) fn apply(&mut self, line: StateLine) -> bool {
        if !self.accepts(&line) {
            return false;
        }
        let queue =
            self.0.entry(line.key.id()).or_insert_with(|| QueueStates { epoch: i32::MIN, ..Default::default() });
        if !line.migrated {
            queue.epoch = line.epoch;
        }
        let consumer = line.key.consumer;
        if let Some(state) = line.state {
            queue.states.insert(consumer.clone(), state);
        }
        if let Some(change) = line.change {
            change.apply(queue.states.entry(consumer).or_default());
        }
        true
    }

    /// Applies every line of a record's value; lines that do not parse are skipped (logged).
    pub(crate) fn apply_value(&mut self, value: &[u8]) {
        for line in value.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            match serde_json::from_slice::<StateLine>(line) {
                Ok(line) => {
                    self.apply(line);
                }
                Err(e) => tracing::warn!(error = %e, "invisible-time state: skipping a line that does not parse"),
            }
        }
    }
}

/// `lines` as a record value (JSON lines).
pub(crate) fn encode(lines: &[StateLine]) -> Result<Vec<u8>, weir_broker::BrokerError> {
    let mut value = Vec::new();
    for line in lines {
        serde_json::to_writer(&mut value, line).map_err(|e| weir_broker::BrokerError::internal(e.to_string()))?;
        value.push(b'\n');
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(consumer: Option<&str>) -> QueueKey {
        QueueKey { consumer: consumer.map(String::from), ..QueueKey::new("g", "t", 0) }
    }

    fn delivered(state: &QueueState, offset: i64) -> QueueState {
        let mut after = state.clone();
        after.deliver(offset, 10, 1);
        after
    }

    #[test]
    fn a_line_of_a_deposed_leader_is_refused_and_a_migrated_one_only_fills_an_empty_queue() {
        let mut queues = Queues::default();
        let empty = QueueState::starting_at(0);
        let one = delivered(&empty, 0);
        assert!(queues.apply(StateLine::change(key(None), 3, Change::between(&empty, &one))));
        assert!(queues.apply(StateLine::took_over(key(None), 4)), "a new leader loads it");
        let two = delivered(&one, 1);
        assert!(!queues.apply(StateLine::change(key(None), 3, Change::between(&one, &two))), "the deposed one");
        assert!(!queues.apply(StateLine::change(key(Some("c1")), 3, Change::between(&one, &two))), "any consumer");
        assert_eq!(queues.0[&key(None).id()].states[&None], one);
        let migrated = StateLine { migrated: true, ..StateLine::whole(key(None), 0, QueueState::starting_at(7)) };
        assert!(!queues.apply(migrated.clone()), "the queue has a state");
        let other = QueueKey::new("g", "t", 1);
        assert!(queues.apply(StateLine { key: other.clone(), ..migrated }));
        assert_eq!(queues.0[&other.id()].states[&None].next, 7);
        assert!(queues.apply(StateLine::took_over(other.clone(), 1)), "a migrated queue fences nobody");
    }

    #[test]
    fn a_change_is_written_in_runs_and_reads_back_whole() {
        let entry = |attempt| Inflight { visible_at_ms: 10, attempt, nonce: 7, group: None, max_attempts: None };
        let change = Change {
            done_below: 1,
            next: 600,
            set: (100..600).map(|o| (o, entry(if o == 300 { 2 } else { 1 }))).collect(),
            removed: (1..100).chain([150]).collect(),
        };
        let line = StateLine::change(key(None), 1, change.clone());
        let value = encode(std::slice::from_ref(&line)).expect("encode");
        assert!(value.len() < 400, "{} bytes: {}", value.len(), String::from_utf8_lossy(&value));
        let read: StateLine = serde_json::from_slice(&value[..value.len() - 1]).expect("parses");
        assert_eq!(read.change, Some(change));
        // A line of an earlier version, every entry listed.
        let earlier = br#"{"q":{"group":"g","topic":"t","partition":0},"e":1,"d":{"done_below":0,"next":2,"set":[[1,{"visible_at_ms":10,"attempt":1,"nonce":7}]],"removed":[0]}}"#;
        let read: StateLine = serde_json::from_slice(earlier).expect("parses");
        assert_eq!(read.change, Some(Change { done_below: 0, next: 2, set: vec![(1, entry(1))], removed: vec![0] }));
    }

    #[test]
    fn lines_read_back_as_written() {
        let empty = QueueState::starting_at(0);
        let one = delivered(&empty, 0);
        let lines = vec![
            StateLine::change(key(None), 1, Change::between(&empty, &one)),
            StateLine::whole(key(Some("c")), 1, one.clone()),
        ];
        let value = encode(&lines).expect("encode");
        let mut queues = Queues::default();
        queues.apply_value(&value);
        queues.apply_value(b"{\"q\":{\"group\"\n");
        let queue = &queues.0[&key(None).id()];
        assert_eq!((queue.epoch, queue.states.len()), (1, 2));
        assert_eq!(queue.states[&None], one);
    }
}
