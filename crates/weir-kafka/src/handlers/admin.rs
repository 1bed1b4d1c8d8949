//! Admin APIs: topics, partitions, configs, records, cluster and log dirs.

use std::collections::BTreeMap;

use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::{CreatableTopicConfigs, CreatableTopicResult};
use kafka_protocol::messages::delete_records_response::{DeleteRecordsPartitionResult, DeleteRecordsTopicResult};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use weir_broker::throttle;
use weir_broker::topic_config::{self, ConfigEdit, ConfigOp, ConfigSource};
use weir_broker::{BrokerError, ErrorKind, NewTopic};

use weir_security::acl::{AclOperation, ResourceType};

use crate::context::{Client, Ctx};
use crate::errors;
use crate::handlers::{authorized_operations, message};

/// DescribeConfigs/AlterConfigs resource types.
const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
/// KIP-848's group resource: a group's settings (Weir's RocketMQ consumer settings).
const RESOURCE_GROUP: i8 = 32;

/// DescribeConfigs config sources.
const SOURCE_DYNAMIC_TOPIC: i8 = 1;
const SOURCE_DYNAMIC_BROKER: i8 = 2;
const SOURCE_DYNAMIC_DEFAULT_BROKER: i8 = 3;
const SOURCE_STATIC_BROKER: i8 = 4;
const SOURCE_DEFAULT: i8 = 5;
const SOURCE_DYNAMIC_GROUP: i8 = 8;

fn str(s: impl Into<String>) -> StrBytes {
    StrBytes::from_string(s.into())
}

fn topic_name(s: &str) -> TopicName {
    TopicName(str(s))
}

fn source_code(source: ConfigSource) -> i8 {
    match source {
        ConfigSource::Topic => SOURCE_DYNAMIC_TOPIC,
        ConfigSource::BrokerDefault => SOURCE_STATIC_BROKER,
        ConfigSource::Default => SOURCE_DEFAULT,
    }
}

/// DescribeConfigs' `config_type`, from the name (Kafka's ConfigType codes).
fn config_type(name: &str) -> i8 {
    const BOOLEAN: i8 = 1;
    const STRING: i8 = 2;
    const INT: i8 = 3;
    const LONG: i8 = 5;
    const DOUBLE: i8 = 6;
    const LIST: i8 = 7;
    match name {
        "cleanup.policy" | "listeners" | "advertised.listeners" | "log.dirs" | "log.cleanup.policy" => LIST,
        "min.cleanable.dirty.ratio" | "log.cleaner.min.cleanable.ratio" => DOUBLE,
        n if n.ends_with(".enable") => BOOLEAN,
        n if n.ends_with(".ms") || n == "retention.bytes" || n == "flush.messages" || n.ends_with(".minutes") => LONG,
        n if n.ends_with(".bytes") || n.ends_with("replicas") || n.ends_with(".partitions") || n == "node.id" => INT,
        _ => STRING,
    }
}

/// Kafka's message for THROTTLING_QUOTA_EXCEEDED.
const THROTTLED: &str = "The throttling quota has been exceeded.";

/// May this request create or delete `partitions` partitions under the client's
/// controller_mutation_rate (KIP-599; from version `strict_from` a request over the quota is
/// refused, before it the mutation is made and the client throttled after)?
fn mutation_allowed(ctx: &Ctx, client: &Client, partitions: i64, strict_from: i16) -> bool {
    client.charge.as_ref().is_none_or(|charge| charge.mutation_allowed(ctx, partitions, client.version >= strict_from))
}

