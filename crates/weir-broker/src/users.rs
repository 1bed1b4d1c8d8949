//! Users and their SCRAM credentials on this broker: read from the applied metadata, changed
//! through the controller ([`weir_controller::users`]).

use std::collections::BTreeMap;
use std::sync::Arc;

pub use weir_controller::users::*;
use weir_metadata::{ScramCredential, ScramMechanism};

use crate::broker::Broker;
use crate::cluster::{ControlAnswer, ControlRequest};
use crate::error::BrokerError;

impl Broker {
    /// `user`'s credential for `mechanism`, if it has one.
    pub fn scram_credential(&self, user: &str, mechanism: ScramMechanism) -> Option<ScramCredential> {
        self.metadata().scram_credentials.get(user).and_then(|m| m.get(&mechanism)).cloned()
    }

    /// Every user with a credential: its mechanisms and their iterations.
    pub fn scram_users(&self) -> BTreeMap<String, Vec<(ScramMechanism, u32)>> {
        self.metadata()
            .scram_credentials
            .iter()
            .map(|(user, credentials)| (user.clone(), credentials.iter().map(|(m, c)| (*m, c.iterations)).collect()))
            .collect()
    }

    /// Sets and removes credentials through the controller: one outcome per change, in order.
    pub async fn alter_scram_credentials(
        self: &Arc<Self>,
        changes: Vec<ScramChange>,
    ) -> Result<Vec<Result<(), BrokerError>>, BrokerError> {
        match self.control(ControlRequest::AlterScramCredentials { changes }).await? {
            ControlAnswer::Each(outcomes) => Ok(outcomes),
            other => Err(crate::broker::unexpected_answer(&other)),
        }
    }

    pub(crate) fn decide_alter_scram_credentials(
        &self,
        held: &std::sync::MutexGuard<'_, ()>,
        changes: Vec<ScramChange>,
    ) -> Result<Vec<Result<(), BrokerError>>, BrokerError> {
        let (records, outcomes) = decide_alter(&self.metadata(), &changes);
        if !records.is_empty() {
            self.commit(held, records)?;
            for (change, outcome) in changes.iter().zip(&outcomes) {
                if outcome.is_ok() {
                    let action = if matches!(change, ScramChange::Upsert { .. }) { "set" } else { "removed" };
                    tracing::info!(user = %change.user(), action, "SCRAM credential changed");
                }
            }
        }
        Ok(outcomes)
    }
}
