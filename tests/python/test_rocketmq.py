"""RocketMQ 5 clients against Weir's gRPC listener: the official Python client
(rocketmq-python-client) sends, and Kafka clients read what it sent; raw calls with the
protocol's own stubs check the statuses a client gets for bad requests.
"""

import json
import os
import subprocess
import time
import urllib.parse
import uuid

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
)
from rocketmq import grpc_protocol as pb
from rocketmq.grpc_protocol import definition_pb2 as d

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from conftest import weir_bin
from helpers import c_admin, c_consume, c_consumer, c_create_topic, c_producer, c_read_partition, http, unique


def producer_for(broker, topics):
    config = ClientConfiguration(broker.rocketmq_endpoint, Credentials(), request_timeout=10)
    producer = Producer(config, topics)
    producer.startup()
    return producer


def message(topic, body, tag=None, keys=(), properties=None, group=None):
    m = Message()
    m.topic = topic
    m.body = body
    if tag is not None:
        m.tag = tag
    for key in keys:
        m.keys = key  # the client's setter adds a key to the message's set
    for name, value in (properties or {}).items():
        m.add_property(name, value)
    if group is not None:
        m.message_group = group
    return m


def headers_of(rec):
    """A record's headers as name → [values as text], in order."""
    out = {}
    for name, value in rec.headers:
        out.setdefault(name, []).append(value.decode() if value is not None else None)
    return out


@pytest.fixture
def stub(broker):
    channel = grpc.insecure_channel(broker.rocketmq_endpoint)
    yield pb.MessagingServiceStub(channel)
    channel.close()


# RocketMQ's clients send these with every call; the signature is not checked yet.
METADATA = [
    ("x-mq-client-id", "weir-test-client"),
    ("x-mq-language", "PYTHON"),
    ("x-mq-protocol", "v2"),
    ("authorization", "MQv2-HMAC-SHA1 Credential=, SignedHeaders=x-mq-date-time, Signature="),
]


def test_a_rocketmq_producer_sends_and_a_kafka_consumer_reads_body_tag_keys_and_properties(broker):
    topic = unique("rmq-send")
    producer = producer_for(broker, [topic])
    try:
        sent = [
            message(topic, b"first", tag="TagA", keys=("order-1",), properties={"colour": "red"}),
            message(topic, "второе сообщение 🚀".encode(), tag="Тег", keys=("ключ", "k2"), properties={"город": "Москва"}),
            message(topic, b"untagged"),
        ]
        receipts = [producer.send(m) for m in sent]
    finally:
        producer.shutdown()
    # One partition by default: the offsets are the receipts'.
    assert [r.offset for r in receipts] == [0, 1, 2]
    assert len({r.message_id for r in receipts}) == 3

    got = c_read_partition(broker.bootstrap, topic, 0, 3)
    assert [r.value for r in got] == [m.body for m in sent]
    first, second, third = (headers_of(r) for r in got)
    assert first["weir.tag"] == ["TagA"]
    assert first["weir.key"] == ["order-1"]
    assert first["colour"] == ["red"]
    assert first["weir.message-id"] == [receipts[0].message_id]
    assert int(first["weir.born-timestamp"][0]) > 1_600_000_000_000
    assert second["weir.tag"] == ["Тег"]
    assert set(second["weir.key"]) == {"ключ", "k2"}
    assert second["город"] == ["Москва"]
    assert "weir.tag" not in third
    assert all(r.key is None for r in got), "no message group, no record key"


def test_a_one_mebibyte_body_with_every_byte_value_arrives_intact(broker):
    topic = unique("rmq-big")
    body = bytes(range(256)) * 4096
    assert len(body) == 1 << 20
    producer = producer_for(broker, [topic])
    try:
        receipt = producer.send(message(topic, body, tag="big"))
    finally:
        producer.shutdown()
    (got,) = c_read_partition(broker.bootstrap, topic, 0, 1, conf={"fetch.max.bytes": 8 << 20})
    assert got.offset == receipt.offset
    assert got.value == body


