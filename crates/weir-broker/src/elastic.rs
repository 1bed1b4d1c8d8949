//! Elastic topics through the controller (`docs/elastic.md`): create one, split a physical
//! partition, merge two. The decisions are `weir_controller::elastic`'s; a split or merge
//! answers once its layout is committed and, when it moves stable partitions, once those moves
//! are done (or `wait` has passed: the moves go on, and `weir topic describe` shows them).

use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_controller::elastic::ElasticChange;

use crate::broker::{unexpected_answer, Broker, CreatedTopic, NewTopic};
use crate::cluster::{ControlAnswer, ControlRequest};
use crate::error::{BrokerError, ErrorKind};
use crate::metadata::elastic::PhysicalState;

/// What a split or merge did, and whether its moves finished within the wait.
#[derive(Debug, Clone)]
pub struct ElasticOutcome {
    pub change: ElasticChange,
    /// Every replaced physical partition is retired: its range serves from its new placement.
    pub in_force: bool,
}

impl Broker {
    /// Creates an elastic topic: `topic.partitions` physical partitions (-1: `num.partitions`)
    /// over `stable_partitions` stable ones (`None`: 16 per physical partition, rounded up to a
    /// power of two).
    pub async fn create_elastic_topic(
        self: &Arc<Self>,
        topic: NewTopic,
        stable_partitions: Option<i32>,
        validate_only: bool,
    ) -> Result<CreatedTopic, BrokerError> {
        match self.control(ControlRequest::CreateElasticTopic { topic, stable_partitions, validate_only }).await? {
            ControlAnswer::CreatedTopics(mut results) if results.len() == 1 => {
                results.pop().unwrap_or_else(|| Err(BrokerError::internal("no result")))
            }
            other => Err(unexpected_answer(&other)),
        }
    }

    /// Splits physical partition `partition` of elastic topic `topic`; waits up to `wait` for
    /// the moves it starts.
    pub async fn split_physical(
        self: &Arc<Self>,
        topic: &str,
        partition: i32,
        wait: Duration,
    ) -> Result<ElasticOutcome, BrokerError> {
        let request = ControlRequest::SplitPhysical { topic: topic.to_string(), partition };
        self.change_layout(topic, request, wait).await
    }

    /// Merges two adjacent physical partitions of elastic topic `topic`; waits up to `wait`
    /// for the moves it starts.
    pub async fn merge_physical(
        self: &Arc<Self>,
        topic: &str,
        partitions: (i32, i32),
        wait: Duration,
    ) -> Result<ElasticOutcome, BrokerError> {
        let request = ControlRequest::MergePhysical { topic: topic.to_string(), partitions };
        self.change_layout(topic, request, wait).await
    }

    /// The brokers' loads as the active controller sees them, and its next move
    /// (`weir cluster balance`).
    pub async fn describe_balance(self: &Arc<Self>) -> Result<crate::balance::BalanceReport, BrokerError> {
        match self.control(ControlRequest::DescribeBalance).await? {
            ControlAnswer::Balance(report) => Ok(report),
            other => Err(unexpected_answer(&other)),
        }
    }

