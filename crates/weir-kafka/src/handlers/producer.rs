//! InitProducerId: producer ids for idempotent producers (`enable.idempotence=true`, the
//! default of the Java client) and transactional ones. Without a `transactional.id` each call
//! gets a fresh id at epoch 0, as Kafka answers; the partitions then enforce sequences per id
//! (weir-storage's producer state). With one, the transaction coordinator keeps the id's producer
//! id and bumps its epoch, fencing the previous producer.

use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};
use kafka_protocol::ResponseError;

use weir_security::acl::{AclOperation, ResourceType};

use crate::context::{Client, Ctx};
use crate::errors::kafka_error;

pub(crate) async fn init_producer_id(
    ctx: &Ctx,
    client: &Client,
    request: InitProducerIdRequest,
) -> InitProducerIdResponse {
    let failed = |code: ResponseError| {
        InitProducerIdResponse::default()
            .with_error_code(code.code())
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1)
    };
    if let Some(id) = request.transactional_id.as_ref().filter(|id| !id.is_empty()) {
        if !ctx.allowed(client, AclOperation::Write, ResourceType::TransactionalId, id) {
            return failed(ResponseError::TransactionalIdAuthorizationFailed);
        }
        let (txns, id, timeout) = (ctx.txns.clone(), id.to_string(), request.transaction_timeout_ms);
        return match tokio::task::spawn_blocking(move || txns.init_producer_id(&id, timeout)).await {
            Ok(Ok(who)) => InitProducerIdResponse::default()
                .with_producer_id(ProducerId(who.producer_id))
                .with_producer_epoch(who.producer_epoch),
            Ok(Err(e)) => {
                tracing::info!(error = %e, "InitProducerId refused");
                failed(kafka_error(e.kind))
            }
            Err(_) => failed(ResponseError::UnknownServerError),
        };
    }
    // An idempotent producer: IDEMPOTENT_WRITE on the cluster, or WRITE on some topic (Kafka 3's rule).
    let idempotent_allowed = ctx.allowed_on_cluster(client, AclOperation::IdempotentWrite)
        || ctx.broker.authorize_any(&client.principal, &client.host, AclOperation::Write, ResourceType::Topic);
    if !idempotent_allowed {
        return failed(ResponseError::ClusterAuthorizationFailed);
    }
    let broker = ctx.broker.clone();
    match tokio::task::spawn_blocking(move || broker.allocate_producer_id()).await {
        Ok(Ok(id)) => InitProducerIdResponse::default().with_producer_id(ProducerId(id)).with_producer_epoch(0),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot allocate a producer id");
            failed(kafka_error(e.kind))
        }
        Err(_) => failed(ResponseError::UnknownServerError),
    }
}
