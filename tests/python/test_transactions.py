"""Transactions: read_committed isolation, fencing, timeouts, consume-transform-produce with
offsets in the transaction, and atomicity across producer and broker crashes."""

import subprocess
import threading
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition

from helpers import (
    TIMEOUT_S,
    c_admin,
    c_create_topic,
    c_producer,
    kp_producer,
    read_isolated,
    unique,
    wait_until,
)

TRANSFORMER = Path(__file__).parent / "tools" / "transformer.py"


def txn_producer(bootstrap, txn_id, **conf):
    p = c_producer(bootstrap, {"transactional.id": txn_id, "linger.ms": 1, **conf})
    p.init_transactions(TIMEOUT_S)
    return p


def test_committed_records_are_visible_aborted_ones_never(broker, closer):
    topic = c_create_topic(c_admin(broker.bootstrap), unique("txn"), partitions=2)
    p = closer.add(txn_producer(broker.bootstrap, unique("tx")))
    p.begin_transaction()
    for i in range(10):
        p.produce(topic, value=f"c{i}".encode(), partition=i % 2)
    p.commit_transaction(TIMEOUT_S)
    p.begin_transaction()
    for i in range(10):
        p.produce(topic, value=f"a{i}".encode(), partition=i % 2)
    p.flush()
    p.abort_transaction(TIMEOUT_S)
    p.begin_transaction()
    for i in range(4):
        p.produce(topic, value=f"z{i}".encode(), partition=i % 2)
    p.commit_transaction(TIMEOUT_S)

    committed = [v for _, v in read_isolated(broker.bootstrap, topic, 2, "read_committed")]
    assert sorted(committed) == sorted([f"c{i}" for i in range(10)] + [f"z{i}" for i in range(4)])
    everything = [v for _, v in read_isolated(broker.bootstrap, topic, 2, "read_uncommitted")]
    assert sorted(everything) == sorted(committed + [f"a{i}" for i in range(10)]), "markers are not records"
    # Offsets: 10 + 10 + 4 records and one marker per partition per transaction (3 x 2).
    lo, hi = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "x"}).get_watermark_offsets(
        TopicPartition(topic, 0), timeout=TIMEOUT_S
    )
    assert (lo, hi) == (0, 12 + 3)


def test_open_transaction_holds_read_committed_consumers_back(broker, closer):
    topic = c_create_topic(c_admin(broker.bootstrap), unique("txn-open"), partitions=1)
    plain = closer.add(c_producer(broker.bootstrap))
    p = closer.add(txn_producer(broker.bootstrap, unique("tx")))
    p.begin_transaction()
    p.produce(topic, value=b"in-txn", partition=0)
    p.flush()
    plain.produce(topic, value=b"after", partition=0)
    plain.flush()
    # The plain record comes after the open transaction's first offset: not yet stable.
    assert [v for _, v in read_isolated(broker.bootstrap, topic, 1, "read_committed")] == []
    assert [v for _, v in read_isolated(broker.bootstrap, topic, 1, "read_uncommitted")] == ["in-txn", "after"]
    p.commit_transaction(TIMEOUT_S)
    assert [v for _, v in read_isolated(broker.bootstrap, topic, 1, "read_committed")] == ["in-txn", "after"]


def test_a_second_producer_with_the_same_transactional_id_fences_the_first(broker, closer):
    topic = c_create_topic(c_admin(broker.bootstrap), unique("txn-fence"), partitions=1)
    txn_id = unique("tx")
    first = closer.add(txn_producer(broker.bootstrap, txn_id))
    first.begin_transaction()
    first.produce(topic, value=b"zombie", partition=0)
    first.flush()
    second = closer.add(txn_producer(broker.bootstrap, txn_id))  # aborts the first's transaction
    with pytest.raises(KafkaException) as fenced:
        first.commit_transaction(TIMEOUT_S)
    assert fenced.value.args[0].fatal() or "fenced" in str(fenced.value).lower(), str(fenced.value)
    second.begin_transaction()
    second.produce(topic, value=b"live", partition=0)
    second.commit_transaction(TIMEOUT_S)
    assert [v for _, v in read_isolated(broker.bootstrap, topic, 1, "read_committed")] == ["live"]


