"""Delayed messages, retries and dead letters, through real clients: the official RocketMQ 5
Python client (rocketmq-python-client), confluent-kafka and raw calls with the protocol's own
stubs, against a real `weir` process.

What the Python client does that these tests rely on (rocketmq/v5 in site-packages):
- `Message.delivery_timestamp` is whole SECONDS since the epoch, whatever its docstring says:
  Producer.__send_req copies it into `system_properties.delivery_timestamp.seconds`. A received
  message's `delivery_timestamp` is in milliseconds (Misc.to_mills).
- A PushConsumer that is not FIFO answers a failed consume with ChangeInvisibleDuration (the
  group's back-off) every time, whatever the attempt: it never forwards to the dead letters
  itself, so the server must move a message after its last attempt. A FIFO PushConsumer retries
  locally and then calls ForwardMessageToDeadLetterQueue, until it succeeds.
"""

import math
import subprocess
import threading
import time
import uuid

import grpc
import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from rocketmq import grpc_protocol as pb
from rocketmq.grpc_protocol import definition_pb2 as d
from rocketmq.v5.exception import BadRequestException, NotFoundException

from conftest import weir_bin
from helpers import c_admin, c_create_topic, c_producer, http, metric, rec_from_confluent, unique
from test_rocketmq import METADATA, Recorder, headers_of, message, producer_for, push_consumer, send_all, simple_consumer

DAY_MS = 86_400_000


@pytest.fixture
def stub(broker):
    channel = grpc.insecure_channel(broker.rocketmq_endpoint)
    yield pb.MessagingServiceStub(channel)
    channel.close()


def now_ms():
    return int(time.time() * 1000)


def due_in(seconds):
    """A delivery time, in whole seconds since the epoch (the Python client's unit), at least
    `seconds` from now."""
    return math.ceil(time.time() + seconds)


def delay_topic(broker, partitions=1, **config):
    topic = unique("rmq-delay")
    configs = {"message.type": "DELAY"}
    configs.update({k.replace("_", "."): v for k, v in config.items()})
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=partitions, config=configs)
    return topic


def delayed(topic, body, due_s, **kwargs):
    m = message(topic, body, **kwargs)
    m.delivery_timestamp = due_s
    return m


