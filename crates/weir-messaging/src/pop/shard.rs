//! The state shards: the partitions of `__share_group_state` this broker leads, each with
//! every queue state it holds in memory (replayed from its log when this broker comes to
//! lead it), as Kafka's share coordinator keeps `__share_group_state`.
//!
//! The engines do not run here: each runs on the broker leading its queue's partition
//! ([`super::store`]), loads a queue's states from its shard ([`StateShard::take_over`]) and
//! writes each change through ([`StateShard::write`]) before it answers. A shard applies a
//! line only when its leader epoch is not lower than the queue's (see [`super::lines`]).
//!
//! Compaction: once a shard's log has taken [`COMPACT_AFTER_BYTES`] of lines since the last
//! compaction, every queue state of it is written anew and the log is trimmed below the first
//! of those lines.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use weir_broker::broker::InternalWrite;
use weir_broker::{Broker, BrokerError, ErrorKind, Partition};
use weir_coordinators::shards::{ShardOwner, Shards};
use weir_storage::records::{self, BatchOptions, Record};
use weir_storage::sync::lock;

use super::lines::{self, QueueId, Queues, StateLine};
use super::state::QueueState;
use super::store::QueueKey;

/// The internal topic of the queue states.
pub const TOPIC: &str = weir_broker::metadata::SHARE_GROUP_STATE_TOPIC;

/// A shard's log is compacted once this many bytes of lines were written since the last time.
pub(crate) const COMPACT_AFTER_BYTES: u64 = 64 << 20;
/// Most bytes of lines in one record of a compaction.
const COMPACTION_RECORD_BYTES: usize = 1 << 20;
/// How often the shards are looked at for compaction.
const MAINTAIN_EVERY: Duration = Duration::from_secs(10);

/// Every consumer's state of one queue, by key.
pub(crate) type QueueStatesOf = Vec<(QueueKey, QueueState)>;

/// One partition of `__share_group_state` that this broker leads.
pub(crate) struct StateShard {
    index: i32,
    partition: Arc<Partition>,
    inner: Mutex<ShardInner>,
}

struct ShardInner {
    queues: Queues,
    /// Bytes of lines written (or replayed) since the last compaction.
    written: u64,
}

fn batch_of(value: Vec<u8>) -> Result<BytesMut, BrokerError> {
    let record = Record::new(0, None, Some(Bytes::from(value)));
    records::encode_batch(&[record], &BatchOptions::default()).map_err(|e| BrokerError::internal(e.to_string()))
}

/// Loads shard `index` from its partition's log. Blocking.
fn load(broker: &Broker, index: i32, partition: Arc<Partition>) -> Result<StateShard, BrokerError> {
    let mut queues = Queues::default();
    let mut written = 0;
    for record in crate::state_topic::read_log(broker, &partition)? {
        if let Some(value) = record.value {
            written += value.len() as u64;
            queues.apply_value(&value);
        }
    }
    tracing::info!(shard = index, queues = queues.0.len(), "invisible-time state: loaded a partition of {TOPIC}");
    Ok(StateShard { index, partition, inner: Mutex::new(ShardInner { queues, written }) })
}

impl StateShard {
    /// Writes the lines the shard accepts (see [`lines::Queues::accepts`]), in order, as one
    /// record, and applies them. Returns which were accepted and the write to wait for (none
    /// when none was). Blocking.
    pub(crate) fn write(
        &self,
        broker: &Broker,
        lines: Vec<StateLine>,
    ) -> Result<(Vec<bool>, Option<InternalWrite>), BrokerError> {
        let mut inner = lock(&self.inner);
        // Whether each line applies, given those before it in the batch: (epoch, has states).
        let mut seen: HashMap<QueueId, (i32, bool)> = HashMap::new();
        let mut accepted = Vec::with_capacity(lines.len());
        for line in &lines {
            let id = line.key.id();
            let (epoch, has_states) = *seen.entry(id.clone()).or_insert_with(|| {
                inner.queues.0.get(&id).map_or((i32::MIN, false), |q| (q.epoch, !q.states.is_empty()))
            });
            let ok = if line.migrated { !has_states } else { line.epoch >= epoch };
            if ok {
                let epoch = if line.migrated { epoch } else { line.epoch };
                seen.insert(id, (epoch, has_states || line.state.is_some() || line.change.is_some()));
            }
            accepted.push(ok);
        }
        let kept: Vec<StateLine> =
            lines.into_iter().zip(&accepted).filter(|(_, ok)| **ok).map(|(line, _)| line).collect();
        if kept.is_empty() {
            return Ok((accepted, None));
        }
        let value = lines::encode(&kept)?;
        inner.written += value.len() as u64;
        let write = broker.write_internal(&self.partition, batch_of(value)?)?;
        for line in kept {
            let applied = inner.queues.apply(line);
            debug_assert!(applied, "a line accepted was not applied");
        }
        Ok((accepted, Some(write)))
    }

