//! The invisible-time state of one queue (partition) for one group: which offsets are out with
//! a consumer, until when, and how often they were delivered.
//!
//! Invariants (checked by [`QueueState::check`] in debug builds and by the property tests):
//! - `done_below <= next`;
//! - every in-flight offset is in `done_below..next`, and `done_below` is the smallest of them
//!   when there is one (else `next`);
//! - every offset in `done_below..next` that is not in flight is done: acked, filtered out by
//!   the receiver's tag expression, or no message at all (a transaction marker, a compacted
//!   gap). Only what is in flight is remembered.

use std::collections::BTreeMap;

/// One delivered, unacknowledged message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Inflight {
    /// When it becomes visible again (milliseconds since the epoch).
    pub visible_at_ms: i64,
    /// How many times it was delivered (1 on the first delivery).
    pub attempt: u32,
    /// The delivery's nonce: a receipt handle names it, so a handle from an earlier delivery
    /// of the same message is stale.
    pub nonce: u64,
}

/// Why an ack or a change of invisible time was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandleError {
    /// The offset is not in flight (acked already, or never delivered).
    NotInFlight,
    /// In flight, but under another delivery: the handle is stale.
    Stale,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueueState {
    /// Every offset below is done.
    pub done_below: i64,
    /// The first offset never examined: where the next read of new messages starts.
    pub next: i64,
    pub inflight: BTreeMap<i64, Inflight>,
}

impl QueueState {
    /// A queue whose consumption starts at `offset`.
    pub fn starting_at(offset: i64) -> QueueState {
        QueueState { done_below: offset, next: offset, inflight: BTreeMap::new() }
    }

    /// The in-flight offsets visible again at `now_ms` (their invisible time ran out) that may
    /// be delivered again (delivered fewer than `max_attempts` times), oldest first, at most
    /// `limit`.
    pub fn expired(&self, now_ms: i64, limit: usize, max_attempts: u32) -> Vec<(i64, Inflight)> {
        self.inflight
            .iter()
            .filter(|(_, i)| i.visible_at_ms <= now_ms && i.attempt < max_attempts)
            .take(limit)
            .map(|(o, i)| (*o, *i))
            .collect()
    }

    /// The in-flight offsets whose invisible time ran out after their last allowed delivery
    /// (`max_attempts`): they go to the dead letters, not to a consumer.
    pub fn exhausted(&self, now_ms: i64, max_attempts: u32) -> Vec<(i64, Inflight)> {
        self.inflight
            .iter()
            .filter(|(_, i)| i.visible_at_ms <= now_ms && i.attempt >= max_attempts)
            .map(|(o, i)| (*o, *i))
            .collect()
    }

    /// When the next in-flight message becomes visible again, if any is in flight.
    pub fn next_expiry_ms(&self) -> Option<i64> {
        self.inflight.values().map(|i| i.visible_at_ms).min()
    }

    /// Records a delivery of `offset`: a first one (it must be at or after `next`, which moves
    /// past it) or a redelivery of an in-flight offset (its attempt counts up).
    pub fn deliver(&mut self, offset: i64, visible_at_ms: i64, nonce: u64) -> Inflight {
        let attempt = match self.inflight.get(&offset) {
            Some(previous) => previous.attempt + 1,
            None => {
                debug_assert!(offset >= self.next, "first delivery of {offset} below next {}", self.next);
                self.next = self.next.max(offset + 1);
                1
            }
        };
        let inflight = Inflight { visible_at_ms, attempt, nonce };
        self.inflight.insert(offset, inflight);
        self.settle();
        inflight
    }

    /// Everything below `offset` was examined and not delivered (filtered out, or no message):
    /// the next read starts there.
    pub fn skip_to(&mut self, offset: i64) {
        if offset > self.next {
            self.next = offset;
            self.settle();
        }
    }

