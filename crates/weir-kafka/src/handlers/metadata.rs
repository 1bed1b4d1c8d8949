//! Metadata: the brokers, and topics with their partitions' replicas, ISR, leaders and leader
//! epochs, as the applied metadata has them.
//! Unknown topics are auto-created when both the client and `auto.create.topics.enable` allow.

use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use uuid::Uuid;
use weir_broker::metadata::{TopicMetadata, NO_LEADER};
use weir_broker::Broker;

use crate::context::{Client, Ctx};
use crate::errors::kafka_error;
use crate::handlers::authorized_operations;
use weir_security::acl::AclOperation;

pub(crate) async fn handle(ctx: &Ctx, client: &Client, request: MetadataRequest) -> MetadataResponse {
    let broker = &ctx.broker;
    let config = &broker.config;
    // v0 has no flag and always auto-creates; v4+ says whether the client wants it.
    let client_allows = client.version < 4 || request.allow_auto_topic_creation;
    let mut topics = Vec::new();
    match request.topics.clone() {
        None => {
            for topic in broker.metadata().topics.values() {
                if ctx.allowed_on_topic(client, AclOperation::Describe, &topic.name) {
                    topics.push(topic_response(client.version, topic));
                }
            }
        }
        // v0: an empty list means all topics.
        Some(list) if list.is_empty() && client.version == 0 => {
            for topic in broker.metadata().topics.values() {
                if ctx.allowed_on_topic(client, AclOperation::Describe, &topic.name) {
                    topics.push(topic_response(client.version, topic));
                }
            }
        }
        Some(list) => {
            for requested in list {
                let by_name = requested.name.as_ref().map(|n| n.to_string());
                let response = match by_name {
                    Some(name) if !ctx.allowed_on_topic(client, AclOperation::Describe, &name) => {
                        error_topic(Some(&name), Uuid::nil(), ResponseError::TopicAuthorizationFailed)
                    }
                    Some(name) => {
                        let existing = broker.metadata().topic(&name).cloned();
                        match existing {
                            Some(topic) => topic_response(client.version, &topic),
                            None => {
                                if let Err(e) = Broker::validate_topic_name(&name) {
                                    error_topic(Some(&name), Uuid::nil(), kafka_error(e.kind))
                                } else if client_allows && config.auto_create_topics && !may_create(ctx, client, &name)
                                {
                                    error_topic(Some(&name), Uuid::nil(), ResponseError::TopicAuthorizationFailed)
                                } else if client_allows && config.auto_create_topics {
                                    match broker.auto_create_topic(&name).await {
                                        Ok(topic) => topic_response(client.version, &topic),
                                        Err(e) => error_topic(Some(&name), Uuid::nil(), kafka_error(e.kind)),
                                    }
                                } else {
                                    error_topic(Some(&name), Uuid::nil(), ResponseError::UnknownTopicOrPartition)
                                }
                            }
                        }
                    }
                    None => match broker.metadata().topic_by_id(requested.topic_id).cloned() {
                        Some(topic) if !ctx.allowed_on_topic(client, AclOperation::Describe, &topic.name) => {
                            error_topic(None, requested.topic_id, ResponseError::TopicAuthorizationFailed)
                        }
                        Some(topic) => topic_response(client.version, &topic),
                        None => error_topic(None, requested.topic_id, ResponseError::UnknownTopicId),
                    },
                };
                topics.push(response);
            }
        }
    }
    // Every live broker of the cluster, and those fenced a moment ago, each with its advertised
    // listener (see `Broker::brokers_for_clients`).
    let brokers = broker
        .brokers_for_clients()
        .into_iter()
        .map(|b| {
            let (host, port) = ctx.endpoint(&b, client.listener);
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(b.id))
                .with_host(StrBytes::from_string(host.to_string()))
                .with_port(i32::from(port))
                .with_rack(b.rack.map(StrBytes::from_string))
        })
        .collect();
    let mut response = MetadataResponse::default().with_brokers(brokers).with_topics(topics);
    if client.version >= 1 {
        response = response.with_controller_id(BrokerId(broker.controller_for_clients().unwrap_or(-1)));
    }
    if client.version >= 2 {
        response = response.with_cluster_id(Some(StrBytes::from_string(broker.cluster_id())));
    }
    if (8..=10).contains(&client.version) && request.include_cluster_authorized_operations {
        response = response.with_cluster_authorized_operations(authorized_operations::on_cluster(ctx, client));
    }
    if client.version >= 8 && request.include_topic_authorized_operations {
        for topic in &mut response.topics {
            if topic.error_code == 0 {
                let name = topic.name.as_ref().map(|n| n.to_string()).unwrap_or_default();
                topic.topic_authorized_operations = authorized_operations::on_topic(ctx, client, &name);
            }
        }
    }
    response
}

/// May the client create `topic`: CREATE on the cluster, or on the topic?
pub(crate) fn may_create(ctx: &Ctx, client: &Client, topic: &str) -> bool {
    ctx.allowed_on_cluster(client, AclOperation::Create) || ctx.allowed_on_topic(client, AclOperation::Create, topic)
}

fn topic_response(version: i16, topic: &TopicMetadata) -> MetadataResponseTopic {
    let partitions = topic
        .assignments
        .iter()
        .enumerate()
        .map(|(index, state)| {
            let brokers = |ids: &[i32]| ids.iter().map(|b| BrokerId(*b)).collect::<Vec<_>>();
            let leaderless = state.leader == NO_LEADER;
            MetadataResponsePartition::default()
                .with_error_code(if leaderless { ResponseError::LeaderNotAvailable.code() } else { 0 })
                .with_partition_index(index as i32)
                .with_leader_id(BrokerId(state.leader))
                .with_leader_epoch(if version >= 7 { state.leader_epoch } else { -1 })
                .with_replica_nodes(brokers(&state.replicas))
                .with_isr_nodes(brokers(&state.isr))
        })
        .collect();
    MetadataResponseTopic::default()
        .with_name(Some(TopicName(StrBytes::from_string(topic.name.clone()))))
        .with_topic_id(if version >= 10 { topic.id } else { Uuid::nil() })
        .with_is_internal(version >= 1 && topic.internal)
        .with_partitions(partitions)
}

fn error_topic(name: Option<&str>, id: Uuid, error: ResponseError) -> MetadataResponseTopic {
    MetadataResponseTopic::default()
        .with_name(name.map(|n| TopicName(StrBytes::from_string(n.to_string()))))
        .with_topic_id(id)
        .with_error_code(error.code())
}
