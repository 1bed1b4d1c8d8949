//! Placement by measured load (`docs/elastic.md`): brokers report in their heartbeats what each
//! partition they lead carries, their CPU and their disk use; the active controller keeps every
//! broker's traffic within a band of the mean by moving elastic topics' physical partitions,
//! one at a time, with the partition reassignment (and its throttle).
//!
//! A broker's load is the bytes per second it serves: for each partition it leads, the bytes
//! produced and fetched; for each it follows, the bytes produced (what it copies). Only elastic
//! topics' physical partitions move: a plain topic's placement is its operator's.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use weir_metadata::elastic::PhysicalState;
use weir_metadata::{MetadataRecord, MetadataState, PartitionState};

use crate::reassignment::{self, OngoingReassignment, ReassignmentTarget};
use crate::Decision;

/// One partition's traffic, as its leader measured it over its last load window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartitionRate {
    pub topic: String,
    pub partition: i32,
    pub bytes_in_per_sec: f64,
    pub bytes_out_per_sec: f64,
}

/// What a broker reports of its load in each heartbeat.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadReport {
    /// Each partition it leads that carried traffic.
    pub partitions: Vec<PartitionRate>,
    /// The process's CPU use over the last window, in cores.
    pub cpu_cores: f64,
    /// Bytes of partition logs in its data directory.
    pub disk_bytes: u64,
}

/// The balancer's settings (the broker's `elastic.balance.*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BalanceConfig {
    pub enable: bool,
    /// Every broker's load is kept at most this many times the mean (above 1).
    pub band: f64,
    /// Below this mean load (bytes per second) nothing moves: the differences are noise.
    pub min_bytes_per_sec: f64,
}

/// One broker's load as the controller sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BrokerLoad {
    pub broker: i32,
    /// Bytes per second it serves (see the module doc).
    pub bytes_per_sec: f64,
    pub cpu_cores: f64,
    pub disk_bytes: u64,
    /// Whether it reported since this controller took over.
    pub reported: bool,
}

/// The move the balancer would make next.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedMove {
    pub topic: String,
    pub physical: i32,
    pub from: i32,
    pub to: i32,
    /// The physical partition's load, bytes per second.
    pub bytes_per_sec: f64,
    /// Its replicas after the move (the first leads).
    pub replicas: Vec<i32>,
}

/// What `weir cluster balance` shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BalanceReport {
    pub enabled: bool,
    pub band: f64,
    pub min_bytes_per_sec: f64,
    pub mean_bytes_per_sec: f64,
    pub brokers: Vec<BrokerLoad>,
    /// The next move, if one is due (and no elastic move is in progress).
    pub plan: Option<PlannedMove>,
    /// Elastic topics' stable partitions being moved now.
    pub moving: Vec<OngoingReassignment>,
}

/// Each partition's rates from the reports, by (topic, partition).
fn rates(reports: &BTreeMap<i32, LoadReport>) -> BTreeMap<(&str, i32), (f64, f64)> {
    reports
        .values()
        .flat_map(|r| r.partitions.iter())
        .map(|p| ((p.topic.as_str(), p.partition), (p.bytes_in_per_sec, p.bytes_out_per_sec)))
        .collect()
}

/// Every unfenced broker's load.
pub fn broker_loads(state: &MetadataState, reports: &BTreeMap<i32, LoadReport>) -> Vec<BrokerLoad> {
    let rates = rates(reports);
    let mut bytes: BTreeMap<i32, f64> = state.brokers.values().filter(|b| !b.fenced).map(|b| (b.id, 0.0)).collect();
    for topic in state.topics.values() {
        for (index, partition) in topic.assignments.iter().enumerate() {
            let Some((bytes_in, bytes_out)) = rates.get(&(topic.name.as_str(), index as i32)) else { continue };
            for replica in &partition.replicas {
                if let Some(load) = bytes.get_mut(replica) {
                    *load += if *replica == partition.leader { bytes_in + bytes_out } else { *bytes_in };
                }
            }
        }
    }
    bytes
        .into_iter()
        .map(|(broker, bytes_per_sec)| {
            let report = reports.get(&broker);
            BrokerLoad {
                broker,
                bytes_per_sec,
                cpu_cores: report.map_or(0.0, |r| r.cpu_cores),
                disk_bytes: report.map_or(0, |r| r.disk_bytes),
                reported: report.is_some(),
            }
        })
        .collect()
}

