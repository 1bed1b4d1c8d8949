"""Client helpers shared by the tests: one small vocabulary over confluent-kafka and kafka-python.

Every wait is bounded. Records read by either client are turned into `Rec`, so tests can compare
what one client wrote with what the other read.
"""

import json
import re
import time
import urllib.error
import urllib.request
import uuid
from typing import List, NamedTuple, Optional, Tuple

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition

TIMEOUT_S = 30.0


def unique(prefix="t"):
    """A name no other test uses: topics, groups and client ids get one each."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def wait_until(predicate, timeout=TIMEOUT_S, interval=0.05, what="condition"):
    """Calls predicate until it returns something truthy, which is returned; fails after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class Rec(NamedTuple):
    """A consumed record, whichever client read it. headers: list of (str, bytes or None)."""

    topic: str
    partition: int
    offset: int
    key: Optional[bytes]
    value: Optional[bytes]
    headers: List[Tuple[str, Optional[bytes]]]
    timestamp: int

    def content(self):
        """What a producer controls: key, value and headers."""
        return (self.key, self.value, self.headers)


# -- confluent-kafka (librdkafka) ------------------------------------------------------------


def c_admin(bootstrap):
    return AdminClient({"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 10000})


def c_producer(bootstrap, conf=None):
    base = {
        "bootstrap.servers": bootstrap,
        "linger.ms": 5,
        "message.timeout.ms": int(TIMEOUT_S * 1000),
        "socket.connection.setup.timeout.ms": 10000,
    }
    base.update(conf or {})
    return Producer(base)


def c_consumer(bootstrap, group=None, conf=None):
    base = {
        "bootstrap.servers": bootstrap,
        "group.id": group or unique("g"),
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
        "socket.connection.setup.timeout.ms": 10000,
    }
    base.update(conf or {})
    return Consumer(base)


def c_create_topic(admin, name, partitions=1, config=None, timeout=TIMEOUT_S):
    """Creates a topic and waits until its metadata shows every partition with a leader."""
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})],
        request_timeout=timeout,
    )
    futures[name].result(timeout=timeout)
    wait_for_topic(admin, name, partitions)
    return name


def wait_for_topic(admin, name, partitions, timeout=TIMEOUT_S):
    def ready():
        md = admin.list_topics(topic=name, timeout=5)
        t = md.topics.get(name)
        if t is None or t.error is not None or len(t.partitions) != partitions:
            return False
        return all(p.leader >= 0 and p.error is None for p in t.partitions.values())

    wait_until(ready, timeout, interval=0.1, what=f"topic {name} with {partitions} partitions in metadata")


def c_produce(producer, topic, records, partition=None, flush_timeout=TIMEOUT_S):
    """Produces dicts (key, value, headers, timestamp, partition) and waits for every ack.

    Returns the delivered records' (partition, offset) in produce order; fails on any error.
    """
    reports = [None] * len(records)

    def on_delivery(i):
        def cb(err, msg):
            reports[i] = (err, msg.partition() if err is None else None, msg.offset() if err is None else None)

        return cb

    for i, r in enumerate(records):
        kwargs = {"value": r.get("value"), "key": r.get("key"), "on_delivery": on_delivery(i)}
        if r.get("headers") is not None:
            kwargs["headers"] = r["headers"]
        if r.get("timestamp") is not None:
            kwargs["timestamp"] = r["timestamp"]
        p = r.get("partition", partition)
        if p is not None:
            kwargs["partition"] = p
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    remaining = producer.flush(flush_timeout)
    assert remaining == 0, f"{remaining} messages still unacknowledged after {flush_timeout}s"
    errors = [(i, rep[0]) for i, rep in enumerate(reports) if rep is None or rep[0] is not None]
    assert not errors, f"{len(errors)} deliveries failed, first: {errors[:3]}"
    return [(rep[1], rep[2]) for rep in reports]


def rec_from_confluent(msg):
    return Rec(
        topic=msg.topic(),
        partition=msg.partition(),
        offset=msg.offset(),
        key=msg.key(),
        value=msg.value(),
        headers=list(msg.headers() or []),
        timestamp=msg.timestamp()[1],
    )


