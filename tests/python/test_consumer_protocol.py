"""The consumer group protocol (KIP-848, `group.protocol=consumer`): the broker assigns the
partitions through ConsumerGroupHeartbeat, incrementally, with librdkafka as the client.

Every broker here runs with a short consumer session timeout, so a dead member is noticed in a
few seconds; every wait is bounded."""

import os
import subprocess
import sys
import textwrap
import time

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient


from helpers import c_admin, c_consumer, c_create_topic, c_produce, c_producer, unique

SESSION_MS = 3000
SETTINGS = {
    "group.consumer.session.timeout.ms": str(SESSION_MS),
    "group.consumer.heartbeat.interval.ms": "300",
}
WAIT_S = 25


@pytest.fixture
def kip848(broker_factory):
    return broker_factory(settings=SETTINGS)


def new_consumer(bootstrap, group, name, conf=None):
    base = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "group.protocol": "consumer",
        "client.id": name,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "socket.connection.setup.timeout.ms": 10000,
    }
    base.update(conf or {})
    return Consumer(base)


def owned(consumer, topic=None):
    return sorted((tp.topic, tp.partition) for tp in consumer.assignment() if topic is None or tp.topic == topic)


def drive(consumers, done, timeout=WAIT_S, what="assignment"):
    """Polls every consumer (discarding messages, failing on errors) until `done()` is true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in consumers:
            msg = c.poll(0.05)
            if msg is not None and msg.error() and msg.error().code() != KafkaError._PARTITION_EOF:
                raise AssertionError(f"consumer error: {msg.error()}")
        if done():
            return
    raise AssertionError(f"timed out waiting for {what}: " + "; ".join(str(owned(c)) for c in consumers))


def exact_cover(consumers, topic, partitions):
    """Each partition owned by exactly one consumer."""
    seen = [p for c in consumers for (_, p) in owned(c, topic)]
    return sorted(seen) == list(range(partitions))


def test_members_share_the_partitions_and_rebalance_as_they_join_and_leave(kip848, closer):
    topic, group = unique("kip"), unique("g")
    c_create_topic(c_admin(kip848.bootstrap), topic, partitions=6)
    a = closer.add(new_consumer(kip848.bootstrap, group, "a"))
    a.subscribe([topic])
    drive([a], lambda: exact_cover([a], topic, 6))
    b = closer.add(new_consumer(kip848.bootstrap, group, "b"))
    b.subscribe([topic])
    drive([a, b], lambda: exact_cover([a, b], topic, 6) and len(owned(b)) == 3, what="a 3/3 split")
    # Uniform and sticky: a kept three of its own partitions.
    assert len(owned(a)) == 3
    c = closer.add(new_consumer(kip848.bootstrap, group, "c"))
    c.subscribe([topic])
    drive([a, b, c], lambda: exact_cover([a, b, c], topic, 6) and all(len(owned(x)) == 2 for x in (a, b, c)))
    c.close()
    drive([a, b], lambda: exact_cover([a, b], topic, 6), what="c's partitions handed back")
    assert sorted(len(owned(x)) for x in (a, b)) == [3, 3]


DYING_MEMBER = textwrap.dedent(
    """
    import sys, time
    from confluent_kafka import Consumer
    c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2], "group.protocol": "consumer",
                  "client.id": "doomed", "enable.auto.commit": False})
    c.subscribe([sys.argv[3]])
    end = time.monotonic() + 60
    while time.monotonic() < end:
        c.poll(0.1)
        if c.assignment():
            print("assigned", len(c.assignment()), flush=True)
    """
)


def test_a_killed_member_is_removed_after_the_session_timeout(kip848, closer):
    topic, group = unique("kip"), unique("g")
    c_create_topic(c_admin(kip848.bootstrap), topic, partitions=4)
    a = closer.add(new_consumer(kip848.bootstrap, group, "a"))
    a.subscribe([topic])
    drive([a], lambda: exact_cover([a], topic, 4))
    child = subprocess.Popen(
        [sys.executable, "-c", DYING_MEMBER, kip848.bootstrap, group, topic], stdout=subprocess.PIPE, text=True
    )
    try:
        drive([a], lambda: len(owned(a)) == 2, what="the child taking two partitions")
        child.kill()
        child.wait(10)
        killed_at = time.monotonic()
        drive([a], lambda: len(owned(a)) == 4, timeout=SESSION_MS / 1000 + 15, what="the dead member's partitions")
        waited = time.monotonic() - killed_at
        # Not before the session ran out (minus a heartbeat of slack), but soon after.
        assert waited >= SESSION_MS / 1000 - 0.6, waited
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


def test_a_groups_own_session_timeout_config_overrides_the_brokers(broker_factory, closer):
    """The broker keeps Kafka's 45 s default; the group's `consumer.session.timeout.ms` of 3 s
    (set as kafka-configs --entity-type groups sets it) removes a killed member in seconds, and
    its `consumer.heartbeat.interval.ms` is what the members are told."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    broker = broker_factory()
    topic, group = unique("kip"), unique("g")
    admin = c_admin(broker.bootstrap)
    c_create_topic(admin, topic, partitions=4)
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("consumer.session.timeout.ms", str(SESSION_MS), incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("consumer.heartbeat.interval.ms", "300", incremental_operation=AlterConfigOpType.SET),
    ])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)
    a = closer.add(new_consumer(broker.bootstrap, group, "a"))
    a.subscribe([topic])
    drive([a], lambda: exact_cover([a], topic, 4))
    child = subprocess.Popen(
        [sys.executable, "-c", DYING_MEMBER, broker.bootstrap, group, topic], stdout=subprocess.PIPE, text=True
    )
    try:
        drive([a], lambda: len(owned(a)) == 2, what="the child taking two partitions")
        child.kill()
        child.wait(10)
        killed_at = time.monotonic()
        drive([a], lambda: len(owned(a)) == 4, timeout=SESSION_MS / 1000 + 15, what="the dead member's partitions")
        assert time.monotonic() - killed_at >= SESSION_MS / 1000 - 0.6
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


