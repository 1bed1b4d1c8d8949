//! Users' SCRAM credentials (KIP-554's AlterUserScramCredentials): which changes may be
//! committed. The credential arrives salted and hashed (the broker that took the request
//! derived it from the password); the password itself never reaches the metadata log.

use serde::{Deserialize, Serialize};
use weir_error::{BrokerError, ErrorKind};
use weir_metadata::{MetadataRecord, MetadataState, ScramCredential, ScramMechanism};

/// Kafka's bounds on a SCRAM credential's iterations (`ScramMechanism.minIterations`, and
/// the 16,384 its brokers refuse beyond).
pub const MIN_ITERATIONS: u32 = 4096;
pub const MAX_ITERATIONS: u32 = 16384;
/// Longest user name (a principal is named in ACLs and logs; Kafka sets no limit of its own).
pub const MAX_USER_NAME: usize = 256;

/// One change of AlterUserScramCredentials.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ScramChange {
    Upsert { user: String, mechanism: ScramMechanism, credential: ScramCredential },
    Delete { user: String, mechanism: ScramMechanism },
}

impl ScramChange {
    pub fn user(&self) -> &str {
        match self {
            ScramChange::Upsert { user, .. } | ScramChange::Delete { user, .. } => user,
        }
    }
}

/// The records of `changes` and each change's outcome, in order. As Kafka does, a user named
/// by more than one change of the request fails every one of them (DUPLICATE_RESOURCE): the
/// order they would apply in is not the client's to guess.
pub fn decide_alter(
    state: &MetadataState,
    changes: &[ScramChange],
) -> (Vec<MetadataRecord>, Vec<Result<(), BrokerError>>) {
    let mut records = Vec::new();
    let mut outcomes = Vec::with_capacity(changes.len());
    for change in changes {
        let user = change.user();
        let named = changes.iter().filter(|c| c.user() == user).count();
        let outcome = if named > 1 {
            Err(BrokerError::new(ErrorKind::DuplicateResource, format!("user {user:?} is named more than once")))
        } else {
            check(state, change)
        };
        if outcome.is_ok() {
            records.push(match change.clone() {
                ScramChange::Upsert { user, mechanism, credential } => {
                    MetadataRecord::SetScramCredential { user, mechanism, credential }
                }
                ScramChange::Delete { user, mechanism } => MetadataRecord::RemoveScramCredential { user, mechanism },
            });
        }
        outcomes.push(outcome);
    }
    (records, outcomes)
}

fn check(state: &MetadataState, change: &ScramChange) -> Result<(), BrokerError> {
    let user = change.user();
    if user.is_empty() || user.len() > MAX_USER_NAME || user.chars().any(|c| c.is_control()) {
        return Err(BrokerError::new(
            ErrorKind::UnacceptableCredential,
            format!("a user name has 1 to {MAX_USER_NAME} characters, none of them control characters"),
        ));
    }
    match change {
        ScramChange::Upsert { credential, mechanism, .. } => {
            if !(MIN_ITERATIONS..=MAX_ITERATIONS).contains(&credential.iterations) {
                return Err(BrokerError::new(
                    ErrorKind::UnacceptableCredential,
                    format!("iterations must be from {MIN_ITERATIONS} to {MAX_ITERATIONS}"),
                ));
            }
            let digest = match mechanism {
                ScramMechanism::Sha256 => 32,
                ScramMechanism::Sha512 => 64,
            };
            if credential.salt.is_empty()
                || credential.stored_key.len() != digest
                || credential.server_key.len() != digest
            {
                return Err(BrokerError::new(
                    ErrorKind::UnacceptableCredential,
                    format!("a {} credential needs a salt and keys of {digest} bytes", mechanism.name()),
                ));
            }
            Ok(())
        }
        ScramChange::Delete { user, mechanism } => {
            let exists = state.scram_credentials.get(user).is_some_and(|m| m.contains_key(mechanism));
            if exists {
                Ok(())
            } else {
                Err(BrokerError::new(
                    ErrorKind::ResourceNotFound,
                    format!("user {user:?} has no {} credential to delete", mechanism.name()),
                ))
            }
        }
    }
}

