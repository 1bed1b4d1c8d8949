"""Client quotas (KIP-546's AlterClientQuotas and DescribeClientQuotas, KIP-219's throttling)
with real clients: kafka-python's protocol layer sets, describes and removes quotas on users,
client ids and addresses; librdkafka producers and consumers over producer_byte_rate and
consumer_byte_rate are told to wait (its throttle callback fires) and are held to the rate;
request_percentage throttles a client that keeps the broker busy; a RocketMQ client over its
rate gets TOO_MANY_REQUESTS; connections over connection_creation_rate are closed. Quotas are
kept in the metadata log: they survive a restart.

The broker measures rates over 2 samples of 1 s (`quota.window.num=2`), so a new client's
free burst is one second of its quota and the waits show within seconds. The assertions on
time are lower bounds only (a slow machine makes clients slower, never faster).
"""

import socket
import struct
import subprocess
import time

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kafka import KafkaAdminClient
from kafka.protocol.admin import DescribeClientQuotasRequest
from kafka.protocol.api import Request, Response
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.types import Array, Boolean, Float64, Int16, Int32, Schema, String

from conftest import _ALL_BROKERS, Broker, weir_bin
from helpers import TIMEOUT_S, http, labelled_metric, unique, wait_until

KIB = 1024
UTF8 = String("utf-8")


class AlterClientQuotasResponse_v0(Response):
    API_KEY = 49
    API_VERSION = 0
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("entries", Array(
            ("error_code", Int16),
            ("error_message", UTF8),
            ("entity", Array(("entity_type", UTF8), ("entity_name", UTF8))))),
    )


class AlterClientQuotasRequest_v0(Request):
    """kafka-python has no AlterClientQuotas (its admin CLI lists it as not supported yet):
    the v0 schema, as Kafka's AlterClientQuotasRequest.json defines it."""
    API_KEY = 49
    API_VERSION = 0
    RESPONSE_TYPE = AlterClientQuotasResponse_v0
    SCHEMA = Schema(
        ("entries", Array(
            ("entity", Array(("entity_type", UTF8), ("entity_name", UTF8))),
            ("ops", Array(("key", UTF8), ("value", Float64), ("remove", Boolean))))),
        ("validate_only", Boolean),
    )


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = Broker(tmp_path_factory.mktemp("quotas") / "quotas", settings={"quota.window.num": "2"}, name="quotas")
    _ALL_BROKERS.append(b)
    b.start()
    yield b
    b.cleanup()
    _ALL_BROKERS.remove(b)


def send(admin, request):
    future = admin._send_request_to_node(admin._client.least_loaded_node(), request)
    admin._wait_for_futures([future])
    return future.value


def alter(admin, entries, validate_only=False):
    """entries: [(entity [(type, name or None)], ops [(key, value or None to remove)])] ->
    [(error_code, error_message)]."""
    request = AlterClientQuotasRequest_v0(
        entries=[
            (list(entity), [(key, 0.0 if value is None else float(value), value is None) for key, value in ops])
            for entity, ops in entries
        ],
        validate_only=validate_only,
    )
    response = send(admin, request)
    return [(code, message) for code, message, _ in response.entries]


def describe(admin, components, strict=False):
    """components: [(type, match_type, match)] -> ({frozenset(entity): {key: value}}, error)."""
    response = send(admin, DescribeClientQuotasRequest[0](components=components, strict=strict))
    if response.error_code:
        return None, (response.error_code, response.error_message)
    found = {frozenset(entity): dict(values) for entity, values in response.entries or []}
    return found, None


def set_quotas(admin, entries):
    results = alter(admin, entries)
    assert all(code == 0 for code, _ in results), results


def quota_metric(broker, name, quota):
    return labelled_metric(broker, name, "quota", quota)


def make_topic(bootstrap, topic, partitions=1):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(timeout=TIMEOUT_S)


EXACT, DEFAULT, SPECIFIED = 0, 1, 2
INVALID_REQUEST, UNSUPPORTED_VERSION = 42, 35


