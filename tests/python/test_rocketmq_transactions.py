"""Transactional messages (RocketMQ's half messages) with the official RocketMQ 5 Python client,
confluent-kafka and raw calls with the protocol's own stubs, against a real `weir` process.

The contract: on a topic with message.type=TRANSACTION, a message sent within a transaction is
invisible (to RocketMQ consumers and Kafka consumers alike) until its producer commits it; then
it is in the topic once. A rolled-back one never is. A transaction left open is checked: the
broker sends a RecoverOrphanedTransactionCommand on the Telemetry stream of a producer of the
topic (any of them) every `transaction.check.interval.ms`, and the producer's checker answers
with an EndTransaction; after `transaction.check.max` checks without an answer it is rolled
back. Open transactions survive kill -9.

What the Python client does that these tests rely on (rocketmq/v5/producer/producer.py):
- `Producer(config, topics, checker=...)`: without a checker a producer cannot end a
  transaction at all. `tx = producer.begin_transaction(); producer.send(m, tx); tx.commit()`.
- A checker's answer is sent as EndTransaction(source=SOURCE_SERVER_CHECK) to the endpoints
  whose Telemetry stream carried the command. An answer that is neither COMMIT nor ROLLBACK is
  sent as it is (TRANSACTION_RESOLUTION_UNSPECIFIED) and refused by the server.
- The client re-opens its Telemetry stream only with its settings sync, every 300 s: after a
  broker restart, a producer started before it is not asked about transactions for minutes.
"""

import queue
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from rocketmq import ClientConfiguration, Credentials, Producer, TransactionChecker, TransactionResolution
from rocketmq import grpc_protocol as pb
from rocketmq.grpc_protocol import definition_pb2 as d

from helpers import c_admin, c_create_topic, unique
from test_rocketmq import METADATA, headers_of, message, simple_consumer
from test_rocketmq_messaging import read_to_end

# Fast check-back: a check each second, rolled back after 3.
FAST_CHECKS = {"transaction.check.interval.ms": "1000", "transaction.check.max": "3"}


@pytest.fixture
def stub(broker):
    channel = grpc.insecure_channel(broker.rocketmq_endpoint)
    yield pb.MessagingServiceStub(channel)
    channel.close()


class Checker(TransactionChecker):
    """Answers every check with `resolution` and notes the messages it was asked about."""

    def __init__(self, resolution):
        self.resolution = resolution
        self.asked = []

    def check(self, message):
        self.asked.append(message)
        return self.resolution


def tx_topic(broker, partitions=1):
    topic = unique("rmq-tx")
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=partitions, config={"message.type": "TRANSACTION"})
    return topic


def tx_producer(broker, topics, checker):
    config = ClientConfiguration(broker.rocketmq_endpoint, Credentials(), request_timeout=10)
    producer = Producer(config, topics, checker=checker)
    producer.startup()
    return producer


def send_in_transaction(producer, m):
    tx = producer.begin_transaction()
    receipt = producer.send(m, tx)
    assert receipt.transaction_id, "a transactional send is answered with a transaction id"
    return tx, receipt


def received(broker, topic, seconds, group=None, want=None):
    """What a new SimpleConsumer group receives (and acks) within `seconds`."""
    consumer = simple_consumer(broker, group or unique("g"), topic, await_s=1)
    try:
        got = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and (want is None or len(got) < want):
            for m in consumer.receive(32, 30):
                got.append(m)
                consumer.ack(m)
        return got
    finally:
        consumer.shutdown()


def kafka_values(broker, topic, partitions=1, want=0):
    return sorted(r.value for p in range(partitions) for r in read_to_end(broker.bootstrap, topic, p, want=want if p == 0 else 0))


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


# -- commit and rollback ---------------------------------------------------------------------


def test_a_transactional_message_is_invisible_until_committed_then_delivered_once_and_a_rolled_back_one_never(broker):
    topic = tx_topic(broker)
    group = unique("g")
    producer = tx_producer(broker, [topic], Checker(TransactionResolution.ROLLBACK))
    try:
        commit_tx, committed = send_in_transaction(
            producer, message(topic, b"commit me", tag="TagT", keys=("order-7",), properties={"colour": "green"}))
        rollback_tx, rolled_back = send_in_transaction(producer, message(topic, b"roll me back"))
        assert committed.transaction_id != rolled_back.transaction_id

        # Open: nobody sees either, not a RocketMQ group nor a Kafka consumer.
        assert received(broker, topic, 2, group=group) == []
        assert kafka_values(broker, topic) == []

        commit_tx.commit()
        rollback_tx.rollback()
    finally:
        producer.shutdown()

    got = received(broker, topic, 10, group=group, want=1)
    got += received(broker, topic, 1.5, group=group)  # nothing more for the same group
    assert [m.body for m in got] == [b"commit me"], [m.body for m in got]
    [m] = got
    assert (m.message_id, m.tag, m.keys, m.properties) == (committed.message_id, "TagT", {"order-7"}, {"colour": "green"})
    assert m.delivery_attempt == 1

    [record] = read_to_end(broker.bootstrap, topic, want=1)
    assert record.value == b"commit me"
    assert headers_of(record)["weir.message-id"] == [committed.message_id]
    # A new group, from the start of the queue: still once, and never the rolled-back one.
    assert [m.body for m in received(broker, topic, 2)] == [b"commit me"]