pub(crate) async fn create_topics(ctx: &Ctx, client: &Client, request: CreateTopicsRequest) -> CreateTopicsResponse {
    let broker = &ctx.broker;
    let mut results = Vec::with_capacity(request.topics.len());
    let mut topics = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for topic in request.topics {
        let name = topic.name.to_string();
        if !seen.insert(name.clone()) {
            results.push(
                CreatableTopicResult::default()
                    .with_name(topic.name)
                    .with_error_code(ResponseError::InvalidRequest.code())
                    .with_error_message(message(format!("Duplicate topic name {name} in the request."))),
            );
            continue;
        }
        if !super::metadata::may_create(ctx, client, &name) {
            results.push(
                CreatableTopicResult::default()
                    .with_name(topic.name)
                    .with_error_code(ResponseError::TopicAuthorizationFailed.code())
                    .with_error_message(message(format!("CREATE on the cluster or on topic {name} is needed."))),
            );
            continue;
        }
        let partitions = if topic.num_partitions > 0 {
            topic.num_partitions
        } else if !topic.assignments.is_empty() {
            topic.assignments.len() as i32
        } else {
            broker.config.num_partitions
        };
        if !request.validate_only && !mutation_allowed(ctx, client, partitions.into(), 6) {
            results.push(
                CreatableTopicResult::default()
                    .with_name(topic.name)
                    .with_error_code(ResponseError::ThrottlingQuotaExceeded.code())
                    .with_error_message(message(THROTTLED)),
            );
            continue;
        }
        let mut configs = BTreeMap::new();
        for c in &topic.configs {
            if let Some(value) = &c.value {
                configs.insert(c.name.to_string(), value.to_string());
            }
        }
        topics.push(NewTopic {
            name,
            partitions: topic.num_partitions,
            replication_factor: topic.replication_factor,
            assignments: topic
                .assignments
                .iter()
                .map(|a| (a.partition_index, a.broker_ids.iter().map(|b| b.0).collect()))
                .collect(),
            configs,
        });
    }
    let names: Vec<String> = topics.iter().map(|t| t.name.clone()).collect();
    let outcomes = broker.create_topics(topics, request.validate_only).await;
    for (name, outcome) in names.into_iter().zip(outcomes) {
        let result = CreatableTopicResult::default().with_name(topic_name(&name));
        results.push(match outcome {
            Ok(created) => {
                let configs = topic_config::describe(&broker.topic_defaults(), &created.topic.configs)
                    .into_iter()
                    .map(|e| {
                        CreatableTopicConfigs::default()
                            .with_name(str(e.name))
                            .with_value(Some(str(e.value)))
                            .with_config_source(source_code(e.source))
                    })
                    .collect();
                let result = if client.version >= 7 { result.with_topic_id(created.topic.id) } else { result };
                if client.version >= 5 {
                    result
                        .with_num_partitions(created.topic.partitions)
                        .with_replication_factor(created.replication_factor)
                        .with_configs(Some(configs))
                } else {
                    result
                }
            }
            Err(e) => result.with_error_code(errors::code(&e)).with_error_message(message(e.message)),
        });
    }
    CreateTopicsResponse::default().with_topics(results)
}

pub(crate) async fn delete_topics(ctx: &Ctx, client: &Client, request: DeleteTopicsRequest) -> DeleteTopicsResponse {
    let targets: Vec<(Option<String>, Option<uuid::Uuid>)> = if client.version >= 6 {
        request
            .topics
            .iter()
            .map(|t| (t.name.as_ref().map(|n| n.to_string()), (!t.topic_id.is_nil()).then_some(t.topic_id)))
            .collect()
    } else {
        request.topic_names.iter().map(|n| (Some(n.to_string()), None)).collect()
    };
    let mut responses = Vec::with_capacity(targets.len());
    for (name, id) in targets {
        // DELETE on the topic, by name (a topic id is resolved to its name first).
        let known =
            name.clone().or_else(|| id.and_then(|id| ctx.broker.metadata().topic_by_id(id).map(|t| t.name.clone())));
        let allowed = match &known {
            Some(topic) => ctx.require(client, AclOperation::Delete, ResourceType::Topic, topic),
            None => Ok(()),
        };
        let partitions = known.as_deref().and_then(|t| ctx.broker.metadata().topic(t).map(|t| t.partitions));
        let allowed = allowed.and_then(|()| match partitions {
            Some(partitions) if !mutation_allowed(ctx, client, partitions.into(), 5) => {
                Err(BrokerError::new(ErrorKind::Throttled, THROTTLED))
            }
            _ => Ok(()),
        });
        let deleted = match allowed {
            Ok(()) => ctx.broker.delete_topic(name.clone(), id).await,
            Err(e) => Err(e),
        };
        let result = match deleted {
            Ok(topic) => DeletableTopicResult::default()
                .with_name(Some(topic_name(&topic.name)))
                .with_topic_id(if client.version >= 6 { topic.id } else { uuid::Uuid::nil() }),
            Err(e) => {
                let failed = DeletableTopicResult::default()
                    .with_name(name.as_deref().map(topic_name))
                    .with_topic_id(id.unwrap_or_default())
                    .with_error_code(errors::code(&e));
                if client.version >= 5 {
                    failed.with_error_message(message(e.message))
                } else {
                    failed
                }
            }
        };
        responses.push(result);
    }
    DeleteTopicsResponse::default().with_responses(responses)
}

