//! A receive by invisible time: which messages of one queue go out to one group, with long
//! polling. What each protocol calls it (RocketMQ's ReceiveMessage, a Kafka share group's
//! ShareFetch) is decoded by its front-end into a [`ReceiveRequest`]; the answer is the
//! [`Delivery`]s, each a record with its attempt and the nonce a receipt names.
//!
//! A receive of one queue for one group first hands out that queue's messages whose invisible
//! time ran out (one delivery attempt higher), then new ones from the group's position,
//! skipping what the [`TagFilter`] filters out; with nothing to hand out it waits for an
//! append, for an in-flight message to become visible again, or for its deadline. Messages that
//! used up their deliveries go to the dead letters first (`super::dead_letter`). Receives of
//! one queue for one group take turns (`ReceiveTurns`), so two consumers never get the same
//! message at once.
//!
//! New messages are read in steps sized by what they find ([`first_step`], [`next_step`]; at
//! most [`READ_BYTES`] in all), and under a tag filter only the batches the message index
//! names. Under FIFO consumption a new message of a group with an active one is parked, not
//! delivered ([`super::state`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use weir_storage::records::Record;
use weir_storage::sync::lock;

use super::filter::TagFilter;
use crate::pop::state::group_hash;
use crate::pop::{Durable, QueueKey, QueueState, MAX_INFLIGHT_PER_QUEUE, MAX_PARKED_PER_QUEUE};
use crate::Messaging;
use weir_broker::broker::OffsetQuery;
use weir_broker::fetch::Isolation;
use weir_broker::group_config::ConsumeFrom;
use weir_broker::{BrokerError, Partition};

/// The longest a receive waits for messages.
pub const MAX_LONG_POLLING: Duration = Duration::from_secs(60);
/// The most messages one receive asks for.
pub const MAX_BATCH: usize = 1024;
/// The shortest invisible duration a receive may ask for.
pub const MIN_INVISIBLE: Duration = Duration::from_secs(1);
/// The longest invisible duration a receive, or a change of invisible time, may ask for.
pub const MAX_INVISIBLE: Duration = Duration::from_secs(12 * 3600);
/// How much of a queue one receive reads at most while looking for new messages.
const READ_BYTES: u64 = 4 << 20;
/// The first read of a filtered scan, and of one in a log whose record size is not known:
/// about a batch of 32 messages of 1 KiB with their headers.
const FIRST_READ_BYTES: u64 = 64 << 10;

/// How soon a long poll tries again to move a dead letter it could not move.
const RETRY_DEAD_LETTER_MS: u64 = 200;

/// Most queue turns remembered before those nobody holds or waits for are dropped.
const TURNS_MAX: usize = 1024;

/// What a receive asks for. The front-end validates it against [`MAX_BATCH`],
/// [`MIN_INVISIBLE`]..=[`MAX_INVISIBLE`] and [`MAX_LONG_POLLING`] (each protocol refuses with
/// its own codes); [`ReceiveRequest::check`] asserts it did.
#[derive(Clone)]
pub struct ReceiveRequest {
    /// The queue, and whose consumption of it.
    pub key: QueueKey,
    /// The partition `key` names, led by this broker.
    pub partition: Arc<Partition>,
    pub filter: TagFilter,
    /// The most messages to hand out (1..=[`MAX_BATCH`]); FIFO races with acks may add a few.
    pub batch: usize,
    /// How long what is handed out stays invisible to the group.
    pub invisible: Duration,
    /// How long to wait for a message when there is none.
    pub long_polling: Duration,
    /// The group's `max.delivery.attempts`: a message delivered this often is not delivered
    /// again but dead-lettered.
    pub max_attempts: u32,
    /// The group's `consume.fifo`: messages of one message group go out one at a time, in
    /// order (see [`super::state`]).
    pub fifo: bool,
    /// The group's `consume.from.where`: where it starts on this queue when it has no state
    /// for it yet (a new group, or a new broadcasting consumer).
    pub start: ConsumeFrom,
    /// The client the deliveries are held for: their invisible time is renewed, one
    /// `invisible` at a time, while it lives ([`super::renew`], a push consumer's receive).
    /// `None`: they come back after `invisible`.
    pub hold_for: Option<String>,
    /// The nonce each delivery of this receive gets, chosen by the caller; `None`: a random
    /// one per pass (a handle's offset tells its deliveries apart). A protocol whose
    /// acknowledgements name no nonce (a Kafka share group's, by offset) gives one per
    /// consumer (a hash of its member id), so that its ack by offset names its own delivery
    /// and another consumer's is refused as stale.
    pub nonce: Option<u64>,
    /// Hand new messages on as the log stores them, a whole batch at a time
    /// ([`Received::batches`]), not decoded: what a Kafka share group's fetch sends on as it
    /// is. Only without a tag filter and FIFO order, which look into each message. A receive may
    /// then hand out up to a batch more than `batch` messages, as Kafka acquires whole batches.
    pub whole_batches: bool,
}

