//! The group commands over Kafka's group requests: ListGroups (every broker), DescribeGroups,
//! OffsetFetch, ListOffsets, OffsetCommit (a standalone commit, as `kafka-consumer-groups.sh
//! --reset-offsets` does), DeleteGroups and OffsetDelete, each at the group's coordinator.
//!
//! What only the admin API knows is left out, and the docs say so: the RocketMQ consumers
//! connected to a group. Its settings are read with DescribeConfigs (KIP-848's GROUP
//! resource) and changed only through the admin API.

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::describe_share_group_offsets_request::DescribeShareGroupOffsetsRequestGroup;
use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
use kafka_protocol::messages::offset_delete_request::{OffsetDeleteRequestPartition, OffsetDeleteRequestTopic};
use kafka_protocol::messages::{
    DeleteGroupsRequest, DescribeConfigsRequest, DescribeGroupsRequest, DescribeShareGroupOffsetsRequest, GroupId,
    ListGroupsRequest, OffsetCommitRequest, OffsetDeleteRequest, OffsetFetchRequest, ShareGroupDescribeRequest,
};
use kafka_protocol::protocol::StrBytes;
use weir_admin::api::{
    AlterConfigs, ConfigEntry, Configs, CreateGroup, CreatedGroup, DeletedGroup, DeletedOffsets, GroupDescription,
    GroupList, GroupMember, GroupOffset, GroupSummary, OffsetChange, ResendDeadLetters, ResentDeadLetters,
    ResetOffsets, ResetOffsetsResult, ResetTo, TopicPartitions, TopicSelector,
};
use weir_client::Cluster;

use super::{check, codes, failure, list_offsets, topic_layout, topic_name, EARLIEST, LATEST};
use crate::admin_cli::group::GroupSource;
use crate::admin_cli::ApiFailure;

/// DescribeConfigs' resource type of a group (KIP-848) and the source of a group's own setting.
const RESOURCE_GROUP: i8 = 32;
const SOURCE_DYNAMIC_GROUP: i8 = 8;

/// Why group settings need the admin API.
const SETTINGS_NEED_ADMIN: &str = "a group's settings (consume.fifo, max.delivery.attempts, retry.backoff) are \
     Weir metadata that only the admin HTTP API changes; run it with --admin instead of --bootstrap";

pub struct KafkaGroups {
    cluster: Cluster,
}

fn group_id(group: &str) -> GroupId {
    GroupId(StrBytes::from_string(group.to_string()))
}

impl KafkaGroups {
    pub fn connect(bootstrap: &str) -> anyhow::Result<KafkaGroups> {
        Ok(KafkaGroups { cluster: super::connect(bootstrap)? })
    }

    /// The group's committed offsets: (topic, partition) → (offset, metadata).
    fn committed(&mut self, coordinator: i32, group: &str) -> anyhow::Result<BTreeMap<(String, i32), (i64, String)>> {
        let request = OffsetFetchRequest::default().with_group_id(group_id(group)).with_topics(None);
        let (_, response) = self.cluster.send_to(coordinator, 2..=7, &request).map_err(failure)?;
        check(response.error_code, None, || format!("offsets of group '{group}'"))?;
        let mut out = BTreeMap::new();
        for t in &response.topics {
            for p in t.partitions.iter().filter(|p| p.error_code == 0 && p.committed_offset >= 0) {
                let metadata = p.metadata.as_ref().map(|m| m.to_string()).unwrap_or_default();
                out.insert((t.name.to_string(), p.partition_index), (p.committed_offset, metadata));
            }
        }
        Ok(out)
    }

