"""Tiered storage (docs/tiered-storage.md) against a real S3 API server.

The object store is moto's server mode (`python -m moto.server`, installed by scripts/test from
requirements-test.txt): a separate process speaking S3's HTTP API, which the broker reaches
through the `object_store` crate's S3 client, signatures and all. Nothing is mocked inside the
broker.

What it proves:
- Closed, committed segments of a topic with remote.storage.enable=true reach the bucket under
  the configured prefix, byte for byte, with their indexes and a manifest; the admin API,
  `weir topic describe` and /metrics show what is uploaded and what is still to go.
- Retention (DeleteRecords here) removes the segments it passes from the bucket too.
- The store going away never blocks producers: acks=all produce goes on; passes fail, are
  counted and shown; once the store is back the uploads resume where they stopped, and a
  kill -9 of the broker loses nothing the store holds (the restarted broker lists it).
- Bad settings get clear refusals: a tiered topic on a broker without tiering, turning tiering
  off, local.retention.ms above retention.ms, an unusable store URL at start-up. The secret key
  is never shown by DescribeConfigs.

Every wait is bounded.
"""

import json
import pathlib
import socket
import subprocess
import sys
import time

import boto3
import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import ConfigResource, NewTopic, ResourceType

from conftest import Broker, free_port, weir_bin
from helpers import c_admin, c_producer, c_read_partition, http, kp_admin, kp_read_partition, metric, unique, wait_until

ACCESS_KEY = "weir-test"
SECRET_KEY = "weir-test-secret"


class S3Server:
    """One moto server process on 127.0.0.1 and a boto3 client of it."""

    def __init__(self, workdir, port=None):
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = pathlib.Path(workdir) / f"moto-{self.port}.log"
        self.proc = None

    def start(self):
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + 30
        while True:
            assert self.proc.poll() is None, f"moto exited: {self.log_path.read_text()[-2000:]}"
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                assert time.monotonic() < deadline, "moto did not listen within 30 s"
                time.sleep(0.1)
        self.client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
        )
        return self

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def keys(self, bucket, prefix=""):
        keys = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys.extend(item["Key"] for item in page.get("Contents", []))
        return keys

    def get(self, bucket, key):
        return self.client.get_object(Bucket=bucket, Key=key)["Body"].read()


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("s3")).start()
    yield server
    server.kill()


def tiered_settings(s3, bucket, prefix="cluster-a"):
    return {
        "remote.log.storage.system.enable": "true",
        "object.store.url": f"s3://{bucket}/{prefix}",
        "object.store.endpoint": s3.endpoint,
        "object.store.access.key.id": ACCESS_KEY,
        "object.store.secret.access.key": SECRET_KEY,
        "object.store.path.style": "true",
        "remote.log.manager.task.interval.ms": "200",
    }


def create_tiered_topic(broker, topic, config=None):
    admin = c_admin(broker.bootstrap)
    configs = {"remote.storage.enable": "true", "segment.bytes": "4096", **(config or {})}
    futures = admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1, config=configs)])
    futures[topic].result(timeout=30)
    return admin


def produce(broker, topic, count, start=0, size=100):
    produce_to(broker.bootstrap, topic, count, start, size)


def produce_to(bootstrap, topic, count, start=0, size=100):
    """`count` numbered records to partition 0, one per batch, acks=all; all acknowledged."""
    producer = c_producer(bootstrap, {"acks": "all", "linger.ms": 0, "batch.num.messages": 1})
    errors = []
    for i in range(start, start + count):
        producer.produce(topic, value=f"{i:06d}".ljust(size, "x").encode(), partition=0,
                         on_delivery=lambda err, _msg: err and errors.append(err))
        producer.poll(0)
    assert producer.flush(60) == 0, "unacknowledged messages"
    assert not errors, errors[:3]


def remote(broker, topic):
    status, body = http("GET", f"{broker.admin_url()}/v1/topics/{topic}")
    assert status == 200, body
    return body["partitions"][0]["remote"]