def c_consume(consumer, n, timeout=TIMEOUT_S):
    """Polls until n records arrived (fails on a consumer error or after timeout)."""
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"consumed {len(out)} of {n} records within {timeout}s")
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                continue
            raise AssertionError(f"consumer error: {msg.error()}")
        out.append(rec_from_confluent(msg))
    return out


def c_read_partition(bootstrap, topic, partition, n, start=OFFSET_BEGINNING, conf=None, timeout=TIMEOUT_S):
    """Reads n records of one partition with an assigned (group-less) confluent consumer."""
    consumer = c_consumer(bootstrap, conf=conf)
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        return c_consume(consumer, n, timeout)
    finally:
        consumer.close()


# -- kafka-python ------------------------------------------------------------------------------


def kp_producer(bootstrap, **kwargs):
    conf = dict(
        bootstrap_servers=bootstrap,
        linger_ms=5,
        request_timeout_ms=int(TIMEOUT_S * 1000),
        max_block_ms=int(TIMEOUT_S * 1000),
    )
    conf.update(kwargs)
    return KafkaProducer(**conf)


def kp_consumer(bootstrap, **kwargs):
    conf = dict(
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        request_timeout_ms=int(TIMEOUT_S * 1000),
    )
    conf.update(kwargs)
    return KafkaConsumer(**conf)


def kp_admin(bootstrap, **kwargs):
    conf = dict(bootstrap_servers=bootstrap, request_timeout_ms=int(TIMEOUT_S * 1000))
    conf.update(kwargs)
    return KafkaAdminClient(**conf)


def kp_produce(producer, topic, records, partition=None, timeout=TIMEOUT_S):
    """Sends dicts (key, value, headers, timestamp, partition); returns [(partition, offset)]."""
    futures = []
    for r in records:
        p = r.get("partition", partition)
        futures.append(
            producer.send(
                topic,
                value=r.get("value"),
                key=r.get("key"),
                headers=r.get("headers") or None,
                partition=p,
                timestamp_ms=r.get("timestamp"),
            )
        )
    producer.flush(timeout=timeout)
    out = []
    for f in futures:
        md = f.get(timeout=timeout)
        out.append((md.partition, md.offset))
    return out


def rec_from_kp(r):
    return Rec(
        topic=r.topic,
        partition=r.partition,
        offset=r.offset,
        key=r.key,
        value=r.value,
        headers=[(k, v) for k, v in (r.headers or [])],
        timestamp=r.timestamp,
    )


def kp_consume(consumer, n, timeout=TIMEOUT_S):
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"consumed {len(out)} of {n} records within {timeout}s")
        # max_records: the consumer's position moves past the records returned, and no further.
        batches = consumer.poll(timeout_ms=200, max_records=n - len(out))
        for tp in sorted(batches, key=lambda tp: (tp.topic, tp.partition)):
            out.extend(rec_from_kp(r) for r in batches[tp])
    return out


def kp_read_partition(bootstrap, topic, partition, n, timeout=TIMEOUT_S, **kwargs):
    consumer = kp_consumer(bootstrap, **kwargs)
    try:
        tp = KpTopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        return kp_consume(consumer, n, timeout)
    finally:
        consumer.close(autocommit=False)