    /// The delivery `nonce` of `offset` is done with.
    pub fn ack(&mut self, offset: i64, nonce: u64) -> Result<Inflight, HandleError> {
        let inflight = self.check_handle(offset, nonce)?;
        self.inflight.remove(&offset);
        self.settle();
        Ok(inflight)
    }

    /// The delivery `nonce` of `offset` becomes visible at `visible_at_ms` instead, under the
    /// new nonce `renewed` (the old handle goes stale, as RocketMQ's does).
    pub fn change_invisible(
        &mut self,
        offset: i64,
        nonce: u64,
        visible_at_ms: i64,
        renewed: u64,
    ) -> Result<Inflight, HandleError> {
        let mut inflight = self.check_handle(offset, nonce)?;
        inflight.visible_at_ms = visible_at_ms;
        inflight.nonce = renewed;
        self.inflight.insert(offset, inflight);
        Ok(inflight)
    }

    fn check_handle(&self, offset: i64, nonce: u64) -> Result<Inflight, HandleError> {
        match self.inflight.get(&offset) {
            None => Err(HandleError::NotInFlight),
            Some(inflight) if inflight.nonce != nonce => Err(HandleError::Stale),
            Some(inflight) => Ok(*inflight),
        }
    }

    /// An in-flight message the log no longer has (compaction removed its record): done.
    pub fn forget(&mut self, offset: i64) {
        if self.inflight.remove(&offset).is_some() {
            self.settle();
        }
    }

    /// The log lost everything below `log_start` (retention, DeleteRecords): those offsets are
    /// done, delivered or not.
    pub fn truncate_below(&mut self, log_start: i64) {
        if log_start > self.done_below {
            self.inflight.retain(|offset, _| *offset >= log_start);
            self.next = self.next.max(log_start);
            self.done_below = log_start;
            self.settle();
        }
    }

    fn settle(&mut self) {
        self.done_below = self.inflight.keys().next().copied().unwrap_or(self.next);
        self.check();
    }

