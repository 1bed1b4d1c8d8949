//! `weir produce` over the Kafka protocol: each request's lines become one record batch per
//! partition, produced with `acks=all` to the partition's leader.
//!
//! A record goes where the admin API would put it: `--partition`, else Kafka's murmur2 hash
//! of its key (as the Java client's default partitioner), else round-robin. A batch is cut to
//! fit the topic's `max.message.bytes` with the same bound on a record's size as the admin
//! path.

use std::collections::BTreeMap;
use std::io::Write;

use bytes::Bytes;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::ProduceRequest;
use weir_admin::api::{ErrorDetail, ProducedRecord};
use weir_broker::partitioner::partition_for_key;
use weir_broker::storage::records::{encode_batch, BatchOptions, Header, Record};
use weir_client::Cluster;

use super::{failure, topic_layout, topic_name, TopicLayout, REQUEST_TIMEOUT_MS};
use crate::admin_cli::print_json;
use crate::admin_cli::produce::{record_bytes_max, split_line, ProduceArgs, BATCH_OVERHEAD_BYTES};

/// `acks=all`: answered once the in-sync replicas have the batch.
const ACKS_ALL: i16 = -1;

/// Sends lines to the partitions' leaders and counts what was produced.
pub struct KafkaSender<'a> {
    args: &'a ProduceArgs,
    cluster: Cluster,
    layout: TopicLayout,
    batch_bytes_max: u64,
    next_round_robin: i32,
    /// Records the brokers took.
    pub produced: u64,
    /// Lines sent (taken or refused) so far.
    pub lines_sent: u64,
}

