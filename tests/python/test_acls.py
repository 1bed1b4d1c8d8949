"""ACLs (Kafka's model) with real clients: confluent-kafka's AdminClient creates, describes and
deletes them (CreateAcls, DescribeAcls, DeleteAcls), kafka-python reads them back, and the
authorizer (`authorizer.class.name`, `super.users`, `allow.everyone.if.no.acl.found`) decides
what SASL users may do: produce, consume in a group, see topics, create and delete them, read
configs, run transactions. ACLs are kept in the metadata log: they survive a restart.
"""

import base64
import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from kafka import KafkaAdminClient
from kafka.admin import ACL as KpAcl
from kafka.admin import ACLFilter as KpAclFilter
from kafka.admin import ACLOperation as KpOperation
from kafka.admin import ACLPermissionType as KpPermission
from kafka.admin import ACLResourcePatternType as KpPatternType
from kafka.admin import ResourcePattern as KpPattern
from kafka.admin import ResourcePatternFilter as KpPatternFilter
from kafka.admin import ResourceType as KpResourceType
from kafka.errors import ClusterAuthorizationFailedError

from conftest import _ALL_BROKERS, Broker, weir_bin
from helpers import TIMEOUT_S, unique, wait_until

PASSWORD = "acl-test-password"
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


def weir(broker, *args, check=True):
    out = subprocess.run(
        [str(weir_bin()), *args, "--admin", broker.admin_url()], capture_output=True, text=True, timeout=60
    )
    if check:
        assert out.returncode == 0, out.stderr
    return out


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """A SASL_PLAINTEXT broker with the authorizer on: `admin` is a super user, `alice` and
    `bob` are ordinary users, and nothing is open without an ACL."""
    broker = Broker(
        tmp_path_factory.mktemp("acls") / "acl",
        settings={
            "authorizer.class.name": AUTHORIZER,
            "super.users": "User:admin",
            "allow.everyone.if.no.acl.found": "false",
        },
        name="acl",
    )
    broker.settings["listeners"] = f"SASL_PLAINTEXT://127.0.0.1:{broker.port}"
    _ALL_BROKERS.append(broker)
    broker.start()
    for user in ("admin", "alice", "bob"):
        weir(broker, "user", "create", user, "--password", PASSWORD)
    yield broker
    broker.cleanup()
    _ALL_BROKERS.remove(broker)


def conf(broker, user, **extra):
    base = {
        "bootstrap.servers": broker.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "SCRAM-SHA-256",
        "sasl.username": user,
        "sasl.password": PASSWORD,
        "socket.connection.setup.timeout.ms": 10000,
    }
    base.update(extra)
    return base


def admin_of(broker, user):
    return AdminClient(conf(broker, user))


def kp_admin_of(broker, user):
    return KafkaAdminClient(
        bootstrap_servers=broker.bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_plain_username=user,
        sasl_plain_password=PASSWORD,
    )


def create_acls(admin, bindings):
    for future in admin.create_acls(bindings, request_timeout=TIMEOUT_S).values():
        future.result(timeout=TIMEOUT_S)


def allow(principal, restype, name, operation, pattern=ResourcePatternType.LITERAL):
    return AclBinding(restype, name, pattern, principal, "*", operation, AclPermissionType.ALLOW)


def make_topic(admin, name, partitions=1):
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(timeout=TIMEOUT_S)
    assert wait_until(lambda: name in admin.list_topics(timeout=TIMEOUT_S).topics, TIMEOUT_S)


