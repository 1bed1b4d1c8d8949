//! The invisible-time state of one queue (partition) for one group: which offsets are out with
//! a consumer, until when, and how often they were delivered.
//!
//! Invariants (checked by `QueueState::check` in debug builds and by the property tests):
//! - `done_below <= next`;
//! - every in-flight offset is in `done_below..next`, and `done_below` is the smallest of them
//!   when there is one (else `next`);
//! - every offset in `done_below..next` that is not in flight is done: acked, filtered out by
//!   the receiver's tag expression, or no message at all (a transaction marker, a compacted
//!   gap). Only what is in flight is remembered;
//! - FIFO consumption: of each message group, at most one message is *active* (delivered and
//!   not done, or released to be delivered next); the group's later messages read meanwhile
//!   are *parked* (in flight with attempt 0, never visible) and released one at a time, in
//!   offset order, as the one before is done (acked, dead-lettered, gone from the log).
//!
//! A worked FIFO example: group `g` has offsets 4, 7, 9 in a queue. A receive delivers 4 and
//! parks 7 and 9. Redeliveries of 4 go on until it is acked; then 7 is released (visible now,
//! attempt 0), the next receive delivers it as attempt 1, and 9 waits for 7.

use std::collections::BTreeMap;

/// One delivered, unacknowledged message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Inflight {
    /// When it becomes visible again (milliseconds since the epoch).
    pub(crate) visible_at_ms: i64,
    /// How many times it was delivered (1 on the first delivery).
    pub attempt: u32,
    /// The delivery's nonce: a receipt handle names it, so a handle from an earlier delivery
    /// of the same message is stale.
    pub nonce: u64,
    /// Under FIFO consumption, a hash of the message's group ([`group_hash`]); `None` for a
    /// message delivered without order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<u64>,
    /// The delivery limit of the receive that handed it out (RocketMQ's
    /// `max.delivery.attempts`, a share group's `share.delivery.count.limit`): it goes to the
    /// dead letters when its invisible time runs out after that many deliveries, whichever
    /// broker leads the queue by then. `None` in state written before it was recorded: the
    /// caller's limit applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_attempts: Option<u32>,
}

/// A parked FIFO message's `visible_at_ms`: never, until released.
pub(crate) const PARKED: i64 = i64::MAX;

/// The hash of a message group that FIFO consumption orders by (FNV-1a: stable across builds).
/// Two groups of one hash are ordered together, which costs parallelism, never order.
pub(crate) fn group_hash(group: &[u8]) -> u64 {
    group.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3))
}

impl Inflight {
    /// Its delivery limit: its own, else `fallback`.
    pub(crate) fn limit(&self, fallback: u32) -> u32 {
        self.max_attempts.unwrap_or(fallback)
    }

    /// A FIFO message waiting for the one before it in its group.
    pub(crate) fn is_parked(&self) -> bool {
        self.attempt == 0 && self.visible_at_ms == PARKED
    }
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
pub(crate) struct QueueState {
    /// Every offset below is done.
    pub(crate) done_below: i64,
    /// The first offset never examined: where the next read of new messages starts. It only
    /// grows, except by a reset.
    pub next: i64,
    pub(crate) inflight: BTreeMap<i64, Inflight>,
    /// How often this state was reset ([`QueueState::reset_to`]) since the broker started.
    /// A receive reads the state, reads the log, then updates the state; one whose state was
    /// reset in between hands out nothing from what it read. Not kept on disk: it only has
    /// to tell apart two moments of one process.
    #[serde(skip)]
    pub resets: u64,
    /// The in-flight offsets changed since the store last took them ([`QueueState::take_change`]):
    /// what a change writes, without comparing the whole state with a copy of it.
    #[serde(skip)]
    pub(crate) touched: Touched,
}

/// Offsets whose in-flight entry was set or removed. Never part of a state's value: two states
/// that differ only in it are equal.
#[derive(Debug, Clone, Default)]
pub(crate) struct Touched(pub(crate) Vec<i64>);

impl PartialEq for Touched {
    fn eq(&self, _: &Touched) -> bool {
        true
    }
}

impl Eq for Touched {}

impl QueueState {
    /// A queue whose consumption starts at `offset`.
    pub(crate) fn starting_at(offset: i64) -> QueueState {
        QueueState {
            done_below: offset,
            next: offset,
            inflight: BTreeMap::new(),
            resets: 0,
            touched: Touched::default(),
        }
    }

