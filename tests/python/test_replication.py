"""ISR replication with real processes: three `weir server` nodes on 127.0.0.1 and real clients.

What it proves: a topic with replication factor 3 has every replica in sync and each follower's
log identical to the leader's; `acks=all` answers only once the in-sync replicas have a write,
and `min.insync.replicas` refuses writes the ISR cannot hold (NOT_ENOUGH_REPLICAS); a follower
frozen past `replica.lag.time.max.ms` leaves the ISR and rejoins when it catches up; a leader
killed with -9 is replaced by an in-sync follower at a higher leader epoch, with nothing that
was acknowledged lost; a restarted old leader truncates what it alone had and catches up.

Timings are short (cluster.py, plus a lag time of 1.5 s) and every wait is bounded.
"""

import collections
import os
import random
import shutil
import threading
import time
import urllib.request

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka import ConsumerGroupTopicPartitions, ElectionType
from confluent_kafka.admin import AdminClient, NewTopic

from cluster import NONE
from kafka.admin import NewTopic as KpNewTopic
from kafka.protocol.find_coordinator import FindCoordinatorRequest
from kafka.protocol.metadata import MetadataRequest

from helpers import ack_stall, acks_flowing, c_consumer, c_producer, kp_admin, read_isolated, unique

LAG_TIME_MS = 1500
REPLICATION_SETTINGS = {"replica.lag.time.max.ms": str(LAG_TIME_MS), "replica.fetch.wait.max.ms": "200"}


def figure(text):
    print(f"\n[replication figure] {text}", flush=True)


@pytest.fixture
def replicated(cluster_factory):
    return cluster_factory(voters=3, settings=REPLICATION_SETTINGS)


def create_replicated(cluster, name, partitions=1, rf=3, config=None, assignment=None):
    if assignment:
        # confluent-kafka's NewTopic refuses a replica assignment: kafka-python sends it.
        admin = kp_admin(cluster.bootstrap())
        try:
            admin.create_topics(
                [
                    KpNewTopic(
                        name,
                        num_partitions=-1,
                        replication_factor=-1,
                        replica_assignments=dict(enumerate(assignment)),
                        topic_configs=config or {},
                    )
                ],
                timeout_ms=30000,
            )
        finally:
            admin.close()
        partitions, rf = len(assignment), len(assignment[0])
    else:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap()})
        futures = admin.create_topics(
            [NewTopic(name, partitions, rf, config=config or {})], operation_timeout=20, request_timeout=30
        )
        futures[name].result(timeout=40)
    return wait_in_sync(cluster, name, partitions, rf)


def partition_states(cluster, topic, via=None):
    """{partition: (leader, replicas, isr)} as a node's Metadata says."""
    admin = AdminClient({"bootstrap.servers": cluster.node(via).bootstrap if via else cluster.bootstrap()})
    md = admin.list_topics(topic, timeout=10)
    t = md.topics[topic]
    if t.error is not None:
        return {}
    return {p: (m.leader, sorted(m.replicas), sorted(m.isrs)) for p, m in t.partitions.items()}


def wait_in_sync(cluster, topic, partitions, size, timeout=30):
    """Waits until every partition has a leader and an ISR of `size`; returns the states."""

    def ready():
        states = partition_states(cluster, topic)
        if len(states) != partitions:
            return None
        if any(leader < 0 or len(isr) != size for leader, _, isr in states.values()):
            return None
        return states

    return cluster.wait(ready, timeout, f"{topic}: {partitions} partitions led with {size} in sync")


def produce(bootstrap, topic, values, acks="all", partition=0, timeout=30, retries=None):
    """Produces each value; returns {value: (error or None, offset)} as the delivery reports say.
    With retries=0 the first error is reported (librdkafka retries NOT_ENOUGH_REPLICAS)."""
    conf = {"acks": acks, "message.timeout.ms": int(timeout * 1000) - 2000}
    conf["enable.idempotence"] = acks == "all" and retries is None
    if retries is not None:
        conf["retries"] = retries
    producer = c_producer(bootstrap, conf)
    reports = {}

    def report(err, msg):
        reports[msg.value()] = (err, msg.offset())

    for v in values:
        producer.produce(topic, v, partition=partition, on_delivery=report)
        producer.poll(0)
    producer.flush(timeout)
    return reports


