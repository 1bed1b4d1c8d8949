"""The native write protocol (docs/native-protocol.md) through `weir produce --native`, which
drives the `weir-client` crate's producer, against the real broker.

What it proves:
- kill -9 of the broker in the middle of a stream of a memory-first topic: no line at or below
  a reported checkpoint is lost, no line is stored twice, order holds, and only lines the broker
  had not persisted are sent again; the checkpoints the producer reports only move forward;
- the same producer on a page-cache topic (C is the high watermark there);
- SessionWrite frames the broker cannot take are answered with an error, not a closed
  connection or a crash: an unknown version, a cut-short body, a batch of another producer id.

Every wait is bounded.
"""

import json
import os
import socket
import struct
import subprocess
import threading
import time

import pytest
from confluent_kafka.admin import NewTopic

from conftest import weir_bin
from helpers import c_admin, c_read_partition, unique, wait_until
from test_tiered_storage import S3Server, s3, tiered_settings  # noqa: F401 (the fixture)

LINES = 3000
SESSION_WRITE_KEY = 22341


def memory_broker(broker_factory):
    # The embedded object store (a directory) is enough here: the S3 path is proven by
    # test_memory_first.py.
    return broker_factory({"remote.log.storage.system.enable": "true", "memory.flush.ms": "50"})


def create_topic(broker, topic, config):
    admin = c_admin(broker.bootstrap)
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1, config=config)])[topic].result(
        timeout=30)