def test_ending_a_transaction_a_second_time_or_one_never_begun_is_refused_with_invalid_transaction_id(broker, stub):
    topic = tx_topic(broker)
    producer = tx_producer(broker, [topic], Checker(TransactionResolution.ROLLBACK))
    try:
        tx, receipt = send_in_transaction(producer, message(topic, b"once"))
        tx.commit()
        with pytest.raises(Exception, match="40008"):
            tx.commit()
        with pytest.raises(Exception, match="40008"):
            tx.rollback()
        rolled, rolled_receipt = send_in_transaction(producer, message(topic, b"never"))
        rolled.rollback()
        with pytest.raises(Exception, match="40008"):
            rolled.commit()
    finally:
        producer.shutdown()

    def end(transaction_id, message_id, resolution=pb.TransactionResolution.COMMIT):
        request = pb.EndTransactionRequest(
            topic=pb.Resource(name=topic),
            message_id=message_id,
            transaction_id=transaction_id,
            resolution=resolution,
            source=pb.TransactionSource.SOURCE_CLIENT,
        )
        return stub.EndTransaction(request, metadata=METADATA, timeout=10).status

    invalid = pb.Code.INVALID_TRANSACTION_ID
    assert end("", receipt.message_id).code == invalid
    assert end("nonsense", receipt.message_id).code == invalid
    assert end("0" * 32, receipt.message_id).code == invalid
    # The ids of the decided transactions, by raw call too.
    assert end(receipt.transaction_id, receipt.message_id).code == invalid
    assert end(rolled_receipt.transaction_id, rolled_receipt.message_id).code == invalid
    # An id one character off a real (open) one.
    raw = raw_send(stub, topic, b"open", message_type=pb.MessageType.TRANSACTION)
    assert raw.status.code == pb.Code.OK, raw.status
    forged = raw.transaction_id[:-1] + ("0" if raw.transaction_id[-1] != "0" else "1")
    assert end(forged, raw.message_id).code == invalid
    # Another message's id with the real transaction id.
    assert end(raw.transaction_id, "01" + uuid.uuid4().hex.upper()).code == invalid
    # A resolution that is neither commit nor rollback decides nothing.
    assert end(raw.transaction_id, raw.message_id, pb.TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED).code != pb.Code.OK
    assert end(raw.transaction_id, raw.message_id, pb.TransactionResolution.ROLLBACK).code == pb.Code.OK

    assert kafka_values(broker, topic, want=1) == [b"once"], "each committed message once, nothing else"


def test_a_transaction_committed_twice_at_the_same_moment_is_appended_once(broker, stub):
    topic = tx_topic(broker)
    n = 40
    sent = [raw_send(stub, topic, f"race-{i}".encode(), message_type=pb.MessageType.TRANSACTION) for i in range(n)]
    assert all(s.status.code == pb.Code.OK for s in sent), [s.status for s in sent if s.status.code != pb.Code.OK][:3]

    def commit(entry):
        request = pb.EndTransactionRequest(
            topic=pb.Resource(name=topic),
            message_id=entry.message_id,
            transaction_id=entry.transaction_id,
            resolution=pb.TransactionResolution.COMMIT,
            source=pb.TransactionSource.SOURCE_CLIENT,
        )
        return stub.EndTransaction(request, metadata=METADATA, timeout=10).status.code

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(commit, [e for e in sent for _ in range(2)]))
    oks = [codes[2 * i:2 * i + 2].count(pb.Code.OK) for i in range(n)]
    values = kafka_values(broker, topic, want=n)
    duplicates = sorted({v for v in values if values.count(v) > 1})
    assert not duplicates, f"{len(duplicates)} transactions appended twice (both commits OK for {oks.count(2)}): {duplicates[:5]}"
    assert values == sorted(f"race-{i}".encode() for i in range(n))
    assert all(ok >= 1 for ok in oks), "one of each pair of commits succeeds"