def test_commits_are_read_back_and_resumed_from(kip848, closer):
    topic, group = unique("kip"), unique("g")
    c_create_topic(c_admin(kip848.bootstrap), topic, partitions=2)
    producer = c_producer(kip848.bootstrap)
    c_produce(producer, topic, [{"key": f"k{i}".encode(), "value": f"v{i}".encode()} for i in range(20)], partition=0)
    c_produce(producer, topic, [{"key": f"k{i}".encode(), "value": f"w{i}".encode()} for i in range(10)], partition=1)
    a = closer.add(new_consumer(kip848.bootstrap, group, "a"))
    a.subscribe([topic])
    got = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < 30 and time.monotonic() < deadline:
        msg = a.poll(0.2)
        if msg is not None and not msg.error():
            got.append(msg)
    assert len(got) == 30
    # Commit part of each partition: the member epoch goes as the generation (OffsetCommit v9).
    a.commit(offsets=[TopicPartition(topic, 0, 12), TopicPartition(topic, 1, 4)], asynchronous=False)
    committed = {tp.partition: tp.offset for tp in a.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], 10)}
    assert committed == {0: 12, 1: 4}
    a.close()
    b = closer.add(new_consumer(kip848.bootstrap, group, "b"))
    b.subscribe([topic])
    resumed = []
    deadline = time.monotonic() + WAIT_S
    while len(resumed) < 14 and time.monotonic() < deadline:
        msg = b.poll(0.2)
        if msg is not None and not msg.error():
            resumed.append((msg.partition(), msg.offset()))
    assert sorted(resumed) == sorted([(0, o) for o in range(12, 20)] + [(1, o) for o in range(4, 10)])


def test_range_assignor_gives_co_partitioned_ranges(kip848, closer):
    t1, t2, group = unique("kipa"), unique("kipb"), unique("g")
    admin = c_admin(kip848.bootstrap)
    c_create_topic(admin, t1, partitions=4)
    c_create_topic(admin, t2, partitions=4)
    conf = {"group.remote.assignor": "range"}
    a = closer.add(new_consumer(kip848.bootstrap, group, "a", conf))
    b = closer.add(new_consumer(kip848.bootstrap, group, "b", conf))
    a.subscribe([t1, t2])
    b.subscribe([t1, t2])
    drive([a, b], lambda: exact_cover([a, b], t1, 4) and exact_cover([a, b], t2, 4) and len(owned(a)) == 4)
    for c in (a, b):
        p1 = [p for _, p in owned(c, t1)]
        p2 = [p for _, p in owned(c, t2)]
        # Range: consecutive partitions, the same numbers of both topics.
        assert p1 == p2 and p1 in ([0, 1], [2, 3]), (p1, p2)
    described = admin.describe_consumer_groups([group])[group].result(10)
    assert described.partition_assignor == "range"


