"""Kafka share groups (KIP-932, queues for Kafka) with librdkafka's ShareConsumer: several
consumers share a partition record by record, acknowledge with ACCEPT, RELEASE or REJECT, get
a record back when its acquisition lock runs out, and lose it to the dead-letter topic past the
delivery count limit. A share group and a RocketMQ group of the same name are one group, and a
classic consumer cannot join a share group.

The broker hands records out through its invisible-time engine (the one RocketMQ's
SimpleConsumer uses); see docs/kafka.md, "Share groups". Every wait is bounded."""

import os
import subprocess
import time

import pytest
from confluent_kafka import AcknowledgeType, Consumer, KafkaError, KafkaException, ShareConsumer

from conftest import weir_bin
from helpers import c_admin, c_create_topic, c_produce, c_producer, unique
from test_rocketmq import message, send_all, simple_consumer
from test_rocketmq_messaging import read_to_end

WAIT_S = 30
SETTINGS = {"group.share.heartbeat.interval.ms": "500"}


@pytest.fixture
def share_broker(broker_factory):
    return broker_factory(settings=SETTINGS)


def weir(broker, *args):
    env = {**os.environ, "WEIR_ADMIN": broker.admin_url()}
    done = subprocess.run([str(weir_bin()), *args], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, f"weir {' '.join(args)}: {done.stderr}"
    return done.stdout


def share_group(broker, **configs):
    """A new group name with these group configs (dots for underscores), starting at the
    earliest record."""
    group = unique("sg")
    configs.setdefault("share_auto_offset_reset", "earliest")
    args = []
    for name, value in configs.items():
        args += ["--config", f"{name.replace('_', '.')}={value}"]
    weir(broker, "group", "create", group, *args)
    return group


def new_topic(broker, partitions=1):
    topic = unique("share")
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=partitions)
    return topic


def produce(broker, topic, n, prefix="v"):
    producer = c_producer(broker.bootstrap)
    c_produce(producer, topic, [{"value": f"{prefix}{i}".encode()} for i in range(n)], partition=0)
    return [f"{prefix}{i}" for i in range(n)]


def share_consumer(broker, group, topic, name="share"):
    consumer = ShareConsumer({
        "bootstrap.servers": broker.bootstrap,
        "group.id": group,
        "client.id": name,
        "share.acknowledgement.mode": "explicit",
    })
    consumer.subscribe([topic])
    return consumer


def poll_some(consumer, timeout=1.0):
    """The records of one poll (errors fail the test)."""
    got = []
    for m in consumer.poll(timeout) or []:
        if m.error():
            raise AssertionError(f"share consumer error: {m.error()}")
        got.append(m)
    return got


