//! The topic commands over Kafka's admin requests: CreateTopics, Metadata, DescribeConfigs,
//! ListOffsets, DescribeLogDirs, DeleteTopics, IncrementalAlterConfigs, CreatePartitions.
//! Each answer is built as the admin API's type of the same command.

use std::collections::BTreeMap;

use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::describe_log_dirs_request::DescribableLogDirTopic;
use kafka_protocol::messages::incremental_alter_configs_request::{AlterConfigsResource, AlterableConfig};
use kafka_protocol::messages::{
    CreatePartitionsRequest, CreateTopicsRequest, DeleteTopicsRequest, DescribeConfigsRequest, DescribeLogDirsRequest,
    IncrementalAlterConfigsRequest,
};
use kafka_protocol::protocol::StrBytes;
use weir_admin::api::{
    AlterConfigs, ConfigEntry, Configs, CreatePartitions, CreateTopic, CreatedTopic, DeletedTopic, PartitionCount,
    PartitionInfo, TopicDescription, TopicList, TopicSummary,
};
use weir_client::Cluster;

use super::{check, failure, layout_of, list_offsets, topic_layout, topic_name, REQUEST_TIMEOUT_MS};
use super::{EARLIEST, LATEST};
use crate::admin_cli::topic::TopicSource;

/// DescribeConfigs and IncrementalAlterConfigs' resource type of a topic.
const RESOURCE_TOPIC: i8 = 2;
/// IncrementalAlterConfigs' operations.
const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;

/// The topic commands' answers, asked over the Kafka protocol.
pub struct KafkaTopics {
    cluster: Cluster,
}

impl KafkaTopics {
    pub fn connect(bootstrap: &str) -> anyhow::Result<KafkaTopics> {
        Ok(KafkaTopics { cluster: super::connect(bootstrap)? })
    }

    pub fn from_cluster(cluster: Cluster) -> KafkaTopics {
        KafkaTopics { cluster }
    }

    pub fn into_cluster(self) -> Cluster {
        self.cluster
    }

    /// The value in force of one config of `topic`.
    pub fn config(&mut self, topic: &str, name: &str) -> anyhow::Result<Option<String>> {
        Ok(self.configs(topic)?.into_iter().find(|c| c.name == name).map(|c| c.value))
    }