pub(crate) async fn create_partitions(
    ctx: &Ctx,
    client: &Client,
    request: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut results = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let name = topic.name.to_string();
        // An empty list (what several clients send for "none") places the partitions like null.
        let assignments = topic
            .assignments
            .as_ref()
            .filter(|list| !list.is_empty())
            .map(|list| list.iter().map(|a| a.broker_ids.iter().map(|b| b.0).collect()).collect());
        let current = ctx.broker.metadata().topic(&name).map_or(0, |t| t.partitions);
        let throttled = !request.validate_only
            && topic.count > current
            && !mutation_allowed(ctx, client, i64::from(topic.count - current), 3);
        let outcome = match ctx.require(client, AclOperation::Alter, ResourceType::Topic, &name) {
            Ok(()) if throttled => Err(BrokerError::new(ErrorKind::Throttled, THROTTLED)),
            Ok(()) => ctx.broker.create_partitions(name, topic.count, assignments, request.validate_only).await,
            Err(e) => Err(e),
        };
        let result = CreatePartitionsTopicResult::default().with_name(topic.name);
        results.push(match outcome {
            Ok(()) => result,
            Err(e) => result.with_error_code(errors::code(&e)).with_error_message(message(e.message)),
        });
    }
    CreatePartitionsResponse::default().with_results(results)
}

pub(crate) async fn describe_configs(
    ctx: &Ctx,
    client: &Client,
    request: DescribeConfigsRequest,
) -> DescribeConfigsResponse {
    let broker = &ctx.broker;
    let mut results = Vec::with_capacity(request.resources.len());
    for resource in request.resources {
        let name = resource.resource_name.to_string();
        let wanted =
            |key: &str| resource.configuration_keys.as_ref().is_none_or(|keys| keys.iter().any(|k| k.as_str() == key));
        let base = DescribeConfigsResult::default()
            .with_resource_type(resource.resource_type)
            .with_resource_name(resource.resource_name.clone());
        if let Err(e) = config_access(ctx, client, resource.resource_type, &name, AclOperation::DescribeConfigs) {
            results.push(base.with_error_code(errors::code(&e)).with_error_message(message(e.message)));
            continue;
        }
        let entries: Vec<(String, String, i8)> = match resource.resource_type {
            RESOURCE_TOPIC => match broker.metadata().topic(&name) {
                Some(topic) => topic_config::describe(&broker.topic_defaults(), &topic.configs)
                    .into_iter()
                    .map(|e| (e.name, e.value, source_code(e.source)))
                    .collect(),
                None => {
                    results.push(
                        base.with_error_code(ResponseError::UnknownTopicOrPartition.code())
                            .with_error_message(message(format!("Topic {name} does not exist."))),
                    );
                    continue;
                }
            },
            RESOURCE_BROKER => {
                if !name.is_empty() && name != broker.config.node_id.to_string() {
                    results.push(base.with_error_code(ResponseError::InvalidRequest.code()).with_error_message(
                        message(format!("Broker {name} does not exist; this is broker {}.", broker.config.node_id)),
                    ));
                    continue;
                }
                // A dynamic value (this broker's own, else the cluster-wide one) wins over the
                // static one, as in Kafka.
                let own = broker.dynamic_broker_configs(&broker.config.node_id.to_string());
                let every = broker.dynamic_broker_configs("");
                let dynamic = |name: &str| match (own.get(name), every.get(name)) {
                    (Some(v), _) => Some((v.clone(), SOURCE_DYNAMIC_BROKER)),
                    (_, Some(v)) => Some((v.clone(), SOURCE_DYNAMIC_DEFAULT_BROKER)),
                    _ => None,
                };
                let mut entries: Vec<(String, String, i8)> = broker
                    .config
                    .describe()
                    .into_iter()
                    .map(|(n, v, explicit)| {
                        let static_source = if explicit { SOURCE_STATIC_BROKER } else { SOURCE_DEFAULT };
                        let (v, source) = dynamic(&n).unwrap_or((v, static_source));
                        (n, v, source)
                    })
                    .collect();
                for name in throttle::DYNAMIC_BROKER_CONFIGS {
                    let (v, source) = dynamic(name).unwrap_or((throttle::UNLIMITED.to_string(), SOURCE_DEFAULT));
                    entries.push((name.to_string(), v, source));
                }
                entries
            }
            // Any group has settings (the defaults, until some are set), as the admin API shows.
            RESOURCE_GROUP => weir_broker::group_config::describe(&broker.group_configs(&name).unwrap_or_default())
                .into_iter()
                .map(|e| (e.name, e.value, if e.overridden { SOURCE_DYNAMIC_GROUP } else { SOURCE_DEFAULT }))
                .collect(),
            other => {
                results.push(
                    base.with_error_code(ResponseError::InvalidRequest.code())
                        .with_error_message(message(format!("Resource type {other} is not supported."))),
                );
                continue;
            }
        };
        let configs = entries
            .into_iter()
            .filter(|(n, _, _)| wanted(n))
            .map(|(n, v, source)| {
                // As Kafka does: a secret is marked sensitive and its value is null.
                let sensitive = weir_broker::config::SENSITIVE_SETTINGS.contains(&n.as_str());
                let v = (!sensitive).then_some(v);
                let synonyms = if request.include_synonyms {
                    vec![DescribeConfigsSynonym::default()
                        .with_name(str(n.clone()))
                        .with_value(v.clone().map(str))
                        .with_source(source)]
                } else {
                    Vec::new()
                };
                let entry = DescribeConfigsResourceResult::default()
                    .with_name(str(n.clone()))
                    .with_value(v.map(str))
                    .with_is_sensitive(sensitive)
                    .with_read_only(resource.resource_type == RESOURCE_BROKER && !throttle::is_dynamic(&n))
                    .with_config_source(source)
                    .with_synonyms(synonyms);
                if client.version >= 3 {
                    entry.with_config_type(config_type(&n))
                } else {
                    entry
                }
            })
            .collect();
        results.push(base.with_configs(configs));
    }
    DescribeConfigsResponse::default().with_results(results)
}