    async fn change_layout(
        self: &Arc<Self>,
        topic: &str,
        request: ControlRequest,
        wait: Duration,
    ) -> Result<ElasticOutcome, BrokerError> {
        let change = match self.control(request).await? {
            ControlAnswer::Elastic(change) => change,
            other => return Err(unexpected_answer(&other)),
        };
        let deadline = Instant::now() + wait;
        loop {
            let retired = {
                let metadata = self.metadata();
                let layout = metadata.topic(topic).and_then(|t| t.elastic.as_ref()).ok_or_else(|| {
                    BrokerError::new(ErrorKind::UnknownTopicOrPartition, format!("topic '{topic}' was deleted"))
                })?;
                change.replaced.iter().all(|id| layout.physical(*id).is_some_and(|p| p.state == PhysicalState::Retired))
            };
            if retired || Instant::now() >= deadline {
                return Ok(ElasticOutcome { change, in_force: retired });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// An automatic change of an elastic topic's layout (`elastic.split.bytes.per.sec`,
/// `elastic.merge.bytes.per.sec`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Autoscale {
    Split(i32),
    /// Two adjacent physical partitions, the lower first.
    Merge(i32, i32),
}

/// Since when (ms) each automatic change's condition has held, per topic: a change is asked for
/// once its condition held for the topic's `elastic.autoscale.window.ms`.
pub(crate) type Holds = std::collections::HashMap<(String, Autoscale), i64>;

/// The automatic change due on `topic` now, if any. `rates` has the bytes-in rate of each
/// active physical partition this broker leads whole. A split is due when one's rate stayed
/// above the split threshold for the window (and it has two stable partitions or more); a merge
/// when two adjacent ones together stayed below the merge threshold, and below half the split
/// threshold (so that the merged partition does not split again at once). Conditions that stop
/// holding are forgotten.
pub(crate) fn autoscale_due(
    topic: &str,
    layout: &crate::metadata::elastic::ElasticLayout,
    rates: &std::collections::BTreeMap<i32, f64>,
    settings: crate::topic_config::ElasticAutoscale,
    holds: &mut Holds,
    now_ms: i64,
) -> Option<Autoscale> {
    let mut holding = Vec::new();
    let active = layout.active();
    if settings.split_bytes_per_sec > 0 {
        for p in &active {
            if p.end - p.first >= 2 && rates.get(&p.id).is_some_and(|r| *r > settings.split_bytes_per_sec as f64) {
                holding.push(Autoscale::Split(p.id));
            }
        }
    }
    if settings.merge_bytes_per_sec > 0 {
        for pair in active.windows(2) {
            let (Some(a), Some(b)) = (rates.get(&pair[0].id), rates.get(&pair[1].id)) else { continue };
            let together = a + b;
            let under_split = settings.split_bytes_per_sec == 0 || together * 2.0 < settings.split_bytes_per_sec as f64;
            if together < settings.merge_bytes_per_sec as f64 && under_split {
                holding.push(Autoscale::Merge(pair[0].id, pair[1].id));
            }
        }
    }
    holds.retain(|(t, change), _| t != topic || holding.contains(change));
    let window = i64::try_from(settings.window_ms).unwrap_or(i64::MAX);
    let mut due = None;
    for change in holding {
        let since = *holds.entry((topic.to_string(), change)).or_insert(now_ms);
        if now_ms.saturating_sub(since) >= window && due.is_none() {
            due = Some(change);
        }
    }
    if let Some(change) = due {
        // The layout changes: what held of this topic is measured anew.
        holds.retain(|(t, _), _| t != topic);
        return Some(change);
    }
    None
}

impl Broker {
    /// Splits and merges elastic topics' physical partitions by their load, where their topics
    /// ask for it, after each load window, until shutdown. Each broker looks after the physical
    /// partitions it leads whole.
    pub(crate) fn run_elastic_autoscaler(self: &Arc<Self>) {
        let holds = Arc::new(std::sync::Mutex::new(Holds::new()));
        self.every(crate::metrics::LOAD_SAMPLE_INTERVAL, move |broker| {
            let holds = holds.clone();
            async move {
                for (topic, change) in broker.autoscale_changes(&holds) {
                    let outcome = match change {
                        Autoscale::Split(id) => broker.split_physical(&topic, id, Duration::ZERO).await,
                        Autoscale::Merge(a, b) => broker.merge_physical(&topic, (a, b), Duration::ZERO).await,
                    };
                    match outcome {
                        Ok(done) => tracing::info!(topic, ?change, created = ?done.change.created, "elastic topic: automatic change"),
                        Err(e) => tracing::info!(topic, ?change, error = %e, "elastic topic: automatic change refused"),
                    }
                }
            }
        });
    }

    /// The automatic changes due now, at most one per topic.
    fn autoscale_changes(&self, holds: &std::sync::Mutex<Holds>) -> Vec<(String, Autoscale)> {
        let metadata = self.metadata();
        let defaults = crate::topic_config::effective_defaults(
            &self.config.topic_defaults,
            &metadata.broker_configs,
            Some(self.config.node_id),
        );
        let mut holds = weir_storage::sync::lock(holds);
        let mut changes = Vec::new();
        for topic in metadata.topics.values() {
            let Some(layout) = &topic.elastic else { continue };
            let settings = crate::topic_config::elastic_autoscale(&defaults, &topic.configs);
            if settings.split_bytes_per_sec == 0 && settings.merge_bytes_per_sec == 0 {
                continue;
            }
            let mut rates = std::collections::BTreeMap::new();
            'physical: for p in layout.active() {
                let mut rate = 0.0;
                for stable in p.stable_range() {
                    match self.partition(&topic.name, stable) {
                        Some(partition) if partition.state().leader == self.config.node_id => {
                            rate += partition.metrics.load().bytes_in_per_sec
                        }
                        _ => continue 'physical,
                    }
                }
                rates.insert(p.id, rate);
            }
            if let Some(change) = autoscale_due(&topic.name, layout, &rates, settings, &mut holds, self.now_ms()) {
                changes.push((topic.name.clone(), change));
            }
        }
        changes
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::metadata::elastic::ElasticLayout;
    use crate::topic_config::ElasticAutoscale;

    const SETTINGS: ElasticAutoscale =
        ElasticAutoscale { split_bytes_per_sec: 1000, merge_bytes_per_sec: 300, window_ms: 10_000 };

    #[test]
    fn a_split_is_due_once_its_rate_held_for_the_window_and_not_if_it_dropped_meanwhile() {
        let layout = ElasticLayout::new(8, 2);
        let mut holds = Holds::new();
        let hot: BTreeMap<i32, f64> = [(0, 5000.0), (1, 600.0)].into();
        assert_eq!(autoscale_due("t", &layout, &hot, SETTINGS, &mut holds, 0), None);
        assert_eq!(autoscale_due("t", &layout, &hot, SETTINGS, &mut holds, 9_999), None);
        let cool: BTreeMap<i32, f64> = [(0, 500.0), (1, 600.0)].into();
        assert_eq!(autoscale_due("t", &layout, &cool, SETTINGS, &mut holds, 10_000), None);
        assert_eq!(autoscale_due("t", &layout, &hot, SETTINGS, &mut holds, 11_000), None);
        assert_eq!(autoscale_due("t", &layout, &hot, SETTINGS, &mut holds, 21_000), Some(Autoscale::Split(0)));
        assert!(holds.is_empty(), "what held is measured anew after a change");
    }

    #[test]
    fn a_cold_adjacent_pair_merges_and_a_single_stable_partition_never_splits() {
        let layout = ElasticLayout::new(2, 2);
        let mut holds = Holds::new();
        let rates: BTreeMap<i32, f64> = [(0, 100.0), (1, 100.0)].into();
        assert_eq!(autoscale_due("t", &layout, &rates, SETTINGS, &mut holds, 0), None);
        assert_eq!(autoscale_due("t", &layout, &rates, SETTINGS, &mut holds, 10_000), Some(Autoscale::Merge(0, 1)));
        let hot: BTreeMap<i32, f64> = [(0, 9000.0), (1, 9000.0)].into();
        assert_eq!(autoscale_due("t", &layout, &hot, SETTINGS, &mut holds, 20_000), None);
        assert_eq!(autoscale_due("t", &layout, &hot, SETTINGS, &mut holds, 40_000), None, "one stable partition each");
        // A pair this broker does not lead whole (no rate) does not merge.
        let half: BTreeMap<i32, f64> = [(0, 0.0)].into();
        assert_eq!(autoscale_due("t", &layout, &half, SETTINGS, &mut holds, 50_000), None);
        assert_eq!(autoscale_due("t", &layout, &half, SETTINGS, &mut holds, 70_000), None);
    }
}
