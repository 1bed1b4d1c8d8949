//! Consumer-group settings on this broker: read from the applied metadata, changed through the
//! controller. What they mean, how they are checked and decided is the controller's
//! ([`weir_controller::group_config`], re-exported here).

use std::collections::BTreeMap;

pub use weir_controller::group_config::*;

use crate::broker::Broker;
use crate::cluster::{ControlAnswer, ControlRequest};
use crate::error::BrokerError;
use crate::topic_config::ConfigEdit;

impl Broker {
    /// The settings of consumer group `group` (the defaults for a group without any).
    pub fn group_settings(&self, group: &str) -> GroupSettings {
        self.metadata().group_configs.get(group).map(GroupSettings::from_configs).unwrap_or_default()
    }

    /// The overrides of consumer group `group`, by name; `None` when it has none.
    pub fn group_configs(&self, group: &str) -> Option<BTreeMap<String, String>> {
        self.metadata().group_configs.get(group).cloned()
    }

    /// Changes a group's settings through the controller, applying `edit` to the overrides
    /// current when it decides. With `create`, a group that has settings already is refused
    /// ([`ErrorKind::GroupExists`]).
    pub async fn alter_group_configs(
        self: &std::sync::Arc<Self>,
        group: String,
        create: bool,
        validate_only: bool,
        edit: ConfigEdit,
    ) -> Result<(), BrokerError> {
        match self.control(ControlRequest::AlterGroupConfigs { group, create, validate_only, edit }).await? {
            ControlAnswer::Done => Ok(()),
            other => Err(crate::broker::unexpected_answer(&other)),
        }
    }

    pub(crate) fn decide_alter_group_configs(
        &self,
        held: &std::sync::MutexGuard<'_, ()>,
        group: String,
        create: bool,
        validate_only: bool,
        edit: ConfigEdit,
    ) -> Result<(), BrokerError> {
        let records = decide_alter(&self.metadata(), &group, create, validate_only, &edit)?;
        if !records.is_empty() {
            self.commit(held, records)?;
            tracing::info!(group = %group, "altered group configs");
        }
        Ok(())
    }
}
