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

    /// A broker that logs in to the others' inter-broker listener over SASL makes sure its user
    /// exists, as Kafka's `kafka-storage format --add-scram` would have made it: created with the
    /// configured password when the metadata holds no credential of the login's mechanism for
    /// it (for PLAIN, which is checked against any of them: none at all). An existing
    /// credential is never replaced: a password changed through the API wins over the file, and
    /// this broker's login then fails, loudly, at the leader. Brokers starting together may
    /// each create it; they hold the same password, so whichever is stored last serves.
    pub async fn ensure_inter_broker_user(self: &Arc<Self>) -> Result<(), BrokerError> {
        let Some(login) = self.config.inter_broker.as_ref().and_then(|c| c.login.as_ref()) else { return Ok(()) };
        let (mechanism, exists) = match login.mechanism {
            crate::config::SaslMechanism::Plain => (
                ScramMechanism::Sha512,
                self.metadata().scram_credentials.get(&login.user).is_some_and(|c| !c.is_empty()),
            ),
            crate::config::SaslMechanism::Scram(mechanism) => {
                (mechanism, self.scram_credential(&login.user, mechanism).is_some())
            }
        };
        if exists {
            return Ok(());
        }
        let credential = weir_security::scram::credential(mechanism, &login.password, MIN_ITERATIONS);
        let change = ScramChange::Upsert { user: login.user.clone(), mechanism, credential };
        for outcome in self.alter_scram_credentials(vec![change]).await? {
            outcome?;
        }
        tracing::info!(user = %login.user, mechanism = mechanism.name(), "created the inter-broker user from its JAAS login");
        Ok(())
    }

    /// `user`'s RocketMQ secret key, if it has RocketMQ access.
    pub fn access_secret(&self, user: &str) -> Option<String> {
        self.metadata().access_secrets.get(user).cloned()
    }

    /// Gives `user` RocketMQ access with `secret` (its password), or with `None` takes it away,
    /// through the controller.
    pub async fn set_access_secret(self: &Arc<Self>, user: String, secret: Option<String>) -> Result<(), BrokerError> {
        match self.control(ControlRequest::SetAccessSecret { user, secret }).await? {
            ControlAnswer::Done => Ok(()),
            other => Err(crate::broker::unexpected_answer(&other)),
        }
    }

    pub(crate) fn decide_access_secret(
        &self,
        held: &std::sync::MutexGuard<'_, ()>,
        user: String,
        secret: Option<String>,
    ) -> Result<(), BrokerError> {
        if let Some(record) = decide_access_secret(&self.metadata(), &user, secret.as_deref())? {
            self.commit(held, vec![record])?;
            tracing::info!(%user, access = secret.is_some(), "RocketMQ access changed");
        }
        Ok(())
    }
}