def poll_until(consumer, want, ack=AcknowledgeType.ACCEPT, timeout=WAIT_S):
    """Polls (acknowledging each record with `ack`, committing after each poll) until `want`
    records came; returns them."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        batch = poll_some(consumer)
        for m in batch:
            consumer.acknowledge(m, ack)
        if batch:
            consumer.commit_sync()
        got += batch
    assert len(got) >= want, f"only {len(got)} of {want} records came: {[m.value() for m in got]}"
    return got


def values(messages):
    return sorted(m.value().decode() for m in messages)


def test_consumers_sharing_one_partition_each_get_a_record_once(share_broker):
    topic, group = new_topic(share_broker), share_group(share_broker)
    consumers = [share_consumer(share_broker, group, topic, f"c{i}") for i in range(3)]
    try:
        sent = produce(share_broker, topic, 60)
        got = {i: [] for i in range(3)}
        deadline = time.monotonic() + WAIT_S
        while sum(len(v) for v in got.values()) < 60 and time.monotonic() < deadline:
            for i, c in enumerate(consumers):
                batch = poll_some(c, 0.3)
                for m in batch:
                    c.acknowledge(m, AcknowledgeType.ACCEPT)
                if batch:
                    c.commit_sync()
                got[i] += batch
        everything = [v for batch in got.values() for v in values(batch)]
        assert sorted(everything) == sorted(sent), "every record exactly once across the consumers"
        assert all(m.delivery_count() == 1 for batch in got.values() for m in batch)
        # All three are members sharing the one partition; everything is done: start offset 60,
        # no lag, nothing in flight.
        described = weir(share_broker, "group", "describe", group)
        assert "Protocol: share (simple)   Members: 3   Total lag: 0" in described, described
        assert "IN-FLIGHT" in described, described
        row = next(line.split() for line in described.splitlines() if line.startswith(topic))
        assert row[1:5] == ["0", "60", "60", "0"] and row[-1] == "0", described
        # The same over the Kafka port (ShareGroupDescribe, DescribeShareGroupOffsets).
        env = {k: v for k, v in os.environ.items() if k != "WEIR_ADMIN"}
        env["WEIR_BOOTSTRAP"] = share_broker.bootstrap
        done = subprocess.run([str(weir_bin()), "group", "describe", group], capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "Protocol: share (simple)   Members: 3   Total lag: 0" in done.stdout, done.stdout
        row = next(line.split() for line in done.stdout.splitlines() if line.startswith(topic))
        assert row[1:5] == ["0", "60", "60", "0"], done.stdout
    finally:
        for c in consumers:
            c.close()


def test_release_redelivers_with_a_higher_count_and_reject_dead_letters(share_broker):
    topic, group = new_topic(share_broker), share_group(share_broker)
    produce(share_broker, topic, 3)
    consumer = share_consumer(share_broker, group, topic)
    try:
        got = []
        deadline = time.monotonic() + WAIT_S
        while len(got) < 3 and time.monotonic() < deadline:
            got += poll_some(consumer)
        assert values(got) == ["v0", "v1", "v2"]
        by_value = {m.value(): m for m in got}
        consumer.acknowledge(by_value[b"v0"], AcknowledgeType.ACCEPT)
        consumer.acknowledge(by_value[b"v1"], AcknowledgeType.RELEASE)
        consumer.acknowledge(by_value[b"v2"], AcknowledgeType.REJECT)
        consumer.commit_sync()
        again = poll_until(consumer, 1)
        assert values(again) == ["v1"], "only the released record comes back"
        assert again[0].delivery_count() == 2
        dead = read_to_end(share_broker.bootstrap, f"%DLQ%{group}", want=1)
        assert [m.value for m in dead] == [b"v2"], "the rejected record is in the group's dead-letter topic"
    finally:
        consumer.close()


def test_a_record_whose_lock_runs_out_comes_back_with_delivery_count_2(share_broker):
    topic = new_topic(share_broker)
    group = share_group(share_broker, share_record_lock_duration_ms=2000)
    produce(share_broker, topic, 1)
    holder = share_consumer(share_broker, group, topic, "holder")
    other = share_consumer(share_broker, group, topic, "other")
    try:
        got = []
        deadline = time.monotonic() + WAIT_S
        while not got and time.monotonic() < deadline:
            got = poll_some(holder)
        assert values(got) == ["v0"] and got[0].delivery_count() == 1
        acquired_at = time.monotonic()
        # The holder never acknowledges: after 2 s the record is available again.
        again = poll_until(other, 1)
        assert values(again) == ["v0"] and again[0].delivery_count() == 2
        assert time.monotonic() - acquired_at >= 1.5, "not before the lock ran out"
    finally:
        other.close()
        holder.close()


def test_a_record_released_past_the_delivery_count_limit_goes_to_the_dead_letter_topic(share_broker):
    topic = new_topic(share_broker)
    group = share_group(share_broker, share_delivery_count_limit=2)
    produce(share_broker, topic, 2)
    consumer = share_consumer(share_broker, group, topic)
    try:
        counts = []
        deadline = time.monotonic() + WAIT_S
        accepted = False
        while time.monotonic() < deadline:
            batch = poll_some(consumer)
            for m in batch:
                if m.value() == b"v1" and not accepted:
                    consumer.acknowledge(m, AcknowledgeType.ACCEPT)
                    accepted = True
                else:
                    counts.append(m.delivery_count())
                    consumer.acknowledge(m, AcknowledgeType.RELEASE)
            if batch:
                consumer.commit_sync()
            if len(counts) >= 2:
                break
        assert counts == [1, 2], "delivered twice, released twice"
        dead = read_to_end(share_broker.bootstrap, f"%DLQ%{group}", want=1)
        assert [m.value for m in dead] == [b"v0"]
        assert poll_some(consumer, 2.0) == [], "nothing left to hand out"
    finally:
        consumer.close()


def test_a_share_group_and_a_rocketmq_group_of_one_name_are_one_group(share_broker):
    topic, group = new_topic(share_broker), share_group(share_broker)
    send_all(share_broker, topic, [message(topic, f"m{i}".encode()) for i in range(6)])
    rocketmq = simple_consumer(share_broker, group, topic, await_s=1)
    try:
        acked = []
        deadline = time.monotonic() + WAIT_S
        while len(acked) < 3 and time.monotonic() < deadline:
            for m in rocketmq.receive(3 - len(acked), 30):
                rocketmq.ack(m)
                acked.append(m.body.decode())
        assert len(acked) == 3, acked
    finally:
        rocketmq.shutdown()
    consumer = share_consumer(share_broker, group, topic)
    try:
        got = values(poll_until(consumer, 3))
        assert not set(got) & set(acked), f"acked through RocketMQ, then handed out again: {got}"
        assert sorted(got + acked) == [f"m{i}" for i in range(6)]
        assert poll_some(consumer, 2.0) == []
    finally:
        consumer.close()


def test_a_classic_consumer_cannot_join_a_share_group(share_broker):
    topic, group = new_topic(share_broker), share_group(share_broker)
    produce(share_broker, topic, 1)
    sharing = share_consumer(share_broker, group, topic)
    classic = Consumer({"bootstrap.servers": share_broker.bootstrap, "group.id": group, "auto.offset.reset": "earliest"})
    try:
        poll_until(sharing, 1)
        classic.subscribe([topic])
        error = None
        deadline = time.monotonic() + WAIT_S
        while error is None and time.monotonic() < deadline:
            try:
                msg = classic.poll(0.5)
            except KafkaException as e:
                error = e.args[0]
                break
            if msg is not None and msg.error():
                error = msg.error()
            assert msg is None or msg.error(), "a classic member of a share group got a record"
        assert error is not None and error.code() == KafkaError.INCONSISTENT_GROUP_PROTOCOL, error
    finally:
        classic.close()
        sharing.close()


# A share consumer in a process of its own, so that the test can kill -9 it: it receives the
# topic's records, ACCEPTs the first `want` (committing them), prints their values as one JSON
# line, then holds the rest of what it received until killed.
HOLDER = r"""
import json, sys, time
from confluent_kafka import AcknowledgeType, ShareConsumer
bootstrap, group, topic, want = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": "holder",
                   "share.acknowledgement.mode": "explicit"})
