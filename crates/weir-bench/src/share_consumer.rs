//! A Kafka share group's consumers (KIP-932) over the raw protocol, as librdkafka's
//! ShareConsumer drives them: each member on its own connection joins with
//! ShareGroupHeartbeat, heartbeats at the interval the broker asks for, and loops ShareFetch of
//! its assigned partitions with the previous batch's acknowledgements (ACCEPT) piggy-backed;
//! the last batch goes back with a ShareAcknowledge before the member leaves.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use bytes::Buf;
use hdrhistogram::Histogram;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;
use weir_harness::kafka_client::{topic_name, Client};

use crate::produce;
use crate::raw_protocol::{self, error_name};

/// IncrementalAlterConfigs' resource type of a group.
const GROUP_RESOURCE: i8 = 32;
/// Kafka's acknowledge type ACCEPT.
const ACCEPT: i8 = 1;
/// The versions the broker serves (and librdkafka's ShareConsumer uses).
const HEARTBEAT_VERSION: i16 = 1;
const SHARE_FETCH_VERSION: i16 = 1;
const SHARE_ACKNOWLEDGE_VERSION: i16 = 1;
/// A ShareFetch's long poll: short, so that members notice soon that the run is over.
const MAX_WAIT_MS: i32 = 200;

fn s(text: impl Into<String>) -> StrBytes {
    StrBytes::from_string(text.into())
}

/// Sets `configs` of `group` with IncrementalAlterConfigs (SET) on a GROUP resource.
pub(crate) fn set_group_configs(client: &mut Client, group: &str, configs: &[(&str, &str)]) -> anyhow::Result<()> {
    use incremental_alter_configs_request::{AlterConfigsResource, AlterableConfig};
    let request = IncrementalAlterConfigsRequest::default().with_resources(vec![AlterConfigsResource::default()
        .with_resource_type(GROUP_RESOURCE)
        .with_resource_name(s(group))
        .with_configs(
            configs
                .iter()
                .map(|(name, value)| {
                    AlterableConfig::default().with_name(s(*name)).with_config_operation(0).with_value(Some(s(*value)))
                })
                .collect(),
        )]);
    let response = client.send(1, &request).context("IncrementalAlterConfigs")?;
    let result = response.responses.first().context("empty IncrementalAlterConfigs response")?;
    if result.error_code != 0 {
        bail!(
            "setting the configs of group {group} failed: {} {}",
            error_name(result.error_code),
            result.error_message.as_deref().unwrap_or("")
        );
    }
    Ok(())
}

/// What the members of one share consume did.
pub(crate) struct Consumed {
    /// Every record acquired (and accepted), as (partition, offset), over all members.
    pub(crate) records: Vec<(i32, i64)>,
    /// ShareFetch, ShareAcknowledge and ShareGroupHeartbeat requests.
    pub(crate) requests: u64,
    /// Latency of each ShareFetch.
    pub(crate) latency_us: Histogram<u64>,
    /// From the start until the last records were acquired or the last acknowledgement answered,
    /// whichever came later (members still in a long poll then finish it with nothing).
    pub(crate) until_last: Duration,
}

/// What the members share.
struct Shared {
    /// Records acquired so far, by all members.
    acquired: AtomicU64,
    requests: AtomicU64,
    failed: AtomicBool,
    started: Instant,
    /// When a member last acquired records or had its last acknowledgement answered, µs since
    /// `started`.
    last_progress_us: AtomicU64,
    records: Mutex<Vec<(i32, i64)>>,
}

/// Consumes `topic` through share group `group` with `members` members, one connection each,
/// until `expected` records have been acquired altogether, accepting each; every member then
/// acknowledges its last batch and leaves. Fails on any error, on a record delivered more than
/// once (delivery count above 1) or on no progress for `stall_limit`.
pub(crate) fn consume(
    addr: SocketAddr,
    group: &str,
    topic: &str,
    members: u32,
    max_records: i32,
    expected: u64,
    stall_limit: Duration,
) -> anyhow::Result<Consumed> {
    let shared = Shared {
        acquired: AtomicU64::new(0),
        requests: AtomicU64::new(0),
        failed: AtomicBool::new(false),
        started: Instant::now(),
        last_progress_us: AtomicU64::new(0),
        records: Mutex::new(Vec::with_capacity(expected as usize)),
    };
    let results: Vec<anyhow::Result<Histogram<u64>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..members)
            .map(|_| {
                let shared = &shared;
                scope.spawn(move || {
                    let result = member(addr, group, topic, max_records, expected, stall_limit, shared);
                    if result.is_err() {
                        shared.failed.store(true, Ordering::Relaxed);
                    }
                    result
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a share member thread panicked"))))
            .collect()
    });
    let latencies = results.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Consumed {
        records: shared.records.into_inner().unwrap_or_else(|e| e.into_inner()),
        requests: shared.requests.load(Ordering::Relaxed),
        latency_us: produce::merge(&latencies)?,
        until_last: Duration::from_micros(shared.last_progress_us.load(Ordering::Relaxed)),
    })
}