def test_under_a_steady_stream_of_commits_each_committed_message_is_in_its_topic_once(broker, stub):
    """Each commit is appended by its EndTransaction call; a background sweep each second
    appends commits whose append failed. The sweep must not append a commit whose
    EndTransaction is still appending it. 16 committers for 4 s (raw calls: the Python client
    sends one message at a time); each transaction is committed once, and answered OK."""
    topic = tx_topic(broker)
    deadline = time.monotonic() + 4

    def committer(worker):
        sent = []
        while time.monotonic() < deadline:
            body = f"w{worker}-{len(sent)}".encode()
            entry = raw_send(stub, topic, body, message_type=pb.MessageType.TRANSACTION)
            assert entry.status.code == pb.Code.OK, entry.status
            answer = stub.EndTransaction(
                pb.EndTransactionRequest(
                    topic=pb.Resource(name=topic),
                    message_id=entry.message_id,
                    transaction_id=entry.transaction_id,
                    resolution=pb.TransactionResolution.COMMIT,
                    source=pb.TransactionSource.SOURCE_CLIENT,
                ),
                metadata=METADATA, timeout=10,
            )
            assert answer.status.code == pb.Code.OK, answer.status
            sent.append(body)
        return sent

    with ThreadPoolExecutor(16) as pool:
        committed = sorted(b for sent in pool.map(committer, range(16)) for b in sent)
    values = kafka_values(broker, topic, want=len(committed))
    duplicates = sorted({v for v in values if values.count(v) > 1})
    assert not duplicates, f"{len(values) - len(set(values))} extra copies of {len(committed)} committed messages: {duplicates[:5]}"
    assert values == committed


# -- message types -----------------------------------------------------------------------------