    /// Starts consumption again at `offset` (RocketMQ's reset of a group's offset): nothing is
    /// in flight or parked any more, and every message from `offset` on is new to the group,
    /// including those delivered or acknowledged before. Handles of earlier deliveries go stale.
    pub fn reset_to(&mut self, offset: i64) {
        let resets = self.resets + 1;
        *self = QueueState { resets, ..QueueState::starting_at(offset) };
        self.check();
    }

    /// The in-flight offsets visible again at `now_ms` (their invisible time ran out) that may
    /// be delivered again (delivered fewer than `max_attempts` times), oldest first, at most
    /// `limit`.
    pub fn expired(&self, now_ms: i64, limit: usize, max_attempts: u32) -> Vec<(i64, Inflight)> {
        self.inflight
            .iter()
            .filter(|(_, i)| i.visible_at_ms <= now_ms && i.attempt < i.limit(max_attempts))
            .take(limit)
            .map(|(o, i)| (*o, *i))
            .collect()
    }

    /// The in-flight offsets whose invisible time ran out after their last allowed delivery
    /// (their own limit, else `max_attempts`): they go to the dead letters, not to a consumer.
    pub fn exhausted(&self, now_ms: i64, max_attempts: u32) -> Vec<(i64, Inflight)> {
        self.inflight
            .iter()
            .filter(|(_, i)| i.visible_at_ms <= now_ms && i.attempt >= i.limit(max_attempts))
            .map(|(o, i)| (*o, *i))
            .collect()
    }

    /// When the next in-flight message becomes visible again, if any is in flight.
    pub(crate) fn next_expiry_ms(&self) -> Option<i64> {
        self.inflight.values().map(|i| i.visible_at_ms).min()
    }

    /// Records a delivery of `offset`: a first one (it must be at or after `next`, which moves
    /// past it) or a redelivery of an in-flight offset (its attempt counts up).
    #[cfg(test)]
    pub fn deliver(&mut self, offset: i64, visible_at_ms: i64, nonce: u64) -> Inflight {
        self.deliver_in_group(offset, visible_at_ms, nonce, None, None)
    }

    /// [`QueueState::deliver`] of a message of FIFO group `group` (a first delivery; a
    /// redelivery keeps the group it had), under the receive's delivery limit `max_attempts`.
    pub(crate) fn deliver_in_group(
        &mut self,
        offset: i64,
        visible_at_ms: i64,
        nonce: u64,
        group: Option<u64>,
        max_attempts: Option<u32>,
    ) -> Inflight {
        let (attempt, group) = match self.inflight.get(&offset) {
            Some(previous) => (previous.attempt + 1, previous.group),
            None => {
                debug_assert!(offset >= self.next, "first delivery of {offset} below next {}", self.next);
                self.next = self.next.max(offset + 1);
                (1, group)
            }
        };
        let inflight = Inflight { visible_at_ms, attempt, nonce, group, max_attempts };
        self.inflight.insert(offset, inflight);
        self.touched.0.push(offset);
        self.settle();
        inflight
    }

    /// Parks `offset` (never delivered, at or after `next`) behind the active message of its
    /// FIFO group `group`.
    pub fn park(&mut self, offset: i64, group: u64) {
        debug_assert!(offset >= self.next, "parking {offset} below next {}", self.next);
        debug_assert!(self.is_active(group), "parking {offset} of a group with no active message");
        self.next = self.next.max(offset + 1);
        self.inflight.insert(
            offset,
            Inflight { visible_at_ms: PARKED, attempt: 0, nonce: 0, group: Some(group), max_attempts: None },
        );
        self.touched.0.push(offset);
        self.settle();
    }

