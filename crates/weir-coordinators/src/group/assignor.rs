//! Server-side assignors of the consumer group protocol (KIP-848): `uniform` and `range`.
//!
//! Both are pure functions from the group's members (subscriptions, racks, current target
//! assignment) and the subscribed topics (partition counts, replica racks) to a new target
//! assignment. Both are sticky: a member keeps the partitions it has as long as it stays
//! subscribed and within its fair share, so a rebalance moves as few partitions as it can.
//!
//! Guarantees (checked by the property tests below):
//! - every partition of a topic some member subscribes to is assigned to exactly one member
//!   subscribed to it, and no member gets a partition of a topic it does not subscribe to;
//! - `uniform`, when every member subscribes to the same topics, gives each member within one
//!   partition of every other;
//! - `range` gives, per topic, each subscribed member ⌊P/N⌋ or ⌈P/N⌉ partitions of it.

use std::collections::{BTreeMap, BTreeSet};

use uuid::Uuid;

/// A member's partitions, by topic id.
pub(crate) type Assignment = BTreeMap<Uuid, BTreeSet<i32>>;

pub(crate) const UNIFORM: &str = "uniform";
pub(crate) const RANGE: &str = "range";

/// One member as the assignor sees it.
#[derive(Debug, Clone, Default)]
pub(crate) struct MemberSpec {
    pub(crate) subscribed: BTreeSet<Uuid>,
    pub(crate) rack: Option<String>,
    /// Its partitions in the current target assignment (what stickiness keeps).
    pub(crate) current: Assignment,
}

/// One subscribed topic.
#[derive(Debug, Clone, Default)]
pub(crate) struct TopicSpec {
    pub(crate) partitions: i32,
    /// The racks of each partition's replicas (index = partition); empty when unknown.
    pub(crate) racks: Vec<BTreeSet<String>>,
}

impl TopicSpec {
    fn on_rack(&self, partition: i32, rack: Option<&str>) -> bool {
        match (rack, usize::try_from(partition).ok().and_then(|p| self.racks.get(p))) {
            (Some(rack), Some(racks)) => racks.contains(rack),
            _ => false,
        }
    }
}

/// Runs the assignor named `name` (one of [`UNIFORM`], [`RANGE`]); `None` for an unknown name.
pub(crate) fn assign(
    name: &str,
    members: &BTreeMap<String, MemberSpec>,
    topics: &BTreeMap<Uuid, TopicSpec>,
) -> Option<BTreeMap<String, Assignment>> {
    match name {
        UNIFORM => Some(uniform(members, topics)),
        RANGE => Some(range(members, topics)),
        _ => None,
    }
}

fn empty_result(members: &BTreeMap<String, MemberSpec>) -> BTreeMap<String, Assignment> {
    members.keys().map(|id| (id.clone(), Assignment::new())).collect()
}

fn count(assignment: &Assignment) -> usize {
    assignment.values().map(BTreeSet::len).sum()
}

