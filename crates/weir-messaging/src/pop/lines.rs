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

/// What one update did to a queue's state.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Change {
    pub(crate) done_below: i64,
    pub(crate) next: i64,
    /// In-flight entries added or changed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) set: Vec<(i64, Inflight)>,
    /// In-flight entries gone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) removed: Vec<i64>,
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
