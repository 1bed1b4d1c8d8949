"""Partition reassignment (KIP-455) with real processes: three `weir server` nodes on 127.0.0.1.

What it proves: a partition moves to new replicas while an idempotent `acks=all` producer
writes to it, without losing or duplicating anything acknowledged; the new replicas copy the
log, join the ISR, and only then the old ones are dropped (the old leader hands over, and its
log is deleted); ListPartitionReassignments shows the moves in progress; a replication throttle
set the way `kafka-reassign-partitions.sh --throttle` sets it (IncrementalAlterConfigs on broker
resources) holds the copy back; a move can be cancelled, back to the original replicas; bad
plans get Kafka's error codes. The `weir partition` CLI drives one of the moves.

Every wait is bounded.
"""

import json
import subprocess
import threading
import time

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from kafka.protocol.admin import AlterPartitionReassignmentsRequest, ListPartitionReassignmentsRequest

from cluster import NONE
from conftest import weir_bin
from helpers import c_producer, http, unique
from test_replication import REPLICATION_SETTINGS, create_replicated, partition_states, produce, read_partition

INVALID_REPLICA_ASSIGNMENT = 39
UNKNOWN_TOPIC_OR_PARTITION = 3
NO_REASSIGNMENT_IN_PROGRESS = 85


@pytest.fixture
def replicated(cluster_factory):
    return cluster_factory(voters=3, settings=REPLICATION_SETTINGS)


def alter(cluster, topic, moves, via=1):
    """AlterPartitionReassignments v0: {partition: replicas or None}; returns (top-level error,
    {partition: (code, message)})."""
    raw = cluster.raw(via, timeout=40)
    try:
        request = AlterPartitionReassignmentsRequest[0](
            timeout_ms=30_000,
            topics=[(topic, [(p, replicas, {}) for p, replicas in moves.items()], {})],
            tags={},
        )
        response = raw.request(request, timeout=40)
    finally:
        raw.close()
    results = {}
    for _name, partitions, _tags in response.responses:
        for index, code, message, _tags in partitions:
            results[index] = (code, message)
    return response.error_code, results


def ongoing(cluster, via=1):
    """ListPartitionReassignments v0 of every partition: {(topic, partition): (replicas,
    adding, removing)}."""
    raw = cluster.raw(via)
    try:
        response = raw.request(ListPartitionReassignmentsRequest[0](timeout_ms=10_000, topics=None, tags={}))
    finally:
        raw.close()
    assert response.error_code == NONE, response
    return {
        (name, p[0]): (list(p[1]), list(p[2]), list(p[3])) for name, partitions, _ in response.topics for p in partitions
    }


