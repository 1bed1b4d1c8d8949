//! Client quotas in Kafka's model (KIP-546's quota APIs, KRaft's `ClientQuotaRecord`): a quota
//! entity names a user, a client id, both, or an IP address, each either by name or as the
//! default for its type, and carries rates by key (`producer_byte_rate`, ...). Quotas are stored
//! in the metadata log and applied like every other record; what the broker makes of them is
//! `weir_broker::quotas`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Bytes per second a producer may send (user and client-id entities).
pub const PRODUCER_BYTE_RATE: &str = "producer_byte_rate";
/// Bytes per second a consumer may fetch (user and client-id entities).
pub const CONSUMER_BYTE_RATE: &str = "consumer_byte_rate";
/// Percentage of one request-handling thread's time (user and client-id entities).
pub const REQUEST_PERCENTAGE: &str = "request_percentage";
/// Partitions created or deleted per second (CreateTopics, CreatePartitions, DeleteTopics;
/// KIP-599).
pub const CONTROLLER_MUTATION_RATE: &str = "controller_mutation_rate";
/// New connections per second from one address (IP entities).
pub const CONNECTION_CREATION_RATE: &str = "connection_creation_rate";

/// The keys a user or client-id entity takes, and whether each must be a whole number.
pub const CLIENT_KEYS: &[(&str, bool)] = &[
    (PRODUCER_BYTE_RATE, true),
    (CONSUMER_BYTE_RATE, true),
    (REQUEST_PERCENTAGE, false),
    (CONTROLLER_MUTATION_RATE, false),
];
/// The keys an IP entity takes, and whether each must be a whole number.
pub const IP_KEYS: &[(&str, bool)] = &[(CONNECTION_CREATION_RATE, true)];

/// The entity types, by Kafka's names.
pub const USER: &str = "user";
pub const CLIENT_ID: &str = "client-id";
pub const IP: &str = "ip";

/// One component of a quota entity: a name, or the default of its type (Kafka's `<default>`,
/// a null name on the wire).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum EntityName {
    Default,
    Named(String),
}

impl EntityName {
    /// From the wire: null is the default.
    pub fn from_wire(name: Option<&str>) -> EntityName {
        match name {
            None => EntityName::Default,
            Some(name) => EntityName::Named(name.to_string()),
        }
    }

    /// To the wire: the default is null.
    pub fn as_wire(&self) -> Option<&str> {
        match self {
            EntityName::Default => None,
            EntityName::Named(name) => Some(name),
        }
    }
}

impl std::fmt::Display for EntityName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EntityName::Default => f.write_str("<default>"),
            EntityName::Named(name) => f.write_str(name),
        }
    }
}

/// What a quota applies to. At least one component is set; `ip` is never combined with the
/// others (the controller checks both before a quota is stored).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct QuotaEntity {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<EntityName>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<EntityName>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<EntityName>,
}

impl QuotaEntity {
    pub fn user_client(user: Option<EntityName>, client_id: Option<EntityName>) -> QuotaEntity {
        QuotaEntity { user, client_id, ip: None }
    }

    /// The components that are set, as (entity type, name), in Kafka's order.
    pub fn components(&self) -> impl Iterator<Item = (&'static str, &EntityName)> {
        [(USER, &self.user), (CLIENT_ID, &self.client_id), (IP, &self.ip)]
            .into_iter()
            .filter_map(|(kind, name)| name.as_ref().map(|name| (kind, name)))
    }

    /// The component of type `kind` (one of [`USER`], [`CLIENT_ID`], [`IP`]).
    pub fn component(&self, kind: &str) -> Option<&EntityName> {
        match kind {
            USER => self.user.as_ref(),
            CLIENT_ID => self.client_id.as_ref(),
            IP => self.ip.as_ref(),
            _ => None,
        }
    }
}

impl std::fmt::Display for QuotaEntity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut first = true;
        for (kind, name) in self.components() {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{kind}={name}")?;
        }
        Ok(())
    }
}

/// The quotas of every entity that has one: by entity, then by key.
pub type ClientQuotas = BTreeMap<QuotaEntity, BTreeMap<String, f64>>;

/// [`ClientQuotas`] as a list of (entity, values) pairs: a JSON object's keys are strings, and an
/// entity is not one.
pub(crate) mod as_pairs {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(quotas: &ClientQuotas, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(quotas.iter())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ClientQuotas, D::Error> {
        let pairs: Vec<(QuotaEntity, BTreeMap<String, f64>)> = Vec::deserialize(deserializer)?;
        Ok(pairs.into_iter().collect())
    }
}

/// How a DescribeClientQuotas filter component matches an entity's component of its type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Match {
    /// This name.
    Exact(String),
    /// The default of the type.
    Default,
    /// Any name or the default (the component is present).
    Specified,
}

/// A DescribeClientQuotas filter, checked (see `weir_controller::quotas::filter`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaFilter {
    /// (entity type, match), each type once.
    pub components: Vec<(&'static str, Match)>,
    /// Only entities with no component besides the filter's.
    pub strict: bool,
}

impl QuotaFilter {
    pub fn matches(&self, entity: &QuotaEntity) -> bool {
        if self.strict && entity.components().count() != self.components.len() {
            return false;
        }
        self.components.iter().all(|(kind, wanted)| match (entity.component(kind), wanted) {
            (None, _) => false,
            (Some(_), Match::Specified) => true,
            (Some(EntityName::Default), Match::Default) => true,
            (Some(EntityName::Named(name)), Match::Exact(exact)) => name == exact,
            _ => false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(name: &str) -> Option<EntityName> {
        Some(EntityName::Named(name.to_string()))
    }

    #[test]
    fn filters_match_as_kafka_describes() {
        let alice = QuotaEntity::user_client(named("alice"), None);
        let alice_app = QuotaEntity::user_client(named("alice"), named("app"));
        let default_user = QuotaEntity::user_client(Some(EntityName::Default), None);
        let exact = QuotaFilter { components: vec![(USER, Match::Exact("alice".into()))], strict: false };
        assert!(exact.matches(&alice) && exact.matches(&alice_app) && !exact.matches(&default_user));
        let strict = QuotaFilter { strict: true, ..exact };
        assert!(strict.matches(&alice) && !strict.matches(&alice_app));
        let default = QuotaFilter { components: vec![(USER, Match::Default)], strict: false };
        assert!(default.matches(&default_user) && !default.matches(&alice));
        let any_client = QuotaFilter { components: vec![(CLIENT_ID, Match::Specified)], strict: false };
        assert!(any_client.matches(&alice_app) && !any_client.matches(&alice));
        let everything = QuotaFilter { components: vec![], strict: false };
        assert!(everything.matches(&alice) && everything.matches(&default_user));
    }

    #[test]
    fn quotas_survive_json_as_pairs() {
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct Holder {
            #[serde(with = "as_pairs")]
            quotas: ClientQuotas,
        }
        let mut quotas = ClientQuotas::new();
        quotas.insert(
            QuotaEntity::user_client(named("alice"), Some(EntityName::Default)),
            BTreeMap::from([(PRODUCER_BYTE_RATE.to_string(), 1024.0)]),
        );
        let holder = Holder { quotas };
        let json = serde_json::to_string(&holder).expect("encodes");
        let back: Holder = serde_json::from_str(&json).expect("decodes");
        assert_eq!(back, holder);
    }
}
