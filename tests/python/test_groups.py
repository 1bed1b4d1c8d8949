"""Consumer groups: rebalancing under load, and committed offsets resuming with both clients."""

import subprocess
import sys
import threading
import time

import pytest
from confluent_kafka import Consumer, ConsumerGroupState, ConsumerGroupTopicPartitions, KafkaError, KafkaException
from confluent_kafka import TopicPartition as CTopicPartition
from kafka import TopicPartition

from helpers import (
    TIMEOUT_S,
    c_admin,
    c_consume,
    c_consumer,
    c_create_topic,
    c_produce,
    c_producer,
    kp_consume,
    kp_consumer,
    unique,
    wait_until,
)

PARTITIONS = 12
PRODUCE_RATE_PER_S = 300


class GroupLog:
    """What every member did, in one order, checked for the group's guarantees as it happens."""

    def __init__(self):
        self.lock = threading.Lock()
        self.owner = {}  # partition -> member name, from the members' assign/revoke callbacks
        self.committed = {}  # partition -> highest offset committed successfully
        self.consumed = {}  # partition -> set of offsets consumed (by anyone)
        self.values = set()
        self.per_member = {}  # member -> records consumed
        self.violations = []
        self.errors = []
        self.commit_failures = 0
        self.duplicates = 0

    def assigned(self, member, partitions):
        with self.lock:
            for p in partitions:
                other = self.owner.get(p)
                if other is not None and other != member:
                    self.violations.append(f"partition {p} assigned to {member} while {other} still owns it")
                self.owner[p] = member

    def revoked(self, member, partitions):
        with self.lock:
            for p in partitions:
                if self.owner.get(p) == member:
                    del self.owner[p]

    def owned_by(self, member):
        with self.lock:
            return {p for p, m in self.owner.items() if m == member}

    def consumed_one(self, member, partition, offset, value):
        with self.lock:
            if self.owner.get(partition) != member:
                self.violations.append(f"{member} consumed {partition}@{offset} without owning {partition}")
            if offset < self.committed.get(partition, 0):
                self.violations.append(
                    f"{member} consumed {partition}@{offset} after offset {self.committed[partition]} was committed"
                )
            self.per_member[member] = self.per_member.get(member, 0) + 1
            seen = self.consumed.setdefault(partition, set())
            if offset in seen:
                self.duplicates += 1
            seen.add(offset)
            self.values.add(value)

    def committed_one(self, partition, next_offset):
        with self.lock:
            self.committed[partition] = max(self.committed.get(partition, 0), next_offset)

    def snapshot_committed(self):
        with self.lock:
            return dict(self.committed)


