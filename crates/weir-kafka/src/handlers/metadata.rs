//! Metadata: the one broker, and topics with their partitions (this broker leads them all).
//! Unknown topics are auto-created when both the client and `auto.create.topics.enable` allow.

use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use uuid::Uuid;
use weir_broker::metadata::TopicMetadata;
use weir_broker::Broker;

use crate::context::{Client, Ctx};
use crate::handlers::authorized_operations;

pub async fn handle(ctx: &Ctx, client: &Client, request: MetadataRequest) -> MetadataResponse {
    let broker = &ctx.broker;
    let config = &broker.config;
    // v0 has no flag and always auto-creates; v4+ says whether the client wants it.
    let client_allows = client.version < 4 || request.allow_auto_topic_creation;
    let mut topics = Vec::new();
    match request.topics.clone() {
        None => {
            for topic in broker.metadata().topics.values() {
                topics.push(topic_response(ctx, client.version, topic));
            }
        }
        // v0: an empty list means all topics.
        Some(list) if list.is_empty() && client.version == 0 => {
            for topic in broker.metadata().topics.values() {
                topics.push(topic_response(ctx, client.version, topic));
            }
        }
        Some(list) => {
            for requested in list {
                let by_name = requested.name.as_ref().map(|n| n.to_string());
                let response = match by_name {
                    Some(name) => {
                        let existing = broker.metadata().topic(&name).cloned();
                        match existing {
                            Some(topic) => topic_response(ctx, client.version, &topic),
                            None => {
                                if let Err(e) = Broker::validate_topic_name(&name) {
                                    error_topic(Some(&name), Uuid::nil(), e.code)
                                } else if client_allows && config.auto_create_topics {
                                    match broker.auto_create_topic(&name).await {
                                        Ok(topic) => topic_response(ctx, client.version, &topic),
                                        Err(e) => error_topic(Some(&name), Uuid::nil(), e.code),
                                    }
                                } else {
                                    error_topic(Some(&name), Uuid::nil(), ResponseError::UnknownTopicOrPartition)
                                }
                            }
                        }
                    }
                    None => match broker.metadata().topic_by_id(requested.topic_id).cloned() {
                        Some(topic) => topic_response(ctx, client.version, &topic),
                        None => error_topic(None, requested.topic_id, ResponseError::UnknownTopicId),
                    },
                };
                topics.push(response);
            }
        }
    }
    let mut response = MetadataResponse::default()
        .with_brokers(vec![MetadataResponseBroker::default()
            .with_node_id(BrokerId(config.node_id))
            .with_host(StrBytes::from_string(config.advertised_host.clone()))
            .with_port(config.advertised_port as i32)])
        .with_topics(topics);
    if client.version >= 1 {
        response = response.with_controller_id(BrokerId(config.node_id));
    }
    if client.version >= 2 {
        response = response.with_cluster_id(Some(StrBytes::from_string(broker.cluster_id())));
    }
    if (8..=10).contains(&client.version) && request.include_cluster_authorized_operations {
        response = response.with_cluster_authorized_operations(authorized_operations::CLUSTER);
    }
    if client.version >= 8 && request.include_topic_authorized_operations {
        for topic in &mut response.topics {
            if topic.error_code == 0 {
                topic.topic_authorized_operations = authorized_operations::TOPIC;
            }
        }
    }
    response
}

fn topic_response(ctx: &Ctx, version: i16, topic: &TopicMetadata) -> MetadataResponseTopic {
    let node = BrokerId(ctx.broker.config.node_id);
    let partitions = (0..topic.partitions)
        .map(|index| {
            MetadataResponsePartition::default()
                .with_partition_index(index)
                .with_leader_id(node)
                .with_leader_epoch(if version >= 7 { 0 } else { -1 })
                .with_replica_nodes(vec![node])
                .with_isr_nodes(vec![node])
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