    /// Whether FIFO group `group` has an active message (one delivered and not done, or
    /// released): its next message must wait.
    pub fn is_active(&self, group: u64) -> bool {
        self.inflight.values().any(|i| i.group == Some(group) && !i.is_parked())
    }

    /// How many FIFO messages are parked.
    pub(crate) fn parked_count(&self) -> usize {
        self.inflight.values().filter(|i| i.is_parked()).count()
    }

    /// The groups with an active message.
    pub(crate) fn active_groups(&self) -> std::collections::HashSet<u64> {
        self.inflight.values().filter(|i| !i.is_parked()).filter_map(|i| i.group).collect()
    }

    /// After a message of `group` is done: releases the group's first parked message when no
    /// other is active, to be delivered next. Returns whether one was released.
    fn release_next(&mut self, group: Option<u64>) -> bool {
        let Some(group) = group else { return false };
        if self.is_active(group) {
            return false;
        }
        let next = self.inflight.iter_mut().find(|(_, i)| i.group == Some(group) && i.is_parked());
        match next {
            Some((offset, parked)) => {
                parked.visible_at_ms = 0;
                self.touched.0.push(*offset);
                true
            }
            None => false,
        }
    }

    /// Everything below `offset` was examined and not delivered (filtered out, or no message):
    /// the next read starts there.
    pub(crate) fn skip_to(&mut self, offset: i64) {
        if offset > self.next {
            self.next = offset;
            self.settle();
        }
    }

    /// The delivery `nonce` of `offset` is done with.
    pub fn ack(&mut self, offset: i64, nonce: u64) -> Result<Inflight, HandleError> {
        let inflight = self.check_handle(offset, nonce)?;
        self.inflight.remove(&offset);
        self.touched.0.push(offset);
        self.release_next(inflight.group);
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
        self.touched.0.push(offset);
        Ok(inflight)
    }

    fn check_handle(&self, offset: i64, nonce: u64) -> Result<Inflight, HandleError> {
        match self.inflight.get(&offset) {
            None => Err(HandleError::NotInFlight),
            // Never delivered (a parked or released FIFO message): no handle names it.
            Some(inflight) if inflight.attempt == 0 => Err(HandleError::NotInFlight),
            Some(inflight) if inflight.nonce != nonce => Err(HandleError::Stale),
            Some(inflight) => Ok(*inflight),
        }
    }

    /// An in-flight message the log no longer has (compaction removed its record): done.
    pub fn forget(&mut self, offset: i64) {
        if let Some(gone) = self.inflight.remove(&offset) {
            self.touched.0.push(offset);
            self.release_next(gone.group);
            self.settle();
        }
    }

    /// The log lost everything below `log_start` (retention, DeleteRecords): those offsets are
    /// done, delivered or not.
    pub(crate) fn truncate_below(&mut self, log_start: i64) {
        if log_start > self.done_below {
            let gone: Vec<Option<u64>> =
                self.inflight.range(..log_start).map(|(_, i)| i.group).filter(Option::is_some).collect();
            let kept = self.inflight.split_off(&log_start);
            self.touched.0.extend(self.inflight.keys());
            self.inflight = kept;
            for group in gone {
                self.release_next(group);
            }
            self.next = self.next.max(log_start);
            self.done_below = log_start;
            self.settle();
        }
    }

    /// What changed since the last call (or since the state was made): the position, and the
    /// in-flight entries touched, as they are now.
    pub(crate) fn take_change(&mut self) -> super::lines::Change {
        let mut touched = std::mem::take(&mut self.touched.0);
        touched.sort_unstable();
        touched.dedup();
        let (mut set, mut removed) = (Vec::new(), Vec::new());
        for offset in touched {
            match self.inflight.get(&offset) {
                Some(inflight) => set.push((offset, *inflight)),
                None => removed.push(offset),
            }
        }
        super::lines::Change { done_below: self.done_below, next: self.next, set, removed }
    }

    fn settle(&mut self) {
        self.done_below = self.inflight.keys().next().copied().unwrap_or(self.next);
        self.check();
    }