def local_segment_files(broker, topic):
    """The .log files of the partition's local segments, by base offset."""
    directory = broker.data_dir / f"{topic}-0"
    return {int(p.stem): p for p in directory.glob("*.log")}


def uploaded(s3, bucket, prefix, topic):
    """Manifests in the bucket for the topic's partition 0, by base offset."""
    manifests = {}
    for key in s3.keys(bucket, f"{prefix}/{topic}-"):
        if key.endswith("/0/" + key.rsplit("/", 1)[-1]) and key.endswith(".manifest.json"):
            manifest = json.loads(s3.get(bucket, key))
            manifests[manifest["base_offset"]] = (key, manifest)
    return manifests


def test_closed_segments_reach_the_bucket_byte_for_byte_and_retention_removes_them(s3, broker_factory):
    bucket = unique("bucket")
    s3.client.create_bucket(Bucket=bucket)
    broker = broker_factory(tiered_settings(s3, bucket))
    topic = unique("tiered")
    admin = create_tiered_topic(broker, topic)
    produce(broker, topic, 300)

    # Every closed segment goes up: the store then ends where the active segment begins.
    def caught_up():
        r = remote(broker, topic)
        active = max(local_segment_files(broker, topic))
        return r["loaded"] and r["remote_end_offset"] == active and r["upload_lag_segments"] == 0

    wait_until(caught_up, timeout=60, what="every closed segment uploaded")
    r = remote(broker, topic)
    assert r["remote_start_offset"] == 0 and r["remote_segments"] >= 5, r
    assert r["upload_failures"] == 0 and "last_error" not in r, r

    manifests = uploaded(s3, bucket, "cluster-a", topic)
    assert len(manifests) == r["remote_segments"]
    local = local_segment_files(broker, topic)
    keys = set(s3.keys(bucket, "cluster-a/"))
    for base, (key, manifest) in manifests.items():
        stem = key[: -len(".manifest.json")]
        assert manifest["topic"] == topic and manifest["partition"] == 0
        assert manifest["uploaded_by"] == 0 and manifest["next_offset"] > base
        for suffix in (".log", ".index", ".timeindex"):
            assert stem + suffix in keys, f"{stem}{suffix} missing"
        body = s3.get(bucket, stem + ".log")
        assert body == local[base].read_bytes(), f"segment {base} differs from the local file"
        sizes = {f["kind"]: f["size"] for f in manifest["files"]}
        assert sizes["log"] == len(body)

    # Consumers read everything (the local copies stay: no local retention is set).
    records = c_read_partition(broker.bootstrap, topic, 0, 300)
    assert [bytes(r.value[:6]).decode() for r in records] == [f"{i:06d}" for i in range(300)]

    # The tier shows in the CLI and in /metrics.
    text = subprocess.run([str(weir_bin()), "topic", "describe", topic, "--admin", broker.admin_url()],
                          capture_output=True, text=True, timeout=60)
    assert text.returncode == 0, text.stderr
    assert "Object store (tiered storage):" in text.stdout, text.stdout
    assert metric(broker, "weir_remote_log_uploaded_segments_total") >= len(manifests)
    assert metric(broker, "weir_remote_log_upload_failures_total") == 0

    # The secret stays secret.
    described = admin.describe_configs([ConfigResource(ResourceType.BROKER, "0")])
    entries = list(described.values())[0].result(timeout=30)
    secret = entries["object.store.secret.access.key"]
    assert secret.is_sensitive and secret.value is None
    assert entries["object.store.access.key.id"].value == ACCESS_KEY

    # DeleteRecords moves the log start past two segments: they leave the bucket.
    bases = sorted(manifests)
    cut = bases[2]
    result = admin.delete_records([TopicPartition(topic, 0, cut)])
    list(result.values())[0].result(timeout=30)
    wait_until(lambda: remote(broker, topic)["remote_start_offset"] == cut, timeout=60,
               what="the store's start to follow the log start")
    left = set(s3.keys(bucket, "cluster-a/"))
    for base in bases[:2]:
        stem = manifests[base][0][: -len(".manifest.json")]
        assert not [k for k in left if k.startswith(stem)], f"segment {base} stayed in the bucket"
    assert metric(broker, "weir_remote_log_deleted_segments_total") == 2