def test_an_unknown_assignor_is_refused(kip848, closer):
    topic, group = unique("kip"), unique("g")
    c_create_topic(c_admin(kip848.bootstrap), topic, partitions=1)
    a = closer.add(new_consumer(kip848.bootstrap, group, "a", {"group.remote.assignor": "sticky"}))
    a.subscribe([topic])
    deadline = time.monotonic() + WAIT_S
    error = None
    while error is None and time.monotonic() < deadline:
        msg = a.poll(0.2)
        if msg is not None and msg.error():
            error = msg.error()
    # librdkafka makes UNSUPPORTED_ASSIGNOR fatal, as the Java client does.
    assert error is not None and error.code() == KafkaError._FATAL and "assignor" in error.str(), error
    assert not a.assignment()


def test_regex_subscription_follows_matching_topics(kip848, closer):
    prefix, group = unique("kipre"), unique("g")
    admin = c_admin(kip848.bootstrap)
    c_create_topic(admin, f"{prefix}-one", partitions=2)
    c_create_topic(admin, f"{prefix}-two", partitions=2)
    c_create_topic(admin, f"other-{prefix}", partitions=2)
    a = closer.add(new_consumer(kip848.bootstrap, group, "a", {"topic.metadata.refresh.interval.ms": 1000}))
    a.subscribe([f"^{prefix}-.*"])
    drive([a], lambda: len(owned(a)) == 4)
    assert {t for t, _ in owned(a)} == {f"{prefix}-one", f"{prefix}-two"}
    # A new matching topic is picked up.
    c_create_topic(admin, f"{prefix}-three", partitions=1)
    drive([a], lambda: len(owned(a)) == 5, what="the new matching topic")


def test_groups_are_listed_and_described_with_their_type(kip848, closer):
    topic, group = unique("kip"), unique("g")
    admin = c_admin(kip848.bootstrap)
    c_create_topic(admin, topic, partitions=3)
    a = closer.add(new_consumer(kip848.bootstrap, group, "a"))
    a.subscribe([topic])
    drive([a], lambda: exact_cover([a], topic, 3))
    listed = {g.group_id: g for g in admin.list_consumer_groups().result(10).valid}
    assert group in listed
    assert str(listed[group].type).endswith("CONSUMER"), listed[group].type
    described = admin.describe_consumer_groups([group])[group].result(10)
    assert str(described.type).endswith("CONSUMER"), described.type
    assert len(described.members) == 1
    assert described.members[0].client_id == "a"
    assert sorted(tp.partition for tp in described.members[0].assignment.topic_partitions) == [0, 1, 2]
    assert str(described.state).endswith("STABLE"), described.state


def test_a_classic_member_joining_a_consumer_group_gets_its_share(kip848, closer):
    """Policy bidirectional: a classic consumer (JoinGroup) joining a running consumer group is
    served by the broker's assignment, and never gets a partition the other still owns."""
    topic, group = unique("kip"), unique("g")
    c_create_topic(c_admin(kip848.bootstrap), topic, partitions=2)
    a = closer.add(new_consumer(kip848.bootstrap, group, "a"))
    a.subscribe([topic])
    drive([a], lambda: exact_cover([a], topic, 2))
    classic = closer.add(c_consumer(kip848.bootstrap, group=group))
    classic.subscribe([topic])
    overlap = []

    def shared():
        both = set(owned(a)) & set(owned(classic))
        if both:
            overlap.append(both)
        return exact_cover([a, classic], topic, 2) and len(owned(classic)) == 1

    drive([a, classic], shared, what="the classic member's share")
    assert not overlap, overlap


def test_an_empty_classic_group_becomes_a_consumer_group_with_its_offsets(kip848, closer):
    topic, group = unique("kip"), unique("g")
    c_create_topic(c_admin(kip848.bootstrap), topic, partitions=1)
    c_produce(c_producer(kip848.bootstrap), topic, [{"value": f"v{i}".encode()} for i in range(10)], partition=0)
    classic = closer.add(c_consumer(kip848.bootstrap, group=group))
    classic.subscribe([topic])
    deadline = time.monotonic() + WAIT_S
    while not classic.assignment() and time.monotonic() < deadline:
        classic.poll(0.1)
    classic.commit(offsets=[TopicPartition(topic, 0, 6)], asynchronous=False)
    classic.close()
    a = closer.add(new_consumer(kip848.bootstrap, group, "a"))
    a.subscribe([topic])
    first = None
    deadline = time.monotonic() + WAIT_S
    while first is None and time.monotonic() < deadline:
        msg = a.poll(0.2)
        if msg is not None and not msg.error():
            first = msg.offset()
    assert first == 6


