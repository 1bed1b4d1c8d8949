//! ACLs on this broker: read from the applied metadata, changed through the controller
//! ([`weir_controller::acls`]), and the authorizer's decisions ([`weir_security::acl`]) with
//! this broker's settings.

use std::sync::Arc;

use weir_metadata::acl::{AclBinding, AclFilter, AclOperation, ResourceType};
use weir_security::acl::{self, Request};

use crate::broker::Broker;
use crate::cluster::{ControlAnswer, ControlRequest};
use crate::error::BrokerError;
use weir_storage::sync::{read, write};

impl Broker {
    /// The ACLs of the current metadata, indexed: built again only when they changed (the
    /// state's ACLs are shared between the states that did not change them).
    fn acl_index(&self) -> Arc<acl::AclIndex> {
        let state = self.metadata();
        {
            let (acls, index) = &*read(&self.acl_index);
            if Arc::ptr_eq(acls, &state.acls) {
                return index.clone();
            }
        }
        let index = Arc::new(acl::AclIndex::new(state.acls.iter()));
        *write(&self.acl_index) = (state.acls.clone(), index.clone());
        index
    }

    /// Is authorization on (`authorizer.class.name`)?
    pub fn authorizer_enabled(&self) -> bool {
        self.config.authorizer.enabled
    }

    /// May `principal`, connected from `host`, perform `operation` on the resource?
    pub fn authorize(
        &self,
        principal: &str,
        host: &str,
        operation: AclOperation,
        resource_type: ResourceType,
        resource_name: &str,
    ) -> bool {
        let settings = &self.config.authorizer;
        if !settings.enabled {
            return true;
        }
        let request = Request { principal, host, operation, resource_type, resource_name };
        let allowed = acl::authorize(settings, &self.acl_index(), &request);
        if !allowed {
            self.metrics.authorization_denials.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::debug!(principal, host, %operation, %resource_type, resource_name, "not authorized");
        }
        allowed
    }

    /// May `principal` perform `operation` on some resource of `resource_type` (Kafka's
    /// authorization by resource type: IDEMPOTENT_WRITE is implied by WRITE on any topic)?
    pub fn authorize_any(
        &self,
        principal: &str,
        host: &str,
        operation: AclOperation,
        resource_type: ResourceType,
    ) -> bool {
        let settings = &self.config.authorizer;
        !settings.enabled || acl::authorize_any(settings, &self.acl_index(), principal, host, operation, resource_type)
    }

    /// The ACLs `filter` matches, in their stored order.
    pub fn acls(&self, filter: &AclFilter) -> Vec<AclBinding> {
        self.metadata().acls.iter().filter(|b| filter.matches(b)).cloned().collect()
    }

    /// Adds ACLs through the controller: one outcome per binding, in order.
    pub async fn create_acls(
        self: &Arc<Self>,
        bindings: Vec<AclBinding>,
    ) -> Result<Vec<Result<(), BrokerError>>, BrokerError> {
        match self.control(ControlRequest::CreateAcls { bindings }).await? {
            ControlAnswer::Each(outcomes) => Ok(outcomes),
            other => Err(crate::broker::unexpected_answer(&other)),
        }
    }

    /// Removes the ACLs the filters match, through the controller: per filter, what it removed.
    pub async fn delete_acls(self: &Arc<Self>, filters: Vec<AclFilter>) -> Result<Vec<Vec<AclBinding>>, BrokerError> {
        match self.control(ControlRequest::DeleteAcls { filters }).await? {
            ControlAnswer::DeletedAcls(matched) => Ok(matched),
            other => Err(crate::broker::unexpected_answer(&other)),
        }
    }

    pub(crate) fn decide_create_acls(
        &self,
        held: &std::sync::MutexGuard<'_, ()>,
        bindings: Vec<AclBinding>,
    ) -> Result<Vec<Result<(), BrokerError>>, BrokerError> {
        let (records, outcomes) = weir_controller::acls::decide_create(&self.metadata(), &bindings);
        if !records.is_empty() {
            let count = records.len();
            self.commit(held, records)?;
            tracing::info!(count, "ACLs created");
        }
        Ok(outcomes)
    }

    pub(crate) fn decide_delete_acls(
        &self,
        held: &std::sync::MutexGuard<'_, ()>,
        filters: Vec<AclFilter>,
    ) -> Result<Vec<Vec<AclBinding>>, BrokerError> {
        let (records, matched) = weir_controller::acls::decide_delete(&self.metadata(), &filters);
        if !records.is_empty() {
            let count = records.len();
            self.commit(held, records)?;
            tracing::info!(count, "ACLs deleted");
        }
        Ok(matched)
    }
}
