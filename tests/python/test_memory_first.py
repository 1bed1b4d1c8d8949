"""Memory-first topics (storage.mode=memory, docs/memory-first.md) against a real S3 API server.

A memory-first topic's writes count once the broker's writer has them in the object store:
Kafka producers are answered then, consumers see the records then, and a broker that lost its
disk serves everything it acknowledged from the store. What it proves:
- acks=all produce is answered once the store has the write; write-ahead objects hold several
  partitions' batches each;
- kill -9 and the loss of the partitions' local directories lose nothing acknowledged: the
  restarted broker writes the store's part back (write-ahead objects, tiered segments);
- with the store down, producers wait (their requests time out), nothing is acknowledged, and
  the writes go on once it is back;
- clear refusals: memory-first without tiering, a change of storage.mode, a bad value.

Every wait is bounded.
"""

import shutil
import socket
import threading
import time

from confluent_kafka import KafkaException
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType

from conftest import free_port
from helpers import c_admin, c_producer, c_read_partition, metric, unique, wait_until
from test_tiered_storage import S3Server, c_watermarks, s3, tiered_settings  # noqa: F401 (the fixture)

PARTITIONS = 3


def memory_settings(s3_server, bucket, prefix="memory"):
    settings = dict(tiered_settings(s3_server, bucket, prefix=prefix))
    settings.update({"memory.flush.ms": "50", "log.retention.check.interval.ms": "200"})
    return settings


def create_memory_topic(broker, topic, config=None):
    admin = c_admin(broker.bootstrap)
    configs = {"storage.mode": "memory", "remote.storage.enable": "true", "segment.bytes": "65536",
               "local.retention.bytes": "131072", **(config or {})}
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1, config=configs)])[
        topic].result(timeout=30)
    return admin


def produce(broker, topic, values, conf=None):
    """Produces `values` round-robin over the partitions; returns (acknowledged, failed)."""
    producer = c_producer(broker.bootstrap, {"acks": "all", "linger.ms": 5, **(conf or {})})
    acked, failed = [], []

    def report(err, msg):
        (failed if err else acked).append(msg.value().decode())

    for i, value in enumerate(values):
        producer.produce(topic, value=value.encode(), partition=i % PARTITIONS, on_delivery=report)
        producer.poll(0)
    producer.flush(60)
    return acked, failed


def read_all(broker, topic, counts):
    values = []
    for p in range(PARTITIONS):
        values += [bytes(r.value).decode() for r in c_read_partition(broker.bootstrap, topic, p, counts[p])]
    return values


def test_a_memory_first_topic_answers_once_the_store_has_writes_and_survives_losing_its_disk(s3, broker_factory):
    bucket = unique("bucket")
    s3.client.create_bucket(Bucket=bucket)
    broker = broker_factory(memory_settings(s3, bucket))
    topic = unique("memory")
    create_memory_topic(broker, topic)
    values = [f"v{i:05d}".ljust(200, "x") for i in range(3000)]
    acked, failed = produce(broker, topic, values)
    assert not failed and sorted(acked) == sorted(values)
    # The writes went to the store as write-ahead objects holding several partitions each.
    wal = [k for k in s3.keys(bucket, "memory/wal/")]
    assert wal, "no write-ahead object in the store"
    assert metric(broker, "weir_memory_flushes_total") >= 1
    assert metric(broker, "weir_memory_pending_bytes") == 0
    counts = [1000, 1000, 1000]
    assert sorted(read_all(broker, topic, counts)) == sorted(values)

    # kill -9, and the partitions' directories gone (a lost disk): what was acknowledged comes
    # back from the store.
    broker.kill9()
    for p in range(PARTITIONS):
        shutil.rmtree(broker.data_dir / f"{topic}-{p}", ignore_errors=True)
    broker.start()
    assert sorted(read_all(broker, topic, counts)) == sorted(values)
    more = [f"w{i:05d}" for i in range(90)]
    acked, failed = produce(broker, topic, more)
    assert not failed and sorted(acked) == sorted(more)
    assert sorted(read_all(broker, topic, [1030, 1030, 1030])) == sorted(values + more)

    # The same after a kill -9 that keeps the disk: the local log and the store agree.
    broker.kill9()
    broker.settings["memory.wal.max.age.ms"] = "1000"
    broker.start()
    assert sorted(read_all(broker, topic, [1030, 1030, 1030])) == sorted(values + more)
    # Objects older than memory.wal.max.age.ms have their partitions' segments rolled; once the
    # tier holds those, the objects go.
    wait_until(lambda: not s3.keys(bucket, "memory/wal/"), timeout=60, what="the write-ahead objects to be collected")
    assert metric(broker, "weir_memory_wal_objects") == 0
    broker.kill9()
    for p in range(PARTITIONS):
        shutil.rmtree(broker.data_dir / f"{topic}-{p}", ignore_errors=True)
    broker.start()
    assert sorted(read_all(broker, topic, [1030, 1030, 1030])) == sorted(values + more), "from the tier alone"