class Member(threading.Thread):
    """One confluent-kafka group member: consumes a batch, then commits it synchronously."""

    def __init__(self, name, bootstrap, group, topic, strategy, log):
        super().__init__(name=name, daemon=True)
        self.log = log
        self.topic = topic
        self.member_id = None
        self.stopping = threading.Event()
        self.closed = threading.Event()
        self.lost = []
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "client.id": name,
                "partition.assignment.strategy": strategy,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 500,
                "max.poll.interval.ms": 30000,
                "fetch.wait.max.ms": 100,
            }
        )

    @property
    def owned(self):
        return self.log.owned_by(self.name)

    def _on_assign(self, consumer, partitions):
        self.log.assigned(self.name, [tp.partition for tp in partitions])
        self.member_id = consumer.memberid()

    def _on_revoke(self, consumer, partitions):
        self.log.revoked(self.name, [tp.partition for tp in partitions])

    def _on_lost(self, consumer, partitions):
        self.lost.append([tp.partition for tp in partitions])
        self._on_revoke(consumer, partitions)

    def run(self):
        self.consumer.subscribe(
            [self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        try:
            while not self.stopping.is_set():
                # Revocations happen only inside consume(), so between it and the commit below
                # this member still owns every partition of the batch.
                batch = self.consumer.consume(num_messages=100, timeout=0.1)
                positions = {}
                for msg in batch:
                    if msg.error():
                        if msg.error().code() != KafkaError._PARTITION_EOF:
                            self.log.errors.append(f"{self.name}: {msg.error()}")
                        continue
                    self.log.consumed_one(self.name, msg.partition(), msg.offset(), msg.value())
                    positions[msg.partition()] = msg.offset() + 1
                if not positions:
                    continue
                offsets = [CTopicPartition(self.topic, p, o) for p, o in positions.items()]
                try:
                    result = self.consumer.commit(offsets=offsets, asynchronous=False)
                except KafkaException:
                    # Allowed while a rebalance is under way: these records were not committed,
                    # so the partitions' next owners may read them again.
                    self.log.commit_failures += 1
                    continue
                for tp in result:
                    if tp.error is None:
                        self.log.committed_one(tp.partition, tp.offset)
                    else:
                        self.log.commit_failures += 1
        finally:
            self.consumer.close()  # revokes (on_revoke) and leaves the group
            self.closed.set()

    def stop(self, timeout=TIMEOUT_S):
        self.stopping.set()
        self.join(timeout)
        assert self.closed.is_set(), f"{self.name} did not close within {timeout}s"


class RateProducer(threading.Thread):
    """Produces sequence-numbered records round-robin over the partitions at a steady rate."""

    def __init__(self, bootstrap, topic):
        super().__init__(name="producer", daemon=True)
        self.topic = topic
        self.producer = c_producer(bootstrap)
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.acked = {}  # partition -> next offset after the highest acknowledged one
        self.failures = []
        self.sent = 0

    def _on_delivery(self, err, msg):
        if err is not None:
            self.failures.append(err)
            return
        with self.lock:
            self.acked[msg.partition()] = max(self.acked.get(msg.partition(), 0), msg.offset() + 1)

    def run(self):
        per_tick = PRODUCE_RATE_PER_S // 10
        try:
            while not self.stopping.is_set():
                for _ in range(per_tick):
                    seq = self.sent
                    self.producer.produce(
                        self.topic, value=str(seq).encode(), partition=seq % PARTITIONS, on_delivery=self._on_delivery
                    )
                    self.sent += 1
                self.producer.poll(0)
                self.stopping.wait(0.1)  # the rate, not a wait for a condition
            if self.producer.flush(TIMEOUT_S) != 0:
                self.failures.append("records still unacknowledged at the end")
        except Exception as e:  # noqa: BLE001 - reported by the test, which checks failures
            self.failures.append(f"producer thread: {e!r}")

    def acked_snapshot(self):
        with self.lock:
            return dict(self.acked)


def wait_for_stable_group(admin, group, members):
    """Waits until the live members own disjoint, balanced sets covering every partition, and the
    broker describes the group as Stable with the same members and assignments."""
    everything = set(range(PARTITIONS))

    def client_side_ok():
        owned = [m.owned for m in members]
        if sum(len(o) for o in owned) != PARTITIONS or set().union(*owned) != everything:
            return False
        sizes = [len(o) for o in owned]
        return min(sizes) >= 1 and max(sizes) - min(sizes) <= 1

    wait_until(client_side_ok, what=f"{len(members)} members sharing {PARTITIONS} partitions")

    seen = {}

    def broker_agrees():
        desc = admin.describe_consumer_groups([group])[group].result(timeout=TIMEOUT_S)
        seen["broker"] = (
            desc.state,
            {m.member_id: {tp.partition for tp in m.assignment.topic_partitions} for m in desc.members},
        )
        seen["clients"] = {m.member_id: m.owned for m in members}
        return desc.state == ConsumerGroupState.STABLE and seen["broker"][1] == seen["clients"]

    try:
        wait_until(broker_agrees, timeout=15, interval=0.2, what="the broker's view of the group")
    except AssertionError as e:
        raise AssertionError(f"{e}: broker {seen.get('broker')} vs clients {seen.get('clients')}") from None


def wait_for_progress(producer, log, members, what):
    """Waits until every live member consumed new records, and every record acknowledged so far
    has been consumed and committed: consumption goes on with this membership."""
    with log.lock:
        before = {m.name: log.per_member.get(m.name, 0) for m in members}

    def all_members_consumed():
        with log.lock:
            return all(log.per_member.get(name, 0) > n for name, n in before.items())

    wait_until(all_members_consumed, timeout=30, interval=0.05, what=f"every member to consume ({what})")
    target = producer.acked_snapshot()

    def caught_up():
        assert not producer.failures, producer.failures
        committed = log.snapshot_committed()
        return all(committed.get(p, 0) >= o for p, o in target.items())

    wait_until(caught_up, timeout=60, interval=0.1, what=f"consumption to catch up ({what})")


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_group_of_three_rebalances_when_a_fourth_joins_and_one_leaves(broker, strategy):
    admin = c_admin(broker.bootstrap)
    topic = c_create_topic(admin, unique("rebalance"), partitions=PARTITIONS)
    group = unique("rebalance-group")
    log = GroupLog()
    producer = RateProducer(broker.bootstrap, topic)
    members = [Member(f"m{i}", broker.bootstrap, group, topic, strategy, log) for i in range(1, 4)]
    started = list(members)
    try:
        producer.start()
        for m in members:
            m.start()
        wait_for_stable_group(admin, group, members)
        wait_for_progress(producer, log, members, "three members")

        fourth = Member("m4", broker.bootstrap, group, topic, strategy, log)
        started.append(fourth)
        fourth.start()
        members.append(fourth)
        wait_for_stable_group(admin, group, members)
        wait_for_progress(producer, log, members, "four members")

        leaving = members.pop(0)
        leaving.stop()
        wait_for_stable_group(admin, group, members)
        wait_for_progress(producer, log, members, "after one left")

        producer.stopping.set()
        producer.join(TIMEOUT_S)
        assert not producer.is_alive() and not producer.failures, producer.failures
        final = producer.acked_snapshot()
        assert sum(final.values()) == producer.sent
        wait_for_progress(producer, log, [], "all records")
    finally:
        producer.stopping.set()
        for m in started:
            if m.is_alive():
                m.stop()

    assert not log.violations, log.violations[:10]
    assert not log.errors, log.errors[:10]
    assert all(not m.lost for m in started), {m.name: m.lost for m in started}
    # Nothing lost: every offset of every partition was consumed, every record's value seen.
    for p in range(PARTITIONS):
        assert log.consumed.get(p, set()) == set(range(final.get(p, 0))), f"partition {p}"
    assert log.values == {str(i).encode() for i in range(producer.sent)}
    # The broker kept what was committed: exactly the end of every partition.
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(timeout=TIMEOUT_S)
    assert {tp.partition: tp.offset for tp in offsets.topic_partitions} == {p: final.get(p, 0) for p in range(PARTITIONS)}
    print(
        f"{strategy}: {producer.sent} records, {log.duplicates} re-read after a failed commit, "
        f"{log.commit_failures} commits refused during rebalances"
    )


def test_committed_offsets_resume_across_clients(broker, closer):
    """A confluent-kafka member commits, a kafka-python member of the same group resumes, and back."""
    admin = c_admin(broker.bootstrap)
    topic = c_create_topic(admin, unique("resume"), partitions=1)
    producer = closer.add(c_producer(broker.bootstrap))
    c_produce(producer, topic, [{"value": f"m{i}".encode()} for i in range(30)], partition=0)
    group = unique("resume-group")

    first = c_consumer(broker.bootstrap, group=group)
    first.subscribe([topic])
    got = c_consume(first, 10)
    assert [r.offset for r in got] == list(range(10))
    first.commit(offsets=[CTopicPartition(topic, 0, 10)], asynchronous=False)
    first.close()

    second = closer.add(kp_consumer(broker.bootstrap, group_id=group, session_timeout_ms=6000, heartbeat_interval_ms=500))
    second.subscribe([topic])
    got = kp_consume(second, 10)
    assert [r.offset for r in got] == list(range(10, 20))
    second.commit()
    assert second.committed(TopicPartition(topic, 0)) == 20
    second.close(autocommit=False)

    third = closer.add(c_consumer(broker.bootstrap, group=group))
    third.subscribe([topic])
    got = c_consume(third, 10)
    assert [(r.offset, r.value) for r in got] == [(i, f"m{i}".encode()) for i in range(20, 30)]


def test_mixed_client_group_shares_partitions(broker):
    """A confluent-kafka and a kafka-python member in one group: the broker picks a protocol both
    support, the two split the partitions, and each record is read by exactly one of them."""
    admin = c_admin(broker.bootstrap)
    topic = c_create_topic(admin, unique("mixed"), partitions=4)
    group = unique("mixed-group")
    lock = threading.Lock()
    owned = {}
    consumed = []
    errors = []
    stop = threading.Event()

    def confluent_member():
        c = c_consumer(broker.bootstrap, group=group, conf={"client.id": "confluent-member"})
        try:
            c.subscribe([topic])
            while not stop.is_set():
                msg = c.poll(0.1)
                if msg is not None and not msg.error():
                    with lock:
                        consumed.append(("confluent", msg.partition(), msg.offset()))
                with lock:
                    owned["confluent"] = {tp.partition for tp in c.assignment()}
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))
        finally:
            c.close()

    def kafka_python_member():
        c = kp_consumer(
            broker.bootstrap,
            group_id=group,
            client_id="kafka-python-member",
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
        )
        try:
            c.subscribe([topic])
            while not stop.is_set():
                batches = c.poll(timeout_ms=100)
                with lock:
                    for tp, records in batches.items():
                        consumed.extend(("kafka-python", r.partition, r.offset) for r in records)
                    owned["kafka-python"] = {tp.partition for tp in c.assignment()}
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))
        finally:
            c.close(autocommit=False)

    threads = [threading.Thread(target=f, daemon=True) for f in (confluent_member, kafka_python_member)]
    for t in threads:
        t.start()
    try:

        def split():
            with lock:
                a, b = owned.get("confluent", set()), owned.get("kafka-python", set())
            return len(a) == 2 and len(b) == 2 and a | b == {0, 1, 2, 3}

        wait_until(split, what="both members owning two partitions each")
        desc = admin.describe_consumer_groups([group])[group].result(timeout=TIMEOUT_S)
        assert desc.state == ConsumerGroupState.STABLE
        assert desc.partition_assignor in ("range", "roundrobin")
        assert sorted(m.client_id for m in desc.members) == ["confluent-member", "kafka-python-member"]

        producer = c_producer(broker.bootstrap)
        c_produce(producer, topic, [{"value": f"m{i}".encode(), "partition": i % 4} for i in range(40)])
        wait_until(lambda: len(consumed) >= 40, what="40 records consumed")
    finally:
        stop.set()
        for t in threads:
            t.join(TIMEOUT_S)
    assert not errors, errors
    assert len(consumed) == 40
    assert sorted((p, o) for _, p, o in consumed) == sorted((p, o) for p in range(4) for o in range(10))
    with lock:
        for who, p, _ in consumed:
            assert p in owned[who], (who, p, owned)


