"""A data directory written by the previous version starts under this one with everything intact.

The fixture (`fixtures/weir-0.1-data`, see its README) predates replica assignments: its topics'
metadata records have none. At its first start the broker assigns those partitions to itself,
in sync and leading at leader epoch 0 (the epoch their batches carry), once; topics, records,
committed offsets and transactions read as before, through real clients.
"""

import shutil
import time

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import ConfigResource

from conftest import _ALL_BROKERS, Broker
from helpers import TIMEOUT_S, c_admin, c_consumer, c_produce, c_producer, c_read_partition, metric

FIXTURE = __import__("pathlib").Path(__file__).resolve().parent / "fixtures" / "weir-0.1-data"
ASSIGNING = "assigning the partitions of an older data directory"


def upgrade(tmp_path, fixture, settings):
    """Today's broker started on a copy of `fixture`; stopped and forgotten at the end."""
    broker = Broker(tmp_path / "upgraded", settings=settings, name="upgraded")
    shutil.rmtree(broker.data_dir)
    shutil.copytree(fixture, broker.data_dir)
    _ALL_BROKERS.append(broker)
    broker.start()
    yield broker
    broker.cleanup()
    _ALL_BROKERS.remove(broker)


@pytest.fixture
def upgraded(tmp_path):
    yield from upgrade(tmp_path, FIXTURE, {"offsets.topic.num.partitions": "1"})


def test_an_older_data_directory_keeps_its_topics_records_offsets_and_transactions(upgraded, closer):
    admin = c_admin(upgraded.bootstrap)
    metadata = admin.list_topics(timeout=TIMEOUT_S)
    assert {"legacy-orders", "legacy-compacted", "legacy-txn"} <= set(metadata.topics)
    orders = metadata.topics["legacy-orders"]
    assert sorted(orders.partitions) == [0, 1, 2]
    for partition in orders.partitions.values():
        assert (partition.leader, partition.replicas, partition.isrs) == (0, [0], [0])

    for p in range(3):
        records = c_read_partition(upgraded.bootstrap, "legacy-orders", p, 10)
        assert [r.key for r in records] == [f"k{i}".encode() for i in range(p, 30, 3)]
        assert all(r.headers == [("h", b"1"), ("h", b"2")] for r in records)

    committed = c_read_partition(upgraded.bootstrap, "legacy-txn", 0, 5, conf={"isolation.level": "read_committed"})
    assert [r.value for r in committed] == [f"committed {i}".encode() for i in range(5)]

    group = closer.add(c_consumer(upgraded.bootstrap, group="legacy-group"))
    offsets = group.committed([TopicPartition("legacy-orders", p) for p in range(3)], timeout=TIMEOUT_S)
    assert [tp.offset for tp in offsets][:2] == [5, 3]

    # The transactional id keeps its producer: a new instance fences the old epoch and commits.
    producer = closer.add(Producer({"bootstrap.servers": upgraded.bootstrap, "transactional.id": "legacy-tx"}))
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    producer.produce("legacy-txn", value=b"after the upgrade", partition=0)
    producer.commit_transaction(TIMEOUT_S)
    after = c_read_partition(upgraded.bootstrap, "legacy-txn", 0, 6, conf={"isolation.level": "read_committed"})
    assert after[-1].value == b"after the upgrade"

    # New writes go on from the old log ends, on the old topics and on new ones.
    fresh = closer.add(c_producer(upgraded.bootstrap))
    assert c_produce(fresh, "legacy-orders", [{"key": b"new", "value": b"v"}], partition=0) == [(0, 10)]
    described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "legacy-compacted")])
    assert list(described.values())[0].result(timeout=TIMEOUT_S)["cleanup.policy"].value == "compact"


def test_an_older_data_directory_is_assigned_once_and_restarts_like_any_other(upgraded):
    assert upgraded.log_since(0).count(ASSIGNING) == 1
    code = upgraded.stop()
    assert code == 0
    mark = upgraded.log_size()
    upgraded.start()
    assert ASSIGNING not in upgraded.log_since(mark), "the assignment is in the metadata log already"
    upgraded.kill9()
    mark = upgraded.log_size()
    upgraded.start()
    assert ASSIGNING not in upgraded.log_since(mark)
    metadata = c_admin(upgraded.bootstrap).list_topics(timeout=TIMEOUT_S)
    assert metadata.topics["legacy-orders"].partitions[2].leader == 0


# -- the messaging state of commit 17ed087 (fixtures/weir-17ed087-messaging-data) --------------

MESSAGING_FIXTURE = FIXTURE.parent / "weir-17ed087-messaging-data"
# When the fixture's far delayed messages come due (its README).
FAR_DUE_S = 1_822_241_142


@pytest.fixture
def upgraded_messaging(tmp_path):
    settings = {
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.num.partitions": "1",
        "transaction.check.interval.ms": "1000",
    }
    yield from upgrade(tmp_path, MESSAGING_FIXTURE, settings)


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.1)