    /// A share group's members with their epochs and assignments (ShareGroupDescribe), and each
    /// partition's start offset (DescribeShareGroupOffsets) as its committed offset; returns
    /// the group and assignment epochs.
    fn share(
        &mut self,
        coordinator: i32,
        group: &str,
        committed: &mut BTreeMap<(String, i32), (i64, String)>,
        members: &mut Vec<GroupMember>,
    ) -> anyhow::Result<(i32, i32)> {
        let request = ShareGroupDescribeRequest::default().with_group_ids(vec![group_id(group)]);
        let (_, response) = self.cluster.send_to(coordinator, 1..=1, &request).map_err(failure)?;
        let Some(described) = response.groups.into_iter().next() else {
            anyhow::bail!("the coordinator answered ShareGroupDescribe without the group");
        };
        check(described.error_code, described.error_message.as_ref(), || format!("share group '{group}'"))?;
        members.clear();
        for m in described.members {
            members.push(GroupMember {
                member_id: m.member_id.to_string(),
                member_epoch: Some(m.member_epoch),
                client_id: m.client_id.to_string(),
                client_host: m.client_host.to_string(),
                assignment: m
                    .assignment
                    .topic_partitions
                    .iter()
                    .map(|t| TopicPartitions { topic: t.topic_name.to_string(), partitions: t.partitions.clone() })
                    .collect(),
                ..GroupMember::default()
            });
        }
        let request = DescribeShareGroupOffsetsRequest::default().with_groups(vec![
            DescribeShareGroupOffsetsRequestGroup::default().with_group_id(group_id(group)).with_topics(None),
        ]);
        let (_, response) = self.cluster.send_to(coordinator, 0..=0, &request).map_err(failure)?;
        for g in &response.groups {
            for t in &g.topics {
                for p in t.partitions.iter().filter(|p| p.error_code == 0 && p.start_offset >= 0) {
                    committed.insert((t.topic_name.to_string(), p.partition_index), (p.start_offset, String::new()));
                }
            }
        }
        Ok((described.group_epoch, described.assignment_epoch))
    }

    /// The group's settings in force (DescribeConfigs of KIP-848's GROUP resource); none from a
    /// broker that has no such resource.
    fn settings(&mut self, group: &str) -> anyhow::Result<Vec<ConfigEntry>> {
        let request = DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
            .with_resource_type(RESOURCE_GROUP)
            .with_resource_name(StrBytes::from_string(group.to_string()))
            .with_configuration_keys(None)]);
        let (_, response) = self.cluster.any().send(1..=4, &request).map_err(failure)?;
        let mut out = Vec::new();
        for result in response.results.iter().filter(|r| r.error_code == 0) {
            for c in &result.configs {
                out.push(ConfigEntry {
                    name: c.name.to_string(),
                    value: c.value.as_ref().map(|v| v.to_string()).unwrap_or_default(),
                    source: if c.config_source == SOURCE_DYNAMIC_GROUP { "group" } else { "default" }.to_string(),
                });
            }
        }
        Ok(out)
    }

    /// Each partition's (log start, high watermark) of `topics`, from their leaders.
    fn bounds(&mut self, topics: &BTreeSet<String>) -> anyhow::Result<BTreeMap<(String, i32), (i64, i64)>> {
        let mut out = BTreeMap::new();
        for topic in topics {
            let layout = match topic_layout(&mut self.cluster, topic) {
                Ok(layout) => layout,
                // A topic deleted since the group committed: its rows keep no high watermark.
                Err(e) if crate::admin_cli::failure_code(&e) == Some("UNKNOWN_TOPIC_OR_PARTITION") => continue,
                Err(e) => return Err(e),
            };
            let led: Vec<i32> = layout.partitions.iter().filter(|p| p.leader >= 0).map(|p| p.partition).collect();
            let starts: BTreeMap<i32, i64> =
                list_offsets(&mut self.cluster, &layout, &led, EARLIEST)?.into_iter().collect();
            for (p, hw) in list_offsets(&mut self.cluster, &layout, &led, LATEST)? {
                out.insert((topic.clone(), p), (starts.get(&p).copied().unwrap_or(0), hw));
            }
        }
        Ok(out)
    }

    /// The partitions `selectors` name, checked to exist.
    fn selected(&mut self, selectors: &[TopicSelector]) -> anyhow::Result<BTreeSet<(String, i32)>> {
        let mut out = BTreeSet::new();
        for selector in selectors {
            let (topic, wanted) = match selector {
                TopicSelector::All(topic) => (topic, None),
                TopicSelector::Some { topic, partitions } => (topic, Some(partitions)),
            };
            let layout = topic_layout(&mut self.cluster, topic)?;
            let exists = |p: i32| layout.partitions.iter().any(|l| l.partition == p);
            match wanted {
                None => out.extend(layout.partitions.iter().map(|l| (topic.clone(), l.partition))),
                Some(partitions) => {
                    for &p in partitions {
                        if !exists(p) {
                            return Err(ApiFailure {
                                code: "UNKNOWN_TOPIC_OR_PARTITION".into(),
                                message: format!("topic '{topic}' has no partition {p}"),
                            }
                            .into());
                        }
                        out.insert((topic.clone(), p));
                    }
                }
            }
        }
        Ok(out)
    }
}