/// The elastic topics' stable partitions being moved now.
fn elastic_moves(state: &MetadataState) -> Vec<OngoingReassignment> {
    reassignment::ongoing(state, None)
        .into_iter()
        .filter(|m| state.topic(&m.topic).is_some_and(|t| t.elastic.is_some()))
        .collect()
}

/// The next move: from the most loaded broker, when it is above `band` times the mean, the
/// physical partition it leads whose move to the least loaded broker leaves the larger of the
/// two loads smallest (and smaller than the hot broker's now). None while an elastic move is in
/// progress, below `min_bytes_per_sec`, or when no move helps.
pub fn plan(state: &MetadataState, reports: &BTreeMap<i32, LoadReport>, config: &BalanceConfig) -> Option<PlannedMove> {
    if !elastic_moves(state).is_empty() {
        return None;
    }
    let loads = broker_loads(state, reports);
    if loads.len() < 2 || loads.iter().any(|l| !l.reported) {
        return None;
    }
    let mean = loads.iter().map(|l| l.bytes_per_sec).sum::<f64>() / loads.len() as f64;
    let by_load =
        |a: &&BrokerLoad, b: &&BrokerLoad| a.bytes_per_sec.total_cmp(&b.bytes_per_sec).then(a.broker.cmp(&b.broker));
    let hot = loads.iter().max_by(by_load)?;
    let cold = loads.iter().min_by(by_load)?;
    if mean < config.min_bytes_per_sec || hot.bytes_per_sec <= mean * config.band || hot.broker == cold.broker {
        return None;
    }
    let rates = rates(reports);
    let mut best: Option<(f64, PlannedMove)> = None;
    for topic in state.topics.values() {
        let Some(layout) = &topic.elastic else { continue };
        for physical in layout.physical.iter().filter(|p| p.state == PhysicalState::Active) {
            let states: Vec<&PartitionState> = physical.stable_range().filter_map(|s| topic.partition(s)).collect();
            if states.is_empty() || states.iter().any(|s| s.leader != hot.broker) {
                continue;
            }
            // What leaves the hot broker: all it serves as leader; what the cold one takes on,
            // the same (it leads after the move).
            let moved: f64 =
                physical.stable_range().filter_map(|s| rates.get(&(topic.name.as_str(), s))).map(|(i, o)| i + o).sum();
            if moved <= 0.0 {
                continue;
            }
            let worst = (hot.bytes_per_sec - moved).max(cold.bytes_per_sec + moved);
            if worst >= hot.bytes_per_sec || best.as_ref().is_some_and(|(w, _)| *w <= worst) {
                continue;
            }
            let current = states[0].target_replicas();
            let mut replicas: Vec<i32> = if current.contains(&cold.broker) {
                current.clone()
            } else {
                current.iter().map(|b| if *b == hot.broker { cold.broker } else { *b }).collect()
            };
            replicas.retain(|b| *b != cold.broker);
            replicas.insert(0, cold.broker);
            let planned = PlannedMove {
                topic: topic.name.clone(),
                physical: physical.id,
                from: hot.broker,
                to: cold.broker,
                bytes_per_sec: moved,
                replicas,
            };
            best = Some((worst, planned));
        }
    }
    best.map(|(_, planned)| planned)
}

/// The report `weir cluster balance` shows.
pub fn report(state: &MetadataState, reports: &BTreeMap<i32, LoadReport>, config: &BalanceConfig) -> BalanceReport {
    let brokers = broker_loads(state, reports);
    let mean = if brokers.is_empty() {
        0.0
    } else {
        brokers.iter().map(|l| l.bytes_per_sec).sum::<f64>() / brokers.len() as f64
    };
    BalanceReport {
        enabled: config.enable,
        band: config.band,
        min_bytes_per_sec: config.min_bytes_per_sec,
        mean_bytes_per_sec: mean,
        brokers,
        plan: plan(state, reports, config),
        moving: elastic_moves(state),
    }
}