def test_quotas_are_set_described_filtered_and_removed(broker):
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id="quota-admin")
    try:
        alice, app = unique("alice"), unique("app")
        set_quotas(admin, [
            ([("user", alice)], [("producer_byte_rate", 1048576), ("request_percentage", 12.5)]),
            ([("user", alice), ("client-id", app)], [("consumer_byte_rate", 2048)]),
            ([("user", None)], [("consumer_byte_rate", 4096)]),
            ([("client-id", app)], [("producer_byte_rate", 8192)]),
            ([("ip", "10.1.2.3")], [("connection_creation_rate", 5)]),
        ])
        user_alice = frozenset({("user", alice)})
        alice_app = frozenset({("user", alice), ("client-id", app)})

        found, _ = describe(admin, [("user", EXACT, alice)])
        assert found == {
            user_alice: {"producer_byte_rate": 1048576.0, "request_percentage": 12.5},
            alice_app: {"consumer_byte_rate": 2048.0},
        }
        found, _ = describe(admin, [("user", EXACT, alice)], strict=True)
        assert list(found) == [user_alice]
        found, _ = describe(admin, [("user", DEFAULT, None)])
        assert found == {frozenset({("user", None)}): {"consumer_byte_rate": 4096.0}}
        found, _ = describe(admin, [("client-id", SPECIFIED, None)])
        assert set(found) == {alice_app, frozenset({("client-id", app)})}
        found, _ = describe(admin, [("ip", SPECIFIED, None)])
        assert found == {frozenset({("ip", "10.1.2.3")}): {"connection_creation_rate": 5.0}}

        # Refusals, each entry on its own, with Kafka's codes and messages.
        results = alter(admin, [
            ([("user", alice)], [("producer_byte_rate", 1.5)]),
            ([("user", alice)], [("bogus_rate", 1)]),
            ([("user", alice), ("ip", "10.0.0.1")], [("producer_byte_rate", 1)]),
            ([("user", alice)], [("consumer_byte_rate", -1)]),
            ([], [("consumer_byte_rate", 1)]),
            ([("user", alice)], [("consumer_byte_rate", 999)]),
        ])
        assert [code for code, _ in results] == [INVALID_REQUEST] * 5 + [0], results
        assert "cannot be a fractional value" in results[0][1]
        assert "Invalid configuration key bogus_rate" in results[1][1]
        assert "should not be combined" in results[2][1]
        assert "must be greater than 0" in results[3][1]
        _, error = describe(admin, [("group", EXACT, "g")])
        assert error[0] == UNSUPPORTED_VERSION, error
        _, error = describe(admin, [("user", EXACT, None)])
        assert error[0] == INVALID_REQUEST and "MATCH_TYPE_EXACT" in error[1], error

        # validate_only checks and stores nothing.
        results = alter(admin, [([("user", alice)], [("producer_byte_rate", 1)])], validate_only=True)
        assert results == [(0, None)]
        found, _ = describe(admin, [("user", EXACT, alice)], strict=True)
        assert found[user_alice]["producer_byte_rate"] == 1048576.0
    finally:
        admin.close()

    # Kept in the metadata log.
    broker.restart()
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id="quota-admin")
    try:
        found, _ = describe(admin, [("user", EXACT, alice)])
        assert found[user_alice]["consumer_byte_rate"] == 999.0
        assert found[alice_app] == {"consumer_byte_rate": 2048.0}
        set_quotas(admin, [
            ([("user", alice)], [("producer_byte_rate", None), ("request_percentage", None), ("consumer_byte_rate", None)]),
            ([("user", alice), ("client-id", app)], [("consumer_byte_rate", None)]),
            ([("user", None)], [("consumer_byte_rate", None)]),
            ([("client-id", app)], [("producer_byte_rate", None)]),
            ([("ip", "10.1.2.3")], [("connection_creation_rate", None)]),
        ])
        found, _ = describe(admin, [])
        assert found == {}, found
    finally:
        admin.close()


def throttled_producer(bootstrap, client_id, events):
    return Producer({
        "bootstrap.servers": bootstrap,
        "client.id": client_id,
        "linger.ms": 5,
        "batch.size": 64 * KIB,
        "throttle_cb": lambda event: events.append(event.throttle_time),
    })


def produce_all(producer, topic, count, size):
    value = b"q" * size
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value=value, key=str(i).encode())
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(120) == 0, "every record delivered"