    /// Asserts the invariants (debug builds).
    pub fn check(&self) {
        #[cfg(debug_assertions)]
        {
            let mut active = std::collections::HashSet::new();
            for inflight in self.inflight.values().filter(|i| !i.is_parked()) {
                if let Some(group) = inflight.group {
                    debug_assert!(active.insert(group), "two active messages of one FIFO group: {self:?}");
                }
            }
            // None waits for nothing: a parked message's group has its active one.
            for (offset, parked) in self.inflight.iter().filter(|(_, i)| i.is_parked()) {
                debug_assert!(
                    parked.group.is_some_and(|group| active.contains(&group)),
                    "{offset} is parked behind no active message of its group: {self:?}"
                );
            }
        }
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
        assert_eq!(
            q.ack(11, 2),
            Ok(Inflight { visible_at_ms: 1_000, attempt: 1, nonce: 2, group: None, max_attempts: None })
        );
        assert_eq!(q.ack(11, 2), Err(HandleError::NotInFlight), "acked twice");
        assert_eq!(q.done_below, 10, "10 is still out");
        assert_eq!(q.expired(999, 10, 16), vec![]);
        assert_eq!(
            q.expired(1_000, 10, 16),
            vec![(10, Inflight { visible_at_ms: 1_000, attempt: 1, nonce: 1, group: None, max_attempts: None })]
        );
        assert_eq!(q.exhausted(1_000, 16), vec![]);
        // Delivered as often as allowed: not again, but to the dead letters.
        assert_eq!(q.expired(1_000, 10, 1), vec![]);
        assert_eq!(
            q.exhausted(1_000, 1),
            vec![(10, Inflight { visible_at_ms: 1_000, attempt: 1, nonce: 1, group: None, max_attempts: None })]
        );
        let again = q.deliver(10, 2_000, 3);
        assert_eq!(again.attempt, 2);
        assert_eq!(q.ack(10, 1), Err(HandleError::Stale), "the first delivery's handle");
        assert!(q.ack(10, 3).is_ok());
        assert_eq!((q.done_below, q.next), (12, 12));
    }

    #[test]
    fn a_reset_forgets_every_delivery_and_starts_at_its_offset_in_either_direction() {
        let g = group_hash(b"g");
        let mut q = QueueState::starting_at(0);
        q.deliver(0, 100, 1);
        q.deliver_in_group(1, 100, 2, Some(g), None);
        q.park(2, g);
        q.skip_to(10);
        q.reset_to(1);
        assert_eq!((q.done_below, q.next, q.inflight.len(), q.resets), (1, 1, 0, 1));
        assert_eq!(q.ack(1, 2), Err(HandleError::NotInFlight), "a handle from before the reset");
        // Delivered again as a first delivery, then forward past everything.
        assert_eq!(q.deliver(1, 200, 3).attempt, 1);
        q.reset_to(50);
        assert_eq!((q.done_below, q.next, q.inflight.len(), q.resets), (50, 50, 0, 2));
        assert_eq!(q.parked_count(), 0);
    }