def find_coordinator(cluster, group, via):
    from kafka.protocol.find_coordinator import FindCoordinatorRequest

    client = cluster.raw(via, timeout=5)
    try:
        response = client.request(FindCoordinatorRequest[1](coordinator_key=group, coordinator_type=0), timeout=5)
    finally:
        client.close()
    return response.coordinator_id if response.error_code == 0 else None


def test_the_group_carries_on_when_its_coordinator_is_killed(cluster_factory, closer):
    """Three nodes; the group's coordinator is killed with -9. The new coordinator loads the
    group from its record (members, epochs, assignment), so no member loses its partitions; the
    committed offsets are there, and consumption goes on."""
    from confluent_kafka.admin import NewTopic

    cluster = cluster_factory(voters=3, settings=SETTINGS)
    topic, group = unique("kipfo"), unique("g")
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap()})
    admin.create_topics([NewTopic(topic, num_partitions=4, replication_factor=3)])[topic].result(30)
    cluster.wait_topic(topic, 4)
    producer = closer.add(c_producer(cluster.bootstrap(), {"acks": "all"}))
    c_produce(producer, topic, [{"value": f"a{i}".encode(), "partition": i % 4} for i in range(40)])
    a = closer.add(new_consumer(cluster.bootstrap(), group, "a"))
    b = closer.add(new_consumer(cluster.bootstrap(), group, "b"))
    lost = []
    a.subscribe([topic], on_lost=lambda c, parts: lost.append(("a", parts)))
    b.subscribe([topic], on_lost=lambda c, parts: lost.append(("b", parts)))
    seen = {}
    deadline = time.monotonic() + 40
    while sum(seen.values(), 0) < 40 and time.monotonic() < deadline:
        for c in (a, b):
            msg = c.poll(0.05)
            if msg is not None and not msg.error():
                seen[msg.partition()] = seen.get(msg.partition(), 0) + 1
    assert sum(seen.values()) == 40
    drive([a, b], lambda: exact_cover([a, b], topic, 4) and owned(a) and owned(b), timeout=40)
    commits = {p: 10 - p for p in range(4)}  # a commit per partition, by its current owner
    for c in (a, b):
        mine = [TopicPartition(topic, p, commits[p]) for _, p in owned(c, topic)]
        c.commit(offsets=mine, asynchronous=False)
    coordinator = cluster.wait(lambda: find_coordinator(cluster, group, 1), 20, "the group coordinator")
    before = {name: owned(c, topic) for name, c in (("a", a), ("b", b))}
    cluster.node(coordinator).kill9()
    survivors = [i for i in cluster.ids() if i != coordinator]
    survivor_admin = AdminClient({"bootstrap.servers": cluster.bootstrap(survivors)})

    def assigned_again():
        for c in (a, b):
            c.poll(0.05)
        if find_coordinator(cluster, group, survivors[0]) not in survivors:
            return None
        try:
            described = survivor_admin.describe_consumer_groups([group])[group].result(5)
        except Exception:
            return None
        parts = sorted(tp.partition for m in described.members for tp in m.assignment.topic_partitions)
        return described if parts == [0, 1, 2, 3] and len(described.members) == 2 else None

    cluster.wait(assigned_again, 45, "every partition assigned by the new coordinator", interval=0.1)
    result = survivor_admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(10)
    assert {tp.partition: tp.offset for tp in result.topic_partitions if tp.topic == topic} == commits
    # Consumption goes on: new records reach the members.
    c_produce(producer, topic, [{"value": f"b{i}".encode(), "partition": i % 4} for i in range(8)])
    later = set()
    deadline = time.monotonic() + 40
    while len(later) < 8 and time.monotonic() < deadline:
        for c in (a, b):
            msg = c.poll(0.05)
            if msg is not None and not msg.error() and msg.value().startswith(b"b"):
                later.add(msg.value())
    assert len(later) == 8
    # The members were never fenced: the same partitions, none lost.
    assert not lost, lost
    assert {name: owned(c, topic) for name, c in (("a", a), ("b", b))} == before