/// Uniform: spreads all subscribed partitions as evenly as possible over the members.
///
/// 1. Each member keeps the current partitions it is still subscribed to (but, when racks are
///    known, not a partition with no replica on its rack that another subscriber's rack has),
///    up to its quota:
///    ⌊T/N⌋ each, and ⌊T/N⌋ + 1 for the first T mod N members that have that many (T = the
///    partitions its subscribed topics hold between all members subscribed to them, so for
///    equal subscriptions this is the exact balanced share).
/// 2. Every partition left goes to the eligible member with the fewest partitions, preferring
///    one on a rack holding a replica of it, then by member id.
/// 3. With different subscriptions step 2 can leave members further apart than one: partitions
///    move from the fullest member to an eligible emptier one while that narrows the gap.
pub(crate) fn uniform(
    members: &BTreeMap<String, MemberSpec>,
    topics: &BTreeMap<Uuid, TopicSpec>,
) -> BTreeMap<String, Assignment> {
    let mut result = empty_result(members);
    if members.is_empty() {
        return result;
    }
    // Every partition of a topic somebody subscribes to, with the members that may have it.
    let mut eligible: BTreeMap<(Uuid, i32), Vec<&String>> = BTreeMap::new();
    for (topic, spec) in topics {
        let subscribers: Vec<&String> =
            members.iter().filter(|(_, m)| m.subscribed.contains(topic)).map(|(id, _)| id).collect();
        if subscribers.is_empty() {
            continue;
        }
        for p in 0..spec.partitions {
            eligible.insert((*topic, p), subscribers.clone());
        }
    }
    let total = eligible.len();
    let n = members.len();
    let floor = total / n;
    let mut extras = total % n;
    let mut taken: BTreeSet<(Uuid, i32)> = BTreeSet::new();
    // Step 1: stickiness within the quota; the first pass keeps ⌊T/N⌋, the second hands the
    // T mod N places for one more to members that held one more.
    let mut kept: BTreeMap<&String, Vec<(Uuid, i32)>> = BTreeMap::new();
    for (id, member) in members {
        let mut own: Vec<(Uuid, i32)> = Vec::new();
        for (topic, partitions) in &member.current {
            for p in partitions {
                let key = (*topic, *p);
                let Some(subscribers) = eligible.get(&key) else { continue };
                if !subscribers.contains(&id) || taken.contains(&key) {
                    continue;
                }
                // Rack-aware: a partition read across racks goes to a subscriber on its rack.
                let spec = &topics[topic];
                let elsewhere = member.rack.is_some()
                    && !spec.on_rack(*p, member.rack.as_deref())
                    && subscribers.iter().any(|other| spec.on_rack(*p, members[other.as_str()].rack.as_deref()));
                if !elsewhere {
                    own.push(key);
                }
            }
        }
        let keep = own.len().min(floor);
        for key in own.drain(..keep) {
            taken.insert(key);
            result.entry(id.clone()).or_default().entry(key.0).or_default().insert(key.1);
        }
        kept.insert(id, own);
    }
    for (id, rest) in kept {
        if extras == 0 {
            break;
        }
        if let Some(key) = rest.into_iter().find(|k| !taken.contains(k)) {
            taken.insert(key);
            result.entry(id.clone()).or_default().entry(key.0).or_default().insert(key.1);
            extras -= 1;
        }
    }
    // Step 2: the rest to the emptiest eligible member, rack-local first.
    let mut counts: BTreeMap<String, usize> = result.iter().map(|(id, a)| (id.clone(), count(a))).collect();
    for (key, subscribers) in &eligible {
        if taken.contains(key) {
            continue;
        }
        let spec = &topics[&key.0];
        let best = subscribers.iter().min_by_key(|id| {
            let rack = members[id.as_str()].rack.as_deref();
            (counts[id.as_str()], !spec.on_rack(key.1, rack), **id)
        });
        if let Some(id) = best {
            result.entry((*id).clone()).or_default().entry(key.0).or_default().insert(key.1);
            *counts.entry((*id).clone()).or_default() += 1;
        }
    }
    // Step 3: narrow gaps left by different subscriptions. Each move lowers the sum of squared
    // counts, so this ends; the bound is a second guard.
    for _ in 0..total.saturating_mul(2) {
        let mut moved = false;
        let mut order: Vec<(String, usize)> = counts.iter().map(|(id, c)| (id.clone(), *c)).collect();
        order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        'outer: for (from, from_count) in &order {
            let owned: Vec<(Uuid, i32)> =
                result[from].iter().flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p))).collect();
            for key in owned.iter().rev() {
                let Some(to) = eligible[key]
                    .iter()
                    .filter(|id| counts[id.as_str()] + 1 < *from_count)
                    .min_by_key(|id| (counts[id.as_str()], **id))
                else {
                    continue;
                };
                let to = (*to).clone();
                if let Some(ps) = result.get_mut(from).and_then(|a| a.get_mut(&key.0)) {
                    ps.remove(&key.1);
                    if ps.is_empty() {
                        result.get_mut(from).map(|a| a.remove(&key.0));
                    }
                }
                result.entry(to.clone()).or_default().entry(key.0).or_default().insert(key.1);
                *counts.entry(from.clone()).or_default() -= 1;
                *counts.entry(to).or_default() += 1;
                moved = true;
                break 'outer;
            }
        }
        if !moved {
            break;
        }
    }
    result
}

