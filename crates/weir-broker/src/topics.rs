//! Topic administration through the controller: create, auto-create, delete, grow and alter
//! topics. Each operation is a control request that the active controller decides
//! (`weir_controller::topics`) and commits to the metadata log; the answer comes back once this
//! node applied it, so a topic created here is visible here at once.

use std::collections::BTreeMap;
use std::sync::Arc;

use uuid::Uuid;

use crate::broker::{unexpected_answer, Broker, CreatedTopic, NewTopic};
use crate::cluster::{ControlAnswer, ControlRequest};
use crate::error::{BrokerError, ErrorKind};
use crate::metadata::TopicMetadata;
use crate::{placement, topic_config};

impl Broker {
    /// Checks a topic name against Kafka's rules (the controller's: `weir_controller::topics`).
    pub fn validate_topic_name(name: &str) -> Result<(), BrokerError> {
        weir_controller::topics::validate_topic_name(name)
    }

    /// Creates topics (each independently; one failure does not stop the others). With
    /// `validate_only` nothing changes but every check runs.
    pub async fn create_topics(
        self: &Arc<Self>,
        topics: Vec<NewTopic>,
        validate_only: bool,
    ) -> Vec<Result<CreatedTopic, BrokerError>> {
        // This broker's own check first (tiering needs a store here); the controller decides
        // the rest. Results stay in the order of the request.
        let refusals: Vec<Option<BrokerError>> = topics.iter().map(|t| self.check_tiering_of_new(t).err()).collect();
        let allowed: Vec<NewTopic> =
            topics.into_iter().zip(&refusals).filter(|(_, refused)| refused.is_none()).map(|(t, _)| t).collect();
        let count = allowed.len();
        let mut decided = if count == 0 {
            Vec::new()
        } else {
            match self.control(ControlRequest::CreateTopics { topics: allowed, validate_only }).await {
                Ok(ControlAnswer::CreatedTopics(results)) if results.len() == count => results,
                Ok(other) => vec![Err(unexpected_answer(&other)); count],
                Err(e) => vec![Err(e); count],
            }
        }
        .into_iter();
        refusals
            .into_iter()
            .map(|refused| match refused {
                Some(e) => Err(e),
                None => decided.next().unwrap_or_else(|| Err(BrokerError::new(ErrorKind::Internal, "no result"))),
            })
            .collect()
    }

    /// [`Broker::create_topics`] from blocking code.
    pub fn create_topics_blocking(
        self: &Arc<Self>,
        topics: Vec<NewTopic>,
        validate_only: bool,
    ) -> Vec<Result<CreatedTopic, BrokerError>> {
        let count = topics.len();
        match crate::runtime::block_on(self.create_topics(topics, validate_only)) {
            Ok(results) => results,
            Err(e) => vec![Err(e); count],
        }
    }

    /// The brokers partitions can be placed on: the registered, unfenced ones, in placement
    /// order (by id; rack-alternating when brokers have racks).
    pub fn brokers(&self) -> Vec<i32> {
        placement::unfenced_brokers(&self.metadata())
    }

    /// Creates `name` with the broker's defaults if it does not exist (Metadata auto-creation).
    pub async fn auto_create_topic(self: &Arc<Self>, name: &str) -> Result<TopicMetadata, BrokerError> {
        self.auto_create_topic_with(name, BTreeMap::new()).await
    }

    /// [`Broker::auto_create_topic`] with topic `configs` a front-end's protocol implies (a
    /// RocketMQ topic takes RocketMQ's larger default body). A topic that exists is returned as
    /// it is.
    pub async fn auto_create_topic_with(
        self: &Arc<Self>,
        name: &str,
        configs: BTreeMap<String, String>,
    ) -> Result<TopicMetadata, BrokerError> {
        let topic = NewTopic {
            name: name.to_string(),
            partitions: -1,
            replication_factor: -1,
            assignments: Vec::new(),
            configs,
        };
        match self.create_topics(vec![topic], false).await.pop() {
            Some(Ok(created)) => Ok(created.topic),
            Some(Err(e)) if e.kind == ErrorKind::TopicExists => self
                .metadata()
                .topic(name)
                .cloned()
                .ok_or_else(|| BrokerError::new(ErrorKind::UnknownTopicOrPartition, "topic was deleted meanwhile")),
            Some(Err(e)) => Err(e),
            None => Err(BrokerError::new(ErrorKind::Internal, "no result")),
        }
    }

    /// Creates an internal topic (name starting with `__`) unless it exists; returns its metadata.
    pub async fn ensure_internal_topic(
        self: &Arc<Self>,
        name: &str,
        partitions: i32,
        configs: BTreeMap<String, String>,
    ) -> Result<TopicMetadata, BrokerError> {
        if let Some(topic) = self.metadata().topic(name) {
            return Ok(topic.clone());
        }
        let request = ControlRequest::EnsureInternalTopic { name: name.to_string(), partitions, configs };
        match self.control(request).await? {
            ControlAnswer::Topic(topic) => Ok(topic),
            other => Err(unexpected_answer(&other)),
        }
    }

    /// Deletes a topic by name or id.
    pub async fn delete_topic(
        self: &Arc<Self>,
        name: Option<String>,
        id: Option<Uuid>,
    ) -> Result<TopicMetadata, BrokerError> {
        match self.control(ControlRequest::DeleteTopic { name, id }).await? {
            ControlAnswer::Topic(topic) => Ok(topic),
            other => Err(unexpected_answer(&other)),
        }
    }

    /// Grows a topic to `count` partitions, the new ones on the `assignments` given (one replica
    /// list per new partition) or placed like the topic's.
    pub async fn create_partitions(
        self: &Arc<Self>,
        name: String,
        count: i32,
        assignments: Option<Vec<Vec<i32>>>,
        validate_only: bool,
    ) -> Result<(), BrokerError> {
        match self.control(ControlRequest::CreatePartitions { name, count, assignments, validate_only }).await? {
            ControlAnswer::Done => Ok(()),
            other => Err(unexpected_answer(&other)),
        }
    }

    /// Changes a topic's config overrides by `edit`, applied to the overrides current when the
    /// controller decides (so concurrent edits do not race).
    pub async fn alter_topic_configs(
        self: &Arc<Self>,
        name: String,
        validate_only: bool,
        edit: topic_config::ConfigEdit,
    ) -> Result<(), BrokerError> {
        if let Some(topic) = self.metadata().topic(&name) {
            self.check_tiering_edit(&topic.configs, &edit)?;
        }
        match self.control(ControlRequest::AlterTopicConfigs { name, validate_only, edit }).await? {
            ControlAnswer::Done => Ok(()),
            other => Err(unexpected_answer(&other)),
        }
    }
}
