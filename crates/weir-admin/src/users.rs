//! `/v1/users`: users and their SCRAM credentials, which SASL clients log in with (SCRAM and
//! PLAIN alike).

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use weir_broker::users::ScramChange;
use weir_broker::ErrorKind;
use weir_security::scram;
use weir_security::ScramMechanism;

use crate::api::{CreateUser, DeletedUser, UserCredential, UserInfo};
use crate::error::ApiError;
use crate::extract::{JsonBody, PathParams};
use crate::SharedState;

/// `GET /v1/users`: every user with a credential.
pub(crate) async fn list(State(state): State<SharedState>) -> Result<Json<Vec<UserInfo>>, ApiError> {
    let core = state.core()?;
    let broker = &core.broker;
    Ok(Json(broker.scram_users().into_iter().map(|(name, list)| info(broker, name, &list)).collect()))
}

fn info(broker: &weir_broker::Broker, name: String, list: &[(ScramMechanism, u32)]) -> UserInfo {
    let credentials = list
        .iter()
        .map(|(m, iterations)| UserCredential { mechanism: m.name().to_string(), iterations: *iterations })
        .collect();
    let rocketmq = broker.access_secret(&name).is_some();
    UserInfo { name, credentials, rocketmq }
}

/// `POST /v1/users`: creates the user, or changes its password.
pub(crate) async fn create(
    State(state): State<SharedState>,
    JsonBody(request): JsonBody<CreateUser>,
) -> Result<(StatusCode, Json<UserInfo>), ApiError> {
    let core = state.core()?;
    if request.password.is_empty() {
        return Err(ApiError::new(ErrorKind::UnacceptableCredential, "the password is empty"));
    }
    let mechanisms: Vec<ScramMechanism> = if request.mechanisms.is_empty() {
        ScramMechanism::ALL.to_vec()
    } else {
        request
            .mechanisms
            .iter()
            .map(|m| {
                ScramMechanism::from_name(m).ok_or_else(|| {
                    ApiError::new(
                        ErrorKind::UnsupportedSaslMechanism,
                        format!("{m}: expected SCRAM-SHA-256 or SCRAM-SHA-512"),
                    )
                })
            })
            .collect::<Result<_, _>>()?
    };
    let iterations = request.iterations.unwrap_or(scram::DEFAULT_ITERATIONS);
    let password = request.password.clone();
    // PBKDF2 of every mechanism: milliseconds, off the async workers.
    let credentials = tokio::task::spawn_blocking(move || {
        mechanisms.into_iter().map(|m| (m, scram::credential(m, &password, iterations))).collect::<Vec<_>>()
    })
    .await
    .map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?;
    // One change per mechanism would name the user twice in one request, which the controller
    // refuses: each goes on its own.
    for (mechanism, credential) in credentials {
        let change = ScramChange::Upsert { user: request.name.clone(), mechanism, credential };
        let outcome = core.broker.alter_scram_credentials(vec![change]).await?;
        if let Some(Err(e)) = outcome.into_iter().next() {
            return Err(e.into());
        }
    }
    // RocketMQ access: granted or taken away when asked; a user who has it signs with the new
    // password from now on.
    let had_access = core.broker.access_secret(&request.name).is_some();
    match request.rocketmq {
        Some(true) => core.broker.set_access_secret(request.name.clone(), Some(request.password.clone())).await?,
        Some(false) => core.broker.set_access_secret(request.name.clone(), None).await?,
        None if had_access => {
            core.broker.set_access_secret(request.name.clone(), Some(request.password.clone())).await?
        }
        None => {}
    }
    let list = core.broker.scram_users().remove(&request.name).unwrap_or_default();
    Ok((StatusCode::CREATED, Json(info(&core.broker, request.name, &list))))
}

/// `DELETE /v1/users/{name}`: removes every credential of the user.
pub(crate) async fn delete(
    State(state): State<SharedState>,
    PathParams(name): PathParams<String>,
) -> Result<Json<DeletedUser>, ApiError> {
    let core = state.core()?;
    let Some(list) = core.broker.scram_users().remove(&name) else {
        return Err(ApiError::new(ErrorKind::ResourceNotFound, format!("user {name:?} does not exist")));
    };
    let mut removed = Vec::new();
    for (mechanism, _) in list {
        let change = ScramChange::Delete { user: name.clone(), mechanism };
        let outcome = core.broker.alter_scram_credentials(vec![change]).await?;
        match outcome.into_iter().next() {
            Some(Err(e)) => return Err(e.into()),
            _ => removed.push(mechanism.name().to_string()),
        }
    }
    Ok(Json(DeletedUser { name, mechanisms: removed }))
}
