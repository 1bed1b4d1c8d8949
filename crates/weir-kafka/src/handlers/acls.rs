//! ACLs (KIP-140): CreateAcls, DescribeAcls and DeleteAcls. Creating and deleting need ALTER on
//! the cluster, describing DESCRIBE. ACLs can be managed with the authorizer off (they are
//! stored, and apply once `authorizer.class.name` is set), so they can be prepared before
//! authorization is switched on.

use std::collections::BTreeMap;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::{DeleteAclsFilterResult, DeleteAclsMatchingAcl};
use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use weir_security::acl::{
    AclBinding, AclFilter, AclOperation, AclPermission, PatternFilter, PatternType, ResourceType, ANY_CODE, MATCH_CODE,
};

use super::message;
use crate::context::{Client, Ctx};
use crate::errors;

/// The wire fields of a filter (DescribeAcls' request, and each of DeleteAcls').
struct FilterFields<'a> {
    resource_type: i8,
    resource_name: Option<&'a StrBytes>,
    pattern_type: i8,
    principal: Option<&'a StrBytes>,
    host: Option<&'a StrBytes>,
    operation: i8,
    permission: i8,
}

/// A filter from its wire fields; `Err`: the message of Kafka's INVALID_REQUEST.
fn filter(fields: FilterFields<'_>) -> Result<AclFilter, String> {
    fn any_or<T>(code: i8, what: &str, parse: impl Fn(i8) -> Option<T>) -> Result<Option<T>, String> {
        if code == ANY_CODE {
            return Ok(None);
        }
        parse(code).map(Some).ok_or_else(|| format!("unknown {what} {code}"))
    }
    let pattern = match fields.pattern_type {
        ANY_CODE => PatternFilter::Any,
        MATCH_CODE => PatternFilter::Match,
        code => {
            PatternFilter::Exactly(PatternType::from_code(code).ok_or_else(|| format!("unknown pattern type {code}"))?)
        }
    };
    Ok(AclFilter {
        resource_type: any_or(fields.resource_type, "resource type", ResourceType::from_code)?,
        resource_name: fields.resource_name.map(|n| n.to_string()),
        pattern,
        principal: fields.principal.map(|p| p.to_string()),
        host: fields.host.map(|h| h.to_string()),
        operation: any_or(fields.operation, "operation", AclOperation::from_code)?,
        permission: any_or(fields.permission, "permission type", AclPermission::from_code)?,
    })
}

fn binding(creation: &create_acls_request::AclCreation) -> Result<AclBinding, String> {
    let wire = |code: i8, what: &str| format!("{what} {code} is not one an ACL can have");
    Ok(AclBinding {
        resource_type: ResourceType::from_code(creation.resource_type)
            .ok_or_else(|| wire(creation.resource_type, "resource type"))?,
        resource_name: creation.resource_name.to_string(),
        pattern_type: PatternType::from_code(creation.resource_pattern_type)
            .ok_or_else(|| wire(creation.resource_pattern_type, "pattern type"))?,
        principal: creation.principal.to_string(),
        host: creation.host.to_string(),
        operation: AclOperation::from_code(creation.operation).ok_or_else(|| wire(creation.operation, "operation"))?,
        permission: AclPermission::from_code(creation.permission_type)
            .ok_or_else(|| wire(creation.permission_type, "permission type"))?,
    })
}

pub(crate) async fn create_acls(ctx: &Ctx, client: &Client, request: CreateAclsRequest) -> CreateAclsResponse {
    let failed =
        |code: i16, text: String| AclCreationResult::default().with_error_code(code).with_error_message(message(text));
    if !ctx.allowed_on_cluster(client, AclOperation::Alter) {
        let results = request
            .creations
            .iter()
            .map(|_| failed(ResponseError::ClusterAuthorizationFailed.code(), "ALTER on the cluster is needed".into()))
            .collect();
        return CreateAclsResponse::default().with_results(results);
    }
    let parsed: Vec<Result<AclBinding, String>> = request.creations.iter().map(binding).collect();
    let valid: Vec<AclBinding> = parsed.iter().filter_map(|p| p.as_ref().ok().cloned()).collect();
    let mut outcomes = match ctx.broker.create_acls(valid).await {
        Ok(outcomes) => outcomes.into_iter().map(|o| o.map_err(|e| (errors::code(&e), e.message))).collect(),
        Err(e) => vec![Err((errors::code(&e), e.message)); parsed.len()],
    }
    .into_iter();
    let results = parsed
        .into_iter()
        .map(|p| match p {
            Err(why) => failed(ResponseError::InvalidRequest.code(), why),
            Ok(_) => match outcomes.next() {
                Some(Ok(())) => AclCreationResult::default(),
                Some(Err((code, text))) => failed(code, text),
                None => failed(ResponseError::UnknownServerError.code(), "no outcome".into()),
            },
        })
        .collect();
    CreateAclsResponse::default().with_results(results)
}