impl ReceiveRequest {
    /// Asserts what the front-end validated (debug builds).
    pub fn check(&self) {
        debug_assert!((1..=MAX_BATCH).contains(&self.batch), "batch {}", self.batch);
        debug_assert!((MIN_INVISIBLE..=MAX_INVISIBLE).contains(&self.invisible), "invisible {:?}", self.invisible);
        debug_assert!(self.long_polling <= MAX_LONG_POLLING, "long polling {:?}", self.long_polling);
        debug_assert!(self.max_attempts >= 1, "no delivery allowed");
        debug_assert!(
            self.partition.topic == self.key.topic && self.partition.index == self.key.partition,
            "{:?} received from {}-{}",
            self.key,
            self.partition.topic,
            self.partition.index
        );
        self.filter.check();
        debug_assert!(
            !self.whole_batches || (matches!(self.filter, TagFilter::All) && !self.fifo),
            "whole batches under a tag filter or FIFO order"
        );
    }
}

/// One message handed out.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub record: Record,
    /// How many times it was delivered, this time included (1 on the first delivery).
    pub attempt: u32,
    /// Names this delivery: an ack or a change of invisible time must give it back.
    pub nonce: u64,
}

/// What a receive hands out: decoded deliveries (every one, unless the request asked for
/// [`ReceiveRequest::whole_batches`]), and the stored batches handed out whole.
#[derive(Debug, Default)]
pub struct Received {
    pub deliveries: Vec<Delivery>,
    pub batches: Vec<BatchDelivery>,
}

impl Received {
    pub fn is_empty(&self) -> bool {
        self.deliveries.is_empty() && self.batches.is_empty()
    }

    /// About how many bytes went out: the stored batches' sizes and the decoded records' keys,
    /// values and headers (what a fetch's `MinBytes` counts).
    pub fn bytes(&self) -> usize {
        let records: usize = self
            .deliveries
            .iter()
            .map(|d| {
                let r = &d.record;
                let headers: usize =
                    r.headers.iter().map(|h| h.name.len() + h.value.as_ref().map_or(0, |v| v.len())).sum();
                r.key.as_ref().map_or(0, |k| k.len()) + r.value.as_ref().map_or(0, |v| v.len()) + headers
            })
            .sum();
        records + self.batches.iter().map(|b| b.batch.bytes.len()).sum::<usize>()
    }

    /// Adds what a later pass over the same queue handed out.
    pub fn append(&mut self, later: Received) {
        self.deliveries.extend(later.deliveries);
        self.batches.extend(later.batches);
    }

    /// How many messages went out.
    pub fn len(&self) -> usize {
        self.deliveries.len() + self.batches.iter().map(|b| b.offsets.len()).sum::<usize>()
    }

    /// Every offset handed out, with the nonce its delivery got.
    pub fn offsets(&self) -> impl Iterator<Item = (i64, u64)> + '_ {
        let batched = self.batches.iter().flat_map(|b| b.offsets.iter().map(move |o| (o, b.nonce)));
        self.deliveries.iter().map(|d| (d.record.offset, d.nonce)).chain(batched)
    }
}

/// A stored batch handed out as the log keeps it: its records at `offsets` went out for the
/// first time (attempt 1), all under `nonce`. They are the batch's records from the receive's
/// start on; a batch that began before it, or whose records compaction thinned, holds records
/// that did not go out (see [`BatchDelivery::is_whole`]).
#[derive(Debug, Clone)]
pub struct BatchDelivery {
    pub batch: weir_broker::StoredBatch,
    pub offsets: BatchOffsets,
    pub nonce: u64,
}