def read_partition(bootstrap, topic, partition, n, timeout=30):
    consumer = c_consumer(bootstrap, conf={"enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, partition, 0)])
        got = []
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(msg.error())
            got.append((msg.offset(), msg.value()))
        return got
    finally:
        consumer.close()


def test_replicas_stay_in_sync_and_acks_all_survives_the_leader_killed(replicated):
    cluster = replicated
    topic = unique("repl")
    states = create_replicated(cluster, topic, partitions=1, rf=3, config={"min.insync.replicas": "2"})
    leader, replicas, isr = states[0]
    assert replicas == [1, 2, 3] and isr == [1, 2, 3], states

    first = [f"a-{i}".encode() for i in range(200)]
    reports = produce(cluster.bootstrap(), topic, first)
    assert all(err is None for err, _ in reports.values()), [r for r in reports.values() if r[0]][:3]

    started = time.monotonic()
    cluster.node(leader).kill9()
    survivors = [i for i in cluster.ids() if i != leader]

    def new_leader():
        s = partition_states(cluster, topic, via=survivors[0]).get(0)
        return s if s and s[0] in survivors else None

    after = cluster.wait(new_leader, 20, "a new leader among the survivors")
    assert leader not in after[2], f"the dead leader left the ISR: {after}"

    second = [f"b-{i}".encode() for i in range(200)]
    reports2 = produce(cluster.bootstrap(survivors), topic, second)
    figure(f"leader kill -9 to new leader in {time.monotonic() - started:.2f}s")
    assert all(err is None for err, _ in reports2.values()), [r for r in reports2.values() if r[0]][:3]

    got = read_partition(cluster.bootstrap(survivors), topic, 0, 400)
    values = [v for _, v in got]
    assert values == first + second, "every acknowledged record, once, in order"
    assert [o for o, _ in got] == list(range(400))

    # The old leader comes back, catches up and rejoins the ISR.
    cluster.node(leader).start()
    wait_in_sync(cluster, topic, 1, 3, timeout=30)
    third = [f"c-{i}".encode() for i in range(50)]
    reports3 = produce(cluster.bootstrap(), topic, third)
    assert all(err is None for err, _ in reports3.values())
    got = read_partition(cluster.bootstrap(), topic, 0, 450)
    assert [v for _, v in got] == first + second + third


def test_a_frozen_follower_leaves_the_isr_and_min_insync_replicas_refuses_what_the_isr_cannot_hold(cluster_factory):
    # One voter (node 1, the leader) and two broker-only followers: freezing both followers
    # leaves the metadata quorum whole, so the ISR can shrink to the leader.
    cluster = cluster_factory(voters=1, brokers=2, settings=REPLICATION_SETTINGS)
    topic = unique("minisr")
    states = create_replicated(cluster, topic, config={"min.insync.replicas": "2"}, assignment=[[1, 2, 3]])
    leader = states[0][0]
    assert leader == 1, states
    followers = [2, 3]

    # One follower frozen: acks=all waits for it until it leaves the ISR, then goes on with two.
    cluster.node(followers[0]).pause()
    started = time.monotonic()
    reports = produce(cluster.bootstrap([leader]), topic, [b"one-frozen"])
    waited = time.monotonic() - started
    assert reports[b"one-frozen"][0] is None, reports
    figure(f"acks=all with a frozen follower answered after {waited:.2f}s (lag time {LAG_TIME_MS} ms)")
    isr = partition_states(cluster, topic, via=leader)[0][2]
    assert followers[0] not in isr, f"the frozen follower left the ISR: {isr}"
    assert gauge(cluster.node(leader), "weir_under_replicated_partitions") >= 1

    # Both frozen: the ISR shrinks to the leader; acks=all is refused, acks=1 still works.
    cluster.node(followers[1]).pause()
    cluster.wait(
        lambda: partition_states(cluster, topic, via=leader)[0][2] == [leader],
        LAG_TIME_MS / 1000 + 10,
        "the ISR to shrink to the leader",
    )
    refused = produce(cluster.bootstrap([leader]), topic, [b"refused"], timeout=8, retries=0)
    err = refused[b"refused"][0]
    assert err is not None and err.code() == KafkaError.NOT_ENOUGH_REPLICAS, refused
    leader_only = produce(cluster.bootstrap([leader]), topic, [b"acks-1"], acks="1")
    assert leader_only[b"acks-1"][0] is None, leader_only
    assert gauge(cluster.node(leader), "weir_under_min_isr_partitions") >= 1

    # Thawed, they catch up and rejoin; acks=all works again and every replica has the data.
    for f in followers:
        cluster.node(f).resume()
    wait_in_sync(cluster, topic, 1, 3, timeout=30)
    cluster.wait(
        lambda: gauge(cluster.node(leader), "weir_under_min_isr_partitions") == 0, 10, "the ISR gauge to clear"
    )
    after = produce(cluster.bootstrap(), topic, [b"after"])
    assert after[b"after"][0] is None, after
    got = [v for _, v in read_partition(cluster.bootstrap(), topic, 0, 3)]
    assert got == [b"one-frozen", b"acks-1", b"after"], got


# ---------------------------------------------------------------------------------------------
# The fault test: an idempotent acks=all producer and a consumer group run on a replicated topic
# while nodes are killed, frozen, restarted and the controller moves.

FAULT_ROUNDS = int(os.environ.get("WEIR_FAULT_ROUNDS", "20"))
FAULT_PARTITIONS = 3


def leader_epochs(cluster, node_id, topic):
    """{partition: (leader, leader_epoch, isr)} from node_id's Metadata v7, or {} if it cannot say."""
    client = cluster.raw(node_id, timeout=5)
    try:
        response = client.request(
            MetadataRequest[7](topics=[topic], allow_auto_topic_creation=False), timeout=5
        )
    finally:
        client.close()
    out = {}
    for error_code, name, _internal, partitions in response.topics:
        if name != topic or error_code != NONE:
            continue
        for p in partitions:
            out[p[1]] = (p[2], p[3], sorted(p[5]))
    return out


class Workload:
    """The producer and the consumer threads, and what each saw."""

    def __init__(self, cluster, topic):
        self.cluster = cluster
        self.topic = topic
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.sent = {p: 0 for p in range(FAULT_PARTITIONS)}
        self.acked = {}  # value -> (partition, offset)
        self.ack_times = {p: [] for p in range(FAULT_PARTITIONS)}  # monotonic times of acks
        self.failed = []  # (value, error) of sends that were not acknowledged
        self.consumed = {}  # (partition, offset) -> value
        self.consume_errors = []
        self.epochs = {}  # (partition, leader_epoch) -> {leaders seen}
        self.threads = [
            threading.Thread(target=self.produce, daemon=True),
            threading.Thread(target=self.consume, daemon=True),
            threading.Thread(target=self.watch_leaders, daemon=True),
        ]

    def start(self):
        for t in self.threads:
            t.start()

    def finish(self, timeout=90):
        self.stop.set()
        for t in self.threads:
            t.join(timeout)
            assert not t.is_alive(), f"{t} did not stop"

    def produce(self):
        producer = c_producer(
            self.cluster.bootstrap(),
            {"acks": "all", "enable.idempotence": True, "message.timeout.ms": 120000, "linger.ms": 5},
        )

        def report(err, msg):
            with self.lock:
                if err is None:
                    self.acked[msg.value()] = (msg.partition(), msg.offset())
                    self.ack_times[msg.partition()].append(time.monotonic())
                else:
                    self.failed.append((msg.value(), err))

        seq = 0
        while not self.stop.is_set():
            p = seq % FAULT_PARTITIONS
            value = f"p{p}-{seq // FAULT_PARTITIONS:07d}".encode()
            try:
                producer.produce(self.topic, value, partition=p, on_delivery=report)
                seq += 1
                with self.lock:
                    self.sent[p] += 1
            except BufferError:
                pass
            producer.poll(0.002)
        assert producer.flush(130) == 0, "every message was acknowledged or failed"

    def consume(self):
        consumer = c_consumer(
            self.cluster.bootstrap(),
            group=unique("faultgroup"),
            conf={"auto.offset.reset": "earliest", "enable.auto.commit": True, "auto.commit.interval.ms": 200},
        )
        consumer.subscribe([self.topic])
        try:
            while not self.stop.is_set():
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                if msg.error():
                    if not msg.error().retriable() and msg.error().code() != KafkaError._PARTITION_EOF:
                        self.consume_errors.append(msg.error())
                    continue
                key = (msg.partition(), msg.offset())
                with self.lock:
                    seen = self.consumed.setdefault(key, msg.value())
                    if seen != msg.value():
                        self.consume_errors.append(f"offset {key} read as {seen!r} and later {msg.value()!r}")
        finally:
            consumer.close()

    def watch_leaders(self):
        while not self.stop.is_set():
            for node in self.cluster.live_brokers():
                if node.paused:
                    continue
                try:
                    states = leader_epochs(self.cluster, node.node_id, self.topic)
                except (OSError, TimeoutError, ConnectionError):
                    continue
                with self.lock:
                    for p, (leader, epoch, _isr) in states.items():
                        if leader >= 0:
                            self.epochs.setdefault((p, epoch), set()).add(leader)
            time.sleep(0.1)

    def times_of(self, partition):
        with self.lock:
            return list(self.ack_times[partition])

    def acked_count(self):
        with self.lock:
            return len(self.acked)


def wait_healthy(cluster, topic, timeout=40):
    """Every partition led by a live broker with at least 2 in sync, as a live node says."""

    def healthy():
        live = [n for n in cluster.live_brokers() if not n.paused]
        for node in live:
            states = leader_epochs(cluster, node.node_id, topic)
            if len(states) == FAULT_PARTITIONS and all(
                leader in [n.node_id for n in live] and len(isr) >= 2 for leader, _, isr in states.values()
            ):
                return states
        return None

    return cluster.wait(healthy, timeout, f"{topic}: every partition led with 2 or more in sync", interval=0.2)


def wait_progress(workload, timeout=40):
    """The producer gets acknowledgements again."""
    before = workload.acked_count()
    workload.cluster.wait(lambda: workload.acked_count() > before + 20, timeout, "the producer to make progress")


@pytest.mark.timeout(90 + FAULT_ROUNDS * 15)
def test_acknowledged_writes_survive_rounds_of_kills_freezes_restarts_and_controller_moves(replicated):
    cluster = replicated
    topic = unique("faults")
    create_replicated(cluster, topic, partitions=FAULT_PARTITIONS, rf=3, config={"min.insync.replicas": "2"})
    workload = Workload(cluster, topic)
    workload.start()
    rng = random.Random(int(os.environ.get("WEIR_FAULT_SEED", "14")))
    # How long each kill -9 stopped the acknowledgements of each partition (`ack_stall`), by
    # the victim's part in it: "led", "followed", and the same when it was the controller.
    stalls = collections.defaultdict(list)
    actions = []
    started = time.monotonic()
    try:
        wait_progress(workload)
        for round_ in range(FAULT_ROUNDS):
            states = wait_healthy(cluster, topic)
            kind = ["kill-leader", "freeze-follower", "restart-node", "kill-controller"][round_ % 4]
            if kind == "kill-leader":
                p = rng.randrange(FAULT_PARTITIONS)
                victim = states[p][0]
                killed_at = time.monotonic()
                cluster.node(victim).kill9()
                record_stalls(workload, states, victim, killed_at, stalls, "")
                cluster.node(victim).start()
            elif kind == "freeze-follower":
                p = rng.randrange(FAULT_PARTITIONS)
                leader, _, isr = states[p]
                victim = rng.choice([b for b in isr if b != leader])
                cluster.node(victim).pause()
                time.sleep(LAG_TIME_MS / 1000 + 1.0)
                cluster.node(victim).resume()
            elif kind == "restart-node":
                victim = rng.choice(cluster.ids())
                cluster.node(victim).restart()
            else:
                # Right after a restart the quorum may be electing: wait for its leader.
                victim = cluster.wait(lambda: controller_of(cluster), 30, "an active controller", interval=0.2)
                killed_at = time.monotonic()
                cluster.node(victim).kill9()
                record_stalls(workload, states, victim, killed_at, stalls, "controller ")
                cluster.node(victim).start()
            actions.append((kind, victim))
            wait_progress(workload)
    finally:
        for node in cluster.nodes.values():
            node.resume()
    wait_healthy(cluster, topic, timeout=60)
    wait_progress(workload)
    workload.finish()
    elapsed = time.monotonic() - started

    # Everything in the log now, per partition, in offset order.
    final = {}
    for p in range(FAULT_PARTITIONS):
        expected = workload.sent[p]
        got = read_partition(cluster.bootstrap(), topic, p, expected, timeout=60)
        final[p] = got
    values_at = {(p, o): v for p, got in final.items() for o, v in got}

    # Every acknowledged message is there exactly once, at the offset it was acknowledged at.
    counts = {}
    for got in final.values():
        for _, v in got:
            counts[v] = counts.get(v, 0) + 1
    duplicated = [v for v, n in counts.items() if n > 1]
    if duplicated:
        # Where each copy is and which one was acknowledged: tells a lost producer state
        # (a retry appended again) from a client re-sending under a new epoch.
        where = {v: [(p, o) for (p, o), x in values_at.items() if x == v] for v in duplicated[:3]}
        detail = [f"{v!r} at {where[v]}, acknowledged at {workload.acked.get(v)}" for v in duplicated[:3]]
        actions_text = ", ".join(f"{k}:{n}" for k, n in actions)
        raise AssertionError(f"{len(duplicated)} messages stored twice: {detail}; faults: {actions_text}")
    missing = [v for v in workload.acked if v not in counts]
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:3]}"
    # librdkafka acknowledges a batch whose request failed with an uncertain outcome (a timeout,
    # a dropped connection) once a later batch of the same idempotent producer succeeds: the
    # broker took the later sequence, so it has the earlier one. Such an implicit ack carries
    # no offset (None); those messages are checked above for being there exactly once.
    implicit = [v for v, (_, offset) in workload.acked.items() if offset is None]
    moved = [(v, at) for v, at in workload.acked.items() if at[1] is not None and values_at.get(at) != v]
    assert not moved, f"acknowledged at one offset, stored at another: {moved[:3]}"
    # Per-partition order: each partition's log holds its sequence numbers in send order.
    for p, got in final.items():
        seqs = [int(v.split(b"-")[1]) for _, v in got]
        assert seqs == sorted(seqs), f"partition {p} out of order"
        assert all(v.startswith(f"p{p}-".encode()) for _, v in got)
    # No consumer saw a record that is not in the log at that offset now (below the high
    # watermark nothing disappears or changes).
    assert not workload.consume_errors, workload.consume_errors[:3]
    vanished = [(k, v) for k, v in workload.consumed.items() if values_at.get(k) != v]
    assert not vanished, f"{len(vanished)} consumed records vanished or changed, e.g. {vanished[:3]}"
    # One leader per partition and epoch.
    split = {k: v for k, v in workload.epochs.items() if len(v) > 1}
    assert not split, f"two brokers led in one epoch: {split}"

    stall_text = "; ".join(
        f"{kind} p50 {percentile(v, 50):.2f}s max {max(v):.2f}s ({len(v)})" for kind, v in sorted(stalls.items())
    )
    figure(
        f"{FAULT_ROUNDS} rounds in {elapsed:.0f}s: {len(workload.acked)} acknowledged, "
        f"{len(workload.failed)} failed sends, {len(implicit)} acknowledged implicitly (no offset), "
        f"{len(workload.consumed)} consumed; acknowledgements stopped by a kill -9 on partitions the victim "
        f"{stall_text}; actions {dict(collections.Counter(kind for kind, _ in actions))}"
    )