    /// The engine of the leader of epoch `epoch` of `id`'s partition takes the queue over:
    /// returns every consumer's state of it, and the note (to wait for) that fences earlier
    /// leaders. Refused when a later leader has taken it already. Blocking.
    pub(crate) fn take_over(
        &self,
        broker: &Broker,
        id: &QueueId,
        epoch: i32,
    ) -> Result<(QueueStatesOf, Option<InternalWrite>), BrokerError> {
        let mut inner = lock(&self.inner);
        let current = inner.queues.0.get(id).map_or(i32::MIN, |q| q.epoch);
        if current > epoch {
            return Err(BrokerError::new(
                ErrorKind::NotLeader,
                format!(
                    "{}-{} has a newer leader (epoch {current}, not {epoch}) for group {}",
                    id.topic, id.partition, id.group
                ),
            ));
        }
        let write = if current < epoch {
            let key = QueueKey::new(id.group.clone(), id.topic.clone(), id.partition);
            let line = StateLine::took_over(key, epoch);
            let value = lines::encode(std::slice::from_ref(&line))?;
            inner.written += value.len() as u64;
            let write = broker.write_internal(&self.partition, batch_of(value)?)?;
            inner.queues.apply(line);
            Some(write)
        } else {
            None
        };
        let states = inner
            .queues
            .0
            .get(id)
            .map(|q| {
                q.states
                    .iter()
                    .map(|(consumer, state)| {
                        let key = QueueKey {
                            consumer: consumer.clone(),
                            ..QueueKey::new(&*id.group, &*id.topic, id.partition)
                        };
                        (key, state.clone())
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok((states, write))
    }

    /// Writes every state anew when the log grew past [`COMPACT_AFTER_BYTES`]; returns the
    /// offset below which the log may go once the last write is durable. Blocking.
    fn compact(&self, broker: &Broker) -> Result<Option<(i64, InternalWrite)>, BrokerError> {
        let mut inner = lock(&self.inner);
        if inner.written < COMPACT_AFTER_BYTES {
            return Ok(None);
        }
        let mut chunks: Vec<Vec<u8>> = vec![Vec::new()];
        for (id, queue) in &inner.queues.0 {
            let base = QueueKey::new(id.group.clone(), id.topic.clone(), id.partition);
            let queue_lines: Vec<StateLine> = if queue.states.is_empty() {
                vec![StateLine::took_over(base, queue.epoch)]
            } else {
                queue
                    .states
                    .iter()
                    .map(|(consumer, state)| {
                        StateLine::whole(
                            QueueKey { consumer: consumer.clone(), ..base.clone() },
                            queue.epoch,
                            state.clone(),
                        )
                    })
                    .collect()
            };
            for line in queue_lines {
                let encoded = lines::encode(std::slice::from_ref(&line))?;
                let last = chunks.last_mut().expect("one chunk at least");
                if !last.is_empty() && last.len() + encoded.len() > COMPACTION_RECORD_BYTES {
                    chunks.push(encoded);
                } else {
                    last.extend_from_slice(&encoded);
                }
            }
        }
        let mut first = None;
        let mut last_write = None;
        let mut written = 0;
        for chunk in chunks.into_iter().filter(|c| !c.is_empty()) {
            written += chunk.len() as u64;
            let write = broker.write_internal(&self.partition, batch_of(chunk)?)?;
            first.get_or_insert(write.info.first_offset);
            last_write = Some(write);
        }
        inner.written = written;
        let end = self.partition.log.log_end_offset();
        Ok(last_write.map(|write| (first.unwrap_or(end), write)))
    }
}

/// What this broker keeps of the shards of `__share_group_state` it leads.
pub(crate) struct StateShards {
    broker: Weak<Broker>,
    pub(crate) shards: Shards<Arc<StateShard>>,
}

impl StateShards {
    pub(crate) fn new(broker: &Arc<Broker>) -> StateShards {
        StateShards { broker: Arc::downgrade(broker), shards: Shards::new(TOPIC) }
    }

    fn broker(&self) -> Result<Arc<Broker>, BrokerError> {
        self.broker.upgrade().ok_or_else(|| BrokerError::internal("the broker is shutting down"))
    }

    /// Loads the shards this broker leads, now and as leadership moves, and compacts them as
    /// they grow. Call within a tokio runtime, once.
    pub(crate) fn start(self: &Arc<Self>, broker: &Arc<Broker>) {
        crate::state_topic::start_shards(broker, self);
        let weak = Arc::downgrade(self);
        let mut shutdown = broker.shutdown_signal();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(MAINTAIN_EVERY) => {}
                    _ = shutdown.wait_for(|down| *down) => return,
                }
                let Some(owner) = weak.upgrade() else { return };
                owner.maintain().await;
            }
        });
    }

