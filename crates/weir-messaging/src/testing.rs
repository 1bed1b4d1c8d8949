//! What the tests of this crate share: a real broker with its messaging stores in a temporary
//! directory, with one topic.

use std::collections::BTreeMap;
use std::sync::Arc;

use weir_broker::{Broker, BrokerConfig, NewTopic};

use crate::Messaging;

/// Opens a broker and its messaging stores with `settings` (which name `log.dirs`), and creates
/// `topic` with one partition. Needs a multi-threaded tokio runtime.
pub(crate) async fn open_with_topic(settings: BTreeMap<String, String>, topic: &str) -> (Arc<Broker>, Arc<Messaging>) {
    let config = BrokerConfig::from_settings(&settings).expect("config");
    let (broker, messaging) = tokio::task::spawn_blocking(move || {
        let broker = Broker::open(config).expect("open");
        let messaging = Messaging::open(&broker).expect("messaging");
        (broker, messaging)
    })
    .await
    .expect("join");
    let topic = NewTopic {
        name: topic.into(),
        partitions: 1,
        replication_factor: -1,
        assignments: Vec::new(),
        configs: BTreeMap::new(),
    };
    broker.create_topics(vec![topic], false).await.pop().expect("a result").expect("created");
    (broker, messaging)
}

/// [`open_with_topic`] in `dir`, with two shards of `__share_group_state` whose loading has
/// started (made at the first queue's load), as the engine's tests need.
pub(crate) async fn open_with_state_shards(dir: &std::path::Path, topic: &str) -> (Arc<Broker>, Arc<Messaging>) {
    let settings = [
        ("log.dirs".to_string(), dir.display().to_string()),
        ("messaging.state.topic.num.partitions".to_string(), "2".to_string()),
    ]
    .into_iter()
    .collect();
    let (broker, messaging) = open_with_topic(settings, topic).await;
    messaging.pop_states.start(&broker);
    (broker, messaging)
}
