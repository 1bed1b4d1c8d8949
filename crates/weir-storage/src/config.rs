//! Per-log configuration, named as Kafka's topic configs are, with Kafka's defaults.

use std::collections::BTreeMap;

use crate::batch::TimestampType;
use crate::error::{Result, StorageError};

/// When an append is durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushPolicy {
    /// Leave data in the page cache; safety comes from replication (Kafka's default).
    /// Segments are flushed when rolled and on clean shutdown.
    None,
    /// fsync after `messages` unflushed messages or every `interval_ms` (Kafka's
    /// `flush.messages` / `flush.ms`), whichever comes first.
    Interval { messages: u64, interval_ms: u64 },
    /// Every acknowledged append is on disk: the caller waits with [`crate::Log::sync_to`], and
    /// concurrent waiters share one fdatasync (group commit).
    Sync,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CleanupPolicy {
    pub delete: bool,
    pub compact: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LogConfig {
    /// `segment.bytes`: roll the active segment when it would exceed this size.
    pub segment_bytes: u64,
    /// `segment.ms`: roll when the active segment's first batch is this old.
    pub segment_ms: u64,
    /// `segment.jitter.ms`: a random amount up to this is subtracted from `segment_ms` per segment.
    pub segment_jitter_ms: u64,
    /// `segment.index.bytes`: preallocated size of each index file; a full index rolls the segment.
    pub segment_index_bytes: u64,
    /// `index.interval.bytes`: bytes of log between two offset-index entries.
    pub index_interval_bytes: u64,
    /// `max.message.bytes`: largest batch accepted.
    pub max_message_bytes: u64,
    /// `message.timestamp.type`.
    pub timestamp_type: TimestampType,
    /// `flush.policy` (Weir), `flush.messages`, `flush.ms`.
    pub flush: FlushPolicy,
    /// `retention.ms`: -1 keeps forever.
    pub retention_ms: i64,
    /// `retention.bytes`: -1 keeps any size.
    pub retention_bytes: i64,
    /// `cleanup.policy`: delete, compact, or both.
    pub cleanup_policy: CleanupPolicy,
    /// `delete.retention.ms`: how long compaction keeps tombstones.
    pub delete_retention_ms: u64,
    /// `min.compaction.lag.ms`: records younger than this are never compacted.
    pub min_compaction_lag_ms: u64,
    /// `min.cleanable.dirty.ratio`: compact when this share of the log is uncompacted.
    pub min_cleanable_dirty_ratio: f64,
    /// `file.delete.delay.ms`: how long deleted segments linger as `.deleted` files.
    pub file_delete_delay_ms: u64,
    /// `remote.storage.enable` (KIP-405): the partition's closed segments are uploaded to the
    /// broker's object store (the tier lives above this crate; the log only lists the segments).
    pub remote_storage_enable: bool,
    /// `local.retention.ms`: with remote storage, how long uploaded segments stay on local disk
    /// too; -2 (the default) is `retention.ms`.
    pub local_retention_ms: i64,
    /// `local.retention.bytes`: with remote storage, local bytes kept; -2 is `retention.bytes`.
    pub local_retention_bytes: i64,
    /// `storage.mode` (Weir): `memory` makes the topic memory-first (Swift's write path): its
    /// writes count once the broker's writer has them in the object store, not once on local
    /// disk, and the high watermark follows the store (the broker sets it). `disk` (the
    /// default) is Kafka's log.
    pub memory_first: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: 1 << 30,
            segment_ms: 7 * 24 * 3600 * 1000,
            segment_jitter_ms: 0,
            segment_index_bytes: 10 << 20,
            index_interval_bytes: 4096,
            max_message_bytes: 1_048_588,
            timestamp_type: TimestampType::CreateTime,
            flush: FlushPolicy::None,
            retention_ms: 7 * 24 * 3600 * 1000,
            retention_bytes: -1,
            cleanup_policy: CleanupPolicy { delete: true, compact: false },
            delete_retention_ms: 24 * 3600 * 1000,
            min_compaction_lag_ms: 0,
            min_cleanable_dirty_ratio: 0.5,
            file_delete_delay_ms: 60_000,
            remote_storage_enable: false,
            local_retention_ms: -2,
            local_retention_bytes: -2,
            memory_first: false,
        }
    }
}