/// May the client describe (or alter) the configs of this resource: a topic's need the
/// operation on the topic, a broker's on the cluster, a group's on the group.
fn config_access(
    ctx: &Ctx,
    client: &Client,
    resource_type: i8,
    name: &str,
    operation: AclOperation,
) -> Result<(), BrokerError> {
    match resource_type {
        RESOURCE_TOPIC => ctx.require(client, operation, ResourceType::Topic, name),
        RESOURCE_BROKER => ctx.require_on_cluster(client, operation),
        RESOURCE_GROUP => ctx.require(client, operation, ResourceType::Group, name),
        _ => Ok(()),
    }
}

/// The error for a resource whose configs cannot change: anything but topics and the dynamic
/// broker configs (the replication throttles and the topic defaults).
fn configs_are_static<'a>(resource_type: i8, mut names: impl Iterator<Item = &'a str>) -> Option<BrokerError> {
    match resource_type {
        RESOURCE_TOPIC => None,
        RESOURCE_BROKER if names.all(throttle::is_dynamic) => None,
        RESOURCE_BROKER => Some(BrokerError::new(
            ErrorKind::InvalidRequest,
            format!(
                "This broker config is static in Weir: set it in weir.toml or with --set and restart (the dynamic ones \
                 are {} and the log.* topic defaults such as log.retention.ms).",
                throttle::DYNAMIC_BROKER_CONFIGS.join(", ")
            ),
        )),
        other => Some(BrokerError::new(ErrorKind::InvalidRequest, format!("Resource type {other} is not supported."))),
    }
}

pub(crate) async fn alter_configs(ctx: &Ctx, client: &Client, request: AlterConfigsRequest) -> AlterConfigsResponse {
    use kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse;
    let mut responses = Vec::with_capacity(request.resources.len());
    for resource in request.resources {
        let access =
            config_access(ctx, client, resource.resource_type, &resource.resource_name, AclOperation::AlterConfigs);
        let refused = access
            .err()
            .or_else(|| configs_are_static(resource.resource_type, resource.configs.iter().map(|c| c.name.as_str())));
        let outcome = match refused {
            Some(e) => Err(e),
            None => {
                // Non-incremental: the given set replaces every override.
                let configs: BTreeMap<String, String> = resource
                    .configs
                    .iter()
                    .filter_map(|c| c.value.as_ref().map(|v| (c.name.to_string(), v.to_string())))
                    .collect();
                let name = resource.resource_name.to_string();
                let edit = ConfigEdit::Replace(configs);
                if resource.resource_type == RESOURCE_BROKER {
                    ctx.broker.alter_broker_configs(name, request.validate_only, edit).await
                } else {
                    ctx.broker.alter_topic_configs(name, request.validate_only, edit).await
                }
            }
        };
        let response = AlterConfigsResourceResponse::default()
            .with_resource_type(resource.resource_type)
            .with_resource_name(resource.resource_name);
        responses.push(match outcome {
            Ok(()) => response,
            Err(e) => response.with_error_code(errors::code(&e)).with_error_message(message(e.message)),
        });
    }
    AlterConfigsResponse::default().with_responses(responses)
}