def record_stalls(workload, states, victim, killed_at, stalls, prefix):
    """Waits until every partition acknowledges again after the kill of `victim`, and records
    how long each stopped, under "led" or "followed" (prefixed)."""
    def resumed():
        now = time.monotonic()
        since = [[t for t in workload.times_of(p) if t > killed_at] for p in range(FAULT_PARTITIONS)]
        return now - killed_at > 1.0 and all(acks_flowing(times, now) for times in since)

    workload.cluster.wait(
        resumed,
        40,
        "acknowledgements on every partition",
        interval=0.1,
    )
    for p, (leader, _, _) in states.items():
        stall = ack_stall(workload.times_of(p), killed_at)
        stalls[prefix + ("led" if leader == victim else "followed")].append(stall)


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


def controller_of(cluster):
    """The active controller, as a node's admin API reports it."""
    return cluster.active_controller()


def find_coordinator(cluster, key, kind, via):
    """The coordinator's node id for a group (kind 0) or transactional id (kind 1), from `via`."""
    client = cluster.raw(via, timeout=5)
    try:
        response = client.request(FindCoordinatorRequest[1](coordinator_key=key, coordinator_type=kind), timeout=5)
    finally:
        client.close()
    return response.coordinator_id if response.error_code == NONE else None


def test_group_and_transaction_coordinators_fail_over_with_their_partitions(replicated, closer):
    """The internal topics have three replicas: when the broker coordinating a group and a
    transaction is killed with -9, another takes both over with the committed offsets and the
    open transaction, which then commits."""
    cluster = replicated
    topic = unique("coord")
    create_replicated(cluster, topic, partitions=3, rf=3, config={"min.insync.replicas": "2"})
    group = unique("g")
    txn_id = unique("tx")
    producer = closer.add(c_producer(cluster.bootstrap(), {"transactional.id": txn_id, "linger.ms": 1}))
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(30):
        producer.produce(topic, value=f"t{i}".encode(), partition=i % 3)
    producer.flush(30)
    group_coordinator = cluster.wait(lambda: find_coordinator(cluster, group, 0, 1), 20, "a group coordinator")
    txn_coordinator = cluster.wait(lambda: find_coordinator(cluster, txn_id, 1, 1), 20, "a transaction coordinator")

    consumer = closer.add(c_consumer(cluster.bootstrap(), group=group, conf={"enable.auto.commit": False}))
    offsets = [TopicPartition(topic, p, 7 + p) for p in range(3)]
    consumer.commit(offsets=offsets, asynchronous=False)
    consumer.close()

    # Kill the group's coordinator (and, if it is another broker, then the transaction's too:
    # one at a time, so that two replicas of every partition stay).
    victims = [group_coordinator] + ([txn_coordinator] if txn_coordinator != group_coordinator else [])
    for victim in victims:
        cluster.node(victim).kill9()
        survivors = [i for i in cluster.ids() if i != victim]
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap(survivors)})

        def committed():
            try:
                result = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(10)
            except KafkaException:
                return None
            got = {tp.partition: tp.offset for tp in result.topic_partitions if tp.topic == topic}
            return got if got == {0: 7, 1: 8, 2: 9} else None

        cluster.wait(committed, 30, "the committed offsets at the new group coordinator", interval=0.5)
        assert find_coordinator(cluster, group, 0, survivors[0]) in survivors
        if victim == txn_coordinator:
            break
        cluster.node(victim).start()
        wait_in_sync(cluster, topic, 3, 3)

    # The open transaction commits through the new transaction coordinator.
    producer.commit_transaction(60)
    committed_records = read_isolated(cluster.bootstrap(), topic, 3, "read_committed", 30)
    assert sorted(v for _, v in committed_records) == sorted(f"t{i}" for i in range(30))