    /// Every config of `topic` in force, sorted by name, named by source as the admin API does.
    fn configs(&mut self, topic: &str) -> anyhow::Result<Vec<ConfigEntry>> {
        let request = DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
            .with_resource_type(RESOURCE_TOPIC)
            .with_resource_name(StrBytes::from_string(topic.to_string()))
            .with_configuration_keys(None)]);
        let (_, response) = self.cluster.any().send(1..=4, &request).map_err(failure)?;
        let mut out = Vec::new();
        for result in &response.results {
            check(result.error_code, result.error_message.as_ref(), || format!("configs of topic '{topic}'"))?;
            for c in &result.configs {
                out.push(ConfigEntry {
                    name: c.name.to_string(),
                    value: c.value.as_ref().map(|v| v.to_string()).unwrap_or_default(),
                    source: source_name(c.config_source).to_string(),
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Bytes on disk of each partition of `topic`, as its leader reports them.
    fn sizes(&mut self, topic: &str, leaders: &BTreeMap<i32, Vec<i32>>) -> anyhow::Result<BTreeMap<i32, u64>> {
        let mut sizes = BTreeMap::new();
        for (&leader, partitions) in leaders {
            let request = DescribeLogDirsRequest::default().with_topics(Some(vec![DescribableLogDirTopic::default()
                .with_topic(topic_name(topic))
                .with_partitions(partitions.clone())]));
            let (_, response) = self.cluster.send_to(leader, 1..=4, &request).map_err(failure)?;
            for dir in &response.results {
                for p in dir.topics.iter().filter(|t| t.name.as_str() == topic).flat_map(|t| &t.partitions) {
                    if partitions.contains(&p.partition_index) {
                        sizes.insert(p.partition_index, u64::try_from(p.partition_size).unwrap_or(0));
                    }
                }
            }
        }
        Ok(sizes)
    }
}

/// The admin API's name of a DescribeConfigs source.
fn source_name(source: i8) -> &'static str {
    match source {
        1 => "topic",
        2..=4 => "broker",
        _ => "default",
    }
}

impl TopicSource for KafkaTopics {
    fn create(&mut self, request: &CreateTopic) -> anyhow::Result<CreatedTopic> {
        if request.elastic {
            anyhow::bail!(
                "Kafka's CreateTopics cannot make an elastic topic: leave out --bootstrap (Weir's admin API)"
            );
        }
        let topic = CreatableTopic::default()
            .with_name(topic_name(&request.name))
            .with_num_partitions(request.partitions.unwrap_or(-1))
            .with_replication_factor(request.replication_factor.unwrap_or(-1))
            .with_configs(
                request
                    .configs
                    .iter()
                    .map(|(n, v)| {
                        CreatableTopicConfig::default()
                            .with_name(StrBytes::from_string(n.clone()))
                            .with_value(Some(StrBytes::from_string(v.clone())))
                    })
                    .collect(),
            );
        let kafka_request = CreateTopicsRequest::default()
            .with_topics(vec![topic])
            .with_timeout_ms(REQUEST_TIMEOUT_MS)
            .with_validate_only(request.validate_only);
        // v5 answers the partitions, replication factor and configs the topic got.
        let (_, response) = self.cluster.any().send(5..=7, &kafka_request).map_err(failure)?;
        let Some(created) = response.topics.first() else {
            anyhow::bail!("the broker answered CreateTopics without the topic");
        };
        check(created.error_code, created.error_message.as_ref(), || format!("creating topic '{}'", request.name))?;
        let mut configs: Vec<ConfigEntry> = created
            .configs
            .iter()
            .flatten()
            .map(|c| ConfigEntry {
                name: c.name.to_string(),
                value: c.value.as_ref().map(|v| v.to_string()).unwrap_or_default(),
                source: source_name(c.config_source).to_string(),
            })
            .collect();
        configs.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(CreatedTopic {
            name: request.name.clone(),
            id: created.topic_id.to_string(),
            partitions: created.num_partitions,
            replication_factor: created.replication_factor,
            configs,
            physical_partitions: None,
            validate_only: request.validate_only,
        })
    }

    fn list(&mut self) -> anyhow::Result<TopicList> {
        let metadata = self.cluster.metadata(None).map_err(failure)?;
        let mut topics: Vec<TopicSummary> = metadata
            .topics
            .iter()
            .filter(|t| t.error_code == 0)
            .filter_map(|t| {
                Some(TopicSummary {
                    name: t.name.as_ref()?.to_string(),
                    id: t.topic_id.to_string(),
                    partitions: t.partitions.len() as i32,
                    internal: t.is_internal,
                })
            })
            .collect();
        topics.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(TopicList { topics })
    }

    fn describe(&mut self, name: &str) -> anyhow::Result<TopicDescription> {
        let layout = topic_layout(&mut self.cluster, name)?;
        let led: Vec<i32> = layout.partitions.iter().filter(|p| p.leader >= 0).map(|p| p.partition).collect();
        let starts: BTreeMap<i32, i64> =
            list_offsets(&mut self.cluster, &layout, &led, EARLIEST)?.into_iter().collect();
        let ends: BTreeMap<i32, i64> = list_offsets(&mut self.cluster, &layout, &led, LATEST)?.into_iter().collect();
        let mut leaders: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
        for p in layout.partitions.iter().filter(|p| p.leader >= 0) {
            leaders.entry(p.leader).or_default().push(p.partition);
        }
        let sizes = self.sizes(name, &leaders)?;
        let configs = self.configs(name)?;
        let partitions: Vec<PartitionInfo> = layout
            .partitions
            .iter()
            .map(|p| {
                let high_watermark = ends.get(&p.partition).copied().unwrap_or(-1);
                PartitionInfo {
                    partition: p.partition,
                    leader: p.leader,
                    leader_epoch: p.leader_epoch,
                    replicas: p.replicas.clone(),
                    isr: p.isr.clone(),
                    log_start_offset: starts.get(&p.partition).copied().unwrap_or(-1),
                    high_watermark,
                    // Kafka's protocol tells clients no further than the high watermark: the
                    // records past it are not replicated yet, and only the admin API shows them.
                    log_end_offset: high_watermark,
                    size_bytes: sizes.get(&p.partition).copied().unwrap_or(0),
                    // Followers' positions are the leader's to know; the protocol tells
                    // clients none (the table prints `-`).
                    replica_lags: Vec::new(),
                    remote: None,
                    bytes_in_per_sec: 0.0,
                    bytes_out_per_sec: 0.0,
                }
            })
            .collect();
        Ok(TopicDescription {
            name: layout.name,
            id: layout.id,
            internal: layout.internal,
            replication_factor: layout.partitions.first().map_or(0, |p| p.replicas.len() as i16),
            size_bytes: partitions.iter().map(|p| p.size_bytes).sum(),
            partitions,
            configs,
            elastic: None,
        })
    }

    fn delete(&mut self, name: &str) -> anyhow::Result<DeletedTopic> {
        let layout = topic_layout(&mut self.cluster, name)?;
        let request =
            DeleteTopicsRequest::default().with_topic_names(vec![topic_name(name)]).with_timeout_ms(REQUEST_TIMEOUT_MS);
        let (_, response) = self.cluster.any().send(1..=5, &request).map_err(failure)?;
        for r in &response.responses {
            check(r.error_code, r.error_message.as_ref(), || format!("deleting topic '{name}'"))?;
        }
        Ok(DeletedTopic { name: name.to_string(), id: layout.id })
    }

    fn alter_configs(&mut self, name: &str, request: &AlterConfigs) -> anyhow::Result<Configs> {
        // An unknown topic is named as such before anything is asked to change.
        let _ = topic_layout(&mut self.cluster, name)?;
        let edits = request
            .set
            .iter()
            .map(|(n, v)| (n, OP_SET, Some(v)))
            .chain(request.delete.iter().map(|n| (n, OP_DELETE, None)))
            .map(|(n, op, v)| {
                AlterableConfig::default()
                    .with_name(StrBytes::from_string(n.clone()))
                    .with_config_operation(op)
                    .with_value(v.map(|v| StrBytes::from_string(v.clone())))
            })
            .collect();
        let kafka_request = IncrementalAlterConfigsRequest::default()
            .with_resources(vec![AlterConfigsResource::default()
                .with_resource_type(RESOURCE_TOPIC)
                .with_resource_name(StrBytes::from_string(name.to_string()))
                .with_configs(edits)])
            .with_validate_only(request.validate_only);
        let (_, response) = self.cluster.any().send(0..=1, &kafka_request).map_err(failure)?;
        for r in &response.responses {
            check(r.error_code, r.error_message.as_ref(), || format!("altering the configs of topic '{name}'"))?;
        }
        Ok(Configs { configs: self.configs(name)? })
    }

    fn create_partitions(&mut self, name: &str, request: &CreatePartitions) -> anyhow::Result<PartitionCount> {
        let kafka_request = CreatePartitionsRequest::default()
            .with_topics(vec![CreatePartitionsTopic::default().with_name(topic_name(name)).with_count(request.count)])
            .with_timeout_ms(REQUEST_TIMEOUT_MS)
            .with_validate_only(request.validate_only);
        let (_, response) = self.cluster.any().send(0..=3, &kafka_request).map_err(failure)?;
        for r in &response.results {
            check(r.error_code, r.error_message.as_ref(), || format!("adding partitions to topic '{name}'"))?;
        }
        let metadata = self.cluster.metadata(Some(&[name.to_string()])).map_err(failure)?;
        let partitions =
            if request.validate_only { request.count } else { layout_of(&metadata, name)?.partitions.len() as i32 };
        Ok(PartitionCount { name: name.to_string(), partitions, validate_only: request.validate_only })
    }
}