impl BatchDelivery {
    /// Whether every record of the batch went out: the batch can be sent on as it is.
    pub fn is_whole(&self) -> bool {
        let header = &self.batch.header;
        self.batch.is_dense()
            && matches!(self.offsets, BatchOffsets::Range(first, last)
                if first == header.base_offset && last == header.last_offset())
    }
}

/// The offsets of a [`BatchDelivery`], ascending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOffsets {
    /// Every offset of `first..=last`.
    Range(i64, i64),
    /// These (a batch thinned by compaction).
    List(Vec<i64>),
}

impl BatchOffsets {
    pub fn len(&self) -> usize {
        match self {
            BatchOffsets::Range(first, last) => (last - first + 1).max(0) as usize,
            BatchOffsets::List(offsets) => offsets.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The offsets, ascending (no allocation: this runs for every batch a share fetch hands out).
    pub fn iter(&self) -> impl Iterator<Item = i64> + '_ {
        let (range, list) = match self {
            BatchOffsets::Range(first, last) => (*first..=*last, &[][..]),
            #[allow(clippy::reversed_empty_ranges)]
            BatchOffsets::List(offsets) => (1..=0, &offsets[..]),
        };
        range.chain(list.iter().copied())
    }

    fn first(&self) -> Option<i64> {
        match self {
            BatchOffsets::Range(first, _) => Some(*first),
            BatchOffsets::List(offsets) => offsets.first().copied(),
        }
    }
}

/// Receives take turns per queue and group.
#[derive(Default)]
pub(crate) struct ReceiveTurns(Mutex<HashMap<QueueKey, Arc<tokio::sync::Mutex<()>>>>);

impl ReceiveTurns {
    fn of(&self, key: &QueueKey) -> Arc<tokio::sync::Mutex<()>> {
        let mut turns = lock(&self.0);
        // Turns nobody holds or waits for are dropped, so the map stays as large as what is
        // being received.
        if turns.len() > TURNS_MAX {
            turns.retain(|_, turn| Arc::strong_count(turn) > 1);
        }
        turns.entry(key.clone()).or_default().clone()
    }
}

/// The FIFO group hash of `record`, when the receive orders by group and it has one.
fn fifo_group(request: &ReceiveRequest, record: &Record) -> Option<u64> {
    if !request.fifo {
        return None;
    }
    weir_broker::message::fifo_group(record).map(group_hash)
}

/// One pass of a receive: what it hands out now (maybe nothing), once the write of its state
/// is durable. The queue must be loaded. Blocking.
pub(crate) fn receive_once(
    messaging: &Messaging,
    request: &ReceiveRequest,
) -> Result<(Received, Durable), BrokerError> {
    let partition = &request.partition;
    let log_start = partition.log.log_start_offset();
    let now = messaging.broker.now_ms();
    // A queue the group has no state for starts where its `consume.from.where` says, decided
    // once: the update below stores this very state, so a message appended between the two
    // reads of the state is not skipped by a later "latest".
    let (state, fresh) = match messaging.pop.get(&request.key) {
        Some(state) => (state, None),
        None => {
            let fresh = QueueState::starting_at(first_offset(messaging, request, log_start, now)?);
            (fresh.clone(), Some(fresh))
        }
    };
    let start = || fresh.unwrap_or_else(|| QueueState::starting_at(log_start));

    // Messages whose invisible time ran out, then new ones.
    let mut pass = Pass::new(request, &state, log_start);
    pass.pick_expired(messaging, &state, now)?;
    let room = pass.room(&state);
    // A tag filter reads only the batches the message index names (when it covers what is next).
    let indexed = match &request.filter {
        TagFilter::Tags(tags) if room > 0 => {
            messaging.message_index.tagged_offsets(&partition.topic, partition.index, tags, pass.examined_to, room)
        }
        _ => None,
    };
    match indexed.filter(|(_, indexed_to)| *indexed_to > pass.examined_to) {
        Some((offsets, indexed_to)) => pass.pick_indexed(messaging, &offsets, indexed_to, room)?,
        None if room > 0 && request.whole_batches => pass.pick_batches(messaging, room)?,
        None if room > 0 => pass.pick_scanned(messaging, room)?,
        None => {}
    }

    let visible_at = now + request.invisible.as_millis() as i64;
    let Pass { picked, batches, vanished, examined_to, .. } = pass;
    let (result, durable) = messaging.pop.update(&request.key, start, |q| {
        // Reset since it was read: what was read is no longer what the group has next. (A
        // batch's first offset below `next` cannot be new either; only a reset moves `next`
        // between the read and here, receives of the queue taking turns.)
        if q.resets != state.resets || batches.iter().any(|(_, offsets)| offsets.first().is_some_and(|o| o < q.next)) {
            return Ok::<_, ()>(Received::default());
        }
        q.truncate_below(log_start);
        for offset in &vanished {
            q.forget(*offset);
        }
        let deliveries = deliver(q, request, picked, visible_at);
        let batches = deliver_batches(q, request, batches, visible_at);
        q.skip_to(examined_to);
        Ok::<_, ()>(Received { deliveries, batches })
    })?;
    let received = result.unwrap_or_default();
    check_deliveries(log_start, &received);
    Ok((received, durable))
}

/// Where a group without state for the queue starts (its `consume.from.where`): the oldest
/// offset, the last stable offset (nothing of a transaction still open is skipped: its records
/// lie at or after it), or the first offset at or after a time (the last stable offset when no
/// record is that late). Blocking.
fn first_offset(
    messaging: &Messaging,
    request: &ReceiveRequest,
    log_start: i64,
    now_ms: i64,
) -> Result<i64, BrokerError> {
    let partition = &request.partition;
    let offset = match request.start {
        ConsumeFrom::FirstOffset => log_start,
        ConsumeFrom::LastOffset => partition.log.last_stable_offset(),
        ConsumeFrom::Timestamp(time) => {
            let query = OffsetQuery::AtTimestamp(time.at(now_ms));
            match messaging.broker.list_offset(partition, query, Isolation::Committed)? {
                Some(found) => found.offset,
                None => partition.log.last_stable_offset(),
            }
        }
    };
    Ok(offset.max(log_start))
}

/// Hands out what a pass picked, against the state as it is now (it may have moved since the
/// pass read it: an ack of a redelivery candidate): a FIFO message of a group with an active
/// one is parked instead.
fn deliver(
    q: &mut QueueState,
    request: &ReceiveRequest,
    picked: Vec<(Record, bool)>,
    visible_at: i64,
) -> Vec<Delivery> {
    let mut deliveries = Vec::with_capacity(picked.len());
    // One nonce for the whole pass: a handle names its offset too, so it still names one
    // delivery (a redelivery comes in another pass, under another nonce), and the line that
    // records the pass holds one run of alike entries rather than one entry per message.
    let nonce = request.nonce.unwrap_or_else(rand::random::<u64>);
    for (record, redelivery) in picked {
        let in_flight = q.inflight.contains_key(&record.offset);
        if redelivery != in_flight || (!redelivery && record.offset < q.next) {
            continue;
        }
        let group = if redelivery { None } else { fifo_group(request, &record) };
        if let Some(group) = group.filter(|g| q.is_active(*g)) {
            q.park(record.offset, group);
            continue;
        }
        let inflight = q.deliver_in_group(record.offset, visible_at, nonce, group, Some(request.max_attempts));
        deliveries.push(Delivery { record, attempt: inflight.attempt, nonce });
    }
    deliveries
}

/// First deliveries of whole stored batches (a request for [`ReceiveRequest::whole_batches`]),
/// all under one nonce. Their offsets are new (at or after `next`, checked by the caller).
fn deliver_batches(
    q: &mut QueueState,
    request: &ReceiveRequest,
    picked: Vec<(weir_broker::StoredBatch, BatchOffsets)>,
    visible_at: i64,
) -> Vec<BatchDelivery> {
    if picked.is_empty() {
        return Vec::new();
    }
    let nonce = request.nonce.unwrap_or_else(rand::random::<u64>);
    let mut out = Vec::with_capacity(picked.len());
    for (batch, offsets) in picked {
        for offset in offsets.iter() {
            let inflight = q.deliver_in_group(offset, visible_at, nonce, None, Some(request.max_attempts));
            debug_assert_eq!(inflight.attempt, 1, "offset {offset} of a batch was in flight already");
        }
        out.push(BatchDelivery { batch, offsets, nonce });
    }
    out
}

/// What one receive pass picked from a queue, before the queue's state is updated.
struct Pass<'a> {
    request: &'a ReceiveRequest,
    /// The records to hand out, each with whether it is a redelivery.
    picked: Vec<(Record, bool)>,
    /// The stored batches to hand out whole (new messages, [`ReceiveRequest::whole_batches`]),
    /// each with its offsets that go out.
    batches: Vec<(weir_broker::StoredBatch, BatchOffsets)>,
    /// In flight, but compacted away since: done, or it would stay in flight for ever.
    vanished: Vec<i64>,
    /// Every offset below this was looked at: the group's next offset after the pass.
    examined_to: i64,
    /// FIFO: a new message of a group with an active one is parked, not delivered; it takes
    /// room in the state (up to MAX_PARKED_PER_QUEUE) but not in the batch. `busy` predicts it
    /// (the update decides).
    busy: std::collections::HashSet<u64>,
    park_room: usize,
}

