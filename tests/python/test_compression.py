"""Every compression codec, produced by one client and consumed by the other (both directions).

Besides the records themselves, the raw Fetch response is inspected: the broker must keep the
producer's batches as they were sent (same codec, valid CRC), as Kafka does with the default
`compression.type=producer`.
"""

import pytest

from helpers import (
    c_admin,
    c_create_topic,
    c_produce,
    c_producer,
    c_read_partition,
    kp_produce,
    kp_producer,
    kp_read_partition,
    raw_batches,
    unique,
)

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
DIRECTIONS = [("confluent", "kafka-python"), ("kafka-python", "confluent")]
N = 500


def compressible_records():
    filler = "the quick brown fox jumps over the lazy dog; " * 20
    return [
        {
            "key": f"k{i % 10}".encode(),
            "value": f"{i:06d} {filler}".encode(),
            "headers": [("seq", str(i).encode())],
        }
        for i in range(N)
    ]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("producer,consumer", DIRECTIONS, ids=[f"{p}-to-{c}" for p, c in DIRECTIONS])
def test_codec_cross_client(broker, closer, codec, producer, consumer):
    topic = c_create_topic(c_admin(broker.bootstrap), unique(f"z-{codec}"), partitions=1)
    records = compressible_records()

    if producer == "confluent":
        p = closer.add(c_producer(broker.bootstrap, {"compression.type": codec, "linger.ms": 50}))
        delivered = c_produce(p, topic, records, partition=0)
    else:
        p = closer.add(
            kp_producer(
                broker.bootstrap,
                compression_type=None if codec == "none" else codec,
                linger_ms=50,
                batch_size=64 * 1024,
            )
        )
        delivered = kp_produce(p, topic, records, partition=0)
    assert delivered == [(0, i) for i in range(N)]

    if consumer == "confluent":
        got = c_read_partition(broker.bootstrap, topic, 0, N)
    else:
        got = kp_read_partition(broker.bootstrap, topic, 0, N)
    assert [r.offset for r in got] == list(range(N))
    assert [r.content() for r in got] == [(r["key"], r["value"], r["headers"]) for r in records]

    batches = raw_batches(broker.bootstrap, topic, 0)
    assert sum(count for _, count, _, _ in batches) == N
    assert {codec_id for _, _, codec_id, _ in batches} == {CODEC_IDS[codec]}, batches
    assert all(crc_ok for _, _, _, crc_ok in batches), batches
    assert max(count for _, count, _, _ in batches) > 1, f"expected multi-record batches: {batches}"
    bases = [base for base, _, _, _ in batches]
    assert bases == sorted(bases) and bases[0] == 0
