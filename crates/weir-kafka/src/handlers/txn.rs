//! Transactions: AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn (the producer's
//! side), DescribeTransactions and ListTransactions (operators). The coordinator is
//! `weir_coordinators::txn::TxnCoordinator`; InitProducerId with a transactional id is in
//! `handlers::producer`.

use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::describe_transactions_response::{TopicData, TransactionState};
use kafka_protocol::messages::list_transactions_response::TransactionState as ListedTransaction;
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use weir_broker::BrokerError;
use weir_coordinators::txn::{PendingOffset, ProducerIdentity};

use super::{commit_generation, committed_leader_epoch};
use weir_security::acl::{AclOperation, ResourceType};

use crate::context::{Client, Ctx};
use crate::errors;

fn code(result: &Result<(), BrokerError>) -> i16 {
    match result {
        Ok(()) => 0,
        Err(e) => {
            tracing::debug!(error = %e, "transaction request refused");
            errors::code(e)
        }
    }
}

/// Runs a blocking coordinator call off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, BrokerError> + Send + 'static,
) -> Result<T, BrokerError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| Err(BrokerError::internal(e.to_string())))
}

/// TRANSACTIONAL_ID_AUTHORIZATION_FAILED unless the client may WRITE the transactional id.
fn transaction_refused(ctx: &Ctx, client: &Client, transactional_id: &str) -> Option<ResponseError> {
    (!ctx.allowed(client, AclOperation::Write, ResourceType::TransactionalId, transactional_id))
        .then_some(ResponseError::TransactionalIdAuthorizationFailed)
}

pub(crate) async fn add_partitions(
    ctx: &Ctx,
    client: &Client,
    request: AddPartitionsToTxnRequest,
) -> AddPartitionsToTxnResponse {
    if let Some(error) = transaction_refused(ctx, client, &request.v3_and_below_transactional_id) {
        // Every partition carries the refusal (the v0-3 response has no top-level error).
        let topics = request
            .v3_and_below_topics
            .iter()
            .map(|t| {
                let results = t
                    .partitions
                    .iter()
                    .map(|p| {
                        AddPartitionsToTxnPartitionResult::default()
                            .with_partition_index(*p)
                            .with_partition_error_code(error.code())
                    })
                    .collect();
                AddPartitionsToTxnTopicResult::default().with_name(t.name.clone()).with_results_by_partition(results)
            })
            .collect();
        return AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(topics);
    }
    let topic_refused: Vec<String> = request
        .v3_and_below_topics
        .iter()
        .filter(|t| !ctx.allowed_on_topic(client, AclOperation::Write, &t.name))
        .map(|t| t.name.to_string())
        .collect();
    // v0-3: one transaction per request (the client's form).
    let who = ProducerIdentity {
        producer_id: request.v3_and_below_producer_id.0,
        producer_epoch: request.v3_and_below_producer_epoch,
    };
    let txn_id = request.v3_and_below_transactional_id.to_string();
    let partitions: Vec<(String, i32)> = request
        .v3_and_below_topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(move |p| (t.name.to_string(), *p)))
        .collect();
    let txns = ctx.txns.clone();
    let asked = partitions.clone();
    // Kafka adds none of the partitions when one topic is refused: the others are NOT_ATTEMPTED.
    let outcomes = if topic_refused.is_empty() {
        tokio::task::spawn_blocking(move || txns.add_partitions(&txn_id, who, &asked))
            .await
            .unwrap_or_else(|_| vec![Some(BrokerError::internal("task failed")); partitions.len()])
    } else {
        partitions
            .iter()
            .map(|(topic, _)| {
                let kind = if topic_refused.contains(topic) {
                    weir_broker::ErrorKind::TopicAuthorizationFailed
                } else {
                    weir_broker::ErrorKind::NotAttempted
                };
                Some(BrokerError::new(kind, "WRITE on a topic of the request is needed"))
            })
            .collect()
    };
    let mut topics: Vec<AddPartitionsToTxnTopicResult> = Vec::new();
    for ((topic, partition), outcome) in partitions.into_iter().zip(outcomes) {
        let result = AddPartitionsToTxnPartitionResult::default()
            .with_partition_index(partition)
            .with_partition_error_code(outcome.map_or(0, |e| errors::code(&e)));
        match topics.iter_mut().find(|t| t.name.as_str() == topic) {
            Some(t) => t.results_by_partition.push(result),
            None => topics.push(
                AddPartitionsToTxnTopicResult::default()
                    .with_name(TopicName(StrBytes::from_string(topic)))
                    .with_results_by_partition(vec![result]),
            ),
        }
    }
    AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(topics)
}