def test_a_producer_over_its_byte_rate_is_told_to_wait_and_held_to_the_rate(broker):
    topic = unique("quota-produce")
    make_topic(broker.bootstrap, topic)
    slow, fast = unique("slow-producer"), unique("fast-producer")
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id="quota-admin")
    rate = 256 * KIB
    try:
        set_quotas(admin, [([("client-id", slow)], [("producer_byte_rate", rate)])])
        before = quota_metric(broker, "weir_client_quota_throttles_total", "produce")
        total = 1536 * KIB
        events = []
        started = time.monotonic()
        produce_all(throttled_producer(broker.bootstrap, slow, events), topic, 96, 16 * KIB)
        took = time.monotonic() - started
        assert events and max(events) > 0, "librdkafka heard throttle_time_ms"
        # One second of the quota goes at once; the rest at the quota at best.
        least = (total - rate) / rate
        assert took >= 0.7 * least, f"{total} bytes at {rate}/s took {took:.1f} s (at least {least:.1f} s)"
        assert quota_metric(broker, "weir_client_quota_throttles_total", "produce") > before

        # A client without a quota is not held back.
        unthrottled = []
        produce_all(throttled_producer(broker.bootstrap, fast, unthrottled), topic, 96, 16 * KIB)
        assert unthrottled == [] or max(unthrottled) == 0, unthrottled
    finally:
        set_quotas(admin, [([("client-id", slow)], [("producer_byte_rate", None)])])
        admin.close()


def test_a_consumer_over_its_byte_rate_is_told_to_wait_and_held_to_the_rate(broker):
    topic = unique("quota-fetch")
    make_topic(broker.bootstrap, topic)
    # Batches well under a window of the quota (a fetch returns at least one whole batch).
    writer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "batch.size": 32 * KIB})
    produce_all(writer, topic, 96, 16 * KIB)
    slow = unique("slow-consumer")
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id="quota-admin")
    rate = 256 * KIB
    try:
        set_quotas(admin, [([("client-id", slow)], [("consumer_byte_rate", rate)])])
        events = []
        consumer = Consumer({
            "bootstrap.servers": broker.bootstrap,
            "group.id": unique("quota-group"),
            "client.id": slow,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "throttle_cb": lambda event: events.append(event.throttle_time),
        })
        try:
            consumer.subscribe([topic])
            got = 0
            started = time.monotonic()
            deadline = started + 120
            while got < 96 and time.monotonic() < deadline:
                for m in consumer.consume(100, 1.0):
                    assert m.error() is None, m.error()
                    got += 1
            took = time.monotonic() - started
        finally:
            consumer.close()
        assert got == 96, f"read {got} of 96 records"
        assert events and max(events) > 0, "librdkafka heard throttle_time_ms"
        total = 96 * 16 * KIB
        least = (total - rate) / rate
        assert took >= 0.7 * least, f"{total} bytes at {rate}/s took {took:.1f} s (at least {least:.1f} s)"
    finally:
        set_quotas(admin, [([("client-id", slow)], [("consumer_byte_rate", None)])])
        admin.close()


def test_a_client_keeping_the_broker_busy_is_throttled_by_request_percentage(broker):
    busy = unique("busy")
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id="quota-admin")
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id=busy)
    try:
        # A hundredth of a percent of one thread: a tenth of a millisecond per second.
        set_quotas(admin, [([("client-id", busy)], [("request_percentage", 0.01)])])
        throttles = []
        for _ in range(20):
            response = send(client, MetadataRequest[7](topics=None, allow_auto_topic_creation=False))
            throttles.append(response.throttle_time_ms)
            if response.throttle_time_ms > 0:
                break
        assert max(throttles) > 0, throttles
        # Kafka bounds a request-time throttle by one sample (1 s here).
        assert max(throttles) <= 1000, throttles
    finally:
        set_quotas(admin, [([("client-id", busy)], [("request_percentage", None)])])
        client.close()
        admin.close()


RMQ_CLIENT = "weir-quota-rmq"


