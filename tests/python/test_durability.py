"""What survives a broker crash (kill -9) or a clean stop: records, committed offsets, topics.

Each test runs its own broker, as it kills it.
"""

import threading
import time

from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import ConfigResource, ResourceType
from kafka import TopicPartition as KpTopicPartition
from kafka.structs import OffsetAndMetadata

from helpers import (
    TIMEOUT_S,
    c_admin,
    c_consume,
    c_consumer,
    c_create_topic,
    c_produce,
    c_producer,
    c_read_partition,
    kp_admin,
    kp_consumer,
    unique,
    wait_for_topic,
)


def group_offsets(admin, group):
    res = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(timeout=TIMEOUT_S)
    return {tp.partition: tp.offset for tp in res.topic_partitions if tp.offset >= 0}


def test_committed_offsets_survive_kill9(fresh_broker, closer):
    b = fresh_broker
    admin = c_admin(b.bootstrap)
    topic = c_create_topic(admin, unique("offsets-crash"), partitions=2)
    producer = closer.add(c_producer(b.bootstrap))
    c_produce(producer, topic, [{"value": f"m{i}".encode(), "partition": i % 2} for i in range(100)])

    group = unique("crash-group")
    consumer = c_consumer(b.bootstrap, group=group)
    consumer.subscribe([topic])
    c_consume(consumer, 100)
    consumer.commit(offsets=[TopicPartition(topic, 0, 37), TopicPartition(topic, 1, 12)], asynchronous=False)
    consumer.close()

    # A kafka-python commit from an assigned (group-less member) consumer, another group.
    simple_group = unique("crash-simple")
    kp = kp_consumer(b.bootstrap, group_id=simple_group)
    kp.assign([KpTopicPartition(topic, 0)])
    kp.commit({KpTopicPartition(topic, 0): OffsetAndMetadata(5, "", -1)})
    kp.close(autocommit=False)

    assert group_offsets(admin, group) == {0: 37, 1: 12}
    b.kill9()
    b.start()

    admin = c_admin(b.bootstrap)
    wait_for_topic(admin, topic, 2)
    assert group_offsets(admin, group) == {0: 37, 1: 12}
    assert group_offsets(admin, simple_group) == {0: 5}
    kpa = closer.add(kp_admin(b.bootstrap))
    assert {tp.partition: om.offset for tp, om in kpa.list_consumer_group_offsets(simple_group).items()} == {0: 5}

    # A new member of the group resumes exactly at the committed offsets.
    resumed = closer.add(c_consumer(b.bootstrap, group=group))
    resumed.subscribe([topic])
    got = c_consume(resumed, (50 - 37) + (50 - 12))
    by_partition = {p: sorted(r.offset for r in got if r.partition == p) for p in (0, 1)}
    assert by_partition == {0: list(range(37, 50)), 1: list(range(12, 50))}


def test_50k_acks_all_sync_flush_survive_kill9(broker_factory, closer):
    """50,000 records acknowledged with acks=all under log.flush.policy=sync, then kill -9 right
    after the last ack: after a restart all 50,000 are there, once each, in order."""
    n = 50_000
    b = broker_factory({"log.flush.policy": "sync"})
    topic = c_create_topic(c_admin(b.bootstrap), unique("durable"), partitions=1)
    producer = c_producer(
        b.bootstrap,
        {
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 1 << 20,
            "enable.idempotence": False,
            "retries": 0,  # a retry could duplicate or reorder: any error must fail the test instead
        },
    )
    values = [f"{i:08d}-durable".encode() for i in range(n)]
    delivered = c_produce(producer, topic, [{"value": v} for v in values], partition=0, flush_timeout=120)
    b.kill9()  # right after the last acknowledgement
    assert delivered == [(0, i) for i in range(n)]

    b.start()
    consumer = closer.add(c_consumer(b.bootstrap))
    assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT_S) == (0, n)
    got = c_read_partition(b.bootstrap, topic, 0, n, timeout=90)
    assert [r.offset for r in got] == list(range(n))
    assert [r.value for r in got] == values


def test_acked_records_survive_kill9_during_produce(broker_factory, closer):
    """kill -9 while acks=all produce requests are in flight: every acknowledged record is there
    after the restart, at its acknowledged offset; the log is contiguous (no holes)."""
    b = broker_factory({"log.flush.policy": "sync"})
    topic = c_create_topic(c_admin(b.bootstrap), unique("inflight"), partitions=1)
    producer = c_producer(
        b.bootstrap,
        {"acks": "all", "linger.ms": 2, "enable.idempotence": False, "retries": 0, "message.timeout.ms": 5000},
    )
    acked = {}
    enough = threading.Event()

    def on_delivery(err, msg):
        if err is None:
            acked[msg.offset()] = msg.value()
            if len(acked) >= 20_000:
                enough.set()

    i = 0
    deadline = time.monotonic() + 60
    while not enough.is_set():
        try:
            producer.produce(topic, value=f"{i:08d}".encode(), partition=0, on_delivery=on_delivery)
            i += 1
        except BufferError:
            pass
        producer.poll(0 if i % 100 else 0.001)
        assert time.monotonic() < deadline, f"only {len(acked)} acknowledgements within 60s"
    b.kill9()
    producer.purge()
    producer.flush(10)

    b.start()
    consumer = closer.add(c_consumer(b.bootstrap))
    low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT_S)
    assert low == 0 and high >= max(acked) + 1
    got = c_read_partition(b.bootstrap, topic, 0, high, timeout=90)
    assert [r.offset for r in got] == list(range(high))
    values = {r.offset: r.value for r in got}
    missing = [o for o, v in acked.items() if values.get(o) != v]
    assert not missing, f"{len(missing)} acknowledged records lost or changed, e.g. offsets {sorted(missing)[:5]}"
    # Whatever was written, acknowledged or not, was written in produce order.
    assert [r.value for r in got] == sorted(r.value for r in got)


def test_sigterm_exits_0_and_restart_keeps_topics_records_offsets(fresh_broker, closer):
    b = fresh_broker
    admin = c_admin(b.bootstrap)
    topic = c_create_topic(admin, unique("clean"), partitions=3, config={"retention.ms": "123456789"})
    producer = c_producer(b.bootstrap)
    c_produce(producer, topic, [{"value": f"m{i}".encode(), "partition": i % 3} for i in range(30)])
    producer.flush(5)
    group = unique("clean-group")
    consumer = c_consumer(b.bootstrap, group=group)
    consumer.subscribe([topic])
    c_consume(consumer, 30)
    consumer.commit(asynchronous=False)
    consumer.close()

    assert b.stop() == 0, b.tail()
    b.start()

    admin = c_admin(b.bootstrap)
    wait_for_topic(admin, topic, 3)
    resource = ConfigResource(ResourceType.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=TIMEOUT_S)
    assert configs["retention.ms"].value == "123456789"
    assert group_offsets(admin, group) == {0: 10, 1: 10, 2: 10}
    for p in range(3):
        got = c_read_partition(b.bootstrap, topic, p, 10)
        assert [(r.offset, r.value) for r in got] == [(i, f"m{3 * i + p}".encode()) for i in range(10)]