/// The Kafka topic-config names this crate understands, in documentation order.
pub const TOPIC_CONFIG_NAMES: &[&str] = &[
    "cleanup.policy",
    "delete.retention.ms",
    "file.delete.delay.ms",
    "flush.messages",
    "flush.ms",
    "flush.policy",
    "index.interval.bytes",
    "local.retention.bytes",
    "local.retention.ms",
    "max.message.bytes",
    "message.timestamp.type",
    "min.cleanable.dirty.ratio",
    "min.compaction.lag.ms",
    "remote.storage.enable",
    "retention.bytes",
    "retention.ms",
    "segment.bytes",
    "segment.index.bytes",
    "segment.jitter.ms",
    "segment.ms",
    "storage.mode",
];

impl LogConfig {
    /// Applies Kafka-named overrides on top of `self`. Unknown names and invalid values are
    /// errors that name the setting; nothing is applied unless everything is valid.
    pub fn with_overrides(&self, overrides: &BTreeMap<String, String>) -> Result<LogConfig> {
        let mut config = self.clone();
        let mut flush_messages: Option<u64> = None;
        let mut flush_ms: Option<u64> = None;
        let mut flush_policy: Option<String> = None;
        for (name, value) in overrides {
            let value = value.trim();
            match name.as_str() {
                "segment.bytes" => config.segment_bytes = parse_range(name, value, 14, i32::MAX as u64)?,
                "segment.ms" => config.segment_ms = parse_range(name, value, 1, i64::MAX as u64)?,
                "segment.jitter.ms" => config.segment_jitter_ms = parse_range(name, value, 0, i64::MAX as u64)?,
                "segment.index.bytes" => config.segment_index_bytes = parse_range(name, value, 4, i32::MAX as u64)?,
                "index.interval.bytes" => config.index_interval_bytes = parse_range(name, value, 0, i32::MAX as u64)?,
                "max.message.bytes" => config.max_message_bytes = parse_range(name, value, 0, i32::MAX as u64)?,
                "message.timestamp.type" => {
                    config.timestamp_type = match value {
                        "CreateTime" => TimestampType::CreateTime,
                        "LogAppendTime" => TimestampType::LogAppendTime,
                        _ => return Err(invalid(name, value, "expected CreateTime or LogAppendTime")),
                    }
                }
                "flush.messages" => flush_messages = Some(parse_range(name, value, 1, i64::MAX as u64)?),
                "flush.ms" => flush_ms = Some(parse_range(name, value, 0, i64::MAX as u64)?),
                "flush.policy" => flush_policy = Some(value.to_string()),
                "retention.ms" => config.retention_ms = parse_signed(name, value)?,
                "retention.bytes" => config.retention_bytes = parse_signed(name, value)?,
                "cleanup.policy" => config.cleanup_policy = parse_cleanup_policy(name, value)?,
                "delete.retention.ms" => config.delete_retention_ms = parse_range(name, value, 0, i64::MAX as u64)?,
                "min.compaction.lag.ms" => config.min_compaction_lag_ms = parse_range(name, value, 0, i64::MAX as u64)?,
                "min.cleanable.dirty.ratio" => {
                    let ratio: f64 =
                        value.parse().map_err(|_| invalid(name, value, "expected a number between 0 and 1"))?;
                    if !(0.0..=1.0).contains(&ratio) {
                        return Err(invalid(name, value, "expected a number between 0 and 1"));
                    }
                    config.min_cleanable_dirty_ratio = ratio;
                }
                "file.delete.delay.ms" => config.file_delete_delay_ms = parse_range(name, value, 0, i64::MAX as u64)?,
                "storage.mode" => {
                    config.memory_first = match value {
                        "memory" => true,
                        "disk" => false,
                        _ => return Err(invalid(name, value, "expected disk or memory")),
                    }
                }
                "remote.storage.enable" => {
                    config.remote_storage_enable = match value {
                        "true" => true,
                        "false" => false,
                        _ => return Err(invalid(name, value, "expected true or false")),
                    }
                }
                "local.retention.ms" => config.local_retention_ms = parse_local_retention(name, value)?,
                "local.retention.bytes" => config.local_retention_bytes = parse_local_retention(name, value)?,
                _ => {
                    return Err(StorageError::InvalidConfig {
                        name: name.clone(),
                        value: value.to_string(),
                        reason: "unknown topic config".into(),
                    })
                }
            }
        }
        let (current_messages, current_ms) = match config.flush {
            FlushPolicy::Interval { messages, interval_ms } => (messages, interval_ms),
            _ => (u64::MAX, u64::MAX),
        };
        config.flush = match flush_policy.as_deref() {
            Some("none") => FlushPolicy::None,
            Some("sync") => FlushPolicy::Sync,
            Some("interval") => FlushPolicy::Interval {
                messages: flush_messages.unwrap_or(current_messages),
                interval_ms: flush_ms.unwrap_or(current_ms),
            },
            Some(other) => return Err(invalid("flush.policy", other, "expected none, interval or sync")),
            // Kafka users set flush.messages / flush.ms alone; honour that as the interval policy.
            None if flush_messages.is_some() || flush_ms.is_some() => FlushPolicy::Interval {
                messages: flush_messages.unwrap_or(current_messages),
                interval_ms: flush_ms.unwrap_or(current_ms),
            },
            None => config.flush,
        };
        for (local_name, local, total_name, total) in [
            ("local.retention.ms", config.local_retention_ms, "retention.ms", config.retention_ms),
            ("local.retention.bytes", config.local_retention_bytes, "retention.bytes", config.retention_bytes),
        ] {
            // Kafka's rule: the local tier cannot keep more than both tiers together.
            if local >= 0 && total >= 0 && local > total {
                return Err(invalid(
                    local_name,
                    &local.to_string(),
                    &format!("must not exceed {total_name} ({total}), which covers both tiers"),
                ));
            }
            if local == -1 && total >= 0 {
                return Err(invalid(
                    local_name,
                    "-1",
                    &format!("cannot keep forever what {total_name} ({total}) deletes"),
                ));
            }
        }
        if config.memory_first && !config.remote_storage_enable {
            return Err(invalid(
                "storage.mode",
                "memory",
                "a memory-first topic keeps its data in the object store: set remote.storage.enable=true too",
            ));
        }
        if config.segment_index_bytes < 8 {
            return Err(invalid(
                "segment.index.bytes",
                &config.segment_index_bytes.to_string(),
                "must hold at least one entry",
            ));
        }
        Ok(config)
    }

