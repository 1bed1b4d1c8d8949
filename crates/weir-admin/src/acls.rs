//! `/v1/acls`: the ACLs the authorizer decides by (Kafka's model, `weir_security::acl`), the
//! same the Kafka ACL APIs manage.
//!
//! - `GET /v1/acls?resource_type=&resource_name=&pattern_type=&principal=&host=&operation=&permission=`
//!   lists those matching every parameter given (`pattern_type=MATCH`: every ACL that applies to
//!   `resource_name`, literal, `*` or prefix);
//! - `POST /v1/acls` adds `{"acls": [...]}`, answering each with its error if refused;
//! - `DELETE /v1/acls?...` removes those the same parameters select; at least one is needed.

use axum::extract::State;
use axum::Json;
use weir_broker::ErrorKind;
use weir_security::acl::{
    AclBinding, AclFilter, AclOperation, AclPermission, PatternFilter, PatternType, ResourceType,
};

use crate::api::{Acl, AclResult, CreateAcls, DeletedAcls};
use crate::error::ApiError;
use crate::extract::{JsonBody, QueryParams};
use crate::SharedState;

/// The parameters a filter is made of.
const FILTER_PARAMETERS: [&str; 7] =
    ["resource_type", "resource_name", "pattern_type", "principal", "host", "operation", "permission"];

fn parse<T>(what: &str, text: &str, parse: impl Fn(&str) -> Option<T>, all: &[&str]) -> Result<T, ApiError> {
    parse(text).ok_or_else(|| ApiError::invalid(format!("{what} {text:?}: expected one of {}", all.join(", "))))
}

fn names<T: Copy>(all: &[T], name: impl Fn(T) -> &'static str) -> Vec<&'static str> {
    all.iter().map(|v| name(*v)).collect()
}

fn binding(acl: &Acl) -> Result<AclBinding, ApiError> {
    Ok(AclBinding {
        resource_type: parse(
            "resource_type",
            &acl.resource_type,
            ResourceType::from_name,
            &names(ResourceType::ALL, ResourceType::name),
        )?,
        resource_name: acl.resource_name.clone(),
        pattern_type: parse(
            "pattern_type",
            &acl.pattern_type,
            PatternType::from_name,
            &names(PatternType::ALL, PatternType::name),
        )?,
        principal: acl.principal.clone(),
        host: acl.host.clone(),
        operation: parse(
            "operation",
            &acl.operation,
            AclOperation::from_name,
            &names(AclOperation::ALL, AclOperation::name),
        )?,
        permission: parse(
            "permission",
            &acl.permission,
            AclPermission::from_name,
            &names(AclPermission::ALL, AclPermission::name),
        )?,
    })
}

pub(crate) fn acl(binding: AclBinding) -> Acl {
    Acl {
        resource_type: binding.resource_type.name().into(),
        resource_name: binding.resource_name,
        pattern_type: binding.pattern_type.name().into(),
        principal: binding.principal,
        host: binding.host,
        operation: binding.operation.name().into(),
        permission: binding.permission.name().into(),
    }
}

fn filter(query: &QueryParams) -> Result<AclFilter, ApiError> {
    let text = |name: &str| query.get(name).map(str::trim).filter(|v| !v.is_empty() && !v.eq_ignore_ascii_case("ANY"));
    let pattern = match text("pattern_type") {
        None => PatternFilter::Any,
        Some(m) if m.eq_ignore_ascii_case("MATCH") => PatternFilter::Match,
        Some(p) => PatternFilter::Exactly(parse(
            "pattern_type",
            p,
            PatternType::from_name,
            &["ANY", "MATCH", "LITERAL", "PREFIXED"],
        )?),
    };
    Ok(AclFilter {
        resource_type: text("resource_type")
            .map(|t| parse("resource_type", t, ResourceType::from_name, &names(ResourceType::ALL, ResourceType::name)))
            .transpose()?,
        resource_name: query.get("resource_name").map(str::to_string),
        pattern,
        principal: query.get("principal").map(str::to_string),
        host: query.get("host").map(str::to_string),
        operation: text("operation")
            .map(|o| parse("operation", o, AclOperation::from_name, &names(AclOperation::ALL, AclOperation::name)))
            .transpose()?,
        permission: text("permission")
            .map(|p| parse("permission", p, AclPermission::from_name, &names(AclPermission::ALL, AclPermission::name)))
            .transpose()?,
    })
}

/// `GET /v1/acls`.
pub(crate) async fn list(State(state): State<SharedState>, query: QueryParams) -> Result<Json<Vec<Acl>>, ApiError> {
    let core = state.core()?;
    let filter = filter(&query)?;
    Ok(Json(core.broker.acls(&filter).into_iter().map(acl).collect()))
}

/// `POST /v1/acls`.
pub(crate) async fn create(
    State(state): State<SharedState>,
    JsonBody(request): JsonBody<CreateAcls>,
) -> Result<Json<Vec<AclResult>>, ApiError> {
    let core = state.core()?;
    if request.acls.is_empty() {
        return Err(ApiError::invalid("no ACL to create"));
    }
    let bindings = request.acls.iter().map(binding).collect::<Result<Vec<_>, _>>()?;
    let outcomes = core.broker.create_acls(bindings).await?;
    Ok(Json(
        request
            .acls
            .into_iter()
            .zip(outcomes)
            .map(|(acl, outcome)| AclResult { acl, error: outcome.err().map(|e| e.message) })
            .collect(),
    ))
}

/// `DELETE /v1/acls`.
pub(crate) async fn delete(
    State(state): State<SharedState>,
    query: QueryParams,
) -> Result<Json<DeletedAcls>, ApiError> {
    let core = state.core()?;
    if !FILTER_PARAMETERS.iter().any(|p| query.get(p).is_some()) {
        return Err(ApiError::new(
            ErrorKind::InvalidRequest,
            format!("name the ACLs to delete with at least one of {}", FILTER_PARAMETERS.join(", ")),
        ));
    }
    let filter = filter(&query)?;
    let deleted = core.broker.delete_acls(vec![filter]).await?;
    Ok(Json(DeletedAcls { deleted: deleted.into_iter().flatten().map(acl).collect() }))
}