pub(crate) async fn add_offsets(
    ctx: &Ctx,
    client: &Client,
    request: AddOffsetsToTxnRequest,
) -> AddOffsetsToTxnResponse {
    if let Some(error) = transaction_refused(ctx, client, &request.transactional_id) {
        return AddOffsetsToTxnResponse::default().with_error_code(error.code());
    }
    if !ctx.allowed_on_group(client, AclOperation::Read, &request.group_id) {
        return AddOffsetsToTxnResponse::default().with_error_code(ResponseError::GroupAuthorizationFailed.code());
    }
    let who = ProducerIdentity { producer_id: request.producer_id.0, producer_epoch: request.producer_epoch };
    let (txns, txn_id, group) = (ctx.txns.clone(), request.transactional_id.to_string(), request.group_id.to_string());
    let result = blocking(move || txns.add_offsets(&txn_id, who, &group)).await;
    AddOffsetsToTxnResponse::default().with_error_code(code(&result))
}

pub(crate) async fn txn_offset_commit(
    ctx: &Ctx,
    client: &Client,
    request: TxnOffsetCommitRequest,
) -> TxnOffsetCommitResponse {
    let who = ProducerIdentity { producer_id: request.producer_id.0, producer_epoch: request.producer_epoch };
    let group = request.group_id.to_string();
    // WRITE on the transactional id, READ on the group: refused, every partition says so.
    let authorized = ctx
        .require(client, AclOperation::Write, ResourceType::TransactionalId, &request.transactional_id)
        .and_then(|()| ctx.require(client, AclOperation::Read, ResourceType::Group, &group));
    let mut offsets = Vec::new();
    for topic in &request.topics {
        for p in &topic.partitions {
            offsets.push(PendingOffset {
                topic: topic.name.to_string(),
                partition: p.partition_index,
                offset: p.committed_offset,
                leader_epoch: if client.version >= 2 { committed_leader_epoch(p.committed_leader_epoch) } else { None },
                metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
            });
        }
    }
    // v3+ (KIP-447): the member's generation is checked like an OffsetCommit's.
    let member_check = if client.version >= 3 {
        ctx.groups
            .validate_transactional_commit(
                &group,
                commit_generation(request.generation_id),
                request.member_id.as_str(),
                request.group_instance_id.as_ref().map(|i| i.as_str()),
            )
            .map_err(|kind| BrokerError::new(kind, "the consumer's group membership is stale"))
    } else {
        Ok(())
    };
    let unknown: Vec<bool> = offsets.iter().map(|o| !ctx.broker.partition_exists(&o.topic, o.partition)).collect();
    let result = match authorized.and(member_check) {
        Err(e) => Err(e),
        Ok(()) => {
            let (txns, txn_id, group, known) = (
                ctx.txns.clone(),
                request.transactional_id.to_string(),
                group.clone(),
                offsets.iter().zip(&unknown).filter(|(_, u)| !**u).map(|(o, _)| o.clone()).collect(),
            );
            blocking(move || txns.txn_offset_commit(&txn_id, who, &group, known)).await
        }
    };
    let common = code(&result);
    let topics = request
        .topics
        .iter()
        .map(|topic| {
            let partitions = topic
                .partitions
                .iter()
                .map(|p| {
                    let missing = !ctx.broker.partition_exists(topic.name.as_str(), p.partition_index);
                    let error = if missing { ResponseError::UnknownTopicOrPartition.code() } else { common };
                    TxnOffsetCommitResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(error)
                })
                .collect();
            TxnOffsetCommitResponseTopic::default().with_name(topic.name.clone()).with_partitions(partitions)
        })
        .collect();
    TxnOffsetCommitResponse::default().with_topics(topics)
}

