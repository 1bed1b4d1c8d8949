//! ReceiveMessage, AckMessage and ChangeInvisibleDuration: invisible-time consumption (POP) over
//! the core's [`PopStore`].
//!
//! A receive of one queue for one group first hands out that queue's messages whose invisible
//! time ran out (one delivery attempt higher), then new ones from the group's position, skipping
//! what the tag expression filters out; with nothing to hand out it waits (long polling) for an
//! append, for an in-flight message to become visible again, or for its deadline. Receives of
//! one queue for one group take turns, so two consumers never get the same message at once.
//!
//! A receipt handle names the delivery: `w1.<partition>.<offset>.<nonce>`, the nonce a random
//! number kept with the in-flight message. A handle of an earlier delivery, of an acked message,
//! or made up gets `INVALID_RECEIPT_HANDLE`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use weir_broker::message::Message;
use weir_broker::pop::state::group_hash;
use weir_broker::pop::{HandleError, PopStore, QueueKey, QueueState, MAX_INFLIGHT_PER_QUEUE, MAX_PARKED_PER_QUEUE};
use weir_broker::storage::records::Record;
use weir_broker::{Broker, BrokerError, Partition};

use crate::filter::TagFilter;
use crate::proto::{self, receive_message_response::Content, Code, ReceiveMessageResponse};
use crate::status::{self, status};

/// The longest a receive waits for messages.
pub const MAX_LONG_POLLING: Duration = Duration::from_secs(60);
/// The most messages one receive hands out.
pub const MAX_BATCH: usize = 1024;
/// The shortest and longest invisible durations accepted.
pub const MIN_INVISIBLE: Duration = Duration::from_secs(1);
pub const MAX_INVISIBLE: Duration = Duration::from_secs(12 * 3600);
/// How much of a queue one receive reads at most while looking for new messages.
const READ_BYTES: u64 = 4 << 20;
/// Its first read: about a batch of 32 messages of 1 KiB with their headers. Each further read
/// is four times larger, up to [`READ_BYTES`] in all.
const FIRST_READ_BYTES: u64 = 64 << 10;

/// How soon a long poll tries again to move a dead letter it could not move.
const RETRY_DEAD_LETTER_MS: u64 = 200;

/// A receipt handle's parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handle {
    pub partition: i32,
    pub offset: i64,
    pub nonce: u64,
}

impl Handle {
    pub fn encode(&self) -> String {
        format!("w1.{}.{}.{:016x}", self.partition, self.offset, self.nonce)
    }

    pub fn decode(text: &str) -> Option<Handle> {
        let mut parts = text.strip_prefix("w1.")?.split('.');
        let partition = parts.next()?.parse().ok().filter(|p: &i32| *p >= 0)?;
        let offset = parts.next()?.parse().ok().filter(|o: &i64| *o >= 0)?;
        let nonce_text = parts.next()?;
        if nonce_text.len() != 16 || parts.next().is_some() {
            return None;
        }
        let nonce = u64::from_str_radix(nonce_text, 16).ok()?;
        Some(Handle { partition, offset, nonce })
    }
}

/// The status of a refused ack or change.
pub fn handle_status(error: HandleError) -> proto::Status {
    match error {
        HandleError::NotInFlight => status(
            Code::InvalidReceiptHandle,
            "the receipt handle names no message in flight (acked already, or never delivered)",
        ),
        HandleError::Stale => status(
            Code::InvalidReceiptHandle,
            "the receipt handle is stale: the message was delivered again or its invisible time changed",
        ),
    }
}

/// One delivery of a receive.
struct Delivery {
    record: Record,
    attempt: u32,
    nonce: u64,
}

/// Receives take turns per queue and group.
#[derive(Default)]
pub struct QueueLocks(Mutex<HashMap<QueueKey, Arc<tokio::sync::Mutex<()>>>>);

impl QueueLocks {
    fn get(&self, key: &QueueKey) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // Locks nobody holds or waits for are dropped, so the map stays as large as what is
        // being received.
        if locks.len() > 1024 {
            locks.retain(|_, lock| Arc::strong_count(lock) > 1);
        }
        locks.entry(key.clone()).or_default().clone()
    }
}