def test_a_broker_lost_for_good_is_replaced_by_an_empty_one_that_catches_up(cluster_factory):
    """A broker-only node's data directory is lost; a new process with its id and an empty
    directory replicates every partition from the leader and rejoins the ISR, and its log is
    the leader's byte for byte."""
    cluster = cluster_factory(voters=1, brokers=2, settings=REPLICATION_SETTINGS)
    topic = unique("lost")
    create_replicated(cluster, topic, config={"min.insync.replicas": "2"}, assignment=[[1, 2, 3]])
    first = [f"a-{i}".encode() * 20 for i in range(300)]
    assert all(err is None for err, _ in produce(cluster.bootstrap(), topic, first).values())
    cluster.node(3).kill9()
    second = [f"b-{i}".encode() * 20 for i in range(300)]
    assert all(err is None for err, _ in produce(cluster.bootstrap([1, 2]), topic, second).values())

    shutil.rmtree(cluster.node(3).data_dir)
    cluster.node(3).data_dir.mkdir()
    cluster.node(3).start()
    wait_in_sync(cluster, topic, 1, 3, timeout=30)
    third = [f"c-{i}".encode() for i in range(50)]
    assert all(err is None for err, _ in produce(cluster.bootstrap(), topic, third).values())
    wait_in_sync(cluster, topic, 1, 3, timeout=30)

    def same_log():
        leader = sorted((cluster.node(1).data_dir / f"{topic}-0").glob("*.log"))
        newcomer = sorted((cluster.node(3).data_dir / f"{topic}-0").glob("*.log"))
        if [p.name for p in leader] != [p.name for p in newcomer]:
            return False
        return all(a.read_bytes() == b.read_bytes() for a, b in zip(leader, newcomer))

    cluster.wait(same_log, 20, "the newcomer's log to equal the leader's", interval=0.2)