def test_producers_carry_on_while_the_store_is_down_and_uploads_resume_after_it_and_a_kill_9(tmp_path, broker_factory):
    s3 = S3Server(tmp_path).start()
    try:
        bucket = unique("bucket")
        s3.client.create_bucket(Bucket=bucket)
        broker = broker_factory(tiered_settings(s3, bucket, prefix="outage"))
        topic = unique("outage")
        create_tiered_topic(broker, topic)
        produce(broker, topic, 100)
        wait_until(lambda: remote(broker, topic)["remote_segments"] >= 2, timeout=60, what="first uploads")

        # The store dies: acks=all produce is not slowed by it.
        s3.kill()
        started = time.monotonic()
        produce(broker, topic, 200, start=100)
        assert time.monotonic() - started < 20, "producing waited on the object store"
        wait_until(lambda: remote(broker, topic)["upload_failures"] > 0, timeout=60, what="a failed pass")
        r = remote(broker, topic)
        assert r["upload_lag_segments"] > 0 and r.get("last_error"), r

        # It comes back (empty: moto keeps nothing across a restart): the uploads resume after
        # what was uploaded before the outage, and nothing fails any more.
        end_before = r["remote_end_offset"]
        s3 = S3Server(tmp_path, port=s3.port).start()
        s3.client.create_bucket(Bucket=bucket)
        active = lambda: max(local_segment_files(broker, topic))  # noqa: E731
        wait_until(lambda: remote(broker, topic)["remote_end_offset"] == active()
                   and remote(broker, topic)["upload_lag_segments"] == 0, timeout=90, what="uploads to resume")
        assert "last_error" not in remote(broker, topic)
        resumed = uploaded(s3, bucket, "outage", topic)
        assert min(resumed) == end_before, f"resumed at {min(resumed)}, the store ended at {end_before}"

        # kill -9 and restart: the broker lists what the store holds and uploads nothing twice.
        broker.kill9()
        broker.start()
        wait_until(lambda: remote(broker, topic)["loaded"], timeout=60, what="the store listed again")
        r = remote(broker, topic)
        assert r["remote_start_offset"] == end_before and r["remote_end_offset"] == active(), r
        records = c_read_partition(broker.bootstrap, topic, 0, 300)
        assert [bytes(x.value[:6]).decode() for x in records] == [f"{i:06d}" for i in range(300)]
    finally:
        s3.kill()