@pytest.mark.parametrize("assignor", ["uniform", "range"])
def test_the_assignors_give_each_partition_to_a_member_on_its_replicas_rack(cluster_factory, closer, assignor):
    """Three brokers on three racks, one partition on each; members with client.rack join one
    after another (the last-numbered rack first, against the partition order range would
    follow), and each ends up with the partition whose replica is on its rack."""
    from kafka.admin import NewTopic as KpNewTopic

    from helpers import kp_admin

    cluster = cluster_factory(voters=3, settings=SETTINGS, start=False)
    for node_id, node in cluster.nodes.items():
        node.settings["broker.rack"] = f"rack-{node_id}"
    cluster.start()
    cluster.wait_formed()
    topic, group = unique("kiprack"), unique("g")
    admin = kp_admin(cluster.bootstrap())
    try:
        admin.create_topics(
            [KpNewTopic(topic, num_partitions=-1, replication_factor=-1, replica_assignments={0: [1], 1: [2], 2: [3]})],
            timeout_ms=30000,
        )
    finally:
        admin.close()
    cluster.wait_topic(topic, 3)
    members = []
    for node_id in (3, 2, 1):
        conf = {"client.rack": f"rack-{node_id}", "group.remote.assignor": assignor}
        c = closer.add(new_consumer(cluster.bootstrap(), group, f"m{node_id}", conf))
        c.subscribe([topic])
        members.append(c)
        drive(members, lambda: exact_cover(members, topic, 3) and all(owned(m) for m in members), timeout=40)
    # Partition p has its replica on node p + 1, in rack-(p + 1).
    assert [owned(m, topic) for m in members] == [[(topic, 2)], [(topic, 1)], [(topic, 0)]]


def test_the_admin_api_and_the_cli_show_members_assignments_and_epochs(kip848, closer):
    from conftest import weir_bin
    from helpers import http

    topic, group = unique("kip"), unique("g")
    c_create_topic(c_admin(kip848.bootstrap), topic, partitions=4)
    a = closer.add(new_consumer(kip848.bootstrap, group, "a"))
    b = closer.add(new_consumer(kip848.bootstrap, group, "b"))
    a.subscribe([topic])
    b.subscribe([topic])
    drive([a, b], lambda: exact_cover([a, b], topic, 4) and owned(a) and owned(b))
    a.commit(offsets=[TopicPartition(topic, p, 0) for _, p in owned(a, topic)], asynchronous=False)

    def stable():
        for c in (a, b):
            c.poll(0.05)
        status, body = http("GET", f"{kip848.admin_url()}/v1/groups/{group}")
        return body if status == 200 and body["state"] == "Stable" else None

    deadline = time.monotonic() + WAIT_S
    body = None
    while body is None and time.monotonic() < deadline:
        body = stable()
    assert body is not None, "the group never showed Stable in the admin API"
    assert body["protocol_type"] == "consumer" and body["protocol"] == "uniform"
    assert body["group_epoch"] == body["assignment_epoch"] >= 2
    by_client = {m["client_id"]: m for m in body["members"]}
    assert set(by_client) == {"a", "b"}
    assert all(m["member_epoch"] == body["assignment_epoch"] for m in body["members"])
    assert sorted(p for m in body["members"] for tp in m["assignment"] for p in tp["partitions"]) == [0, 1, 2, 3]
    # Every partition row names its owner; lag is computed for the committed ones.
    assert all(o["member_id"] for o in body["offsets"])
    env = {k: v for k, v in os.environ.items() if k not in ("WEIR_BOOTSTRAP", "WEIR_ADMIN")}
    env["WEIR_ADMIN"] = kip848.admin_url()
    described = subprocess.run(
        [str(weir_bin()), "group", "describe", group], capture_output=True, text=True, env=env, timeout=60
    )
    assert described.returncode == 0, described.stderr
    assert "Protocol: consumer (uniform)" in described.stdout
    assert f"Assignment epoch: {body['assignment_epoch']}" in described.stdout
    listed = subprocess.run(
        [str(weir_bin()), "group", "list", "--json"], capture_output=True, text=True, env=env, timeout=60
    )
    assert listed.returncode == 0, listed.stderr
    assert group in listed.stdout


