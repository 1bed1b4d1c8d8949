//! Users' SCRAM credentials (KIP-554: AlterUserScramCredentials, DescribeUserScramCredentials),
//! and the SASL requests on a listener without SASL.

use std::collections::BTreeSet;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use weir_broker::users::ScramChange;
use weir_broker::ErrorKind;
use weir_security::scram;
use weir_security::ScramMechanism;

use super::message;
use crate::context::{Client, Ctx};
use crate::errors;

/// A change refused before the controller sees it: its error code and message.
type Refused = (i16, String);

/// A SaslHandshake on a listener that has no SASL: no mechanism is offered.
pub(crate) async fn handshake_without_sasl(
    _ctx: &Ctx,
    _client: &Client,
    _request: SaslHandshakeRequest,
) -> SaslHandshakeResponse {
    SaslHandshakeResponse::default().with_error_code(ResponseError::UnsupportedSaslMechanism.code())
}

pub(crate) async fn authenticate_without_sasl(
    _ctx: &Ctx,
    _client: &Client,
    _request: SaslAuthenticateRequest,
) -> SaslAuthenticateResponse {
    SaslAuthenticateResponse::default()
        .with_error_code(ResponseError::IllegalSaslState.code())
        .with_error_message(message("this listener does not use SASL"))
}

pub(crate) async fn alter_scram_credentials(
    ctx: &Ctx,
    client: &Client,
    request: AlterUserScramCredentialsRequest,
) -> AlterUserScramCredentialsResponse {
    if let Err(e) = ctx.require_on_cluster(client, weir_security::acl::AclOperation::Alter) {
        let users: BTreeSet<String> = request
            .deletions
            .iter()
            .map(|d| d.name.to_string())
            .chain(request.upsertions.iter().map(|u| u.name.to_string()))
            .collect();
        let results = users
            .into_iter()
            .map(|user| {
                AlterUserScramCredentialsResult::default()
                    .with_user(StrBytes::from_string(user))
                    .with_error_code(errors::code(&e))
                    .with_error_message(message(e.message.clone()))
            })
            .collect();
        return AlterUserScramCredentialsResponse::default().with_results(results);
    }
    // Each change in request order: (user, the change or why it cannot be one).
    let mut changes: Vec<(String, Result<ScramChange, Refused>)> = Vec::new();
    for deletion in &request.deletions {
        let user = deletion.name.to_string();
        let change = match ScramMechanism::from_kafka_type(deletion.mechanism) {
            Some(mechanism) => Ok(ScramChange::Delete { user: user.clone(), mechanism }),
            None => Err((
                ResponseError::UnsupportedSaslMechanism.code(),
                format!("unknown SCRAM mechanism {}", deletion.mechanism),
            )),
        };
        changes.push((user, change));
    }
    for upsertion in &request.upsertions {
        let user = upsertion.name.to_string();
        let change = match ScramMechanism::from_kafka_type(upsertion.mechanism) {
            None => Err((
                ResponseError::UnsupportedSaslMechanism.code(),
                format!("unknown SCRAM mechanism {}", upsertion.mechanism),
            )),
            Some(_) if upsertion.salt.is_empty() || upsertion.salted_password.is_empty() => Err((
                errors::code_of(Some(ErrorKind::UnacceptableCredential)),
                "a salt and a salted password are required".into(),
            )),
            Some(mechanism) => {
                let iterations = u32::try_from(upsertion.iterations).unwrap_or(0);
                let credential = scram::credential_from_salted(
                    mechanism,
                    upsertion.salt.to_vec(),
                    &upsertion.salted_password,
                    iterations,
                );
                Ok(ScramChange::Upsert { user: user.clone(), mechanism, credential })
            }
        };
        changes.push((user, change));
    }
    // A user named twice fails every time it is named (Kafka's rule, decided by the
    // controller too); the others go to the controller together.
    let mut seen = BTreeSet::new();
    let duplicates: BTreeSet<String> =
        changes.iter().filter(|(u, _)| !seen.insert(u.clone())).map(|(u, _)| u.clone()).collect();
    let valid: Vec<ScramChange> = changes
        .iter()
        .filter(|(user, _)| !duplicates.contains(user))
        .filter_map(|(_, c)| c.as_ref().ok().cloned())
        .collect();
    let outcomes = if valid.is_empty() { Ok(Vec::new()) } else { ctx.broker.alter_scram_credentials(valid).await };
    let mut outcomes = match outcomes {
        Ok(outcomes) => outcomes.into_iter().map(|o| o.err()).collect::<Vec<_>>().into_iter(),
        Err(e) => {
            // Nothing was decided: every change gets the error.
            let n = changes.len();
            vec![Some(e); n].into_iter()
        }
    };
    let results = changes
        .into_iter()
        .map(|(user, change)| {
            let result = AlterUserScramCredentialsResult::default().with_user(StrBytes::from_string(user.clone()));
            if duplicates.contains(&user) {
                return result
                    .with_error_code(ResponseError::DuplicateResource.code())
                    .with_error_message(message(format!("user {user:?} is named more than once")));
            }
            match change {
                Err((code, text)) => result.with_error_code(code).with_error_message(message(text)),
                Ok(_) => match outcomes.next().flatten() {
                    None => result,
                    Some(e) => result.with_error_code(errors::code(&e)).with_error_message(message(e.message)),
                },
            }
        })
        .collect();
    AlterUserScramCredentialsResponse::default().with_results(results)
}