class NativeProducer:
    """`weir produce --native --json` on partition 0, fed lines `line-<n>` by a thread (at a
    pace that keeps the stream going through a broker restart), its JSON lines collected."""

    def __init__(self, bootstrap, topic, lines=LINES, per_tick=50, tick_s=0.03):
        self.proc = subprocess.Popen(
            [str(weir_bin()), "produce", topic, "--native", "--bootstrap", bootstrap, "--partition", "0",
             "--json"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.written = 0
        self.checkpoints = []
        self.summary = None
        self.feeder = threading.Thread(target=self._feed, args=(lines, per_tick, tick_s), daemon=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.feeder.start()
        self.reader.start()

    def _feed(self, lines, per_tick, tick_s):
        try:
            for n in range(lines):
                self.proc.stdin.write(f"line-{n}\n")
                self.written = n + 1
                if n % per_tick == per_tick - 1:
                    self.proc.stdin.flush()
                    time.sleep(tick_s)
            self.proc.stdin.close()
        except BrokenPipeError:
            pass

    def _read(self):
        for line in self.proc.stdout:
            record = json.loads(line)
            if "checkpoint" in record:
                self.checkpoints.append(record)
            else:
                self.summary = record

    def persisted_sequence(self):
        return max((c["sequence"] for c in self.checkpoints if c["sequence"] is not None), default=-1)

    def finish(self, timeout=90):
        self.feeder.join(timeout)
        rc = self.proc.wait(timeout)
        self.reader.join(10)
        assert rc == 0, f"weir produce --native failed ({rc}): {self.proc.stderr.read()}"
        assert self.summary is not None, "no summary printed"
        return self.summary


def assert_checkpoints_only_move_forward(checkpoints):
    offsets = [c["checkpoint"] for c in checkpoints]
    sequences = [c["sequence"] for c in checkpoints if c["sequence"] is not None]
    assert offsets == sorted(offsets), f"a checkpoint moved back: {offsets}"
    assert sequences == sorted(sequences), f"a persisted sequence moved back: {sequences}"


def lines_in_order(bootstrap, topic, count):
    records = c_read_partition(bootstrap, topic, 0, count)
    return [int(bytes(r.value).decode().removeprefix("line-")) for r in records]


def test_a_native_producer_resends_only_what_a_killed_broker_had_not_persisted(broker_factory):
    broker = memory_broker(broker_factory)
    topic = unique("native")
    create_topic(broker, topic, {"storage.mode": "memory", "remote.storage.enable": "true"})
    producer = NativeProducer(broker.bootstrap, topic)
    wait_until(lambda: producer.persisted_sequence() >= 600, timeout=60, what="a checkpoint past line 600")

    broker.kill9()
    persisted_at_kill = producer.persisted_sequence()
    stamps_before = {c["load_stamp"] for c in producer.checkpoints}
    time.sleep(0.5)
    # Lines fed by now may have gone into the dead broker's socket; later ones go to the new one.
    written_at_restart = producer.written
    broker.start()
    summary = producer.finish()

    assert summary["produced"] == LINES
    assert summary["stale_sessions"] >= 1, f"the restart went unnoticed: {summary}"
    # Only what the broker had not persisted is sent again: never a line at or below the
    # checkpoint reported before the kill.
    assert summary["resent"] <= written_at_restart - (persisted_at_kill + 1), (
        summary, written_at_restart, persisted_at_kill)
    assert summary["resent"] == 0 or summary["lowest_resent"] > persisted_at_kill, (summary, persisted_at_kill)
    assert_checkpoints_only_move_forward(producer.checkpoints)
    assert {c["load_stamp"] for c in producer.checkpoints} - stamps_before, "no checkpoint from the new load"
    assert producer.persisted_sequence() == LINES - 1

    # Every line once, in order; nothing at or below the pre-kill checkpoint lost.
    stored = lines_in_order(broker.bootstrap, topic, LINES)
    assert stored == list(range(LINES)), (
        f"lost {sorted(set(range(LINES)) - set(stored))[:10]}, duplicated "
        f"{[n for n in set(stored) if stored.count(n) > 1][:10]}")


@pytest.mark.parametrize("move", ["kill", "reassign"])
def test_a_memory_first_partition_moves_in_the_middle_of_a_stream_and_the_producer_resends_only_the_rest(
        move, s3, cluster_factory, tmp_path):
    """Three nodes share one bucket. In the middle of a native stream, the memory-first
    partition (one replica) moves to another broker: its broker is killed for good (the
    controller moves it to a live broker), or it is reassigned. The new broker loads it from
    the store and serves it. The producer resends only lines after its last checkpoint; every
    line is there once, in order."""
    bucket = unique("bucket")
    s3.client.create_bucket(Bucket=bucket)
    settings = dict(tiered_settings(s3, bucket, prefix="moves"))
    settings["memory.flush.ms"] = "50"
    c = cluster_factory(settings=settings)
    topic = unique("moving")
    admin = c_admin(c.bootstrap())
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1, config={
        "storage.mode": "memory", "remote.storage.enable": "true"})])[topic].result(30)
    c.wait_topic(topic, 1)
    home = c.metadata(c.ids()[0], [topic]).topics[topic].leaders()[0]
    others = [i for i in c.ids() if i != home]

    producer = NativeProducer(c.bootstrap(), topic)
    wait_until(lambda: producer.persisted_sequence() >= 600, timeout=60, what="a checkpoint past line 600")
    if move == "kill":
        c.node(home).kill9()
        persisted_before = producer.persisted_sequence()
    else:
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps({"version": 1, "partitions": [
            {"topic": topic, "partition": 0, "replicas": [others[0]]}]}))
        persisted_before = producer.persisted_sequence()
        done = subprocess.run([str(weir_bin()), "partition", "reassign", "--plan", str(plan), "--wait", "--timeout",
                               "60", "--admin", c.node(others[0]).admin_url()],
                              capture_output=True, text=True, timeout=90)
        assert done.returncode == 0, done.stdout + done.stderr
    c.wait(lambda: c.metadata(others[0], [topic]).topics[topic].leaders()[0] in others, 30,
           "the partition moved to another broker")
    summary = producer.finish()

    assert summary["produced"] == LINES and summary["stale_sessions"] >= 1, summary
    assert summary["resent"] == 0 or summary["lowest_resent"] > persisted_before, (summary, persisted_before)
    assert_checkpoints_only_move_forward(producer.checkpoints)
    stored = lines_in_order(c.bootstrap(others), topic, LINES)
    assert stored == list(range(LINES)), (
        f"lost {sorted(set(range(LINES)) - set(stored))[:10]}, duplicated "
        f"{[n for n in set(stored) if stored.count(n) > 1][:10]}")


