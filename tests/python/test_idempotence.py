"""Idempotent producers (enable.idempotence=true): no duplicates and no reordering when
responses are lost and when the broker is killed and restarted mid-stream.

The broker's test-only fault `fault.produce.response.drop.every=N` appends a produce request and
then, instead of answering, closes the connection, every Nth time: the producer must retry, and
the broker must recognise the retry by its sequence numbers and answer with the original offsets.
"""

import threading
import time

from helpers import (
    TIMEOUT_S,
    c_admin,
    c_create_topic,
    c_producer,
    c_read_partition,
    kp_producer,
    kp_read_partition,
    unique,
)

PARTITIONS = 3


def check_exactly_once_in_order(records, expected_per_partition):
    """Every partition holds exactly its expected values, once, in production order."""
    by_partition = {}
    for r in records:
        by_partition.setdefault(r.partition, []).append(int(r.value))
    for partition, expected in expected_per_partition.items():
        got = by_partition.get(partition, [])
        assert len(got) == len(set(got)), f"partition {partition}: {len(got) - len(set(got))} duplicates"
        assert got == expected, f"partition {partition}: got {len(got)} records, expected {len(expected)} in order"


def read_all(bootstrap, topic, expected):
    out = []
    for p, values in expected.items():
        out += c_read_partition(bootstrap, topic, p, len(values))
    return out


def test_confluent_idempotent_producer_survives_dropped_responses(broker_factory, closer):
    b = broker_factory({"fault.produce.response.drop.every": "5"})
    topic = c_create_topic(c_admin(b.bootstrap), unique("idem-faults"), partitions=PARTITIONS)
    producer = closer.add(
        c_producer(b.bootstrap, {"enable.idempotence": True, "linger.ms": 2, "batch.num.messages": 50})
    )
    errors = []
    expected = {p: [] for p in range(PARTITIONS)}
    for i in range(6000):
        p = i % PARTITIONS
        expected[p].append(i)
        producer.produce(topic, value=str(i).encode(), partition=p, on_delivery=lambda e, m: e and errors.append(e))
        if i % 500 == 0:
            producer.poll(0)
    assert producer.flush(TIMEOUT_S) == 0
    assert errors == []
    assert b.log_since(0).count("fault injection") >= 3, "the fault was injected"
    check_exactly_once_in_order(read_all(b.bootstrap, topic, expected), expected)


def test_kafka_python_idempotent_producer_survives_dropped_responses(broker_factory, closer):
    b = broker_factory({"fault.produce.response.drop.every": "3"})
    topic = c_create_topic(c_admin(b.bootstrap), unique("idem-kp"), partitions=PARTITIONS)
    # Small batches, so that the stream takes many requests and several are dropped.
    producer = closer.add(
        kp_producer(b.bootstrap, enable_idempotence=True, acks="all", retries=20, batch_size=512, linger_ms=1)
    )
    expected = {p: [] for p in range(PARTITIONS)}
    futures = []
    for i in range(1500):
        p = i % PARTITIONS
        expected[p].append(i)
        futures.append(producer.send(topic, value=str(i).encode(), partition=p))
    producer.flush(TIMEOUT_S)
    for f in futures:
        f.get(timeout=TIMEOUT_S)
    assert b.log_since(0).count("fault injection") >= 3
    records = []
    for p, values in expected.items():
        records += kp_read_partition(b.bootstrap, topic, p, len(values))
    check_exactly_once_in_order(records, expected)


def test_idempotent_producer_across_a_broker_kill9_and_restart(broker_factory, closer):
    b = broker_factory()
    topic = c_create_topic(c_admin(b.bootstrap), unique("idem-crash"), partitions=PARTITIONS)
    producer = closer.add(
        c_producer(
            b.bootstrap,
            {"enable.idempotence": True, "linger.ms": 2, "message.timeout.ms": 60000, "retry.backoff.ms": 50},
        )
    )
    errors = []
    expected = {p: [] for p in range(PARTITIONS)}
    stop = threading.Event()

    def killer():
        time.sleep(0.5)
        b.kill9()
        time.sleep(0.3)
        b.restart()
        stop.set()

    t = threading.Thread(target=killer)
    t.start()
    i = 0
    deadline = time.monotonic() + 30
    while (not stop.is_set() or i < 3000) and time.monotonic() < deadline:
        p = i % PARTITIONS
        expected[p].append(i)
        producer.produce(topic, value=str(i).encode(), partition=p, on_delivery=lambda e, m: e and errors.append(e))
        producer.poll(0)
        i += 1
        if i % 200 == 0:
            time.sleep(0.01)
    t.join()
    assert producer.flush(60) == 0
    assert errors == [], errors[:3]
    assert b.starts == 2
    check_exactly_once_in_order(read_all(b.bootstrap, topic, expected), expected)