def test_tiering_needs_the_broker_switch_and_cannot_be_turned_off(broker, broker_factory, tmp_path):
    admin = c_admin(broker.bootstrap)
    topic = unique("refused")
    futures = admin.create_topics([NewTopic(topic, 1, 1, config={"remote.storage.enable": "true"})])
    with pytest.raises(KafkaException) as refused:
        futures[topic].result(timeout=30)
    assert "remote.log.storage.system.enable" in str(refused.value), refused.value

    objects = tmp_path / "objects"
    tiered = broker_factory({"remote.log.storage.system.enable": "true", "object.store.url": f"file://{objects}",
                             "remote.log.manager.task.interval.ms": "200"})
    admin = create_tiered_topic(tiered, topic)
    status, body = http("PATCH", f"{tiered.admin_url()}/v1/topics/{topic}/configs",
                        {"set": {"remote.storage.enable": "false"}})
    assert status == 400 and "cannot be turned off" in body["error"]["message"], body
    futures = admin.create_topics([NewTopic(unique("local"), 1, 1, config={
        "remote.storage.enable": "true", "retention.ms": "60000", "local.retention.ms": "120000"})])
    with pytest.raises(KafkaException) as too_long:
        list(futures.values())[0].result(timeout=30)
    assert "local.retention.ms" in str(too_long.value), too_long.value

    # The file store: uploads land as files under the directory.
    produce(tiered, topic, 100)
    wait_until(lambda: list(objects.glob(f"{topic}-*/0/*.manifest.json")), timeout=60, what="a file-store upload")

    bad = Broker(tmp_path / "bad", settings={"remote.log.storage.system.enable": "true",
                                             "object.store.url": "gs://bucket"}, name="bad")
    proc = subprocess.run(bad.command(), capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "object.store.url" in proc.stderr, proc.stderr


def test_consumers_of_every_client_read_from_the_store_what_local_retention_deleted(s3, broker_factory):
    """local.retention.bytes keeps two segments on disk; librdkafka, kafka-python and kcat still
    read every record from offset 0, the older ones through the store (in chunks smaller than
    a segment, through a cache smaller than the data); a kill -9 and restart change nothing."""
    bucket = unique("bucket")
    s3.client.create_bucket(Bucket=bucket)
    settings = dict(tiered_settings(s3, bucket, prefix="reads"))
    settings.update({
        "log.retention.check.interval.ms": "200",
        "remote.log.read.ahead.bytes": "65536",
        "remote.log.cache.bytes": "1048576",
        "log.flush.offset.checkpoint.interval.ms": "200",
    })
    broker = broker_factory(settings)
    topic = unique("reads")
    create_tiered_topic(broker, topic, {"segment.bytes": "65536", "local.retention.bytes": "131072"})
    count = 8000
    produce(broker, topic, count)

    def local_retention_done():
        status, body = http("GET", f"{broker.admin_url()}/v1/topics/{topic}")
        partition = body["partitions"][0]
        return partition["remote"]["upload_lag_segments"] == 0 and partition["size_bytes"] <= 131072 + 65536

    wait_until(local_retention_done, timeout=60, what="local retention to delete uploaded segments")
    status, body = http("GET", f"{broker.admin_url()}/v1/topics/{topic}")
    assert body["partitions"][0]["log_start_offset"] == 0, body
    assert body["partitions"][0]["remote"]["local_log_start_offset"] > count // 2, body
    expected = [f"{i:06d}" for i in range(count)]

    def check_every_client():
        records = c_read_partition(broker.bootstrap, topic, 0, count)
        assert [bytes(r.value[:6]).decode() for r in records] == expected
        assert [r.offset for r in records] == list(range(count))
        # ListOffsets by timestamp finds records only the store holds (offsetsForTimes).
        local_start = remote(broker, topic)["local_log_start_offset"]
        for probe in (1, local_start // 3, local_start - 1, local_start + 1):
            target = records[probe].timestamp
            want = min(r.offset for r in records if r.timestamp >= target)
            consumer = c_consumer_plain(broker)
            try:
                found = consumer.offsets_for_times([TopicPartition(topic, 0, target)], timeout=30)[0]
            finally:
                consumer.close()
            assert found.offset == want, f"offsetsForTimes({target}) = {found.offset}, want {want} (probe {probe})"
        records = kp_read_partition(broker.bootstrap, topic, 0, count)
        assert [bytes(r.value[:6]).decode() for r in records] == expected
        kcat = subprocess.run(["kcat", "-C", "-b", broker.bootstrap, "-t", topic, "-p", "0", "-o", "beginning", "-e",
                               "-f", "%o\n"], capture_output=True, text=True, timeout=60)
        assert kcat.returncode == 0, kcat.stderr
        assert [int(x) for x in kcat.stdout.split()] == list(range(count))
        low, high = c_watermarks(broker, topic)
        assert (low, high) == (0, count)

    check_every_client()
    assert metric(broker, "weir_remote_log_read_bytes_total") > 0
    assert metric(broker, "weir_remote_log_cache_bytes") <= 1048576
    assert metric(broker, "weir_remote_log_cache_misses_total") > 1, "reads spanned several chunks"

    # kill -9, and a restart whose tier pass would come only in 10 minutes: the log start comes
    # back from its checkpoint, and the store serves the reads before any pass lists it.
    time.sleep(0.5)
    broker.kill9()
    broker.settings["remote.log.manager.task.interval.ms"] = "600000"
    broker.start()
    check_every_client()


def c_watermarks(broker, topic, partition=0):
    consumer = c_consumer_plain(broker)
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
    finally:
        consumer.close()


def c_consumer_plain(broker):
    return Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique("g"), "enable.auto.commit": False})


