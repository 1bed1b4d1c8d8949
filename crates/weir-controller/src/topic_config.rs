//! Topic configs: Kafka's names, validated in one place.
//!
//! Most are storage settings (weir-storage's [`LogConfig`]); `min.insync.replicas` and
//! `compression.type` are the broker's. A topic's effective config is: Kafka's default, then the
//! broker-wide `log.*` default, then the topic's own override.

use std::collections::BTreeMap;

use weir_storage::config::TOPIC_CONFIG_NAMES;
use weir_storage::{Compression, LogConfig, StorageError};

/// Broker-level defaults of topic configs: (broker name, topic name, default). A topic's own
/// config overrides these. Each can also be set while the cluster runs, cluster-wide or per
/// broker, as a dynamic broker config ([`effective_defaults`]); the controller, which alone
/// reads `unclean.leader.election.enable`, takes the cluster-wide value.
pub const TOPIC_DEFAULT_SETTINGS: &[(&str, &str, &str)] = &[
    ("log.segment.bytes", "segment.bytes", "1073741824"),
    ("log.roll.ms", "segment.ms", "604800000"),
    ("log.roll.jitter.ms", "segment.jitter.ms", "0"),
    ("log.index.size.max.bytes", "segment.index.bytes", "10485760"),
    ("log.index.interval.bytes", "index.interval.bytes", "4096"),
    ("message.max.bytes", "max.message.bytes", "1048588"),
    ("log.message.timestamp.type", "message.timestamp.type", "CreateTime"),
    ("log.flush.policy", "flush.policy", "none"),
    ("log.flush.interval.messages", "flush.messages", "9223372036854775807"),
    ("log.flush.interval.ms", "flush.ms", "9223372036854775807"),
    ("log.retention.ms", "retention.ms", "604800000"),
    ("log.retention.bytes", "retention.bytes", "-1"),
    ("log.local.retention.ms", "local.retention.ms", "-2"),
    ("log.local.retention.bytes", "local.retention.bytes", "-2"),
    ("log.storage.mode", "storage.mode", "disk"),
    ("log.cleanup.policy", "cleanup.policy", "delete"),
    ("log.cleaner.delete.retention.ms", "delete.retention.ms", "86400000"),
    ("log.cleaner.min.compaction.lag.ms", "min.compaction.lag.ms", "0"),
    ("log.cleaner.min.cleanable.ratio", "min.cleanable.dirty.ratio", "0.5"),
    ("log.segment.delete.delay.ms", "file.delete.delay.ms", "60000"),
    ("min.insync.replicas", "min.insync.replicas", "1"),
    ("compression.type", "compression.type", "producer"),
    ("unclean.leader.election.enable", "unclean.leader.election.enable", "false"),
];

/// The topic config that the dynamic broker config `broker_name` sets the default of
/// (`log.retention.ms` → `retention.ms`), if it is one that may change at run time.
pub fn dynamic_topic_default(broker_name: &str) -> Option<&'static str> {
    TOPIC_DEFAULT_SETTINGS.iter().find(|(b, _, _)| *b == broker_name).map(|(_, topic_name, _)| *topic_name)
}

/// The topic defaults in force (by topic config name) on broker `node`: those of its settings
/// (`static_defaults`), overlaid by the dynamic broker configs (`dynamic`, by resource) of the
/// whole cluster (`""`) and then of the broker itself, Kafka's order. `node: None` is the
/// cluster-wide view.
pub fn effective_defaults(
    static_defaults: &BTreeMap<String, String>,
    dynamic: &BTreeMap<String, BTreeMap<String, String>>,
    node: Option<i32>,
) -> BTreeMap<String, String> {
    let mut defaults = static_defaults.clone();
    let own = node.and_then(|id| dynamic.get(&id.to_string()));
    for layer in [dynamic.get(""), own].into_iter().flatten() {
        for (name, value) in layer {
            if let Some(topic_name) = dynamic_topic_default(name) {
                defaults.insert(topic_name.to_string(), value.clone());
            }
        }
    }
    defaults
}