impl<'a> Pass<'a> {
    fn new(request: &'a ReceiveRequest, state: &QueueState, log_start: i64) -> Pass<'a> {
        Pass {
            request,
            picked: Vec::new(),
            batches: Vec::new(),
            vanished: Vec::new(),
            examined_to: state.next.max(log_start),
            busy: if request.fifo { state.active_groups() } else { Default::default() },
            park_room: MAX_PARKED_PER_QUEUE.saturating_sub(state.parked_count()),
        }
    }

    /// The messages whose invisible time ran out.
    fn pick_expired(&mut self, messaging: &Messaging, state: &QueueState, now: i64) -> Result<(), BrokerError> {
        let request = self.request;
        for (offset, _) in state.expired(now, request.batch, request.max_attempts) {
            match messaging.broker.read_record(&request.partition, offset)? {
                Some(record) => self.picked.push((record, true)),
                None => self.vanished.push(offset),
            }
        }
        Ok(())
    }

    /// How many new messages may go out: what the batch has left, within the queue's limit of
    /// messages in flight.
    fn room(&self, state: &QueueState) -> usize {
        let delivered = state.inflight.len() - state.parked_count();
        self.request.batch.saturating_sub(self.picked.len()).min(MAX_INFLIGHT_PER_QUEUE.saturating_sub(delivered))
    }

    /// Whether `record` may go out now (not a FIFO message behind an active one of its group);
    /// marks its group active.
    fn deliverable(&mut self, record: &Record) -> bool {
        fifo_group(self.request, record).is_none_or(|group| self.busy.insert(group))
    }

    /// The messages of the tagged `offsets` the message index found (up to `indexed_to`).
    fn pick_indexed(
        &mut self,
        messaging: &Messaging,
        offsets: &[i64],
        indexed_to: i64,
        room: usize,
    ) -> Result<(), BrokerError> {
        let (broker, request) = (&messaging.broker, self.request);
        let (mut batch, mut batch_end): (Vec<Record>, i64) = (Vec::new(), i64::MIN);
        for offset in offsets {
            if *offset >= batch_end {
                (batch, batch_end) = broker.read_records(&request.partition, *offset, 1)?;
            }
            // A hash matched; the tag itself must too.
            if let Some(record) = batch.iter().find(|r| r.offset == *offset && request.filter.matches(r)) {
                self.deliverable(record);
                self.picked.push((record.clone(), false));
            }
        }
        // With a full list, what lies past its last offset is yet to be looked at.
        self.examined_to = match offsets.last() {
            Some(last) if offsets.len() >= room => last + 1,
            _ => indexed_to,
        };
        Ok(())
    }

    /// New messages read from the log in growing steps until the batch is full: a receive of
    /// 32 small messages must not copy and decode megabytes of the queue (the first step is
    /// what they take, about).
    fn pick_scanned(&mut self, messaging: &Messaging, room: usize) -> Result<(), BrokerError> {
        let (broker, request) = (&messaging.broker, self.request);
        let mut taken = 0;
        let mut step = first_step(request, room);
        let mut read_bytes = 0;
        // No room left to remember a waiting FIFO message: the rest of the queue waits too.
        let mut parking_full = false;
        while taken < room && read_bytes < READ_BYTES && !parking_full {
            let (batches, end) = broker.read_batches(&request.partition, self.examined_to, step)?;
            if end <= self.examined_to {
                break; // nothing more below the high watermark
            }
            read_bytes += step;
            let start = self.examined_to;
            // Batches are decoded as they are reached: what lies past a full batch is read
            // (the read is one copy) but never decoded.
            'read: for batch in batches {
                if taken == room {
                    break;
                }
                for record in batch.transient_records()?.into_iter().filter(|r| r.offset >= start) {
                    if taken == room {
                        self.examined_to = record.offset;
                        break 'read;
                    }
                    let offset = record.offset;
                    if request.filter.matches(&record) {
                        if self.deliverable(&record) {
                            taken += 1;
                        } else if self.park_room == 0 {
                            self.examined_to = offset;
                            parking_full = true;
                            break 'read;
                        } else {
                            self.park_room -= 1;
                        }
                        self.picked.push((record, false));
                    }
                    self.examined_to = offset + 1;
                }
            }
            if parking_full {
                break;
            }
            if taken < room {
                // Everything read was examined, up to the end of its last batch.
                self.examined_to = self.examined_to.max(end);
            }
            step = next_step(step, read_bytes, taken, room);
        }
        Ok(())
    }