    async fn maintain(&self) {
        let Ok(broker) = self.broker() else { return };
        for shard in self.shards.loaded().into_values() {
            let compacted = {
                let (shard, broker) = (shard.clone(), broker.clone());
                tokio::task::spawn_blocking(move || shard.compact(&broker)).await
            };
            let (target, write) = match compacted {
                Ok(Ok(Some(compacted))) => compacted,
                Ok(Ok(None)) => continue,
                Ok(Err(e)) => {
                    tracing::warn!(shard = shard.index, error = %e, "invisible-time state: cannot compact");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(shard = shard.index, error = %e, "invisible-time state: compaction failed");
                    continue;
                }
            };
            if let Err(e) = write.durable().await {
                tracing::debug!(shard = shard.index, error = %e, "invisible-time state: compaction not durable yet");
                continue;
            }
            let (partition, broker) = (shard.partition.clone(), broker.clone());
            let trimmed = tokio::task::spawn_blocking(move || {
                broker.delete_records(&partition, target)?;
                partition.log.apply_retention().map_err(BrokerError::from)
            })
            .await;
            if !matches!(trimmed, Ok(Ok(_))) {
                tracing::debug!(shard = shard.index, "invisible-time state: cannot trim the log yet");
            }
        }
    }

    /// [`StateShard::write`] on shard `index`, led here, once durable.
    pub(crate) async fn write_here(&self, index: i32, lines: Vec<StateLine>) -> Result<Vec<bool>, BrokerError> {
        let shard = self.shards.get(index)?;
        let broker = self.broker()?;
        let (accepted, write) = shard.write(&broker, lines)?;
        if let Some(write) = write {
            write.durable().await?;
        }
        Ok(accepted)
    }

    /// [`StateShard::take_over`] on shard `index`, led here, once durable.
    pub(crate) async fn take_over_here(
        &self,
        index: i32,
        id: &QueueId,
        epoch: i32,
    ) -> Result<Vec<(QueueKey, QueueState)>, BrokerError> {
        let shard = self.shards.get(index)?;
        let broker = self.broker()?;
        let (states, write) = shard.take_over(&broker, id, epoch)?;
        if let Some(write) = write {
            write.durable().await?;
        }
        Ok(states)
    }

    /// The queues shards `shards`, led here, hold on `partitions`. NOT_COORDINATOR and its
    /// kin when one of them is not loaded here (the caller asks again later).
    pub(crate) fn queues_on_here(
        &self,
        shards: &[i32],
        partitions: &[(String, i32)],
    ) -> Result<Vec<QueueId>, BrokerError> {
        let wanted: std::collections::HashSet<(&str, i32)> = partitions.iter().map(|(t, p)| (t.as_str(), *p)).collect();
        let mut queues = Vec::new();
        for index in shards {
            let shard = self.shards.get(*index)?;
            let inner = lock(&shard.inner);
            queues.extend(
                inner.queues.0.keys().filter(|id| wanted.contains(&(id.topic.as_str(), id.partition))).cloned(),
            );
        }
        Ok(queues)
    }

    /// How many queues the shards led here hold.
    pub(crate) fn queue_count(&self) -> usize {
        self.shards.loaded().values().map(|s| lock(&s.inner).queues.0.len()).sum()
    }
}

impl ShardOwner for StateShards {
    type Shard = Arc<StateShard>;

    fn shards(&self) -> &Shards<Arc<StateShard>> {
        &self.shards
    }

    fn load_shard(&self, index: i32, partition: Arc<Partition>) -> Result<Arc<StateShard>, BrokerError> {
        let broker = self.broker()?;
        Ok(Arc::new(load(&broker, index, partition)?))
    }

    fn unload_shard(&self, index: i32) {
        tracing::info!(shard = index, "invisible-time state: no longer leads this partition of {TOPIC}");
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::pop::lines::{Change, QueueStates};

    /// The queues of shard `index` as a new leader would load them from its log.
    pub(crate) fn load(broker: &Broker, index: i32, partition: Arc<Partition>) -> HashMap<QueueId, QueueStates> {
        let shard = super::load(broker, index, partition).expect("load");
        let inner = shard.inner.into_inner().expect("lock");
        inner.queues.0
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_compaction_keeps_every_state_and_trims_the_log_below_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (broker, _messaging) = crate::testing::open_with_state_shards(dir.path(), "t").await;
        crate::state_topic::partitions(&broker, TOPIC).await.expect("topic");
        let partition = broker.require_partition(TOPIC, 0).expect("partition");
        let shard = super::load(&broker, 0, partition.clone()).expect("load");
        let mut state = QueueState::starting_at(0);
        for offset in 0..50 {
            let before = state.clone();
            state.deliver(offset, 10, offset as u64);
            let key = QueueKey::new("g", "t", (offset % 3) as i32);
            let (accepted, _) =
                shard.write(&broker, vec![StateLine::change(key, 1, Change::between(&before, &state))]).expect("write");
            assert_eq!(accepted, [true]);
        }
        let before = load(&broker, 0, partition.clone());
        assert!(shard.compact(&broker).expect("compact").is_none(), "not grown enough");
        lock(&shard.inner).written = COMPACT_AFTER_BYTES;
        let (target, write) = shard.compact(&broker).expect("compact").expect("compacted");
        write.durable().await.expect("durable");
        broker.delete_records(&partition, target).expect("trim");
        assert_eq!(partition.log.log_start_offset(), 50, "the 50 lines before the compaction went");
        assert_eq!(load(&broker, 0, partition), before);
        broker.begin_shutdown();
    }
}