/// Decides the next move, when balancing is on and one is due: the reassignment records of
/// the physical partition's stable partitions, and the stable partitions whose replicas stay
/// the same but whose preferred leader changes (the caller elects it).
pub fn decide_balance(
    state: &MetadataState,
    reports: &BTreeMap<i32, LoadReport>,
    config: &BalanceConfig,
) -> Decision<Option<(PlannedMove, Vec<i32>)>> {
    let Some(planned) = plan(state, reports, config).filter(|_| config.enable) else {
        return Decision::nothing(None);
    };
    let Some(topic) = state.topic(&planned.topic) else { return Decision::nothing(None) };
    let Some(physical) = topic.elastic.as_ref().and_then(|l| l.physical(planned.physical)) else {
        return Decision::nothing(None);
    };
    let targets: Vec<ReassignmentTarget> = physical
        .stable_range()
        .map(|s| ReassignmentTarget {
            topic: topic.name.clone(),
            partition: s,
            replicas: Some(planned.replicas.clone()),
        })
        .collect();
    let same_set = topic.partition(physical.first).is_some_and(|p| {
        let mut now = p.target_replicas();
        now.sort_unstable();
        let mut after = planned.replicas.clone();
        after.sort_unstable();
        now == after
    });
    let new_leaders = if same_set { physical.stable_range().collect() } else { Vec::new() };
    let decision = reassignment::decide_alter(state, targets, false);
    if decision.answer.iter().any(|(_, _, outcome)| outcome.is_err()) {
        return Decision::nothing(None);
    }
    let records: Vec<MetadataRecord> = decision.records;
    Decision { records, answer: Some((planned, new_leaders)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_metadata::elastic::ElasticLayout;
    use weir_metadata::TopicMetadata;

    fn state() -> MetadataState {
        let mut state = MetadataState::new();
        for b in [1, 2, 3] {
            state.brokers.insert(b, crate::placement::test_broker(b, false));
        }
        // Elastic topic "e": 4 stable partitions in 2 physical ones, both led by broker 1
        // (replicas 1,2); a plain topic "p" led by broker 3.
        let layout = ElasticLayout::new(4, 2);
        let elastic = TopicMetadata {
            name: "e".into(),
            id: uuid::Uuid::from_u128(1),
            partitions: 4,
            configs: Default::default(),
            internal: false,
            assignments: (0..4).map(|_| PartitionState::new(vec![1, 2])).collect(),
            elastic: Some(layout),
        };
        let plain = TopicMetadata {
            name: "p".into(),
            id: uuid::Uuid::from_u128(2),
            partitions: 1,
            configs: Default::default(),
            internal: false,
            assignments: vec![PartitionState::new(vec![3])],
            elastic: None,
        };
        state.topics.insert("e".into(), std::sync::Arc::new(elastic));
        state.topics.insert("p".into(), std::sync::Arc::new(plain));
        state
    }

    fn rate(topic: &str, partition: i32, bytes_in: f64, bytes_out: f64) -> PartitionRate {
        PartitionRate { topic: topic.into(), partition, bytes_in_per_sec: bytes_in, bytes_out_per_sec: bytes_out }
    }

    fn reports(hot: f64) -> BTreeMap<i32, LoadReport> {
        let leader =
            LoadReport { partitions: (0..4).map(|s| rate("e", s, hot, hot)).collect(), cpu_cores: 0.5, disk_bytes: 10 };
        let plain = LoadReport { partitions: vec![rate("p", 0, 100.0, 0.0)], ..LoadReport::default() };
        [(1, leader), (2, LoadReport::default()), (3, plain)].into()
    }

    const CONFIG: BalanceConfig = BalanceConfig { enable: true, band: 1.25, min_bytes_per_sec: 1000.0 };

    #[test]
    fn a_broker_serves_what_it_leads_and_copies_what_it_follows() {
        let loads = broker_loads(&state(), &reports(1000.0));
        let of = |b: i32| loads.iter().find(|l| l.broker == b).map(|l| l.bytes_per_sec);
        assert_eq!((of(1), of(2), of(3)), (Some(8000.0), Some(4000.0), Some(100.0)));
    }

    #[test]
    fn the_hot_brokers_physical_partition_moves_to_the_cold_one_and_only_past_the_band() {
        let state = state();
        let planned = plan(&state, &reports(1000.0), &CONFIG).expect("a move");
        assert_eq!((planned.from, planned.to, planned.replicas.clone()), (1, 3, vec![3, 2]));
        assert_eq!(planned.bytes_per_sec, 4000.0);
        let decision = decide_balance(&state, &reports(1000.0), &CONFIG);
        assert_eq!(decision.records.len(), 2, "both stable partitions of the physical partition move");
        assert!(plan(&state, &reports(1.0), &CONFIG).is_none(), "below the minimum load");
        let off = BalanceConfig { enable: false, ..CONFIG };
        assert!(decide_balance(&state, &reports(1000.0), &off).records.is_empty());
        assert!(report(&state, &reports(1000.0), &off).plan.is_some(), "the plan is shown even when off");
        // A broker that has not reported yet: nothing moves.
        let mut partial = reports(1000.0);
        partial.remove(&2);
        assert!(plan(&state, &partial, &CONFIG).is_none());
    }
}