def test_a_new_leader_serves_from_the_shared_store_what_every_replica_deleted_locally(s3, cluster_factory):
    """Three nodes share one bucket. The leader uploads; followers list the store, so local
    retention trims every replica; after the leader is killed, a new leader serves a consumer
    reading from offset 0 through the store."""
    bucket = unique("bucket")
    s3.client.create_bucket(Bucket=bucket)
    settings = dict(tiered_settings(s3, bucket, prefix="cluster"))
    settings["log.retention.check.interval.ms"] = "200"
    c = cluster_factory(settings=settings)
    topic = unique("moved")
    admin = c_admin(c.bootstrap())
    configs = {"remote.storage.enable": "true", "segment.bytes": "65536", "local.retention.bytes": "131072",
               "min.insync.replicas": "2"}
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=3, config=configs)])[topic].result(30)
    c.wait_topic(topic, 1)
    count = 4000
    produce_to(c.bootstrap(), topic, count)

    def local_segments(node):
        return sorted((node.data_dir / f"{topic}-0").glob("*.log"))

    # Every replica keeps only its tail (at most local.retention.bytes plus a segment and the
    # active one): the followers learned from the shared store what the leader uploaded.
    c.wait(lambda: all(len(local_segments(n)) <= 4 for n in c.nodes.values()), 90,
           "local retention on every replica")
    assert all(local_segments(n)[0].stem != "0" * 20 for n in c.nodes.values())

    leader = c.metadata(c.ids()[0], [topic]).topics[topic].leaders()[0]
    c.node(leader).kill9()
    survivors = [i for i in c.ids() if i != leader]
    c.wait(lambda: c.metadata(survivors[0], [topic]).topics[topic].leaders()[0] in survivors, 30, "a new leader")
    records = c_read_partition(c.bootstrap(survivors), topic, 0, count)
    assert [bytes(r.value[:6]).decode() for r in records] == [f"{i:06d}" for i in range(count)]


def list_offset(c, node_id, topic, timestamp):
    """ListOffsets of partition 0 at one node, raw (the Python clients lack -4 and -5)."""
    from kafka.protocol.list_offsets import ListOffsetsRequest

    raw = c.raw(node_id)
    try:
        response = raw.request(ListOffsetsRequest[4](replica_id=-1, isolation_level=0,
                                                     topics=[(topic, [(0, -1, timestamp)])]))
    finally:
        raw.close()
    [(_, [(_, error, _timestamp, offset, _epoch)])] = response.topics
    assert error == 0, error
    return offset