/// Range: per topic, its subscribers (by member id) get ⌊P/N⌋ partitions each and the first
/// P mod N one more; a member keeps the partitions it has within that quota, and the rest are
/// handed out in partition order to members below their quota, in member order. Members with
/// the same subscriptions get the same partition numbers of co-partitioned topics as long as
/// nothing is kept from an earlier, different assignment.
///
/// Rack-aware when racks are known (as Kafka's RangeAssignor is since KIP-881): a member does
/// not keep a partition with no replica on its rack that another subscriber's rack has, and
/// before the partition-order pass each member below its quota takes free partitions with a
/// replica on its own rack; what is left goes back to its holder if it has room. The quotas
/// are the same, so racks never unbalance the counts.
pub(crate) fn range(
    members: &BTreeMap<String, MemberSpec>,
    topics: &BTreeMap<Uuid, TopicSpec>,
) -> BTreeMap<String, Assignment> {
    let mut result = empty_result(members);
    for (topic, spec) in topics {
        let subscribers: Vec<&String> =
            members.iter().filter(|(_, m)| m.subscribed.contains(topic)).map(|(id, _)| id).collect();
        if subscribers.is_empty() || spec.partitions <= 0 {
            continue;
        }
        let partitions = usize::try_from(spec.partitions).unwrap_or(0);
        let n = subscribers.len();
        let quota = |i: usize| partitions / n + usize::from(i < partitions % n);
        let rack_of = |id: &str| members[id].rack.as_deref();
        // Another subscriber than `i` sits on a rack holding a replica of `p`.
        let local_elsewhere =
            |i: usize, p: i32| subscribers.iter().enumerate().any(|(j, id)| j != i && spec.on_rack(p, rack_of(id)));
        let mut taken = vec![false; partitions];
        let mut got: Vec<Vec<i32>> = vec![Vec::new(); n];
        for (i, id) in subscribers.iter().enumerate() {
            let rack = rack_of(id);
            if let Some(current) = members[id.as_str()].current.get(topic) {
                for p in current {
                    let Ok(index) = usize::try_from(*p) else { continue };
                    let misplaced = rack.is_some() && !spec.on_rack(*p, rack) && local_elsewhere(i, *p);
                    if index < partitions && !taken[index] && got[i].len() < quota(i) && !misplaced {
                        taken[index] = true;
                        got[i].push(*p);
                    }
                }
            }
        }
        if !spec.racks.is_empty() {
            for (i, id) in subscribers.iter().enumerate() {
                let Some(rack) = rack_of(id) else { continue };
                for (index, p) in (0..spec.partitions).enumerate() {
                    if got[i].len() >= quota(i) {
                        break;
                    }
                    if !taken[index] && spec.on_rack(p, Some(rack)) {
                        taken[index] = true;
                        got[i].push(p);
                    }
                }
            }
        }
        // A partition left over goes back to a member that held it and has room, so that
        // assigning an unchanged group again changes nothing (whether a partition is misplaced
        // depends on racks and subscriptions only, never on the assignment).
        for (i, id) in subscribers.iter().enumerate() {
            let Some(current) = members[id.as_str()].current.get(topic) else { continue };
            for p in current {
                let Ok(index) = usize::try_from(*p) else { continue };
                if index < partitions && !taken[index] && got[i].len() < quota(i) {
                    taken[index] = true;
                    got[i].push(*p);
                }
            }
        }
        let mut free = (0..spec.partitions).filter(|p| usize::try_from(*p).is_ok_and(|i| !taken[i]));
        for (i, mine) in got.iter_mut().enumerate() {
            while mine.len() < quota(i) {
                match free.next() {
                    Some(p) => mine.push(p),
                    None => break,
                }
            }
        }
        for (i, id) in subscribers.iter().enumerate() {
            if !got[i].is_empty() {
                result.entry((*id).clone()).or_default().insert(*topic, got[i].iter().copied().collect());
            }
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn topic_ids(n: usize) -> Vec<Uuid> {
        (0..n).map(|i| Uuid::from_u128(i as u128 + 1)).collect()
    }

    fn flat(a: &Assignment) -> BTreeSet<(Uuid, i32)> {
        a.iter().flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p))).collect()
    }

    /// Every subscribed partition exactly once, only to subscribers.
    fn check_complete(
        members: &BTreeMap<String, MemberSpec>,
        topics: &BTreeMap<Uuid, TopicSpec>,
        result: &BTreeMap<String, Assignment>,
    ) {
        let mut seen = BTreeSet::new();
        for (id, a) in result {
            for key in flat(a) {
                assert!(members[id].subscribed.contains(&key.0), "{id} not subscribed to {key:?}");
                assert!(seen.insert(key), "{key:?} assigned twice");
            }
        }
        for (topic, spec) in topics {
            if members.values().any(|m| m.subscribed.contains(topic)) {
                for p in 0..spec.partitions {
                    assert!(seen.contains(&(*topic, p)), "{topic}:{p} unassigned");
                }
            }
        }
    }

    fn homogeneous(n_members: usize, partitions: &[i32]) -> (BTreeMap<String, MemberSpec>, BTreeMap<Uuid, TopicSpec>) {
        let ids = topic_ids(partitions.len());
        let topics =
            ids.iter().zip(partitions).map(|(id, p)| (*id, TopicSpec { partitions: *p, racks: vec![] })).collect();
        let members = (0..n_members)
            .map(|i| {
                (format!("m{i:02}"), MemberSpec { subscribed: ids.iter().copied().collect(), ..Default::default() })
            })
            .collect();
        (members, topics)
    }

    fn with_current(members: &mut BTreeMap<String, MemberSpec>, result: &BTreeMap<String, Assignment>) {
        for (id, m) in members.iter_mut() {
            m.current = result.get(id).cloned().unwrap_or_default();
        }
    }

    #[test]
    fn uniform_spreads_and_prefers_rack_local_replicas() {
        let topic = Uuid::from_u128(7);
        let racks = (0..4).map(|p| [if p % 2 == 0 { "a" } else { "b" }.to_string()].into()).collect();
        let topics = BTreeMap::from([(topic, TopicSpec { partitions: 4, racks })]);
        let members = BTreeMap::from([
            ("x".to_string(), MemberSpec { subscribed: [topic].into(), rack: Some("b".into()), ..Default::default() }),
            ("y".to_string(), MemberSpec { subscribed: [topic].into(), rack: Some("a".into()), ..Default::default() }),
        ]);
        let result = uniform(&members, &topics);
        assert_eq!(result["x"][&topic], [1, 3].into());
        assert_eq!(result["y"][&topic], [0, 2].into());
    }

    #[test]
    fn uniform_moves_a_partition_to_its_rack_when_a_member_there_joins() {
        let topic = Uuid::from_u128(9);
        let racks = (0..3).map(|p| [format!("r{p}")].into()).collect();
        let topics = BTreeMap::from([(topic, TopicSpec { partitions: 3, racks })]);
        let member = |rack: &str, current: &[i32]| MemberSpec {
            subscribed: [topic].into(),
            rack: Some(rack.into()),
            current: if current.is_empty() {
                Assignment::new()
            } else {
                [(topic, current.iter().copied().collect())].into()
            },
        };
        // a (r0) held everything; b (r1) and c (r2) join.
        let members = BTreeMap::from([
            ("a".to_string(), member("r0", &[0, 1, 2])),
            ("b".to_string(), member("r1", &[])),
            ("c".to_string(), member("r2", &[])),
        ]);
        let result = uniform(&members, &topics);
        assert_eq!(result["a"][&topic], [0].into());
        assert_eq!(result["b"][&topic], [1].into());
        assert_eq!(result["c"][&topic], [2].into());
    }

    #[test]
    fn range_gives_consecutive_ranges_first_members_one_more() {
        let (members, topics) = homogeneous(3, &[7]);
        let result = range(&members, &topics);
        let t = *topics.keys().next().expect("one topic");
        assert_eq!(result["m00"][&t], [0, 1, 2].into());
        assert_eq!(result["m01"][&t], [3, 4].into());
        assert_eq!(result["m02"][&t], [5, 6].into());
    }

    #[test]
    fn range_moves_a_partition_to_its_rack_when_a_member_there_joins() {
        let topic = Uuid::from_u128(11);
        let racks = (0..3).map(|p| [format!("r{p}")].into()).collect();
        let topics = BTreeMap::from([(topic, TopicSpec { partitions: 3, racks })]);
        let member =
            |rack: &str| MemberSpec { subscribed: [topic].into(), rack: Some(rack.into()), ..Default::default() };
        // Members join one at a time (ids against rack order, so member order is no help).
        let mut members = BTreeMap::from([("c".to_string(), member("r2"))]);
        for (id, rack) in [("b", "r1"), ("a", "r0")] {
            let result = range(&members, &topics);
            with_current(&mut members, &result);
            members.insert(id.to_string(), member(rack));
        }
        let result = range(&members, &topics);
        assert_eq!(result["c"][&topic], [2].into());
        assert_eq!(result["b"][&topic], [1].into());
        assert_eq!(result["a"][&topic], [0].into());
    }

    #[test]
    fn range_with_a_full_rack_gives_the_rest_in_partition_order() {
        // Four partitions all on rack a, two members on a: still two each.
        let topic = Uuid::from_u128(12);
        let racks = (0..4).map(|_| ["a".to_string()].into()).collect();
        let topics = BTreeMap::from([(topic, TopicSpec { partitions: 4, racks })]);
        let members = BTreeMap::from([
            ("x".to_string(), MemberSpec { subscribed: [topic].into(), rack: Some("a".into()), ..Default::default() }),
            ("y".to_string(), MemberSpec { subscribed: [topic].into(), rack: Some("b".into()), ..Default::default() }),
        ]);
        let result = range(&members, &topics);
        assert_eq!(result["x"][&topic], [0, 1].into());
        assert_eq!(result["y"][&topic], [2, 3].into());
    }

    #[test]
    fn unknown_assignor_is_refused() {
        assert!(assign("sticky", &BTreeMap::new(), &BTreeMap::new()).is_none());
    }

    proptest! {
        #[test]
        fn uniform_homogeneous_is_complete_balanced_and_sticky(
            n in 1usize..8, parts in proptest::collection::vec(0i32..20, 1..4), extra in 1usize..3,
        ) {
            let (mut members, topics) = homogeneous(n, &parts);
            let first = uniform(&members, &topics);
            check_complete(&members, &topics, &first);
            let counts: Vec<usize> = first.values().map(count).collect();
            prop_assert!(counts.iter().max().unwrap_or(&0) - counts.iter().min().unwrap_or(&0) <= 1);
            // Unchanged input: unchanged output.
            with_current(&mut members, &first);
            prop_assert_eq!(&uniform(&members, &topics), &first);
            // Members join: no partition moves between two members that were there before.
            let subscribed = members.values().next().map(|m| m.subscribed.clone()).unwrap_or_default();
            for i in 0..extra {
                members.insert(format!("new{i}"), MemberSpec { subscribed: subscribed.clone(), ..Default::default() });
            }
            let second = uniform(&members, &topics);
            check_complete(&members, &topics, &second);
            let counts: Vec<usize> = second.values().map(count).collect();
            prop_assert!(counts.iter().max().unwrap_or(&0) - counts.iter().min().unwrap_or(&0) <= 1);
            for (id, before) in &first {
                prop_assert!(flat(&second[id]).is_subset(&flat(before)), "{} gained a partition from another old member", id);
            }
        }

        #[test]
        fn uniform_heterogeneous_is_complete(
            n in 1usize..6, parts in proptest::collection::vec(1i32..10, 1..4), masks in proptest::collection::vec(0u8..16, 6),
        ) {
            let ids = topic_ids(parts.len());
            let topics: BTreeMap<Uuid, TopicSpec> =
                ids.iter().zip(&parts).map(|(id, p)| (*id, TopicSpec { partitions: *p, racks: vec![] })).collect();
            let members: BTreeMap<String, MemberSpec> = (0..n)
                .map(|i| {
                    let subscribed = ids.iter().enumerate().filter(|(t, _)| masks[i] & (1 << t) != 0).map(|(_, id)| *id).collect();
                    (format!("m{i}"), MemberSpec { subscribed, ..Default::default() })
                })
                .collect();
            let result = uniform(&members, &topics);
            check_complete(&members, &topics, &result);
        }

        #[test]
        fn range_is_complete_within_quota_and_sticky(n in 1usize..8, parts in proptest::collection::vec(0i32..20, 1..4)) {
            let (mut members, topics) = homogeneous(n, &parts);
            let first = range(&members, &topics);
            check_complete(&members, &topics, &first);
            for (topic, spec) in &topics {
                for a in first.values() {
                    let got = a.get(topic).map_or(0, BTreeSet::len) as i32;
                    prop_assert!(got == spec.partitions / n as i32 || got == spec.partitions / n as i32 + 1);
                }
            }
            with_current(&mut members, &first);
            prop_assert_eq!(&range(&members, &topics), &first);
        }

        #[test]
        fn range_with_racks_is_complete_within_quota_and_stable(
            n in 1usize..7,
            parts in proptest::collection::vec(0i32..12, 1..4),
            member_racks in proptest::collection::vec(proptest::option::of(0u8..3), 7),
            replica_racks in proptest::collection::vec(proptest::collection::btree_set(0u8..3, 0..3), 12),
            joiners in 0usize..3,
        ) {
            let ids = topic_ids(parts.len());
            let topics: BTreeMap<Uuid, TopicSpec> = ids
                .iter()
                .zip(&parts)
                .map(|(id, p)| {
                    let racks = (0..*p as usize)
                        .map(|i| replica_racks[i].iter().map(|r| format!("r{r}")).collect())
                        .collect();
                    (*id, TopicSpec { partitions: *p, racks })
                })
                .collect();
            let mut members: BTreeMap<String, MemberSpec> = (0..n)
                .map(|i| {
                    let rack = member_racks[i].map(|r| format!("r{r}"));
                    (format!("m{i}"), MemberSpec { subscribed: ids.iter().copied().collect(), rack, ..Default::default() })
                })
                .collect();
            let mut result = range(&members, &topics);
            // Members join a running group, each time from the assignment before.
            for j in 0..joiners {
                with_current(&mut members, &result);
                let rack = member_racks[(n + j) % 7].map(|r| format!("r{r}"));
                members.insert(format!("j{j}"), MemberSpec { subscribed: ids.iter().copied().collect(), rack, ..Default::default() });
                result = range(&members, &topics);
            }
            check_complete(&members, &topics, &result);
            let size = members.len() as i32;
            for (topic, spec) in &topics {
                for a in result.values() {
                    let got = a.get(topic).map_or(0, BTreeSet::len) as i32;
                    prop_assert!(got == spec.partitions / size || got == spec.partitions / size + 1);
                }
            }
            with_current(&mut members, &result);
            prop_assert_eq!(&range(&members, &topics), &result);
        }
    }
}