/// What a receive asks for, validated.
pub struct Wanted {
    pub key: QueueKey,
    pub partition: Arc<Partition>,
    pub filter: TagFilter,
    pub batch: usize,
    pub invisible: Duration,
    pub long_polling: Duration,
    /// The group's `max.delivery.attempts`: a message delivered this often is not delivered
    /// again but dead-lettered.
    pub max_attempts: u32,
    /// The group's `consume.fifo`: messages of one message group go out one at a time, in
    /// order (see [`weir_broker::pop::state`]).
    pub fifo: bool,
}

/// The FIFO group hash of `record`, when the receive orders by group and it has one.
fn fifo_group(wanted: &Wanted, record: &Record) -> Option<u64> {
    if !wanted.fifo {
        return None;
    }
    weir_broker::message::fifo_group(record).map(group_hash)
}

/// One pass of a receive: what it hands out now (maybe nothing). Blocking.
fn receive_once(broker: &Broker, store: &PopStore, wanted: &Wanted) -> Result<Vec<Delivery>, BrokerError> {
    let partition = &wanted.partition;
    let log_start = partition.log.log_start_offset();
    let now = broker.now_ms();
    let start = || QueueState::starting_at(log_start);
    let state = store.get(&wanted.key).unwrap_or_else(start);

    // Messages whose invisible time ran out, then new ones.
    let mut picked: Vec<(Record, bool)> = Vec::new();
    // In flight, but compacted away since: done, or it would stay in flight for ever.
    let mut vanished = Vec::new();
    for (offset, _) in state.expired(now, wanted.batch, wanted.max_attempts) {
        match broker.read_record(partition, offset)? {
            Some(record) => picked.push((record, true)),
            None => vanished.push(offset),
        }
    }
    let mut examined_to = state.next.max(log_start);
    let parked = state.parked_count();
    let delivered = state.inflight.len() - parked;
    let room = wanted.batch.saturating_sub(picked.len()).min(MAX_INFLIGHT_PER_QUEUE.saturating_sub(delivered));
    // FIFO: a new message of a group with an active one is parked, not delivered; it takes
    // room in the state (up to MAX_PARKED_PER_QUEUE) but not in the batch. `busy` predicts it
    // (the update decides).
    let mut park_room = MAX_PARKED_PER_QUEUE.saturating_sub(parked);
    let mut busy = if wanted.fifo { state.active_groups() } else { Default::default() };
    let mut deliverable = |record: &Record| fifo_group(wanted, record).is_none_or(|group| busy.insert(group));
    // A tag filter reads only the batches the message index names (when it covers what is next).
    let indexed = match &wanted.filter {
        TagFilter::Tags(tags) if room > 0 => {
            broker.message_index.tagged_offsets(&partition.topic, partition.index, tags, examined_to, room)
        }
        _ => None,
    };
    if let Some((offsets, indexed_to)) = indexed.filter(|(_, indexed_to)| *indexed_to > examined_to) {
        let (mut batch, mut batch_end): (Vec<Record>, i64) = (Vec::new(), i64::MIN);
        for offset in &offsets {
            if *offset >= batch_end {
                (batch, batch_end) = broker.read_records(partition, *offset, 1)?;
            }
            // A hash matched; the tag itself must too.
            if let Some(record) = batch.iter().find(|r| r.offset == *offset && wanted.filter.matches(r)) {
                deliverable(record);
                picked.push((record.clone(), false));
            }
        }
        // With a full list, what lies past its last offset is yet to be looked at.
        examined_to = match offsets.last() {
            Some(last) if offsets.len() >= room => last + 1,
            _ => indexed_to,
        };
    } else if room > 0 {
        // Read in growing steps until the batch is full: a receive of 32 small messages must
        // not copy and decode megabytes of the queue (the first step is what they take, about).
        let mut taken = 0;
        let mut step = FIRST_READ_BYTES;
        let mut read_bytes = 0;
        // No room left to remember a waiting FIFO message: the rest of the queue waits too.
        let mut parking_full = false;
        while taken < room && read_bytes < READ_BYTES && !parking_full {
            let (records, end) = broker.read_records(partition, examined_to, step)?;
            if end <= examined_to {
                break; // nothing more below the high watermark
            }
            read_bytes += step;
            for record in records {
                if taken == room {
                    examined_to = record.offset;
                    break;
                }
                let offset = record.offset;
                if wanted.filter.matches(&record) {
                    if deliverable(&record) {
                        taken += 1;
                    } else if park_room == 0 {
                        examined_to = offset;
                        parking_full = true;
                        break;
                    } else {
                        park_room -= 1;
                    }
                    picked.push((record, false));
                }
                examined_to = offset + 1;
            }
            if parking_full {
                break;
            }
            if taken < room {
                // Everything read was examined, up to the end of its last batch.
                examined_to = examined_to.max(end);
            }
            step = (step * 4).min(READ_BYTES);
        }
    }

    let visible_at = now + wanted.invisible.as_millis() as i64;
    let result = store.update(&wanted.key, start, |q| {
        if q.resets != state.resets {
            // Reset since it was read: what was read is no longer what the group has next.
            return Ok::<_, ()>(Vec::new());
        }
        q.truncate_below(log_start);
        for offset in &vanished {
            q.forget(*offset);
        }
        let mut deliveries = Vec::with_capacity(picked.len());
        for (record, redelivery) in picked {
            // The state may have moved since it was read (an ack of a redelivery candidate).
            let in_flight = q.inflight.contains_key(&record.offset);
            if redelivery != in_flight || (!redelivery && record.offset < q.next) {
                continue;
            }
            let group = if redelivery { None } else { fifo_group(wanted, &record) };
            if let Some(group) = group.filter(|g| q.is_active(*g)) {
                q.park(record.offset, group);
                continue;
            }
            let nonce = rand::random::<u64>();
            let inflight = q.deliver_in_group(record.offset, visible_at, nonce, group);
            deliveries.push(Delivery { record, attempt: inflight.attempt, nonce });
        }
        q.skip_to(examined_to);
        Ok::<_, ()>(deliveries)
    })?;
    Ok(result.unwrap_or_default())
}