/// The record setting (or, with `None`, removing) `user`'s RocketMQ secret key; `None` when
/// nothing changes. A secret goes with a user who has a SCRAM credential (the access key is the
/// user's name), and is what a client signs with: not empty, at most 1,024 bytes.
pub fn decide_access_secret(
    state: &MetadataState,
    user: &str,
    secret: Option<&str>,
) -> Result<Option<MetadataRecord>, BrokerError> {
    let invalid = |why: String| Err(BrokerError::new(ErrorKind::InvalidRequest, why));
    if let Some(secret) = secret {
        if secret.is_empty() || secret.len() > 1024 {
            return invalid("a RocketMQ secret key has 1 to 1024 bytes".into());
        }
        if !state.scram_credentials.contains_key(user) {
            return Err(BrokerError::new(ErrorKind::ResourceNotFound, format!("no user {user:?}: create it first")));
        }
    }
    let current = state.access_secrets.get(user).map(String::as_str);
    if current == secret {
        return Ok(None);
    }
    Ok(Some(MetadataRecord::SetAccessSecret { user: user.to_string(), secret: secret.map(str::to_string) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credential(iterations: u32) -> ScramCredential {
        ScramCredential { salt: vec![1; 16], stored_key: vec![2; 32], server_key: vec![3; 32], iterations }
    }

    #[test]
    fn upserts_deletes_and_refusals() {
        let mut state = MetadataState::default();
        let upsert = |user: &str, iterations| ScramChange::Upsert {
            user: user.into(),
            mechanism: ScramMechanism::Sha256,
            credential: credential(iterations),
        };
        let (records, outcomes) = decide_alter(&state, &[upsert("alice", 4096), upsert("bob", 100)]);
        assert_eq!(records.len(), 1);
        assert!(outcomes[0].is_ok());
        assert_eq!(outcomes[1].as_ref().unwrap_err().kind, ErrorKind::UnacceptableCredential);
        state.apply(0, &records[0]);
        assert!(state.scram_credentials["alice"].contains_key(&ScramMechanism::Sha256));

        let delete = |user: &str, mechanism| ScramChange::Delete { user: user.into(), mechanism };
        let (_, outcomes) = decide_alter(&state, &[delete("alice", ScramMechanism::Sha512)]);
        assert_eq!(outcomes[0].as_ref().unwrap_err().kind, ErrorKind::ResourceNotFound);
        let (_, outcomes) = decide_alter(&state, &[delete("alice", ScramMechanism::Sha256), upsert("alice", 4096)]);
        assert!(outcomes.iter().all(|o| o.as_ref().unwrap_err().kind == ErrorKind::DuplicateResource));
        let (records, outcomes) = decide_alter(&state, &[delete("alice", ScramMechanism::Sha256)]);
        assert!(outcomes[0].is_ok());
        state.apply(1, &records[0]);
        assert!(state.scram_credentials.is_empty());
        let (_, outcomes) = decide_alter(&state, &[upsert("", 4096)]);
        assert!(outcomes[0].is_err());
    }

    #[test]
    fn a_rocketmq_secret_goes_with_an_existing_user() {
        let mut state = MetadataState::default();
        let refused = decide_access_secret(&state, "carol", Some("secret")).expect_err("no such user");
        assert_eq!(refused.kind, ErrorKind::ResourceNotFound);
        state.scram_credentials.entry("carol".into()).or_default();
        assert!(decide_access_secret(&state, "carol", Some("")).is_err(), "an empty secret");
        let record = decide_access_secret(&state, "carol", Some("secret")).expect("valid").expect("a change");
        state.apply(0, &record);
        assert_eq!(state.access_secrets.get("carol").map(String::as_str), Some("secret"));
        assert_eq!(decide_access_secret(&state, "carol", Some("secret")).expect("valid"), None, "unchanged");
        let removal = decide_access_secret(&state, "carol", None).expect("valid").expect("a change");
        state.apply(1, &removal);
        assert!(state.access_secrets.is_empty());
    }
}