def test_producers_wait_while_the_store_is_down_and_go_on_once_it_is_back(tmp_path, broker_factory):
    port = free_port()
    store = S3Server(tmp_path, port=port)
    bucket = "down"
    settings = memory_settings(store, bucket, prefix="down")
    settings["memory.pool.bytes"] = "65536"
    broker = broker_factory(settings)
    topic = unique("memory-down")
    create_memory_topic(broker, topic)
    # Nothing listens where the store should be: no write is acknowledged.
    early = [f"early{i:03d}".ljust(100, "x") for i in range(30)]
    acked, failed = produce(broker, topic, early, {"message.timeout.ms": "3000", "request.timeout.ms": "2000"})
    assert acked == [], "a write was acknowledged with the store down"
    assert len(failed) == len(early)
    assert metric(broker, "weir_memory_flush_failures_total") > 0
    assert metric(broker, "weir_memory_pending_bytes") > 0

    store.start()
    try:
        store.client.create_bucket(Bucket=bucket)
        later = [f"later{i:03d}" for i in range(60)]  # 8 characters each
        acked, failed = produce(broker, topic, later)
        assert not failed and sorted(acked) == sorted(later)
        wait_until(lambda: metric(broker, "weir_memory_pending_bytes") == 0, what="the pool to drain")
        # The early writes were not acknowledged, but they were written (each of the client's
        # retries again): they reach the store too. At least once, never lost.
        everything = []
        for p in range(PARTITIONS):
            high = c_watermarks(broker, topic, p)[1]
            everything += [bytes(r.value).decode()[:8] for r in c_read_partition(broker.bootstrap, topic, p, high)]
        assert set(later) <= set(everything)
    finally:
        store.kill()


def test_memory_first_settings_are_checked(s3, broker_factory):
    bucket = unique("bucket")
    s3.client.create_bucket(Bucket=bucket)
    broker = broker_factory(memory_settings(s3, bucket, prefix="checks"))
    admin = c_admin(broker.bootstrap)

    def refused(topic, configs):
        future = admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1, config=configs)])[topic]
        try:
            future.result(timeout=30)
        except KafkaException as e:
            return str(e)
        raise AssertionError(f"{topic} was created with {configs}")

    assert "remote.storage.enable" in refused(unique("t"), {"storage.mode": "memory"})
    assert "disk or memory" in refused(unique("t"), {"storage.mode": "ram", "remote.storage.enable": "true"})
    topic = unique("memory")
    create_memory_topic(broker, topic)
    change = ConfigEntry("storage.mode", "disk", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[change])
    future = admin.incremental_alter_configs([resource])[resource]
    try:
        future.result(timeout=30)
        raise AssertionError("storage.mode changed")
    except KafkaException as e:
        assert "storage.mode cannot change" in str(e)


class StoreGate:
    """A TCP forwarder in front of the S3 server, closed (connections refused) and opened again
    at will: the store becomes unreachable while keeping what it holds."""

    def __init__(self, target_port):
        self.target_port = target_port
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.listener = None
        self.connections = []

    def open(self):
        self.listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()
        return self

    def close(self):
        listener, self.listener = self.listener, None
        listener.close()
        for conn in self.connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
        self.connections = []

    def _accept(self, listener):
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self.connections += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source, sink):
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            try:
                sink.shutdown(socket.SHUT_WR)
            except OSError:
                pass


def test_a_broker_starts_with_its_store_unreachable_and_loads_memory_first_partitions_once_it_answers(
        s3, broker_factory):
    """The store cannot be reached when the broker restarts: it starts anyway and serves its
    other topics; the memory-first topic takes no write and serves nothing until the store
    answers, then serves every record it had acknowledged."""
    bucket = unique("bucket")
    s3.client.create_bucket(Bucket=bucket)
    gate = StoreGate(s3.port).open()
    broker = broker_factory(memory_settings(gate, bucket, prefix="gate"))
    topic = unique("memory-gate")
    admin = create_memory_topic(broker, topic)
    plain = unique("plain")
    admin.create_topics([NewTopic(plain, num_partitions=1, replication_factor=1)])[plain].result(timeout=30)
    values = [f"v{i:04d}" for i in range(300)]
    acked, failed = produce(broker, topic, values)
    assert not failed and len(acked) == len(values)

    broker.kill9()
    gate.close()
    broker.start()
    # Other topics are served.
    producer = c_producer(broker.bootstrap, {"acks": "all"})
    producer.produce(plain, value=b"still here")
    assert producer.flush(30) == 0
    assert bytes(c_read_partition(broker.bootstrap, plain, 0, 1)[0].value) == b"still here"
    # The memory-first topic takes nothing.
    acked_down, _ = produce(broker, topic, ["down"] * 3, {"message.timeout.ms": "2000", "request.timeout.ms": "1000"})
    assert acked_down == [], "a write was acknowledged before the partition was loaded"

    gate.open()
    try:
        assert sorted(read_all(broker, topic, [100, 100, 100])) == sorted(values)
        later, failed = produce(broker, topic, [f"later{i}" for i in range(30)])
        assert not failed and len(later) == 30
    finally:
        gate.close()