    /// Asserts the invariants (debug builds).
    pub fn check(&self) {
        debug_assert!(self.done_below <= self.next, "done_below {} above next {}", self.done_below, self.next);
        debug_assert!(self.inflight.keys().all(|o| (self.done_below..self.next).contains(o)), "{self:?}");
        debug_assert_eq!(self.done_below, self.inflight.keys().next().copied().unwrap_or(self.next), "{self:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_delivered_message_is_done_once_acked_and_back_after_its_invisible_time() {
        let mut q = QueueState::starting_at(10);
        q.deliver(10, 1_000, 1);
        q.deliver(11, 1_000, 2);
        assert_eq!((q.done_below, q.next), (10, 12));
        assert_eq!(q.ack(11, 2), Ok(Inflight { visible_at_ms: 1_000, attempt: 1, nonce: 2 }));
        assert_eq!(q.ack(11, 2), Err(HandleError::NotInFlight), "acked twice");
        assert_eq!(q.done_below, 10, "10 is still out");
        assert_eq!(q.expired(999, 10, 16), vec![]);
        assert_eq!(q.expired(1_000, 10, 16), vec![(10, Inflight { visible_at_ms: 1_000, attempt: 1, nonce: 1 })]);
        assert_eq!(q.exhausted(1_000, 16), vec![]);
        // Delivered as often as allowed: not again, but to the dead letters.
        assert_eq!(q.expired(1_000, 10, 1), vec![]);
        assert_eq!(q.exhausted(1_000, 1), vec![(10, Inflight { visible_at_ms: 1_000, attempt: 1, nonce: 1 })]);
        let again = q.deliver(10, 2_000, 3);
        assert_eq!(again.attempt, 2);
        assert_eq!(q.ack(10, 1), Err(HandleError::Stale), "the first delivery's handle");
        assert!(q.ack(10, 3).is_ok());
        assert_eq!((q.done_below, q.next), (12, 12));
    }

    #[test]
    fn a_forgotten_message_is_done() {
        let mut q = QueueState::starting_at(0);
        q.deliver(0, 1, 1);
        q.deliver(1, 1, 2);
        q.forget(0);
        assert_eq!((q.done_below, q.inflight.len()), (1, 1));
        q.forget(5);
        assert_eq!(q.done_below, 1);
    }

    #[test]
    fn a_changed_invisible_time_renews_the_handle() {
        let mut q = QueueState::starting_at(0);
        q.deliver(0, 100, 7);
        assert_eq!(q.change_invisible(0, 7, 5_000, 8).map(|i| i.visible_at_ms), Ok(5_000));
        assert_eq!(q.expired(4_999, 1, 16), vec![]);
        assert_eq!(q.ack(0, 7), Err(HandleError::Stale));
        assert!(q.ack(0, 8).is_ok());
    }

    #[test]
    fn skipped_and_truncated_offsets_are_done() {
        let mut q = QueueState::starting_at(0);
        q.skip_to(5);
        assert_eq!((q.done_below, q.next), (5, 5));
        q.deliver(5, 10, 1);
        q.deliver(8, 10, 2);
        q.truncate_below(7);
        assert_eq!(q.inflight.keys().copied().collect::<Vec<_>>(), vec![8]);
        assert_eq!((q.done_below, q.next), (8, 9));
    }

    #[derive(Debug, Clone)]
    enum Op {
        DeliverNew(u8),
        Redeliver(u8),
        Ack(u8, bool),
        Change(u8, bool),
        Skip(u8),
        Truncate(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            any::<u8>().prop_map(Op::DeliverNew),
            any::<u8>().prop_map(Op::Redeliver),
            (any::<u8>(), any::<bool>()).prop_map(|(o, s)| Op::Ack(o, s)),
            (any::<u8>(), any::<bool>()).prop_map(|(o, s)| Op::Change(o, s)),
            (0u8..4).prop_map(Op::Skip),
            (0u8..4).prop_map(Op::Truncate),
        ]
    }

    proptest! {
        /// Whatever the order of deliveries, acks, changes and truncations: the invariants hold,
        /// an offset is acked at most once per delivery, and nothing below `done_below` is in
        /// flight.
        #[test]
        fn the_invariants_hold_under_any_sequence(ops in proptest::collection::vec(op(), 1..200)) {
            let mut q = QueueState::starting_at(0);
            let mut nonce = 0u64;
            for op in ops {
                nonce += 1;
                match op {
                    Op::DeliverNew(gap) => { let at = q.next + i64::from(gap % 3); q.deliver(at, 0, nonce); }
                    Op::Redeliver(pick) => {
                        let offsets: Vec<i64> = q.inflight.keys().copied().collect();
                        if !offsets.is_empty() {
                            let at = offsets[pick as usize % offsets.len()];
                            let before = q.inflight[&at].attempt;
                            prop_assert_eq!(q.deliver(at, 0, nonce).attempt, before + 1);
                        }
                    }
                    Op::Ack(pick, stale) | Op::Change(pick, stale) if !q.inflight.is_empty() => {
                        let offsets: Vec<(i64, Inflight)> = q.inflight.iter().map(|(o, i)| (*o, *i)).collect();
                        let (at, inflight) = offsets[pick as usize % offsets.len()];
                        let given = if stale { inflight.nonce.wrapping_add(1_000_000) } else { inflight.nonce };
                        let result = if matches!(op, Op::Ack(..)) { q.ack(at, given) } else { q.change_invisible(at, given, 5, nonce) };
                        prop_assert_eq!(result.is_ok(), !stale);
                        if matches!(op, Op::Ack(..)) && !stale {
                            prop_assert!(q.ack(at, given).is_err());
                        }
                    }
                    Op::Ack(..) | Op::Change(..) => {}
                    Op::Skip(n) => q.skip_to(q.next + i64::from(n)),
                    Op::Truncate(n) => q.truncate_below(q.done_below + i64::from(n)),
                }
                prop_assert!(q.done_below <= q.next);
                prop_assert!(q.inflight.keys().all(|o| *o >= q.done_below && *o < q.next));
            }
        }
    }
}