    #[test]
    fn a_fifo_groups_next_message_waits_until_the_one_before_is_done() {
        let (g, h) = (group_hash(b"g"), group_hash(b"h"));
        let mut q = QueueState::starting_at(0);
        q.deliver_in_group(0, 100, 1, Some(g), None);
        q.park(1, g);
        q.deliver_in_group(2, 100, 2, Some(h), None); // another group goes on
        q.park(3, g);
        assert_eq!(q.active_groups(), [g, h].into_iter().collect());
        // Parked messages are never visible, and no handle names them.
        assert_eq!(q.expired(i64::MAX - 1, 10, 16).iter().map(|(o, _)| *o).collect::<Vec<_>>(), vec![0, 2]);
        assert_eq!(q.ack(1, 0), Err(HandleError::NotInFlight));
        // Redelivering 0 releases nothing; acking it releases 1, not 3.
        q.deliver(0, 200, 3);
        assert!(q.ack(0, 3).is_ok());
        assert_eq!(
            q.expired(300, 10, 16).iter().map(|(o, i)| (*o, i.attempt)).collect::<Vec<_>>(),
            vec![(1, 0), (2, 1)]
        );
        assert_eq!(q.deliver(1, 400, 4).attempt, 1, "a released message's first delivery");
        assert!(q.inflight[&3].is_parked());
        // Dead-lettered or gone, the next is released as if acked.
        q.forget(1);
        assert!(!q.inflight[&3].is_parked());
        assert_eq!(q.done_below, 2);
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
        /// A new message of FIFO group `.1 % 3`: delivered, or parked behind its group's active one.
        DeliverGrouped(u8, u8),
        Redeliver(u8),
        Ack(u8, bool),
        Change(u8, bool),
        Skip(u8),
        Truncate(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            any::<u8>().prop_map(Op::DeliverNew),
            (any::<u8>(), any::<u8>()).prop_map(|(gap, group)| Op::DeliverGrouped(gap, group)),
            any::<u8>().prop_map(Op::Redeliver),
            (any::<u8>(), any::<bool>()).prop_map(|(o, s)| Op::Ack(o, s)),
            (any::<u8>(), any::<bool>()).prop_map(|(o, s)| Op::Change(o, s)),
            (0u8..4).prop_map(Op::Skip),
            (0u8..4).prop_map(Op::Truncate),
        ]
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "two active messages of one FIFO group")]
    fn two_active_messages_of_one_group_are_caught() {
        let g = group_hash(b"g");
        let mut q = QueueState::starting_at(0);
        q.deliver_in_group(0, 100, 1, Some(g), None);
        q.deliver_in_group(1, 100, 2, Some(g), None);
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "parked behind no active message")]
    fn a_message_parked_behind_nothing_is_caught() {
        let mut q = QueueState::starting_at(0);
        q.deliver(0, 100, 1);
        q.inflight.insert(
            1,
            Inflight { visible_at_ms: PARKED, attempt: 0, nonce: 0, group: Some(group_hash(b"g")), max_attempts: None },
        );
        q.next = 2;
        q.check();
    }

    proptest! {
        /// Whatever the order of deliveries (FIFO ones too), acks, changes and truncations: the
        /// invariants hold (one active message per FIFO group among them), an offset is acked at
        /// most once per delivery, nothing below `done_below` is in flight, and a FIFO group
        /// with waiting messages always has one active (none waits for nothing).
        #[test]
        fn the_invariants_hold_under_any_sequence(ops in proptest::collection::vec(op(), 1..200)) {
            let mut q = QueueState::starting_at(0);
            let mut nonce = 0u64;
            for op in ops {
                nonce += 1;
                match op {
                    Op::DeliverNew(gap) => { let at = q.next + i64::from(gap % 3); q.deliver(at, 0, nonce); }
                    Op::DeliverGrouped(gap, group) => {
                        let (at, group) = (q.next + i64::from(gap % 3), u64::from(group % 3));
                        if q.is_active(group) {
                            q.park(at, group);
                        } else {
                            q.deliver_in_group(at, 0, nonce, Some(group), None);
                        }
                    }
                    Op::Redeliver(pick) => {
                        // What a receive redelivers: anything but a parked message.
                        let offsets: Vec<i64> = q.inflight.iter().filter(|(_, i)| !i.is_parked()).map(|(o, _)| *o).collect();
                        if !offsets.is_empty() {
                            let at = offsets[pick as usize % offsets.len()];
                            let before = q.inflight[&at].attempt;
                            prop_assert_eq!(q.deliver(at, 0, nonce).attempt, before + 1);
                        }
                    }
                    Op::Ack(pick, stale) | Op::Change(pick, stale) if q.inflight.values().any(|i| i.attempt > 0) => {
                        // Only a delivered message has a handle.
                        let offsets: Vec<(i64, Inflight)> =
                            q.inflight.iter().filter(|(_, i)| i.attempt > 0).map(|(o, i)| (*o, *i)).collect();
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
                let waiting: std::collections::HashSet<u64> =
                    q.inflight.values().filter(|i| i.is_parked()).filter_map(|i| i.group).collect();
                prop_assert!(waiting.iter().all(|g| q.is_active(*g)), "a parked group with nothing active: {:?}", q);
            }
        }
    }
}