pub(crate) async fn incremental_alter_configs(
    ctx: &Ctx,
    client: &Client,
    request: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
    const SET: i8 = 0;
    const DELETE: i8 = 1;
    const APPEND: i8 = 2;
    const SUBTRACT: i8 = 3;
    let mut responses = Vec::with_capacity(request.resources.len());
    for resource in request.resources {
        // A group's settings (KIP-848's GROUP resource: RocketMQ's and share groups' configs).
        let is_group = resource.resource_type == RESOURCE_GROUP;
        let access =
            config_access(ctx, client, resource.resource_type, &resource.resource_name, AclOperation::AlterConfigs);
        let refused = if let Err(e) = access {
            Some(e)
        } else if is_group {
            None
        } else {
            configs_are_static(resource.resource_type, resource.configs.iter().map(|c| c.name.as_str()))
        };
        let outcome = match refused {
            Some(e) => Err(e),
            None => {
                let ops: Result<Vec<ConfigOp>, BrokerError> = resource
                    .configs
                    .iter()
                    .map(|c| {
                        let name = c.name.to_string();
                        let value = c.value.as_ref().map(|v| v.to_string());
                        match (c.config_operation, value) {
                            (SET, Some(value)) => Ok(ConfigOp::Set { name, value }),
                            (DELETE, _) => Ok(ConfigOp::Delete { name }),
                            (APPEND, Some(value)) => Ok(ConfigOp::Append { name, value }),
                            (SUBTRACT, Some(value)) => Ok(ConfigOp::Subtract { name, value }),
                            (op, _) => Err(BrokerError::new(
                                ErrorKind::InvalidRequest,
                                format!("Invalid config operation {op} or missing value for {name}"),
                            )),
                        }
                    })
                    .collect();
                let name = resource.resource_name.to_string();
                match ops {
                    Ok(ops) if is_group => {
                        ctx.broker.alter_group_configs(name, false, request.validate_only, ConfigEdit::Apply(ops)).await
                    }
                    Ok(ops) if resource.resource_type == RESOURCE_BROKER => {
                        ctx.broker.alter_broker_configs(name, request.validate_only, ConfigEdit::Apply(ops)).await
                    }
                    Ok(ops) => {
                        ctx.broker.alter_topic_configs(name, request.validate_only, ConfigEdit::Apply(ops)).await
                    }
                    Err(e) => Err(e),
                }
            }
        };
        let response = AlterConfigsResourceResponse::default()
            .with_resource_type(resource.resource_type)
            .with_resource_name(resource.resource_name);
        responses.push(match outcome {
            Ok(()) => response,
            Err(e) => response.with_error_code(errors::code(&e)).with_error_message(message(e.message)),
        });
    }
    IncrementalAlterConfigsResponse::default().with_responses(responses)
}

pub(crate) async fn delete_records(ctx: &Ctx, client: &Client, request: DeleteRecordsRequest) -> DeleteRecordsResponse {
    let broker = ctx.broker.clone();
    // DELETE on each topic, decided before the blocking work.
    let refused: Vec<Option<BrokerError>> = request
        .topics
        .iter()
        .map(|t| ctx.require(client, AclOperation::Delete, ResourceType::Topic, &t.name).err())
        .collect();
    let topics = tokio::task::spawn_blocking(move || {
        request
            .topics
            .into_iter()
            .zip(refused)
            .map(|(topic, refused)| {
                let name = topic.name.to_string();
                let partitions = topic
                    .partitions
                    .iter()
                    .map(|p| {
                        let result = DeleteRecordsPartitionResult::default()
                            .with_partition_index(p.partition_index)
                            .with_low_watermark(-1);
                        let deleted = match &refused {
                            Some(e) => Err(e.clone()),
                            None => broker
                                .require_partition(&name, p.partition_index)
                                .and_then(|part| broker.delete_records(&part, p.offset)),
                        };
                        match deleted {
                            Ok(low) => result.with_low_watermark(low),
                            Err(e) => result.with_error_code(errors::code(&e)),
                        }
                    })
                    .collect();
                DeleteRecordsTopicResult::default().with_name(topic.name).with_partitions(partitions)
            })
            .collect()
    })
    .await
    .unwrap_or_default();
    DeleteRecordsResponse::default().with_topics(topics)
}