def test_kafka_python_transactional_producer(broker, closer):
    topic = c_create_topic(c_admin(broker.bootstrap), unique("txn-kp"), partitions=1)
    p = closer.add(kp_producer(broker.bootstrap, transactional_id=unique("kp-tx")))
    p.init_transactions()
    p.begin_transaction()
    p.send(topic, value=b"kept", partition=0)
    p.commit_transaction()
    p.begin_transaction()
    p.send(topic, value=b"dropped", partition=0)
    p.flush()  # on the broker before the abort, so that the abort has something to abort
    p.abort_transaction()
    assert [v for _, v in read_isolated(broker.bootstrap, topic, 1, "read_committed")] == ["kept"]
    assert [v for _, v in read_isolated(broker.bootstrap, topic, 1, "read_uncommitted")] == ["kept", "dropped"]


def test_transactions_that_outlive_their_timeout_are_aborted(broker, closer):
    topic = c_create_topic(c_admin(broker.bootstrap), unique("txn-timeout"), partitions=1)
    p = closer.add(
        txn_producer(broker.bootstrap, unique("tx"), **{"transaction.timeout.ms": 1500, "message.timeout.ms": 1500})
    )
    p.begin_transaction()
    p.produce(topic, value=b"forgotten", partition=0)
    p.flush()
    # The coordinator aborts it (and fences the producer); the partition becomes stable again.
    wait_until(
        lambda: Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "x", "isolation.level": "read_committed"})
        .get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT_S)[1]
        == 2,
        timeout=15,
        what="the timed-out transaction's abort marker",
    )
    assert read_isolated(broker.bootstrap, topic, 1, "read_committed") == []
    with pytest.raises(KafkaException):
        p.commit_transaction(TIMEOUT_S)