def test_a_rocketmq_client_over_its_rate_gets_too_many_requests(broker):
    import grpc
    from rocketmq import grpc_protocol as pb
    from rocketmq.grpc_protocol import definition_pb2 as d

    topic = unique("quota-rmq")
    make_topic(broker.bootstrap, topic)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id="quota-admin")
    metadata = [("x-mq-client-id", RMQ_CLIENT), ("x-mq-language", "PYTHON"), ("x-mq-protocol", "v2")]
    try:
        # RocketMQ clients are the user ANONYMOUS, under their client id.
        set_quotas(admin, [([("user", "ANONYMOUS"), ("client-id", RMQ_CLIENT)], [("producer_byte_rate", 1024)])])
        with grpc.insecure_channel(broker.rocketmq_endpoint) as channel:
            stub = pb.MessagingServiceStub(channel)

            def send_one():
                message = d.Message(topic=pb.Resource(name=topic), body=b"r" * 4096,
                                    system_properties=d.SystemProperties(message_id=unique("id")))
                return stub.SendMessage(pb.SendMessageRequest(messages=[message]), metadata=metadata, timeout=10)

            first = send_one()
            assert first.status.code == pb.Code.OK, first
            second = send_one()
            assert second.status.code == pb.Code.TOO_MANY_REQUESTS, second
            assert "producer_byte_rate" in second.status.message
            # The wait ends: 4 KiB at 1 KiB/s over a 2 s window is about 2 s.
            wait_until(lambda: send_one().status.code == pb.Code.OK, timeout=30, interval=0.5,
                       what="a send accepted once the throttle is over")
    finally:
        set_quotas(admin, [([("user", "ANONYMOUS"), ("client-id", RMQ_CLIENT)], [("producer_byte_rate", None)])])
        admin.close()


def test_a_busy_rocketmq_client_is_held_by_request_percentage(broker):
    """request_percentage on a RocketMQ client: the time its sends keep the broker busy counts,
    and once over, SendMessage and ReceiveMessage answer TOO_MANY_REQUESTS naming the quota."""
    import grpc
    from rocketmq import grpc_protocol as pb
    from rocketmq.grpc_protocol import definition_pb2 as d

    topic = unique("quota-rmq-busy")
    make_topic(broker.bootstrap, topic)
    busy = RMQ_CLIENT + "-busy"
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id="quota-admin")
    metadata = [("x-mq-client-id", busy), ("x-mq-language", "PYTHON"), ("x-mq-protocol", "v2")]
    entity = [("user", "ANONYMOUS"), ("client-id", busy)]
    try:
        # A hundredth of a percent of one thread: a tenth of a millisecond per second.
        set_quotas(admin, [(entity, [("request_percentage", 0.01)])])
        with grpc.insecure_channel(broker.rocketmq_endpoint) as channel:
            stub = pb.MessagingServiceStub(channel)

            def send_one():
                message = d.Message(topic=pb.Resource(name=topic), body=b"busy",
                                    system_properties=d.SystemProperties(message_id=unique("id")))
                return stub.SendMessage(pb.SendMessageRequest(messages=[message]), metadata=metadata, timeout=10)

            codes = []
            for _ in range(200):
                answer = send_one()
                codes.append(answer.status.code)
                if answer.status.code != pb.Code.OK:
                    break
            assert codes[0] == pb.Code.OK and codes[-1] == pb.Code.TOO_MANY_REQUESTS, codes
            assert "request_percentage" in answer.status.message, answer
            queue = d.MessageQueue(topic=pb.Resource(name=topic), id=0)
            receive = pb.ReceiveMessageRequest(
                group=pb.Resource(name=unique("g")), message_queue=queue, batch_size=1,
                filter_expression=d.FilterExpression(type=d.FilterType.TAG, expression="*"))
            first = next(iter(stub.ReceiveMessage(receive, metadata=metadata, timeout=10)))
            assert first.status.code == pb.Code.TOO_MANY_REQUESTS, first
    finally:
        set_quotas(admin, [(entity, [("request_percentage", None)])])
        admin.close()


def api_versions_answered(port):
    """Opens a connection and asks ApiVersions v0: True when answered, False when the broker
    closed the connection instead."""
    request = struct.pack(">hhih", 18, 0, 1, 4) + b"test"
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(struct.pack(">i", len(request)) + request)
            header = s.recv(4)
            return len(header) == 4
    except (ConnectionResetError, BrokenPipeError):
        return False


def test_connections_over_connection_creation_rate_are_closed(broker):
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id="quota-admin")
    try:
        set_quotas(admin, [([("ip", "127.0.0.1")], [("connection_creation_rate", 2)])])
        answered = [api_versions_answered(broker.port) for _ in range(8)]
        assert answered[0], "the first connection is served"
        assert not all(answered), f"every one of 8 connections at once was served: {answered}"
    finally:
        # (This admin connection is open already: removing the quota needs no new one.)
        set_quotas(admin, [([("ip", "127.0.0.1")], [("connection_creation_rate", None)])])
        admin.close()
    wait_until(lambda: all(api_versions_answered(broker.port) for _ in range(3)), timeout=30, interval=0.5,
               what="connections served again once the quota is gone")


def weir(broker, *args):
    return subprocess.run([str(weir_bin()), *args, "--admin", broker.admin_url()],
                          capture_output=True, text=True, timeout=60)


