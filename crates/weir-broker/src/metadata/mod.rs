//! Cluster metadata as a replicated state machine.
//!
//! Every change of topics, partitions or configs is a [`MetadataRecord`]. Records are appended to
//! the metadata log ([`MetadataLog`]) and then applied, in log order, to [`MetadataState`];
//! nothing else mutates the state. On one node the log is a local, fsynced partition log; in a
//! cluster the same records will be the entries of an openraft log whose leader is the
//! controller, so only the transport of the log changes. Applying a record is deterministic and
//! cannot fail: validation happens before a record is proposed.

mod log;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use self::log::{MetadataLog, MetadataLogError};

/// One change to the cluster's metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MetadataRecord {
    /// The first record of a new cluster.
    InitCluster {
        cluster_id: String,
    },
    CreateTopic {
        name: String,
        id: Uuid,
        partitions: i32,
        configs: BTreeMap<String, String>,
        internal: bool,
    },
    DeleteTopic {
        name: String,
        id: Uuid,
    },
    /// Grows a topic to `partitions` partitions (never shrinks).
    CreatePartitions {
        name: String,
        id: Uuid,
        partitions: i32,
    },
    /// Replaces the topic's config overrides with `configs`.
    SetTopicConfigs {
        name: String,
        id: Uuid,
        configs: BTreeMap<String, String>,
    },
    /// Reserves producer ids `[first, first + count)` for InitProducerId; ids are never reused.
    AllocateProducerIds {
        first: i64,
        count: i64,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopicMetadata {
    pub name: String,
    pub id: Uuid,
    pub partitions: i32,
    /// Overrides only; defaults come from the broker config.
    pub configs: BTreeMap<String, String>,
    pub internal: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetadataState {
    pub cluster_id: String,
    pub topics: BTreeMap<String, TopicMetadata>,
    /// Offset of the last applied record; -1 before the first.
    pub applied_offset: i64,
    /// The first producer id not yet reserved.
    #[serde(default)]
    pub next_producer_id: i64,
}

impl MetadataState {
    pub fn new() -> MetadataState {
        MetadataState { applied_offset: -1, ..Default::default() }
    }

    pub fn topic(&self, name: &str) -> Option<&TopicMetadata> {
        self.topics.get(name)
    }

    pub fn topic_by_id(&self, id: Uuid) -> Option<&TopicMetadata> {
        self.topics.values().find(|t| t.id == id)
    }

    /// Applies the record at `offset`. A record that does not fit the state (which validation
    /// prevents) is skipped with a warning, so every replica skips it alike.
    pub fn apply(&mut self, offset: i64, record: &MetadataRecord) {
        self.applied_offset = offset;
        match record {
            MetadataRecord::InitCluster { cluster_id } => {
                if self.cluster_id.is_empty() {
                    self.cluster_id = cluster_id.clone();
                }
            }
            MetadataRecord::CreateTopic { name, id, partitions, configs, internal } => {
                if self.topics.contains_key(name) {
                    tracing::warn!(offset, topic = %name, "metadata: skipping create of an existing topic");
                    return;
                }
                self.topics.insert(
                    name.clone(),
                    TopicMetadata {
                        name: name.clone(),
                        id: *id,
                        partitions: *partitions,
                        configs: configs.clone(),
                        internal: *internal,
                    },
                );
            }
            MetadataRecord::DeleteTopic { name, id } => {
                if self.topics.get(name).is_some_and(|t| t.id == *id) {
                    self.topics.remove(name);
                } else {
                    tracing::warn!(offset, topic = %name, "metadata: skipping delete of an unknown topic");
                }
            }
            MetadataRecord::CreatePartitions { name, id, partitions } => match self.topics.get_mut(name) {
                Some(topic) if topic.id == *id && *partitions >= topic.partitions => topic.partitions = *partitions,
                _ => tracing::warn!(offset, topic = %name, "metadata: skipping invalid partition increase"),
            },
            MetadataRecord::SetTopicConfigs { name, id, configs } => match self.topics.get_mut(name) {
                Some(topic) if topic.id == *id => topic.configs = configs.clone(),
                _ => tracing::warn!(offset, topic = %name, "metadata: skipping configs of an unknown topic"),
            },
            MetadataRecord::AllocateProducerIds { first, count } => {
                if *first >= self.next_producer_id && *count > 0 {
                    self.next_producer_id = first.saturating_add(*count);
                } else {
                    tracing::warn!(offset, first, "metadata: skipping an overlapping producer id block");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_is_deterministic_and_skips_invalid_records() {
        let id = Uuid::new_v4();
        let records = [
            MetadataRecord::InitCluster { cluster_id: "c1".into() },
            MetadataRecord::CreateTopic {
                name: "t".into(),
                id,
                partitions: 2,
                configs: BTreeMap::new(),
                internal: false,
            },
            MetadataRecord::CreatePartitions { name: "t".into(), id, partitions: 1 }, // shrink: skipped
            MetadataRecord::CreatePartitions { name: "t".into(), id, partitions: 4 },
            MetadataRecord::SetTopicConfigs {
                name: "t".into(),
                id,
                configs: [("retention.ms".to_string(), "10".to_string())].into(),
            },
            MetadataRecord::DeleteTopic { name: "t".into(), id: Uuid::new_v4() }, // wrong id: skipped
        ];
        let mut a = MetadataState::new();
        let mut b = MetadataState::new();
        for (i, r) in records.iter().enumerate() {
            a.apply(i as i64, r);
            b.apply(i as i64, r);
        }
        assert_eq!(a, b);
        let topic = a.topic("t").unwrap();
        assert_eq!(topic.partitions, 4);
        assert_eq!(topic.configs.get("retention.ms").map(String::as_str), Some("10"));
        assert_eq!(a.applied_offset, 5);
        a.apply(6, &MetadataRecord::DeleteTopic { name: "t".into(), id });
        assert!(a.topic("t").is_none());
    }
}
