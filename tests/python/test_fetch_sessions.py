"""Incremental fetch sessions (KIP-227) with real clients and real followers.

What it proves: kafka-python opens a fetch session with Weir and keeps consuming across many
partitions through incremental fetches (new records in a few partitions reach it, nothing is
lost or repeated); librdkafka, which sends sessionless fetches (epoch -1), is served as before
next to them; the followers of a three-node cluster
replicate through sessions, and a caught-up follower of an idle partition, which names it in
no fetch, stays in the ISR past `replica.lag.time.max.ms`, while acks=all writes go on being
acknowledged. Sessions in use are read from the `weir_fetch_sessions` gauge.
"""

import time
import urllib.request

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic

from helpers import c_admin, c_consumer, c_create_topic, c_producer, kp_consumer, unique

LAG_TIME_MS = 1500
SETTINGS = {"replica.lag.time.max.ms": str(LAG_TIME_MS), "replica.fetch.wait.max.ms": "200"}


def fetch_sessions(node):
    """The node's weir_fetch_sessions{protocol="kafka"}."""
    with urllib.request.urlopen(f"{node.admin_url()}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("weir_fetch_sessions{") and 'protocol="kafka"' in line:
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"weir_fetch_sessions not in {node}'s metrics")


def produce_to_each(bootstrap, topic, partitions, per_partition, tag, acks="all"):
    producer = c_producer(bootstrap, {"acks": acks})
    failed = []

    def report(err, _msg):
        if err is not None:
            failed.append(err)

    for p in partitions:
        for i in range(per_partition):
            producer.produce(topic, f"{tag}-{p}-{i}".encode(), partition=p, on_delivery=report)
            producer.poll(0)
    assert producer.flush(30) == 0, "every record delivered"
    assert not failed, failed


def consume_values(consumer, n, timeout=30):
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                continue
            raise KafkaException(msg.error())
        got.append(msg.value().decode())
    return got


def test_librdkafka_sessionless_fetches_consume_many_partitions(broker):
    topic = unique("sessions")
    partitions = 60
    admin = c_admin(broker.bootstrap)
    c_create_topic(admin, topic, partitions=partitions)
    produce_to_each(broker.bootstrap, topic, range(partitions), 5, "a", acks="1")
    consumer = c_consumer(broker.bootstrap, conf={"enable.auto.commit": False, "fetch.wait.max.ms": 100})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        first = consume_values(consumer, partitions * 5)
        assert sorted(first) == sorted(f"a-{p}-{i}" for p in range(partitions) for i in range(5))
        few = [3, 17, 59]
        for round_ in range(3):
            produce_to_each(broker.bootstrap, topic, few, 4, f"b{round_}", acks="1")
            more = consume_values(consumer, len(few) * 4)
            assert sorted(more) == sorted(f"b{round_}-{p}-{i}" for p in few for i in range(4)), more
        assert consume_values(consumer, 1, timeout=1) == [], "nothing is delivered twice"
    finally:
        consumer.close()


def test_kafka_python_consumes_many_partitions_through_a_fetch_session(broker):
    topic = unique("kp-sessions")
    partitions = 40
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=partitions)
    produce_to_each(broker.bootstrap, topic, range(partitions), 3, "a", acks="1")
    consumer = kp_consumer(broker.bootstrap, auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        from kafka import TopicPartition as KpTopicPartition

        consumer.assign([KpTopicPartition(topic, p) for p in range(partitions)])
        consumer.seek_to_beginning()
        got = []
        deadline = time.monotonic() + 30
        while len(got) < partitions * 3 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                got.extend(r.value.decode() for r in records)
        assert sorted(got) == sorted(f"a-{p}-{i}" for p in range(partitions) for i in range(3))
        assert fetch_sessions(broker) >= 1, "kafka-python's fetches go through a session"
        # Incremental fetches from here: new records in a few partitions are answered, and the
        # idle ones stay in the session without being named.
        few = [5, 21, 39]
        for round_ in range(3):
            produce_to_each(broker.bootstrap, topic, few, 2, f"b{round_}", acks="1")
            more = []
            deadline = time.monotonic() + 30
            while len(more) < len(few) * 2 and time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=200).values():
                    more.extend(r.value.decode() for r in records)
            assert sorted(more) == sorted(f"b{round_}-{p}-{i}" for p in few for i in range(2)), more
        assert not any(consumer.poll(timeout_ms=1000).values()), "nothing is delivered twice"
    finally:
        consumer.close()


def isr_sizes(cluster, topic):
    admin = c_admin(cluster.bootstrap())
    t = admin.list_topics(topic, timeout=10).topics[topic]
    if t.error is not None:
        return {}
    return {p: len(m.isrs) for p, m in t.partitions.items()}


def test_followers_replicate_through_sessions_and_idle_caught_up_followers_stay_in_the_isr(cluster_factory):
    cluster = cluster_factory(voters=3, settings=SETTINGS)
    topic = unique("isr-sessions")
    partitions = 12
    admin = c_admin(cluster.bootstrap())
    futures = admin.create_topics([NewTopic(topic, partitions, 3)], operation_timeout=20, request_timeout=30)
    futures[topic].result(timeout=40)
    cluster.wait(lambda: set(isr_sizes(cluster, topic).values()) == {3}, 30, "every partition fully in sync")
    # Each node leads some partitions and has both others fetching from it.
    cluster.wait(
        lambda: all(fetch_sessions(node) >= 2 for node in cluster.live()),
        20,
        "each leader to hold a session for each of its two followers",
    )
    produce_to_each(cluster.bootstrap(), topic, range(partitions), 3, "a")
    # Idle for several lag times: the followers name no partition in their fetches, yet they
    # are caught up and must stay in the ISR.
    idle_until = time.monotonic() + 4 * LAG_TIME_MS / 1000
    while time.monotonic() < idle_until:
        assert set(isr_sizes(cluster, topic).values()) == {3}, isr_sizes(cluster, topic)
        time.sleep(0.5)
    # Writes to a few partitions still need (and get) the whole ISR.
    produce_to_each(cluster.bootstrap(), topic, [0, 7], 10, "b")
    consumer = c_consumer(cluster.bootstrap(), conf={"enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got = consume_values(consumer, partitions * 3 + 20)
        assert len(got) == partitions * 3 + 20 and len(set(got)) == len(got)
    finally:
        consumer.close()
    assert set(isr_sizes(cluster, topic).values()) == {3}