/// One member on its connection.
struct Member<'a> {
    client: Client,
    group: &'a str,
    topic: &'a str,
    id: String,
    epoch: i32,
    heartbeat_interval: Duration,
    last_heartbeat: Instant,
    /// The assigned partitions, by topic id.
    assigned: BTreeMap<Uuid, BTreeSet<i32>>,
    /// The share session's next epoch.
    session_epoch: i32,
    /// Partitions the share session holds.
    in_session: BTreeSet<(Uuid, i32)>,
    requests: u64,
}

impl Member<'_> {
    /// ShareGroupHeartbeat (epoch 0 joins); takes the assignment when it comes.
    fn heartbeat(&mut self) -> anyhow::Result<()> {
        let mut request = ShareGroupHeartbeatRequest::default()
            .with_group_id(GroupId(s(self.group)))
            .with_member_id(s(&self.id))
            .with_member_epoch(self.epoch);
        if self.epoch == 0 {
            request = request.with_subscribed_topic_names(Some(vec![topic_name(self.topic)]));
        }
        let response = self.client.send(HEARTBEAT_VERSION, &request).context("ShareGroupHeartbeat")?;
        self.requests += 1;
        if response.error_code != 0 {
            bail!(
                "ShareGroupHeartbeat of {} in {} failed: {} {}",
                self.id,
                self.group,
                error_name(response.error_code),
                response.error_message.as_deref().unwrap_or("")
            );
        }
        self.epoch = response.member_epoch;
        self.heartbeat_interval = Duration::from_millis(response.heartbeat_interval_ms.max(100) as u64);
        self.last_heartbeat = Instant::now();
        if let Some(assignment) = response.assignment {
            self.assigned = assignment
                .topic_partitions
                .into_iter()
                .map(|t| (t.topic_id, t.partitions.into_iter().collect()))
                .collect();
        }
        Ok(())
    }

    /// One ShareFetch of the assigned partitions with `acks` (ranges acquired by the previous
    /// one, by partition) accepted; returns the ranges it acquired, as (topic id, partition,
    /// first, last).
    fn fetch(
        &mut self,
        max_records: i32,
        acks: &[(Uuid, i32, i64, i64)],
    ) -> anyhow::Result<Vec<(Uuid, i32, i64, i64)>> {
        let mut wanted: BTreeMap<(Uuid, i32), Vec<share_fetch_request::AcknowledgementBatch>> = BTreeMap::new();
        for (topic, partitions) in &self.assigned {
            for &p in partitions {
                wanted.entry((*topic, p)).or_default();
            }
        }
        for &(topic, p, first, last) in acks {
            wanted.entry((topic, p)).or_default().push(
                share_fetch_request::AcknowledgementBatch::default()
                    .with_first_offset(first)
                    .with_last_offset(last)
                    .with_acknowledge_types(vec![ACCEPT]),
            );
        }
        // Partitions of the session no longer wanted are forgotten; those already in it and
        // without acknowledgements need not be named again (an incremental session).
        let mut forgotten: BTreeMap<Uuid, Vec<i32>> = BTreeMap::new();
        for &(topic, p) in &self.in_session {
            if !wanted.contains_key(&(topic, p)) {
                forgotten.entry(topic).or_default().push(p);
            }
        }
        let mut topics: BTreeMap<Uuid, Vec<share_fetch_request::FetchPartition>> = BTreeMap::new();
        for ((topic, p), batches) in wanted {
            if self.session_epoch != 0 && batches.is_empty() && self.in_session.contains(&(topic, p)) {
                continue;
            }
            topics.entry(topic).or_default().push(
                share_fetch_request::FetchPartition::default()
                    .with_partition_index(p)
                    .with_acknowledgement_batches(batches),
            );
        }
        let request = ShareFetchRequest::default()
            .with_group_id(Some(GroupId(s(self.group))))
            .with_member_id(Some(s(&self.id)))
            .with_share_session_epoch(self.session_epoch)
            .with_max_wait_ms(MAX_WAIT_MS)
            .with_min_bytes(1)
            .with_max_bytes(50 << 20)
            .with_max_records(max_records)
            .with_batch_size(max_records)
            .with_topics(
                topics
                    .iter()
                    .map(|(topic, partitions)| {
                        share_fetch_request::FetchTopic::default()
                            .with_topic_id(*topic)
                            .with_partitions(partitions.clone())
                    })
                    .collect(),
            )
            .with_forgotten_topics_data(
                forgotten
                    .iter()
                    .map(|(topic, partitions)| {
                        share_fetch_request::ForgottenTopic::default()
                            .with_topic_id(*topic)
                            .with_partitions(partitions.clone())
                    })
                    .collect(),
            );
        let response = self.client.send(SHARE_FETCH_VERSION, &request).context("ShareFetch")?;
        self.requests += 1;
        if response.error_code != 0 {
            bail!(
                "ShareFetch of {} at session epoch {} failed: {} {}",
                self.id,
                self.session_epoch,
                error_name(response.error_code),
                response.error_message.as_deref().unwrap_or("")
            );
        }
        self.session_epoch = next_epoch(self.session_epoch);
        for (topic, partitions) in &topics {
            for p in partitions {
                self.in_session.insert((*topic, p.partition_index));
            }
        }
        for (topic, partitions) in &forgotten {
            for p in partitions {
                self.in_session.remove(&(*topic, *p));
            }
        }
        let mut acquired = Vec::new();
        for t in &response.responses {
            for p in &t.partitions {
                let at = format!("{}-{}", self.topic, p.partition_index);
                if p.error_code != 0 || p.acknowledge_error_code != 0 {
                    bail!(
                        "ShareFetch of {at}: error {}, acknowledgement error {}",
                        error_name(p.error_code),
                        error_name(p.acknowledge_error_code)
                    );
                }
                let mut count = 0i64;
                for range in &p.acquired_records {
                    if range.delivery_count != 1 {
                        bail!(
                            "{at}: offsets {}..={} delivered again (delivery count {}) although each was accepted",
                            range.first_offset,
                            range.last_offset,
                            range.delivery_count
                        );
                    }
                    count += range.last_offset - range.first_offset + 1;
                    acquired.push((t.topic_id, p.partition_index, range.first_offset, range.last_offset));
                }
                let in_batches = records_in_batches(p.records.as_ref())
                    .with_context(|| format!("the records ShareFetch returned of {at}"))?;
                if in_batches != count {
                    bail!("ShareFetch of {at} acquired {count} records but returned {in_batches}");
                }
            }
        }
        Ok(acquired)
    }

    /// ShareAcknowledge (ACCEPT) of `acks`.
    fn acknowledge(&mut self, acks: &[(Uuid, i32, i64, i64)]) -> anyhow::Result<()> {
        let mut topics: BTreeMap<Uuid, BTreeMap<i32, Vec<share_acknowledge_request::AcknowledgementBatch>>> =
            BTreeMap::new();
        for &(topic, p, first, last) in acks {
            topics.entry(topic).or_default().entry(p).or_default().push(
                share_acknowledge_request::AcknowledgementBatch::default()
                    .with_first_offset(first)
                    .with_last_offset(last)
                    .with_acknowledge_types(vec![ACCEPT]),
            );
        }
        let request = ShareAcknowledgeRequest::default()
            .with_group_id(Some(GroupId(s(self.group))))
            .with_member_id(Some(s(&self.id)))
            .with_share_session_epoch(self.session_epoch)
            .with_topics(
                topics
                    .into_iter()
                    .map(|(topic, partitions)| {
                        share_acknowledge_request::AcknowledgeTopic::default().with_topic_id(topic).with_partitions(
                            partitions
                                .into_iter()
                                .map(|(p, batches)| {
                                    share_acknowledge_request::AcknowledgePartition::default()
                                        .with_partition_index(p)
                                        .with_acknowledgement_batches(batches)
                                })
                                .collect(),
                        )
                    })
                    .collect(),
            );
        let response = self.client.send(SHARE_ACKNOWLEDGE_VERSION, &request).context("ShareAcknowledge")?;
        self.requests += 1;
        if response.error_code != 0 {
            bail!("ShareAcknowledge of {} failed: {}", self.id, error_name(response.error_code));
        }
        self.session_epoch = next_epoch(self.session_epoch);
        if let Some(p) = response.responses.iter().flat_map(|t| &t.partitions).find(|p| p.error_code != 0) {
            bail!("ShareAcknowledge of {}-{} failed: {}", self.topic, p.partition_index, error_name(p.error_code));
        }
        Ok(())
    }

    /// Leaves the group (ShareGroupHeartbeat with epoch -1).
    fn leave(&mut self) -> anyhow::Result<()> {
        self.epoch = -1;
        let request = ShareGroupHeartbeatRequest::default()
            .with_group_id(GroupId(s(self.group)))
            .with_member_id(s(&self.id))
            .with_member_epoch(-1);
        let response = self.client.send(HEARTBEAT_VERSION, &request).context("ShareGroupHeartbeat (leave)")?;
        self.requests += 1;
        if response.error_code != 0 {
            bail!("{} could not leave {}: {}", self.id, self.group, error_name(response.error_code));
        }
        Ok(())
    }
}

