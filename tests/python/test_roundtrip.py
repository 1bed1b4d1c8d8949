"""Produce and consume round trips, written by one client and read by the same or the other one."""

import hashlib
import os
import time

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
    unique,
)

CLIENTS = ["confluent", "kafka-python"]
PAIRS = [(p, c) for p in CLIENTS for c in CLIENTS]
PAIR_IDS = [f"{p}-to-{c}" for p, c in PAIRS]

EXPLICIT_TS = 1_600_000_000_123


def mixed_records(producer):
    """Keys, null keys, empty keys and values, null values, headers (repeated, empty, null, binary).

    kafka-python's producer refuses null header values (it asserts bytes), so it sends an empty one.
    """
    null_header = None if producer == "confluent" else b""
    return [
        {"key": b"k1", "value": b"v1", "headers": [("h1", b"x"), ("h2", b"")]},
        {"key": None, "value": b"a record with a null key"},
        {"key": b"k3", "value": b""},
        {"key": b"", "value": b"a record with an empty key"},
        {"key": b"k5", "value": None},
        {"key": b"dup", "value": b"repeated header names", "headers": [("dup", b"1"), ("dup", b"2"), ("o", b"3")]},
        {"key": b"nullh", "value": b"a header with a null value", "headers": [("n", null_header)]},
        {"key": "ключ-🔑".encode(), "value": bytes(range(256)), "headers": [("bin", bytes(range(256)))]},
        {"key": b"ts", "value": b"explicit timestamp", "timestamp": EXPLICIT_TS},
    ]


def produce_with(client, bootstrap, topic, records, closer, partition=0, **conf):
    if client == "confluent":
        producer = closer.add(c_producer(bootstrap, conf.get("confluent")))
        return c_produce(producer, topic, records, partition=partition)
    producer = closer.add(kp_producer(bootstrap, **conf.get("kafka_python", {})))
    return kp_produce(producer, topic, records, partition=partition)


def read_with(client, bootstrap, topic, partition, n):
    if client == "confluent":
        return c_read_partition(bootstrap, topic, partition, n)
    return kp_read_partition(bootstrap, topic, partition, n)


@pytest.mark.parametrize("producer,consumer", PAIRS, ids=PAIR_IDS)
def test_round_trip_keys_headers_nulls_empties(broker, closer, producer, consumer):
    topic = c_create_topic(c_admin(broker.bootstrap), unique("rt"), partitions=1)
    records = mixed_records(producer)
    before_ms = int(time.time() * 1000)
    delivered = produce_with(producer, broker.bootstrap, topic, records, closer)
    after_ms = int(time.time() * 1000)
    assert delivered == [(0, i) for i in range(len(records))]

    got = read_with(consumer, broker.bootstrap, topic, 0, len(records))
    assert [r.offset for r in got] == list(range(len(records)))
    assert all(r.topic == topic and r.partition == 0 for r in got)
    for rec, want in zip(got, records):
        assert rec.key == want.get("key"), rec
        assert rec.value == want.get("value"), rec
        assert rec.headers == list(want.get("headers") or []), rec
        if want.get("timestamp") is not None:
            assert rec.timestamp == want["timestamp"], rec
        else:
            assert before_ms - 1000 <= rec.timestamp <= after_ms + 1000, rec


@pytest.mark.parametrize("producer,consumer", PAIRS, ids=PAIR_IDS)
def test_round_trip_1mib_values(broker, closer, producer, consumer):
    """Three 1 MiB values, each alone in its batch, on a topic whose max.message.bytes allows them.

    The consumers keep their default fetch sizes (1 MiB per partition), so this also checks that
    the broker returns a first batch larger than the partition limit, as Kafka does (KIP-74).
    """
    size = 1024 * 1024
    topic = c_create_topic(
        c_admin(broker.bootstrap), unique("big"), partitions=1, config={"max.message.bytes": str(4 * size)}
    )
    values = [os.urandom(size) for _ in range(3)]
    records = [{"key": f"big-{i}".encode(), "value": v} for i, v in enumerate(values)]
    conf = {
        "confluent": {"message.max.bytes": 4 * size, "batch.size": 4 * size},
        "kafka_python": {"max_request_size": 4 * size},
    }
    delivered = produce_with(producer, broker.bootstrap, topic, records, closer, **conf)
    assert delivered == [(0, 0), (0, 1), (0, 2)]

    got = read_with(consumer, broker.bootstrap, topic, 0, 3)
    assert [r.offset for r in got] == [0, 1, 2]
    assert [r.key for r in got] == [b"big-0", b"big-1", b"big-2"]
    assert [len(r.value) for r in got] == [size] * 3
    assert [hashlib.sha256(r.value).hexdigest() for r in got] == [hashlib.sha256(v).hexdigest() for v in values]


@pytest.mark.parametrize("producer,consumer", PAIRS, ids=PAIR_IDS)
def test_round_trip_many_partitions_keyed(broker, closer, producer, consumer):
    """600 keyed records over 4 partitions: per-partition order and the key→partition mapping hold."""
    topic = c_create_topic(c_admin(broker.bootstrap), unique("keyed"), partitions=4)
    records = [
        {"key": f"key-{i % 13}".encode(), "value": f"value-{i}".encode(), "partition": i % 4} for i in range(600)
    ]
    delivered = produce_with(producer, broker.bootstrap, topic, records, closer, partition=None)
    assert [p for p, _ in delivered] == [i % 4 for i in range(600)]
    for p in range(4):
        assert sorted(o for q, o in delivered if q == p) == list(range(150))

    for p in range(4):
        got = read_with(consumer, broker.bootstrap, topic, p, 150)
        want = [r for r in records if r["partition"] == p]
        assert [r.offset for r in got] == list(range(150))
        assert [(r.key, r.value) for r in got] == [(w["key"], w["value"]) for w in want]
