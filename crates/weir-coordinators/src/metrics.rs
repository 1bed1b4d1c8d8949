//! The groups' part of `/metrics`: how many groups are in each state, and each group's committed
//! offsets and lag.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use weir_broker::metrics::{Exposition, Kind, MetricsSection};
use weir_broker::Partition;

use crate::group::{GroupCoordinator, GroupOffsets, GroupState};

impl MetricsSection for GroupCoordinator {
    fn render(&self, out: &mut Exposition, partitions: &[Arc<Partition>]) {
        render_groups(out, &self.committed_offsets(), partitions);
    }
}

fn render_groups(out: &mut Exposition, groups: &[GroupOffsets], partitions: &[Arc<Partition>]) {
    let mut states: BTreeMap<&str, u64> =
        [GroupState::Empty, GroupState::PreparingRebalance, GroupState::CompletingRebalance, GroupState::Stable]
            .into_iter()
            .map(|s| (s.as_str(), 0))
            .collect();
    for group in groups {
        *states.entry(group.state.as_str()).or_default() += 1;
    }
    out.family("weir_consumer_groups", Kind::Gauge, "Consumer groups, by state.");
    for (state, count) in &states {
        out.sample("weir_consumer_groups", &[("state", state)], *count);
    }

    let by_key: HashMap<(&str, i32), &Partition> =
        partitions.iter().map(|p| ((p.topic.as_str(), p.index), &**p)).collect();
    out.family(
        "weir_consumer_group_committed_offset",
        Kind::Gauge,
        "The offset a group committed, by group, topic and partition.",
    );
    for group in groups {
        for (topic, partition, offset) in &group.offsets {
            let labels: [(&str, &dyn std::fmt::Display); 3] =
                [("group", &group.group_id), ("topic", topic), ("partition", partition)];
            out.sample("weir_consumer_group_committed_offset", &labels, *offset);
        }
    }
    out.family(
        "weir_consumer_group_lag_records",
        Kind::Gauge,
        "High watermark minus the committed offset (0 if the commit is ahead), by group, topic and partition; \
         absent for partitions that no longer exist or that this broker does not host.",
    );
    for group in groups {
        for (topic, partition, offset) in &group.offsets {
            let Some(p) = by_key.get(&(topic.as_str(), *partition)) else { continue };
            let lag = (p.log.high_watermark() - offset).max(0);
            let labels: [(&str, &dyn std::fmt::Display); 3] =
                [("group", &group.group_id), ("topic", topic), ("partition", partition)];
            out.sample("weir_consumer_group_lag_records", &labels, lag);
        }
    }
}
