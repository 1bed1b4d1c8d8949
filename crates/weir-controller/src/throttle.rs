//! Replication throttles (Kafka's KIP-73): bound the bandwidth a reassignment's copying takes,
//! so that moving a partition does not starve producers, consumers and in-sync followers.
//!
//! Two dynamic broker configs, set cluster-wide (resource name `""`) or per broker with
//! IncrementalAlterConfigs (what `kafka-reassign-partitions.sh --throttle` does) or
//! `weir partition reassign --throttle`, and kept in the metadata:
//!
//! - `leader.replication.throttled.rate`: bytes per second a leader sends to throttled
//!   replicas;
//! - `follower.replication.throttled.rate`: bytes per second a follower fetches for its
//!   throttled replicas.
//!
//! A replica is throttled while it is outside the ISR and either a reassignment adds it (the
//! copy of a move), or the topic names it in Kafka's topic configs
//! `leader.replication.throttled.replicas` (partitions whose leader on this broker throttles
//! what it sends) and `follower.replication.throttled.replicas` (replicas on this broker that
//! throttle what they fetch), as `*` or `partition:broker,...` (what `kafka-reassign-partitions.sh
//! --throttle` sets; also useful to throttle a replaced broker's catch-up). In-sync replicas are
//! never throttled, so `acks=all` never waits on a throttle. Like Kafka's quotas, a throttle is
//! a budget over time: once it is spent, throttled replicas get nothing until it refills, while
//! the others carry on.
//!
//! This module holds what the throttles are and how a change of them is decided; the budgets
//! themselves run on each broker (`weir_broker::throttle`).

use std::collections::BTreeMap;

use weir_error::{BrokerError, ErrorKind};
use weir_metadata::{MetadataRecord, MetadataState, PartitionState};

use crate::topic_config::{self, ConfigEdit, ConfigOp};

pub const LEADER_RATE: &str = "leader.replication.throttled.rate";
pub const FOLLOWER_RATE: &str = "follower.replication.throttled.rate";

pub(crate) const LEADER_REPLICAS: &str = "leader.replication.throttled.replicas";
pub(crate) const FOLLOWER_REPLICAS: &str = "follower.replication.throttled.replicas";

/// The replication throttles' rates: dynamic broker configs, as are the topic defaults of
/// [`topic_config::TOPIC_DEFAULT_SETTINGS`] (see [`is_dynamic`]).
pub const DYNAMIC_BROKER_CONFIGS: &[&str] = &[LEADER_RATE, FOLLOWER_RATE];

/// Whether broker config `name` can change while the cluster runs: a replication throttle's
/// rate, or a topic default such as `log.retention.ms` (Kafka's dynamic log configs). The
/// others are static.
pub fn is_dynamic(name: &str) -> bool {
    DYNAMIC_BROKER_CONFIGS.contains(&name) || topic_config::dynamic_topic_default(name).is_some()
}

/// Kafka's default for both rates: no limit.
pub const UNLIMITED: u64 = i64::MAX as u64;

/// A topic's list of throttled replicas.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ThrottledReplicas {
    #[default]
    None,
    All,
    /// (partition, broker) pairs.
    Listed(Vec<(i32, i32)>),
}

impl ThrottledReplicas {
    /// `""`, `*`, or `partition:broker` pairs separated by commas.
    pub fn parse(value: &str) -> Option<ThrottledReplicas> {
        let value = value.trim();
        if value.is_empty() {
            return Some(ThrottledReplicas::None);
        }
        if value == "*" {
            return Some(ThrottledReplicas::All);
        }
        let mut pairs = Vec::new();
        for item in value.split(',') {
            let (partition, broker) = item.trim().split_once(':')?;
            pairs.push((partition.trim().parse().ok()?, broker.trim().parse().ok()?));
        }
        Some(ThrottledReplicas::Listed(pairs))
    }

    pub fn contains(&self, partition: i32, broker: i32) -> bool {
        match self {
            ThrottledReplicas::None => false,
            ThrottledReplicas::All => true,
            ThrottledReplicas::Listed(pairs) => pairs.contains(&(partition, broker)),
        }
    }
}

/// Is `replica` of `partition` throttled: outside the ISR, and added by a reassignment or named
/// by the topic (`listed`, the topic's list for the side asking, and `listed_broker`, the broker
/// its entries must name: the leader for the leader's list, the follower for the follower's)?
pub fn is_throttled(
    partition: &PartitionState,
    index: i32,
    replica: i32,
    listed: &ThrottledReplicas,
    listed_broker: i32,
) -> bool {
    !partition.isr.contains(&replica)
        && (partition.adding_replicas.contains(&replica) || listed.contains(index, listed_broker))
}

/// Checks dynamic broker configs: the rates are byte rates; a topic default must be a value
/// the topic config could take.
pub fn validate(configs: &BTreeMap<String, String>) -> Result<(), BrokerError> {
    for (name, value) in configs {
        if let Some(topic_name) = topic_config::dynamic_topic_default(name) {
            let as_topic = BTreeMap::from([(topic_name.to_string(), value.clone())]);
            topic_config::validate(&as_topic)
                .map_err(|e| BrokerError::new(ErrorKind::InvalidConfig, format!("{name}={value:?}: {}", e.message)))?;
            continue;
        }
        if !is_dynamic(name) {
            return Err(BrokerError::new(
                ErrorKind::InvalidConfig,
                format!(
                    "{name} cannot change while the broker runs: set it in weir.toml or with --set and restart (dynamic \
                     broker configs: {} and the log.* topic defaults such as log.retention.ms)",
                    DYNAMIC_BROKER_CONFIGS.join(", ")
                ),
            ));
        }
        if value.trim().parse::<i64>().map_or(true, |rate| rate < 0) {
            return Err(BrokerError::new(
                ErrorKind::InvalidConfig,
                format!("{name} must be a number of bytes per second (0 or more), not {value:?}"),
            ));
        }
    }
    Ok(())
}