CRASHING_MEMBER = """
import sys, time
from confluent_kafka import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2], "client.id": "doomed",
              "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
c.subscribe([sys.argv[3]])
told = False
while True:
    c.poll(0.1)
    if c.assignment() and not told:
        print("assigned", flush=True)
        told = True
"""


def test_member_killed_without_leaving_is_evicted_after_session_timeout(broker, closer):
    """A member that dies without LeaveGroup (kill -9) stops heartbeating: after its session
    timeout the broker rebalances and the survivor owns every partition."""
    admin = c_admin(broker.bootstrap)
    topic = c_create_topic(admin, unique("evict"), partitions=4)
    group = unique("evict-group")
    survivor = closer.add(c_consumer(broker.bootstrap, group=group, conf={"client.id": "survivor"}))
    survivor.subscribe([topic])

    def assignment():
        survivor.poll(0.1)
        return {tp.partition for tp in survivor.assignment()}

    wait_until(lambda: assignment() == {0, 1, 2, 3}, what="the survivor alone owning 4 partitions")
    doomed = subprocess.Popen(
        [sys.executable, "-c", CRASHING_MEMBER, broker.bootstrap, group, topic],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: len(assignment()) == 2, what="the partitions split between two members")
        assert doomed.stdout.readline().strip() == b"assigned"
        doomed.kill()
        doomed.wait()
        killed_at = time.monotonic()
        wait_until(lambda: assignment() == {0, 1, 2, 3}, timeout=30, what="the survivor owning every partition again")
        elapsed = time.monotonic() - killed_at
    finally:
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait()
    # Not before the 6 s session timeout (no LeaveGroup was sent), and not much after it.
    assert 4.0 <= elapsed <= 16.0, f"rebalanced {elapsed:.1f} s after the member died"
    desc = admin.describe_consumer_groups([group])[group].result(timeout=TIMEOUT_S)
    assert [m.client_id for m in desc.members] == ["survivor"]
