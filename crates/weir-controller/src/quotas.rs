//! Client quotas (KIP-546's AlterClientQuotas and DescribeClientQuotas): which changes may be
//! committed, and what a describe's filter selects. The checks are Kafka's
//! (`ClientQuotaControlManager`), with its messages, so tools print what they print for Kafka.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use weir_error::{BrokerError, ErrorKind};
use weir_metadata::quota::{EntityName, Match, QuotaEntity, QuotaFilter, CLIENT_ID, CLIENT_KEYS, IP, IP_KEYS, USER};
use weir_metadata::{MetadataRecord, MetadataState};

/// Longest entity name (Kafka sets none; a user or client id is logged and described).
pub const MAX_NAME: usize = 1024;

/// One entry of AlterClientQuotas, as it came: the entity's components (type, name; `None`
/// the default) and the changes of its keys (`None` removes the key).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuotaAlteration {
    pub entity: Vec<(String, Option<String>)>,
    pub ops: Vec<(String, Option<f64>)>,
}

/// The records of `alterations` and each one's outcome with the entity it named, in order. A
/// bad entry fails alone, with none of its changes (as Kafka does). With `validate_only` the
/// outcomes are computed and no record is returned.
pub fn decide_alter(
    state: &MetadataState,
    alterations: &[QuotaAlteration],
    validate_only: bool,
) -> (Vec<MetadataRecord>, Vec<Result<(), BrokerError>>) {
    let mut records = Vec::new();
    let mut outcomes = Vec::with_capacity(alterations.len());
    // What the earlier entries of this request set, so a later one compares against it.
    let mut pending: BTreeMap<QuotaEntity, BTreeMap<String, Option<f64>>> = BTreeMap::new();
    for alteration in alterations {
        let outcome = entity(&alteration.entity).and_then(|entity| {
            let keys = keys_for(&entity);
            let mut changes = Vec::new();
            for (key, value) in &alteration.ops {
                if let Some(value) = value {
                    check_value(keys, key, *value)?;
                }
                changes.push((key.clone(), *value));
            }
            let current = state.client_quotas.get(&entity);
            for (key, value) in changes {
                let now = match pending.get(&entity).and_then(|p| p.get(&key)) {
                    Some(set) => *set,
                    None => current.and_then(|values| values.get(&key)).copied(),
                };
                if now != value {
                    pending.entry(entity.clone()).or_default().insert(key.clone(), value);
                    records.push(MetadataRecord::SetClientQuota { entity: entity.clone(), key, value });
                }
            }
            Ok(())
        });
        outcomes.push(outcome);
    }
    if validate_only {
        records.clear();
    }
    (records, outcomes)
}

/// The entity an alteration names, checked: known types, each once, names not empty, `ip`
/// alone and a valid address.
pub fn entity(components: &[(String, Option<String>)]) -> Result<QuotaEntity, BrokerError> {
    let invalid = |why: String| BrokerError::new(ErrorKind::InvalidRequest, why);
    if components.is_empty() {
        return Err(invalid("Invalid empty client quota entity".into()));
    }
    let mut entity = QuotaEntity::default();
    for (kind, name) in components {
        let slot = match kind.as_str() {
            USER => &mut entity.user,
            CLIENT_ID => &mut entity.client_id,
            IP => &mut entity.ip,
            other => return Err(invalid(format!("Unhandled client quota entity type: {other}"))),
        };
        if slot.is_some() {
            return Err(invalid(format!("Invalid client quota entity, duplicate entity entry {kind}")));
        }
        if let Some(name) = name {
            if name.is_empty() {
                return Err(invalid(format!("Empty {kind} not supported")));
            }
            if name.len() > MAX_NAME || name.chars().any(char::is_control) {
                return Err(invalid(format!(
                    "a {kind} name has at most {MAX_NAME} characters, none of them control characters"
                )));
            }
        }
        *slot = Some(EntityName::from_wire(name.as_deref()));
    }
    if let Some(ip) = &entity.ip {
        if entity.user.is_some() || entity.client_id.is_some() {
            return Err(invalid(
                "Invalid quota entity combination, IP entity should not be combined with User or ClientId".into(),
            ));
        }
        if let EntityName::Named(address) = ip {
            if address.parse::<std::net::IpAddr>().is_err() {
                return Err(invalid(format!("{address} is not a valid IP or resolvable host.")));
            }
        }
    }
    Ok(entity)
}

fn keys_for(entity: &QuotaEntity) -> &'static [(&'static str, bool)] {
    if entity.ip.is_some() {
        IP_KEYS
    } else {
        CLIENT_KEYS
    }
}

