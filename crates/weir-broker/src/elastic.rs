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