def delivery_errors(broker, user, topic, count=3, **extra):
    producer = Producer(conf(broker, user, **{"message.timeout.ms": 10000, **extra}))
    errors = []
    for i in range(count):
        producer.produce(topic, value=f"v{i}".encode(), on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(TIMEOUT_S)
    assert len(errors) == count
    return errors


def test_acls_are_created_described_and_deleted_with_the_admin_client(secured):
    admin = admin_of(secured, "admin")
    base = unique("acl-topic")
    bindings = [
        allow("User:test1", ResourceType.TOPIC, f"{base}_1", AclOperation.READ, ResourcePatternType.PREFIXED),
        allow("User:test2", ResourceType.TOPIC, f"{base}_1", AclOperation.WRITE),
        allow("User:test2", ResourceType.TOPIC, f"{base}_2", AclOperation.WRITE),
        allow("User:test2", ResourceType.GROUP, f"{base}-group", AclOperation.READ),
    ]
    create_acls(admin, bindings)
    create_acls(admin, bindings[:1])  # the same binding again changes nothing

    match = AclBindingFilter(ResourceType.TOPIC, f"{base}_1", ResourcePatternType.MATCH, None, None,
                             AclOperation.ANY, AclPermissionType.ANY)
    found = admin.describe_acls(match, request_timeout=TIMEOUT_S).result(timeout=TIMEOUT_S)
    assert sorted((b.principal, b.resource_pattern_type, b.operation) for b in found) == [
        ("User:test1", ResourcePatternType.PREFIXED, AclOperation.READ),
        ("User:test2", ResourcePatternType.LITERAL, AclOperation.WRITE),
    ]
    write_only = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, "User:test2", None,
                                  AclOperation.WRITE, AclPermissionType.ANY)
    found = admin.describe_acls(write_only, request_timeout=TIMEOUT_S).result(timeout=TIMEOUT_S)
    assert sorted(b.name for b in found) == [f"{base}_1", f"{base}_2"]

    literal_1 = AclBindingFilter(ResourceType.TOPIC, f"{base}_1", ResourcePatternType.ANY, None, None,
                                 AclOperation.ANY, AclPermissionType.ANY)
    deleted = admin.delete_acls([literal_1], request_timeout=TIMEOUT_S)[literal_1].result(timeout=TIMEOUT_S)
    assert sorted(b.principal for b in deleted) == ["User:test1", "User:test2"]
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                  AclOperation.ANY, AclPermissionType.ANY)
    left = admin.describe_acls(everything, request_timeout=TIMEOUT_S).result(timeout=TIMEOUT_S)
    assert {(b.restype, b.name) for b in left} >= {(ResourceType.TOPIC, f"{base}_2"), (ResourceType.GROUP, f"{base}-group")}
    assert not any(b.name == f"{base}_1" for b in left)


def test_malformed_acls_are_refused_one_by_one(secured):
    admin = admin_of(secured, "admin")
    topic = unique("acl-bad")
    good = allow("User:carol", ResourceType.TOPIC, topic, AclOperation.READ)
    no_type = allow("carol", ResourceType.TOPIC, topic, AclOperation.READ)
    wrong_operation = allow("User:carol", ResourceType.GROUP, topic, AclOperation.WRITE)
    bad_host = AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:carol", "not a host",
                          AclOperation.READ, AclPermissionType.ALLOW)
    futures = admin.create_acls([good, no_type, wrong_operation, bad_host], request_timeout=TIMEOUT_S)
    futures[good].result(timeout=TIMEOUT_S)
    for binding in (no_type, wrong_operation, bad_host):
        with pytest.raises(KafkaException) as refused:
            futures[binding].result(timeout=TIMEOUT_S)
        assert refused.value.args[0].code() == KafkaError.INVALID_REQUEST, refused.value


def test_only_a_user_allowed_on_the_cluster_manages_acls(secured):
    alice = admin_of(secured, "alice")
    binding = allow("User:alice", ResourceType.TOPIC, "*", AclOperation.ALL)
    with pytest.raises(KafkaException) as refused:
        create_acls(alice, [binding])
    assert refused.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                  AclOperation.ANY, AclPermissionType.ANY)
    create_acls(admin_of(secured, "admin"), [allow("User:someone", ResourceType.TOPIC, "secret", AclOperation.READ)])
    # librdkafka drops DescribeAcls' top-level error and shows an empty list; kafka-python raises it.
    assert alice.describe_acls(everything, request_timeout=TIMEOUT_S).result(timeout=TIMEOUT_S) == []
    kp_admin = kp_admin_of(secured, "alice")
    try:
        with pytest.raises(ClusterAuthorizationFailedError):
            kp_admin.describe_acls(
                KpAclFilter(principal=None, host=None, operation=KpOperation.ANY, permission_type=KpPermission.ANY,
                            resource_pattern=KpPatternFilter(KpResourceType.ANY, None, KpPatternType.ANY))
            )
    finally:
        kp_admin.close()


def test_kafka_python_reads_and_writes_the_same_acls(secured):
    kp_admin = kp_admin_of(secured, "admin")
    name = unique("acl-kp")
    try:
        created = kp_admin.create_acls([
            KpAcl(principal="User:dave", host="*", operation=KpOperation.READ, permission_type=KpPermission.ALLOW,
                  resource_pattern=KpPattern(KpResourceType.TOPIC, name, KpPatternType.PREFIXED)),
        ])
        assert not created["failed"], created
        acls, error = kp_admin.describe_acls(
            KpAclFilter(principal="User:dave", host=None, operation=KpOperation.ANY, permission_type=KpPermission.ANY,
                        resource_pattern=KpPatternFilter(KpResourceType.TOPIC, f"{name}-x", KpPatternType.MATCH))
        )
        assert [(a.resource_pattern.resource_name, a.operation) for a in acls] == [(name, KpOperation.READ)], error
    finally:
        kp_admin.close()
    # confluent-kafka sees what kafka-python created.
    admin = admin_of(secured, "admin")
    found = admin.describe_acls(
        AclBindingFilter(ResourceType.TOPIC, name, ResourcePatternType.PREFIXED, None, None,
                         AclOperation.ANY, AclPermissionType.ANY), request_timeout=TIMEOUT_S).result(timeout=TIMEOUT_S)
    assert [(b.principal, b.operation) for b in found] == [("User:dave", AclOperation.READ)]


