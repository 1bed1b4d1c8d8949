//! Access control lists in Kafka's model (KIP-140's ACL APIs, KRaft's `AccessControlEntryRecord`):
//! a binding allows or denies one principal, from one host, one operation on a resource or on
//! every resource whose name starts with a prefix. Bindings are stored in the metadata log and
//! applied like every other record; the decision that uses them is `weir_security::acl`.
//!
//! The numbers are Kafka's wire codes (`ResourceType`, `PatternType`, `AclOperation`,
//! `AclPermissionType`), so the APIs translate without tables of their own. The filters'
//! wildcards (ANY, MATCH) are only in [`AclFilter`]: a stored binding is always concrete.

use serde::{Deserialize, Serialize};

/// The name of the one cluster resource (Kafka's `kafka-cluster`).
pub const CLUSTER_RESOURCE: &str = "kafka-cluster";
/// A literal resource name matching every resource of its type; a principal or host matching
/// every principal or host is `User:*` and `*`.
pub const WILDCARD: &str = "*";
/// The wildcard principal.
pub const ANY_PRINCIPAL: &str = "User:*";

macro_rules! kafka_enum {
    ($(#[$doc:meta])* $name:ident { $($variant:ident = $code:literal => $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub enum $name {
            $(#[serde(rename = $text)] $variant),+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// Kafka's wire code.
            pub fn code(self) -> i8 {
                match self { $($name::$variant => $code),+ }
            }

            pub fn from_code(code: i8) -> Option<$name> {
                match code { $($code => Some($name::$variant),)+ _ => None }
            }

            /// Kafka's name (as `kafka-acls.sh` and the Admin client print it).
            pub fn name(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }

            /// By Kafka's name, in any case, with `-` or `_` between words.
            pub fn from_name(name: &str) -> Option<$name> {
                let wanted = name.replace('-', "_");
                $name::ALL.iter().copied().find(|v| v.name().eq_ignore_ascii_case(&wanted))
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

kafka_enum! {
    /// What kind of resource a binding is about.
    ResourceType {
        Topic = 2 => "TOPIC",
        Group = 3 => "GROUP",
        Cluster = 4 => "CLUSTER",
        TransactionalId = 5 => "TRANSACTIONAL_ID",
        DelegationToken = 6 => "DELEGATION_TOKEN",
        User = 7 => "USER",
    }
}

kafka_enum! {
    /// How a binding's resource name matches: the name itself (or `*`: every name), or every
    /// name starting with it.
    PatternType {
        Literal = 3 => "LITERAL",
        Prefixed = 4 => "PREFIXED",
    }
}

kafka_enum! {
    /// What a binding allows or denies.
    AclOperation {
        All = 2 => "ALL",
        Read = 3 => "READ",
        Write = 4 => "WRITE",
        Create = 5 => "CREATE",
        Delete = 6 => "DELETE",
        Alter = 7 => "ALTER",
        Describe = 8 => "DESCRIBE",
        ClusterAction = 9 => "CLUSTER_ACTION",
        DescribeConfigs = 10 => "DESCRIBE_CONFIGS",
        AlterConfigs = 11 => "ALTER_CONFIGS",
        IdempotentWrite = 12 => "IDEMPOTENT_WRITE",
        CreateTokens = 13 => "CREATE_TOKENS",
        DescribeTokens = 14 => "DESCRIBE_TOKENS",
    }
}

kafka_enum! {
    AclPermission {
        Deny = 2 => "DENY",
        Allow = 3 => "ALLOW",
    }
}

/// Kafka's wire codes of the filters' wildcards.
pub const ANY_CODE: i8 = 1;
/// `PatternType.MATCH`: a filter matching every binding that applies to its resource name
/// (literal equal, literal `*`, or a prefix of the name).
pub const MATCH_CODE: i8 = 2;

/// One ACL: `permission` for `principal` connecting from `host` to perform `operation` on the
/// resources `(resource_type, resource_name, pattern_type)` names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AclBinding {
    pub resource_type: ResourceType,
    pub resource_name: String,
    pub pattern_type: PatternType,
    /// `User:<name>`, or `User:*` for every principal.
    pub principal: String,
    /// An IP address, or `*` for every host.
    pub host: String,
    pub operation: AclOperation,
    pub permission: AclPermission,
}

impl AclBinding {
    /// Does this binding's resource pattern cover the resource `name` of `resource_type`?
    pub fn covers(&self, resource_type: ResourceType, name: &str) -> bool {
        self.resource_type == resource_type
            && match self.pattern_type {
                PatternType::Literal => self.resource_name == name || self.resource_name == WILDCARD,
                PatternType::Prefixed => name.starts_with(&self.resource_name),
            }
    }
}

/// A pattern of resources in a filter: `None` fields match everything (Kafka's ANY).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PatternFilter {
    Any,
    /// Every binding that applies to the filter's name: literal equal, literal `*`, or a prefix.
    Match,
    Exactly(PatternType),
}

/// What DescribeAcls and DeleteAcls select: every field `None` (or [`PatternFilter::Any`])
/// matches any binding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclFilter {
    pub resource_type: Option<ResourceType>,
    pub resource_name: Option<String>,
    pub pattern: PatternFilter,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: Option<AclOperation>,
    pub permission: Option<AclPermission>,
}

impl AclFilter {
    /// Matches every binding.
    pub fn any() -> AclFilter {
        AclFilter {
            resource_type: None,
            resource_name: None,
            pattern: PatternFilter::Any,
            principal: None,
            host: None,
            operation: None,
            permission: None,
        }
    }

    pub fn matches(&self, binding: &AclBinding) -> bool {
        let same = |wanted: &Option<String>, value: &str| wanted.as_deref().is_none_or(|w| w == value);
        if self.resource_type.is_some_and(|t| t != binding.resource_type)
            || !same(&self.principal, &binding.principal)
            || !same(&self.host, &binding.host)
            || self.operation.is_some_and(|o| o != binding.operation)
            || self.permission.is_some_and(|p| p != binding.permission)
        {
            return false;
        }
        match self.pattern {
            PatternFilter::Any => same(&self.resource_name, &binding.resource_name),
            PatternFilter::Exactly(pattern) => {
                pattern == binding.pattern_type && same(&self.resource_name, &binding.resource_name)
            }
            PatternFilter::Match => match &self.resource_name {
                None => true,
                Some(name) => match binding.pattern_type {
                    PatternType::Literal => binding.resource_name == *name || binding.resource_name == WILDCARD,
                    PatternType::Prefixed => name.starts_with(&binding.resource_name),
                },
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(pattern_type: PatternType, name: &str) -> AclBinding {
        AclBinding {
            resource_type: ResourceType::Topic,
            resource_name: name.into(),
            pattern_type,
            principal: "User:alice".into(),
            host: "*".into(),
            operation: AclOperation::Read,
            permission: AclPermission::Allow,
        }
    }

    #[test]
    fn codes_and_names_round_trip() {
        for op in AclOperation::ALL {
            assert_eq!(AclOperation::from_code(op.code()), Some(*op));
            assert_eq!(AclOperation::from_name(&op.name().to_lowercase().replace('_', "-")), Some(*op));
        }
        assert_eq!(ResourceType::from_code(ANY_CODE), None);
        assert_eq!(PatternType::from_code(MATCH_CODE), None);
    }

    #[test]
    fn a_binding_covers_its_literal_name_the_wildcard_covers_all_and_a_prefix_its_names() {
        assert!(binding(PatternType::Literal, "orders").covers(ResourceType::Topic, "orders"));
        assert!(!binding(PatternType::Literal, "orders").covers(ResourceType::Topic, "orders-eu"));
        assert!(!binding(PatternType::Literal, "orders").covers(ResourceType::Group, "orders"));
        assert!(binding(PatternType::Literal, "*").covers(ResourceType::Topic, "anything"));
        assert!(binding(PatternType::Prefixed, "ord").covers(ResourceType::Topic, "orders"));
        assert!(!binding(PatternType::Prefixed, "*").covers(ResourceType::Topic, "orders"), "no wildcard in a prefix");
    }

    #[test]
    fn filters_select_by_field_and_match_selects_what_applies_to_a_name() {
        let literal = binding(PatternType::Literal, "orders");
        let prefixed = binding(PatternType::Prefixed, "ord");
        let wildcard = binding(PatternType::Literal, "*");
        let other = binding(PatternType::Literal, "payments");
        let mut filter = AclFilter::any();
        assert!([&literal, &prefixed, &wildcard, &other].iter().all(|b| filter.matches(b)));
        filter.resource_name = Some("orders".into());
        assert!(filter.matches(&literal) && !filter.matches(&prefixed) && !filter.matches(&wildcard));
        filter.pattern = PatternFilter::Match;
        assert!(filter.matches(&literal) && filter.matches(&prefixed) && filter.matches(&wildcard));
        assert!(!filter.matches(&other));
        filter.pattern = PatternFilter::Exactly(PatternType::Prefixed);
        assert!(!filter.matches(&prefixed), "the prefixed binding is named ord, not orders");
        filter.pattern = PatternFilter::Exactly(PatternType::Literal);
        assert!(filter.matches(&literal) && !filter.matches(&wildcard));
        filter.principal = Some("User:bob".into());
        filter.pattern = PatternFilter::Any;
        assert!(!filter.matches(&literal));
    }
}