/// A receive, with long polling: the stream's responses.
pub async fn receive(
    broker: &Arc<Broker>,
    store: &Arc<PopStore>,
    locks: &QueueLocks,
    wanted: Wanted,
) -> Vec<ReceiveMessageResponse> {
    let lock = locks.get(&wanted.key);
    let deadline = tokio::time::Instant::now() + wanted.long_polling;
    let _turn = match tokio::time::timeout_at(deadline, lock.lock()).await {
        Ok(turn) => turn,
        Err(_) => return not_found(),
    };
    let wanted = Arc::new(wanted);
    let mut shutdown = broker.shutdown_signal();
    loop {
        // Register first: an append between the read and the wait still wakes this one.
        let waiter = Arc::new(Notify::new());
        wanted.partition.register_waiter(&waiter);
        // Messages out of deliveries go to the dead letters before anything is handed out.
        crate::dead_letter::move_exhausted(broker, store, &wanted.key).await;
        let pass = {
            let (broker, store, wanted) = (broker.clone(), store.clone(), wanted.clone());
            tokio::task::spawn_blocking(move || receive_once(&broker, &store, &wanted)).await
        };
        let deliveries = match pass {
            Ok(Ok(deliveries)) => deliveries,
            Ok(Err(e)) => return vec![status_response(status::of_error(&e))],
            Err(e) => return vec![status_response(status(Code::InternalError, e.to_string()))],
        };
        if !deliveries.is_empty() {
            return found(broker, &wanted, deliveries);
        }
        // Wake at the next expiry too: that message is deliverable again then.
        let now = tokio::time::Instant::now();
        // (One already past is a dead letter that could not be moved: try again a little later.)
        let expiry = store.next_expiry_ms(&wanted.key).map(|at| {
            let wait_ms = at - broker.now_ms();
            now + Duration::from_millis(if wait_ms > 0 { wait_ms as u64 } else { RETRY_DEAD_LETTER_MS })
        });
        let wake = expiry.map_or(deadline, |e| e.min(deadline));
        if now >= deadline || *shutdown.borrow() {
            return not_found();
        }
        // Then one more pass, also at the deadline: what arrived just now is handed out.
        tokio::select! {
            _ = waiter.notified() => {}
            _ = tokio::time::sleep_until(wake) => {}
            _ = shutdown.wait_for(|down| *down) => return not_found(),
        }
    }
}