impl<'a> KafkaSender<'a> {
    pub fn connect(args: &'a ProduceArgs, bootstrap: &str) -> anyhow::Result<KafkaSender<'a>> {
        if args.logical_partition.is_some() {
            anyhow::bail!(
                "--logical-partition goes through Weir's admin API, which knows elastic topics: leave out --bootstrap, or add --native"
            );
        }
        let mut cluster = super::connect(bootstrap)?;
        let layout = topic_layout(&mut cluster, &args.topic)?;
        if let Some(p) = args.partition {
            if !layout.partitions.iter().any(|l| l.partition == p) {
                anyhow::bail!("topic '{}' has no partition {p}", args.topic);
            }
        }
        let mut topics = super::topics::KafkaTopics::from_cluster(cluster);
        let value = topics.config(&args.topic, "max.message.bytes")?;
        let batch_bytes_max = value.as_deref().and_then(|v| v.parse().ok()).ok_or_else(|| {
            anyhow::anyhow!("the broker gave no usable max.message.bytes for '{}': {value:?}", args.topic)
        })?;
        Ok(KafkaSender {
            args,
            cluster: topics.into_cluster(),
            layout,
            batch_bytes_max,
            next_round_robin: 0,
            produced: 0,
            lines_sent: 0,
        })
    }

    fn partition_of(&mut self, key: Option<&[u8]>) -> i32 {
        let count = self.layout.partitions.len().max(1) as i32;
        match (self.args.partition, key) {
            (Some(p), _) => p,
            (None, Some(key)) => partition_for_key(key, count),
            (None, None) => {
                let p = self.next_round_robin % count;
                self.next_round_robin = self.next_round_robin.wrapping_add(1) & i32::MAX;
                p
            }
        }
    }

    /// Produces `lines` in order; with `--json` prints each record's offset as the admin path
    /// does. A partition that refuses its records fails the command after what the others took
    /// is counted.
    pub fn send(&mut self, lines: &[Vec<u8>], out: &mut impl Write) -> anyhow::Result<()> {
        let separator = self.args.key_separator.as_deref().map(str::as_bytes);
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        // Per partition, in line order: (line index, record, its size bound).
        let mut by_partition: BTreeMap<i32, Vec<(usize, Record, u64)>> = BTreeMap::new();
        for (i, line) in lines.iter().enumerate() {
            let (key, value) = split_line(line, separator);
            let bound = record_bytes_max(key, value, &self.args.headers);
            let mut record = Record::new(now_ms, key.map(Bytes::copy_from_slice), Some(Bytes::copy_from_slice(value)));
            record.headers = self
                .args
                .headers
                .iter()
                .map(|(n, v)| Header::new(n.clone(), Some(Bytes::from(v.clone().into_bytes()))))
                .collect();
            let partition = self.partition_of(key);
            by_partition.entry(partition).or_default().push((i, record, bound));
        }
        let mut results: Vec<Option<ProducedRecord>> = vec![None; lines.len()];
        let mut refusal = None;
        for (partition, records) in by_partition {
            for chunk in self.chunks(records) {
                let answer = self.produce(partition, &chunk);
                for (n, (i, record, _)) in chunk.iter().enumerate() {
                    results[*i] = Some(match &answer {
                        Ok(base) => ProducedRecord {
                            partition,
                            offset: Some(base + n as i64),
                            timestamp: Some(record.timestamp),
                            error: None,
                        },
                        Err(e) => ProducedRecord { partition, offset: None, timestamp: None, error: Some(e.clone()) },
                    });
                }
                if let Err(e) = answer {
                    refusal.get_or_insert((partition, e));
                    break;
                }
            }
        }
        self.lines_sent += lines.len() as u64;
        let taken: Vec<&ProducedRecord> = results.iter().flatten().filter(|r| r.error.is_none()).collect();
        self.produced += taken.len() as u64;
        if self.args.connection.json {
            for record in taken {
                print_json(out, record)?;
            }
            out.flush()?;
        }
        if let Some((partition, error)) = refusal {
            anyhow::bail!("partition {partition} refused its records: {} ({})", error.message, error.code);
        }
        Ok(())
    }

    /// `records` cut into batches whose size bound fits `max.message.bytes` (a record over it
    /// goes alone: the broker's answer says why).
    fn chunks(&self, records: Vec<(usize, Record, u64)>) -> Vec<Vec<(usize, Record, u64)>> {
        let mut out: Vec<Vec<(usize, Record, u64)>> = Vec::new();
        let mut bytes = BATCH_OVERHEAD_BYTES;
        for record in records {
            let full = out.last().is_none_or(|c| !c.is_empty() && bytes + record.2 > self.batch_bytes_max);
            if full {
                out.push(Vec::new());
                bytes = BATCH_OVERHEAD_BYTES;
            }
            bytes += record.2;
            if let Some(chunk) = out.last_mut() {
                chunk.push(record);
            }
        }
        out
    }

    /// One batch to `partition`'s leader; its base offset, or the broker's error.
    fn produce(&mut self, partition: i32, chunk: &[(usize, Record, u64)]) -> Result<i64, ErrorDetail> {
        let detail = |code: String, message: String| ErrorDetail { code, message };
        let records: Vec<Record> = chunk.iter().map(|(_, r, _)| r.clone()).collect();
        let batch = encode_batch(&records, &BatchOptions::default())
            .map_err(|e| detail("INVALID_RECORD".into(), format!("cannot encode the batch: {e}")))?;
        let leader = self.layout.partitions.iter().find(|l| l.partition == partition).map_or(-1, |l| l.leader);
        if leader < 0 {
            return Err(detail("LEADER_NOT_AVAILABLE".into(), format!("partition {partition} has no leader")));
        }
        let request =
            ProduceRequest::default().with_acks(ACKS_ALL).with_timeout_ms(REQUEST_TIMEOUT_MS).with_topic_data(vec![
                TopicProduceData::default().with_name(topic_name(&self.args.topic)).with_partition_data(vec![
                    PartitionProduceData::default().with_index(partition).with_records(Some(batch.freeze())),
                ]),
            ]);
        let (_, response) = self.cluster.send_to(leader, 3..=11, &request).map_err(|e| {
            let e = failure(e);
            detail(crate::admin_cli::failure_code(&e).unwrap_or("NETWORK_EXCEPTION").to_string(), format!("{e:#}"))
        })?;
        let answer = response.responses.iter().flat_map(|t| &t.partition_responses).find(|p| p.index == partition);
        let Some(answer) = answer else {
            return Err(detail("UNKNOWN_SERVER_ERROR".into(), "the leader answered without the partition".into()));
        };
        if answer.error_code != 0 {
            let message = answer.error_message.as_ref().map(|m| m.to_string()).filter(|m| !m.is_empty());
            let code = weir_kafka::errors::error_name(i32::from(answer.error_code));
            return Err(detail(code, message.unwrap_or_else(|| super::describe_code(answer.error_code))));
        }
        Ok(answer.base_offset)
    }

    /// `e`, and how much was produced before it, if anything was.
    pub fn partial(&self, e: anyhow::Error) -> anyhow::Error {
        if self.produced == 0 {
            return e;
        }
        anyhow::anyhow!(
            "{e:#}; {} record(s) were produced (from the first {} line(s); nothing after them was sent)",
            self.produced,
            self.lines_sent
        )
    }
}