def run_transformer(bootstrap, source, sink, group, txn_id, pause, max_idle):
    return subprocess.Popen(
        [sys.executable, str(TRANSFORMER), bootstrap, source, sink, group, txn_id, "20", str(pause), str(max_idle)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_consume_transform_produce_is_exactly_once_across_crashes(fresh_broker, closer):
    b = fresh_broker
    admin = c_admin(b.bootstrap)
    source = c_create_topic(admin, unique("ctp-in"), partitions=2)
    sink = c_create_topic(admin, unique("ctp-out"), partitions=2)
    group, txn_id = unique("ctp-group"), unique("ctp-tx")
    inputs = [f"r{i}" for i in range(400)]
    producer = closer.add(c_producer(b.bootstrap))
    for i, v in enumerate(inputs):
        producer.produce(source, value=v.encode(), partition=i % 2)
    assert producer.flush(TIMEOUT_S) == 0

    # Let the worker commit a few transactions, then kill it in the middle of one.
    worker = run_transformer(b.bootstrap, source, sink, group, txn_id, pause=0.3, max_idle=30)
    lines = []
    deadline = time.monotonic() + 60
    while sum(1 for line in lines if line.startswith("txn")) < 3 and time.monotonic() < deadline:
        line = worker.stdout.readline()
        if not line:
            break
        lines.append(line)
    assert sum(1 for line in lines if line.startswith("txn")) >= 3, "".join(lines)
    time.sleep(0.15)  # inside the next transaction's pause
    worker.kill()
    worker.wait(10)
    # Then the broker, with that transaction open; restart both.
    b.kill9()
    b.restart()
    worker = run_transformer(b.bootstrap, source, sink, group, txn_id, pause=0.0, max_idle=4)
    out, _ = worker.communicate(timeout=120)
    assert worker.returncode == 0, out

    results = read_isolated(b.bootstrap, sink, 2, "read_committed")
    values = [v for _, v in results]
    assert sorted(values) == sorted(f"out-{v}" for v in inputs), (
        f"{len(values)} outputs for {len(inputs)} inputs, {len(values) - len(set(values))} duplicates"
    )
    # The group's committed offsets cover exactly the input.
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": group})
    committed = c.committed([TopicPartition(source, 0), TopicPartition(source, 1)], timeout=TIMEOUT_S)
    c.close()
    assert [tp.offset for tp in committed] == [200, 200]


def test_a_broker_crash_during_commits_leaves_every_transaction_whole(fresh_broker, closer):
    b = fresh_broker
    partitions = 4
    topic = c_create_topic(c_admin(b.bootstrap), unique("txn-crash"), partitions=partitions)
    txn_id = unique("tx")
    p = txn_producer(b.bootstrap, txn_id, **{"transaction.timeout.ms": 10000, "message.timeout.ms": 10000})
    committed = 0
    deadline = time.monotonic() + 1.0
    n = 0
    # Commit transactions back to back, each writing one record to every partition; kill the
    # broker while they run.
    while time.monotonic() < deadline:
        p.begin_transaction()
        for part in range(partitions):
            p.produce(topic, value=f"t{n}-p{part}".encode(), partition=part)
        p.commit_transaction(TIMEOUT_S)
        committed += 1
        n += 1
    p.begin_transaction()
    for part in range(partitions):
        p.produce(topic, value=f"t{n}-p{part}".encode(), partition=part)
    p.flush(TIMEOUT_S)
    b.kill9()  # the last transaction is open, or committing, when the broker dies
    try:
        p.commit_transaction(1)
    except KafkaException:
        pass
    b.restart()
    # A new producer instance with the same id completes or aborts whatever was left.
    closer.add(txn_producer(b.bootstrap, txn_id))
    values = [v for _, v in read_isolated(b.bootstrap, topic, partitions, "read_committed")]
    by_txn = {}
    for v in values:
        t, _ = v.split("-")
        by_txn.setdefault(t, set()).add(v)
    torn = {t: sorted(vs) for t, vs in by_txn.items() if len(vs) != partitions}
    assert not torn, f"transactions only partly visible: {torn}"
    assert len(by_txn) >= committed, "a committed transaction is missing"
    assert len(values) == len(set(values)), "duplicates"


def source_and_sink(broker, closer, prefix):
    """A one-partition source topic holding 10 records, an empty sink and a group name, for a
    consume-transform-produce loop; with the admin client that made them."""
    admin = c_admin(broker.bootstrap)
    source = c_create_topic(admin, unique(f"{prefix}-in"), partitions=1)
    sink = c_create_topic(admin, unique(f"{prefix}-out"), partitions=1)
    plain = closer.add(c_producer(broker.bootstrap))
    for i in range(10):
        plain.produce(source, value=f"{i}".encode(), partition=0)
    plain.flush(TIMEOUT_S)
    return admin, source, sink, unique(f"{prefix}-group")


def test_offsets_sent_in_a_transaction_count_only_when_it_commits(broker, closer):
    admin, source, sink, group = source_and_sink(broker, closer, "txn-offsets")
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False, "auto.offset.reset": "earliest"}
    )
    try:
        consumer.subscribe([source])
        got = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < 10 and time.monotonic() < deadline:
            got += [m for m in consumer.consume(10, timeout=1.0) if not m.error()]
        assert len(got) == 10
        p = closer.add(txn_producer(broker.bootstrap, unique("tx")))

        def committed_offset():
            return consumer.committed([TopicPartition(source, 0)], timeout=TIMEOUT_S)[0].offset

        p.begin_transaction()
        p.produce(sink, value=b"x", partition=0)
        p.send_offsets_to_transaction(
            [TopicPartition(source, 0, 5)], consumer.consumer_group_metadata(), TIMEOUT_S
        )
        p.abort_transaction(TIMEOUT_S)
        assert committed_offset() < 0, "an aborted transaction's offsets must not be committed"
        p.begin_transaction()
        p.produce(sink, value=b"y", partition=0)
        p.send_offsets_to_transaction(
            [TopicPartition(source, 0, 10)], consumer.consumer_group_metadata(), TIMEOUT_S
        )
        p.commit_transaction(TIMEOUT_S)
        assert committed_offset() == 10
    finally:
        consumer.close()