/// Topic configs the broker itself interprets.
pub(crate) const BROKER_TOPIC_CONFIGS: &[(&str, &str)] = &[
    ("min.insync.replicas", "1"),
    ("compression.type", "producer"),
    ("unclean.leader.election.enable", "false"),
    (crate::throttle::LEADER_REPLICAS, ""),
    (crate::throttle::FOLLOWER_REPLICAS, ""),
    (MESSAGE_TYPE, "NORMAL"),
    (MESSAGE_INDEX, "false"),
    (MESSAGE_DELAY_MAX_MS, "604800000"),
    (ELASTIC_SPLIT_BYTES_PER_SEC, "0"),
    (ELASTIC_MERGE_BYTES_PER_SEC, "0"),
    (ELASTIC_AUTOSCALE_WINDOW_MS, "60000"),
];

/// An elastic topic's automatic split: a physical partition whose producers write more bytes
/// per second than this, for `elastic.autoscale.window.ms`, is split (0: never).
pub const ELASTIC_SPLIT_BYTES_PER_SEC: &str = "elastic.split.bytes.per.sec";
/// An elastic topic's automatic merge: two adjacent physical partitions, led by one broker,
/// whose producers write fewer bytes per second than this together, for
/// `elastic.autoscale.window.ms`, are merged (0: never).
pub const ELASTIC_MERGE_BYTES_PER_SEC: &str = "elastic.merge.bytes.per.sec";
/// How long a rate must hold before an automatic split or merge, in milliseconds.
pub const ELASTIC_AUTOSCALE_WINDOW_MS: &str = "elastic.autoscale.window.ms";

/// An elastic topic's automatic split and merge settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ElasticAutoscale {
    /// Bytes per second in; 0 when off.
    pub split_bytes_per_sec: u64,
    pub merge_bytes_per_sec: u64,
    pub window_ms: u64,
}

/// A topic's automatic split and merge settings.
pub fn elastic_autoscale(
    broker_defaults: &BTreeMap<String, String>,
    overrides: &BTreeMap<String, String>,
) -> ElasticAutoscale {
    let number = |name: &str, default: u64| {
        override_or_default(broker_defaults, overrides, name).and_then(|v| v.trim().parse().ok()).unwrap_or(default)
    };
    ElasticAutoscale {
        split_bytes_per_sec: number(ELASTIC_SPLIT_BYTES_PER_SEC, 0),
        merge_bytes_per_sec: number(ELASTIC_MERGE_BYTES_PER_SEC, 0),
        window_ms: number(ELASTIC_AUTOSCALE_WINDOW_MS, 60_000),
    }
}

/// Whether the topic's messages are indexed by key and message id, for queries (see
/// `weir_broker::message_index`). Topics RocketMQ clients create, and those created with a message
/// type, have it on; on others indexing would cost a second decoding of every batch.
pub const MESSAGE_INDEX: &str = "message.index.enable";

/// RocketMQ 5's topic attribute: which kind of messages the topic takes (routes show it to
/// RocketMQ clients as the queues' accepted message types).
pub const MESSAGE_TYPE: &str = "message.type";

/// The `max.message.bytes` of a topic made for RocketMQ: its 4 MiB body limit (what RocketMQ's
/// brokers and clients default to) plus room for the batch and record headers and the
/// message's properties (the front-end takes 64 KiB of it for those).
pub const ROCKETMQ_MAX_MESSAGE_BYTES: u64 = (4 << 20) + (64 << 10);

/// The configs a new topic gets from `configs`: a topic created with a `message.type` is one
/// for RocketMQ, and takes RocketMQ's 4 MiB bodies unless `max.message.bytes` was set, as a
/// topic RocketMQ clients create does; any other topic keeps Kafka's defaults.
pub fn with_rocketmq_defaults(mut configs: BTreeMap<String, String>) -> BTreeMap<String, String> {
    if configs.contains_key(MESSAGE_TYPE) {
        configs.entry("max.message.bytes".to_string()).or_insert_with(|| ROCKETMQ_MAX_MESSAGE_BYTES.to_string());
    }
    configs
}

/// How far ahead a delayed message of the topic may be scheduled, in milliseconds (default 7
/// days); a later delivery time is refused.
pub(crate) const MESSAGE_DELAY_MAX_MS: &str = "message.delay.max.ms";

