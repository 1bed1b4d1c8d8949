//! Kafka's key partitioner: `toPositive(murmur2(key)) % partitions`, as the Java client's
//! default partitioner (and librdkafka's `murmur2_random`) computes it, so a keyed record
//! produced over HTTP lands in the partition a Java producer would have chosen for that key.
//!
//! librdkafka's *default* partitioner is `consistent_random` (CRC-32), which places keys
//! differently; confluent-kafka users who want the same placement set
//! `partitioner=murmur2_random`.

/// Kafka's `Utils.murmur2`: MurmurHash2, 32 bits, seed 0x9747b28c, little-endian words.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let length = data.len();
    // Java hashes an int length; keys are far below 2 GiB (the body limit is 16 MiB).
    let mut h: u32 = SEED ^ (length as u32);
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        // Java's switch falls through: 3 → 2 → 1.
        if tail.len() == 3 {
            h ^= u32::from(tail[2]) << 16;
        }
        if tail.len() >= 2 {
            h ^= u32::from(tail[1]) << 8;
        }
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition of `key` among `partitions` (which must be positive).
pub fn partition_for_key(key: &[u8], partitions: i32) -> i32 {
    assert!(partitions > 0, "a topic has at least one partition");
    // Kafka's Utils.toPositive: clear the sign bit (not abs, so i32::MIN maps to 0).
    (murmur2(key) & 0x7fff_ffff) % partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_kafkas_test_vectors() {
        // From Kafka's UtilsTest.testMurmur2.
        let cases: &[(&[u8], i32)] = &[
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58_897_971),
            (b"abc", 479_470_107),
        ];
        for (key, expected) in cases {
            assert_eq!(murmur2(key), *expected, "murmur2({:?})", String::from_utf8_lossy(key));
        }
    }

    #[test]
    fn partitions_are_in_range_and_stable() {
        for partitions in [1, 3, 7, 100] {
            for key in ["", "a", "user-42", "\u{1F600}"] {
                let p = partition_for_key(key.as_bytes(), partitions);
                assert!((0..partitions).contains(&p));
                assert_eq!(p, partition_for_key(key.as_bytes(), partitions));
            }
        }
        // (-973932308 & 0x7fffffff) % 3 = 1173551340 % 3 = 0.
        assert_eq!(partition_for_key(b"21", 3), 0);
    }
}