pub(crate) async fn describe_cluster(
    ctx: &Ctx,
    client: &Client,
    request: DescribeClusterRequest,
) -> DescribeClusterResponse {
    // endpoint_type 1 = brokers, 2 = controllers (KIP-919, for clients of controllers; brokers
    // answer with the brokers).
    if let Err(e) = ctx.require_on_cluster(client, AclOperation::Describe) {
        return DescribeClusterResponse::default()
            .with_error_code(errors::code(&e))
            .with_error_message(message(e.message))
            .with_endpoint_type(request.endpoint_type);
    }
    let operations = if request.include_cluster_authorized_operations {
        authorized_operations::on_cluster(ctx, client)
    } else {
        authorized_operations::NOT_REQUESTED
    };
    DescribeClusterResponse::default()
        .with_cluster_authorized_operations(operations)
        .with_endpoint_type(request.endpoint_type)
        .with_cluster_id(str(ctx.broker.cluster_id()))
        .with_controller_id(BrokerId(ctx.broker.controller_for_clients().unwrap_or(-1)))
        .with_brokers(
            ctx.broker
                .brokers_for_clients()
                .into_iter()
                .map(|b| {
                    let (host, port) = ctx.endpoint(&b, client.listener);
                    DescribeClusterBroker::default()
                        .with_broker_id(BrokerId(b.id))
                        .with_host(str(host))
                        .with_port(i32::from(port))
                        .with_rack(b.rack.map(str))
                })
                .collect(),
        )
}

/// DescribeQuorum (KIP-595, `kafka-metadata-quorum.sh describe`): the metadata quorum's leader,
/// term, committed offset and how far each voter and observer has the log, as the leader knows
/// it. Any node answers (asking the leader when it is not the leader itself), as KRaft brokers
/// forward it to the controller. The fetch timestamps are not tracked: -1.
pub(crate) async fn describe_quorum(
    ctx: &Ctx,
    client: &Client,
    request: DescribeQuorumRequest,
) -> DescribeQuorumResponse {
    if let Err(e) = ctx.require_on_cluster(client, AclOperation::Describe) {
        return DescribeQuorumResponse::default()
            .with_error_code(errors::code(&e))
            .with_error_message(message(e.message));
    }
    use kafka_protocol::messages::describe_quorum_response::{PartitionData, ReplicaState, TopicData};
    const METADATA_TOPIC: &str = "__cluster_metadata";
    let asks_for_the_log = request.topics.len() == 1
        && request.topics[0].topic_name.as_str() == METADATA_TOPIC
        && request.topics[0].partitions.len() == 1
        && request.topics[0].partitions[0].partition_index == 0;
    if !asks_for_the_log {
        return DescribeQuorumResponse::default()
            .with_error_code(ResponseError::UnknownTopicOrPartition.code())
            .with_error_message(Some(str(format!("the metadata quorum is {METADATA_TOPIC} partition 0"))));
    }
    let partition = PartitionData::default().with_partition_index(0);
    let partition = match ctx.broker.describe_quorum().await {
        Err(e) => partition
            .with_error_code(crate::errors::kafka_error(e.kind).code())
            .with_error_message(Some(str(e.message)))
            .with_leader_id(BrokerId(-1)),
        Ok(q) => {
            let replicas = |list: Vec<(i32, i64)>| -> Vec<ReplicaState> {
                list.into_iter()
                    .map(|(id, end)| {
                        ReplicaState::default()
                            .with_replica_id(BrokerId(id))
                            .with_log_end_offset(end)
                            .with_last_fetch_timestamp(-1)
                            .with_last_caught_up_timestamp(-1)
                    })
                    .collect()
            };
            partition
                .with_leader_id(BrokerId(q.leader_id))
                .with_leader_epoch(i32::try_from(q.term).unwrap_or(i32::MAX))
                .with_high_watermark(q.high_watermark)
                .with_current_voters(replicas(q.voters))
                .with_observers(replicas(q.observers))
        }
    };
    DescribeQuorumResponse::default().with_topics(vec![TopicData::default()
        .with_topic_name(TopicName(str(METADATA_TOPIC.to_string())))
        .with_partitions(vec![partition])])
}

