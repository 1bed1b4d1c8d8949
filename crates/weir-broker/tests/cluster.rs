//! Cluster mode in one process: three brokers, each a voter of the metadata quorum, over real
//! TCP on 127.0.0.1 (the internal RPC of each node's CONTROLLER listener). The fault tests with
//! kill -9 and SIGSTOP run the real binary (tests/python/test_cluster.py); these check the
//! core's decisions: placement, forwarding, fencing, failover.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_broker::cluster::QuorumMembership;
use weir_broker::{Acks, Broker, BrokerConfig, ErrorKind, NewTopic};

const SESSION_TIMEOUT_MS: u64 = 1500;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

struct Node {
    id: i32,
    dir: PathBuf,
    kafka_port: u16,
    controller_port: u16,
}

fn config(node: &Node, voters: &str) -> BrokerConfig {
    let settings: BTreeMap<String, String> = [
        ("log.dirs", node.dir.display().to_string()),
        ("node.id", node.id.to_string()),
        ("process.roles", "broker,controller".to_string()),
        ("controller.quorum.voters", voters.to_string()),
        (
            "listeners",
            format!("PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}", node.kafka_port, node.controller_port),
        ),
        ("broker.heartbeat.interval.ms", "150".to_string()),
        ("broker.session.timeout.ms", SESSION_TIMEOUT_MS.to_string()),
        ("controller.quorum.election.timeout.ms", "300".to_string()),
        ("offsets.topic.num.partitions", "3".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    BrokerConfig::from_settings(&settings).unwrap()
}

struct Cluster {
    _root: tempfile::TempDir,
    nodes: Vec<Node>,
    voters: String,
    brokers: Vec<Option<Arc<Broker>>>,
}

impl Cluster {
    async fn start(count: i32) -> Cluster {
        let root = tempfile::tempdir().unwrap();
        let nodes: Vec<Node> = (1..=count)
            .map(|id| Node {
                id,
                dir: root.path().join(format!("node-{id}")),
                kafka_port: free_port(),
                controller_port: free_port(),
            })
            .collect();
        let voters =
            nodes.iter().map(|n| format!("{}@127.0.0.1:{}", n.id, n.controller_port)).collect::<Vec<_>>().join(",");
        let mut cluster = Cluster { _root: root, nodes, voters, brokers: Vec::new() };
        // Each open blocks until its broker is unfenced, which needs a majority: open together.
        let opening: Vec<_> = (0..cluster.nodes.len()).map(|i| cluster.open_task(i)).collect();
        for task in opening {
            cluster.brokers.push(Some(task.await.unwrap()));
        }
        cluster
    }

    fn open_task(&self, index: usize) -> tokio::task::JoinHandle<Arc<Broker>> {
        let config = config(&self.nodes[index], &self.voters);
        tokio::task::spawn_blocking(move || Broker::open(config).unwrap())
    }

    fn broker(&self, id: i32) -> &Arc<Broker> {
        self.brokers[(id - 1) as usize].as_ref().unwrap()
    }

    fn live(&self) -> impl Iterator<Item = &Arc<Broker>> {
        self.brokers.iter().flatten()
    }

    async fn stop(&mut self, id: i32) {
        let broker = self.brokers[(id - 1) as usize].take().unwrap();
        tokio::task::spawn_blocking(move || broker.shutdown().unwrap()).await.unwrap();
    }

    async fn restart(&mut self, id: i32) {
        let broker = self.open_task((id - 1) as usize).await.unwrap();
        self.brokers[(id - 1) as usize] = Some(broker);
    }

    async fn shutdown(mut self) {
        for id in 1..=self.nodes.len() as i32 {
            if self.brokers[(id - 1) as usize].is_some() {
                self.stop(id).await;
            }
        }
    }
}

fn topic(name: &str, partitions: i32) -> NewTopic {
    NewTopic {
        name: name.into(),
        partitions,
        replication_factor: -1,
        assignments: Vec::new(),
        configs: BTreeMap::new(),
    }
}

fn batch() -> bytes::BytesMut {
    let records = [weir_storage::testing::record(0, 1_700_000_000_000, None, Some(bytes::Bytes::from_static(b"v")))];
    bytes::BytesMut::from(&weir_storage::testing::encode(&records, weir_storage::Compression::None)[..])
}

/// Polls `check` until it holds or `within` passes.
async fn eventually(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn leader_of(broker: &Broker, topic: &str, partition: i32) -> i32 {
    broker.metadata().topic(topic).and_then(|t| t.partition(partition)).map_or(-2, |p| p.leader)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_form_a_cluster_spread_partitions_and_forward_changes() {
    let cluster = Cluster::start(3).await;
    for broker in cluster.live() {
        // Each node was unfenced before it returned; the others may be a moment behind.
        eventually("every broker live on every node", Duration::from_secs(5), || broker.live_brokers().len() == 3)
            .await;
        assert!(!broker.metadata().cluster_id.is_empty());
    }
    let cluster_ids: Vec<String> = cluster.live().map(|b| b.cluster_id()).collect();
    assert!(cluster_ids.windows(2).all(|w| w[0] == w[1]), "one cluster id: {cluster_ids:?}");

    // Created through a node that may not be the controller: forwarded, then visible there.
    let controller = cluster.broker(1).active_controller().unwrap();
    let via = if controller == 2 { 3 } else { 2 };
    let created = cluster.broker(via).create_topics(vec![topic("spread", 6)], false).await.pop().unwrap().unwrap();
    assert_eq!(created.topic.partitions, 6);
    assert!(cluster.broker(via).metadata().topic("spread").is_some(), "visible on the node that asked at once");
    for broker in cluster.live() {
        eventually("every node applies the topic", Duration::from_secs(5), || {
            broker.metadata().topic("spread").is_some()
        })
        .await;
    }
    let leaders: Vec<i32> = (0..6).map(|p| leader_of(cluster.broker(1), "spread", p)).collect();
    for id in 1..=3 {
        assert_eq!(leaders.iter().filter(|l| **l == id).count(), 2, "two leaders per broker: {leaders:?}");
    }
    // Each broker hosts exactly the partitions it leads; a write elsewhere is refused.
    for broker in cluster.live() {
        let me = broker.config.node_id;
        eventually("partitions open", Duration::from_secs(5), || {
            (0..6).all(|p| broker.partition("spread", p).is_some() == (leaders[p as usize] == me))
        })
        .await;
        for p in 0..6 {
            let result = match broker.partition("spread", p) {
                Some(partition) => broker.append(partition, batch(), Acks::All).await.map(|_| ()),
                None => Err(broker.absent_partition_error("spread", p)),
            };
            if leaders[p as usize] == me {
                result.unwrap();
            } else {
                assert_eq!(result.unwrap_err().kind, ErrorKind::NotLeader, "partition {p} on broker {me}");
            }
        }
    }
    // Every kind of change works from every node.
    cluster.broker(3).create_partitions("spread".into(), 9, None, false).await.unwrap();
    let deleted = cluster.broker(2).delete_topic(Some("spread".into()), None).await.unwrap();
    assert_eq!(deleted.partitions, 9);
    let again = cluster.broker(1).create_topics(vec![topic("spread", 1)], false).await.pop().unwrap();
    assert!(again.is_ok(), "{again:?}");
    // Three replicas on three brokers; four cannot be placed, and say why.
    let mut replicated = topic("replicated", 1);
    replicated.replication_factor = 3;
    let created = cluster.broker(2).create_topics(vec![replicated.clone()], false).await.pop().unwrap().unwrap();
    let mut replicas = created.topic.assignments[0].replicas.clone();
    replicas.sort_unstable();
    assert_eq!(replicas, vec![1, 2, 3]);
    replicated.name = "too-replicated".into();
    replicated.replication_factor = 4;
    let refused = cluster.broker(2).create_topics(vec![replicated], false).await.pop().unwrap().unwrap_err();
    assert_eq!(refused.kind, ErrorKind::InvalidReplicationFactor, "{refused}");

    // DescribeQuorum from any node is the leader's view: three voters, each with the log up to
    // at least the committed offset once replication has caught up.
    for broker in cluster.live() {
        eventually("every voter caught up in the leader's view", Duration::from_secs(5), || {
            let quorum =
                tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(broker.describe_quorum()))
                    .unwrap();
            quorum.leader_id == controller
                && quorum.observers.is_empty()
                && quorum.voters.iter().map(|(id, _)| *id).collect::<Vec<_>>() == vec![1, 2, 3]
                && quorum.voters.iter().all(|(_, end)| *end >= quorum.high_watermark)
        })
        .await;
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_broker_is_fenced_and_a_new_controller_takes_over() {
    let mut cluster = Cluster::start(3).await;
    cluster.broker(1).create_topics(vec![topic("t", 3)], false).await.pop().unwrap().unwrap();
    let controller = cluster.broker(1).active_controller().unwrap();
    let survivor = (1..=3).find(|id| *id != controller).unwrap();

    // The controller goes away without a word: another voter takes over, and brings the
    // metadata with it.
    let started = Instant::now();
    cluster.stop(controller).await;
    eventually("a new controller", Duration::from_secs(10), || {
        cluster.broker(survivor).active_controller().is_some_and(|c| c != controller)
    })
    .await;
    let created = cluster.broker(survivor).create_topics(vec![topic("after", 2)], false).await.pop().unwrap();
    assert!(created.is_ok(), "{created:?}");
    eprintln!("failover to a working controller took {} ms", started.elapsed().as_millis());

    // The stopped broker misses its session: fenced, its partitions without a leader.
    eventually("the stopped broker is fenced", Duration::from_millis(SESSION_TIMEOUT_MS * 4), || {
        cluster.broker(survivor).metadata().brokers.get(&controller).is_some_and(|b| b.fenced)
    })
    .await;
    let led_by_stopped: Vec<i32> = {
        let state = cluster.broker(survivor).metadata();
        let t = state.topic("t").unwrap();
        (0..3).filter(|p| t.partition(*p).unwrap().isr == vec![controller]).collect()
    };
    assert_eq!(led_by_stopped.len(), 1, "one of three partitions was the stopped broker's");
    assert_eq!(leader_of(cluster.broker(survivor), "t", led_by_stopped[0]), -1);

    // Back from its data directory: it catches up, is unfenced and leads its partition again.
    cluster.restart(controller).await;
    let state = cluster.broker(controller).metadata();
    assert!(state.topic("after").is_some(), "the restarted node caught up with what it missed");
    eventually("leader back", Duration::from_secs(5), || {
        leader_of(cluster.broker(survivor), "t", led_by_stopped[0]) == controller
    })
    .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_majority_changes_fail_clearly_and_data_still_flows() {
    let mut cluster = Cluster::start(3).await;
    cluster.broker(1).create_topics(vec![topic("t", 3)], false).await.pop().unwrap().unwrap();
    let controller = cluster.broker(1).active_controller().unwrap();
    let others: Vec<i32> = (1..=3).filter(|id| *id != controller).collect();
    let (keep, drop_) = (others[0], others[1]);
    cluster.stop(controller).await;
    cluster.stop(drop_).await;
    let started = Instant::now();
    let refused = cluster.broker(keep).create_topics(vec![topic("nope", 1)], false).await.pop().unwrap().unwrap_err();
    assert!(matches!(refused.kind, ErrorKind::NotController | ErrorKind::TimedOut), "{refused}");
    assert!(started.elapsed() < Duration::from_secs(10), "the failure took {:?}", started.elapsed());
    eprintln!("without a majority: {refused} (after {} ms)", started.elapsed().as_millis());
    // The remaining broker still serves the partition it leads, within its session timeout.
    let led = (0..3).find(|p| leader_of(cluster.broker(keep), "t", *p) == keep).unwrap();
    let partition = cluster.broker(keep).partition("t", led).unwrap();
    cluster.broker(keep).append(partition, batch(), Acks::All).await.unwrap();
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_status_lists_every_node_and_bounds_the_wait_for_a_stopped_one() {
    let mut cluster = Cluster::start(3).await;
    cluster.broker(2).create_topics(vec![topic("t", 3)], false).await.pop().unwrap().unwrap();
    let controller = cluster.broker(1).active_controller().unwrap();

    // The others apply the topic a moment after the node that asked: wait until all agree.
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        let status = cluster.broker(controller).cluster_status().await;
        let applied: Vec<Option<i64>> =
            status.nodes.iter().map(|n| n.status.as_ref().map(|s| s.applied_offset)).collect();
        if applied.iter().all(|a| *a == Some(status.metadata_offset)) {
            break status;
        }
        assert!(Instant::now() < deadline, "applied offsets never agreed: {applied:?} vs {}", status.metadata_offset);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status.cluster_id, cluster.broker(1).cluster_id());
    assert_eq!((status.node_id, status.controller), (controller, Some(controller)));
    assert!(status.metadata_offset > 0, "{status:?}");
    assert_eq!(status.nodes.iter().map(|n| n.id).collect::<Vec<_>>(), [1, 2, 3]);
    for node in &status.nodes {
        assert!(node.broker && node.controller, "{node:?}");
        assert_eq!(node.quorum, Some(QuorumMembership::Voter), "{node:?}");
        assert!(node.registered && node.reachable && node.error.is_none(), "{node:?}");
        assert_eq!(node.fenced, Some(false), "{node:?}");
        let own = node.status.as_ref().unwrap();
        assert_eq!(own.node_id, node.id);
        assert!(own.may_lead, "{node:?}");
        assert_eq!(own.quorum.role == "Leader", node.id == controller, "{node:?}");
        assert_eq!(node.advertised, Some(format!("127.0.0.1:{}", cluster.nodes[(node.id - 1) as usize].kafka_port)));
        let internal = format!("127.0.0.1:{}", cluster.nodes[(node.id - 1) as usize].controller_port);
        assert_eq!(node.internal_address.as_deref(), Some(internal.as_str()));
    }
    let terms: Vec<u64> = status.nodes.iter().map(|n| n.status.as_ref().unwrap().quorum.term).collect();
    assert!(terms.windows(2).all(|w| w[0] == w[1]), "one term: {terms:?}");
    // Any node answers the same, not only the controller.
    let elsewhere = cluster.broker(if controller == 1 { 2 } else { 1 }).cluster_status().await;
    assert_eq!(elsewhere.controller, Some(controller));
    assert_eq!(elsewhere.nodes.len(), 3);

    // A stopped node is unreachable at once, and fenced once its session ends; the answer never
    // waits for it longer than the status timeout.
    let stopped = (1..=3).find(|id| *id != controller).unwrap();
    cluster.stop(stopped).await;
    let bound = weir_broker::cluster::status::NODE_STATUS_TIMEOUT + Duration::from_secs(1);
    let deadline = Instant::now() + Duration::from_millis(SESSION_TIMEOUT_MS * 4);
    loop {
        let started = Instant::now();
        let status = cluster.broker(controller).cluster_status().await;
        assert!(started.elapsed() < bound, "cluster_status took {:?}", started.elapsed());
        let node = status.nodes.iter().find(|n| n.id == stopped).unwrap();
        assert!(!node.reachable && node.status.is_none(), "{node:?}");
        assert!(node.error.as_deref().is_some_and(|e| !e.is_empty()), "{node:?}");
        assert!(node.registered && node.controller, "still known from the metadata and the voters: {node:?}");
        if node.fenced == Some(true) {
            assert_eq!(status.nodes.iter().filter(|n| n.reachable).count(), 2);
            break;
        }
        assert!(Instant::now() < deadline, "the stopped node was never fenced: {node:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.shutdown().await;
}
