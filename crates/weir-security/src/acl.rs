//! The authorizer: may this principal, from this host, perform this operation on this
//! resource? Kafka's `StandardAuthorizer` semantics over the ACLs of the metadata log
//! ([`weir_metadata::acl`]):
//!
//! 1. A super user (`super.users`) may do anything.
//! 2. The ACLs that apply are those whose resource pattern covers the resource: the literal
//!    name, the literal `*`, or a prefix of the name.
//! 3. If no ACL applies to the resource at all (for any principal), the answer is
//!    `allow.everyone.if.no.acl.found`.
//! 4. A matching DENY wins over any ALLOW.
//! 5. An ALLOW matches the operation itself or ALL; DESCRIBE is also allowed by READ, WRITE,
//!    DELETE and ALTER, and DESCRIBE_CONFIGS by ALTER_CONFIGS (Kafka's implied operations).
//!
//! A principal or host matches when equal, or when the ACL names `User:*` or `*`.
//!
//! The decisions read an [`AclIndex`]: the bindings by resource type, literal name and prefix,
//! so that a request looks at the bindings of its own resource, whatever the number of ACLs.

use std::collections::{BTreeSet, HashMap};

pub use weir_metadata::acl::*;

/// The principal of a client that did not authenticate (Kafka's `User:ANONYMOUS`).
pub const ANONYMOUS: &str = "User:ANONYMOUS";

/// The authorizer's settings (Kafka's names).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthorizerSettings {
    /// `authorizer.class.name` names Kafka's standard authorizer: requests are authorized.
    pub enabled: bool,
    /// `super.users`: principals (`User:name`) allowed everything.
    pub super_users: BTreeSet<String>,
    /// `allow.everyone.if.no.acl.found`.
    pub allow_if_no_acl: bool,
}

/// The class names `authorizer.class.name` accepts: Kafka's KRaft and ZooKeeper-era
/// authorizers, both served by this one.
pub const AUTHORIZER_CLASSES: [&str; 2] =
    ["org.apache.kafka.metadata.authorizer.StandardAuthorizer", "kafka.security.authorizer.AclAuthorizer"];

impl AuthorizerSettings {
    /// From the settings' text: `authorizer.class.name`, `super.users` (`;`-separated, as
    /// Kafka's) and `allow.everyone.if.no.acl.found`. `Err`: the setting at fault, and why.
    pub fn parse(
        class: &str,
        super_users: &str,
        allow_if_no_acl: bool,
    ) -> Result<AuthorizerSettings, (&'static str, String)> {
        let class = class.trim();
        let enabled = match class {
            "" => false,
            c if AUTHORIZER_CLASSES.contains(&c) => true,
            other => {
                return Err((
                    "authorizer.class.name",
                    format!(
                        "{other:?} is not an authorizer Weir has; use {} (Kafka's ACLs) or leave it empty",
                        AUTHORIZER_CLASSES[0]
                    ),
                ))
            }
        };
        let mut users = BTreeSet::new();
        for principal in super_users.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            match principal.split_once(':') {
                Some(("User", name)) if !name.is_empty() => users.insert(principal.to_string()),
                _ => return Err(("super.users", format!("{principal:?} is not a principal of the form User:<name>"))),
            };
        }
        Ok(AuthorizerSettings { enabled, super_users: users, allow_if_no_acl })
    }
}

/// The principal of a client: `User:<name>` once authenticated, else `User:ANONYMOUS`.
pub fn principal(user: Option<&str>) -> String {
    user.map_or_else(|| ANONYMOUS.to_string(), |u| format!("User:{u}"))
}

/// One question to the authorizer.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub principal: &'a str,
    pub host: &'a str,
    pub operation: AclOperation,
    pub resource_type: ResourceType,
    pub resource_name: &'a str,
}

/// The ACLs indexed by the resources they cover. Built once per change of the ACLs; a lookup
/// costs one hash lookup for the literal name, one for `*`, and one per distinct prefix length
/// among the prefixed bindings of the resource type, not one comparison per ACL.
#[derive(Debug, Default)]
pub struct AclIndex {
    types: HashMap<ResourceType, TypeIndex>,
}

#[derive(Debug, Default)]
struct TypeIndex {
    /// Literal bindings by resource name, the wildcard `*` among them.
    literal: HashMap<String, Vec<AclBinding>>,
    /// Prefixed bindings by prefix.
    prefixed: HashMap<String, Vec<AclBinding>>,
    /// The byte lengths of the prefixes in `prefixed`, ascending, once each.
    prefix_lengths: Vec<usize>,
    /// Every binding of the type (authorization by resource type reads them all).
    all: Vec<AclBinding>,
}