def test_read_committed_consumers_wait_for_offsets_an_open_transaction_will_commit(broker, closer):
    """KIP-447: a read_committed consumer fetches its start offset with RequireStable. While a
    transaction holds offsets for its partition, the coordinator answers UNSTABLE_OFFSET_COMMIT
    (so the consumer does not start from the old offset and read records twice); an abort
    makes the old offset stable again, and a commit makes the new one the start."""
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError

    admin, source, sink, group = source_and_sink(broker, closer, "stable")

    def consumer(isolation):
        return closer.add(
            Consumer(
                {
                    "bootstrap.servers": broker.bootstrap,
                    "group.id": group,
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "isolation.level": isolation,
                }
            )
        )

    owner = consumer("read_committed")
    owner.commit(offsets=[TopicPartition(source, 0, 2)], asynchronous=False)

    def listed(require_stable):
        request = [ConsumerGroupTopicPartitions(group, [TopicPartition(source, 0)])]
        future = admin.list_consumer_group_offsets(request, require_stable=require_stable)[group]
        return future.result(timeout=TIMEOUT_S).topic_partitions[0]

    def first_offset_read(c):
        c.assign([TopicPartition(source, 0)])
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and not m.error():
                return m.offset()
        raise AssertionError("nothing was read")

    p = closer.add(txn_producer(broker.bootstrap, unique("tx")))
    # An aborted transaction leaves the old offset, stable again.
    p.begin_transaction()
    p.produce(sink, value=b"a", partition=0)
    p.send_offsets_to_transaction([TopicPartition(source, 0, 5)], owner.consumer_group_metadata(), TIMEOUT_S)
    unstable = listed(require_stable=True)
    assert unstable.error is not None and unstable.error.code() == KafkaError.UNSTABLE_OFFSET_COMMIT, unstable
    assert listed(require_stable=False).offset == 2, "without RequireStable the stored offset is answered"
    p.abort_transaction(TIMEOUT_S)
    after_abort = listed(require_stable=True)
    assert after_abort.error is None and after_abort.offset == 2
    # A committing transaction: a read_committed consumer starting meanwhile waits for it and
    # begins at the transaction's offset, not at the old one.
    p.begin_transaction()
    p.produce(sink, value=b"c", partition=0)
    p.send_offsets_to_transaction([TopicPartition(source, 0, 7)], owner.consumer_group_metadata(), TIMEOUT_S)
    assert first_offset_read(consumer("read_uncommitted")) == 2, "read_uncommitted does not wait"
    committer = threading.Timer(1.5, lambda: p.commit_transaction(TIMEOUT_S))
    committer.start()
    try:
        started = time.monotonic()
        assert first_offset_read(consumer("read_committed")) == 7
        assert time.monotonic() - started >= 1.0, "the consumer started before the transaction ended"
    finally:
        committer.join()


def test_offsets_an_open_transaction_will_commit_stay_unstable_across_a_broker_crash(fresh_broker, closer):
    """The coordinator's note of an open transaction's offsets is durable: after kill -9 and a
    restart, RequireStable still answers UNSTABLE_OFFSET_COMMIT until the transaction ends (it
    used to answer the old offset, from which a read_committed consumer would read twice)."""
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError

    b = fresh_broker
    admin, source, sink, group = source_and_sink(b, closer, "stable-crash")
    owner = closer.add(
        Consumer({"bootstrap.servers": b.bootstrap, "group.id": group, "enable.auto.commit": False})
    )
    owner.commit(offsets=[TopicPartition(source, 0, 2)], asynchronous=False)
    metadata = owner.consumer_group_metadata()

    def listed(require_stable):
        request = [ConsumerGroupTopicPartitions(group, [TopicPartition(source, 0)])]
        future = admin.list_consumer_group_offsets(request, require_stable=require_stable)[group]
        return future.result(timeout=TIMEOUT_S).topic_partitions[0]

    def listed_when(condition, what):
        def attempt():
            try:
                answer = listed(require_stable=True)
            except KafkaException:  # the restarted broker may still be loading
                return None
            return answer if condition(answer) else None

        return wait_until(attempt, what=what)

    txn_id = unique("tx")
    p = txn_producer(b.bootstrap, txn_id, **{"transaction.timeout.ms": 60000})
    p.begin_transaction()
    p.produce(sink, value=b"a", partition=0)
    p.send_offsets_to_transaction([TopicPartition(source, 0, 5)], metadata, TIMEOUT_S)
    assert listed(require_stable=True).error.code() == KafkaError.UNSTABLE_OFFSET_COMMIT
    b.kill9()
    b.restart()
    unstable = listed_when(lambda r: r.error is not None, "an answer with an error")
    assert unstable.error.code() == KafkaError.UNSTABLE_OFFSET_COMMIT, unstable
    assert listed(require_stable=False).offset == 2
    # A new instance with the same transactional id aborts the open transaction: the old offset
    # is stable again (the abort removed the note), and stays so across another crash.
    closer.add(txn_producer(b.bootstrap, txn_id))
    after_abort = listed(require_stable=True)
    assert after_abort.error is None and after_abort.offset == 2, after_abort
    b.kill9()
    b.restart()
    again = listed_when(lambda r: r.error is None, "a stable offset")
    assert again.offset == 2, again
