//! Dynamic broker configs on this broker (the replication throttles' rates and the `log.*`
//! topic defaults): read from the applied metadata, changed through the controller. What they mean and how a change is
//! decided is the controller's ([`weir_controller::throttle`]); the budgets they set are
//! [`crate::throttle`]'s.

use std::collections::BTreeMap;

use crate::broker::Broker;
use crate::cluster::ControlRequest;
use crate::error::BrokerError;
use crate::throttle::decide_alter;
use crate::topic_config::ConfigEdit;

impl Broker {
    /// Changes dynamic broker configs through the controller: `resource` is `""` (every
    /// broker) or a broker id.
    pub async fn alter_broker_configs(
        self: &std::sync::Arc<Self>,
        resource: String,
        validate_only: bool,
        edit: ConfigEdit,
    ) -> Result<(), BrokerError> {
        self.control(ControlRequest::AlterBrokerConfigs { resource, validate_only, edit }).await.map(|_| ())
    }

    /// The dynamic configs of `resource` (`""` or a broker id).
    pub fn dynamic_broker_configs(&self, resource: &str) -> BTreeMap<String, String> {
        self.metadata().broker_configs.get(resource).cloned().unwrap_or_default()
    }

    /// The topic defaults in force on this broker (by topic config name): its settings', then
    /// the dynamic ones of the cluster and of this broker. What a topic's effective configs are
    /// read against; `config.topic_defaults` alone misses what changed at run time.
    pub fn topic_defaults(&self) -> BTreeMap<String, String> {
        crate::topic_config::effective_defaults(
            &self.config.topic_defaults,
            &self.metadata().broker_configs,
            Some(self.config.node_id),
        )
    }

    pub(crate) fn decide_alter_broker_configs(
        &self,
        held: &std::sync::MutexGuard<'_, ()>,
        resource: String,
        validate_only: bool,
        edit: ConfigEdit,
    ) -> Result<(), BrokerError> {
        let records = decide_alter(&self.metadata(), &resource, validate_only, &edit)?;
        if !records.is_empty() {
            self.commit(held, records)?;
            tracing::info!(resource = %resource, "altered dynamic broker configs");
            self.elect_where_unclean_allowed(held)?;
        }
        Ok(())
    }
}