def test_a_new_replica_starts_where_the_store_ends_and_serves_the_rest_from_it(s3, cluster_factory, tmp_path):
    """KIP-405's followers: a replica added by a reassignment does not copy what the store
    holds. The leader answers its fetch of offset 0 with OFFSET_MOVED_TO_TIERED_STORAGE; it
    starts where the store ends, joins the ISR, and once it leads (a preferred election) serves
    every record from offset 0 (the older ones through the store). ListOffsets EARLIEST_LOCAL (-4) and
    LATEST_TIERED (-5) answer its local start and the store's last offset."""
    bucket = unique("bucket")
    s3.client.create_bucket(Bucket=bucket)
    settings = dict(tiered_settings(s3, bucket, prefix="replicas"))
    settings["log.retention.check.interval.ms"] = "200"
    c = cluster_factory(settings=settings)
    topic = unique("grown")
    from kafka.admin import NewTopic as KpNewTopic

    configs = {"remote.storage.enable": "true", "segment.bytes": "65536", "local.retention.bytes": "131072"}
    admin = kp_admin(c.bootstrap())
    try:
        admin.create_topics([KpNewTopic(topic, num_partitions=-1, replication_factor=-1, replica_assignments={0: [1, 2]},
                                        topic_configs=configs)], timeout_ms=30000)
    finally:
        admin.close()
    c.wait_topic(topic, 1)
    count = 4000
    produce_to(c.bootstrap(), topic, count)

    def local_bases(node):
        return sorted(int(p.stem) for p in (node.data_dir / f"{topic}-0").glob("*.log"))

    c.wait(lambda: all(local_bases(c.node(n))[0] > 0 for n in (1, 2)), 90, "local retention on both replicas")

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [{"topic": topic, "partition": 0, "replicas": [3, 1, 2]}]}))
    env = {"WEIR_ADMIN": c.node(1).admin_url(), "PATH": "/usr/bin:/bin"}
    moved = subprocess.run([str(weir_bin()), "partition", "reassign", "--plan", str(plan), "--wait", "--timeout", "60"],
                           capture_output=True, text=True, env=env, timeout=90)
    assert moved.returncode == 0, moved.stderr
    status, described = http("GET", f"{c.node(1).admin_url()}/v1/topics/{topic}")
    assert sorted(described["partitions"][0]["isr"]) == [1, 2, 3], described
    new_start = local_bases(c.node(3))[0]
    assert new_start > 0, "the new replica copied the store's part"
    # It holds only the tail: what it copied is about what the leader keeps locally.
    copied = sum(p.stat().st_size for p in (c.node(3).data_dir / f"{topic}-0").glob("*.log"))
    assert copied < 400_000, copied

    # Node 3, the preferred replica now, leads and serves everything, with node 1 gone.
    elected = subprocess.run([str(weir_bin()), "partition", "elect", "--topic", topic, "--partition", "0"],
                             capture_output=True, text=True, env=env, timeout=60)
    assert elected.returncode == 0, elected.stderr
    c.wait(lambda: c.metadata(3, [topic]).topics[topic].leaders()[0] == 3, 30, "node 3 to lead")
    c.node(1).kill9()
    records = c_read_partition(c.bootstrap([3]), topic, 0, count)
    assert [bytes(r.value[:6]).decode() for r in records] == [f"{i:06d}" for i in range(count)]
    assert list_offset(c, 3, topic, -2) == 0
    assert list_offset(c, 3, topic, -4) == new_start
    latest_tiered = list_offset(c, 3, topic, -5)
    assert new_start - 1 <= latest_tiered < count, (new_start, latest_tiered)


def test_rocketmq_consumers_and_max_timestamp_see_the_stores_part_of_a_tiered_topic(s3, broker_factory):
    """What the broker reads for itself reaches into the store too: a new RocketMQ group
    starting at the oldest message receives every message, the older ones only the store holds
    (it used to start at the local log start, silently); ListOffsets MAX_TIMESTAMP finds the
    record with the largest timestamp when only the store holds it."""
    from confluent_kafka.admin import OffsetSpec

    from test_rocketmq import simple_consumer

    bucket = unique("bucket")
    s3.client.create_bucket(Bucket=bucket)
    settings = dict(tiered_settings(s3, bucket, prefix="own-reads"))
    settings["log.retention.check.interval.ms"] = "200"
    broker = broker_factory(settings)
    topic = unique("own-reads")
    admin = create_tiered_topic(broker, topic, {"segment.bytes": "8192", "local.retention.bytes": "16384"})
    count, late = 600, 7
    now_ms = int(time.time() * 1000)
    producer = c_producer(broker.bootstrap, {"acks": "all", "linger.ms": 0, "batch.num.messages": 1})
    for i in range(count):
        # One record far later than every other: the partition's MAX_TIMESTAMP.
        timestamp = now_ms + 600_000 if i == late else now_ms + i
        producer.produce(topic, value=f"m{i:05d}".ljust(100, "x").encode(), partition=0, timestamp=timestamp)
        producer.poll(0)
    assert producer.flush(30) == 0

    def local_start():
        status, body = http("GET", f"{broker.admin_url()}/v1/topics/{topic}")
        return body["partitions"][0]["remote"]["local_log_start_offset"]

    wait_until(lambda: local_start() > 100, timeout=60, what="local retention to delete uploaded segments")
    assert c_watermarks(broker, topic) == (0, count)

    found = admin.list_offsets({TopicPartition(topic, 0): OffsetSpec.max_timestamp()})
    answer = found[TopicPartition(topic, 0)].result(timeout=30)
    assert (answer.offset, answer.timestamp) == (late, now_ms + 600_000), answer

    consumer = simple_consumer(broker, unique("g"), topic, await_s=1)
    try:
        got = []
        deadline = time.monotonic() + 60
        while len(got) < count and time.monotonic() < deadline:
            for m in consumer.receive(32, 30):
                got.append(bytes(m.body[:6]).decode())
                consumer.ack(m)
    finally:
        consumer.shutdown()
    assert sorted(got) == [f"m{i:05d}" for i in range(count)]
    assert metric(broker, "weir_remote_log_read_bytes_total") > 0


