"""Long polling: an empty fetch parks until its max wait, an append wakes it at once, and so a
consumer with fetch.wait.max.ms=500 sees a new record within milliseconds, not half a second."""

import statistics
import threading
import time

from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from kafka import TopicPartition as KpTopicPartition
from kafka.protocol.fetch import FetchRequest

from helpers import (
    c_admin,
    c_consumer,
    c_create_topic,
    c_produce,
    c_producer,
    kp_admin,
    kp_consumer,
    kp_producer,
    unique,
)

SAMPLES = 30
GAP_S = 0.1  # between samples, so that each record arrives while the consumer's fetch is parked
MEDIAN_LIMIT_S = 0.100


def raw_fetch(admin, topic, max_wait_ms, offset=0):
    request = FetchRequest[4](
        replica_id=-1,
        max_wait_time=max_wait_ms,
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        topics=[(topic, [(0, offset, 1 << 20)])],
    )
    t0 = time.monotonic()
    response = admin.send_request(request, node_id=0)
    elapsed = time.monotonic() - t0
    [(_t, [(_p, error_code, high_watermark, _lso, _aborted, records)])] = response.topics
    assert error_code == 0
    return elapsed, high_watermark, bytes(records or b"")


def test_empty_fetch_waits_for_max_wait(broker, closer):
    topic = c_create_topic(c_admin(broker.bootstrap), unique("park"))
    admin = closer.add(kp_admin(broker.bootstrap))
    raw_fetch(admin, topic, 0)  # connect first
    elapsed, hw, records = raw_fetch(admin, topic, 500)
    assert (hw, records) == (0, b"")
    assert 0.45 <= elapsed < 2.0, f"an empty fetch with max_wait_time=500 ms returned after {elapsed:.3f} s"


def test_append_wakes_a_parked_fetch(broker, closer):
    topic = c_create_topic(c_admin(broker.bootstrap), unique("wake"))
    admin = closer.add(kp_admin(broker.bootstrap))
    producer = closer.add(c_producer(broker.bootstrap, {"linger.ms": 0}))
    raw_fetch(admin, topic, 0)
    timer = threading.Timer(0.2, lambda: c_produce(producer, topic, [{"value": b"wake up"}], partition=0))
    timer.start()
    try:
        elapsed, hw, records = raw_fetch(admin, topic, 3000)
    finally:
        timer.join()
    assert hw == 1 and b"wake up" in records
    assert elapsed < 1.0, f"a fetch parked for up to 3 s returned {elapsed:.3f} s after it was sent (append at 0.2 s)"


def report(name, samples):
    ms = sorted(s * 1000 for s in samples)
    p90 = ms[int(len(ms) * 0.9) - 1]
    print(f"{name}: produce->consume latency over {len(ms)} records: median {statistics.median(ms):.1f} ms, "
          f"p90 {p90:.1f} ms, max {ms[-1]:.1f} ms")
    return statistics.median(samples)


def test_confluent_produce_to_consume_latency(broker, closer):
    topic = c_create_topic(c_admin(broker.bootstrap), unique("latency"))
    consumer = closer.add(c_consumer(broker.bootstrap, conf={"fetch.wait.max.ms": 500, "fetch.min.bytes": 1}))
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    producer = closer.add(c_producer(broker.bootstrap, {"linger.ms": 0}))

    samples = []
    for i in range(SAMPLES + 1):
        time.sleep(GAP_S)
        value = f"sample-{i}".encode()
        t0 = time.perf_counter()
        producer.produce(topic, value=value, partition=0)
        producer.poll(0)
        deadline = t0 + 10
        while True:
            msg = consumer.poll(0.01)
            if msg is not None and not msg.error():
                assert msg.value() == value
                break
            assert time.perf_counter() < deadline, f"record {i} not consumed within 10 s"
        if i > 0:  # the first one warms up connections
            samples.append(time.perf_counter() - t0)
    median = report("confluent-kafka", samples)
    assert median < MEDIAN_LIMIT_S, f"median latency {median * 1000:.1f} ms"


def test_kafka_python_produce_to_consume_latency(broker, closer):
    topic = c_create_topic(c_admin(broker.bootstrap), unique("kp-latency"))
    consumer = closer.add(kp_consumer(broker.bootstrap, fetch_max_wait_ms=500, fetch_min_bytes=1))
    tp = KpTopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    producer = closer.add(kp_producer(broker.bootstrap, linger_ms=0))

    samples = []
    for i in range(SAMPLES + 1):
        time.sleep(GAP_S)
        value = f"sample-{i}".encode()
        t0 = time.perf_counter()
        producer.send(topic, value=value, partition=0)
        deadline = t0 + 10
        got = []
        while not got:
            got = [r for rs in consumer.poll(timeout_ms=10).values() for r in rs]
            assert time.perf_counter() < deadline, f"record {i} not consumed within 10 s"
        assert [r.value for r in got] == [value]
        if i > 0:
            samples.append(time.perf_counter() - t0)
    median = report("kafka-python", samples)
    assert median < MEDIAN_LIMIT_S, f"median latency {median * 1000:.1f} ms"