def raw_send(stub, topic, body=b"x", message_type=None, group=None, delivery_ms=None, recovery_s=None, client="weir-test-client"):
    """One message through SendMessage; returns its entry (status, message_id, transaction_id)."""
    system = d.SystemProperties(
        message_id="01" + uuid.uuid4().hex.upper(),
        body_encoding=d.Encoding.IDENTITY,
        born_timestamp=Timestamp(seconds=int(time.time())),
    )
    if message_type is not None:
        system.message_type = message_type
    if group is not None:
        system.message_group = group
    if delivery_ms is not None:
        system.delivery_timestamp.CopyFrom(Timestamp(seconds=delivery_ms // 1000, nanos=(delivery_ms % 1000) * 1_000_000))
    if recovery_s is not None:
        system.orphaned_transaction_recovery_duration.CopyFrom(Duration(seconds=recovery_s))
    request = pb.SendMessageRequest(messages=[d.Message(topic=pb.Resource(name=topic), system_properties=system, body=body)])
    metadata = [(k, client if k == "x-mq-client-id" else v) for k, v in METADATA]
    response = stub.SendMessage(request, metadata=metadata, timeout=10)
    assert len(response.entries) == 1, response
    return response.entries[0]


def test_a_transaction_topic_takes_only_transactional_messages_and_only_it_takes_them(broker, stub):
    tx = tx_topic(broker)
    normal = unique("rmq-normal")
    c_create_topic(c_admin(broker.bootstrap), normal, partitions=1)
    route = stub.QueryRoute(pb.QueryRouteRequest(topic=pb.Resource(name=tx)), metadata=METADATA, timeout=10)
    assert route.status.code == pb.Code.OK, route.status
    assert [list(q.accept_message_types) for q in route.message_queues] == [[pb.MessageType.TRANSACTION]]

    conflict = pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    later = int(time.time() * 1000) + 60_000
    assert raw_send(stub, tx, message_type=pb.MessageType.NORMAL).status.code == conflict
    assert raw_send(stub, tx).status.code == conflict, "no type given, no properties: a normal message"
    assert raw_send(stub, tx, message_type=pb.MessageType.FIFO, group="g1").status.code == conflict
    assert raw_send(stub, tx, group="g1").status.code == conflict
    assert raw_send(stub, tx, message_type=pb.MessageType.DELAY, delivery_ms=later).status.code == conflict
    # Transactional messages can have neither a group nor a delivery time.
    assert raw_send(stub, tx, message_type=pb.MessageType.TRANSACTION, group="g1").status.code == conflict
    assert raw_send(stub, tx, message_type=pb.MessageType.TRANSACTION, delivery_ms=later).status.code == conflict
    # And they go to TRANSACTION topics only.
    assert raw_send(stub, normal, message_type=pb.MessageType.TRANSACTION).status.code == conflict
    ok = raw_send(stub, tx, message_type=pb.MessageType.TRANSACTION)
    assert ok.status.code == pb.Code.OK and ok.transaction_id, ok
    # Nothing refused was stored anywhere, and the open transaction is not visible.
    assert read_to_end(broker.bootstrap, tx) == []
    assert read_to_end(broker.bootstrap, normal) == []

    # The official client refuses a plain message to the topic itself (it checks the route).
    producer = tx_producer(broker, [tx], Checker(TransactionResolution.ROLLBACK))
    try:
        with pytest.raises(Exception, match="message type not match"):
            producer.send(message(tx, b"plain"))
    finally:
        producer.shutdown()


# -- check-back --------------------------------------------------------------------------------


def test_an_open_transaction_is_checked_and_the_checkers_commit_delivers_it_once_and_its_rollback_never(broker_factory):
    broker = broker_factory(FAST_CHECKS)
    to_commit, to_roll_back = tx_topic(broker), tx_topic(broker)
    committer, roller = Checker(TransactionResolution.COMMIT), Checker(TransactionResolution.ROLLBACK)
    p1 = tx_producer(broker, [to_commit], committer)
    p2 = tx_producer(broker, [to_roll_back], roller)
    try:
        _, kept = send_in_transaction(p1, message(to_commit, b"checked and committed", tag="TagC", keys=("k1",), properties={"n": "1"}))
        _, dropped = send_in_transaction(p2, message(to_roll_back, b"checked and rolled back"))
        sent_at = time.monotonic()
        got = received(broker, to_commit, 15, want=1)
        # Then the checks stop: the transactions are decided.
        time.sleep(2.5)
        asked = (list(committer.asked), list(roller.asked))
    finally:
        p1.shutdown()
        p2.shutdown()
    assert [m.body for m in got] == [b"checked and committed"]
    assert got[0].message_id == kept.message_id
    assert time.monotonic() - sent_at >= 0.9
    [c], [r] = asked  # each asked once
    assert (c.topic, c.message_id, c.body, c.tag, c.keys, c.properties) == (
        to_commit, kept.message_id, b"checked and committed", "TagC", {"k1"}, {"n": "1"})
    assert (r.topic, r.message_id, r.body) == (to_roll_back, dropped.message_id, b"checked and rolled back")
    assert kafka_values(broker, to_commit, want=1) == [b"checked and committed"]
    assert kafka_values(broker, to_roll_back) == []
    assert received(broker, to_roll_back, 2) == []


def test_a_transaction_nobody_decides_is_rolled_back_after_the_maximum_number_of_checks(broker_factory):
    broker = broker_factory(FAST_CHECKS)
    topic = tx_topic(broker)
    undecided = Checker(TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED)
    producer = tx_producer(broker, [topic], undecided)
    try:
        tx, receipt = send_in_transaction(producer, message(topic, b"limbo"))
        wait_for(lambda: len(undecided.asked) >= 3, 15, "three checks")
        time.sleep(3)  # a fourth would come a second after the third
        assert len(undecided.asked) == 3, f"checked {len(undecided.asked)} times, transaction.check.max is 3"
        assert {m.message_id for m in undecided.asked} == {receipt.message_id}
        # Rolled back: the producer's own commit comes too late.
        with pytest.raises(Exception, match="40008"):
            tx.commit()
    finally:
        producer.shutdown()
    assert received(broker, topic, 2) == []
    assert kafka_values(broker, topic) == []


def test_a_transaction_whose_producer_is_gone_is_decided_by_another_producer_of_the_topic(broker_factory):
    broker = broker_factory(FAST_CHECKS)
    topic = tx_topic(broker)
    other = unique("rmq-tx-other")
    c_create_topic(c_admin(broker.bootstrap), other, partitions=1, config={"message.type": "TRANSACTION"})
    survivor, bystander, leaver = (Checker(TransactionResolution.COMMIT), Checker(TransactionResolution.COMMIT),
                                   Checker(TransactionResolution.ROLLBACK))
    b = tx_producer(broker, [topic], survivor)
    c = tx_producer(broker, [other], bystander)  # publishes another topic: never asked
    try:
        a = tx_producer(broker, [topic], leaver)
        _, receipt = send_in_transaction(a, message(topic, b"orphan"))
        a.shutdown()
        got = received(broker, topic, 15, want=1)
    finally:
        b.shutdown()
        c.shutdown()
    assert [m.body for m in got] == [b"orphan"]
    assert [m.message_id for m in survivor.asked] == [receipt.message_id]
    assert leaver.asked == [] and bystander.asked == []
    assert kafka_values(broker, topic, want=1) == [b"orphan"]


def test_the_first_check_comes_after_the_messages_own_recovery_duration(broker, stub):
    """The shared broker checks after 30 s by default; a message asking for 1 s is checked then.
    The producer here is a raw Telemetry stream, answering the check with EndTransaction."""
    topic = tx_topic(broker)
    client = unique("raw-producer")
    metadata = [(k, client if k == "x-mq-client-id" else v) for k, v in METADATA]
    settings = pb.Settings(client_type=pb.ClientType.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name=topic)]))
    stop = threading.Event()

    def requests():
        yield pb.TelemetryCommand(settings=settings)
        stop.wait(30)

    commands = queue.Queue()
    stream = stub.Telemetry(requests(), metadata=metadata, timeout=30)

    def read():
        try:
            for command in stream:
                commands.put(command)
        except grpc.RpcError:
            pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        first = commands.get(timeout=10)
        assert first.status.code == pb.Code.OK and first.WhichOneof("command") == "settings", first
        entry = raw_send(stub, topic, b"recover me", message_type=pb.MessageType.TRANSACTION, recovery_s=1, client=client)
        assert entry.status.code == pb.Code.OK, entry.status
        sent_at = time.monotonic()
        command = commands.get(timeout=10)
        waited = time.monotonic() - sent_at
        assert command.WhichOneof("command") == "recover_orphaned_transaction_command", command
        recover = command.recover_orphaned_transaction_command
        assert recover.transaction_id == entry.transaction_id
        assert (recover.message.topic.name, recover.message.body) == (topic, b"recover me")
        assert recover.message.system_properties.message_id == entry.message_id
        assert 0.9 <= waited < 5, f"checked {waited:.2f} s after the send; the message asked for 1 s"
        answer = stub.EndTransaction(
            pb.EndTransactionRequest(
                topic=pb.Resource(name=topic),
                message_id=entry.message_id,
                transaction_id=recover.transaction_id,
                resolution=pb.TransactionResolution.COMMIT,
                source=pb.TransactionSource.SOURCE_SERVER_CHECK,
            ),
            metadata=metadata, timeout=10,
        )
        assert answer.status.code == pb.Code.OK, answer.status
    finally:
        stop.set()
        stream.cancel()
    assert kafka_values(broker, topic, want=1) == [b"recover me"]


