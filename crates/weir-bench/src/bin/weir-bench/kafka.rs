//! librdkafka clients as the benchmark sets them up: configuration, topic creation and deletion,
//! and the layout of a message value.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures_executor::block_on;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use crate::cli::{Acks, HEADER_BYTES};

/// Timeout of every metadata and admin request.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);

/// The first [`HEADER_BYTES`] of every message value: the send time (nanoseconds since the run's
/// epoch, little-endian u64) and the producer's sequence number; the rest is filler.
pub mod payload {
    use super::HEADER_BYTES;

    /// A value of `bytes` bytes (at least the header) with filler that does not compress.
    pub fn new(bytes: u64, seed: u64) -> Vec<u8> {
        assert!(bytes >= HEADER_BYTES, "a message holds at least its header");
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..bytes)
            .map(|_| {
                // xorshift64: cheap, and random enough that no codec finds anything to squeeze.
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect()
    }

    pub fn write_header(value: &mut [u8], send_ns: u64, sequence: u64) {
        value[..8].copy_from_slice(&send_ns.to_le_bytes());
        value[8..16].copy_from_slice(&sequence.to_le_bytes());
    }

    /// (send_ns, sequence), or None for a value that is not the benchmark's.
    pub fn read_header(value: &[u8]) -> Option<(u64, u64)> {
        let send_ns = u64::from_le_bytes(value.get(..8)?.try_into().ok()?);
        let sequence = u64::from_le_bytes(value.get(8..16)?.try_into().ok()?);
        Some((send_ns, sequence))
    }
}

/// Settings common to every client of a target: the bootstrap address, then the user's
/// --client-config last so that it overrides.
fn base_config(bootstrap: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap).set("client.id", "weir-bench");
    config
}

fn apply_extra(config: &mut ClientConfig, extra: &[(String, String)]) {
    for (key, value) in extra {
        config.set(key, value);
    }
}

/// A producer's settings: 1 MiB batches; at most `buffer_kib` of messages waiting in the
/// producer (the Java client's default buffer.memory is 32 MiB; librdkafka's default of 1 GiB
/// would let a producer run far ahead of a slow broker, and the run's end wait for it); no
/// compression (the filler does not compress anyway); no idempotence, which not every broker
/// offers yet.
pub fn producer_config(
    bootstrap: &str,
    acks: Acks,
    linger_ms: u32,
    buffer_kib: u32,
    extra: &[(String, String)],
) -> ClientConfig {
    let mut config = base_config(bootstrap);
    config
        .set("acks", acks.config_value())
        .set("linger.ms", linger_ms.to_string())
        .set("batch.size", (1 << 20).to_string())
        .set("batch.num.messages", "100000")
        .set("queue.buffering.max.kbytes", buffer_kib.to_string())
        .set("compression.type", "none")
        .set("enable.idempotence", "false")
        // Fail a message after 60 s rather than the default 5 minutes: a stuck broker shows up
        // as delivery errors while the run is still going.
        .set("message.timeout.ms", "60000");
    apply_extra(&mut config, extra);
    config
}

/// A consumer's settings: assigned partitions (no group rebalance to wait for), nothing
/// committed, fetches answered as soon as one byte is there.
pub fn consumer_config(bootstrap: &str, group: &str, extra: &[(String, String)]) -> ClientConfig {
    let mut config = base_config(bootstrap);
    config
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .set("fetch.min.bytes", "1")
        .set("fetch.wait.max.ms", "100");
    apply_extra(&mut config, extra);
    config
}

fn admin(bootstrap: &str, extra: &[(String, String)]) -> anyhow::Result<AdminClient<DefaultClientContext>> {
    let mut config = base_config(bootstrap);
    apply_extra(&mut config, extra);
    config.create().context("cannot create a librdkafka admin client")
}

/// Fails with a clear message when nothing answers at `bootstrap`.
pub fn check_reachable(name: &str, bootstrap: &str, extra: &[(String, String)]) -> anyhow::Result<()> {
    let admin = admin(bootstrap, extra)?;
    let metadata = admin
        .inner()
        .fetch_metadata(None, Duration::from_secs(10))
        .with_context(|| format!("target {name}: no Kafka broker answered at {bootstrap} within 10 s"))?;
    if metadata.brokers().is_empty() {
        bail!("target {name}: the metadata from {bootstrap} lists no broker");
    }
    Ok(())
}

/// Creates `topic` and waits until every partition has a leader.
pub fn create_topic(
    bootstrap: &str,
    extra: &[(String, String)],
    topic: &str,
    partitions: u32,
    replication_factor: i32,
) -> anyhow::Result<()> {
    let admin = admin(bootstrap, extra)?;
    let partitions_i32 = i32::try_from(partitions).context("too many partitions")?;
    let new_topic = NewTopic::new(topic, partitions_i32, TopicReplication::Fixed(replication_factor));
    let options = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT)).request_timeout(Some(ADMIN_TIMEOUT));
    let results = block_on(admin.create_topics([&new_topic], &options))
        .with_context(|| format!("cannot create topic {topic} at {bootstrap}"))?;
    for result in results {
        if let Err((name, code)) = result {
            bail!("cannot create topic {name} ({partitions} partitions) at {bootstrap}: {code}");
        }
    }
    let deadline = Instant::now() + ADMIN_TIMEOUT;
    loop {
        let metadata = admin.inner().fetch_metadata(Some(topic), Duration::from_secs(10))?;
        let ready = metadata.topics().iter().any(|t| {
            t.name() == topic
                && t.error().is_none()
                && t.partitions().len() == partitions as usize
                && t.partitions().iter().all(|p| p.leader() >= 0 && p.error().is_none())
        });
        if ready {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("topic {topic} at {bootstrap}: not every partition had a leader after {ADMIN_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn delete_topic(bootstrap: &str, extra: &[(String, String)], topic: &str) -> anyhow::Result<()> {
    let admin = admin(bootstrap, extra)?;
    let options = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT)).request_timeout(Some(ADMIN_TIMEOUT));
    let results = block_on(admin.delete_topics(&[topic], &options))
        .with_context(|| format!("cannot delete topic {topic} at {bootstrap}"))?;
    for result in results {
        if let Err((name, code)) = result {
            bail!("cannot delete topic {name} at {bootstrap}: {code}");
        }
    }
    Ok(())
}

/// True for the error `send` returns when the producer's queue is full: wait and retry.
pub fn is_queue_full(error: &KafkaError) -> bool {
    matches!(error, KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_header_round_trips() {
        let mut value = payload::new(64, 7);
        assert_eq!(value.len(), 64);
        payload::write_header(&mut value, 123_456_789, 42);
        assert_eq!(payload::read_header(&value), Some((123_456_789, 42)));
        assert_eq!(payload::read_header(&value[..15]), None);
        // The filler differs between producers and does not repeat a single byte.
        assert_ne!(payload::new(64, 1)[16..], payload::new(64, 2)[16..]);
        assert!(value[16..].windows(2).any(|w| w[0] != w[1]));
    }

    #[test]
    fn user_settings_override_the_benchmarks() {
        let config = producer_config("h:1", Acks::All, 5, 1024, &[("linger.ms".into(), "20".into())]);
        assert_eq!(config.get("linger.ms"), Some("20"));
        assert_eq!(config.get("acks"), Some("all"));
        assert_eq!(config.get("bootstrap.servers"), Some("h:1"));
        let config = consumer_config("h:1", "g", &[]);
        assert_eq!(config.get("group.id"), Some("g"));
    }
}
