//! Recalling a delayed message before it is due (RocketMQ 5.3's RecallMessage): the message is
//! taken out of the timer store and never appended to its topic.
//!
//! A recall is a durable note, not an edit of the wheel: far slot files are never rewritten.
//! The note (the message's offset, in a record of its shard's log, see [`super::shard`]) is in
//! the shard's ISR, as durably as the flush policy promises, before the recall is
//! acknowledged; a new leader of the shard reads it back. When the key comes due, firing finds
//! it recalled and settles it without appending anything.
//!
//! A recall handle names the shard, so a recall that comes to any broker goes to the one
//! leading the shard now ([`super::Timer::recall`]), whichever broker took the message.
//!
//! **Invariant:** a recall and the firing of the same message never both succeed. Firing
//! claims the keys it takes (`firing`) under the wheel's lock, and a recall decides under the
//! same lock: a key claimed is being delivered (the recall fails), a key recalled before the
//! claim is settled as recalled. Asserted in debug builds by `Recalls::check_invariants` when
//! a round claims and when it settles: the keys claimed are in order (the recall's search
//! relies on it), and no key that fired (appended or dropped) is among the recalled.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use weir_storage::sync::lock;

use super::shard::{note, TimerShard, NOTE_RECALLED};
use super::wheel::Key;
use super::{due_ms, headers, read_at};
use weir_broker::message::headers::MESSAGE_ID;
use weir_broker::{Broker, BrokerError};

/// What a recall did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Recall {
    /// The message will not be delivered (recalled now, or by an earlier recall of the same
    /// handle). Carries its message id, when it has one.
    Recalled { message_id: Option<String> },
    /// No message of the topic waits under that handle: it was delivered already, or the
    /// handle names none.
    NotPending,
    /// The handle names a delayed message of another topic: it was given for that one.
    OtherTopic,
    /// The message is being appended to its topic right now: too late.
    Delivering,
}

/// The recalled keys not settled yet, and the keys a firing round has claimed.
#[derive(Debug, Default)]
pub(super) struct Recalls {
    recalled: BTreeSet<Key>,
    /// The keys of the firing round in progress, in order (as the wheel hands them out).
    firing: Vec<Key>,
}

impl Recalls {
    /// The recalls a shard's log holds for messages still pending.
    pub(super) fn new(recalled: BTreeSet<Key>) -> Recalls {
        Recalls { recalled, firing: Vec::new() }
    }

    /// How many recalled messages have not come due yet.
    pub(super) fn len(&self) -> usize {
        self.recalled.len()
    }

    pub(super) fn is_recalled(&self, key: &Key) -> bool {
        self.recalled.contains(key)
    }

    /// A firing round takes `keys`: from now until [`Recalls::settle`], they cannot be recalled.
    /// (Every round of the firing loop claims: reusing the vector, it allocates nothing.)
    pub(super) fn claim(&mut self, keys: &[Key]) {
        self.firing.clear();
        self.firing.extend_from_slice(keys);
        self.check_invariants(&[]);
    }

    /// The firing round ended; `recalled` were settled without an append.
    pub(super) fn settle(&mut self, recalled: &[Key]) {
        self.firing.clear();
        for key in recalled {
            self.recalled.remove(key);
        }
    }

    /// Asserts the invariant of the module doc (debug builds only; nothing in release), with
    /// `fired` the keys of the round that were appended or dropped: none of them was recalled.
    /// Called under the wheel's lock, where recalls decide.
    pub(super) fn check_invariants(&self, fired: &[Key]) {
        if !cfg!(debug_assertions) {
            return;
        }
        assert!(
            self.firing.windows(2).all(|w| w[0] < w[1]),
            "the keys of a firing round are out of order: {:?}",
            self.firing
        );
        if let Some(both) = fired.iter().find(|key| self.recalled.contains(key)) {
            panic!("message {both:?} was both recalled and fired");
        }
    }
}

impl TimerShard {
    /// Recalls the message of `topic` scheduled at `offset` of this shard, due at `due_ms`.
    pub(super) async fn recall(
        self: &Arc<Self>,
        broker: &Arc<Broker>,
        topic: &str,
        due_ms: i64,
        offset: i64,
    ) -> Result<Recall, BrokerError> {
        let (shard, broker, topic) = (self.clone(), broker.clone(), topic.to_string());
        let decided = tokio::task::spawn_blocking(move || shard.recall_blocking(&broker, &topic, due_ms, offset))
            .await
            .map_err(|e| BrokerError::internal(e.to_string()))??;
        match decided {
            (recall, Some(write)) => {
                write.durable().await?;
                self.stats().recalled.fetch_add(1, Ordering::Relaxed);
                Ok(recall)
            }
            (recall, None) => Ok(recall),
        }
    }

    /// Decides a recall; the note to wait for, when one was written.
    fn recall_blocking(
        &self,
        broker: &Broker,
        topic: &str,
        due: i64,
        offset: i64,
    ) -> Result<(Recall, Option<weir_broker::broker::InternalWrite>), BrokerError> {
        let log = &self.partition.log;
        if offset < log.log_start_offset() || offset >= log.log_end_offset() {
            return Ok((Recall::NotPending, None));
        }
        // The handle must name this message: its topic and its delivery time.
        let Some(record) = read_at(log, &[offset])?.into_iter().next().flatten() else {
            return Ok((Recall::NotPending, None));
        };
        if record.headers.iter().any(|h| h.name == headers::NOTE) {
            return Ok((Recall::NotPending, None));
        }
        let header = |name: &str| record.headers.iter().rev().find(|h| h.name == name).and_then(|h| h.value.as_deref());
        if due_ms(&record) != Some(due) {
            return Ok((Recall::NotPending, None));
        }
        if header(headers::TARGET_TOPIC) != Some(topic.as_bytes()) {
            return Ok((Recall::OtherTopic, None));
        }
        let message_id = header(MESSAGE_ID).map(|id| String::from_utf8_lossy(id).into_owned());
        let wheel = lock(&self.wheel);
        // Its key in the wheel: its (due, offset), or the raised one a late message got.
        let Some(key) = wheel.pending_key_of(due, offset) else {
            return Ok((Recall::NotPending, None));
        };
        let mut recalls = lock(&self.recalls);
        if recalls.firing.binary_search(&key).is_ok() {
            return Ok((Recall::Delivering, None));
        }
        if recalls.is_recalled(&key) {
            return Ok((Recall::Recalled { message_id }, None));
        }
        let write = broker.write_internal(&self.partition, note(NOTE_RECALLED, key))?;
        recalls.recalled.insert(key);
        tracing::debug!(topic, offset, due, "timer store: recalled a delayed message");
        Ok((Recall::Recalled { message_id }, Some(write)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "both recalled and fired")]
    fn a_message_both_recalled_and_fired_is_caught() {
        let recalls = Recalls::new(BTreeSet::from([(1_000, 7)]));
        recalls.check_invariants(&[(1_000, 7)]);
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "out of order")]
    fn a_round_claimed_out_of_order_is_caught() {
        let mut recalls = Recalls::default();
        recalls.claim(&[(2_000, 1), (1_000, 2)]);
    }
}