/// The rate `name` has for broker `node`: its own dynamic value, else the cluster-wide one.
pub fn rate_for(dynamic: &BTreeMap<String, BTreeMap<String, String>>, node: i32, name: &str) -> Option<u64> {
    let value = dynamic
        .get(&node.to_string())
        .and_then(|c| c.get(name))
        .or_else(|| dynamic.get("").and_then(|c| c.get(name)))?;
    value.trim().parse::<u64>().ok().filter(|rate| *rate < UNLIMITED)
}

/// Decides a change of the dynamic broker configs of `resource` (`""`: every broker; else a
/// broker id): `edit` applied to its current configs in `state`, then checked. The records are
/// empty when nothing changes (or with `validate_only`).
pub fn decide_alter(
    state: &MetadataState,
    resource: &str,
    validate_only: bool,
    edit: &ConfigEdit,
) -> Result<Vec<MetadataRecord>, BrokerError> {
    if !resource.is_empty() && resource.parse::<i32>().map_or(true, |id| id < 0) {
        return Err(BrokerError::new(
            ErrorKind::InvalidRequest,
            format!("broker resource {resource:?} is neither \"\" (every broker) nor a broker id"),
        ));
    }
    let current = state.broker_configs.get(resource).cloned().unwrap_or_default();
    let configs = match edit {
        ConfigEdit::Replace(configs) => configs.clone(),
        ConfigEdit::Apply(ops) => {
            let mut configs = current.clone();
            for op in ops {
                match op {
                    ConfigOp::Set { name, value } => {
                        configs.insert(name.clone(), value.clone());
                    }
                    ConfigOp::Delete { name } => {
                        configs.remove(name);
                    }
                    ConfigOp::Append { name, .. } | ConfigOp::Subtract { name, .. } => {
                        return Err(BrokerError::new(
                            ErrorKind::InvalidConfig,
                            format!("{name} is no list: only SET and DELETE apply"),
                        ))
                    }
                }
            }
            configs
        }
    };
    validate(&configs)?;
    if validate_only || configs == current {
        return Ok(Vec::new());
    }
    Ok(vec![MetadataRecord::SetBrokerConfigs { resource: resource.to_string(), configs }])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_per_broker_then_cluster_wide_and_validated() {
        let mut dynamic = BTreeMap::new();
        dynamic.insert(String::new(), BTreeMap::from([(LEADER_RATE.to_string(), "100".to_string())]));
        dynamic.insert("2".to_string(), BTreeMap::from([(LEADER_RATE.to_string(), "50".to_string())]));
        assert_eq!(rate_for(&dynamic, 1, LEADER_RATE), Some(100));
        assert_eq!(rate_for(&dynamic, 2, LEADER_RATE), Some(50));
        assert_eq!(rate_for(&dynamic, 1, FOLLOWER_RATE), None);
        let bad = |name: &str, value: &str| validate(&BTreeMap::from([(name.to_string(), value.to_string())])).is_err();
        assert!(bad("num.partitions", "3"), "static configs stay static");
        assert!(bad(LEADER_RATE, "-1"));
        assert!(bad(LEADER_RATE, "fast"));
        assert!(!bad(FOLLOWER_RATE, "10485760"));
        assert!(!bad("log.retention.ms", "3600000"), "topic defaults are dynamic");
        assert!(bad("log.retention.ms", "soon"), "and checked as the topic config would be");
        assert!(!bad("unclean.leader.election.enable", "true"), "dynamic, as in Kafka");
        assert!(bad("unclean.leader.election.enable", "maybe"));
        assert!(is_dynamic("min.insync.replicas") && !is_dynamic("num.partitions"));
    }

    #[test]
    fn throttled_replica_lists_parse_as_kafka_writes_them() {
        assert_eq!(ThrottledReplicas::parse(""), Some(ThrottledReplicas::None));
        assert_eq!(ThrottledReplicas::parse(" * "), Some(ThrottledReplicas::All));
        let listed = ThrottledReplicas::parse("0:1, 0:2,1:3").expect("a list");
        assert!(listed.contains(0, 2) && listed.contains(1, 3) && !listed.contains(1, 1));
        assert_eq!(ThrottledReplicas::parse("0:x"), None);
        assert_eq!(ThrottledReplicas::parse("0"), None);
        let mut partition = PartitionState::new(vec![1, 2]);
        partition.isr = vec![1];
        assert!(is_throttled(&partition, 0, 2, &listed, 2), "listed, out of sync");
        assert!(!is_throttled(&partition, 0, 1, &ThrottledReplicas::All, 1), "in sync: never throttled");
        assert!(!is_throttled(&partition, 0, 2, &ThrottledReplicas::None, 2), "neither listed nor added");
        partition.adding_replicas = vec![2];
        assert!(is_throttled(&partition, 0, 2, &ThrottledReplicas::None, 2), "added by a reassignment");
    }
}