    /// New messages as whole stored batches ([`ReceiveRequest::whole_batches`]), read in
    /// growing steps as [`Pass::pick_scanned`] reads them, until the batches taken fill `room`
    /// (the last may overfill it). Only a batch compaction thinned is decoded, for its offsets.
    fn pick_batches(&mut self, messaging: &Messaging, room: usize) -> Result<(), BrokerError> {
        let (broker, request) = (&messaging.broker, self.request);
        let mut taken = 0;
        let mut step = first_step(request, room);
        let mut read_bytes = 0;
        while taken < room && read_bytes < READ_BYTES {
            let (batches, end) = broker.read_batches(&request.partition, self.examined_to, step)?;
            if end <= self.examined_to {
                break; // nothing more below the high watermark
            }
            read_bytes += step;
            for batch in batches {
                if taken >= room {
                    break;
                }
                // The first batch may begin before what is left to examine.
                let from = self.examined_to.max(batch.header.base_offset);
                let last = batch.header.last_offset();
                let offsets = if batch.is_dense() {
                    BatchOffsets::Range(from, last)
                } else {
                    let present = batch.transient_records()?.into_iter().map(|r| r.offset).filter(|o| *o >= from);
                    BatchOffsets::List(present.collect())
                };
                self.examined_to = self.examined_to.max(last + 1);
                if !offsets.is_empty() {
                    taken += offsets.len();
                    self.batches.push((batch, offsets));
                }
            }
            if taken < room {
                self.examined_to = self.examined_to.max(end);
            }
            step = next_step(step, read_bytes, taken, room);
        }
        Ok(())
    }
}