pub(crate) async fn describe_log_dirs(
    ctx: &Ctx,
    client: &Client,
    request: DescribeLogDirsRequest,
) -> DescribeLogDirsResponse {
    if let Err(e) = ctx.require_on_cluster(client, AclOperation::Describe) {
        // (Before v3 there is no error code: no directories are described.)
        return DescribeLogDirsResponse::default().with_error_code(if client.version >= 3 {
            errors::code(&e)
        } else {
            0
        });
    }
    let sizes = ctx.broker.partition_sizes();
    let wanted = |topic: &str, partition: i32| match &request.topics {
        None => true,
        Some(list) => list.iter().any(|t| t.topic.as_str() == topic && t.partitions.contains(&partition)),
    };
    let mut topics: Vec<DescribeLogDirsTopic> = Vec::new();
    for size in sizes.into_iter().filter(|s| wanted(&s.topic, s.partition)) {
        let entry = DescribeLogDirsPartition::default()
            .with_partition_index(size.partition)
            .with_partition_size(size.size_bytes as i64)
            .with_offset_lag(0);
        match topics.last_mut() {
            Some(last) if last.name.as_str() == size.topic => last.partitions.push(entry),
            _ => topics
                .push(DescribeLogDirsTopic::default().with_name(topic_name(&size.topic)).with_partitions(vec![entry])),
        }
    }
    let dir = std::fs::canonicalize(&ctx.broker.config.data_dir).unwrap_or_else(|_| ctx.broker.config.data_dir.clone());
    DescribeLogDirsResponse::default().with_results(vec![DescribeLogDirsResult::default()
        .with_log_dir(str(dir.display().to_string()))
        .with_topics(topics)
        .with_total_bytes(-1)
        .with_usable_bytes(-1)])
}

/// UnregisterBroker (`kafka-cluster.sh unregister`, Admin.unregisterBroker): removes a stopped
/// broker that holds no replica, decided by the controller (see `brokers::decide_unregister`).
pub(crate) async fn unregister_broker(
    ctx: &Ctx,
    client: &Client,
    request: UnregisterBrokerRequest,
) -> UnregisterBrokerResponse {
    let outcome = match ctx.require_on_cluster(client, AclOperation::Alter) {
        Ok(()) => ctx.broker.unregister_broker(request.broker_id.0).await,
        Err(e) => Err(e),
    };
    match outcome {
        Ok(()) => UnregisterBrokerResponse::default(),
        Err(e) => UnregisterBrokerResponse::default()
            .with_error_code(errors::kafka_error(e.kind).code())
            .with_error_message(Some(str(e.message))),
    }
}

/// ElectLeaders (KIP-460, `kafka-leader-election.sh`, AdminClient.electLeaders): preferred or
/// unclean elections, decided by the controller. v0 has no election type (preferred).
pub(crate) async fn elect_leaders(ctx: &Ctx, client: &Client, request: ElectLeadersRequest) -> ElectLeadersResponse {
    use kafka_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
    use weir_broker::cluster::election::ElectionType;
    let kind = match (client.version, request.election_type) {
        (0, _) | (_, 0) => ElectionType::Preferred,
        (_, 1) => ElectionType::Unclean,
        // Only 0 (preferred) and 1 (unclean) exist.
        (_, _) => return ElectLeadersResponse::default().with_error_code(ResponseError::InvalidRequest.code()),
    };
    let partitions = request.topic_partitions.as_ref().map(|topics| {
        topics.iter().flat_map(|t| t.partitions.iter().map(move |p| (t.topic.to_string(), *p))).collect::<Vec<_>>()
    });
    let elected = match ctx.require_on_cluster(client, AclOperation::Alter) {
        Ok(()) => ctx.broker.elect_leaders(kind, partitions.clone()).await,
        Err(e) => Err(e),
    };
    let results = match elected {
        Ok(results) => results,
        Err(e) => {
            // The whole request failed (no controller): every partition asked for says why.
            let code = crate::errors::kafka_error(e.kind).code();
            if client.version >= 1 && partitions.is_none() {
                return ElectLeadersResponse::default().with_error_code(code);
            }
            partitions.unwrap_or_default().into_iter().map(|(topic, p)| (topic, p, Err(e.clone()))).collect()
        }
    };
    let mut by_topic: Vec<ReplicaElectionResult> = Vec::new();
    for (topic, partition, outcome) in results {
        let (code, message) = match outcome {
            Ok(_) => (0, None),
            Err(e) => (crate::errors::kafka_error(e.kind).code(), Some(str(e.message))),
        };
        let result =
            PartitionResult::default().with_partition_id(partition).with_error_code(code).with_error_message(message);
        match by_topic.iter_mut().find(|t| t.topic.as_str() == topic) {
            Some(t) => t.partition_result.push(result),
            None => by_topic.push(
                ReplicaElectionResult::default().with_topic(topic_name(&topic)).with_partition_result(vec![result]),
            ),
        }
    }
    ElectLeadersResponse::default().with_replica_election_results(by_topic)
}