# -- kill -9 -------------------------------------------------------------------------------------


def commit_retrying(tx, timeout=20):
    """Commits; retries while the client's channel to the restarted broker comes back."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return tx.commit()
        except Exception as e:  # noqa: BLE001
            if "40008" in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_an_open_transaction_survives_kill_9_and_its_producers_commit_after_the_restart_delivers_it_once(broker_factory):
    broker = broker_factory()  # checks after 30 s: only the producer decides here
    topic = tx_topic(broker)
    producer = tx_producer(broker, [topic], Checker(TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED))
    try:
        tx, receipt = send_in_transaction(producer, message(topic, b"across a crash", keys=("crash-1",)))
        rolled, _ = send_in_transaction(producer, message(topic, b"rolled back across a crash"))
        broker.kill9()
        broker.start()
        assert kafka_values(broker, topic) == [], "still open after the restart"
        commit_retrying(tx)
        rolled.rollback()
    finally:
        producer.shutdown()
    group = unique("g")
    got = received(broker, topic, 10, group=group, want=1)
    got += received(broker, topic, 1.5, group=group)  # nothing more
    assert [m.body for m in got] == [b"across a crash"], [m.body for m in got]
    assert got[0].message_id == receipt.message_id and got[0].keys == {"crash-1"}
    assert kafka_values(broker, topic, want=1) == [b"across a crash"]


def test_an_open_transaction_survives_kill_9_and_is_committed_by_the_check_back_after_the_restart(broker_factory):
    broker = broker_factory({"transaction.check.interval.ms": "2000", "transaction.check.max": "10"})
    topic = tx_topic(broker)
    first = tx_producer(broker, [topic], Checker(TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED))
    try:
        _, receipt = send_in_transaction(first, message(topic, b"decided after the crash"))
        broker.kill9()
    finally:
        first.shutdown()
    broker.start()
    committer = Checker(TransactionResolution.COMMIT)
    second = tx_producer(broker, [topic], committer)
    try:
        got = received(broker, topic, 20, want=1)
    finally:
        second.shutdown()
    assert [m.body for m in got] == [b"decided after the crash"]
    assert [m.message_id for m in committer.asked] == [receipt.message_id]
    assert kafka_values(broker, topic, want=1) == [b"decided after the crash"]