def test_produce_and_consume_need_write_read_and_the_group(secured):
    admin = admin_of(secured, "admin")
    topic, group = unique("acl-orders"), unique("acl-group")
    make_topic(admin, topic)

    # No ACL: alice cannot write, and does not even see the topic.
    assert all(e is not None and e.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
               for e in delivery_errors(secured, "alice", topic)), "produce without WRITE"
    seen = admin_of(secured, "alice").list_topics(timeout=TIMEOUT_S).topics
    assert topic not in seen, "a topic without DESCRIBE is left out of Metadata"

    create_acls(admin, [allow("User:alice", ResourceType.TOPIC, topic, AclOperation.WRITE)])
    assert delivery_errors(secured, "alice", topic) == [None, None, None]
    assert topic in admin_of(secured, "alice").list_topics(timeout=TIMEOUT_S).topics, "WRITE implies DESCRIBE"
    # bob has no ACL on it: still refused.
    assert all(e.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED for e in delivery_errors(secured, "bob", topic, 1))

    # Reading in a group needs READ on the topic and on the group.
    create_acls(admin, [allow("User:bob", ResourceType.TOPIC, topic, AclOperation.READ)])
    consumer = Consumer(conf(secured, "bob", **{"group.id": group, "auto.offset.reset": "earliest"}))
    try:
        consumer.subscribe([topic])
        refusal = None
        deadline = time.monotonic() + TIMEOUT_S
        while refusal is None and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error():
                refusal = msg.error()
        assert refusal is not None and refusal.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, refusal
    finally:
        consumer.close()

    create_acls(admin, [allow("User:bob", ResourceType.GROUP, group, AclOperation.READ)])
    consumer = Consumer(conf(secured, "bob", **{"group.id": group, "auto.offset.reset": "earliest"}))
    try:
        consumer.subscribe([topic])
        values = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(values) < 3 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                values.append(msg.value())
        assert values == [b"v0", b"v1", b"v2"]
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()


