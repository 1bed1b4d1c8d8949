//! Client quotas (KIP-546): DescribeClientQuotas (DESCRIBE_CONFIGS on the cluster) and
//! AlterClientQuotas (ALTER_CONFIGS on the cluster), as `kafka-configs.sh --entity-type users
//! --entity-type clients` uses them. How the quotas bite is `crate::quota`.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use weir_broker::quotas::QuotaAlteration;
use weir_security::acl::AclOperation;

use super::message;
use crate::context::{Client, Ctx};
use crate::errors;

pub(crate) async fn describe_client_quotas(
    ctx: &Ctx,
    client: &Client,
    request: DescribeClientQuotasRequest,
) -> DescribeClientQuotasResponse {
    let refused = |code: i16, text: &str| {
        DescribeClientQuotasResponse::default()
            .with_error_code(code)
            .with_error_message(message(text))
            .with_entries(None)
    };
    if !ctx.allowed_on_cluster(client, AclOperation::DescribeConfigs) {
        return refused(ResponseError::ClusterAuthorizationFailed.code(), "DESCRIBE_CONFIGS on the cluster is needed");
    }
    let components: Vec<(String, i8, Option<String>)> = request
        .components
        .iter()
        .map(|c| (c.entity_type.to_string(), c.match_type, c._match.as_ref().map(|m| m.to_string())))
        .collect();
    let filter = match weir_broker::quotas::filter(&components, request.strict) {
        Ok(filter) => filter,
        Err(Some(e)) => return refused(errors::code(&e), &e.message),
        Err(None) => {
            let unknown = components.iter().map(|c| c.0.as_str()).find(|t| !["user", "client-id", "ip"].contains(t));
            let text = format!("Unsupported entity type {}", unknown.unwrap_or_default());
            return refused(ResponseError::UnsupportedVersion.code(), &text);
        }
    };
    let entries = ctx
        .broker
        .describe_client_quotas(&filter)
        .into_iter()
        .map(|(entity, values)| {
            let entity = entity
                .components()
                .map(|(kind, name)| {
                    describe_client_quotas_response::EntityData::default()
                        .with_entity_type(StrBytes::from_static_str(kind))
                        .with_entity_name(name.as_wire().map(|n| StrBytes::from_string(n.to_string())))
                })
                .collect();
            let values = values
                .into_iter()
                .map(|(key, value)| {
                    describe_client_quotas_response::ValueData::default()
                        .with_key(StrBytes::from_string(key))
                        .with_value(value)
                })
                .collect();
            describe_client_quotas_response::EntryData::default().with_entity(entity).with_values(values)
        })
        .collect();
    DescribeClientQuotasResponse::default().with_error_message(None).with_entries(Some(entries))
}

pub(crate) async fn alter_client_quotas(
    ctx: &Ctx,
    client: &Client,
    request: AlterClientQuotasRequest,
) -> AlterClientQuotasResponse {
    let echo = |entity: &[alter_client_quotas_request::EntityData]| -> Vec<alter_client_quotas_response::EntityData> {
        entity
            .iter()
            .map(|e| {
                alter_client_quotas_response::EntityData::default()
                    .with_entity_type(e.entity_type.clone())
                    .with_entity_name(e.entity_name.clone())
            })
            .collect()
    };
    let answer = |entry: &alter_client_quotas_request::EntryData, outcome: Result<(), (i16, String)>| {
        let result = alter_client_quotas_response::EntryData::default().with_entity(echo(&entry.entity));
        match outcome {
            Ok(()) => result.with_error_message(None),
            Err((code, text)) => result.with_error_code(code).with_error_message(message(text)),
        }
    };
    if !ctx.allowed_on_cluster(client, AclOperation::AlterConfigs) {
        let denied =
            || Err((ResponseError::ClusterAuthorizationFailed.code(), "ALTER_CONFIGS on the cluster is needed".into()));
        let entries = request.entries.iter().map(|entry| answer(entry, denied())).collect();
        return AlterClientQuotasResponse::default().with_entries(entries);
    }
    let alterations: Vec<QuotaAlteration> = request
        .entries
        .iter()
        .map(|entry| QuotaAlteration {
            entity: entry
                .entity
                .iter()
                .map(|e| (e.entity_type.to_string(), e.entity_name.as_ref().map(|n| n.to_string())))
                .collect(),
            ops: entry.ops.iter().map(|op| (op.key.to_string(), (!op.remove).then_some(op.value))).collect(),
        })
        .collect();
    let outcomes: Vec<Result<(), (i16, String)>> =
        match ctx.broker.alter_client_quotas(alterations, request.validate_only).await {
            Ok(outcomes) => outcomes.into_iter().map(|o| o.map_err(|e| (errors::code(&e), e.message))).collect(),
            Err(e) => vec![Err((errors::code(&e), e.message)); request.entries.len()],
        };
    let entries = request.entries.iter().zip(outcomes).map(|(entry, outcome)| answer(entry, outcome)).collect();
    AlterClientQuotasResponse::default().with_entries(entries)
}