fn check_value(keys: &[(&str, bool)], key: &str, value: f64) -> Result<(), BrokerError> {
    let invalid = |why: String| Err(BrokerError::new(ErrorKind::InvalidRequest, why));
    let Some((_, integral)) = keys.iter().find(|(k, _)| *k == key) else {
        return invalid(format!("Invalid configuration key {key}"));
    };
    if value.is_nan() || value <= 0.0 {
        return invalid(format!("Quota {key} must be greater than 0"));
    }
    if *integral {
        if value > i64::MAX as f64 || value.is_infinite() {
            return invalid(format!("Proposed value for {key} is too large for a LONG."));
        }
        if (value % 1.0).abs() > 1e-6 {
            return invalid(format!("{key} cannot be a fractional value."));
        }
    } else if value.is_infinite() {
        return invalid(format!("Proposed value for {key} is not a finite number."));
    }
    Ok(())
}

/// A DescribeClientQuotas filter, checked as Kafka checks it: each component of a known type
/// (`Err(None)` for an unknown one, which Kafka answers UNSUPPORTED_VERSION), once, with a name
/// exactly when it matches by name, and `ip` never beside the others.
pub fn filter(components: &[(String, i8, Option<String>)], strict: bool) -> Result<QuotaFilter, Option<BrokerError>> {
    let invalid = |why: String| Some(BrokerError::new(ErrorKind::InvalidRequest, why));
    let mut checked: Vec<(&'static str, Match)> = Vec::new();
    for (kind, match_type, name) in components {
        if kind.is_empty() {
            return Err(invalid("Invalid empty entity type.".into()));
        }
        let kind = match kind.as_str() {
            USER => USER,
            CLIENT_ID => CLIENT_ID,
            IP => IP,
            _ => return Err(None),
        };
        if checked.iter().any(|(k, _)| *k == kind) {
            return Err(invalid(format!("Entity type {kind} cannot appear more than once in the filter.")));
        }
        let matching = match (match_type, name) {
            (0, Some(name)) => Match::Exact(name.clone()),
            (0, None) => {
                return Err(invalid("Request specified MATCH_TYPE_EXACT, but set match string to null.".into()))
            }
            (1, None) => Match::Default,
            (1, Some(_)) => {
                return Err(invalid("Request specified MATCH_TYPE_DEFAULT, but also specified a match string.".into()))
            }
            (2, None) => Match::Specified,
            (2, Some(_)) => {
                return Err(invalid(
                    "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string.".into(),
                ))
            }
            (other, _) => return Err(invalid(format!("Unknown match type {other}"))),
        };
        checked.push((kind, matching));
    }
    let has = |wanted: &str| checked.iter().any(|(k, _)| *k == wanted);
    if has(IP) && (has(USER) || has(CLIENT_ID)) {
        return Err(invalid(
            "Invalid entity filter component combination. IP filter component should not be used with user or clientId filter component.".into(),
        ));
    }
    Ok(QuotaFilter { components: checked, strict })
}

/// The quotas `filter` selects, by entity.
pub fn describe<'s>(
    state: &'s MetadataState,
    filter: &QuotaFilter,
) -> impl Iterator<Item = (&'s QuotaEntity, &'s BTreeMap<String, f64>)> {
    let filter = filter.clone();
    state.client_quotas.iter().filter(move |(entity, _)| filter.matches(entity))
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_metadata::quota::{CONNECTION_CREATION_RATE, PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE};

    fn alteration(entity: &[(&str, Option<&str>)], ops: &[(&str, Option<f64>)]) -> QuotaAlteration {
        QuotaAlteration {
            entity: entity.iter().map(|(k, n)| (k.to_string(), n.map(str::to_string))).collect(),
            ops: ops.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        }
    }

    fn apply(state: &mut MetadataState, records: Vec<MetadataRecord>) {
        for (i, record) in records.iter().enumerate() {
            state.apply(i as i64, record);
        }
    }

    fn error(outcome: &Result<(), BrokerError>) -> String {
        outcome.as_ref().err().map(|e| e.to_string()).unwrap_or_default()
    }

    #[test]
    fn quotas_are_set_changed_and_removed() {
        let mut state = MetadataState::default();
        let set = [alteration(&[(USER, Some("alice")), (CLIENT_ID, None)], &[(PRODUCER_BYTE_RATE, Some(1024.0))])];
        let (records, outcomes) = decide_alter(&state, &set, false);
        assert!(outcomes[0].is_ok());
        apply(&mut state, records);
        let entity = QuotaEntity::user_client(Some(EntityName::Named("alice".into())), Some(EntityName::Default));
        assert_eq!(state.client_quotas[&entity][PRODUCER_BYTE_RATE], 1024.0);
        // The same value again: nothing to record.
        assert!(decide_alter(&state, &set, false).0.is_empty());
        let remove = [alteration(&[(USER, Some("alice")), (CLIENT_ID, None)], &[(PRODUCER_BYTE_RATE, None)])];
        let (records, _) = decide_alter(&state, &remove, false);
        apply(&mut state, records);
        assert!(state.client_quotas.is_empty());
        // Removing what is not there: fine, and nothing to record.
        let (records, outcomes) = decide_alter(&state, &remove, false);
        assert!(records.is_empty() && outcomes[0].is_ok());
    }

    #[test]
    fn validate_only_commits_nothing() {
        let set = [alteration(&[(CLIENT_ID, Some("app"))], &[(REQUEST_PERCENTAGE, Some(12.5))])];
        let (records, outcomes) = decide_alter(&MetadataState::default(), &set, true);
        assert!(records.is_empty() && outcomes[0].is_ok());
    }

    #[test]
    fn bad_entries_fail_alone_with_kafkas_messages() {
        let entries = [
            alteration(&[], &[(PRODUCER_BYTE_RATE, Some(1.0))]),
            alteration(&[(USER, Some(""))], &[(PRODUCER_BYTE_RATE, Some(1.0))]),
            alteration(&[(USER, Some("a")), (IP, Some("10.0.0.1"))], &[(PRODUCER_BYTE_RATE, Some(1.0))]),
            alteration(&[(IP, Some("not an address"))], &[(CONNECTION_CREATION_RATE, Some(1.0))]),
            alteration(&[(USER, Some("a"))], &[("bogus", Some(1.0))]),
            alteration(&[(USER, Some("a"))], &[(PRODUCER_BYTE_RATE, Some(0.0))]),
            alteration(&[(USER, Some("a"))], &[(PRODUCER_BYTE_RATE, Some(1.5))]),
            alteration(&[(IP, Some("10.0.0.1"))], &[(PRODUCER_BYTE_RATE, Some(1.0))]),
            alteration(&[("group", Some("g"))], &[(PRODUCER_BYTE_RATE, Some(1.0))]),
            alteration(&[(USER, Some("a")), (USER, Some("b"))], &[(PRODUCER_BYTE_RATE, Some(1.0))]),
            alteration(&[(USER, Some("ok"))], &[(REQUEST_PERCENTAGE, Some(0.5))]),
        ];
        let (records, outcomes) = decide_alter(&MetadataState::default(), &entries, false);
        let messages: Vec<String> = outcomes.iter().map(error).collect();
        assert!(messages[0].contains("Invalid empty client quota entity"), "{messages:?}");
        assert!(messages[1].contains("Empty user not supported"));
        assert!(messages[2].contains("IP entity should not be combined"));
        assert!(messages[3].contains("is not a valid IP"));
        assert!(messages[4].contains("Invalid configuration key bogus"));
        assert!(messages[5].contains("must be greater than 0"));
        assert!(messages[6].contains("cannot be a fractional value"));
        assert!(messages[7].contains("Invalid configuration key producer_byte_rate"));
        assert!(messages[8].contains("Unhandled client quota entity type: group"));
        assert!(messages[9].contains("duplicate entity entry"));
        assert!(outcomes[10].is_ok());
        assert_eq!(records.len(), 1, "only the good entry is recorded");
        assert!(outcomes[..10].iter().all(|o| o.as_ref().is_err_and(|e| e.kind == ErrorKind::InvalidRequest)));
    }

    #[test]
    fn filters_are_checked_as_kafka_checks_them() {
        let component = |kind: &str, m: i8, name: Option<&str>| (kind.to_string(), m, name.map(str::to_string));
        assert!(filter(&[component(USER, 0, Some("a")), component(CLIENT_ID, 2, None)], true).is_ok());
        assert!(matches!(filter(&[component("group", 0, Some("a"))], false), Err(None)));
        let fails = |components: &[(String, i8, Option<String>)]| filter(components, false).is_err_and(|e| e.is_some());
        assert!(fails(&[component(USER, 0, None)]));
        assert!(fails(&[component(USER, 1, Some("a"))]));
        assert!(fails(&[component(USER, 2, Some("a"))]));
        assert!(fails(&[component(USER, 7, None)]));
        assert!(fails(&[component(USER, 1, None), component(USER, 2, None)]));
        assert!(fails(&[component(IP, 2, None), component(USER, 2, None)]));
        assert!(fails(&[component("", 2, None)]));
    }
}