def raw_batches(bootstrap, topic, partition, offset=0, timeout=TIMEOUT_S):
    """Fetches one partition's raw record batches (kafka-python's protocol classes, Fetch v4).

    Returns [(base_offset, record_count, compression_type, crc_ok)] as the broker sent them, up
    to the high watermark: this shows how the broker stored the batches, e.g. still compressed
    with the producer's codec.
    """
    from kafka.protocol.fetch import FetchRequest
    from kafka.record import MemoryRecords

    max_bytes = 64 * 1024 * 1024
    batches = []
    deadline = time.monotonic() + timeout
    admin = kp_admin(bootstrap)
    try:
        while True:
            request = FetchRequest[4](
                replica_id=-1,
                max_wait_time=100,
                min_bytes=1,
                max_bytes=max_bytes,
                isolation_level=0,
                topics=[(topic, [(partition, offset, max_bytes)])],
            )
            response = admin.send_request(request, node_id=0)
            [(_topic, [(_p, error_code, high_watermark, _lso, _aborted, records)])] = response.topics
            assert error_code == 0, f"fetch of {topic}/{partition} at {offset}: error code {error_code}"
            memory = MemoryRecords(records)
            while memory.has_next():
                batch = memory.next_batch()
                if batch is None:
                    break
                crc_ok = batch.validate_crc()  # before iterating, which decompresses
                count = len(list(batch))
                batches.append((batch.base_offset, count, batch.compression_type, crc_ok))
                offset = batch.next_offset
            if offset >= high_watermark:
                return batches
            if time.monotonic() > deadline:
                raise AssertionError(f"raw fetch reached offset {offset} of {high_watermark} in {timeout}s")
    finally:
        admin.close()


# -- closing ---------------------------------------------------------------------------------


def close_quietly(client):
    try:
        if isinstance(client, Consumer):
            client.close()
        elif isinstance(client, Producer):
            client.flush(5)
        elif isinstance(client, KafkaProducer):
            client.close(timeout=5)
        elif isinstance(client, KafkaConsumer):
            client.close(autocommit=False)
        elif isinstance(client, KafkaAdminClient):
            client.close()
    except Exception:  # noqa: BLE001 - teardown must not hide the test's own failure
        pass


def read_isolated(bootstrap, topic, partitions, isolation, timeout=TIMEOUT_S):
    """Every record of partitions 0..partitions-1 up to their end, as (partition, value) in
    offset order per partition, read with `isolation` (read_committed / read_uncommitted)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("iso"),
            "auto.offset.reset": "earliest",
            "isolation.level": isolation,
            "enable.partition.eof": True,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out, eof = [], set()
        deadline = time.monotonic() + timeout
        while len(eof) < partitions and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is None:
                continue
            if m.error():
                eof.add(m.partition())
                continue
            out.append((m.partition(), m.value().decode()))
        assert len(eof) == partitions, f"reached the end of partitions {sorted(eof)} of {partitions} only"
        return out
    finally:
        consumer.close()


def http(method, url, body=None, timeout=30):
    """One admin API call; returns (status, decoded JSON body)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


# ----- how long acknowledgements stop after a fault ------------------------------------------

FLOWING_GAP_S = 0.3


def acks_flowing(times, now):
    """Whether the acknowledgement times of the last second up to `now` leave no gap over
    FLOWING_GAP_S (a partition that recovered from a fault, or never stopped)."""
    recent = [t for t in times if now - 1.0 < t <= now]
    edges = [now - 1.0] + recent + [now]
    return len(recent) >= 3 and all(b - a <= FLOWING_GAP_S for a, b in zip(edges, edges[1:]))


def ack_stall(times, fault_at, horizon=30.0):
    """The longest time without an acknowledgement from `fault_at` on (within `horizon`), i.e.
    how long the fault stopped the partition; None when none came since. Acks just after the
    fault may answer requests served before it, so the first ack after it is no measure."""
    after = [t for t in times if t > fault_at]
    if not after:
        return None
    longest, previous = 0.0, fault_at
    for t in after:
        longest = max(longest, t - previous)
        previous = t
        if t > fault_at + horizon:
            break
    return longest


def labelled_metric(broker, name, label, value):
    """The sample of the broker's /metrics labelled `label="value"`."""
    with urllib.request.urlopen(f"{broker.admin_url()}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = re.search(rf'^{name}\{{{label}="{value}"\}} (\S+)$', text, re.M)
    assert found, f'{name}{{{label}="{value}"}} is not in /metrics'
    return float(found.group(1))


def metric(broker, name):
    """A label-less sample of the broker's /metrics."""
    with urllib.request.urlopen(f"{broker.admin_url()}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} is not in /metrics")