pub(crate) async fn describe_scram_credentials(
    ctx: &Ctx,
    client: &Client,
    request: DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    if let Err(e) = ctx.require_on_cluster(client, weir_security::acl::AclOperation::Describe) {
        return DescribeUserScramCredentialsResponse::default()
            .with_error_code(errors::code(&e))
            .with_error_message(message(e.message));
    }
    let users = ctx.broker.scram_users();
    let info = |list: &[(ScramMechanism, u32)]| -> Vec<CredentialInfo> {
        list.iter()
            .map(|(m, i)| CredentialInfo::default().with_mechanism(m.kafka_type()).with_iterations(*i as i32))
            .collect()
    };
    let results = match request.users {
        // None or empty: every user with a credential.
        None => users.iter().map(|(u, list)| found(u, info(list))).collect(),
        Some(asked) if asked.is_empty() => users.iter().map(|(u, list)| found(u, info(list))).collect(),
        Some(asked) => {
            let mut seen = BTreeSet::new();
            let names: Vec<String> = asked.iter().map(|u| u.name.to_string()).collect();
            let duplicates: BTreeSet<String> = names.iter().filter(|n| !seen.insert((*n).clone())).cloned().collect();
            let mut listed = BTreeSet::new();
            names
                .into_iter()
                .filter(|n| listed.insert(n.clone()))
                .map(|name| {
                    if duplicates.contains(&name) {
                        DescribeUserScramCredentialsResult::default()
                            .with_user(StrBytes::from_string(name.clone()))
                            .with_error_code(ResponseError::DuplicateResource.code())
                            .with_error_message(message(format!("user {name:?} is asked for more than once")))
                    } else {
                        match users.get(&name) {
                            Some(list) => found(&name, info(list)),
                            None => DescribeUserScramCredentialsResult::default()
                                .with_user(StrBytes::from_string(name.clone()))
                                .with_error_code(ResponseError::ResourceNotFound.code())
                                .with_error_message(message(format!(
                                    "attempt to describe a user credential that does not exist: {name}"
                                ))),
                        }
                    }
                })
                .collect()
        }
    };
    DescribeUserScramCredentialsResponse::default().with_results(results)
}

fn found(user: &str, infos: Vec<CredentialInfo>) -> DescribeUserScramCredentialsResult {
    DescribeUserScramCredentialsResult::default()
        .with_user(StrBytes::from_string(user.to_string()))
        .with_credential_infos(infos)
}