def test_a_topic_created_with_a_message_type_takes_a_one_mebibyte_body_unless_its_size_was_set(broker):
    """`weir topic create --message-type` makes a RocketMQ topic: it takes RocketMQ's 4 MiB bodies
    (as topics RocketMQ clients create do), so a 1 MiB body goes through and is received intact.
    A `max.message.bytes` given at creation is kept, by the CLI and by the admin API alike."""
    topic, small, api_topic, group = unique("rmq-typed"), unique("rmq-typed-small"), unique("rmq-typed-api"), unique("g")
    env = {**os.environ, "WEIR_ADMIN": broker.admin_url()}

    def weir(*args):
        done = subprocess.run([str(weir_bin()), *args], capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, f"weir {' '.join(args)}: {done.stderr}"

    def max_message_bytes(name):
        status, answer = http("GET", f"{broker.admin_url()}/v1/topics/{name}/configs")
        assert status == 200, answer
        [entry] = [c for c in answer["configs"] if c["name"] == "max.message.bytes"]
        return entry["value"], entry["source"]

    weir("topic", "create", topic, "--partitions", "1", "--message-type", "NORMAL")
    weir("topic", "create", small, "--partitions", "1", "--message-type", "FIFO", "--config", "max.message.bytes=2000000")
    status, created = http("POST", f"{broker.admin_url()}/v1/topics", {"name": api_topic, "configs": {"message.type": "DELAY"}})
    assert status == 201, created
    assert max_message_bytes(topic) == (str((4 << 20) + (64 << 10)), "topic")
    assert max_message_bytes(api_topic) == (str((4 << 20) + (64 << 10)), "topic")
    assert max_message_bytes(small) == ("2000000", "topic"), "the user's own limit is kept"

    body = bytes(range(256)) * 4096
    producer = producer_for(broker, [topic])
    try:
        receipt = producer.send(message(topic, body, tag="big"))
    finally:
        producer.shutdown()
    consumer = simple_consumer(broker, group, topic)
    try:
        [got] = receive_all(consumer, 1)
        consumer.ack(got)
    finally:
        consumer.shutdown()
    assert (got.message_id, got.tag, len(got.body)) == (receipt.message_id, "big", 1 << 20)
    assert got.body == body


def test_messages_of_one_group_share_a_queue_and_its_record_key(broker):
    topic = unique("rmq-groups")
    # Message groups are FIFO messages: the topic must take them (the client checks the route).
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=4, config={"message.type": "FIFO"})
    producer = producer_for(broker, [topic])
    try:
        receipts = {g: [producer.send(message(topic, f"{g}-{i}".encode(), group=g)) for i in range(3)] for g in ["a", "b"]}
    finally:
        producer.shutdown()
    # The receipt's queue is the one the client picked; the broker picks the queue (as RocketMQ's
    # proxies do), so read every queue.
    consumer = c_consumer(broker.bootstrap)
    try:
        consumer.assign([TopicPartition(topic, q, OFFSET_BEGINNING) for q in range(4)])
        got = c_consume(consumer, 6)
    finally:
        consumer.close()
    for group, rs in receipts.items():
        mine = [r for r in got if r.key == group.encode()]
        assert len({r.partition for r in mine}) == 1, f"group {group} spread over queues"
        assert [r.value for r in mine] == [f"{group}-{i}".encode() for i in range(3)]
        assert [r.offset for r in mine] == [r.offset for r in rs]


def test_routes_list_every_queue_at_this_broker_with_the_topics_message_type(broker, stub):
    topic = unique("rmq-route")
    response = stub.QueryRoute(pb.QueryRouteRequest(topic=pb.Resource(name=topic)), metadata=METADATA, timeout=10)
    assert response.status.code == pb.Code.OK, response.status
    assert len(response.message_queues) == 1
    queue = response.message_queues[0]
    assert queue.topic.name == topic and queue.id == 0
    assert queue.permission == pb.Permission.READ_WRITE
    assert list(queue.accept_message_types) == [pb.MessageType.NORMAL]
    assert queue.broker.id == 0
    address = queue.broker.endpoints.addresses[0]
    assert f"{address.host}:{address.port}" == broker.rocketmq_endpoint


def test_bad_requests_get_the_status_rocketmq_clients_expect(broker, stub):
    def send(topic, body, **system):
        system.setdefault("message_id", "01ABC")
        request = pb.SendMessageRequest(
            messages=[d.Message(topic=pb.Resource(name=topic), body=body, system_properties=d.SystemProperties(**system))]
        )
        response = stub.SendMessage(request, metadata=METADATA, timeout=10)
        return response.status.code, response.entries[0].status.code

    topic = unique("rmq-bad")
    assert send(topic, b"") == (pb.Code.MESSAGE_BODY_EMPTY, pb.Code.MESSAGE_BODY_EMPTY)
    assert send(topic, b"x", tag="a||b")[0] == pb.Code.ILLEGAL_MESSAGE_TAG
    assert send("__consumer_offsets", b"x")[0] == pb.Code.ILLEGAL_TOPIC
    assert send("bad topic name!", b"x")[0] == pb.Code.ILLEGAL_TOPIC
    too_big = b"x" * ((4 << 20) + 1)
    assert send(topic, too_big)[0] == pb.Code.MESSAGE_BODY_TOO_LARGE
    # A delayed message needs a DELAY topic: a clear refusal, not an early delivery.
    later = Timestamp(seconds=int(time.time()) + 3600)
    assert send(topic, b"x", delivery_timestamp=later)[0] == pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    # Nothing refused was stored; a valid message still goes through.
    assert send(topic, b"fine") == (pb.Code.OK, pb.Code.OK)
    (only,) = c_read_partition(broker.bootstrap, topic, 0, 1)
    assert only.value == b"fine" and only.offset == 0

    # An unknown topic with auto-creation off: TOPIC_NOT_FOUND, from the route and the send.
    response = stub.QueryRoute(pb.QueryRouteRequest(topic=pb.Resource(name="")), metadata=METADATA, timeout=10)
    assert response.status.code == pb.Code.ILLEGAL_TOPIC