def test_the_weir_quota_command_and_the_admin_api_manage_the_same_quotas(broker):
    client = unique("cli-client")
    done = weir(broker, "quota", "set", "--user", "<default>", "--client-id", client,
                "producer_byte_rate=2048", "request_percentage=25.5")
    assert done.returncode == 0, done.stderr
    assert "<default>" in done.stdout and "producer_byte_rate" in done.stdout, done.stdout

    # The Kafka API sees what the command set.
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id="quota-admin")
    try:
        found, _ = describe(admin, [("client-id", EXACT, client)])
        assert found == {frozenset({("user", None), ("client-id", client)}):
                         {"producer_byte_rate": 2048.0, "request_percentage": 25.5}}
    finally:
        admin.close()

    status, body = http("GET", f"{broker.admin_url()}/v1/quotas?client_id={client}")
    assert status == 200, body
    assert body == [{"entity": {"user": "<default>", "client_id": client},
                     "quotas": {"producer_byte_rate": 2048.0, "request_percentage": 25.5}}]

    # Refusals carry Kafka's messages; a bad argument never reaches the broker.
    status, body = http("POST", f"{broker.admin_url()}/v1/quotas",
                        {"entity": {"client_id": client}, "set": {"producer_byte_rate": 0.5}})
    assert status == 400 and "fractional" in body["error"]["message"], body
    done = weir(broker, "quota", "set", "--client-id", client, "producer_byte_rate")
    assert done.returncode != 0 and "KEY=VALUE" in done.stderr, done.stderr
    done = weir(broker, "quota", "set", "--client-id", client, "made_up_rate=5")
    assert done.returncode != 0 and "Invalid configuration key made_up_rate" in done.stderr, done.stderr

    done = weir(broker, "quota", "delete", "--user", "<default>", "--client-id", client, "request_percentage")
    assert done.returncode == 0, done.stderr
    listed = weir(broker, "quota", "list", "--client-id", client, "--json")
    assert listed.returncode == 0, listed.stderr
    assert '"request_percentage"' not in listed.stdout and '"producer_byte_rate"' in listed.stdout, listed.stdout
    done = weir(broker, "quota", "delete", "--user", "<default>", "--client-id", client)
    assert done.returncode == 0, done.stderr
    status, body = http("GET", f"{broker.admin_url()}/v1/quotas?client_id={client}")
    assert status == 200 and body == [], body


def test_a_quota_holds_clients_of_a_cluster_but_not_its_replication(cluster_factory):
    """Three nodes, one listener each for clients and brokers alike: a quota set through one
    node throttles a producer on another (its clients are charged there too), while the
    followers' fetches on that listener are exempt and keep the ISR whole."""
    cluster = cluster_factory(voters=3, settings={"quota.window.num": "2", "min.insync.replicas": "2"})
    first = cluster.node(1)
    admin = KafkaAdminClient(bootstrap_servers=first.bootstrap, client_id="quota-admin")
    topic, slow = unique("quota-cluster"), unique("slow-cluster")
    try:
        creator = AdminClient({"bootstrap.servers": first.bootstrap})
        creator.create_topics([NewTopic(topic, 1, 3)])[topic].result(timeout=30)
        # Quotas are the metadata's: set through node 1, in force on every node. A follower's
        # fetches would be over this rate many times; they are not the client's.
        set_quotas(admin, [([("client-id", slow)], [("producer_byte_rate", 64 * KIB)]),
                           ([("client-id", None)], [("consumer_byte_rate", 1024)])])
        events = []
        everywhere = ",".join(node.bootstrap for node in cluster.nodes.values())
        producer = Producer({"bootstrap.servers": everywhere, "client.id": slow, "acks": "all",
                             "linger.ms": 5, "batch.size": 16 * KIB, "message.timeout.ms": 60000,
                             "throttle_cb": lambda event: events.append(event.throttle_time)})
        produce_all(producer, topic, 24, 8 * KIB)
        assert events and max(events) > 0, "the leader throttled the producer"
        isr = creator.list_topics(topic=topic, timeout=10).topics[topic].partitions[0].isrs
        assert len(isr) == 3, f"the followers keep up, unthrottled: ISR {isr}"
    finally:
        set_quotas(admin, [([("client-id", slow)], [("producer_byte_rate", None)]),
                           ([("client-id", None)], [("consumer_byte_rate", None)])])
        admin.close()