c.subscribe([topic])
acked, held, deadline = [], [], time.monotonic() + 60
while len(acked) < want and time.monotonic() < deadline:
    for m in c.poll(1.0) or []:
        if m.error():
            continue
        if len(acked) < want:
            c.acknowledge(m, AcknowledgeType.ACCEPT)
            acked.append(m.value().decode())
        else:
            held.append(m.value().decode())
    c.commit_sync()
print(json.dumps({"acked": acked, "held": held}), flush=True)
time.sleep(600)
"""


def test_a_share_group_loses_nothing_and_redelivers_no_accepted_record_when_the_partition_leader_dies(cluster_factory):
    """Three nodes, replication factor 3, min ISR 2. A share consumer ACCEPTs 30 of 40 records
    and holds the rest; then it and the broker leading the partition are killed (-9). Another
    member of the group gets exactly the 10 others, those that were held after their lock ran
    out, as later deliveries: the state of the queue lived in `__share_group_state`."""
    import json
    import sys

    from confluent_kafka.admin import AdminClient, NewTopic

    settings = {"default.replication.factor": "3", "min.insync.replicas": "2", **SETTINGS}
    cluster = cluster_factory(settings=settings)
    topic, group = unique("share-ha"), unique("sg-ha")
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap()})
    admin.create_topics([NewTopic(topic, 1, 3, config={"min.insync.replicas": "2"})])[topic].result(timeout=30)
    cluster.wait_topic(topic, 1)
    env = {**os.environ, "WEIR_ADMIN": cluster.node(1).admin_url()}
    subprocess.run([str(weir_bin()), "group", "create", group, "--config", "share.auto.offset.reset=earliest",
                    "--config", "share.record.lock.duration.ms=3000"], check=True, capture_output=True, env=env, timeout=60)
    producer = c_producer(cluster.bootstrap())
    sent = [f"r{i}" for i in range(40)]
    c_produce(producer, topic, [{"value": v.encode()} for v in sent], partition=0)

    holder = subprocess.Popen([sys.executable, "-c", HOLDER, cluster.bootstrap(), group, topic, "30"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = holder.stdout.readline()
        assert line, "the holding consumer printed nothing"
        first = json.loads(line)
        assert len(first["acked"]) == 30, first
        md = admin.list_topics(topic, timeout=10)
        victim = md.topics[topic].partitions[0].leader
        holder.kill()
        cluster.node(victim).kill9()
    finally:
        holder.kill()
        holder.wait(10)
    survivors = [n for n in cluster.ids() if n != victim]
    consumer = ShareConsumer({
        "bootstrap.servers": ",".join(cluster.node(n).bootstrap for n in survivors),
        "group.id": group,
        "client.id": "after",
        "share.acknowledgement.mode": "explicit",
    })
    consumer.subscribe([topic])
    try:
        got, deadline = [], time.monotonic() + 90
        while len(got) < 10 and time.monotonic() < deadline:
            batch = [m for m in consumer.poll(1.0) or [] if not m.error()]
            for m in batch:
                consumer.acknowledge(m, AcknowledgeType.ACCEPT)
            if batch:
                consumer.commit_sync()
            got += batch
        # Then nothing more for a while: an accepted record, or a second copy, would show here.
        quiet = time.monotonic() + 4
        while time.monotonic() < quiet:
            batch = [m for m in consumer.poll(0.5) or [] if not m.error()]
            for m in batch:
                consumer.acknowledge(m, AcknowledgeType.ACCEPT)
            got += batch
    finally:
        consumer.close()
    after = [m.value().decode() for m in got]
    accepted = set(first["acked"])
    assert not accepted & set(after), f"accepted records delivered again: {sorted(accepted & set(after))}"
    assert sorted(after) == sorted(set(sent) - accepted), after
    counts = {m.value().decode(): m.delivery_count() for m in got}
    assert all(counts[v] >= 2 for v in first["held"]), (first["held"], counts)

    # Every survivor's admin API shows the group's start offset past all 40 and nothing in
    # flight: the one that does not lead the partition asks the one that does.
    for n in survivors:
        env = {**os.environ, "WEIR_ADMIN": cluster.node(n).admin_url()}
        row, deadline = None, time.monotonic() + 20
        while time.monotonic() < deadline:
            done = subprocess.run([str(weir_bin()), "group", "describe", group, "--json"], capture_output=True,
                                  text=True, env=env, timeout=60)
            assert done.returncode == 0, done.stderr
            rows = [r for r in json.loads(done.stdout)["offsets"] if r["topic"] == topic and r["partition"] == 0]
            row = rows[0] if rows else None
            if row and row.get("committed_offset") == 40 and row.get("in_flight") == 0:
                break
            time.sleep(0.5)
        assert row and row.get("committed_offset") == 40 and row.get("in_flight") == 0, (n, row)