/// The longest `message.delay.max.ms` accepted: a year. The timer store keeps a scheduled
/// message on disk until it is due, so this bounds how long that may be.
pub(crate) const MESSAGE_DELAY_MAX_MS_LIMIT: i64 = 366 * 24 * 3600 * 1000;

/// A topic's `message.delay.max.ms`.
pub fn message_delay_max_ms(broker_defaults: &BTreeMap<String, String>, overrides: &BTreeMap<String, String>) -> i64 {
    override_or_default(broker_defaults, overrides, MESSAGE_DELAY_MAX_MS)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(7 * 24 * 3600 * 1000)
}

/// Whether a topic with `overrides` indexes its messages (`message.index.enable`).
pub fn message_index(broker_defaults: &BTreeMap<String, String>, overrides: &BTreeMap<String, String>) -> bool {
    override_or_default(broker_defaults, overrides, MESSAGE_INDEX).and_then(|v| parse_bool(v)).unwrap_or(false)
}

/// A topic's `message.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageType {
    Normal,
    Fifo,
    Delay,
    Transaction,
}

impl MessageType {
    pub fn parse(value: &str) -> Option<MessageType> {
        Some(match value.trim().to_ascii_uppercase().as_str() {
            "NORMAL" => MessageType::Normal,
            "FIFO" => MessageType::Fifo,
            "DELAY" => MessageType::Delay,
            "TRANSACTION" => MessageType::Transaction,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            MessageType::Normal => "NORMAL",
            MessageType::Fifo => "FIFO",
            MessageType::Delay => "DELAY",
            MessageType::Transaction => "TRANSACTION",
        }
    }
}

/// A topic's effective `message.type` (NORMAL unless set).
pub fn message_type(overrides: &BTreeMap<String, String>) -> MessageType {
    overrides.get(MESSAGE_TYPE).and_then(|v| MessageType::parse(v)).unwrap_or(MessageType::Normal)
}

/// Topic configs Kafka 3.x deprecated but still accepts: Weir accepts and describes them too, so
/// tools and tests that set them keep working, and they change nothing (message format v2 is
/// the only format stored; timestamps are not checked against the broker's clock).
pub(crate) const DEPRECATED_TOPIC_CONFIGS: &[&str] =
    &["message.format.version", "message.downconversion.enable", "message.timestamp.difference.max.ms"];

/// A topic's `compression.type`: keep what the producer sent, or store every batch with one codec
/// (the broker recompresses batches that arrive with another, as Kafka does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicCompression {
    Producer,
    Codec(Compression),
}