def leaders_and_preferred(cluster, topic):
    """{partition: (leader, preferred replica)} from Metadata."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap()})
    t = admin.list_topics(topic, timeout=10).topics[topic]
    return {p: (m.leader, m.replicas[0]) for p, m in t.partitions.items()}


def unbalance(cluster, topic, partitions):
    """Kills the preferred leader of partition 0, waits for the failover, restarts it and waits
    until it is in sync again: it then leads nothing it prefers. Returns its id."""
    victim = leaders_and_preferred(cluster, topic)[0][1]
    cluster.node(victim).kill9()
    cluster.wait(
        lambda: all(l not in (victim, -1) for l, _ in leaders_and_preferred(cluster, topic).values()),
        30,
        "every partition led by a survivor",
    )
    cluster.node(victim).start()
    wait_in_sync(cluster, topic, partitions, 3)
    return victim


def test_elect_leaders_gives_partitions_back_to_their_preferred_replica(cluster_factory):
    settings = dict(REPLICATION_SETTINGS, **{"auto.leader.rebalance.enable": "false"})
    cluster = cluster_factory(voters=3, settings=settings)
    topic = unique("elect")
    create_replicated(cluster, topic, partitions=3, rf=3)
    victim = unbalance(cluster, topic, 3)
    state = leaders_and_preferred(cluster, topic)
    moved = [TopicPartition(topic, p) for p, (leader, preferred) in state.items() if leader != preferred]
    assert moved, f"broker {victim} came back leading nothing: {state}"

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap()})
    results = admin.elect_leaders(ElectionType.PREFERRED, moved).result(timeout=30)
    assert all(err is None for err in results.values()), results
    cluster.wait(
        lambda: all(l == p for l, p in leaders_and_preferred(cluster, topic).values()),
        15,
        "every partition led by its preferred replica",
    )
    # Asked again: nothing to do, and the client is told so per partition.
    again = admin.elect_leaders(ElectionType.PREFERRED, moved).result(timeout=30)
    assert all(err is not None and err.code() == KafkaError.ELECTION_NOT_NEEDED for err in again.values()), again
    # Data still flows through the moved leaders.
    for p in range(3):
        assert produce(cluster.bootstrap(), topic, [f"after-{p}".encode()], partition=p)[f"after-{p}".encode()][0] is None


def test_the_controller_rebalances_leaders_by_itself(cluster_factory):
    settings = dict(REPLICATION_SETTINGS, **{"leader.imbalance.check.interval.seconds": "2"})
    cluster = cluster_factory(voters=3, settings=settings)
    topic = unique("rebalance")
    create_replicated(cluster, topic, partitions=3, rf=3)
    unbalance(cluster, topic, 3)
    cluster.wait(
        lambda: all(l == p for l, p in leaders_and_preferred(cluster, topic).values()),
        20,
        "the controller's balance check to give every partition back to its preferred replica",
    )


def metrics_text(node):
    with urllib.request.urlopen(f"{node.admin_url()}/metrics", timeout=10) as response:
        return response.read().decode()


def gauge(node, name):
    """A label-less metric of the node's /metrics."""
    for line in metrics_text(node).splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in {node}'s metrics")