/// A member's assignment, decoded as the admin API does (consumer groups only).
fn assignment_of(protocol_type: &str, bytes: &bytes::Bytes) -> Vec<TopicPartitions> {
    if protocol_type != "consumer" {
        return Vec::new();
    }
    super::member::assigned_partitions(bytes)
        .into_iter()
        .map(|(topic, partitions)| TopicPartitions { topic, partitions })
        .collect()
}

fn unknown_group(group: &str) -> anyhow::Error {
    ApiFailure { code: "GROUP_ID_NOT_FOUND".into(), message: format!("group '{group}' does not exist") }.into()
}

impl GroupSource for KafkaGroups {
    fn list(&mut self, states: &[String]) -> anyhow::Result<GroupList> {
        let mut groups: BTreeMap<String, GroupSummary> = BTreeMap::new();
        // Each coordinator lists its own groups, as Kafka's ListGroups does.
        for broker in self.cluster.broker_ids() {
            let (_, response) = self.cluster.send_to(broker, 0..=4, &ListGroupsRequest::default()).map_err(failure)?;
            check(response.error_code, None, || format!("listing the groups of broker {broker}"))?;
            for g in response.groups {
                let summary = GroupSummary {
                    group_id: g.group_id.to_string(),
                    state: g.group_state.to_string(),
                    protocol_type: g.protocol_type.to_string(),
                };
                groups.insert(summary.group_id.clone(), summary);
            }
        }
        let wanted = |g: &GroupSummary| states.is_empty() || states.iter().any(|s| s.eq_ignore_ascii_case(&g.state));
        Ok(GroupList { groups: groups.into_values().filter(wanted).collect() })
    }

    fn describe(&mut self, group: &str) -> anyhow::Result<GroupDescription> {
        let coordinator = self.cluster.coordinator(group).map_err(failure)?;
        let request = DescribeGroupsRequest::default().with_groups(vec![group_id(group)]);
        let (_, response) = self.cluster.send_to(coordinator, 0..=5, &request).map_err(failure)?;
        let Some(described) = response.groups.into_iter().next() else {
            anyhow::bail!("the coordinator answered DescribeGroups without the group");
        };
        check(described.error_code, described.error_message.as_ref(), || format!("group '{group}'"))?;
        let mut committed = self.committed(coordinator, group)?;
        if described.group_state.as_str() == "Dead" && committed.is_empty() {
            return Err(unknown_group(group));
        }
        let protocol_type = described.protocol_type.to_string();
        // A share group (KIP-932): its members and start offsets from the share group APIs.
        let mut share_members = Vec::new();
        let epochs = if protocol_type == "share" {
            committed.clear();
            Some(self.share(coordinator, group, &mut committed, &mut share_members)?)
        } else {
            None
        };
        let mut offsets: BTreeMap<(String, i32), GroupOffset> = BTreeMap::new();
        let row = |offsets: &mut BTreeMap<(String, i32), GroupOffset>, topic: &str, partition: i32| {
            offsets.entry((topic.to_string(), partition)).or_insert_with(|| GroupOffset {
                topic: topic.to_string(),
                partition,
                committed_offset: None,
                high_watermark: None,
                lag: None,
                member_id: None,
                metadata: None,
                in_flight: None,
            });
        };
        for ((topic, partition), (offset, metadata)) in &committed {
            row(&mut offsets, topic, *partition);
            if let Some(r) = offsets.get_mut(&(topic.clone(), *partition)) {
                r.committed_offset = Some(*offset);
                r.metadata = Some(metadata.clone());
            }
        }
        let mut members = Vec::with_capacity(described.members.len());
        for m in &share_members {
            for tp in &m.assignment {
                for &p in &tp.partitions {
                    row(&mut offsets, &tp.topic, p);
                    if let Some(r) = offsets.get_mut(&(tp.topic.clone(), p)) {
                        r.member_id.get_or_insert_with(|| m.member_id.clone());
                    }
                }
            }
        }
        let classic_members = if epochs.is_some() { Vec::new() } else { described.members };
        members.extend(share_members);
        for m in classic_members {
            let assignment = assignment_of(&protocol_type, &m.member_assignment);
            for tp in &assignment {
                for &p in &tp.partitions {
                    row(&mut offsets, &tp.topic, p);
                    if let Some(r) = offsets.get_mut(&(tp.topic.clone(), p)) {
                        r.member_id = Some(m.member_id.to_string());
                    }
                }
            }
            members.push(GroupMember {
                member_id: m.member_id.to_string(),
                group_instance_id: m.group_instance_id.map(|i| i.to_string()),
                client_id: m.client_id.to_string(),
                client_host: m.client_host.to_string(),
                assignment,
                ..GroupMember::default()
            });
        }
        let topics: BTreeSet<String> = offsets.keys().map(|(t, _)| t.clone()).collect();
        let bounds = self.bounds(&topics)?;
        let mut total_lag = 0;
        for (key, r) in offsets.iter_mut() {
            r.high_watermark = bounds.get(key).map(|&(_, hw)| hw);
            if let (Some(hw), Some(c)) = (r.high_watermark, r.committed_offset) {
                let lag = (hw - c).max(0);
                r.lag = Some(lag);
                total_lag += lag;
            }
        }
        let state = if described.group_state.as_str() == "Dead" {
            "Empty".to_string()
        } else {
            described.group_state.to_string()
        };
        Ok(GroupDescription {
            group_id: group.to_string(),
            state,
            protocol_type,
            protocol: described.protocol_data.to_string(),
            members,
            offsets: offsets.into_values().collect(),
            total_lag,
            configs: self.settings(group)?,
            // DescribeGroups carries no epochs (ConsumerGroupDescribe would; a share group's
            // come from ShareGroupDescribe); the admin API shows them.
            group_epoch: epochs.map(|e| e.0),
            assignment_epoch: epochs.map(|e| e.1),
        })
    }