def end_offset_after_a_while(broker, topic):
    """Partition 0's end offset, two seconds from now (time for what should not come to come)."""
    time.sleep(2)
    consumer = c_consumer(broker.bootstrap)
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT_S)[1]
    finally:
        consumer.close()


def test_an_older_timer_store_moves_into_its_replicated_topic_and_each_message_fires_once(upgraded_messaging):
    broker = upgraded_messaging
    legacy = broker.data_dir / "timer" / "log"
    wait_until(lambda: not legacy.exists(), 30, "the local timer store moved into __delayed_messages")
    # Due while the broker was down: each fires once at start-up; the recalled one never.
    want = sorted([f"due-{i}".encode() for i in range(5)] + [b"kafka-due-0", b"kafka-due-1"])
    fired = c_read_partition(broker.bootstrap, "legacy-delay", 0, len(want))
    assert sorted(r.value for r in fired) == want
    far_pending = time.time() < FAR_DUE_S
    if far_pending:
        # far-0 and far-1 still wait (far-recalled does not); the metric counts them once moved.
        wait_until(lambda: metric(broker, "weir_timer_messages_pending") == 2, 15, "two far messages pending")
    # A kill -9 and a restart neither moves them again nor fires anything twice.
    broker.kill9()
    broker.start()
    if far_pending:
        wait_until(lambda: metric(broker, "weir_timer_messages_pending") == 2, 15, "two far messages pending")
    again = c_read_partition(broker.bootstrap, "legacy-delay", 0, len(want) + (0 if far_pending else 2))
    values = sorted(r.value for r in again)
    assert len(values) == len(set(values)), f"fired twice: {values}"
    assert b"due-recalled" not in values and b"far-recalled" not in values
    # And the partition holds exactly those: nothing fired twice or late after the restart.
    assert end_offset_after_a_while(broker, "legacy-delay") == len(values)
    assert not legacy.exists()


def test_older_half_messages_move_into_their_replicated_topic_and_a_producers_check_back_commits_them(upgraded_messaging):
    """The fixture's three undecided half messages are checked with a producer of their topic
    after the upgrade (their old transaction ids name nothing now); its COMMIT delivers each
    once."""
    from rocketmq import ClientConfiguration, Credentials, Producer, TransactionChecker, TransactionResolution

    class Commit(TransactionChecker):
        def check(self, message):
            return TransactionResolution.COMMIT

    broker = upgraded_messaging
    wait_until(lambda: not (broker.data_dir / "half").exists(), 30, "the local half messages moved into __half_messages")
    config = ClientConfiguration(broker.rocketmq_endpoint, Credentials(), request_timeout=10)
    producer = Producer(config, ["legacy-txn-rmq"], checker=Commit())
    producer.startup()
    try:
        records = c_read_partition(broker.bootstrap, "legacy-txn-rmq", 0, 3, timeout=60)
    finally:
        producer.shutdown()
    assert sorted(r.value for r in records) == [b"half-0", b"half-1", b"half-2"]
    assert end_offset_after_a_while(broker, "legacy-txn-rmq") == 3, "each committed once"


def test_an_older_invisible_time_store_moves_into_its_replicated_topic_with_acks_and_delivery_counts(upgraded_messaging):
    """The fixture's group acked pop-0..9 and held pop-10..14 (long visible again since):
    after the move the group gets pop-10..19 only, the held ones as second deliveries."""
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

    broker = upgraded_messaging
    legacy = broker.data_dir / "rocketmq-pop"
    wait_until(lambda: not legacy.exists(), 30, "the local invisible-time store moved into __share_group_state")
    config = ClientConfiguration(broker.rocketmq_endpoint, Credentials(), request_timeout=10)

    def receive(want):
        consumer = SimpleConsumer(config, "legacy-pop-group", {"legacy-pop": FilterExpression("*")}, await_duration=1)
        consumer.startup()
        try:
            got, deadline = [], time.monotonic() + 30
            while len(got) < want and time.monotonic() < deadline:
                got += consumer.receive(32, 5)
            # Nothing more comes: what was acked stays acked.
            got += consumer.receive(32, 5)
            return consumer, got
        except BaseException:
            consumer.shutdown()
            raise

    consumer, got = receive(10)
    try:
        attempts = {m.body.decode(): m.delivery_attempt for m in got}
        assert sorted(attempts) == sorted(f"pop-{i}" for i in range(10, 20)), f"got {sorted(attempts)}"
        assert all(attempts[f"pop-{i}"] == 2 for i in range(10, 15)), f"delivery counts kept: {attempts}"
        assert all(attempts[f"pop-{i}"] == 1 for i in range(15, 20)), attempts
        for message in got[:5]:
            consumer.ack(message)
        acked = {m.body for m in got[:5]}
    finally:
        consumer.shutdown()
    # A kill -9 and a restart keep the acks made after the move too.
    broker.kill9()
    broker.start()
    consumer, again = receive(5)
    consumer.shutdown()
    bodies = sorted(m.body for m in again)
    assert not acked & set(bodies), f"acked ones came back: {bodies}"
    assert len(bodies) == 5, bodies
