//! Where a topic's partitions are led, from Metadata, asked again whenever a write or fetch
//! finds the leader moved or gone.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{InitProducerIdRequest, MetadataRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::cluster::parse_bootstrap;
use crate::error::check;
use crate::native::connection::Connection;
use crate::ClientError;

/// Metadata v12: leaders, broker addresses, and the topic's id (not used here).
const METADATA_VERSION: i16 = 12;
/// InitProducerId v4 (flexible, producer id and epoch in the request).
const INIT_PRODUCER_ID_VERSION: i16 = 4;

#[derive(Default)]
struct Table {
    /// The brokers the last answer listed: node id → `host:port`.
    brokers: BTreeMap<i32, String>,
    /// Each partition's leader (`None`: none right now).
    leaders: Vec<Option<i32>>,
}

pub(crate) struct Routes {
    bootstrap: Vec<String>,
    pub(crate) client_id: String,
    pub(crate) timeout: Duration,
    pub(crate) topic: String,
    table: Mutex<Table>,
}

impl Routes {
    /// Asks a bootstrap broker for the topic's partitions; fails when the topic does not exist.
    pub(crate) async fn new(
        bootstrap: &str,
        client_id: &str,
        timeout: Duration,
        topic: &str,
    ) -> Result<Routes, ClientError> {
        let routes = Routes {
            bootstrap: parse_bootstrap(bootstrap)?,
            client_id: client_id.to_string(),
            timeout,
            topic: topic.to_string(),
            table: Mutex::new(Table::default()),
        };
        routes.refresh().await?;
        Ok(routes)
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn partition_count(&self) -> usize {
        self.table().leaders.len()
    }

    /// The address of `partition`'s leader, as last learned.
    pub(crate) fn leader(&self, partition: i32) -> Option<String> {
        let table = self.table();
        let leader = (*table.leaders.get(usize::try_from(partition).ok()?)?)?;
        table.brokers.get(&leader).cloned()
    }

    /// The address of `partition`'s leader, asking Metadata again when none is known.
    pub(crate) async fn find_leader(&self, partition: i32) -> Result<String, ClientError> {
        if let Some(leader) = self.leader(partition) {
            return Ok(leader);
        }
        self.refresh().await?;
        self.leader(partition)
            .ok_or_else(|| ClientError::Unavailable(format!("partition {partition} has no leader now")))
    }

    /// Any broker: the known ones first, then the bootstrap list.
    fn candidates(&self) -> Vec<String> {
        let mut list: Vec<String> = self.table().brokers.values().cloned().collect();
        list.extend(self.bootstrap.iter().cloned());
        list
    }

    /// A connection to any broker that answers.
    pub(crate) async fn any_broker(&self) -> Result<Connection, ClientError> {
        let mut failures = Vec::new();
        for addr in self.candidates() {
            match Connection::connect(&addr, &self.client_id, self.timeout).await {
                Ok(connection) => return Ok(connection),
                Err(e) => failures.push(e.to_string()),
            }
        }
        Err(ClientError::Unavailable(format!("no broker answered: {}", failures.join("; "))))
    }

    /// Asks Metadata of the topic again.
    pub(crate) async fn refresh(&self) -> Result<(), ClientError> {
        let mut connection = self.any_broker().await?;
        let request =
            MetadataRequest::default()
                .with_allow_auto_topic_creation(false)
                .with_topics(Some(vec![MetadataRequestTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_string(self.topic.clone()))))]));
        let response = connection.request(METADATA_VERSION, &request, Duration::ZERO).await?;
        let topic = response
            .topics
            .first()
            .ok_or_else(|| ClientError::Decode("a Metadata answer without the topic asked".into()))?;
        check(topic.error_code, || format!("looking up topic '{}'", self.topic))?;
        let mut leaders = vec![None; topic.partitions.len()];
        for partition in &topic.partitions {
            if let Some(slot) = usize::try_from(partition.partition_index).ok().and_then(|i| leaders.get_mut(i)) {
                *slot = (partition.leader_id.0 >= 0).then_some(partition.leader_id.0);
            }
        }
        let brokers =
            response.brokers.iter().map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port))).collect();
        *self.table() = Table { brokers, leaders };
        Ok(())
    }

    /// A new idempotent producer id (and its epoch) from any broker.
    pub(crate) async fn init_producer_id(&self) -> Result<(i64, i16), ClientError> {
        let mut connection = self.any_broker().await?;
        let request = InitProducerIdRequest::default()
            .with_transaction_timeout_ms(60_000)
            .with_producer_id(kafka_protocol::messages::ProducerId(-1))
            .with_producer_epoch(-1);
        let response = connection.request(INIT_PRODUCER_ID_VERSION, &request, Duration::ZERO).await?;
        check(response.error_code, || "asking for a producer id".to_string())?;
        Ok((response.producer_id.0, response.producer_epoch))
    }
}