    fn create(&mut self, _: &CreateGroup) -> anyhow::Result<CreatedGroup> {
        anyhow::bail!("`weir group create`: {SETTINGS_NEED_ADMIN}")
    }

    fn alter_configs(&mut self, _: &str, _: &AlterConfigs) -> anyhow::Result<Configs> {
        anyhow::bail!("`weir group alter`: {SETTINGS_NEED_ADMIN}")
    }

    fn resend_dead_letters(&mut self, _: &str, _: &ResendDeadLetters) -> anyhow::Result<ResentDeadLetters> {
        anyhow::bail!(
            "`weir group resend-dead-letters` needs the admin HTTP API: the broker that leads the dead-letter \
             topic resends them, which no Kafka request asks for; run it with --admin instead of --bootstrap"
        )
    }

    fn reset_offsets(&mut self, group: &str, request: &ResetOffsets) -> anyhow::Result<ResetOffsetsResult> {
        let coordinator = self.cluster.coordinator(group).map_err(failure)?;
        let committed = self.committed(coordinator, group)?;
        let selectors = match &request.topics {
            Some(topics) => topics.clone(),
            None => {
                let topics: BTreeSet<&String> = committed.keys().map(|(t, _)| t).collect();
                if topics.is_empty() {
                    anyhow::bail!("group '{group}' has no committed offsets; name the topics to reset");
                }
                topics.into_iter().map(|t| TopicSelector::All(t.clone())).collect()
            }
        };
        let targets = self.selected(&selectors)?;
        let bounds = self.bounds(&targets.iter().map(|(t, _)| t.clone()).collect())?;
        let mut changes = Vec::with_capacity(targets.len());
        for (topic, partition) in targets {
            let Some(&(start, hw)) = bounds.get(&(topic.clone(), partition)) else {
                anyhow::bail!("{topic}-{partition} has no leader that answers right now; retry shortly");
            };
            let previous = committed.get(&(topic.clone(), partition)).map(|&(o, _)| o);
            let new_offset = match request.to {
                ResetTo::Earliest => start,
                ResetTo::Latest => hw,
                ResetTo::Timestamp(t) if t < 0 => anyhow::bail!("timestamp {t} is negative"),
                ResetTo::Timestamp(t) => {
                    let layout = topic_layout(&mut self.cluster, &topic)?;
                    let found = list_offsets(&mut self.cluster, &layout, &[partition], t)?;
                    // No record that recent: the high watermark, as the admin API answers.
                    found.first().map(|&(_, o)| o).filter(|&o| o >= 0).unwrap_or(hw)
                }
                ResetTo::Offset(n) if n < start || n > hw => anyhow::bail!(
                    "offset {n} is out of range for {topic}-{partition}: valid offsets are {start} to {hw} (the high watermark)"
                ),
                ResetTo::Offset(n) => n,
                ResetTo::ShiftBy(n) => match previous {
                    Some(current) => current.saturating_add(n).clamp(start, hw),
                    None => anyhow::bail!(
                        "group has no committed offset for {topic}-{partition} to shift from; reset it to earliest, latest, a timestamp or an offset"
                    ),
                },
            };
            changes.push(OffsetChange { topic, partition, previous_offset: previous, new_offset });
        }
        if !request.dry_run {
            self.simple_commit(coordinator, group, &changes)?;
        }
        Ok(ResetOffsetsResult { group_id: group.to_string(), dry_run: request.dry_run, offsets: changes })
    }

