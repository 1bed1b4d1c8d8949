"""kcat (librdkafka's command-line client): metadata listing, produce/consume, keys, headers."""

import json
import shutil
import subprocess
import time

from helpers import c_admin, c_create_topic, c_produce, c_producer, c_read_partition, unique, wait_for_topic

KCAT = shutil.which("kcat")


def kcat(broker, *args, stdin=None, timeout=30):
    """Runs kcat against the broker; fails with its output unless it exits 0."""
    assert KCAT is not None, "kcat is not installed (apt-get install kcat)"
    cmd = [KCAT, "-b", broker.bootstrap, "-m", "10", *args]
    proc = subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} exited {proc.returncode}\nstdout: {proc.stdout.decode(errors='replace')}\n"
        f"stderr: {proc.stderr.decode(errors='replace')}"
    )
    return proc.stdout.decode()


def consume_json(broker, topic):
    out = kcat(broker, "-C", "-t", topic, "-o", "beginning", "-e", "-J")
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_kcat_lists_broker_and_topics(broker):
    topic = c_create_topic(c_admin(broker.bootstrap), unique("kcat-list"), partitions=3)

    text = kcat(broker, "-L")
    assert " 1 brokers:" in text
    assert f"broker 0 at 127.0.0.1:{broker.port} (controller)" in text
    assert f'topic "{topic}" with 3 partitions:' in text
    assert "partition 2, leader 0, replicas: 0, isrs: 0" in text

    md = json.loads(kcat(broker, "-L", "-J"))
    assert md["brokers"] == [{"id": 0, "name": f"127.0.0.1:{broker.port}"}]
    assert md["controllerid"] == 0
    [t] = [t for t in md["topics"] if t["topic"] == topic]
    assert [
        (p["partition"], p["leader"], [r["id"] for r in p["replicas"]], [r["id"] for r in p["isrs"]])
        for p in sorted(t["partitions"], key=lambda p: p["partition"])
    ] == [(0, 0, [0], [0]), (1, 0, [0], [0]), (2, 0, [0], [0])]


def test_kcat_produce_then_consume_with_keys(broker):
    topic = c_create_topic(c_admin(broker.bootstrap), unique("kcat-rt"))
    kcat(broker, "-P", "-t", topic, "-p", "0", "-K:", stdin=b"alpha:1\nbeta:2\ngamma:3:with:colons\n")

    records = consume_json(broker, topic)
    assert [(r["partition"], r["offset"], r["key"], r["payload"]) for r in records] == [
        (0, 0, "alpha", "1"),
        (0, 1, "beta", "2"),
        (0, 2, "gamma", "3:with:colons"),
    ]
    out = kcat(broker, "-C", "-t", topic, "-o", "beginning", "-e", "-f", "%k=%s@%o\n")
    assert out.splitlines() == ["alpha=1@0", "beta=2@1", "gamma=3:with:colons@2"]

    # Another client sees the same keys and values.
    got = c_read_partition(broker.bootstrap, topic, 0, 3)
    assert [(r.key, r.value) for r in got] == [(b"alpha", b"1"), (b"beta", b"2"), (b"gamma", b"3:with:colons")]


def test_kcat_reads_what_confluent_wrote_and_consumes_from_an_offset(broker, closer):
    topic = c_create_topic(c_admin(broker.bootstrap), unique("kcat-off"))
    producer = closer.add(c_producer(broker.bootstrap))
    c_produce(producer, topic, [{"key": f"k{i}".encode(), "value": f"v{i}".encode()} for i in range(10)], partition=0)
    out = kcat(broker, "-C", "-t", topic, "-p", "0", "-o", "7", "-e", "-f", "%k %s %o\n")
    assert out.splitlines() == ["k7 v7 7", "k8 v8 8", "k9 v9 9"]
    out = kcat(broker, "-C", "-t", topic, "-p", "0", "-o", "-2", "-e", "-f", "%o\n")
    assert out.splitlines() == ["8", "9"]


def test_kcat_headers_and_topic_auto_creation(broker):
    topic = unique("kcat-auto")  # not created: producing to it creates it (auto.create.topics.enable)
    kcat(broker, "-P", "-t", topic, "-H", "trace=abc", "-H", "n=1", stdin=b"x\ny\n")

    admin = c_admin(broker.bootstrap)
    wait_for_topic(admin, topic, 1)  # num.partitions defaults to 1, as in Kafka
    records = consume_json(broker, topic)
    assert [(r["offset"], r["payload"], r["headers"]) for r in records] == [
        (0, "x", ["trace", "abc", "n", "1"]),
        (1, "y", ["trace", "abc", "n", "1"]),
    ]


def test_kcat_query_offset_by_timestamp(broker, closer):
    topic = c_create_topic(c_admin(broker.bootstrap), unique("kcat-q"))
    producer = closer.add(c_producer(broker.bootstrap, {"linger.ms": 0}))
    base = int(time.time() * 1000) - 60_000
    for i in range(4):
        c_produce(producer, topic, [{"value": f"m{i}".encode(), "timestamp": base + 1000 * i}], partition=0)
    out = kcat(broker, "-Q", "-t", f"{topic}:0:{base + 1500}")
    assert f"{topic} [0] offset 2" in out, out