def topic_bytes_out(node, topic):
    """The node's weir_topic_bytes_out_total for the topic (0 if absent)."""
    total = 0.0
    for line in metrics_text(node).splitlines():
        if line.startswith("weir_topic_bytes_out_total") and f'topic="{topic}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_consumer_with_client_rack_reads_from_the_in_sync_replica_in_its_rack(cluster_factory):
    """KIP-392: with the rack-aware replica selector, the leader points a consumer that gives
    its client.rack to the in-sync follower in that rack, and the follower serves it."""
    settings = dict(
        REPLICATION_SETTINGS, **{"replica.selector.class": "org.apache.kafka.common.replica.RackAwareReplicaSelector"}
    )
    cluster = cluster_factory(voters=3, settings=settings, start=False)
    for node_id, node in cluster.nodes.items():
        node.settings["broker.rack"] = f"rack-{node_id}"
    cluster.start()
    cluster.wait_formed()
    topic = unique("rack")
    create_replicated(cluster, topic, assignment=[[1, 2, 3]])
    values = [f"r-{i}".encode() for i in range(100)]
    assert all(err is None for err, _ in produce(cluster.bootstrap(), topic, values).values())

    consumer = c_consumer(cluster.bootstrap(), conf={"client.rack": "rack-3", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < len(values) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                got.append(msg.value())
    finally:
        consumer.close()
    assert got == values
    assert topic_bytes_out(cluster.node(3), topic) > 0, "the follower in rack-3 served the consumer"
    assert topic_bytes_out(cluster.node(1), topic) == 0, "the leader (rack-1) sent it no records"