/// The size of a scan's first read for `room` messages: what they take at the log's mean size
/// of a record, a quarter more for the slack (a receive of 32 messages of 1 KiB reads 44 KiB,
/// a share fetch of 500 its 690 KiB at once). A filter may match little of what it reads: its
/// scan starts at [`FIRST_READ_BYTES`] and grows.
fn first_step(request: &ReceiveRequest, room: usize) -> u64 {
    let log = &request.partition.log;
    let records = u64::try_from(log.log_end_offset() - log.log_start_offset()).unwrap_or(0);
    let mean = log.size_bytes().checked_div(records).unwrap_or(0);
    if !matches!(request.filter, TagFilter::All) || mean == 0 {
        return FIRST_READ_BYTES;
    }
    let wanted = mean.saturating_mul(room as u64);
    (wanted + wanted / 4).clamp(FIRST_READ_BYTES / 4, READ_BYTES)
}

/// The size of a scan's next read, after `read_bytes` read gave `taken` of the `room`
/// messages it looks for: what the rest takes at the size they had so far, a quarter more for
/// the slack; four times the last step while nothing was taken (a filter that matches little),
/// never more than that, nor past [`READ_BYTES`] in all.
fn next_step(step: u64, read_bytes: u64, taken: usize, room: usize) -> u64 {
    let most = (step * 4).min(READ_BYTES.saturating_sub(read_bytes)).max(1);
    if taken == 0 {
        return most;
    }
    let left = room.saturating_sub(taken) as u64;
    let wanted = read_bytes / taken as u64 * left;
    (wanted + wanted / 4).clamp(FIRST_READ_BYTES / 4, most.max(FIRST_READ_BYTES / 4))
}

/// What one pass hands out (debug builds): each offset at most once, never below the log start,
/// and every delivery counted.
fn check_deliveries(log_start: i64, received: &Received) {
    #[cfg(debug_assertions)]
    {
        let mut offsets = std::collections::HashSet::new();
        for (offset, _) in received.offsets() {
            debug_assert!(offsets.insert(offset), "offset {offset} handed out twice");
            debug_assert!(offset >= log_start, "offset {offset} below the log start");
        }
        for delivery in &received.deliveries {
            debug_assert!(delivery.attempt >= 1, "a delivery of attempt 0 (a parked message)");
        }
    }
    let _ = (log_start, received);
}