fn status_response(status: proto::Status) -> ReceiveMessageResponse {
    ReceiveMessageResponse { content: Some(Content::Status(status)) }
}

fn not_found() -> Vec<ReceiveMessageResponse> {
    vec![status_response(status(Code::MessageNotFound, "no new message"))]
}

/// A protobuf timestamp of milliseconds since the epoch.
pub fn timestamp(ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: ms.div_euclid(1000), nanos: (ms.rem_euclid(1000) * 1_000_000) as i32 }
}

fn found(broker: &Broker, wanted: &Wanted, deliveries: Vec<Delivery>) -> Vec<ReceiveMessageResponse> {
    let mut responses = Vec::with_capacity(deliveries.len() + 2);
    responses.push(status_response(status::ok()));
    responses.push(ReceiveMessageResponse { content: Some(Content::DeliveryTimestamp(timestamp(broker.now_ms()))) });
    let store_host = format!("{}:{}", broker.config.advertised_host, broker.config.rocketmq_advertised_port);
    for delivery in deliveries {
        let message = Message::from_record(&wanted.key.topic, wanted.key.partition, &delivery.record);
        let handle = Handle { partition: wanted.key.partition, offset: delivery.record.offset, nonce: delivery.nonce };
        responses.push(ReceiveMessageResponse {
            content: Some(Content::Message(to_proto(
                &wanted.key.topic,
                &message,
                &delivery,
                handle,
                wanted,
                &store_host,
            ))),
        });
    }
    responses
}

fn to_proto(
    topic: &str,
    message: &Message,
    delivery: &Delivery,
    handle: Handle,
    wanted: &Wanted,
    store_host: &str,
) -> proto::Message {
    let body = message.body.to_vec();
    let digest = format!("{:08X}", crc32fast::hash(&body));
    let message_type =
        if message.message_group.is_some() { proto::MessageType::Fifo } else { proto::MessageType::Normal };
    let system = proto::SystemProperties {
        tag: message.tag.clone(),
        keys: message.keys.clone(),
        message_id: message.id().to_string(),
        body_digest: Some(proto::Digest { r#type: proto::DigestType::Crc32 as i32, checksum: digest }),
        body_encoding: proto::Encoding::Identity as i32,
        message_type: message_type as i32,
        born_timestamp: Some(timestamp(message.born_timestamp_ms.unwrap_or(delivery.record.timestamp))),
        born_host: message.born_host.clone().unwrap_or_default(),
        store_timestamp: Some(timestamp(delivery.record.timestamp)),
        store_host: store_host.to_string(),
        delivery_timestamp: message.delivery_timestamp_ms.map(timestamp),
        receipt_handle: Some(handle.encode()),
        queue_id: handle.partition,
        queue_offset: Some(delivery.record.offset),
        invisible_duration: Some(prost_types::Duration {
            seconds: wanted.invisible.as_secs() as i64,
            nanos: wanted.invisible.subsec_nanos() as i32,
        }),
        delivery_attempt: Some(delivery.attempt as i32),
        message_group: message.message_group.clone(),
        ..Default::default()
    };
    proto::Message {
        topic: Some(proto::Resource { resource_namespace: String::new(), name: topic.to_string() }),
        user_properties: message.properties.iter().cloned().collect(),
        system_properties: Some(system),
        body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_made_up_ones_do_not_decode() {
        let handle = Handle { partition: 3, offset: 1_234_567, nonce: 0xdead_beef_0000_0001 };
        assert_eq!(Handle::decode(&handle.encode()), Some(handle));
        for bogus in [
            "",
            "w1.",
            "w1.3.4",
            "w1.3.4.5",
            "w1.-1.4.00000000000000ff",
            "w2.3.4.00000000000000ff",
            "w1.3.4.00000000000000ff.x",
        ] {
            assert_eq!(Handle::decode(bogus), None, "{bogus}");
        }
    }
}
