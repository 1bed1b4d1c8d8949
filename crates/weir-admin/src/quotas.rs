//! `/v1/quotas`: client quotas (`weir_broker::quotas`), the same the Kafka quota APIs manage.
//!
//! - `GET /v1/quotas?user=&client_id=&ip=` lists the entities having every component given
//!   (`<default>`: the default of its type), with their quotas;
//! - `POST /v1/quotas` sets (`set`) and removes (`remove`) quotas of one entity.

use axum::extract::State;
use axum::Json;
use weir_broker::metadata::quota::{self as model, EntityName, Match, QuotaFilter};
use weir_broker::quotas::QuotaAlteration;

use crate::api::{AlterQuotas, QuotaEntity, Quotas};
use crate::error::ApiError;
use crate::extract::{JsonBody, QueryParams};
use crate::SharedState;

/// How the API writes the default of an entity type (as Kafka's tools print it).
const DEFAULT: &str = "<default>";

fn wire_name(name: &str) -> Option<String> {
    (name != DEFAULT).then(|| name.to_string())
}

fn api_name(name: &EntityName) -> String {
    name.as_wire().unwrap_or(DEFAULT).to_string()
}

fn api_entity(entity: &model::QuotaEntity) -> QuotaEntity {
    QuotaEntity {
        user: entity.user.as_ref().map(api_name),
        client_id: entity.client_id.as_ref().map(api_name),
        ip: entity.ip.as_ref().map(api_name),
    }
}

/// The components an entity names: (type, name; `None` the default), in Kafka's order.
fn components(entity: &QuotaEntity) -> Vec<(&'static str, Option<String>)> {
    [(model::USER, &entity.user), (model::CLIENT_ID, &entity.client_id), (model::IP, &entity.ip)]
        .into_iter()
        .filter_map(|(kind, name)| name.as_deref().map(|name| (kind, wire_name(name))))
        .collect()
}

/// The entities having every component of `entity` (with `strict`, no other).
fn matching(entity: &QuotaEntity, strict: bool) -> QuotaFilter {
    let components =
        components(entity).into_iter().map(|(kind, name)| (kind, name.map_or(Match::Default, Match::Exact)));
    QuotaFilter { components: components.collect(), strict }
}

/// `GET /v1/quotas`.
pub(crate) async fn list(State(state): State<SharedState>, query: QueryParams) -> Result<Json<Vec<Quotas>>, ApiError> {
    let core = state.core()?;
    let param = |name: &str| query.get(name).map(str::to_string);
    let wanted = QuotaEntity { user: param("user"), client_id: param("client_id"), ip: param("ip") };
    let found = core.broker.describe_client_quotas(&matching(&wanted, false));
    Ok(Json(found.into_iter().map(|(entity, quotas)| Quotas { entity: api_entity(&entity), quotas }).collect()))
}

/// `POST /v1/quotas`.
pub(crate) async fn alter(
    State(state): State<SharedState>,
    JsonBody(request): JsonBody<AlterQuotas>,
) -> Result<Json<Vec<Quotas>>, ApiError> {
    let core = state.core()?;
    if request.set.is_empty() && request.remove.is_empty() {
        return Err(ApiError::invalid("nothing to change: give quotas to set or keys to remove"));
    }
    let entity = components(&request.entity).into_iter().map(|(kind, name)| (kind.to_string(), name)).collect();
    let ops = request
        .set
        .iter()
        .map(|(key, value)| (key.clone(), Some(*value)))
        .chain(request.remove.iter().map(|key| (key.clone(), None)))
        .collect();
    let alteration = QuotaAlteration { entity, ops };
    let outcome = core.broker.alter_client_quotas(vec![alteration], request.validate_only).await?;
    if let Some(Err(e)) = outcome.into_iter().next() {
        return Err(e.into());
    }
    // The entity as it stands now (gone once its last quota is removed).
    let found = core.broker.describe_client_quotas(&matching(&request.entity, true));
    Ok(Json(found.into_iter().map(|(entity, quotas)| Quotas { entity: api_entity(&entity), quotas }).collect()))
}