def raw_send(stub, topic, body=b"x", delivery_ms=None, message_type=None):
    """One message through SendMessage, as a client that does not check types would send it;
    returns its entry's status."""
    system = d.SystemProperties(
        message_id="01" + uuid.uuid4().hex.upper(),
        body_encoding=d.Encoding.IDENTITY,
        born_timestamp=Timestamp(seconds=int(time.time())),
    )
    if delivery_ms is not None:
        system.delivery_timestamp.CopyFrom(Timestamp(seconds=delivery_ms // 1000, nanos=(delivery_ms % 1000) * 1_000_000))
    if message_type is not None:
        system.message_type = message_type
    request = pb.SendMessageRequest(messages=[d.Message(topic=pb.Resource(name=topic), system_properties=system, body=body)])
    response = stub.SendMessage(request, metadata=METADATA, timeout=10)
    assert len(response.entries) == 1, response
    return response.entries[0].status


def receive_timed(consumer, until, want=None, invisible_s=30, ack=True):
    """Receives until the wall-clock time `until` (or until `want` messages came); returns
    [(time.time() when received, message)]. Acks what it gets unless told not to."""
    got = []
    while time.time() < until and (want is None or len(got) < want):
        for m in consumer.receive(32, invisible_s):
            got.append((time.time(), m))
            if ack:
                consumer.ack(m)
    return got


def read_to_end(bootstrap, topic, partition=0, want=0, timeout=15):
    """Every record of a partition, read from the beginning once at least `want` came and the
    consumer reached the partition's end; fails after `timeout` s."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": unique("read"),
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "topic.metadata.refresh.interval.ms": 1000,
    })
    try:
        consumer.assign([TopicPartition(topic, partition, 0)])
        out = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    if len(out) >= want:
                        return out
                    continue
                if msg.error().code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    continue  # not created yet: keep asking
                raise AssertionError(f"consumer error reading {topic}/{partition}: {msg.error()}")
            out.append(rec_from_confluent(msg))
        raise AssertionError(f"read {len(out)} of at least {want} records of {topic}/{partition} within {timeout}s")
    finally:
        consumer.close()


class KafkaWatcher:
    """A confluent consumer assigned to a partition from its beginning, polling in a thread and
    noting when each record arrived (time.time())."""

    def __init__(self, bootstrap, topic, partition=0):
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap,
            "group.id": unique("watch"),
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 50,
        })
        self.consumer.assign([TopicPartition(topic, partition, 0)])
        self.seen, self.errors = [], []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stopping.is_set():
            msg = self.consumer.poll(0.05)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    self.errors.append(str(msg.error()))
                continue
            self.seen.append((time.time(), rec_from_confluent(msg)))

    def wait_for(self, n, until):
        while len(self.seen) < n and time.time() < until:
            time.sleep(0.02)
        return list(self.seen)

    def close(self):
        self.stopping.set()
        self.thread.join(5)
        self.consumer.close()


def group_settings(broker, group, **configs):
    status, created = http("POST", f"{broker.admin_url()}/v1/groups", {
        "name": group, "configs": {k.replace("_", "."): str(v) for k, v in configs.items()},
    })
    assert status == 201, created


def dlq_of(group):
    return f"%DLQ%{group}"


# -- delayed messages --------------------------------------------------------------------------


def test_a_delayed_message_is_received_at_its_delivery_time_not_before_and_carries_it(broker):
    topic, group = delay_topic(broker), unique("g")
    consumer = simple_consumer(broker, group, topic, await_s=1)
    producer = producer_for(broker, [topic])
    try:
        due_s = due_in(3)
        receipt = producer.send(delayed(topic, b"at three", due_s, tag="T", properties={"colour": "red"}))
        got = receive_timed(consumer, until=due_s + 5, want=1)
    finally:
        producer.shutdown()
        consumer.shutdown()
    assert len(got) == 1, "the delayed message was never received"
    [(received_at, m)] = got
    assert received_at >= due_s - 0.05, f"received {due_s - received_at:.3f} s before its delivery time"
    assert received_at <= due_s + 2, f"received {received_at - due_s:.3f} s after its delivery time"
    assert (m.body, m.message_id, m.tag, m.properties) == (b"at three", receipt.message_id, "T", {"colour": "red"})
    assert m.delivery_timestamp == due_s * 1000, "the received message carries its delivery time (ms)"
    assert m.delivery_attempt == 1


def test_a_kafka_consumer_sees_a_delayed_message_only_after_its_delivery_time(broker):
    topic = unique("rmq-delay-kafka")
    cli = subprocess.run(
        [str(weir_bin()), "topic", "create", topic, "--message-type", "DELAY", "--admin", broker.admin_url()],
        capture_output=True, text=True, timeout=30,
    )
    assert cli.returncode == 0, cli.stderr
    watcher = KafkaWatcher(broker.bootstrap, topic)
    try:
        due_s = due_in(3)
        [receipt] = send_all(broker, topic, [delayed(topic, b"for kafka too", due_s, keys=("k1",))])
        seen = watcher.wait_for(1, until=due_s + 5)
    finally:
        watcher.close()
    assert not watcher.errors, watcher.errors
    assert len(seen) == 1, f"a Kafka consumer saw {len(seen)} records"
    [(seen_at, rec)] = seen
    assert seen_at >= due_s - 0.05, f"a Kafka consumer read it {due_s - seen_at:.3f} s before its delivery time"
    assert seen_at <= due_s + 2, f"a Kafka consumer read it {seen_at - due_s:.3f} s after its delivery time"
    headers = headers_of(rec)
    assert rec.value == b"for kafka too"
    assert headers["weir.delivery-timestamp"] == [str(due_s * 1000)]
    assert headers["weir.message-id"] == [receipt.message_id]
    assert headers["weir.key"] == ["k1"]


def test_a_delivery_time_beyond_the_topics_maximum_delay_is_refused_with_illegal_delivery_time(broker, stub):
    short = delay_topic(broker, message_delay_max_ms="60000")
    default = delay_topic(broker)
    delay = pb.MessageType.DELAY
    illegal = pb.Code.ILLEGAL_DELIVERY_TIME
    assert raw_send(stub, short, delivery_ms=now_ms() + 120_000, message_type=delay).code == illegal
    assert raw_send(stub, short, delivery_ms=now_ms() + 30_000, message_type=delay).code == pb.Code.OK
    # The default maximum is 7 days.
    assert raw_send(stub, default, delivery_ms=now_ms() + 8 * DAY_MS, message_type=delay).code == illegal
    assert raw_send(stub, default, delivery_ms=now_ms() + 6 * DAY_MS, message_type=delay).code == pb.Code.OK
    # The official client gets the same answer (a BadRequestException with the code).
    producer = producer_for(broker, [short])
    try:
        with pytest.raises(Exception, match="40012"):
            producer.send(delayed(short, b"an hour on", due_in(3600)))
    finally:
        producer.shutdown()
    # Nothing refused was stored, and what was accepted is not due yet.
    assert read_to_end(broker.bootstrap, short) == []
    assert read_to_end(broker.bootstrap, default) == []


def test_a_delayed_message_to_a_normal_topic_and_a_plain_message_to_a_delay_topic_conflict_with_their_types(broker, stub):
    normal = unique("rmq-normal")
    c_create_topic(c_admin(broker.bootstrap), normal, partitions=1)
    delay = delay_topic(broker)
    route = stub.QueryRoute(pb.QueryRouteRequest(topic=pb.Resource(name=delay)), metadata=METADATA, timeout=10)
    assert route.status.code == pb.Code.OK, route.status
    assert [list(q.accept_message_types) for q in route.message_queues] == [[pb.MessageType.DELAY]]

    conflict = pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    later = now_ms() + 60_000
    # As the official client says it (message_type set), and as a client that leaves it unset.
    assert raw_send(stub, normal, delivery_ms=later, message_type=pb.MessageType.DELAY).code == conflict
    assert raw_send(stub, normal, delivery_ms=later).code == conflict
    assert raw_send(stub, delay, message_type=pb.MessageType.NORMAL).code == conflict
    assert raw_send(stub, delay).code == conflict
    assert raw_send(stub, delay, delivery_ms=later, message_type=pb.MessageType.DELAY).code == pb.Code.OK
    assert raw_send(stub, normal, message_type=pb.MessageType.NORMAL).code == pb.Code.OK
    [only] = read_to_end(broker.bootstrap, normal, want=1)
    assert only.offset == 0 and "weir.delivery-timestamp" not in headers_of(only)
    assert read_to_end(broker.bootstrap, delay) == []


def test_delayed_messages_survive_kill_9_and_those_due_meanwhile_are_delivered_once_at_start_up(broker_factory):
    broker = broker_factory()
    topic, group = delay_topic(broker), unique("g")
    first_due = due_in(3)
    second_due = first_due + 4
    send_all(broker, topic, [delayed(topic, b"due while down", first_due), delayed(topic, b"due after restart", second_due)])
    broker.kill9()
    time.sleep(max(0.0, first_due + 0.5 - time.time()))
    broker.start()
    started_at = time.time()
    consumer = simple_consumer(broker, group, topic, await_s=1)
    try:
        got = receive_timed(consumer, until=second_due + 3, want=2)
        # Then nothing more: each came once.
        got += receive_timed(consumer, until=time.time() + 1.5)
    finally:
        consumer.shutdown()
    bodies = [m.body for _, m in got]
    assert sorted(bodies) == [b"due after restart", b"due while down"], bodies
    times = {m.body: at for at, m in got}
    assert times[b"due while down"] <= started_at + 5, "a message due while the broker was down fires at start-up"
    assert second_due - 0.05 <= times[b"due after restart"] <= second_due + 2, (
        f"the later message came {times[b'due after restart'] - second_due:+.3f} s from its delivery time"
    )
    records = read_to_end(broker.bootstrap, topic, want=2)
    assert sorted(r.value for r in records) == [b"due after restart", b"due while down"], "each is in the log once"


# -- recalling a delayed message (RecallMessage) -------------------------------------------------


def test_a_recalled_delayed_message_is_never_delivered_while_the_others_are(broker):
    topic, other, group = delay_topic(broker), delay_topic(broker), unique("g")
    consumer = simple_consumer(broker, group, topic, await_s=1)
    producer = producer_for(broker, [topic, other])
    try:
        due_s = due_in(4)
        recalled = producer.send(delayed(topic, b"recalled", due_s))
        kept = producer.send(delayed(topic, b"kept", due_s))
        assert recalled.recall_handle and kept.recall_handle, "a delayed message's receipt has a recall handle"
        recalled_before = metric(broker, "weir_timer_messages_recalled_total")
        assert producer.recall_message(topic, recalled.recall_handle) == recalled.message_id
        # Again: still recalled, same answer.
        assert producer.recall_message(topic, recalled.recall_handle) == recalled.message_id
        assert metric(broker, "weir_timer_messages_recalled_total") == recalled_before + 1
        # A handle is only good with its own topic, and says so; a made-up one is refused as such.
        with pytest.raises(BadRequestException, match="another topic"):
            producer.recall_message(other, kept.recall_handle)
        with pytest.raises(BadRequestException):
            producer.recall_message(topic, "not-a-handle")
        got = receive_timed(consumer, until=due_s + 3)
        # Delivered: too late to recall it.
        with pytest.raises(NotFoundException):
            producer.recall_message(topic, kept.recall_handle)
    finally:
        producer.shutdown()
        consumer.shutdown()
    assert [m.body for _, m in got] == [b"kept"]
    assert [r.value for r in read_to_end(broker.bootstrap, topic, want=1)] == [b"kept"], "the log has only the kept one"


def test_a_recall_survives_kill_9_even_when_the_message_came_due_while_the_broker_was_down(broker_factory):
    broker = broker_factory()
    topic, group = delay_topic(broker), unique("g")
    producer = producer_for(broker, [topic])
    try:
        due_s = due_in(3)
        recalled = producer.send(delayed(topic, b"recalled", due_s))
        producer.send(delayed(topic, b"kept", due_s))
        far = producer.send(delayed(topic, b"recalled, an hour away", due_in(3600)))
        assert producer.recall_message(topic, recalled.recall_handle) == recalled.message_id
        assert producer.recall_message(topic, far.recall_handle) == far.message_id
    finally:
        producer.shutdown()
    broker.kill9()
    time.sleep(max(0.0, due_s + 0.5 - time.time()))
    broker.start()
    consumer = simple_consumer(broker, group, topic, await_s=1)
    try:
        got = receive_timed(consumer, until=time.time() + 6, want=1)
        got += receive_timed(consumer, until=time.time() + 1.5)
    finally:
        consumer.shutdown()
    assert [m.body for _, m in got] == [b"kept"]
    assert metric(broker, "weir_timer_messages_pending") == 0, "the recalled far message no longer counts as pending"


# -- Kafka producers schedule too ---------------------------------------------------------------


def test_a_kafka_record_with_a_delivery_timestamp_header_appears_at_that_time_and_one_without_at_once(broker):
    topic = delay_topic(broker)
    watcher = KafkaWatcher(broker.bootstrap, topic)
    try:
        due = now_ms() + 3000
        producer = c_producer(broker.bootstrap)
        producer.produce(topic, value=b"later", headers=[("weir.delivery-timestamp", str(due).encode()), ("origin", b"kafka")])
        producer.produce(topic, value=b"now", headers=[("origin", b"kafka")])
        assert producer.flush(10) == 0
        acked_at = time.time()
        watcher.wait_for(2, until=due / 1000 + 5)
        time.sleep(1)  # nothing more comes
        seen = list(watcher.seen)
    finally:
        watcher.close()
    assert not watcher.errors, watcher.errors
    assert [rec.value for _, rec in seen] == [b"now", b"later"], "the undelayed record at once, the delayed one later"
    (now_at, _), (later_at, later) = seen
    assert now_at - acked_at < 2, f"the record without a delivery time took {now_at - acked_at:.3f} s"
    assert later_at >= due / 1000 - 0.05, f"the delayed record was readable {due / 1000 - later_at:.3f} s early"
    assert later_at <= due / 1000 + 2, f"the delayed record came {later_at - due / 1000:.3f} s late"
    headers = headers_of(later)
    assert (headers.get("weir.delivery-timestamp"), headers.get("origin")) == ([str(due)], ["kafka"]), headers


def test_many_due_messages_fire_in_batches_their_topic_takes_and_do_not_hold_up_other_topics(broker):
    # 3,000 records of 100 bytes due at once on a topic taking 64 KiB batches: the timer must
    # cut what it appends to the topic's limit (a 300 KB batch was refused for ever, and the
    # refused messages, first in line, starved every other topic's).
    small = delay_topic(broker, max_message_bytes="65536")
    other = delay_topic(broker)
    due = now_ms() + 2000
    producer = c_producer(broker.bootstrap, {"linger.ms": 50})
    for i in range(3000):
        producer.produce(small, value=b"%04d" % i + b"x" * 96, headers=[("weir.delivery-timestamp", str(due).encode())])
    producer.produce(other, value=b"other", headers=[("weir.delivery-timestamp", str(due).encode())])
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique("g"), "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(small, 0, 0), TopicPartition(other, 0, 0)])
        got = {small: [], other: []}
        deadline = time.time() + 30
        while time.time() < deadline and (len(got[small]) < 3000 or not got[other]):
            m = consumer.poll(0.5)
            if m is not None and not m.error():
                got[m.topic()].append(m.value())
    finally:
        consumer.close()
    assert got[other] == [b"other"]
    assert len(got[small]) == 3000 and len(set(got[small])) == 3000, f"{len(got[small])} of 3000 fired"


# -- retries and dead letters -------------------------------------------------------------------


def test_a_never_acked_message_is_delivered_max_attempts_times_then_dead_lettered_while_others_flow(broker):
    topic, group = unique("rmq-retry"), unique("g")
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=1)
    group_settings(broker, group, max_delivery_attempts=3)
    [poison, _] = send_all(broker, topic, [
        message(topic, b"poison", tag="TagP", keys=("k-poison",), properties={"colour": "red"}),
        message(topic, b"fine-1"),
    ])
    consumer = simple_consumer(broker, group, topic, await_s=1)
    log, late_sent_at = [], None
    try:
        deadline = time.monotonic() + 20
        third_at = None
        while time.monotonic() < deadline and (third_at is None or time.monotonic() < third_at + 3):
            for m in consumer.receive(32, 1):
                log.append((time.monotonic(), m.body, m.delivery_attempt))
                if m.body != b"poison":
                    consumer.ack(m)  # the others are acked at once; the poison never
                elif m.delivery_attempt == 3 and third_at is None:
                    third_at = time.monotonic()
            if late_sent_at is None and any(body == b"poison" for _, body, _ in log):
                send_all(broker, topic, [message(topic, b"fine-2")])
                late_sent_at = time.monotonic()
    finally:
        consumer.shutdown()
    poison_attempts = [attempt for _, body, attempt in log if body == b"poison"]
    assert poison_attempts == [1, 2, 3], f"the poison's deliveries: {poison_attempts}"
    assert [attempt for _, body, attempt in log if body == b"fine-1"] == [1], "an acked message never comes back"
    fine_2 = [at for at, body, _ in log if body == b"fine-2"]
    assert len(fine_2) == 1, f"a message sent while the poison is retried was delivered {len(fine_2)} times"
    assert fine_2[0] - late_sent_at < 2, "messages behind the retried one keep flowing"

    dlq = dlq_of(group)
    [dead] = read_to_end(broker.bootstrap, dlq, want=1)
    headers = headers_of(dead)
    assert dead.value == b"poison"
    assert headers["weir.origin-topic"] == [topic]
    assert headers["weir.origin-partition"] == ["0"]
    assert headers["weir.origin-offset"] == [str(poison.offset)]
    assert headers["weir.delivery-attempts"] == ["3"]
    assert headers["weir.message-id"] == [poison.message_id]
    assert (headers["weir.tag"], headers["weir.key"], headers["colour"]) == (["TagP"], ["k-poison"], ["red"])
    metadata = c_admin(broker.bootstrap).list_topics(topic=dlq, timeout=10)
    assert len(metadata.topics[dlq].partitions) == 1, "the dead-letter topic has one partition"


def test_a_message_whose_last_delivery_ran_out_is_dead_lettered_after_a_restart_with_no_receive(broker_factory):
    """The broker takes over the state of every queue it leads when it starts (as after a
    failover), so the dead-letter sweep finds a message nobody receives from any more."""
    broker = broker_factory()
    topic, group = unique("rmq-adopt"), unique("g")
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=1)
    group_settings(broker, group, max_delivery_attempts=1)
    send_all(broker, topic, [message(topic, b"orphan")])
    consumer = simple_consumer(broker, group, topic, await_s=1)
    try:
        first = receive_timed(consumer, until=time.time() + 10, want=1, invisible_s=3, ack=False)
        assert [m.body for _, m in first] == [b"orphan"]
    finally:
        consumer.shutdown()
    broker.kill9()
    broker.start()
    [dead] = read_to_end(broker.bootstrap, dlq_of(group), want=1, timeout=20)
    assert dead.value == b"orphan"
    assert headers_of(dead)["weir.delivery-attempts"] == ["1"]


def test_a_dead_lettered_message_is_received_from_the_dlq_topic_by_a_rocketmq_consumer_with_its_origin(broker):
    topic, group = unique("rmq-dlq"), unique("g")
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=1)
    group_settings(broker, group, max_delivery_attempts=1)
    [receipt] = send_all(broker, topic, [message(topic, b"dead on arrival", tag="TagD", properties={"colour": "blue"})])
    consumer = simple_consumer(broker, group, topic, await_s=1)
    try:
        first = receive_timed(consumer, until=time.time() + 10, want=1, invisible_s=1, ack=False)
        assert [(m.body, m.delivery_attempt) for _, m in first] == [(b"dead on arrival", 1)]
        again = receive_timed(consumer, until=time.time() + 2.5, invisible_s=1, ack=False)
        assert again == [], "one attempt only"
    finally:
        consumer.shutdown()
    dlq_consumer = simple_consumer(broker, unique("g-dlq"), dlq_of(group), await_s=1)
    try:
        got = receive_timed(dlq_consumer, until=time.time() + 15, want=1)
        got += receive_timed(dlq_consumer, until=time.time() + 1.5)
    finally:
        dlq_consumer.shutdown()
    assert len(got) == 1, f"the dead-letter topic held {len(got)} messages"
    [(_, dead)] = got
    assert (dead.body, dead.message_id, dead.tag) == (b"dead on arrival", receipt.message_id, "TagD")
    assert dead.properties.get("DLQ_ORIGIN_TOPIC") == topic, dead.properties
    assert dead.properties.get("DLQ_ORIGIN_MESSAGE_ID") == receipt.message_id, dead.properties
    assert dead.properties.get("colour") == "blue", dead.properties


def test_a_push_consumer_that_always_fails_consumes_max_attempts_times_then_the_message_is_dead_lettered_once(broker):
    topic, group = unique("rmq-push-dlq"), unique("g")
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=1)
    cli = subprocess.run(
        [str(weir_bin()), "group", "create", group, "--max-delivery-attempts", "2", "--retry-backoff", "1s",
         "--admin", broker.admin_url()],
        capture_output=True, text=True, timeout=30,
    )
    assert cli.returncode == 0, cli.stderr
    log = []
    consumer = push_consumer(broker, group, topic, Recorder("c", log, fail={b"always fails"}, fail_first=1_000_000))
    try:
        [receipt] = send_all(broker, topic, [message(topic, b"always fails")])
        deadline = time.monotonic() + 20
        while len(log) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(3)  # a third attempt would come 1 s after the second
        deliveries = list(log)
    finally:
        consumer.shutdown()
    assert [attempt for _, _, attempt, _ in deliveries] == [1, 2], deliveries
    assert deliveries[1][3] - deliveries[0][3] >= 0.9, "the group's 1 s back-off"
    dead = read_to_end(broker.bootstrap, dlq_of(group), want=1)
    assert len(dead) == 1, f"{len(dead)} copies in the dead letters"
    headers = headers_of(dead[0])
    assert dead[0].value == b"always fails"
    assert headers["weir.message-id"] == [receipt.message_id]
    assert headers["weir.delivery-attempts"] == ["2"]


def test_forwarding_a_received_message_to_the_dead_letters_moves_it_there_once(broker, stub):
    """What a FIFO PushConsumer of the Python client does after its local retries:
    ForwardMessageToDeadLetterQueue with the delivery's receipt handle."""
    topic, group = unique("rmq-forward"), unique("g")
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=1)
    group_settings(broker, group, max_delivery_attempts=2)
    [receipt] = send_all(broker, topic, [message(topic, b"forward me")])
    request = pb.ReceiveMessageRequest(
        group=pb.Resource(name=group),
        message_queue=d.MessageQueue(topic=pb.Resource(name=topic), id=0),
        filter_expression=d.FilterExpression(type=pb.FilterType.TAG, expression="*"),
        batch_size=1,
        invisible_duration=Duration(seconds=1),
        long_polling_timeout=Duration(seconds=5),
    )
    [held] = [r.message for r in stub.ReceiveMessage(request, metadata=METADATA, timeout=15) if r.WhichOneof("content") == "message"]
    forwarded = stub.ForwardMessageToDeadLetterQueue(
        pb.ForwardMessageToDeadLetterQueueRequest(
            group=pb.Resource(name=group),
            topic=pb.Resource(name=topic),
            receipt_handle=held.system_properties.receipt_handle,
            message_id=held.system_properties.message_id,
            delivery_attempt=held.system_properties.delivery_attempt,
            max_delivery_attempts=2,
        ),
        metadata=METADATA, timeout=10,
    )
    assert forwarded.status.code == pb.Code.OK, forwarded.status
    time.sleep(1.5)  # past the delivery's invisible time: it must not come back
    request.long_polling_timeout.CopyFrom(Duration(seconds=1))
    responses = list(stub.ReceiveMessage(request, metadata=METADATA, timeout=10))
    assert [r.status.code for r in responses if r.WhichOneof("content") == "status"] == [pb.Code.MESSAGE_NOT_FOUND]
    dead = read_to_end(broker.bootstrap, dlq_of(group), want=1)
    assert [r.value for r in dead] == [b"forward me"]
    assert headers_of(dead[0])["weir.message-id"] == [receipt.message_id]