impl TopicCompression {
    pub fn parse(value: &str) -> Option<TopicCompression> {
        Some(match value.trim() {
            "producer" => TopicCompression::Producer,
            "uncompressed" | "none" => TopicCompression::Codec(Compression::None),
            "gzip" => TopicCompression::Codec(Compression::Gzip),
            "snappy" => TopicCompression::Codec(Compression::Snappy),
            "lz4" => TopicCompression::Codec(Compression::Lz4),
            "zstd" => TopicCompression::Codec(Compression::Zstd),
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicConfigError {
    /// The setting at fault, when one is.
    pub name: Option<String>,
    pub message: String,
}

impl std::fmt::Display for TopicConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Where a config's value comes from (DescribeConfigs' `config_source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigSource {
    Topic,
    BrokerDefault,
    Default,
}

#[derive(Debug, Clone)]
pub struct ConfigEntry {
    pub name: String,
    pub value: String,
    pub source: ConfigSource,
}

/// The error of a config name no topic config has, with the one meant when it can be told.
pub fn unknown_config(name: &str) -> TopicConfigError {
    let known = TOPIC_CONFIG_NAMES.iter().copied().chain(BROKER_TOPIC_CONFIGS.iter().map(|(n, _)| *n));
    let hint = match weir_error::closest_name(name, known) {
        Some(meant) => format!("; did you mean {meant}?"),
        None => String::new(),
    };
    TopicConfigError { name: Some(name.to_string()), message: format!("Unknown topic config name: {name}{hint}") }
}

pub fn is_known(name: &str) -> bool {
    TOPIC_CONFIG_NAMES.contains(&name)
        || BROKER_TOPIC_CONFIGS.iter().any(|(n, _)| *n == name)
        || DEPRECATED_TOPIC_CONFIGS.contains(&name)
}

/// The deprecated configs among `configs` (to warn about when they are set).
pub fn deprecated_in(configs: &BTreeMap<String, String>) -> Vec<&str> {
    configs.keys().map(String::as_str).filter(|n| DEPRECATED_TOPIC_CONFIGS.contains(n)).collect()
}

/// Checks names and values without applying them.
pub fn validate(configs: &BTreeMap<String, String>) -> Result<(), TopicConfigError> {
    log_config(&BTreeMap::new(), configs).map(|_| ())
}

/// The storage config for a topic with `overrides` on a broker with `broker_defaults` (both by
/// topic config name).
pub fn log_config(
    broker_defaults: &BTreeMap<String, String>,
    overrides: &BTreeMap<String, String>,
) -> Result<LogConfig, TopicConfigError> {
    let mut storage_overrides = BTreeMap::new();
    for layer in [broker_defaults, overrides] {
        for (name, value) in layer {
            match name.as_str() {
                "min.insync.replicas" => {
                    let n: i64 =
                        value.trim().parse().map_err(|_| bad(name, value, "expected an integer of at least 1"))?;
                    if n < 1 {
                        return Err(bad(name, value, "expected an integer of at least 1"));
                    }
                }
                "unclean.leader.election.enable" | MESSAGE_INDEX => {
                    if parse_bool(value).is_none() {
                        return Err(bad(name, value, "expected true or false"));
                    }
                }
                crate::throttle::LEADER_REPLICAS | crate::throttle::FOLLOWER_REPLICAS => {
                    if crate::throttle::ThrottledReplicas::parse(value).is_none() {
                        return Err(bad(name, value, "expected *, or a list of partition:broker such as 0:1,1:2"));
                    }
                }
                MESSAGE_DELAY_MAX_MS => {
                    let ms: i64 = value.trim().parse().map_err(|_| bad(name, value, "expected milliseconds"))?;
                    if !(1..=MESSAGE_DELAY_MAX_MS_LIMIT).contains(&ms) {
                        return Err(bad(name, value, "expected milliseconds from 1 to a year (31622400000)"));
                    }
                }
                ELASTIC_SPLIT_BYTES_PER_SEC | ELASTIC_MERGE_BYTES_PER_SEC => {
                    if value.trim().parse::<u64>().is_err() {
                        return Err(bad(name, value, "expected bytes per second (0: off)"));
                    }
                }
                ELASTIC_AUTOSCALE_WINDOW_MS => {
                    if !value.trim().parse::<u64>().is_ok_and(|ms| ms >= 1000) {
                        return Err(bad(name, value, "expected milliseconds, at least 1000"));
                    }
                }
                MESSAGE_TYPE => {
                    if MessageType::parse(value).is_none() {
                        return Err(bad(name, value, "expected NORMAL, FIFO, DELAY or TRANSACTION"));
                    }
                }
                "compression.type" => {
                    if TopicCompression::parse(value).is_none() {
                        return Err(bad(name, value, "expected uncompressed, zstd, lz4, snappy, gzip or producer"));
                    }
                }
                n if DEPRECATED_TOPIC_CONFIGS.contains(&n) => {}
                n if TOPIC_CONFIG_NAMES.contains(&n) => {
                    storage_overrides.insert(name.clone(), value.clone());
                }
                _ => return Err(unknown_config(name)),
            }
        }
    }
    LogConfig::default().with_overrides(&storage_overrides).map_err(|e| match e {
        StorageError::InvalidConfig { name, value, reason } => TopicConfigError {
            message: format!("Invalid value {value} for configuration {name}: {reason}"),
            name: Some(name),
        },
        other => TopicConfigError { name: None, message: other.to_string() },
    })
}

fn bad(name: &str, value: &str, reason: &str) -> TopicConfigError {
    TopicConfigError {
        name: Some(name.to_string()),
        message: format!("Invalid value {value} for configuration {name}: {reason}"),
    }
}

/// One change to a topic's config overrides (Kafka's IncrementalAlterConfigs operations).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ConfigOp {
    Set {
        name: String,
        value: String,
    },
    /// Back to the broker default.
    Delete {
        name: String,
    },
    /// Adds comma-separated items to a list config (`cleanup.policy`), each once.
    Append {
        name: String,
        value: String,
    },
    /// Removes comma-separated items from a list config.
    Subtract {
        name: String,
        value: String,
    },
}

/// A change to a topic's config overrides, as a value: the controller applies it to the
/// overrides current when it decides, so concurrent edits do not race, and a request forwarded
/// to the controller carries it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ConfigEdit {
    /// Every override is replaced by these (Kafka's AlterConfigs).
    Replace(BTreeMap<String, String>),
    /// These operations, in order, on the current overrides.
    Apply(Vec<ConfigOp>),
}

impl ConfigEdit {
    /// The overrides after the edit. Unknown names are refused; values are checked by
    /// [`validate`] afterwards.
    pub fn apply(
        &self,
        broker_defaults: &BTreeMap<String, String>,
        current: &BTreeMap<String, String>,
    ) -> Result<BTreeMap<String, String>, TopicConfigError> {
        let ops = match self {
            ConfigEdit::Replace(configs) => return Ok(configs.clone()),
            ConfigEdit::Apply(ops) => ops,
        };
        let mut configs = current.clone();
        for op in ops {
            let name = match op {
                ConfigOp::Set { name, .. }
                | ConfigOp::Delete { name }
                | ConfigOp::Append { name, .. }
                | ConfigOp::Subtract { name, .. } => name,
            };
            if !is_known(name) {
                return Err(unknown_config(name));
            }
            // The list in force: the override, else the broker's default, else Kafka's.
            let items = |configs: &BTreeMap<String, String>| -> Vec<String> {
                describe(broker_defaults, configs)
                    .into_iter()
                    .find(|e| e.name == *name)
                    .map(|e| e.value.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
                    .unwrap_or_default()
            };
            match op {
                ConfigOp::Set { value, .. } => {
                    configs.insert(name.clone(), value.clone());
                }
                ConfigOp::Delete { .. } => {
                    configs.remove(name);
                }
                ConfigOp::Append { value, .. } => {
                    let mut list = items(&configs);
                    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                        if !list.iter().any(|i| i == item) {
                            list.push(item.to_string());
                        }
                    }
                    configs.insert(name.clone(), list.join(","));
                }
                ConfigOp::Subtract { value, .. } => {
                    let remove: Vec<&str> = value.split(',').map(str::trim).collect();
                    let list: Vec<String> =
                        items(&configs).into_iter().filter(|i| !remove.contains(&i.as_str())).collect();
                    configs.insert(name.clone(), list.join(","));
                }
            }
        }
        Ok(configs)
    }
}

/// A broker-interpreted topic config's value: the topic's override, else the broker's default.
fn override_or_default<'a>(
    broker_defaults: &'a BTreeMap<String, String>,
    overrides: &'a BTreeMap<String, String>,
    name: &str,
) -> Option<&'a String> {
    overrides.get(name).or_else(|| broker_defaults.get(name))
}

/// `compression.type` of a topic.
pub fn compression(
    broker_defaults: &BTreeMap<String, String>,
    overrides: &BTreeMap<String, String>,
) -> TopicCompression {
    override_or_default(broker_defaults, overrides, "compression.type")
        .and_then(|v| TopicCompression::parse(v))
        .unwrap_or(TopicCompression::Producer)
}

fn parse_bool(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

/// A topic's `leader.replication.throttled.replicas` and
/// `follower.replication.throttled.replicas`.
pub fn throttled_replicas(
    broker_defaults: &BTreeMap<String, String>,
    overrides: &BTreeMap<String, String>,
) -> (crate::throttle::ThrottledReplicas, crate::throttle::ThrottledReplicas) {
    let parse = |name: &str| {
        override_or_default(broker_defaults, overrides, name)
            .and_then(|v| crate::throttle::ThrottledReplicas::parse(v))
            .unwrap_or_default()
    };
    (parse(crate::throttle::LEADER_REPLICAS), parse(crate::throttle::FOLLOWER_REPLICAS))
}

/// `unclean.leader.election.enable` of a topic: may a replica outside the ISR lead when no
/// in-sync replica is alive (losing what only the ISR had)?
pub(crate) fn unclean_leader_election(
    broker_defaults: &BTreeMap<String, String>,
    overrides: &BTreeMap<String, String>,
) -> bool {
    override_or_default(broker_defaults, overrides, "unclean.leader.election.enable")
        .and_then(|v| parse_bool(v))
        .unwrap_or(false)
}

/// `min.insync.replicas` of a topic.
pub fn min_insync_replicas(broker_defaults: &BTreeMap<String, String>, overrides: &BTreeMap<String, String>) -> i64 {
    override_or_default(broker_defaults, overrides, "min.insync.replicas")
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(1)
}

/// Every topic config with its effective value and source, sorted by name.
pub fn describe(broker_defaults: &BTreeMap<String, String>, overrides: &BTreeMap<String, String>) -> Vec<ConfigEntry> {
    let effective = log_config(broker_defaults, overrides).unwrap_or_default().to_properties();
    let mut entries = Vec::new();
    for (name, value) in effective {
        let source = source_of(&name, broker_defaults, overrides);
        // flush.messages/flush.ms are implied by flush.policy unless set; report what is in force.
        let value = overrides.get(&name).cloned().unwrap_or(value);
        entries.push(ConfigEntry { name, value, source });
    }
    for name in DEPRECATED_TOPIC_CONFIGS.iter().filter(|n| overrides.contains_key(**n)) {
        entries.push(ConfigEntry {
            name: name.to_string(),
            value: overrides.get(*name).cloned().unwrap_or_default(),
            source: ConfigSource::Topic,
        });
    }
    for (name, default) in BROKER_TOPIC_CONFIGS {
        let value =
            override_or_default(broker_defaults, overrides, name).cloned().unwrap_or_else(|| default.to_string());
        entries.push(ConfigEntry {
            name: name.to_string(),
            value,
            source: source_of(name, broker_defaults, overrides),
        });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    entries
}

fn source_of(
    name: &str,
    broker_defaults: &BTreeMap<String, String>,
    overrides: &BTreeMap<String, String>,
) -> ConfigSource {
    if overrides.contains_key(name) {
        ConfigSource::Topic
    } else if broker_defaults.contains_key(name) {
        ConfigSource::BrokerDefault
    } else {
        ConfigSource::Default
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_defaults_overlay_the_static_ones_cluster_then_broker() {
        let static_defaults = BTreeMap::from([("retention.ms".to_string(), "1000".to_string())]);
        let mut dynamic = BTreeMap::new();
        dynamic.insert(
            String::new(),
            BTreeMap::from([
                ("log.retention.ms".to_string(), "2000".to_string()),
                ("log.segment.bytes".to_string(), "4096".to_string()),
                ("unclean.leader.election.enable".to_string(), "true".to_string()),
                ("follower.replication.throttled.rate".to_string(), "10".to_string()),
            ]),
        );
        dynamic.insert("2".to_string(), BTreeMap::from([("log.retention.ms".to_string(), "3000".to_string())]));
        let on_one = effective_defaults(&static_defaults, &dynamic, Some(1));
        assert_eq!(on_one.get("retention.ms").map(String::as_str), Some("2000"));
        assert_eq!(on_one.get("segment.bytes").map(String::as_str), Some("4096"));
        assert_eq!(on_one.get("unclean.leader.election.enable").map(String::as_str), Some("true"));
        assert_eq!(on_one.len(), 3, "a rate is not a topic default: {on_one:?}");
        let on_two = effective_defaults(&static_defaults, &dynamic, Some(2));
        assert_eq!(on_two.get("retention.ms").map(String::as_str), Some("3000"), "the broker's own wins");
        assert_eq!(effective_defaults(&static_defaults, &BTreeMap::new(), None), static_defaults);
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn layers_apply_in_order() {
        let config = log_config(&map(&[("retention.ms", "1000")]), &map(&[("retention.ms", "2000")])).unwrap();
        assert_eq!(config.retention_ms, 2000);
        let entries = describe(&map(&[("segment.bytes", "1048576")]), &map(&[("retention.ms", "2000")]));
        let get = |n: &str| entries.iter().find(|e| e.name == n).unwrap().clone();
        assert_eq!(get("retention.ms").source, ConfigSource::Topic);
        assert_eq!(get("segment.bytes").source, ConfigSource::BrokerDefault);
        assert_eq!(get("segment.bytes").value, "1048576");
        assert_eq!(get("cleanup.policy").source, ConfigSource::Default);
        assert_eq!(get("min.insync.replicas").value, "1");
    }

    #[test]
    fn errors_name_the_setting() {
        let err = validate(&map(&[("retention.mss", "1")])).unwrap_err();
        assert_eq!(err.name.as_deref(), Some("retention.mss"));
        let err = validate(&map(&[("min.insync.replicas", "0")])).unwrap_err();
        assert_eq!(err.name.as_deref(), Some("min.insync.replicas"));
        let err = validate(&map(&[("cleanup.policy", "shred")])).unwrap_err();
        assert_eq!(err.name.as_deref(), Some("cleanup.policy"));
        assert!(validate(&map(&[("compression.type", "producer"), ("cleanup.policy", "compact")])).is_ok());
        assert_eq!(
            validate(&map(&[("compression.type", "brotli")])).unwrap_err().name.as_deref(),
            Some("compression.type")
        );
    }

    #[test]
    fn config_edits_apply_in_order_over_the_effective_lists() {
        let current = map(&[("retention.ms", "10")]);
        let edit = ConfigEdit::Apply(vec![
            ConfigOp::Append { name: "cleanup.policy".into(), value: "compact".into() },
            ConfigOp::Set { name: "segment.bytes".into(), value: "100000".into() },
            ConfigOp::Delete { name: "retention.ms".into() },
        ]);
        let after = edit.apply(&BTreeMap::new(), &current).unwrap();
        assert_eq!(after, map(&[("cleanup.policy", "delete,compact"), ("segment.bytes", "100000")]));
        let back =
            ConfigEdit::Apply(vec![ConfigOp::Subtract { name: "cleanup.policy".into(), value: "delete".into() }]);
        assert_eq!(
            back.apply(&BTreeMap::new(), &after).unwrap().get("cleanup.policy").map(String::as_str),
            Some("compact")
        );
        let unknown = ConfigEdit::Apply(vec![ConfigOp::Delete { name: "nope".into() }]);
        assert_eq!(unknown.apply(&BTreeMap::new(), &current).unwrap_err().name.as_deref(), Some("nope"));
        assert_eq!(ConfigEdit::Replace(map(&[])).apply(&BTreeMap::new(), &current).unwrap(), map(&[]));
    }

    #[test]
    fn every_kafka_codec_is_a_topic_compression() {
        for (value, expected) in [
            ("producer", TopicCompression::Producer),
            ("uncompressed", TopicCompression::Codec(Compression::None)),
            ("gzip", TopicCompression::Codec(Compression::Gzip)),
            ("snappy", TopicCompression::Codec(Compression::Snappy)),
            ("lz4", TopicCompression::Codec(Compression::Lz4)),
            ("zstd", TopicCompression::Codec(Compression::Zstd)),
        ] {
            assert!(validate(&map(&[("compression.type", value)])).is_ok(), "{value}");
            assert_eq!(compression(&BTreeMap::new(), &map(&[("compression.type", value)])), expected);
        }
        assert_eq!(
            compression(&map(&[("compression.type", "lz4")]), &BTreeMap::new()),
            TopicCompression::Codec(Compression::Lz4)
        );
    }

    #[test]
    fn deprecated_configs_are_accepted_and_described_without_effect() {
        let overrides = map(&[("message.format.version", "0.10.0.0"), ("message.timestamp.difference.max.ms", "1000")]);
        assert!(validate(&overrides).is_ok());
        assert_eq!(log_config(&BTreeMap::new(), &overrides).unwrap(), LogConfig::default());
        assert_eq!(deprecated_in(&overrides), vec!["message.format.version", "message.timestamp.difference.max.ms"]);
        let entries = describe(&BTreeMap::new(), &overrides);
        let format = entries.iter().find(|e| e.name == "message.format.version").unwrap();
        assert_eq!((format.value.as_str(), format.source), ("0.10.0.0", ConfigSource::Topic));
        assert!(is_known("message.downconversion.enable"));
    }
}
