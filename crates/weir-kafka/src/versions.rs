//! The APIs and versions this broker implements: what ApiVersions advertises, and the gate every
//! request passes. Each range is what the handlers implement, intersected with what the
//! `kafka-protocol` crate can decode, so nothing is advertised that is not handled.

use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::VersionRange;

/// (API, lowest, highest) implemented by our handlers.
const IMPLEMENTED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 11),
    (ApiKey::Fetch, 4, 16),
    (ApiKey::ListOffsets, 1, 10),
    (ApiKey::Metadata, 0, 12),
    // v9: the generation is a consumer-protocol member's epoch (STALE_MEMBER_EPOCH).
    (ApiKey::OffsetCommit, 2, 9),
    (ApiKey::OffsetFetch, 1, 9),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::ListGroups, 0, 5),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::OffsetForLeaderEpoch, 2, 4),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::DescribeLogDirs, 1, 4),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::OffsetDelete, 0, 0),
    (ApiKey::DescribeCluster, 0, 1),
    (ApiKey::DescribeQuorum, 0, 1),
    (ApiKey::ElectLeaders, 0, 2),
    (ApiKey::AlterPartitionReassignments, 0, 1),
    (ApiKey::ListPartitionReassignments, 0, 0),
    (ApiKey::UnregisterBroker, 0, 0),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::AddPartitionsToTxn, 0, 3),
    (ApiKey::AddOffsetsToTxn, 0, 3),
    (ApiKey::EndTxn, 0, 3),
    (ApiKey::TxnOffsetCommit, 0, 3),
    (ApiKey::DescribeTransactions, 0, 0),
    (ApiKey::ListTransactions, 0, 1),
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
    (ApiKey::AlterUserScramCredentials, 0, 0),
    (ApiKey::DescribeUserScramCredentials, 0, 0),
    // ACLs (KIP-140) at Kafka 4's versions: v0 (no pattern types) is gone there too.
    (ApiKey::DescribeAcls, 1, 3),
    (ApiKey::CreateAcls, 1, 3),
    (ApiKey::DeleteAcls, 1, 3),
    (ApiKey::DescribeClientQuotas, 0, 1),
    (ApiKey::AlterClientQuotas, 0, 1),
    (ApiKey::ConsumerGroupHeartbeat, 0, 1),
    (ApiKey::ConsumerGroupDescribe, 0, 1),
    // Share groups (KIP-932), at Kafka 4.2's versions. ShareFetch and ShareAcknowledge v2
    // (KIP-1206's acquire mode, KIP-1222's renew flag) and DescribeShareGroupOffsets v1 (its
    // lag) are read and answered through the crate's earlier schemas (`share_versions`);
    // RENEW (type 4) is taken in v1 too.
    (ApiKey::ShareGroupHeartbeat, 1, 1),
    (ApiKey::ShareGroupDescribe, 1, 1),
    (ApiKey::ShareFetch, 1, 2),
    (ApiKey::ShareAcknowledge, 1, 2),
    (ApiKey::DescribeShareGroupOffsets, 0, 1),
    (ApiKey::AlterShareGroupOffsets, 0, 0),
    (ApiKey::DeleteShareGroupOffsets, 0, 0),
];

/// The supported version range of `key`, or `None` if the API is not implemented.
pub fn supported(key: ApiKey) -> Option<VersionRange> {
    IMPLEMENTED.iter().find(|(k, _, _)| *k == key).map(|(_, min, max)| {
        let ours = VersionRange { min: *min, max: *max };
        // (Past the crate's versions, these are read through it by `share_versions`.)
        if matches!(key, ApiKey::ShareFetch | ApiKey::ShareAcknowledge | ApiKey::DescribeShareGroupOffsets) {
            return ours;
        }
        let range = ours.intersect(&key.valid_versions());
        debug_assert!(!range.is_empty(), "{key:?}");
        range
    })
}

/// Every implemented API with its range, in API key order.
pub(crate) fn all() -> Vec<(ApiKey, VersionRange)> {
    let mut out: Vec<(ApiKey, VersionRange)> =
        IMPLEMENTED.iter().filter_map(|(k, _, _)| supported(*k).map(|r| (*k, r))).collect();
    out.sort_by_key(|(k, _)| *k as i16);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_range_is_decodable_by_the_protocol_crate() {
        for (key, min, max) in IMPLEMENTED {
            let crate_range = key.valid_versions();
            // (Past the crate's versions, these are read through it by `share_versions`.)
            let max = match key {
                ApiKey::ShareFetch | ApiKey::ShareAcknowledge | ApiKey::DescribeShareGroupOffsets => {
                    &(*max).min(crate_range.max)
                }
                _ => max,
            };
            assert!(*min >= crate_range.min && *max <= crate_range.max, "{key:?} {min}..{max} vs {crate_range}");
        }
    }

    /// The README's compatibility table and docs/kafka.md's list every API with the versions
    /// advertised, so they cannot drift from what the broker speaks.
    #[test]
    fn the_readme_table_lists_every_api_and_its_versions() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
            .expect("README.md is readable");
        let table =
            readme.split("## Kafka compatibility").nth(1).expect("the README has a Kafka compatibility section");
        let mut listed: Vec<(String, String)> = Vec::new();
        for line in table.lines().skip_while(|l| !l.starts_with('|')).take_while(|l| l.starts_with('|')) {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            for pair in cells[1..cells.len() - 1].chunks(3) {
                if let [name, versions, ..] = pair {
                    if !name.is_empty() && *name != "API" && !name.starts_with("---") {
                        listed.push((name.to_string(), versions.to_string()));
                    }
                }
            }
        }
        listed.sort();
        // docs/kafka.md's table too: | API | Key | Versions | Notes |.
        let kafka_md = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/kafka.md"))
            .expect("docs/kafka.md is readable");
        let section = kafka_md.split("## Supported APIs").nth(1).and_then(|s| s.split("\n## ").next());
        let mut documented: Vec<(String, String)> = section
            .expect("docs/kafka.md has a Supported APIs section")
            .lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| API"))
            .map(|l| l.split('|').map(str::trim).collect::<Vec<_>>())
            .filter(|cells| cells.len() >= 5 && cells[2].parse::<i16>().is_ok())
            .map(|cells| (cells[1].to_string(), cells[3].to_string()))
            .collect();
        documented.sort();
        let mut advertised: Vec<(String, String)> = all()
            .into_iter()
            .map(|(key, range)| {
                let versions = if range.min == range.max {
                    range.min.to_string()
                } else {
                    format!("{}\u{2013}{}", range.min, range.max)
                };
                (format!("{key:?}"), versions)
            })
            .collect();
        advertised.sort();
        assert_eq!(listed, advertised, "the README's Kafka compatibility table vs versions::IMPLEMENTED");
        assert_eq!(documented, advertised, "docs/kafka.md's table of APIs vs versions::IMPLEMENTED");
    }
}