def test_an_unknown_topic_is_not_found_when_auto_creation_is_off(broker_factory):
    broker = broker_factory({"auto.create.topics.enable": "false"})
    with grpc.insecure_channel(broker.rocketmq_endpoint) as channel:
        stub = pb.MessagingServiceStub(channel)
        route = stub.QueryRoute(pb.QueryRouteRequest(topic=pb.Resource(name="nope")), metadata=METADATA, timeout=10)
        assert route.status.code == pb.Code.TOPIC_NOT_FOUND
        assert "nope" in route.status.message
        sent = stub.SendMessage(
            pb.SendMessageRequest(messages=[d.Message(topic=pb.Resource(name="nope"), body=b"x")]),
            metadata=METADATA,
            timeout=10,
        )
        assert sent.status.code == pb.Code.TOPIC_NOT_FOUND


def test_calls_not_built_yet_answer_not_implemented_instead_of_failing_the_stream(broker, stub):
    from rocketmq.grpc_protocol import service_pb2

    response = stub.UpdateOffset(service_pb2.UpdateOffsetRequest(), metadata=METADATA, timeout=10)
    assert response.status.code == pb.Code.NOT_IMPLEMENTED


def test_telemetry_answers_a_producers_settings_with_the_servers(broker, stub):
    topic = unique("rmq-telemetry")
    settings = pb.Settings(
        client_type=pb.ClientType.PRODUCER,
        publishing=pb.Publishing(topics=[pb.Resource(name=topic)]),
    )
    responses = stub.Telemetry(iter([pb.TelemetryCommand(settings=settings)]), metadata=METADATA, timeout=10)
    first = next(iter(responses))
    assert first.status.code == pb.Code.OK
    assert first.settings.publishing.max_body_size == 4 << 20
    assert first.settings.publishing.validate_message_type


# -- consumers: SimpleConsumer (receive, ack, invisible time) ------------------------------------


def simple_consumer(broker, group, topic, expression="*", await_s=2):
    config = ClientConfiguration(broker.rocketmq_endpoint, Credentials(), request_timeout=10)
    consumer = SimpleConsumer(config, group, {topic: FilterExpression(expression)}, await_duration=await_s)
    consumer.startup()
    return consumer


