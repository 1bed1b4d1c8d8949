//! ACLs (KIP-140's CreateAcls and DeleteAcls): which bindings may be committed, and which a
//! deletion's filters remove.

use std::collections::BTreeSet;

use weir_error::{BrokerError, ErrorKind};
use weir_metadata::acl::{AclBinding, AclFilter, AclOperation, PatternType, ResourceType, CLUSTER_RESOURCE};
use weir_metadata::{MetadataRecord, MetadataState};

/// Longest resource name, principal or host an ACL may name.
pub const MAX_NAME: usize = 1024;

/// The records adding `bindings` (those not stored already) and each binding's outcome, in
/// order. Each binding is checked on its own: a bad one fails alone.
pub fn decide_create(
    state: &MetadataState,
    bindings: &[AclBinding],
) -> (Vec<MetadataRecord>, Vec<Result<(), BrokerError>>) {
    let mut added = BTreeSet::new();
    let mut records = Vec::new();
    let outcomes = bindings
        .iter()
        .map(|binding| {
            check(binding)?;
            if !state.acls.contains(binding) && added.insert(binding.clone()) {
                records.push(MetadataRecord::CreateAcl { binding: binding.clone() });
            }
            Ok(())
        })
        .collect();
    (records, outcomes)
}

/// The records removing every binding some filter matches, and per filter the bindings it
/// matched (a binding two filters match is removed once and reported under both, as Kafka does).
pub fn decide_delete(state: &MetadataState, filters: &[AclFilter]) -> (Vec<MetadataRecord>, Vec<Vec<AclBinding>>) {
    let mut removed = BTreeSet::new();
    let mut records = Vec::new();
    let matched = filters
        .iter()
        .map(|filter| {
            let bindings: Vec<AclBinding> = state.acls.iter().filter(|b| filter.matches(b)).cloned().collect();
            for binding in &bindings {
                if removed.insert(binding.clone()) {
                    records.push(MetadataRecord::RemoveAcl { binding: binding.clone() });
                }
            }
            bindings
        })
        .collect();
    (records, matched)
}

/// Kafka's operations per resource type (besides ALL, valid everywhere).
pub fn supported_operations(resource_type: ResourceType) -> &'static [AclOperation] {
    use AclOperation::*;
    match resource_type {
        ResourceType::Topic => &[Read, Write, Create, Describe, Delete, Alter, DescribeConfigs, AlterConfigs],
        ResourceType::Group => &[Read, Describe, Delete, DescribeConfigs, AlterConfigs],
        ResourceType::Cluster => {
            &[Create, ClusterAction, DescribeConfigs, AlterConfigs, IdempotentWrite, Alter, Describe]
        }
        ResourceType::TransactionalId => &[Describe, Write],
        ResourceType::DelegationToken => &[Describe],
        ResourceType::User => &[CreateTokens, DescribeTokens],
    }
}

fn check(binding: &AclBinding) -> Result<(), BrokerError> {
    let invalid = |why: String| Err(BrokerError::new(ErrorKind::InvalidRequest, why));
    let name = &binding.resource_name;
    if name.is_empty() || name.len() > MAX_NAME || name.chars().any(char::is_control) {
        return invalid(format!("a resource name has 1 to {MAX_NAME} characters, none of them control characters"));
    }
    if binding.resource_type == ResourceType::Cluster
        && (binding.resource_name != CLUSTER_RESOURCE || binding.pattern_type != PatternType::Literal)
    {
        return invalid(format!("the cluster resource is named {CLUSTER_RESOURCE:?}, as a literal"));
    }
    match binding.principal.split_once(':') {
        Some(("User", user)) if !user.is_empty() && binding.principal.len() <= MAX_NAME => {}
        _ => return invalid(format!("principal {:?} is not of the form User:<name> (or User:*)", binding.principal)),
    }
    let host = &binding.host;
    if host != "*" && host.parse::<std::net::IpAddr>().is_err() {
        return invalid(format!("host {host:?} is neither an IP address nor *"));
    }
    let operation = binding.operation;
    if operation != AclOperation::All && !supported_operations(binding.resource_type).contains(&operation) {
        return invalid(format!("{operation} does not apply to a {} resource", binding.resource_type));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use weir_metadata::acl::{AclPermission, PatternFilter};

    use super::*;

    fn read(topic: &str) -> AclBinding {
        AclBinding {
            resource_type: ResourceType::Topic,
            resource_name: topic.into(),
            pattern_type: PatternType::Literal,
            principal: "User:alice".into(),
            host: "*".into(),
            operation: AclOperation::Read,
            permission: AclPermission::Allow,
        }
    }

    fn apply(state: &mut MetadataState, records: Vec<MetadataRecord>) {
        for record in records {
            state.apply(state.applied_offset + 1, &record);
        }
    }

    #[test]
    fn bindings_are_added_once_and_bad_ones_fail_alone() {
        let mut state = MetadataState::default();
        let mut bad_principal = read("orders");
        bad_principal.principal = "alice".into();
        let mut bad_host = read("orders");
        bad_host.host = "example.com".into();
        let mut bad_operation = read("orders");
        bad_operation.operation = AclOperation::IdempotentWrite;
        let mut bad_cluster = read("orders");
        bad_cluster.resource_type = ResourceType::Cluster;
        let (records, outcomes) = decide_create(
            &state,
            &[read("orders"), read("orders"), bad_principal, bad_host, bad_operation, bad_cluster],
        );
        assert_eq!(records.len(), 1, "the same binding twice is one record");
        assert!(outcomes[0].is_ok() && outcomes[1].is_ok());
        assert!(outcomes[2..].iter().all(|o| o.as_ref().is_err_and(|e| e.kind == ErrorKind::InvalidRequest)));
        apply(&mut state, records);
        assert_eq!(state.acls.len(), 1);
        let (records, outcomes) = decide_create(&state, &[read("orders")]);
        assert!(records.is_empty() && outcomes[0].is_ok(), "an existing binding is not added again");
    }

    #[test]
    fn deletion_removes_what_the_filters_match_and_reports_it_per_filter() {
        let mut state = MetadataState::default();
        let (records, _) = decide_create(&state, &[read("orders"), read("payments")]);
        apply(&mut state, records);
        let mut orders = AclFilter::any();
        orders.resource_name = Some("orders".into());
        orders.pattern = PatternFilter::Match;
        let (records, matched) = decide_delete(&state, &[orders, AclFilter::any()]);
        assert_eq!(matched[0], vec![read("orders")]);
        assert_eq!(matched[1].len(), 2);
        assert_eq!(records.len(), 2, "each binding removed once");
        apply(&mut state, records);
        assert!(state.acls.is_empty());
    }
}