/// AlterPartitionReassignments (KIP-455, `kafka-reassign-partitions.sh --execute`,
/// AdminClient.alterPartitionReassignments): start, replace or (no replicas) cancel the
/// reassignment of each partition, decided by the controller. v1 can refuse a change of the
/// replication factor (KIP-860); v0 always allows it, as Kafka did.
pub(crate) async fn alter_partition_reassignments(
    ctx: &Ctx,
    client: &Client,
    request: AlterPartitionReassignmentsRequest,
) -> AlterPartitionReassignmentsResponse {
    use alter_partition_reassignments_response::{ReassignablePartitionResponse, ReassignableTopicResponse};
    use weir_broker::cluster::reassignment::ReassignmentTarget;
    let allow_replication_factor_change = client.version == 0 || request.allow_replication_factor_change;
    let targets: Vec<ReassignmentTarget> = request
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(move |p| ReassignmentTarget {
                topic: t.name.to_string(),
                partition: p.partition_index,
                replicas: p.replicas.as_ref().map(|list| list.iter().map(|b| b.0).collect()),
            })
        })
        .collect();
    let response = AlterPartitionReassignmentsResponse::default()
        .with_allow_replication_factor_change(allow_replication_factor_change);
    let reassigned = match ctx.require_on_cluster(client, AclOperation::Alter) {
        Ok(()) => ctx.broker.alter_partition_reassignments(targets, allow_replication_factor_change).await,
        Err(e) => Err(e),
    };
    let results = match reassigned {
        Ok(results) => results,
        Err(e) => {
            return response
                .with_error_code(errors::kafka_error(e.kind).code())
                .with_error_message(Some(str(e.message)))
        }
    };
    let mut by_topic: Vec<ReassignableTopicResponse> = Vec::new();
    for (topic, partition, outcome) in results {
        let (code, message) = match outcome {
            Ok(()) => (0, None),
            Err(e) => (errors::kafka_error(e.kind).code(), Some(str(e.message))),
        };
        let result = ReassignablePartitionResponse::default()
            .with_partition_index(partition)
            .with_error_code(code)
            .with_error_message(message);
        match by_topic.iter_mut().find(|t| t.name.as_str() == topic) {
            Some(t) => t.partitions.push(result),
            None => by_topic
                .push(ReassignableTopicResponse::default().with_name(topic_name(&topic)).with_partitions(vec![result])),
        }
    }
    response.with_responses(by_topic)
}

/// ListPartitionReassignments (KIP-455, `kafka-reassign-partitions.sh --verify`,
/// AdminClient.listPartitionReassignments): the reassignments in progress, of the partitions
/// asked for or of all.
pub(crate) async fn list_partition_reassignments(
    ctx: &Ctx,
    client: &Client,
    request: ListPartitionReassignmentsRequest,
) -> ListPartitionReassignmentsResponse {
    if let Err(e) = ctx.require_on_cluster(client, AclOperation::Describe) {
        return ListPartitionReassignmentsResponse::default()
            .with_error_code(errors::code(&e))
            .with_error_message(message(e.message));
    }
    use kafka_protocol::messages::BrokerId;
    use list_partition_reassignments_response::{OngoingPartitionReassignment, OngoingTopicReassignment};
    let filter: Option<BTreeMap<String, Vec<i32>>> = request.topics.as_ref().map(|topics| {
        let mut map: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        for t in topics {
            map.entry(t.name.to_string()).or_default().extend(&t.partition_indexes);
        }
        map
    });
    let brokers = |list: Vec<i32>| list.into_iter().map(BrokerId).collect::<Vec<_>>();
    let mut topics: Vec<OngoingTopicReassignment> = Vec::new();
    for ongoing in ctx.broker.list_partition_reassignments(filter.as_ref()) {
        let partition = OngoingPartitionReassignment::default()
            .with_partition_index(ongoing.partition)
            .with_replicas(brokers(ongoing.replicas))
            .with_adding_replicas(brokers(ongoing.adding))
            .with_removing_replicas(brokers(ongoing.removing));
        match topics.iter_mut().find(|t| t.name.as_str() == ongoing.topic) {
            Some(t) => t.partitions.push(partition),
            None => topics.push(
                OngoingTopicReassignment::default()
                    .with_name(topic_name(&ongoing.topic))
                    .with_partitions(vec![partition]),
            ),
        }
    }
    ListPartitionReassignmentsResponse::default().with_topics(topics)
}