    /// The configs as Kafka-named strings (for DescribeConfigs).
    pub fn to_properties(&self) -> BTreeMap<String, String> {
        let mut p = BTreeMap::new();
        let mut put = |k: &str, v: String| {
            p.insert(k.to_string(), v);
        };
        put("segment.bytes", self.segment_bytes.to_string());
        put("segment.ms", self.segment_ms.to_string());
        put("segment.jitter.ms", self.segment_jitter_ms.to_string());
        put("segment.index.bytes", self.segment_index_bytes.to_string());
        put("index.interval.bytes", self.index_interval_bytes.to_string());
        put("max.message.bytes", self.max_message_bytes.to_string());
        put(
            "message.timestamp.type",
            match self.timestamp_type {
                TimestampType::CreateTime => "CreateTime",
                TimestampType::LogAppendTime => "LogAppendTime",
            }
            .into(),
        );
        let (policy, messages, ms) = match self.flush {
            FlushPolicy::None => ("none", i64::MAX as u64, i64::MAX as u64),
            FlushPolicy::Interval { messages, interval_ms } => {
                ("interval", messages.min(i64::MAX as u64), interval_ms.min(i64::MAX as u64))
            }
            FlushPolicy::Sync => ("sync", 1, 0),
        };
        put("flush.policy", policy.into());
        put("flush.messages", messages.to_string());
        put("flush.ms", ms.to_string());
        put("retention.ms", self.retention_ms.to_string());
        put("retention.bytes", self.retention_bytes.to_string());
        let cleanup = match (self.cleanup_policy.delete, self.cleanup_policy.compact) {
            (true, true) => "compact,delete",
            (false, true) => "compact",
            _ => "delete",
        };
        put("cleanup.policy", cleanup.into());
        put("delete.retention.ms", self.delete_retention_ms.to_string());
        put("min.compaction.lag.ms", self.min_compaction_lag_ms.to_string());
        put("min.cleanable.dirty.ratio", self.min_cleanable_dirty_ratio.to_string());
        put("file.delete.delay.ms", self.file_delete_delay_ms.to_string());
        put("remote.storage.enable", self.remote_storage_enable.to_string());
        put("local.retention.ms", self.local_retention_ms.to_string());
        put("local.retention.bytes", self.local_retention_bytes.to_string());
        put("storage.mode", if self.memory_first { "memory" } else { "disk" }.into());
        p
    }