pub(crate) async fn end_txn(ctx: &Ctx, client: &Client, request: EndTxnRequest) -> EndTxnResponse {
    if let Some(error) = transaction_refused(ctx, client, &request.transactional_id) {
        return EndTxnResponse::default().with_error_code(error.code());
    }
    let who = ProducerIdentity { producer_id: request.producer_id.0, producer_epoch: request.producer_epoch };
    let (txns, txn_id, commit) = (ctx.txns.clone(), request.transactional_id.to_string(), request.committed);
    let result = blocking(move || txns.end_txn(&txn_id, who, commit)).await;
    EndTxnResponse::default().with_error_code(code(&result))
}

pub(crate) async fn describe_transactions(
    ctx: &Ctx,
    client: &Client,
    request: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    let states = request
        .transactional_ids
        .iter()
        .map(|id| {
            let base = TransactionState::default().with_transactional_id(id.clone());
            if let Err(e) = ctx.require(client, AclOperation::Describe, ResourceType::TransactionalId, id) {
                return base.with_error_code(errors::code(&e));
            }
            if let Err(e) = ctx.txns.check_coordinator(id.as_str()) {
                return base.with_error_code(errors::code(&e));
            }
            match ctx.txns.describe(id.as_str()) {
                None => base.with_error_code(ResponseError::TransactionalIdNotFound.code()),
                Some(meta) => {
                    let mut topics: Vec<TopicData> = Vec::new();
                    for (topic, partition) in &meta.partitions {
                        match topics.iter_mut().find(|t| t.topic.as_str() == topic) {
                            Some(t) => t.partitions.push(*partition),
                            None => topics.push(
                                TopicData::default()
                                    .with_topic(TopicName(StrBytes::from_string(topic.clone())))
                                    .with_partitions(vec![*partition]),
                            ),
                        }
                    }
                    base.with_transaction_state(StrBytes::from_static_str(meta.state.name()))
                        .with_transaction_timeout_ms(meta.timeout_ms)
                        .with_transaction_start_time_ms(meta.started_ms)
                        .with_producer_id(ProducerId(meta.producer_id))
                        .with_producer_epoch(meta.producer_epoch)
                        .with_topics(topics)
                }
            }
        })
        .collect();
    DescribeTransactionsResponse::default().with_transaction_states(states)
}

pub(crate) async fn list_transactions(
    ctx: &Ctx,
    client: &Client,
    request: ListTransactionsRequest,
) -> ListTransactionsResponse {
    // Kafka lists the transactional ids the client may DESCRIBE.
    const KNOWN: [&str; 6] = ["Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort"];
    let filters: Vec<String> = request.state_filters.iter().map(|s| s.to_string()).collect();
    let unknown: Vec<StrBytes> =
        filters.iter().filter(|f| !KNOWN.contains(&f.as_str())).map(|f| StrBytes::from_string(f.clone())).collect();
    let producer_ids: Vec<i64> = request.producer_id_filters.iter().map(|p| p.0).collect();
    let now = ctx.broker.now_ms();
    let states = ctx
        .txns
        .list(&filters, &producer_ids)
        .into_iter()
        // v1+: only transactions running longer than the duration filter (-1: all).
        .filter(|m| request.duration_filter < 0 || now.saturating_sub(m.started_ms) >= request.duration_filter)
        .filter(|m| ctx.allowed(client, AclOperation::Describe, ResourceType::TransactionalId, &m.transactional_id))
        .map(|m| {
            ListedTransaction::default()
                .with_transactional_id(TransactionalId(StrBytes::from_string(m.transactional_id)))
                .with_producer_id(ProducerId(m.producer_id))
                .with_transaction_state(StrBytes::from_static_str(m.state.name()))
        })
        .collect();
    ListTransactionsResponse::default().with_unknown_state_filters(unknown).with_transaction_states(states)
}