def set_throttle(cluster, rate):
    """What `kafka-reassign-partitions.sh --throttle` does: both rates on every broker."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap()})
    op = AlterConfigOpType.SET if rate is not None else AlterConfigOpType.DELETE
    for b in cluster.ids():
        # librdkafka sends one broker resource per call.
        resource = ConfigResource(
            ResourceType.BROKER,
            str(b),
            incremental_configs=[
                ConfigEntry(name, str(rate or 0), incremental_operation=op)
                for name in ("leader.replication.throttled.rate", "follower.replication.throttled.rate")
            ],
        )
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(timeout=30)
    return admin


def log_dir(cluster, node, topic, partition=0):
    return cluster.node(node).data_dir / f"{topic}-{partition}"


def test_a_partition_moves_under_load_and_nothing_acknowledged_is_lost(replicated, tmp_path):
    """[1, 2] → [2, 3] with the CLI while a producer writes: broker 3 copies the log and joins
    the ISR, then broker 1 (the leader) is dropped and broker 2 leads at a new epoch; every
    acknowledged message is there exactly once and in order, and broker 1's log is gone. When
    `--wait` reports the move complete, the new leader serves every message acknowledged until
    then (its high watermark has caught up)."""
    cluster = replicated
    topic = unique("move")
    states = create_replicated(cluster, topic, assignment=[[1, 2]], config={"min.insync.replicas": "2"})
    assert states[0] == (1, [1, 2], [1, 2]), states
    first = [f"before-{i}".encode() for i in range(500)]
    reports = produce(cluster.bootstrap(), topic, first)
    assert all(err is None for err, _ in reports.values())

    acked, acked_offsets, errors, stop = [], [], [], threading.Event()

    def keep_producing():
        producer = c_producer(cluster.bootstrap(), {"acks": "all", "enable.idempotence": True, "linger.ms": 5})

        def report(err, msg):
            (errors if err else acked).append(err or msg.value())
            if not err:
                acked_offsets.append(msg.offset())

        i = 0
        while not stop.is_set():
            producer.produce(topic, f"during-{i}".encode(), partition=0, on_delivery=report)
            producer.poll(0.002)
            i += 1
        producer.flush(60)

    writer = threading.Thread(target=keep_producing, daemon=True)
    writer.start()
    time.sleep(1.0)

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [{"topic": topic, "partition": 0, "replicas": [2, 3]}]}))
    env = {"WEIR_ADMIN": cluster.node(3).admin_url(), "PATH": "/usr/bin:/bin"}
    cli = str(weir_bin())
    started = subprocess.run(
        [cli, "partition", "reassign", "--plan", str(plan), "--wait", "--timeout", "60"],
        capture_output=True, text=True, env=env, timeout=90,
    )
    acked_until_done = max(acked_offsets)
    status, described = http("GET", f"{cluster.node(1).admin_url()}/v1/topics/{topic}")
    assert started.returncode == 0, started.stderr
    assert "started" in started.stdout and "completed" in started.stdout, started.stdout
    assert status == 200, described
    [served] = described["partitions"]
    assert served["leader"] in (2, 3) and served["high_watermark"] > acked_until_done, (
        f"offset {acked_until_done} was acknowledged before the move was reported complete, "
        f"but the new leader serves up to {served['high_watermark']} only: {served}"
    )
    time.sleep(1.0)
    stop.set()
    writer.join(90)
    assert not errors, errors[:3]
    assert len(acked) > 100, f"the producer wrote during the move: {len(acked)} acknowledged"

    states = cluster.wait(
        lambda: (s := partition_states(cluster, topic, via=2)).get(0, (0, [], []))[1] == [2, 3] and s,
        30, "the partition on [2, 3]",
    )
    leader, replicas, isr = states[0]
    assert (replicas, isr) == ([2, 3], [2, 3]) and leader == 2, states
    assert ongoing(cluster, via=2) == {}, "nothing is left in progress"
    cluster.wait(lambda: not log_dir(cluster, 1, topic).exists(), 15, "broker 1 deleting its replica")
    assert log_dir(cluster, 3, topic).exists()

    expected = first + acked
    got = read_partition(cluster.bootstrap([2, 3]), topic, 0, len(expected) + 1, timeout=60)
    values = [v for _, v in got]
    assert len(values) == len(set(values)), "no duplicates"
    assert set(values) == set(expected), f"missing {len(set(expected) - set(values))}"
    assert [o for o, _ in got] == list(range(len(got))), "offsets without gaps"
    during = [v for v in values if v.startswith(b"during-")]
    assert during == sorted(during, key=lambda v: int(v.split(b"-")[1])), "send order kept"

    listed = subprocess.run(
        [cli, "partition", "reassignments"], capture_output=True, text=True, env=env, timeout=30, check=True
    )
    assert topic not in listed.stdout


def test_a_throttled_move_waits_for_the_new_replica_and_can_be_cancelled(replicated):
    """[1] → [1, 2] under a 1 MB/s throttle: while 8 MB are copied the move stays in progress
    (ListPartitionReassignments shows broker 2 being added, outside the ISR); cancelling goes
    back to [1] and broker 2 deletes its partial copy; bad plans are refused with Kafka's codes;
    without the throttle the move completes."""
    cluster = replicated
    topic = unique("throttled")
    create_replicated(cluster, topic, assignment=[[1]])
    payload = b"x" * 8000
    reports = produce(cluster.bootstrap(), topic, [payload + str(i).encode() for i in range(1000)], acks="1")
    assert all(err is None for err, _ in reports.values())

    admin = set_throttle(cluster, 1_000_000)
    described = admin.describe_configs([ConfigResource(ResourceType.BROKER, "1")])
    configs = list(described.values())[0].result(timeout=30)
    assert configs["follower.replication.throttled.rate"].value == "1000000"
    assert not configs["follower.replication.throttled.rate"].is_read_only

    code, results = alter(cluster, topic, {0: [1, 2]})
    assert code == NONE and results[0][0] == NONE, results
    started = time.monotonic()
    time.sleep(2.5)
    listed = ongoing(cluster, via=2)
    assert listed.get((topic, 0)) == ([1, 2], [2], []), listed
    leader, replicas, isr = partition_states(cluster, topic)[0]
    assert (leader, replicas, isr) == (1, [1, 2], [1]), "broker 2 is still copying, outside the ISR"
    assert time.monotonic() - started < 5, "the checks above ran within the throttled copy's time"

    code, results = alter(cluster, topic, {0: None})
    assert code == NONE and results[0][0] == NONE, results
    cluster.wait(lambda: partition_states(cluster, topic).get(0) == (1, [1], [1]), 15, "back to [1]")
    assert ongoing(cluster) == {}
    cluster.wait(lambda: not log_dir(cluster, 2, topic).exists(), 15, "broker 2 deleting its partial copy")

    _, results = alter(cluster, topic, {0: None})
    assert results[0][0] == NO_REASSIGNMENT_IN_PROGRESS, results
    _, results = alter(cluster, topic, {0: [1, 9]})
    assert results[0][0] == INVALID_REPLICA_ASSIGNMENT, results
    _, results = alter(cluster, topic, {0: [2, 2]})
    assert results[0][0] == INVALID_REPLICA_ASSIGNMENT, results
    _, results = alter(cluster, unique("nothing"), {0: [1]})
    assert results[0][0] == UNKNOWN_TOPIC_OR_PARTITION, results

    set_throttle(cluster, None)
    code, results = alter(cluster, topic, {0: [2]})
    assert code == NONE and results[0][0] == NONE, results
    cluster.wait(lambda: partition_states(cluster, topic).get(0) == (2, [2], [2]), 60, "moved to broker 2")
    got = read_partition(cluster.bootstrap([2]), topic, 0, 1000, timeout=60)
    assert [v for _, v in got] == [payload + str(i).encode() for i in range(1000)]
    cluster.wait(lambda: not log_dir(cluster, 1, topic).exists(), 15, "broker 1 deleting its replica")


def test_the_topic_throttled_replica_lists_hold_back_a_returning_follower(replicated):
    """What `kafka-reassign-partitions.sh --throttle` also sets: the topic's
    `follower.replication.throttled.replicas`. A follower named there that comes back far
    behind catches up within the rate, outside the ISR, and joins once the throttle is gone."""
    cluster = replicated
    topic = unique("catchup")
    create_replicated(cluster, topic, assignment=[[1, 2]])
    cluster.node(2).stop()
    cluster.wait(lambda: partition_states(cluster, topic, via=1).get(0, (0, [], [1, 2]))[2] == [1], 20, "ISR [1]")
    payload = b"y" * 8000
    reports = produce(cluster.bootstrap([1, 3]), topic, [payload] * 1000, acks="1")
    assert all(err is None for err, _ in reports.values())

    admin = set_throttle(cluster, 1_000_000)
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("leader.replication.throttled.replicas", "0:1", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("follower.replication.throttled.replicas", "0:2", incremental_operation=AlterConfigOpType.SET),
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)
    described = list(admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values())[0].result(30)
    assert described["follower.replication.throttled.replicas"].value == "0:2"
    bad = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("follower.replication.throttled.replicas", "zero:2", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    with pytest.raises(Exception, match="partition:broker"):
        list(admin.incremental_alter_configs([bad]).values())[0].result(timeout=30)

    cluster.node(2).start()
    started = time.monotonic()
    time.sleep(3.0)
    assert partition_states(cluster, topic, via=1)[0][2] == [1], "the throttled follower is still catching up"
    assert time.monotonic() - started < 6

    set_throttle(cluster, None)
    cluster.wait(lambda: partition_states(cluster, topic, via=1)[0][2] == [1, 2], 60, "broker 2 back in the ISR")