def receive_all(consumer, want, invisible_s=30, timeout=30):
    """Receives until `want` messages came (or the timeout), without acking."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got += consumer.receive(32, invisible_s)
    return got


def send_all(broker, topic, messages):
    producer = producer_for(broker, [topic])
    try:
        return [producer.send(m) for m in messages]
    finally:
        producer.shutdown()


def test_a_simple_consumer_receives_what_its_tag_expression_selects_and_acks_it(broker):
    topic, group = unique("rmq-recv"), unique("g")
    tags = ["TagA", "TagB", "TagA", None, "TagC", "TagA"]
    receipts = send_all(
        broker, topic, [message(topic, f"m{i}".encode(), tag=t, keys=(f"k{i}",), properties={"i": str(i)}) for i, t in enumerate(tags)]
    )
    consumer = simple_consumer(broker, group, topic, "TagA || TagC")
    try:
        got = receive_all(consumer, 4)
        assert sorted(m.body for m in got) == [b"m0", b"m2", b"m4", b"m5"]
        by_body = {m.body: m for m in got}
        m0 = by_body[b"m0"]
        assert m0.tag == "TagA" and m0.keys == {"k0"} and m0.properties == {"i": "0"}
        assert m0.message_id == receipts[0].message_id
        assert m0.delivery_attempt == 1
        assert not m0.corrupted, "the body digest matches"
        for m in got:
            consumer.ack(m)
        # Acked and filtered messages do not come back, not even after their invisible time.
        assert consumer.receive(32, 1) == []
        time.sleep(1.5)
        assert consumer.receive(32, 1) == []
    finally:
        consumer.shutdown()
    # Another group has its own position: it gets everything.
    other = simple_consumer(broker, unique("g"), topic)
    try:
        assert sorted(m.body for m in receive_all(other, 6)) == [f"m{i}".encode() for i in range(6)]
    finally:
        other.shutdown()


def test_an_unacked_message_comes_back_after_its_invisible_time_one_attempt_higher(broker):
    topic, group = unique("rmq-invisible"), unique("g")
    send_all(broker, topic, [message(topic, b"again")])
    consumer = simple_consumer(broker, group, topic, await_s=1)
    try:
        (first,) = receive_all(consumer, 1, invisible_s=4)
        received_at = time.monotonic()
        assert first.delivery_attempt == 1
        assert consumer.receive(32, 4) == [], "invisible for 4 s"
        time.sleep(max(0.0, received_at + 4.2 - time.monotonic()))
        (second,) = receive_all(consumer, 1, invisible_s=30)
        assert second.body == b"again" and second.delivery_attempt == 2
        assert second.message_id == first.message_id
        # The first delivery's handle is stale now.
        with pytest.raises(Exception, match="40013"):
            consumer.ack(first)
        # ChangeInvisibleDuration: visible again in 1 s instead of 30.
        consumer.change_invisible_duration(second, 1)
        time.sleep(1.5)
        (third,) = receive_all(consumer, 1, invisible_s=30)
        assert third.delivery_attempt == 3
        consumer.ack(third)
        with pytest.raises(Exception, match="40013"):
            consumer.ack(third)
    finally:
        consumer.shutdown()


def test_acked_messages_stay_acked_and_unacked_ones_come_back_after_kill_9(broker_factory):
    broker = broker_factory()
    topic, group = unique("rmq-crash"), unique("g")
    send_all(broker, topic, [message(topic, f"c{i}".encode()) for i in range(10)])
    consumer = simple_consumer(broker, group, topic)
    try:
        got = receive_all(consumer, 10, invisible_s=3)
        assert len(got) == 10
        acked = {m.body for m in got[:5]}
        for m in got[:5]:
            consumer.ack(m)
    finally:
        consumer.shutdown()
    broker.kill9()
    broker.start()
    time.sleep(3.2)
    consumer = simple_consumer(broker, group, topic)
    try:
        again = receive_all(consumer, 5, invisible_s=30)
        assert sorted(m.body for m in again) == sorted({m.body for m in got} - acked)
        assert all(m.delivery_attempt == 2 for m in again)
        for m in again:
            consumer.ack(m)
        assert consumer.receive(32, 1) == []
    finally:
        consumer.shutdown()


def test_a_kafka_record_is_received_as_an_untagged_message_with_a_stable_id(broker):
    topic, group = unique("rmq-from-kafka"), unique("g")
    producer = c_producer(broker.bootstrap)
    producer.produce(topic, value=b"from kafka", key=b"k", headers=[("origin", b"kafka"), ("weir.tag", b"T")])
    producer.produce(topic, value=b"plain", headers=[("origin", "кафка".encode())])
    producer.flush(30)
    consumer = simple_consumer(broker, group, topic, "T")
    try:
        (tagged,) = receive_all(consumer, 1, invisible_s=1)
        assert tagged.body == b"from kafka" and tagged.properties == {"origin": "kafka"}
        time.sleep(1.2)
        (again,) = receive_all(consumer, 1)
        assert again.message_id == tagged.message_id and len(again.message_id) == 34
        consumer.ack(again)
    finally:
        consumer.shutdown()
    everything = simple_consumer(broker, unique("g"), topic)
    try:
        got = receive_all(everything, 2)
        plain = [m for m in got if m.body == b"plain"][0]
        assert plain.tag is None and plain.properties == {"origin": "кафка"}
    finally:
        everything.shutdown()


def test_receipt_handles_that_are_made_up_or_for_another_queue_are_invalid(broker, stub):
    topic = unique("rmq-handles")
    for handle in ["", "nonsense", "w1.0.0.00000000000000ff", "w1.7.0.00000000000000ff"]:
        response = stub.AckMessage(
            pb.AckMessageRequest(
                group=pb.Resource(name="g"),
                topic=pb.Resource(name=topic),
                entries=[pb.AckMessageEntry(message_id="x", receipt_handle=handle)],
            ),
            metadata=METADATA,
            timeout=10,
        )
        assert response.entries[0].status.code == pb.Code.INVALID_RECEIPT_HANDLE, handle
    receive = stub.ReceiveMessage(
        pb.ReceiveMessageRequest(
            group=pb.Resource(name="g"),
            message_queue=d.MessageQueue(topic=pb.Resource(name=topic), id=0),
            filter_expression=d.FilterExpression(type=pb.FilterType.SQL, expression="a > 1"),
            batch_size=1,
        ),
        metadata=METADATA,
        timeout=10,
    )
    (only,) = list(receive)
    assert only.status.code == pb.Code.UNSUPPORTED


# -- consumers: PushConsumer ------------------------------------------------------------------


class Recorder(MessageListener):
    """Records each delivery (body, attempt, when); fails the first `fail_first` attempts of the
    bodies in `fail`."""

    def __init__(self, name, log, fail=(), fail_first=1):
        self.name, self.log, self.fail, self.fail_first = name, log, set(fail), fail_first

    def consume(self, message):
        self.log.append((self.name, message.body, message.delivery_attempt, time.monotonic()))
        if message.body in self.fail and message.delivery_attempt <= self.fail_first:
            return ConsumeResult.FAILURE
        return ConsumeResult.SUCCESS


def push_consumer(broker, group, topic, listener):
    config = ClientConfiguration(broker.rocketmq_endpoint, Credentials(), request_timeout=10)
    consumer = PushConsumer(config, group, listener, {topic: FilterExpression("*")})
    consumer.startup()
    return consumer


def test_two_push_consumers_of_a_group_share_the_messages_each_consumed_once(broker):
    topic, group = unique("rmq-push"), unique("g")
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=4)
    log = []
    consumers = [push_consumer(broker, group, topic, Recorder(f"c{i}", log)) for i in range(2)]
    try:
        bodies = {f"p{i}".encode() for i in range(40)}
        send_all(broker, topic, [message(topic, b) for b in sorted(bodies)])
        deadline = time.monotonic() + 60
        while len(log) < 40 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)  # nothing more comes
        consumed = [body for _, body, _, _ in log]
        assert sorted(consumed) == sorted(bodies), f"{len(consumed)} deliveries"
        assert all(attempt == 1 for _, _, attempt, _ in log)
    finally:
        for c in consumers:
            c.shutdown()


def test_a_failed_consume_is_redelivered_after_the_groups_back_off(broker):
    topic, group = unique("rmq-nack"), unique("g")
    log = []
    consumer = push_consumer(broker, group, topic, Recorder("c", log, fail={b"retry-me"}))
    try:
        send_all(broker, topic, [message(topic, b"retry-me"), message(topic, b"fine")])
        deadline = time.monotonic() + 60
        while sum(1 for _, b, _, _ in log if b == b"retry-me") < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        retried = [(attempt, at) for _, body, attempt, at in log if body == b"retry-me"]
        assert [a for a, _ in retried] == [1, 2], log
        # The back-off Weir advertises starts at 1 s.
        assert retried[1][1] - retried[0][1] >= 0.9
        time.sleep(1.5)
        assert sum(1 for _, b, _, _ in log if b == b"retry-me") == 2, "acked on the second attempt"
        assert [a for _, b, a, _ in log if b == b"fine"] == [1]
    finally:
        consumer.shutdown()


# -- group settings ------------------------------------------------------------------------------


def consumer_settings(stub, group, topic):
    """The Settings the server answers a push consumer of `group` with."""
    settings = pb.Settings(
        client_type=pb.ClientType.PUSH_CONSUMER,
        subscription=pb.Subscription(
            group=pb.Resource(name=group),
            subscriptions=[
                d.SubscriptionEntry(
                    topic=pb.Resource(name=topic),
                    expression=d.FilterExpression(type=d.FilterType.TAG, expression="*"),
                )
            ],
        ),
    )
    responses = stub.Telemetry(iter([pb.TelemetryCommand(settings=settings)]), metadata=METADATA, timeout=10)
    first = next(iter(responses))
    assert first.status.code == pb.Code.OK
    return first.settings


def test_group_settings_from_the_http_api_reach_consumers_in_their_settings(broker, stub):
    admin, topic = broker.admin_url(), unique("rmq-settings")
    fifo_group, plain_group = unique("g-fifo"), unique("g-plain")

    defaults = consumer_settings(stub, plain_group, topic)
    assert not defaults.subscription.fifo
    assert defaults.backoff_policy.max_attempts == 17
    assert [d.seconds for d in defaults.backoff_policy.customized_backoff.next][:3] == [1, 5, 10]

    status, created = http("POST", f"{admin}/v1/groups", {
        "name": fifo_group,
        "configs": {"consume.fifo": "true", "max.delivery.attempts": "4", "retry.backoff": "exponential:200ms,5s,3"},
    })
    assert status == 201, created
    assert {c["name"]: (c["value"], c["source"]) for c in created["configs"]}["max.delivery.attempts"] == ("4", "group")
    answered = consumer_settings(stub, fifo_group, topic)
    assert answered.subscription.fifo
    assert answered.backoff_policy.max_attempts == 4
    exponential = answered.backoff_policy.exponential_backoff
    assert (exponential.initial.nanos, exponential.max.seconds, exponential.multiplier) == (200_000_000, 5, 3.0)

    # Creating it again is a conflict; a bad value names the setting; an edit applies.
    status, again = http("POST", f"{admin}/v1/groups", {"name": fifo_group, "configs": {}})
    assert (status, again["error"]["code"]) == (409, "GROUP_ALREADY_EXISTS"), again
    status, bad = http("PATCH", f"{admin}/v1/groups/{fifo_group}/configs", {"set": {"max.delivery.attempts": "0"}})
    assert status == 400 and "max.delivery.attempts" in bad["error"]["message"], bad
    status, unknown = http("PATCH", f"{admin}/v1/groups/{fifo_group}/configs", {"set": {"fifo": "true"}})
    assert status == 400 and "Unknown group config" in unknown["error"]["message"], unknown
    status, altered = http("PATCH", f"{admin}/v1/groups/{fifo_group}/configs", {"delete": ["consume.fifo"]})
    assert status == 200, altered
    assert not consumer_settings(stub, fifo_group, topic).subscription.fifo
    status, described = http("GET", f"{admin}/v1/groups/{fifo_group}")
    assert status == 200, described
    assert {c["name"]: c["source"] for c in described["configs"]} == {
        "consume.fifo": "default", "consume.broadcast": "default", "max.delivery.attempts": "group", "retry.backoff": "group",
        "consume.from.where": "default", "consume.timestamp": "default",
        # A Kafka consumer or share group of the same name would obey these (Kafka's group configs).
        "consumer.session.timeout.ms": "default", "consumer.heartbeat.interval.ms": "default",
        "share.session.timeout.ms": "default", "share.heartbeat.interval.ms": "default",
        "share.record.lock.duration.ms": "default", "share.delivery.count.limit": "default",
        "share.auto.offset.reset": "default",
    }


def test_a_push_consumer_waits_its_groups_own_back_off_before_a_redelivery(broker):
    topic, group = unique("rmq-backoff"), unique("g")
    status, created = http("POST", f"{broker.admin_url()}/v1/groups", {"name": group, "configs": {"retry.backoff": "3s"}})
    assert status == 201, created
    log = []
    consumer = push_consumer(broker, group, topic, Recorder("c", log, fail={b"slow-retry"}))
    try:
        send_all(broker, topic, [message(topic, b"slow-retry")])
        deadline = time.monotonic() + 60
        while len(log) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [attempt for _, _, attempt, _ in log] == [1, 2], log
        waited = log[1][3] - log[0][3]
        assert 2.9 <= waited < 20, f"redelivered after {waited:.2f} s, the group's back-off is 3 s"
    finally:
        consumer.shutdown()


# -- finding messages: by key, message id and time ---------------------------------------------


def find(broker, topic, **params):
    query = urllib.parse.urlencode(params)
    return http("GET", f"{broker.admin_url()}/v1/topics/{topic}/messages?{query}")


def wait_found(broker, topic, want, timeout=15, **params):
    """Polls a query until it finds `want` messages (the index lags the log a little)."""
    deadline = time.monotonic() + timeout
    while True:
        status, answer = find(broker, topic, **params)
        assert status == 200, answer
        if len(answer["messages"]) >= want or time.monotonic() > deadline:
            return answer["messages"]
        time.sleep(0.2)


def test_messages_are_found_by_key_id_and_time_also_after_kill_9(broker_factory):
    broker = broker_factory()
    topic = unique("rmq-find")
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=3, config={"message.index.enable": "true"})
    started = int(time.time() * 1000)
    messages = [
        message(topic, f"order-{i}".encode(), tag="created", keys=(f"order-{i}", f"customer-{i % 5}"), properties={"n": str(i)})
        for i in range(60)
    ]
    messages.append(message(topic, "Größe 🚀".encode(), keys=("ключ-🔑",)))
    receipts = send_all(broker, topic, messages)
    sent_at = int(time.time() * 1000)

    customer_3 = wait_found(broker, topic, 12, key="customer-3")
    assert sorted(m["body"] for m in customer_3) == sorted(f"order-{i}" for i in range(60) if i % 5 == 3)
    assert all("customer-3" in m["keys"] and m["tag"] == "created" for m in customer_3)
    [unicode] = wait_found(broker, topic, 1, key="ключ-🔑")
    assert unicode["body"] == "Größe 🚀"

    by_id = http("GET", f"{broker.admin_url()}/v1/topics/{topic}/messages/{receipts[7].message_id}")
    assert by_id[0] == 200, by_id
    assert (by_id[1]["body"], by_id[1]["message_id"], by_id[1]["properties"]) == ("order-7", receipts[7].message_id, {"n": "7"})
    missing = http("GET", f"{broker.admin_url()}/v1/topics/{topic}/messages/01ABCDEF")
    assert (missing[0], missing[1]["error"]["code"]) == (404, "MESSAGE_NOT_FOUND")
    assert find(broker, topic, key="nobody's key")[1]["messages"] == []

    # A time window: everything sent, nothing before; max caps it.
    status, window = find(broker, topic, begin_ms=started - 1000, end_ms=sent_at + 1000, max=1000)
    assert status == 200 and len(window["messages"]) == 61, window
    assert find(broker, topic, begin_ms=0, end_ms=started - 60_000)[1]["messages"] == []
    assert len(find(broker, topic, begin_ms=0, max=5)[1]["messages"]) == 5

    # The CLI asks the same API.
    cli = subprocess.run(
        [str(weir_bin()), "message", "query", topic, "--key", "order-42", "--admin", broker.admin_url()],
        capture_output=True, text=True, timeout=30,
    )
    assert cli.returncode == 0, cli.stderr
    assert "body=order-42" in cli.stdout and f"id={receipts[42].message_id}" in cli.stdout, cli.stdout

    # The index is rebuilt from the log after a crash: found again, once each.
    broker.kill9()
    broker.start()
    again = wait_found(broker, topic, 12, key="customer-3")
    assert sorted(m["offset"] for m in again) == sorted(m["offset"] for m in customer_3)


def test_a_kafka_record_is_found_by_its_derived_id_and_unindexed_topics_say_so(broker):
    topic = unique("rmq-find-kafka")
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=1)
    producer = c_producer(broker.bootstrap)
    producer.produce(topic, value=b"plain kafka", key=b"k1")
    producer.flush(10)
    consumer = simple_consumer(broker, unique("g"), topic)
    try:
        [received] = receive_all(consumer, 1)
        consumer.ack(received)
    finally:
        consumer.shutdown()
    status, found = http("GET", f"{broker.admin_url()}/v1/topics/{topic}/messages/{received.message_id}")
    assert status == 200, found
    assert (found["body"], found["offset"], found["message_id"]) == ("plain kafka", 0, received.message_id)
    status, refused = find(broker, topic, key="k1")
    assert status == 400 and "message.index.enable" in refused["error"]["message"], refused


def test_a_tag_filter_over_the_message_index_delivers_exactly_the_matching_messages(broker):
    """1 message in 50 is tagged `hit`. Once the index has them (a key query finds the last
    one), a receive reads only the batches it names; messages sent after that are read from the
    log until the index catches up. Either way: every hit, once, nothing else."""
    topic, group = unique("rmq-tag-index"), unique("g")
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=2, config={"message.index.enable": "true"})
    first = [message(topic, f"a{i}".encode(), tag="hit" if i % 50 == 7 else "miss", keys=(f"a{i}",)) for i in range(500)]
    send_all(broker, topic, first)
    assert wait_found(broker, topic, 1, key="a499"), "the index caught up"
    consumer = simple_consumer(broker, group, topic, expression="hit")
    try:
        got = receive_all(consumer, 10, timeout=30)
        send_all(broker, topic, [message(topic, b"late-hit", tag="hit"), message(topic, b"late-miss", tag="miss")])
        got += receive_all(consumer, 1, timeout=30)
        for m in got:
            consumer.ack(m)
        assert sorted(m.body for m in got) == sorted([f"a{i}".encode() for i in range(500) if i % 50 == 7] + [b"late-hit"])
        assert all(m.tag == "hit" for m in got)
        assert consumer.receive(32, 10) == [], "nothing else"
    finally:
        consumer.shutdown()


# -- push consumers' invisible time is renewed while their client holds the message ------------


def raw_receive(stub, client, group, topic, invisible_s=None, auto_renew=False, polling_s=2):
    """One ReceiveMessage call as `client`; returns (messages, final status code)."""
    request = pb.ReceiveMessageRequest(
        group=pb.Resource(name=group),
        message_queue=d.MessageQueue(topic=pb.Resource(name=topic), id=0),
        filter_expression=d.FilterExpression(type=pb.FilterType.TAG, expression="*"),
        batch_size=1,
        auto_renew=auto_renew,
        long_polling_timeout=Duration(seconds=polling_s),
    )
    if invisible_s is not None:
        request.invisible_duration.CopyFrom(Duration(seconds=invisible_s))
    metadata = [(k, client if k == "x-mq-client-id" else v) for k, v in METADATA]
    responses = list(stub.ReceiveMessage(request, metadata=metadata, timeout=polling_s + 10))
    messages = [r.message for r in responses if r.WhichOneof("content") == "message"]
    codes = [r.status.code for r in responses if r.WhichOneof("content") == "status"]
    return messages, codes[-1] if codes else None


def test_a_push_consumers_message_stays_invisible_while_its_client_lives_and_returns_after_it_ends(broker, stub):
    topic, group = unique("rmq-renew"), unique("g")
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=1)
    send_all(broker, topic, [message(topic, b"held"), message(topic, b"acked-late")])

    # Handed out for a 2 s slice, renewed while "holder" lives: 5 s later nobody else gets it.
    (held,), _ = raw_receive(stub, "holder", group, topic, invisible_s=2, auto_renew=True)
    (late,), _ = raw_receive(stub, "holder", group, topic, invisible_s=2, auto_renew=True)
    assert (held.body, late.body) == (b"held", b"acked-late")
    time.sleep(5)
    messages, code = raw_receive(stub, "other", group, topic, invisible_s=30, polling_s=1)
    assert (messages, code) == ([], pb.Code.MESSAGE_NOT_FOUND)

    # Its handle stays valid across renewals.
    acked = stub.AckMessage(
        pb.AckMessageRequest(
            group=pb.Resource(name=group),
            topic=pb.Resource(name=topic),
            entries=[pb.AckMessageEntry(message_id=late.system_properties.message_id,
                                        receipt_handle=late.system_properties.receipt_handle)],
        ),
        metadata=METADATA, timeout=10,
    )
    assert acked.entries[0].status.code == pb.Code.OK, acked

    # The client ends: renewal stops, and the message comes back one attempt higher.
    ended = stub.NotifyClientTermination(
        pb.NotifyClientTerminationRequest(group=pb.Resource(name=group)),
        metadata=[(k, "holder" if k == "x-mq-client-id" else v) for k, v in METADATA], timeout=10,
    )
    assert ended.status.code == pb.Code.OK
    (back,), _ = raw_receive(stub, "other", group, topic, invisible_s=30, polling_s=10)
    assert (back.body, back.system_properties.delivery_attempt) == (b"held", 2)


def test_a_rocketmq_groups_progress_shows_as_kafka_committed_offsets_and_lag(broker):
    topic, group = unique("rmq-progress"), unique("g")
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=1)
    send_all(broker, topic, [message(topic, f"p{i}".encode()) for i in range(10)])
    consumer = simple_consumer(broker, group, topic)
    try:
        got = sorted(receive_all(consumer, 10), key=lambda m: m.body)
        assert [m.body for m in got] == [f"p{i}".encode() for i in range(10)]
        for m in got[:6]:
            consumer.ack(m)
        deadline, described = time.monotonic() + 20, None
        while time.monotonic() < deadline:
            status, described = http("GET", f"{broker.admin_url()}/v1/groups/{group}")
            if status == 200 and described["offsets"] and described["offsets"][0]["committed_offset"] == 6:
                break
            time.sleep(0.5)
        [offset] = described["offsets"]
        assert (offset["committed_offset"], offset["lag"], offset["metadata"]) == (6, 4, "rocketmq"), described
    finally:
        consumer.shutdown()


def test_a_message_of_another_type_than_its_topic_is_refused_and_long_polls_end_before_the_deadline(broker, stub):
    normal, fifo = unique("rmq-normal"), unique("rmq-fifo")
    c_create_topic(c_admin(broker.bootstrap), normal, partitions=1)
    c_create_topic(c_admin(broker.bootstrap), fifo, partitions=1, config={"message.type": "FIFO"})

    def send(topic, group=None):
        system = d.SystemProperties(message_id="01" + uuid.uuid4().hex.upper(), body_encoding=d.Encoding.IDENTITY)
        if group:
            system.message_group = group
        request = pb.SendMessageRequest(messages=[d.Message(topic=pb.Resource(name=topic), system_properties=system, body=b"x")])
        return stub.SendMessage(request, metadata=METADATA, timeout=10).entries[0].status

    conflict = pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    assert send(normal, group="g1").code == conflict
    refused = send(fifo)
    assert refused.code == conflict and "FIFO topic" in refused.message, refused
    assert send(fifo, group="g1").code == pb.Code.OK
    assert send(normal).code == pb.Code.OK

    # A client whose deadline is the long-polling time gets MESSAGE_NOT_FOUND, not a timeout.
    request = pb.ReceiveMessageRequest(
        group=pb.Resource(name=unique("g")),
        message_queue=d.MessageQueue(topic=pb.Resource(name=unique("rmq-empty")), id=0),
        batch_size=1,
        invisible_duration=Duration(seconds=10),
        long_polling_timeout=Duration(seconds=2),
    )
    started = time.monotonic()
    responses = list(stub.ReceiveMessage(request, metadata=METADATA, timeout=2))
    assert [r.status.code for r in responses] == [pb.Code.MESSAGE_NOT_FOUND]
    assert 1.0 < time.monotonic() - started < 2.0


def test_a_reset_moves_a_live_rocketmq_groups_position_and_its_consumer_is_a_member(broker):
    """`weir group reset-offsets` of a RocketMQ group whose SimpleConsumer keeps running moves
    where it receives from, as RocketMQ's resetOffsetByTime does: to the earliest offset (every
    acked message comes again, as a first delivery), to an offset, to a time, and to the latest
    (nothing old comes, only what is sent after). Meanwhile the live consumer is the group's
    member in `weir group describe` (state Stable, its host and topic), and the group shows as
    Stable in `weir group list`."""
    topic, group = unique("rmq-reset"), unique("g")
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=1)
    first = send_all(broker, topic, [message(topic, f"r{i}".encode()) for i in range(5)])
    time.sleep(0.05)  # the records of the second batch are stored strictly later
    middle_ms = int(time.time() * 1000)
    time.sleep(0.05)
    second = send_all(broker, topic, [message(topic, f"r{i}".encode()) for i in range(5, 10)])
    assert [r.offset for r in first + second] == list(range(10))
    everything = [f"r{i}".encode() for i in range(10)]
    env = {**os.environ, "WEIR_ADMIN": broker.admin_url()}
    cli = str(weir_bin())

    def weir(*args):
        done = subprocess.run([cli, *args], capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, f"weir {' '.join(args)}: {done.stderr}"
        return done.stdout

    def receive_and_ack(consumer, want):
        got = receive_all(consumer, want, timeout=20)
        for m in got:
            consumer.ack(m)
        return sorted(got, key=lambda m: m.body)

    consumer = simple_consumer(broker, group, topic)
    try:
        got = receive_and_ack(consumer, 10)
        assert [m.body for m in got] == everything

        described = json.loads(weir("group", "describe", group, "--json"))
        assert described["state"] == "Stable" and described["protocol_type"] == "rocketmq", described
        [member] = described["members"]
        assert member["client_host"].startswith("127.0.0.1:"), member
        assert member["assignment"] == [{"topic": topic, "partitions": [0]}], member
        table = weir("group", "describe", group)
        assert "State: Stable" in table and "Members: 1" in table, table
        assert member["client_id"] in table, table
        listed = json.loads(weir("group", "list", "--json"))
        assert {"group_id": group, "state": "Stable", "protocol_type": "rocketmq"} in listed["groups"], listed

        weir("group", "reset-offsets", group, "--topic", topic, "--to-earliest")
        again = receive_and_ack(consumer, 10)
        assert [m.body for m in again] == everything
        assert {m.delivery_attempt for m in again} == {1}, "first deliveries again"

        weir("group", "reset-offsets", group, "--topic", topic, "--to-offset", "7")
        assert [m.body for m in receive_and_ack(consumer, 3)] == everything[7:]

        weir("group", "reset-offsets", group, "--topic", topic, "--to-timestamp", str(middle_ms))
        assert [m.body for m in receive_and_ack(consumer, 5)] == everything[5:]

        # Unreceived messages, then a reset to the latest: only what is sent after comes.
        send_all(broker, topic, [message(topic, f"skipped{i}".encode()) for i in range(3)])
        weir("group", "reset-offsets", group, "--topic", topic, "--to-latest")
        send_all(broker, topic, [message(topic, b"after")])
        assert [m.body for m in receive_and_ack(consumer, 1)] == [b"after"]

        def committed():
            status, body = http("GET", f"{broker.admin_url()}/v1/groups/{group}")
            return status == 200 and [o["committed_offset"] for o in body["offsets"]] == [14]

        deadline = time.monotonic() + 20
        while not committed():
            assert time.monotonic() < deadline, "the group's progress was not committed as offset 14"
            time.sleep(0.5)
    finally:
        consumer.shutdown()
