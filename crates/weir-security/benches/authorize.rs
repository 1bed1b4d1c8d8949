//! Criterion benchmarks of the authorizer's decision with many ACLs: the index
//! (`acl::authorize`) against a scan of every binding with `AclBinding::covers`, which is what
//! the decision did before the index, side by side in one run.
//!
//! `cargo bench -p weir-security` (add `-- --quick` for a run of seconds, as CI does).

use std::collections::BTreeSet;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use weir_security::acl::{
    self, AclBinding, AclIndex, AclOperation, AclPermission, AuthorizerSettings, PatternType, Request, ResourceType,
    AUTHORIZER_CLASSES,
};

/// 10,000 bindings: one user per topic (literal WRITE and READ), a prefixed READ per team, and a
/// few wildcards, as a broker with a few thousand topics and teams has.
fn bindings() -> BTreeSet<AclBinding> {
    let binding = |name: String, pattern, principal: String, operation| AclBinding {
        resource_type: ResourceType::Topic,
        resource_name: name,
        pattern_type: pattern,
        principal,
        host: "*".into(),
        operation,
        permission: AclPermission::Allow,
    };
    let mut acls = BTreeSet::new();
    for i in 0..4_900 {
        acls.insert(binding(
            format!("team{}.topic{i}", i % 100),
            PatternType::Literal,
            format!("User:app{i}"),
            AclOperation::Write,
        ));
        acls.insert(binding(
            format!("team{}.topic{i}", i % 100),
            PatternType::Literal,
            format!("User:reader{i}"),
            AclOperation::Read,
        ));
    }
    for team in 0..100 {
        acls.insert(binding(
            format!("team{team}."),
            PatternType::Prefixed,
            format!("User:team{team}"),
            AclOperation::Read,
        ));
    }
    acls.insert(binding("*".into(), PatternType::Literal, "User:monitor".into(), AclOperation::Describe));
    acls
}

/// The decision as a scan of every binding (the authorizer before the index).
fn scan(acls: &BTreeSet<AclBinding>, request: &Request<'_>) -> bool {
    let mut allowed = false;
    let mut applies = false;
    for binding in acls.iter().filter(|b| b.covers(request.resource_type, request.resource_name)) {
        applies = true;
        if binding.principal == request.principal && binding.operation == request.operation {
            allowed = true;
        }
    }
    applies && allowed
}

fn authorize(c: &mut Criterion) {
    let acls = bindings();
    let index = AclIndex::new(&acls);
    let settings = AuthorizerSettings::parse(AUTHORIZER_CLASSES[0], "", false).expect("valid settings");
    let request = Request {
        principal: "User:app4242",
        host: "10.0.0.7",
        operation: AclOperation::Write,
        resource_type: ResourceType::Topic,
        resource_name: "team42.topic4242",
    };
    assert!(acl::authorize(&settings, &index, &request) && scan(&acls, &request));
    let mut group = c.benchmark_group("authorize 10k ACLs");
    group.bench_function("index", |b| b.iter(|| acl::authorize(&settings, black_box(&index), black_box(&request))));
    group.bench_function("scan", |b| b.iter(|| scan(black_box(&acls), black_box(&request))));
    group.finish();
    c.bench_function("index 10k ACLs (build)", |b| b.iter(|| AclIndex::new(black_box(&acls))));
}

criterion_group!(benches, authorize);
criterion_main!(benches);