def test_deny_wins_and_prefixed_acls_cover_every_matching_name(secured):
    admin = admin_of(secured, "admin")
    prefix = unique("acl-team")
    kept, denied = f"{prefix}-kept", f"{prefix}-denied"
    make_topic(admin, kept)
    make_topic(admin, denied)
    create_acls(admin, [
        allow("User:alice", ResourceType.TOPIC, prefix, AclOperation.WRITE, ResourcePatternType.PREFIXED),
        AclBinding(ResourceType.TOPIC, denied, ResourcePatternType.LITERAL, "User:*", "*", AclOperation.WRITE,
                   AclPermissionType.DENY),
    ])
    assert delivery_errors(secured, "alice", kept, 1) == [None]
    assert delivery_errors(secured, "alice", denied, 1)[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # The super user is not subject to ACLs at all.
    assert delivery_errors(secured, "admin", denied, 1) == [None]
    with urllib.request.urlopen(f"{secured.admin_url()}/metrics", timeout=10) as response:
        text = response.read().decode()
    denials = re.search(r"^weir_authorization_denials_total (\d+)$", text, re.M)
    assert denials and int(denials.group(1)) > 0, "refusals are counted"


def test_topic_administration_needs_create_delete_and_config_acls(secured):
    admin = admin_of(secured, "admin")
    alice = admin_of(secured, "alice")
    mine, theirs = unique("acl-alice"), unique("acl-other")
    create_acls(admin, [allow("User:alice", ResourceType.TOPIC, "acl-alice", AclOperation.CREATE,
                              ResourcePatternType.PREFIXED)])
    futures = alice.create_topics([NewTopic(mine, 1, 1), NewTopic(theirs, 1, 1)])
    futures[mine].result(timeout=TIMEOUT_S)
    with pytest.raises(KafkaException) as refused:
        futures[theirs].result(timeout=TIMEOUT_S)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    resource = ConfigResource(ConfigResource.Type.TOPIC, mine)
    with pytest.raises(KafkaException) as refused:
        alice.describe_configs([resource])[resource].result(timeout=TIMEOUT_S)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    with pytest.raises(KafkaException) as refused:
        alice.delete_topics([mine])[mine].result(timeout=TIMEOUT_S)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    create_acls(admin, [
        allow("User:alice", ResourceType.TOPIC, mine, AclOperation.ALTER_CONFIGS),
        allow("User:alice", ResourceType.TOPIC, mine, AclOperation.DELETE),
    ])
    configs = alice.describe_configs([resource])[resource].result(timeout=TIMEOUT_S)
    assert "retention.ms" in configs, "ALTER_CONFIGS implies DESCRIBE_CONFIGS"
    alice.delete_topics([mine])[mine].result(timeout=TIMEOUT_S)


def test_transactions_need_write_on_the_transactional_id(secured):
    admin = admin_of(secured, "admin")
    topic, txn = unique("acl-txn"), unique("acl-txn-id")
    make_topic(admin, topic)
    create_acls(admin, [allow("User:alice", ResourceType.TOPIC, topic, AclOperation.WRITE)])
    producer = Producer(conf(secured, "alice", **{"transactional.id": txn}))
    with pytest.raises(KafkaException) as refused:
        producer.init_transactions(TIMEOUT_S)
    assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, refused.value

    create_acls(admin, [allow("User:alice", ResourceType.TRANSACTIONAL_ID, txn, AclOperation.WRITE)])
    producer = Producer(conf(secured, "alice", **{"transactional.id": txn}))
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    producer.produce(topic, value=b"in a transaction")
    producer.commit_transaction(TIMEOUT_S)
    consumer = Consumer(conf(secured, "admin", **{"group.id": unique("g"), "isolation.level": "read_committed"}))
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        msg = None
        deadline = time.monotonic() + TIMEOUT_S
        while msg is None and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error():
                msg = None
        assert msg is not None and msg.value() == b"in a transaction"
    finally:
        consumer.close()


def test_the_weir_acl_command_manages_the_same_acls(secured):
    admin = admin_of(secured, "admin")
    topic = unique("acl-cli")
    make_topic(admin, topic)
    assert delivery_errors(secured, "bob", topic, 1)[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    out = weir(secured, "acl", "create", "--topic", topic, "--principal", "User:bob", "--operation", "write",
               "--operation", "describe").stdout
    assert out.count("User:bob") == 2 and "WRITE" in out and "DESCRIBE" in out, out
    assert delivery_errors(secured, "bob", topic, 1) == [None], "the ACL made with weir acl applies"

    listed = weir(secured, "acl", "list", "--topic", topic, "--matching").stdout
    assert "User:bob" in listed and "WRITE" in listed, listed
    refused = weir(secured, "acl", "create", "--topic", topic, "--principal", "bob", "--operation", "read",
                   check=False)
    assert refused.returncode != 0 and "User:<name>" in refused.stderr, refused.stderr
    assert weir(secured, "acl", "delete", check=False).returncode != 0, "delete without a filter is refused"

    deleted = weir(secured, "acl", "delete", "--topic", topic, "--principal", "User:bob").stdout
    assert "deleted 2 ACL(s)" in deleted, deleted
    assert delivery_errors(secured, "bob", topic, 1)[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_acls_survive_a_restart(secured):
    admin = admin_of(secured, "admin")
    name = unique("acl-durable")
    create_acls(admin, [allow("User:bob", ResourceType.TOPIC, name, AclOperation.DESCRIBE)])
    secured.restart()
    everything = AclBindingFilter(ResourceType.TOPIC, name, ResourcePatternType.ANY, None, None,
                                  AclOperation.ANY, AclPermissionType.ANY)
    admin = admin_of(secured, "admin")
    found = admin.describe_acls(everything, request_timeout=TIMEOUT_S).result(timeout=TIMEOUT_S)
    assert [(b.principal, b.operation) for b in found] == [("User:bob", AclOperation.DESCRIBE)]


def test_without_the_authorizer_acls_are_kept_but_not_enforced(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = unique("acl-open")
    make_topic(admin, topic)
    create_acls(admin, [AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:*", "*",
                                   AclOperation.ALL, AclPermissionType.DENY)])
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    errors = []
    producer.produce(topic, value=b"x", on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(TIMEOUT_S)
    assert errors == [None]


@pytest.mark.parametrize(
    "settings, named",
    [
        ({"authorizer.class.name": "com.example.MyAuthorizer"}, "authorizer.class.name"),
        ({"authorizer.class.name": AUTHORIZER, "super.users": "admin"}, "super.users"),
    ],
)
def test_bad_authorizer_settings_are_refused_at_start(tmp_path, settings, named):
    broker = Broker(tmp_path / "bad", settings=settings, name="bad")
    out = subprocess.run(broker.command(), capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert named in out.stderr, out.stderr


# -- the admin API -----------------------------------------------------------------------------

def http(broker, method, path, body=None, user=None, password=PASSWORD):
    """(status, parsed JSON body, headers) of an admin API request, as `user` if given."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{broker.admin_url()}{path}", data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return response.status, json.loads(response.read() or b"null"), response.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null"), e.headers


@pytest.fixture
def guarded(tmp_path):
    """A broker whose admin API requires a user (and whose authorizer is on), and no user yet."""
    broker = Broker(
        tmp_path / "guarded",
        settings={
            "authorizer.class.name": AUTHORIZER,
            "super.users": "User:root",
            "admin.api.require.auth": "true",
        },
        name="guarded",
    )
    _ALL_BROKERS.append(broker)
    broker.start()
    yield broker
    broker.cleanup()
    _ALL_BROKERS.remove(broker)


def test_the_admin_api_asks_for_a_user_and_checks_its_acls(guarded):
    # No user yet: the loopback address may create the first one without credentials.
    weir(guarded, "user", "create", "root", "--password", PASSWORD)
    status, body, headers = http(guarded, "GET", "/v1/topics")
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic"), (status, body)
    status, body, _ = http(guarded, "GET", "/v1/topics", user="root", password="wrong")
    assert status == 401 and body["error"]["code"] == "SASL_AUTHENTICATION_FAILED", body
    assert http(guarded, "GET", "/health")[0] == 200, "probes stay open"

    # The super user may do anything; the CLI sends the credentials from the environment.
    env_user = ["--admin-user", "root"]
    out = subprocess.run(
        [str(weir_bin()), "user", "create", "carol", "--password", PASSWORD, "--admin", guarded.admin_url(), *env_user],
        capture_output=True, text=True, timeout=60, env={**os.environ, "WEIR_ADMIN_PASSWORD": PASSWORD},
    )
    assert out.returncode == 0, out.stderr
    topic = unique("guarded")
    status, body, _ = http(guarded, "POST", "/v1/topics", {"name": topic, "partitions": 1}, user="root")
    assert status in (200, 201), body

    # carol: administration needs ALTER on the cluster, producing WRITE on the topic.
    status, body, _ = http(guarded, "POST", "/v1/topics", {"name": unique("nope"), "partitions": 1}, user="carol")
    assert status == 403 and body["error"]["code"] == "CLUSTER_AUTHORIZATION_FAILED", body
    records = {"records": [{"value": "hello"}]}
    status, body, _ = http(guarded, "POST", f"/v1/topics/{topic}/records", records, user="carol")
    assert status == 403 and body["error"]["code"] == "TOPIC_AUTHORIZATION_FAILED", body
    status, body, _ = http(guarded, "POST", "/v1/acls", {"acls": [
        {"resource_type": "TOPIC", "resource_name": topic, "principal": "User:carol", "operation": "WRITE"},
        {"resource_type": "TOPIC", "resource_name": topic, "principal": "User:carol", "operation": "READ"},
    ]}, user="root")
    assert status == 200 and all("error" not in r for r in body), body
    status, body, _ = http(guarded, "POST", f"/v1/topics/{topic}/records", records, user="carol")
    assert status == 200, body
    status, body, _ = http(guarded, "GET", f"/v1/topics/{topic}/records?timeout_ms=2000", user="carol")
    assert status == 200 and [r["value"] for r in body["records"]] == ["hello"], body
    # The ACL API itself is administration.
    status, body, _ = http(guarded, "GET", "/v1/acls", user="carol")
    assert status == 403, body


# -- RocketMQ ----------------------------------------------------------------------------------

RMQ_METADATA = [
    ("x-mq-client-id", "weir-acl-test"),
    ("x-mq-language", "PYTHON"),
    ("x-mq-protocol", "v2"),
]


def send_one(config, topic, body):
    """Sends one message with a RocketMQ Producer."""
    from rocketmq import Message, Producer

    producer = Producer(config, [topic])
    producer.startup()
    try:
        m = Message()
        m.topic = topic
        m.body = body
        producer.send(m)
    finally:
        producer.shutdown()


def receive_one(config, group, topic):
    """The body of one message a RocketMQ SimpleConsumer of `group` receives and acknowledges."""
    from rocketmq import FilterExpression, SimpleConsumer

    consumer = SimpleConsumer(config, group, {topic: FilterExpression("*")}, await_duration=2)
    consumer.startup()
    try:
        got = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got = consumer.receive(1, 30)
        assert len(got) == 1, got
        consumer.ack(got[0])
        return got[0].body
    finally:
        consumer.shutdown()


def test_rocketmq_clients_are_anonymous_to_the_authorizer(secured):
    """RocketMQ clients without an access key are User:ANONYMOUS, refused
    with FORBIDDEN until ACLs allow that principal: WRITE to send, READ on the group and the
    topic to receive."""
    import grpc
    from rocketmq import ClientConfiguration, Credentials
    from rocketmq import grpc_protocol as pb
    from rocketmq.grpc_protocol import definition_pb2 as d

    admin = admin_of(secured, "admin")
    topic, group = unique("acl-rmq"), unique("acl-rmq-group")
    make_topic(admin, topic)
    with grpc.insecure_channel(secured.rocketmq_endpoint) as channel:
        stub = pb.MessagingServiceStub(channel)
        route = stub.QueryRoute(pb.QueryRouteRequest(topic=pb.Resource(name=topic)), metadata=RMQ_METADATA, timeout=10)
        assert route.status.code == pb.Code.FORBIDDEN, route.status
        sent = stub.SendMessage(
            pb.SendMessageRequest(messages=[d.Message(topic=pb.Resource(name=topic), body=b"x")]),
            metadata=RMQ_METADATA, timeout=10,
        )
        assert sent.entries[0].status.code == pb.Code.FORBIDDEN, sent

    create_acls(admin, [allow("User:ANONYMOUS", ResourceType.TOPIC, topic, AclOperation.WRITE)])
    config = ClientConfiguration(secured.rocketmq_endpoint, Credentials(), request_timeout=10)
    send_one(config, topic, b"allowed")

    with grpc.insecure_channel(secured.rocketmq_endpoint) as channel:
        stub = pb.MessagingServiceStub(channel)
        queue = d.MessageQueue(topic=pb.Resource(name=topic), id=0)
        request = pb.ReceiveMessageRequest(group=pb.Resource(name=group), message_queue=queue, batch_size=1,
                                           filter_expression=d.FilterExpression(type=d.FilterType.TAG, expression="*"))
        first = next(iter(stub.ReceiveMessage(request, metadata=RMQ_METADATA, timeout=10)))
        assert first.status.code == pb.Code.FORBIDDEN, first

    create_acls(admin, [
        allow("User:ANONYMOUS", ResourceType.GROUP, group, AclOperation.READ),
        allow("User:ANONYMOUS", ResourceType.TOPIC, topic, AclOperation.READ),
    ])
    assert receive_one(config, group, topic) == b"allowed"


def test_a_three_node_cluster_enforces_acls_everywhere_and_still_replicates(cluster_factory):
    """Three nodes with the authorizer on, SASL_PLAINTEXT for clients and PLAINTEXT between
    brokers: ACLs made through one node apply on every node; acks=all writes (which need the
    followers' fetches, the brokers' own on the inter-broker listener) succeed; a plain-text
    client on that listener is User:ANONYMOUS and refused like any other."""
    from conftest import free_port

    cluster = cluster_factory(voters=3, start=False, settings={
        "authorizer.class.name": AUTHORIZER,
        "super.users": "User:admin",
        "min.insync.replicas": "2",
    })
    sasl_ports = {}
    for node in cluster.nodes.values():
        sasl_ports[node.node_id] = free_port()
        node.settings["listeners"] += f",SASL_PLAINTEXT://127.0.0.1:{sasl_ports[node.node_id]}"
    cluster.start()
    cluster.wait_formed()
    first = cluster.node(1)
    for user in ("admin", "alice"):
        weir(first, "user", "create", user, "--password", PASSWORD)
    everywhere = ",".join(f"127.0.0.1:{p}" for p in sasl_ports.values())
    admin = AdminClient({**conf(first, "admin"), "bootstrap.servers": f"127.0.0.1:{sasl_ports[1]}"})
    topic, group = unique("acl-cluster"), unique("acl-cluster-g")
    admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(timeout=30)
    create_acls(admin, [
        allow("User:alice", ResourceType.TOPIC, topic, AclOperation.WRITE),
        allow("User:alice", ResourceType.TOPIC, topic, AclOperation.READ),
        allow("User:alice", ResourceType.GROUP, group, AclOperation.READ),
    ])
    leader = admin.list_topics(topic=topic, timeout=10).topics[topic].partitions[0].leader
    # alice through the other nodes only: they learned the ACLs from the metadata log.
    others = ",".join(f"127.0.0.1:{p}" for i, p in sasl_ports.items() if i != 1)
    producer = Producer({**conf(first, "alice"), "bootstrap.servers": others, "acks": "all",
                         "message.timeout.ms": 60000})
    errors = []
    for i in range(20):
        producer.produce(topic, f"m{i}".encode(), on_delivery=lambda e, _m: errors.append(e))
    assert producer.flush(60) == 0
    assert errors == [None] * 20, errors[:3]
    isr = admin.list_topics(topic=topic, timeout=10).topics[topic].partitions[0].isrs
    assert len(isr) == 3, f"the followers replicate: ISR {isr} (leader {leader})"

    consumer = Consumer({**conf(first, "alice"), "bootstrap.servers": everywhere, "group.id": group,
                         "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        values = []
        deadline = time.monotonic() + 60
        while len(values) < 20 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                values.append(msg.value())
        assert sorted(values) == sorted(f"m{i}".encode() for i in range(20))
    finally:
        consumer.close()

    anonymous = Producer({"bootstrap.servers": cluster.node(leader).bootstrap, "message.timeout.ms": 10000})
    refused = []
    anonymous.produce(topic, b"sneaky", on_delivery=lambda e, _m: refused.append(e))
    anonymous.flush(30)
    assert refused and refused[0] is not None and refused[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_groups_are_listed_and_described_only_with_describe(secured):
    """A group alice may not DESCRIBE is left out of her ListGroups and refused in
    DescribeGroups with GROUP_AUTHORIZATION_FAILED; one she may describe shows, with the
    operations she is allowed on it."""
    admin = admin_of(secured, "admin")
    topic, mine, theirs = unique("acl-groups"), unique("acl-mine"), unique("acl-theirs")
    make_topic(admin, topic)
    for group in (mine, theirs):
        consumer = Consumer(conf(secured, "admin", **{"group.id": group, "enable.auto.commit": False}))
        try:
            consumer.assign([TopicPartition(topic, 0, 0)])
            consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
        finally:
            consumer.close()
    create_acls(admin, [allow("User:alice", ResourceType.GROUP, mine, AclOperation.READ)])
    alice = admin_of(secured, "alice")
    listed = {g.group_id for g in alice.list_consumer_groups(request_timeout=TIMEOUT_S).result(timeout=TIMEOUT_S).valid}
    assert mine in listed and theirs not in listed, listed
    described = alice.describe_consumer_groups([mine, theirs], include_authorized_operations=True,
                                               request_timeout=TIMEOUT_S)
    ours = described[mine].result(timeout=TIMEOUT_S)
    assert set(ours.authorized_operations) == {AclOperation.READ, AclOperation.DESCRIBE}, ours.authorized_operations
    with pytest.raises(KafkaException) as refused:
        described[theirs].result(timeout=TIMEOUT_S)
    assert refused.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED


def test_client_quotas_need_cluster_configs_acls_and_follow_the_sasl_user(secured):
    """AlterClientQuotas needs ALTER_CONFIGS on the cluster, DescribeClientQuotas
    DESCRIBE_CONFIGS; a user quota applies to the authenticated user, every client of it."""
    from test_quotas import alter, describe

    alice = kp_admin_of(secured, "alice")
    try:
        results = alter(alice, [([("user", "alice")], [("producer_byte_rate", 1024)])])
        assert [code for code, _ in results] == [31], results  # CLUSTER_AUTHORIZATION_FAILED
        _, error = describe(alice, [])
        assert error[0] == 31, error
    finally:
        alice.close()

    admin = kp_admin_of(secured, "admin")
    topic = unique("acl-quota")
    make_topic(admin_of(secured, "admin"), topic)
    create_acls(admin_of(secured, "admin"), [
        allow("User:alice", ResourceType.TOPIC, topic, AclOperation.WRITE),
        allow("User:bob", ResourceType.TOPIC, topic, AclOperation.WRITE),
    ])
    try:
        results = alter(admin, [([("user", "alice")], [("producer_byte_rate", 4096)])])
        assert results == [(0, None)], results
        found, _ = describe(admin, [("user", 0, "alice")])
        assert found == {frozenset({("user", "alice")}): {"producer_byte_rate": 4096.0}}

        def throttles_of(user):
            events = []
            producer = Producer(conf(secured, user, **{
                "client.id": unique("quota-client"),
                "linger.ms": 5,
                "throttle_cb": lambda event: events.append(event.throttle_time),
            }))
            # 128 KiB: past the ten seconds' worth (40 KiB) a new client sends unthrottled.
            for i in range(32):
                producer.produce(topic, value=b"z" * 4096)
                producer.poll(0)
            assert producer.flush(60) == 0
            return events

        assert any(t > 0 for t in throttles_of("alice")), "alice is over her producer_byte_rate"
        assert not any(t > 0 for t in throttles_of("bob")), "bob has no quota"
    finally:
        alter(admin, [([("user", "alice")], [("producer_byte_rate", None)])])
        admin.close()


def signed_metadata(access_key, secret_key, date_time="20261207T101010Z"):
    """The metadata RocketMQ's clients send, signed as rocketmq-python-client signs it."""
    from rocketmq.v5.util.signature import Signature

    signature = Signature.sign(secret_key, date_time)
    return RMQ_METADATA + [
        ("x-mq-date-time", date_time),
        ("authorization", f"MQv2-HMAC-SHA1 Credential={access_key}, SignedHeaders=x-mq-date-time, Signature={signature}"),
    ]


def test_rocketmq_clients_sign_with_an_access_key_and_are_that_user(secured):
    """A user made with `weir user create --rocketmq` is a RocketMQ access key, its password the
    secret key: the official client signs with them (MQv2-HMAC-SHA1) and is that user to the
    authorizer. A wrong secret or an unknown key is refused with UNAUTHENTICATED."""
    import grpc
    from rocketmq import ClientConfiguration, Credentials
    from rocketmq import grpc_protocol as pb

    out = weir(secured, "user", "create", "carol", "--password", PASSWORD, "--rocketmq")
    assert "yes" in out.stdout, out.stdout
    admin = admin_of(secured, "admin")
    topic, group = unique("acl-ak"), unique("acl-ak-group")
    make_topic(admin, topic)
    create_acls(admin, [
        allow("User:carol", ResourceType.TOPIC, topic, AclOperation.WRITE),
        allow("User:carol", ResourceType.TOPIC, topic, AclOperation.READ),
        allow("User:carol", ResourceType.GROUP, group, AclOperation.READ),
    ])

    config = ClientConfiguration(secured.rocketmq_endpoint, Credentials("carol", PASSWORD), request_timeout=10)
    send_one(config, topic, b"signed")
    assert receive_one(config, group, topic) == b"signed"

    with grpc.insecure_channel(secured.rocketmq_endpoint) as channel:
        stub = pb.MessagingServiceStub(channel)
        request = pb.QueryRouteRequest(topic=pb.Resource(name=topic))
        # Signed right: carol, who may describe the topic (WRITE implies DESCRIBE).
        route = stub.QueryRoute(request, metadata=signed_metadata("carol", PASSWORD), timeout=10)
        assert route.status.code == pb.Code.OK, route.status
        for access_key, secret_key in [("carol", "not her password"), ("nobody", PASSWORD)]:
            with pytest.raises(grpc.RpcError) as refused:
                stub.QueryRoute(request, metadata=signed_metadata(access_key, secret_key), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value
            assert "signature does not match" in refused.value.details()
        # A user without RocketMQ access (alice) is no access key.
        with pytest.raises(grpc.RpcError) as refused:
            stub.QueryRoute(request, metadata=signed_metadata("alice", PASSWORD), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED

    # Taking RocketMQ access away (the password stays for SASL).
    weir(secured, "user", "create", "carol", "--password", PASSWORD, "--no-rocketmq")
    with grpc.insecure_channel(secured.rocketmq_endpoint) as channel:
        stub = pb.MessagingServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.QueryRoute(pb.QueryRouteRequest(topic=pb.Resource(name=topic)),
                            metadata=signed_metadata("carol", PASSWORD), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_rocketmq_authentication_enable_refuses_unsigned_calls(broker_factory):
    """With rocketmq.authentication.enable, an unsigned RocketMQ call is refused; a signed one
    of a user with RocketMQ access goes through; failures are limited per address."""
    import grpc
    from rocketmq import grpc_protocol as pb

    broker = broker_factory({"rocketmq.authentication.enable": "true",
                             "connection.failed.authentication.max.per.minute": "3"})
    weir(broker, "user", "create", "dave", "--password", PASSWORD, "--rocketmq")
    topic = unique("ak-required")
    creator = AdminClient({"bootstrap.servers": broker.bootstrap})
    creator.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=TIMEOUT_S)
    with grpc.insecure_channel(broker.rocketmq_endpoint) as channel:
        stub = pb.MessagingServiceStub(channel)
        request = pb.QueryRouteRequest(topic=pb.Resource(name=topic))
        with pytest.raises(grpc.RpcError) as refused:
            stub.QueryRoute(request, metadata=RMQ_METADATA, timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "rocketmq.authentication.enable" in refused.value.details()
        route = stub.QueryRoute(request, metadata=signed_metadata("dave", PASSWORD), timeout=10)
        assert route.status.code == pb.Code.OK, route.status
        # Guessing is cut short: after 3 failures from this address in a minute, even the
        # right secret is refused unchecked.
        for _ in range(2):
            with pytest.raises(grpc.RpcError):
                stub.QueryRoute(request, metadata=signed_metadata("dave", "a guess"), timeout=10)
        with pytest.raises(grpc.RpcError) as refused:
            stub.QueryRoute(request, metadata=signed_metadata("dave", PASSWORD), timeout=10)
        assert "too many failed authentications" in refused.value.details(), refused.value