def test_a_native_producer_on_a_page_cache_topic_is_persisted_at_the_high_watermark(broker):
    topic = unique("native-plain")
    create_topic(broker, topic, {})
    lines = "".join(f"line-{n}\n" for n in range(500))
    done = subprocess.run(
        [str(weir_bin()), "produce", topic, "--native", "--bootstrap", broker.bootstrap, "--partition", "0", "--json"],
        input=lines, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = [json.loads(line) for line in done.stdout.splitlines()]
    assert out[-1]["produced"] == 500 and out[-1]["resent"] == 0
    assert max(c["sequence"] for c in out[:-1] if c.get("sequence") is not None) == 499
    assert lines_in_order(broker.bootstrap, topic, 500) == list(range(500))


def test_a_native_producer_routes_by_logical_partition_on_an_elastic_topic(broker):
    """Logical partition 20000 of an elastic topic of 8 stable partitions lives in stable
    partition 20000 // (65536 // 8) = 2, where the native producer puts it."""
    topic = unique("native-elastic")
    env = dict(os.environ, WEIR_ADMIN=broker.admin_url())
    created = subprocess.run([str(weir_bin()), "topic", "create", topic, "--elastic", "--partitions", "2",
                              "--stable-partitions", "8"], capture_output=True, text=True, env=env, timeout=60)
    assert created.returncode == 0, created.stderr
    lines = "".join(f"line-{n}\n" for n in range(200))
    done = subprocess.run(
        [str(weir_bin()), "produce", topic, "--native", "--bootstrap", broker.bootstrap, "--logical-partition",
         "20000", "--json"], input=lines, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["partition"] for line in done.stdout.splitlines()[:-1]] == [2] * (
        len(done.stdout.splitlines()) - 1)
    records = c_read_partition(broker.bootstrap, topic, 2, 200)
    assert [bytes(r.value).decode() for r in records] == [f"line-{n}" for n in range(200)]


def session_write(sock, correlation_id, body, version=0):
    header = struct.pack(">hhih", SESSION_WRITE_KEY, version, correlation_id, 4) + b"test"
    frame = header + body
    sock.sendall(struct.pack(">i", len(frame)) + frame)
    size = struct.unpack(">i", recv_exactly(sock, 4))[0]
    response = recv_exactly(sock, size)
    got_correlation, error_code = struct.unpack(">ih", response[:6])
    assert got_correlation == correlation_id
    return error_code, response[6:]


def recv_exactly(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "the broker closed the connection"
        data += chunk
    return data


def request_body(topic, records=None, producer_id=1):
    name = topic.encode()
    body = struct.pack(">h", len(name)) + name + struct.pack(">iqqqqi", 0, -1, -1, producer_id, -1, 0)
    if records is None:
        return body + struct.pack(">i", -1)
    return body + struct.pack(">i", len(records)) + records


def test_session_writes_the_broker_cannot_take_get_an_error_answer(broker):
    topic = unique("native-bad")
    create_topic(broker, topic, {})
    host, port = broker.bootstrap.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        code, _ = session_write(sock, 1, request_body(topic), version=7)
        assert code == 35, "an unknown version is UNSUPPORTED_VERSION"
        code, _ = session_write(sock, 2, request_body(topic)[:-3])
        assert code == 42, "a cut-short body is INVALID_REQUEST"
        # A batch header (61 bytes) whose producer id (at byte 43) is not the writer's.
        batch = bytearray(61)
        batch[43:51] = struct.pack(">q", 99)
        code, _ = session_write(sock, 3, request_body(topic, bytes(batch), producer_id=5))
        assert code == 87, "another producer's batch is INVALID_RECORD"
        code, _ = session_write(sock, 4, request_body("no-such-topic"))
        assert code == 3, "UNKNOWN_TOPIC_OR_PARTITION"
        # The connection still serves: an empty write opens a session and says where it stands.
        code, rest = session_write(sock, 5, request_body(topic))
        assert code == 0
        message_len = struct.unpack(">h", rest[:2])[0]
        version, load_stamp, checkpoint = struct.unpack(">qqq", rest[2 + max(message_len, 0):][:24])
        assert version >= 0 and load_stamp > 0 and checkpoint == 0