def test_a_static_member_restarting_takes_its_partitions_back(kip848, closer):
    """group.instance.id: a closing static member leaves with epoch -2, keeping its partitions
    for its successor, which gets exactly them; the other member never does."""
    topic, group = unique("kip"), unique("g")
    c_create_topic(c_admin(kip848.bootstrap), topic, partitions=4)
    a = new_consumer(kip848.bootstrap, group, "a", {"group.instance.id": "static-a"})
    b = closer.add(new_consumer(kip848.bootstrap, group, "b"))
    a.subscribe([topic])
    b.subscribe([topic])
    drive([a, b], lambda: exact_cover([a, b], topic, 4) and len(owned(a)) == 2)
    had = owned(a, topic)
    a.close()
    a2 = closer.add(new_consumer(kip848.bootstrap, group, "a2", {"group.instance.id": "static-a"}))
    a2.subscribe([topic])
    b_saw = set()

    def back():
        b_saw.update(owned(b, topic))
        return owned(a2, topic) == had

    drive([a2, b], back, what="the successor taking the static member's partitions")
    assert not (b_saw & set(had)), (b_saw, had)


def test_a_restarted_static_classic_member_takes_its_partitions_back_in_a_consumer_group(kip848, closer):
    """A classic consumer with group.instance.id in a consumer-protocol group: closed (a static
    member sends no LeaveGroup) and started again with the same instance id, it gets exactly
    its partitions back, and the consumer-protocol member never gets one of them."""
    topic, group = unique("kip"), unique("g")
    c_create_topic(c_admin(kip848.bootstrap), topic, partitions=4)
    b = closer.add(new_consumer(kip848.bootstrap, group, "b"))
    b.subscribe([topic])
    drive([b], lambda: exact_cover([b], topic, 4))
    static = {"group.instance.id": "classic-static", "session.timeout.ms": 30000}
    a = c_consumer(kip848.bootstrap, group=group, conf=static)
    a.subscribe([topic])
    drive([a, b], lambda: exact_cover([a, b], topic, 4) and len(owned(a)) == 2, what="the classic member's half")
    had = owned(a, topic)
    a.close()
    a2 = closer.add(c_consumer(kip848.bootstrap, group=group, conf=static))
    a2.subscribe([topic])
    b_saw = set()

    def back():
        b_saw.update(owned(b, topic))
        return owned(a2, topic) == had and exact_cover([a2, b], topic, 4)

    # Well within the 30 s session: a dynamic successor would wait for the old member to expire.
    drive([a2, b], back, timeout=20, what="the successor taking the static member's partitions")
    assert not (b_saw & set(had)), (b_saw, had)


def test_offsets_sent_in_a_transaction_use_the_member_epoch(kip848, closer):
    """Consume-transform-produce with a KIP-848 consumer: TxnOffsetCommit carries the member id
    and epoch (consumer_group_metadata) and the offsets are committed with the transaction."""
    src, dst, group = unique("kipsrc"), unique("kipdst"), unique("g")
    admin = c_admin(kip848.bootstrap)
    c_create_topic(admin, src, partitions=1)
    c_create_topic(admin, dst, partitions=1)
    c_produce(c_producer(kip848.bootstrap), src, [{"value": f"v{i}".encode()} for i in range(5)], partition=0)
    consumer = closer.add(new_consumer(kip848.bootstrap, group, "a"))
    consumer.subscribe([src])
    got = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < 5 and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None and not msg.error():
            got.append(msg)
    assert len(got) == 5
    producer = c_producer(kip848.bootstrap, {"transactional.id": unique("tx")})
    producer.init_transactions(30)
    producer.begin_transaction()
    for msg in got:
        producer.produce(dst, value=msg.value().upper(), partition=0)
    producer.send_offsets_to_transaction([TopicPartition(src, 0, 5)], consumer.consumer_group_metadata(), 30)
    producer.commit_transaction(30)
    committed = consumer.committed([TopicPartition(src, 0)], 10)
    assert committed[0].offset == 5


def converted_group(bootstrap, closer, topic, group):
    """A classic consumer owning the 4 partitions of a new `topic`, then a consumer-protocol
    member joining: the group converts and they share the partitions. Returns both."""
    c_create_topic(c_admin(bootstrap), topic, partitions=4)
    classic = closer.add(c_consumer(bootstrap, group=group))
    classic.subscribe([topic])
    drive([classic], lambda: exact_cover([classic], topic, 4), what="the classic member owning all")
    modern = closer.add(new_consumer(bootstrap, group, "modern"))
    modern.subscribe([topic])
    drive(
        [classic, modern],
        lambda: exact_cover([classic, modern], topic, 4) and len(owned(modern)) == 2,
        what="the converted group sharing the partitions",
    )
    return classic, modern