    fn delete(&mut self, group: &str) -> anyhow::Result<DeletedGroup> {
        let coordinator = self.cluster.coordinator(group).map_err(failure)?;
        let request = DeleteGroupsRequest::default().with_groups_names(vec![group_id(group)]);
        let (_, response) = self.cluster.send_to(coordinator, 0..=2, &request).map_err(failure)?;
        for r in &response.results {
            if r.error_code == codes::GROUP_ID_NOT_FOUND {
                return Err(unknown_group(group));
            }
            check(r.error_code, None, || format!("deleting group '{group}'"))?;
        }
        Ok(DeletedGroup { group_id: group.to_string() })
    }

    fn delete_offsets(&mut self, group: &str, topic: &str) -> anyhow::Result<DeletedOffsets> {
        let layout = topic_layout(&mut self.cluster, topic)?;
        let partitions: Vec<i32> = layout.partitions.iter().map(|p| p.partition).collect();
        let coordinator = self.cluster.coordinator(group).map_err(failure)?;
        let request = OffsetDeleteRequest::default().with_group_id(group_id(group)).with_topics(vec![
            OffsetDeleteRequestTopic::default().with_name(topic_name(topic)).with_partitions(
                partitions.iter().map(|&p| OffsetDeleteRequestPartition::default().with_partition_index(p)).collect(),
            ),
        ]);
        let (_, response) = self.cluster.send_to(coordinator, 0..=0, &request).map_err(failure)?;
        if response.error_code == codes::GROUP_ID_NOT_FOUND {
            return Err(unknown_group(group));
        }
        check(response.error_code, None, || format!("deleting the offsets of group '{group}'"))?;
        for p in response.topics.iter().flat_map(|t| &t.partitions) {
            check(p.error_code, None, || format!("group '{group}', {topic}-{}", p.partition_index))?;
        }
        Ok(DeletedOffsets { group_id: group.to_string(), topic: topic.to_string(), partitions })
    }
}

impl KafkaGroups {
    /// Commits `changes` as a consumer outside the group (generation -1), which the coordinator
    /// accepts only while the group has no members.
    fn simple_commit(&mut self, coordinator: i32, group: &str, changes: &[OffsetChange]) -> anyhow::Result<()> {
        let mut by_topic: BTreeMap<&str, Vec<OffsetCommitRequestPartition>> = BTreeMap::new();
        for c in changes {
            by_topic.entry(&c.topic).or_default().push(
                OffsetCommitRequestPartition::default()
                    .with_partition_index(c.partition)
                    .with_committed_offset(c.new_offset),
            );
        }
        let request = OffsetCommitRequest::default()
            .with_group_id(group_id(group))
            .with_generation_id_or_member_epoch(-1)
            .with_topics(
                by_topic
                    .into_iter()
                    .map(|(t, partitions)| {
                        OffsetCommitRequestTopic::default().with_name(topic_name(t)).with_partitions(partitions)
                    })
                    .collect(),
            );
        let (_, response) = self.cluster.send_to(coordinator, 2..=8, &request).map_err(failure)?;
        for t in &response.topics {
            for p in &t.partitions {
                if matches!(
                    p.error_code,
                    codes::UNKNOWN_MEMBER_ID | codes::ILLEGAL_GENERATION | codes::REBALANCE_IN_PROGRESS
                ) {
                    return Err(ApiFailure {
                        code: "NON_EMPTY_GROUP".into(),
                        message: format!("group '{group}' has active members; stop its consumers first"),
                    }
                    .into());
                }
                check(p.error_code, None, || {
                    format!("committing {}-{} for group '{group}'", t.name.as_str(), p.partition_index)
                })?;
            }
        }
        Ok(())
    }
}