pub(crate) async fn describe_acls(ctx: &Ctx, client: &Client, request: DescribeAclsRequest) -> DescribeAclsResponse {
    let refused =
        |code: i16, text: &str| DescribeAclsResponse::default().with_error_code(code).with_error_message(message(text));
    if !ctx.allowed_on_cluster(client, AclOperation::Describe) {
        return refused(ResponseError::ClusterAuthorizationFailed.code(), "DESCRIBE on the cluster is needed");
    }
    let fields = FilterFields {
        resource_type: request.resource_type_filter,
        resource_name: request.resource_name_filter.as_ref(),
        pattern_type: request.pattern_type_filter,
        principal: request.principal_filter.as_ref(),
        host: request.host_filter.as_ref(),
        operation: request.operation,
        permission: request.permission_type,
    };
    let filter = match filter(fields) {
        Ok(filter) => filter,
        Err(why) => return refused(ResponseError::InvalidRequest.code(), &why),
    };
    // One entry per resource pattern, its ACLs under it (the response's shape).
    let mut resources: BTreeMap<(ResourceType, String, PatternType), Vec<AclDescription>> = BTreeMap::new();
    for binding in ctx.broker.acls(&filter) {
        resources
            .entry((binding.resource_type, binding.resource_name.clone(), binding.pattern_type))
            .or_default()
            .push(
                AclDescription::default()
                    .with_principal(StrBytes::from_string(binding.principal))
                    .with_host(StrBytes::from_string(binding.host))
                    .with_operation(binding.operation.code())
                    .with_permission_type(binding.permission.code()),
            );
    }
    let resources = resources
        .into_iter()
        .map(|((resource_type, name, pattern), acls)| {
            DescribeAclsResource::default()
                .with_resource_type(resource_type.code())
                .with_resource_name(StrBytes::from_string(name))
                .with_pattern_type(pattern.code())
                .with_acls(acls)
        })
        .collect();
    DescribeAclsResponse::default().with_resources(resources)
}

pub(crate) async fn delete_acls(ctx: &Ctx, client: &Client, request: DeleteAclsRequest) -> DeleteAclsResponse {
    let failed = |code: i16, text: String| {
        DeleteAclsFilterResult::default().with_error_code(code).with_error_message(message(text))
    };
    if !ctx.allowed_on_cluster(client, AclOperation::Alter) {
        let results = request
            .filters
            .iter()
            .map(|_| failed(ResponseError::ClusterAuthorizationFailed.code(), "ALTER on the cluster is needed".into()))
            .collect();
        return DeleteAclsResponse::default().with_filter_results(results);
    }
    let parsed: Vec<Result<AclFilter, String>> = request
        .filters
        .iter()
        .map(|f| {
            filter(FilterFields {
                resource_type: f.resource_type_filter,
                resource_name: f.resource_name_filter.as_ref(),
                pattern_type: f.pattern_type_filter,
                principal: f.principal_filter.as_ref(),
                host: f.host_filter.as_ref(),
                operation: f.operation,
                permission: f.permission_type,
            })
        })
        .collect();
    let valid: Vec<AclFilter> = parsed.iter().filter_map(|p| p.as_ref().ok().cloned()).collect();
    let mut matched = match ctx.broker.delete_acls(valid).await {
        Ok(matched) => Ok(matched.into_iter()),
        Err(e) => Err((errors::code(&e), e.message)),
    };
    let results = parsed
        .into_iter()
        .map(|p| match (p, &mut matched) {
            (Err(why), _) => failed(ResponseError::InvalidRequest.code(), why),
            (Ok(_), Err((code, text))) => failed(*code, text.clone()),
            (Ok(_), Ok(matched)) => {
                let acls = matched.next().unwrap_or_default().into_iter().map(|b| {
                    DeleteAclsMatchingAcl::default()
                        .with_resource_type(b.resource_type.code())
                        .with_resource_name(StrBytes::from_string(b.resource_name))
                        .with_pattern_type(b.pattern_type.code())
                        .with_principal(StrBytes::from_string(b.principal))
                        .with_host(StrBytes::from_string(b.host))
                        .with_operation(b.operation.code())
                        .with_permission_type(b.permission.code())
                });
                DeleteAclsFilterResult::default().with_matching_acls(acls.collect())
            }
        })
        .collect();
    DeleteAclsResponse::default().with_filter_results(results)
}