/// A share session's epoch after `epoch`: 1 after 0, back to 1 after the largest.
fn next_epoch(epoch: i32) -> i32 {
    if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

/// The records of the record batches in `records` (walking their headers: baseOffset (8),
/// batchLength (4), ..., lastOffsetDelta at 23).
fn records_in_batches(records: Option<&bytes::Bytes>) -> anyhow::Result<i64> {
    let Some(records) = records else { return Ok(0) };
    let mut records = records.clone();
    let mut count = 0i64;
    while records.len() >= 27 {
        let length = (&records[8..12]).get_i32();
        let last_delta = (&records[23..27]).get_i32();
        let length = usize::try_from(length).map_err(|_| anyhow!("a batch with negative length {length}"))?;
        if records.len() - 12 < length {
            bail!("a batch of {length} bytes cut short at {}", records.len() - 12);
        }
        count += i64::from(last_delta) + 1;
        records.advance(12 + length);
    }
    Ok(count)
}

fn member(
    addr: SocketAddr,
    group: &str,
    topic: &str,
    max_records: i32,
    expected: u64,
    stall_limit: Duration,
    shared: &Shared,
) -> anyhow::Result<Histogram<u64>> {
    let mut member = Member {
        client: raw_protocol::connect(addr)?,
        group,
        topic,
        id: uuid::Uuid::new_v4().to_string(),
        epoch: 0,
        heartbeat_interval: Duration::from_secs(5),
        last_heartbeat: Instant::now(),
        assigned: BTreeMap::new(),
        session_epoch: 0,
        in_session: BTreeSet::new(),
        requests: 0,
    };
    let mut latency = produce::latency_histogram()?;
    let mut pending: Vec<(Uuid, i32, i64, i64)> = Vec::new();
    let result = (|| {
        member.heartbeat()?;
        while shared.acquired.load(Ordering::Relaxed) < expected && !shared.failed.load(Ordering::Relaxed) {
            if member.assigned.is_empty() || member.last_heartbeat.elapsed() >= member.heartbeat_interval {
                member.heartbeat()?;
                if member.assigned.is_empty() {
                    std::thread::sleep(Duration::from_millis(20));
                    check_stall(shared, expected, stall_limit, group)?;
                    continue;
                }
            }
            let started = Instant::now();
            let acquired = member.fetch(max_records, &pending)?;
            latency.saturating_record(started.elapsed().as_micros() as u64);
            pending = acquired;
            if pending.is_empty() {
                check_stall(shared, expected, stall_limit, group)?;
                continue;
            }
            let mut records = Vec::new();
            for &(_, p, first, last) in &pending {
                records.extend((first..=last).map(|o| (p, o)));
            }
            shared.acquired.fetch_add(records.len() as u64, Ordering::Relaxed);
            shared.records.lock().unwrap_or_else(|e| e.into_inner()).extend(records);
            shared.last_progress_us.fetch_max(shared.started.elapsed().as_micros() as u64, Ordering::Relaxed);
        }
        if !pending.is_empty() {
            member.acknowledge(&pending)?;
            shared.last_progress_us.fetch_max(shared.started.elapsed().as_micros() as u64, Ordering::Relaxed);
        }
        member.leave()
    })();
    shared.requests.fetch_add(member.requests, Ordering::Relaxed);
    result.map(|()| latency)
}

/// Fails when no member has acquired anything for `stall_limit`.
fn check_stall(shared: &Shared, expected: u64, stall_limit: Duration, group: &str) -> anyhow::Result<()> {
    let idle_us =
        (shared.started.elapsed().as_micros() as u64).saturating_sub(shared.last_progress_us.load(Ordering::Relaxed));
    if Duration::from_micros(idle_us) > stall_limit {
        bail!(
            "share group {group}: nothing acquired for {stall_limit:?}, after {} of the {expected} expected",
            shared.acquired.load(Ordering::Relaxed)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_epochs_wrap_to_one() {
        assert_eq!(next_epoch(0), 1);
        assert_eq!(next_epoch(41), 42);
        assert_eq!(next_epoch(i32::MAX), 1);
    }

    #[test]
    fn records_are_counted_from_the_batch_headers() {
        assert_eq!(records_in_batches(None).ok(), Some(0));
        let mut batch = vec![0u8; 61];
        batch[8..12].copy_from_slice(&49i32.to_be_bytes());
        batch[23..27].copy_from_slice(&4i32.to_be_bytes());
        let two: Vec<u8> = batch.iter().chain(&batch).copied().collect();
        assert_eq!(records_in_batches(Some(&bytes::Bytes::from(two))).ok(), Some(10));
        assert!(records_in_batches(Some(&bytes::Bytes::from(batch[..40].to_vec()))).is_err());
    }
}