impl AclIndex {
    pub fn new<'a>(acls: impl IntoIterator<Item = &'a AclBinding>) -> AclIndex {
        let mut types: HashMap<ResourceType, TypeIndex> = HashMap::new();
        for binding in acls {
            let index = types.entry(binding.resource_type).or_default();
            let by_name = match binding.pattern_type {
                PatternType::Literal => &mut index.literal,
                PatternType::Prefixed => {
                    index.prefix_lengths.push(binding.resource_name.len());
                    &mut index.prefixed
                }
            };
            by_name.entry(binding.resource_name.clone()).or_default().push(binding.clone());
            index.all.push(binding.clone());
        }
        for index in types.values_mut() {
            index.prefix_lengths.sort_unstable();
            index.prefix_lengths.dedup();
        }
        AclIndex { types }
    }

    /// The bindings whose pattern covers `name` of `resource_type` (as
    /// [`AclBinding::covers`] says), each once.
    pub fn covering<'a>(&'a self, resource_type: ResourceType, name: &'a str) -> impl Iterator<Item = &'a AclBinding> {
        let index = self.types.get(&resource_type);
        let literal = index.into_iter().flat_map(move |index| {
            let exact = index.literal.get(name).into_iter().flatten();
            let wildcard = (name != WILDCARD).then(|| index.literal.get(WILDCARD)).flatten().into_iter().flatten();
            exact.chain(wildcard)
        });
        let prefixed = index.into_iter().flat_map(move |index| {
            index
                .prefix_lengths
                .iter()
                .filter_map(move |len| name.get(..*len))
                .filter_map(move |prefix| index.prefixed.get(prefix))
                .flatten()
        });
        literal.chain(prefixed)
    }

    /// Every binding of `resource_type`.
    fn of_type(&self, resource_type: ResourceType) -> &[AclBinding] {
        self.types.get(&resource_type).map_or(&[], |index| &index.all)
    }
}

/// Does `settings` with `acls` allow `request`? (Authorization off allows everything.)
pub fn authorize(settings: &AuthorizerSettings, acls: &AclIndex, request: &Request<'_>) -> bool {
    if !settings.enabled || settings.super_users.contains(request.principal) {
        return true;
    }
    let mut applies = acls.covering(request.resource_type, request.resource_name).peekable();
    if applies.peek().is_none() {
        return settings.allow_if_no_acl;
    }
    let mut allowed = false;
    for binding in applies {
        if !(binding.principal == request.principal || binding.principal == ANY_PRINCIPAL)
            || !(binding.host == request.host || binding.host == WILDCARD)
        {
            continue;
        }
        match binding.permission {
            AclPermission::Deny if binding.operation == AclOperation::All || binding.operation == request.operation => {
                return false;
            }
            AclPermission::Allow if implies(binding.operation, request.operation) => allowed = true,
            _ => {}
        }
    }
    allowed
}

/// Does an ALLOW of `granted` allow `wanted`?
fn implies(granted: AclOperation, wanted: AclOperation) -> bool {
    use AclOperation::*;
    granted == All
        || granted == wanted
        || (wanted == Describe && matches!(granted, Read | Write | Delete | Alter))
        || (wanted == DescribeConfigs && granted == AlterConfigs)
}