/// A receive with long polling: what it hands out, empty when nothing came before its
/// deadline or the broker began shutting down.
///
/// Receives of one queue take turns; a receive waits for its turn until `turn_deadline`, or
/// until the end of its long polling when that is `None`. (A pass of a fetch over several
/// queues waits for its turn as long as the fetch may wait, and for messages not at all.)
pub(crate) async fn receive(
    messaging: &Arc<Messaging>,
    turns: &ReceiveTurns,
    request: ReceiveRequest,
    turn_deadline: Option<tokio::time::Instant>,
) -> Result<Received, BrokerError> {
    let broker = &messaging.broker;
    request.check();
    let turn = turns.of(&request.key);
    let deadline = tokio::time::Instant::now() + request.long_polling;
    let _turn = match tokio::time::timeout_at(turn_deadline.unwrap_or(deadline), turn.lock()).await {
        Ok(turn) => turn,
        Err(_) => return Ok(Received::default()),
    };
    let request = Arc::new(request);
    let mut shutdown = broker.shutdown_signal();
    loop {
        // Register first: an append between the read and the wait still wakes this one.
        let waiter = Arc::new(Notify::new());
        request.partition.register_waiter(&waiter);
        // The queue's state, loaded again when its partition's leadership moved.
        messaging.pop.load(&request.key).await?;
        // Messages out of deliveries go to the dead letters before anything is handed out.
        super::dead_letter::move_exhausted(messaging, &request.key, request.max_attempts).await;
        // An unfiltered pass stops once the batch is full, so it runs here, on the worker: a hop
        // to a blocking thread and back cost more than the pass itself (about a third of the broker
        // CPU of a 32-message receive with its ack, `weir bench rocketmq`), and the reads it
        // makes are of the log's tail, in the page cache, as a Kafka fetch's are. A filtered
        // pass may read and decode up to `READ_BYTES` to find its few matches: that one goes
        // to a blocking thread, not to hold up the other connections of this worker.
        let (received, durable) = if matches!(request.filter, TagFilter::All) {
            receive_once(messaging, &request)?
        } else {
            let (messaging, request) = (messaging.clone(), request.clone());
            tokio::task::spawn_blocking(move || receive_once(&messaging, &request))
                .await
                .map_err(|e| BrokerError::internal(e.to_string()))??
        };
        // Handed out only once the shard has them: else a failover could hand them out again
        // as first deliveries, or not remember they are out.
        durable.wait().await?;
        if !received.is_empty() {
            return Ok(received);
        }
        // Wake at the next expiry too: that message is deliverable again then.
        let now = tokio::time::Instant::now();
        // (One already past is a dead letter that could not be moved: try again a little later.)
        let expiry = messaging.pop.next_expiry_ms(&request.key).map(|at| {
            let wait_ms = at - broker.now_ms();
            now + Duration::from_millis(if wait_ms > 0 { wait_ms as u64 } else { RETRY_DEAD_LETTER_MS })
        });
        let wake = expiry.map_or(deadline, |e| e.min(deadline));
        if now >= deadline || *shutdown.borrow() {
            return Ok(Received::default());
        }
        // Then one more pass, also at the deadline: what arrived just now is handed out.
        tokio::select! {
            _ = waiter.notified() => {}
            _ = tokio::time::sleep_until(wake) => {}
            _ = shutdown.wait_for(|down| *down) => return Ok(Received::default()),
        }
    }
}

#[cfg(test)]
mod batch_offsets_tests {
    use super::BatchOffsets;

    #[test]
    fn batch_offsets_list_what_they_name_in_order() {
        let range = BatchOffsets::Range(4, 6);
        assert_eq!((range.iter().collect::<Vec<_>>(), range.len(), range.first()), (vec![4, 5, 6], 3, Some(4)));
        let list = BatchOffsets::List(vec![7, 9]);
        assert_eq!((list.iter().collect::<Vec<_>>(), list.len(), list.first()), (vec![7, 9], 2, Some(7)));
        assert!(BatchOffsets::List(Vec::new()).is_empty());
    }
}