def test_a_compacted_topic_is_tiered_and_compacted_in_the_store_too(s3, broker_factory):
    """Kafka refuses to tier compacted topics; Weir compacts the store's part too. 30 rounds over
    20 keys go to a compacted, tiered topic that keeps 8 KiB on disk; once the store's part is
    compacted, librdkafka and kcat read from offset 0 to the end across the gaps compaction
    left, every key ends at its last value, and the store holds far fewer records than were
    written."""
    bucket = unique("bucket")
    s3.client.create_bucket(Bucket=bucket)
    settings = dict(tiered_settings(s3, bucket, prefix="compacted"))
    settings["log.retention.check.interval.ms"] = "200"
    broker = broker_factory(settings)
    topic = unique("compacted")
    create_tiered_topic(broker, topic, {
        "cleanup.policy": "compact", "segment.bytes": "4096", "local.retention.bytes": "8192",
        "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "0",
    })
    rounds, keys = 30, 20
    producer = c_producer(broker.bootstrap, {"acks": "all", "linger.ms": 0, "batch.num.messages": 1})
    for r in range(rounds):
        for k in range(keys):
            producer.produce(topic, key=f"k{k:02d}".encode(), value=f"{k}-{r}".ljust(80, "x").encode(), partition=0)
        producer.poll(0)
    assert producer.flush(30) == 0
    written = rounds * keys

    def compacted():
        status, body = http("GET", f"{broker.admin_url()}/v1/topics/{topic}")
        tier = body["partitions"][0]["remote"]
        return tier["compacted_segments"] > 0 and tier["local_log_start_offset"] > written // 3 and tier

    tier = wait_until(compacted, timeout=60, what="the store's part to be compacted")
    assert tier["compacted_records"] > 0
    low, high = c_watermarks(broker, topic)
    assert (low, high) == (0, written)

    consumer = c_consumer_plain(broker)
    latest, count = {}, 0
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is None or m.error():
                if consumer.position([TopicPartition(topic, 0)])[0].offset >= high:
                    break
                continue
            latest[m.key().decode()] = bytes(m.value()).decode().rstrip("x")
            count += 1
            if m.offset() == high - 1:
                break
    finally:
        consumer.close()
    assert latest == {f"k{k:02d}": f"{k}-{rounds - 1}" for k in range(keys)}
    assert count < written, f"read {count} records of {written}: nothing was compacted"
    kcat = subprocess.run(["kcat", "-C", "-b", broker.bootstrap, "-t", topic, "-p", "0", "-o", "beginning", "-e",
                           "-f", "%k=%s\n"], capture_output=True, text=True, timeout=60)
    assert kcat.returncode == 0, kcat.stderr
    last = {}
    for line in kcat.stdout.split():
        key, value = line.split("=", 1)
        last[key] = value.rstrip("x")
    assert last == latest
    assert metric(broker, "weir_remote_log_compacted_records_total") == tier["compacted_records"] or \
        metric(broker, "weir_remote_log_compacted_records_total") >= tier["compacted_records"]