    /// `local.retention.ms` in force: the local tier's own limit, or `retention.ms` for -2.
    pub fn effective_local_retention_ms(&self) -> i64 {
        if self.local_retention_ms == -2 {
            self.retention_ms
        } else {
            self.local_retention_ms
        }
    }

    /// `local.retention.bytes` in force: its own limit, or `retention.bytes` for -2.
    pub fn effective_local_retention_bytes(&self) -> i64 {
        if self.local_retention_bytes == -2 {
            self.retention_bytes
        } else {
            self.local_retention_bytes
        }
    }
}

fn invalid(name: &str, value: &str, reason: &str) -> StorageError {
    StorageError::InvalidConfig { name: name.into(), value: value.into(), reason: reason.into() }
}

/// -2 (follow the total), -1 (keep forever) or a limit.
fn parse_local_retention(name: &str, value: &str) -> Result<i64> {
    let parsed: i64 = value.parse().map_err(|_| invalid(name, value, "expected -2, -1 or a non-negative integer"))?;
    if parsed < -2 {
        return Err(invalid(name, value, "expected -2, -1 or a non-negative integer"));
    }
    Ok(parsed)
}

fn parse_range(name: &str, value: &str, min: u64, max: u64) -> Result<u64> {
    let parsed: u64 =
        value.parse().map_err(|_| invalid(name, value, &format!("expected an integer in [{min}, {max}]")))?;
    if parsed < min || parsed > max {
        return Err(invalid(name, value, &format!("expected an integer in [{min}, {max}]")));
    }
    Ok(parsed)
}

fn parse_signed(name: &str, value: &str) -> Result<i64> {
    let parsed: i64 = value.parse().map_err(|_| invalid(name, value, "expected an integer (-1 for unlimited)"))?;
    if parsed < -1 {
        return Err(invalid(name, value, "expected -1 (unlimited) or a non-negative integer"));
    }
    Ok(parsed)
}

fn parse_cleanup_policy(name: &str, value: &str) -> Result<CleanupPolicy> {
    let mut policy = CleanupPolicy { delete: false, compact: false };
    for part in value.split(',').map(str::trim) {
        match part {
            "delete" => policy.delete = true,
            "compact" => policy.compact = true,
            _ => return Err(invalid(name, value, "expected delete, compact, or compact,delete")),
        }
    }
    if !policy.delete && !policy.compact {
        return Err(invalid(name, value, "expected delete, compact, or compact,delete"));
    }
    Ok(policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn given_kafka_names_when_applied_should_override_defaults() {
        let config = LogConfig::default()
            .with_overrides(&props(&[
                ("segment.bytes", "1048576"),
                ("cleanup.policy", "compact,delete"),
                ("flush.messages", "1"),
            ]))
            .expect("valid");
        assert_eq!(config.segment_bytes, 1 << 20);
        assert_eq!(config.cleanup_policy, CleanupPolicy { delete: true, compact: true });
        assert!(matches!(config.flush, FlushPolicy::Interval { messages: 1, .. }));
    }

    #[test]
    fn given_unknown_or_invalid_setting_should_name_it() {
        let err = LogConfig::default().with_overrides(&props(&[("segment.byts", "1")])).unwrap_err();
        assert!(err.to_string().contains("segment.byts"), "{err}");
        let err = LogConfig::default().with_overrides(&props(&[("retention.ms", "soon")])).unwrap_err();
        assert!(err.to_string().contains("retention.ms"), "{err}");
        let err = LogConfig::default().with_overrides(&props(&[("flush.policy", "always")])).unwrap_err();
        assert!(err.to_string().contains("flush.policy"), "{err}");
    }

    #[test]
    fn properties_round_trip() {
        let config = LogConfig::default()
            .with_overrides(&props(&[("flush.policy", "sync"), ("retention.bytes", "1000")]))
            .expect("valid");
        let again = LogConfig::default().with_overrides(&config.to_properties()).expect("valid");
        assert_eq!(config, again);
    }
}