def test_a_running_classic_group_converts_and_its_classic_members_keep_working(kip848, closer):
    """Kafka 4's migration (policy bidirectional): a consumer-protocol member joins a Stable
    classic group; the group converts, the classic member is told to rejoin and keeps its
    share through JoinGroup/SyncGroup/Heartbeat, commits with its generation, and its leaving
    hands its partitions to the new member."""
    topic, group = unique("kipmig"), unique("g")
    classic, modern = converted_group(kip848.bootstrap, closer, topic, group)
    # The classic member commits through the consumer group (its generation is its epoch).
    classic.commit(offsets=[TopicPartition(topic, p, 1) for _, p in owned(classic, topic)], asynchronous=False)
    admin = c_admin(kip848.bootstrap)
    result = admin.list_consumer_groups().result(10)
    listed = {g.group_id: g for g in result.valid}
    assert group in listed, (result.valid, result.errors)
    assert str(listed[group].type).endswith("CONSUMER"), listed[group].type
    classic.close()
    drive([modern], lambda: exact_cover([modern], topic, 4), what="the classic member's partitions handed over")


def test_a_group_left_with_classic_members_only_becomes_classic_again(kip848, closer):
    """Kafka 4's online downgrade (policy bidirectional): when the last consumer-protocol member
    leaves a converted group, the classic members left make it a classic group again. They
    rejoin, the classic leader assigns every partition, their commits are taken at the new
    generation, and the broker restarted finds a classic group with those offsets."""
    topic, group = unique("kipdown"), unique("g")
    admin = c_admin(kip848.bootstrap)
    classic, modern = converted_group(kip848.bootstrap, closer, topic, group)
    modern.close()

    def classic_again():
        listed = {g.group_id: g for g in admin.list_consumer_groups().result(10).valid}
        return group in listed and str(listed[group].type).endswith("CLASSIC")

    drive([classic], lambda: exact_cover([classic], topic, 4) and classic_again(), what="a classic group again")
    described = admin.describe_consumer_groups([group])[group].result(10)
    assert str(described.type).endswith("CLASSIC"), described.type
    assert len(described.members) == 1, described.members
    assert sorted(tp.partition for tp in described.members[0].assignment.topic_partitions) == [0, 1, 2, 3]
    classic.commit(offsets=[TopicPartition(topic, p, 3) for p in range(4)], asynchronous=False)
    classic.close()

    kip848.restart()
    admin = c_admin(kip848.bootstrap)
    deadline = time.monotonic() + WAIT_S
    while True:
        listed = {g.group_id: g for g in admin.list_consumer_groups().result(10).valid}
        if group in listed or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert str(listed[group].type).endswith("CLASSIC"), listed[group].type
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(10)
    assert sorted((tp.partition, tp.offset) for tp in offsets.topic_partitions) == [(p, 3) for p in range(4)]


def test_with_migration_disabled_a_running_classic_group_keeps_its_protocol(broker_factory, closer):
    """`group.consumer.migration.policy=disabled`: a consumer-protocol member cannot take over a
    running classic group (Kafka's GROUP_ID_NOT_FOUND); the classic member keeps everything."""
    broker = broker_factory(settings={**SETTINGS, "group.consumer.migration.policy": "disabled"})
    topic, group = unique("kipnomig"), unique("g")
    admin = c_admin(broker.bootstrap)
    c_create_topic(admin, topic, partitions=2)
    classic = closer.add(c_consumer(broker.bootstrap, group=group))
    classic.subscribe([topic])
    drive([classic], lambda: exact_cover([classic], topic, 2), what="the classic member owning all")
    modern = closer.add(new_consumer(broker.bootstrap, group, "modern"))
    modern.subscribe([topic])
    errors = []
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        msg = modern.poll(0.1)
        if msg is not None and msg.error():
            errors.append(msg.error())
        classic.poll(0.05)
        assert owned(modern) == [], owned(modern)
    assert exact_cover([classic], topic, 2)
    listed = {g.group_id: g for g in admin.list_consumer_groups().result(10).valid}
    assert str(listed[group].type).endswith("CLASSIC"), listed[group].type