/// Is `principal` allowed `operation` on some resource of `resource_type` that a binding
/// names (Kafka's `authorizeByResourceType`, for IDEMPOTENT_WRITE implied by WRITE on any
/// topic)? Denials on literal names do not count; a DENY on `*` does.
pub fn authorize_any(
    settings: &AuthorizerSettings,
    acls: &AclIndex,
    principal: &str,
    host: &str,
    operation: AclOperation,
    resource_type: ResourceType,
) -> bool {
    if !settings.enabled || settings.super_users.contains(principal) {
        return true;
    }
    let of_type = acls.of_type(resource_type);
    let matching = |b: &&AclBinding| {
        (b.principal == principal || b.principal == ANY_PRINCIPAL) && (b.host == host || b.host == WILDCARD)
    };
    let denied_everywhere = of_type.iter().filter(matching).any(|b| {
        b.permission == AclPermission::Deny
            && b.resource_name == WILDCARD
            && b.pattern_type == PatternType::Literal
            && (b.operation == AclOperation::All || b.operation == operation)
    });
    if denied_everywhere {
        return false;
    }
    of_type.iter().filter(matching).any(|b| b.permission == AclPermission::Allow && implies(b.operation, operation))
        || (settings.allow_if_no_acl && of_type.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(
        name: &str,
        pattern: PatternType,
        principal: &str,
        operation: AclOperation,
        permission: AclPermission,
    ) -> AclBinding {
        AclBinding {
            resource_type: ResourceType::Topic,
            resource_name: name.into(),
            pattern_type: pattern,
            principal: principal.into(),
            host: "*".into(),
            operation,
            permission,
        }
    }

    fn on() -> AuthorizerSettings {
        AuthorizerSettings::parse(AUTHORIZER_CLASSES[0], "User:admin", false).expect("valid")
    }

    fn may(
        settings: &AuthorizerSettings,
        acls: &BTreeSet<AclBinding>,
        who: &str,
        op: AclOperation,
        topic: &str,
    ) -> bool {
        authorize(
            settings,
            &AclIndex::new(acls),
            &Request {
                principal: who,
                host: "10.0.0.1",
                operation: op,
                resource_type: ResourceType::Topic,
                resource_name: topic,
            },
        )
    }

    #[test]
    fn without_acls_the_default_decides_and_super_users_may_do_anything() {
        let acls = BTreeSet::new();
        assert!(!may(&on(), &acls, "User:alice", AclOperation::Read, "orders"));
        assert!(may(&on(), &acls, "User:admin", AclOperation::Read, "orders"));
        let open = AuthorizerSettings { allow_if_no_acl: true, ..on() };
        assert!(may(&open, &acls, "User:alice", AclOperation::Read, "orders"));
        assert!(may(&AuthorizerSettings::default(), &acls, "User:alice", AclOperation::Delete, "orders"), "off");
    }

    #[test]
    fn allow_matches_by_name_wildcard_and_prefix_and_implies_describe() {
        use AclOperation::*;
        let acls: BTreeSet<_> = [
            acl("orders", PatternType::Literal, "User:alice", Write, AclPermission::Allow),
            acl("pay", PatternType::Prefixed, "User:bob", Read, AclPermission::Allow),
            acl("*", PatternType::Literal, "User:*", AlterConfigs, AclPermission::Allow),
        ]
        .into();
        assert!(may(&on(), &acls, "User:alice", Write, "orders"));
        assert!(may(&on(), &acls, "User:alice", Describe, "orders"), "WRITE implies DESCRIBE");
        assert!(!may(&on(), &acls, "User:alice", Read, "orders"));
        assert!(may(&on(), &acls, "User:bob", Read, "payments"));
        assert!(!may(&on(), &acls, "User:bob", Read, "orders"));
        assert!(may(&on(), &acls, "User:carol", DescribeConfigs, "anything"), "ALTER_CONFIGS implies DESCRIBE_CONFIGS");
        let open = AuthorizerSettings { allow_if_no_acl: true, ..on() };
        assert!(!may(&open, &acls, "User:carol", Read, "orders"), "ACLs apply to orders: the default does not");
    }

    #[test]
    fn deny_wins_and_host_must_match() {
        use AclOperation::*;
        let mut acls: BTreeSet<_> = [
            acl("orders", PatternType::Literal, "User:*", All, AclPermission::Allow),
            acl("ord", PatternType::Prefixed, "User:mallory", Write, AclPermission::Deny),
        ]
        .into();
        assert!(may(&on(), &acls, "User:mallory", Read, "orders"));
        assert!(!may(&on(), &acls, "User:mallory", Write, "orders"));
        let mut from_elsewhere = acl("orders", PatternType::Literal, "User:eve", Read, AclPermission::Allow);
        from_elsewhere.host = "10.9.9.9".into();
        acls.insert(from_elsewhere);
        acls.retain(|b| b.operation != All);
        assert!(!may(&on(), &acls, "User:eve", Read, "orders"), "the ACL is for another host");
    }

    #[test]
    fn idempotent_write_is_implied_by_write_on_some_topic() {
        let acls: BTreeSet<_> =
            [acl("orders", PatternType::Literal, "User:alice", AclOperation::Write, AclPermission::Allow)].into();
        let index = AclIndex::new(&acls);
        let any = |who| authorize_any(&on(), &index, who, "10.0.0.1", AclOperation::Write, ResourceType::Topic);
        assert!(any("User:alice"));
        assert!(!any("User:bob"));
    }

    /// The index finds exactly the bindings a scan with `covers` finds, for literal, wildcard,
    /// prefixed (the empty prefix too) and multi-byte names.
    #[test]
    fn the_index_covers_what_a_scan_covers() {
        let names = ["", "*", "a", "ab", "abc", "b", "é", "éa", "a*"];
        let mut acls = BTreeSet::new();
        for (i, name) in names.iter().enumerate() {
            for pattern in [PatternType::Literal, PatternType::Prefixed] {
                let mut binding = acl(name, pattern, "User:x", AclOperation::Read, AclPermission::Allow);
                if i % 2 == 0 {
                    binding.resource_type = ResourceType::Group;
                }
                acls.insert(binding);
            }
        }
        let index = AclIndex::new(&acls);
        for resource_type in [ResourceType::Topic, ResourceType::Group, ResourceType::Cluster] {
            for name in names.iter().chain(&["abcd", "ba", "éé", "x"]) {
                let scanned: BTreeSet<&AclBinding> = acls.iter().filter(|b| b.covers(resource_type, name)).collect();
                let found: Vec<&AclBinding> = index.covering(resource_type, name).collect();
                assert_eq!(found.len(), scanned.len(), "{resource_type} {name:?}: each once");
                assert_eq!(found.into_iter().collect::<BTreeSet<_>>(), scanned, "{resource_type} {name:?}");
            }
        }
    }

    #[test]
    fn settings_refuse_unknown_authorizers_and_malformed_super_users() {
        assert!(AuthorizerSettings::parse("com.example.Custom", "", false).is_err());
        assert!(AuthorizerSettings::parse("", "admin", false).is_err());
        let settings = AuthorizerSettings::parse(AUTHORIZER_CLASSES[1], "User:a; User:b", true).expect("valid");
        assert!(settings.enabled && settings.super_users.len() == 2 && settings.allow_if_no_acl);
    }
}
