"""TLS and SASL on the Kafka listener, with real clients: confluent-kafka (librdkafka),
kafka-python and kcat over SASL_SSL and SSL, users made with `weir user` and with Kafka's
AlterUserScramCredentials, wrong passwords, requests before authentication, garbage in the
TLS handshake, re-authentication (KIP-368) and a certificate replaced while the broker runs.

The certificates are made here with the openssl command: a CA, and a server certificate for
127.0.0.1 and localhost signed by it.
"""

import os
import shlex
import socket
import ssl
import struct
import subprocess
import sys
import time
import urllib.request

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

import helpers
from conftest import _ALL_BROKERS, Broker, weir_bin
from helpers import (
    TIMEOUT_S,
    c_consume,
    c_create_topic,
    c_produce,
    kp_consumer,
    kp_produce,
    kp_producer,
    unique,
    wait_until,
)

PASSWORD = "s3cret-Pässword"


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_server_cert(directory, name, ca="ca", subject="/CN=localhost"):
    """A key and a certificate for 127.0.0.1/localhost signed by `ca`, as one PEM (chain + key)."""
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-subj", subject,
            "-out", f"{name}.csr", cwd=directory)
    (directory / f"{name}.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
            "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=directory)
    pem = (directory / f"{name}.crt").read_text() + (directory / f"{name}.key").read_text()
    (directory / f"{name}.pem").write_text(pem)
    return directory / f"{name}.pem"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("certs")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-subj", "/CN=weir-test-ca",
            "-days", "2", "-out", "ca.pem", cwd=directory)
    server = make_server_cert(directory, "server")
    return {"dir": directory, "ca": directory / "ca.pem", "server": server}


def start_broker(tmp_path, protocol, settings=None, name="secure"):
    broker = Broker(tmp_path / name, settings=settings, name=name)
    broker.settings["listeners"] = f"{protocol}://127.0.0.1:{broker.port}"
    _ALL_BROKERS.append(broker)
    broker.start()
    return broker


@pytest.fixture
def brokers(tmp_path):
    made = []

    def make(protocol, settings=None):
        broker = start_broker(tmp_path, protocol, settings, name=f"secure{len(made)}")
        made.append(broker)
        return broker

    yield make
    for broker in made:
        broker.cleanup()
        _ALL_BROKERS.remove(broker)


def weir_user(broker, *args):
    out = subprocess.run(
        [str(weir_bin()), "user", *args, "--admin", broker.admin_url()],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def client_conf(broker, certs, mechanism="SCRAM-SHA-512", user="alice", password=PASSWORD, protocol="SASL_SSL"):
    conf = {
        "bootstrap.servers": broker.bootstrap,
        "security.protocol": protocol,
        "socket.connection.setup.timeout.ms": 10000,
    }
    if "SSL" in protocol:
        conf["ssl.ca.location"] = str(certs["ca"])
    if "SASL" in protocol:
        conf.update({"sasl.mechanisms": mechanism, "sasl.username": user, "sasl.password": password})
    return conf


def labelled_metric(broker, name, protocol="kafka"):
    return helpers.labelled_metric(broker, name, "protocol", protocol)


def produce_consume(conf, topic, n=20):
    producer = Producer({**conf, "linger.ms": 5, "message.timeout.ms": int(TIMEOUT_S * 1000)})
    records = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(n)]
    c_produce(producer, topic, [{"key": k, "value": v} for k, v in records])
    group = unique("g")
    consumer = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        consumer.subscribe([topic])
        got = c_consume(consumer, n)
        consumer.commit(asynchronous=False)
        committed = consumer.committed([TopicPartition(topic, 0)], timeout=10)
    finally:
        consumer.close()
    assert [(r.key, r.value) for r in got] == records
    assert committed[0].offset == n


def test_sasl_ssl_scram_and_plain_with_confluent_kafka(brokers, certs):
    broker = brokers("SASL_SSL", {"ssl.keystore.location": str(certs["server"])})
    listed = weir_user(broker, "create", "alice", "--password", PASSWORD)
    assert "SCRAM-SHA-256" in listed and "SCRAM-SHA-512" in listed
    assert "alice" in weir_user(broker, "list")
    for mechanism in ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]:
        conf = client_conf(broker, certs, mechanism)
        admin = AdminClient(conf)
        topic = c_create_topic(admin, unique(f"sec-{mechanism.lower()}"))
        produce_consume(conf, topic)
    assert labelled_metric(broker, "weir_authentications_total") >= 3

    # Transactions over SASL_SSL.
    conf = client_conf(broker, certs)
    topic = c_create_topic(AdminClient(conf), unique("sec-txn"))
    producer = Producer({**conf, "transactional.id": unique("tx")})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"committed")
    producer.commit_transaction(30)
    consumer = Consumer({**conf, "group.id": unique("g"), "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"})
    try:
        consumer.subscribe([topic])
        assert [r.value for r in c_consume(consumer, 1)] == [b"committed"]
    finally:
        consumer.close()


def test_wrong_passwords_unknown_users_and_deleted_users_are_refused(brokers, certs):
    broker = brokers("SASL_SSL", {"ssl.keystore.location": str(certs["server"]),
                                  "connection.failed.authentication.delay.ms": "0",
                                  "connection.failed.authentication.max.per.minute": "100000"})
    weir_user(broker, "create", "alice", "--password", PASSWORD, "--mechanism", "SCRAM-SHA-256")
    before = labelled_metric(broker, "weir_authentication_failures_total")
    for mechanism, user, password in [
        ("SCRAM-SHA-256", "alice", "wrong"),
        ("SCRAM-SHA-512", "alice", PASSWORD),  # alice has no SHA-512 credential
        ("PLAIN", "alice", "wrong"),
        ("SCRAM-SHA-256", "mallory", PASSWORD),
    ]:
        admin = AdminClient({**client_conf(broker, certs, mechanism, user, password)})
        with pytest.raises(KafkaException) as refused:
            admin.list_topics(timeout=5)
        assert "Authentication" in str(refused.value) or "_TRANSPORT" in str(refused.value) or "timed out" in str(
            refused.value
        ), str(refused.value)
    wait_until(lambda: labelled_metric(broker, "weir_authentication_failures_total") >= before + 4,
               what="the failures counted")
    # The right password works, then not once the user is deleted.
    AdminClient(client_conf(broker, certs, "SCRAM-SHA-256")).list_topics(timeout=10)
    assert "deleted user alice" in weir_user(broker, "delete", "alice")
    with pytest.raises(KafkaException):
        AdminClient(client_conf(broker, certs, "SCRAM-SHA-256")).list_topics(timeout=5)


def test_failed_logins_are_rate_limited_per_address(brokers, certs):
    broker = brokers("SASL_PLAINTEXT", {"connection.failed.authentication.delay.ms": "0",
                                        "connection.failed.authentication.max.per.minute": "3"})
    weir_user(broker, "create", "alice", "--password", PASSWORD)
    for _ in range(3):
        assert sasl_plain_login(broker, "alice", "wrong") == 58
    # Past the limit even the right password is refused, for a minute, from this address.
    assert sasl_plain_login(broker, "alice", PASSWORD) == 58


def kafka_request(sock, api_key, version, correlation_id, body, client_id=b"raw"):
    header = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    frame = header + body
    sock.sendall(struct.pack(">i", len(frame)) + frame)


def read_frame(sock):
    size = struct.unpack(">i", recv_exact(sock, 4))[0]
    return recv_exact(sock, size)


def recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def plain_login(sock, user, password):
    """SaslHandshake v1 + SaslAuthenticate v1 with PLAIN on a raw socket: the error code."""
    mechanism = b"PLAIN"
    kafka_request(sock, 17, 1, 1, struct.pack(">h", len(mechanism)) + mechanism)
    response = read_frame(sock)
    assert struct.unpack(">h", response[4:6])[0] == 0
    token = b"\0" + user.encode() + b"\0" + password.encode()
    kafka_request(sock, 36, 1, 2, struct.pack(">i", len(token)) + token)
    response = read_frame(sock)
    return struct.unpack(">h", response[4:6])[0]


def sasl_plain_login(broker, user, password):
    with socket.create_connection((broker.host, broker.port), timeout=10) as sock:
        return plain_login(sock, user, password)


def test_an_authenticated_connection_may_stay_idle(brokers, certs):
    """connections.max.unauthenticated.ms bounds the time to authenticate, not the connection:
    one that authenticated and then sends nothing for longer is still served."""
    broker = brokers("SASL_PLAINTEXT", {"connections.max.unauthenticated.ms": "1000"})
    weir_user(broker, "create", "alice", "--password", PASSWORD)
    with socket.create_connection((broker.host, broker.port), timeout=10) as sock:
        assert plain_login(sock, "alice", PASSWORD) == 0
        time.sleep(2.5)
        kafka_request(sock, 18, 0, 9, b"")
        assert struct.unpack(">i", read_frame(sock)[:4])[0] == 9


def test_requests_before_authentication_close_the_connection(brokers, certs):
    broker = brokers("SASL_PLAINTEXT", {"connections.max.unauthenticated.ms": "1000"})
    # A Metadata request before any SASL exchange: closed, no answer.
    with socket.create_connection((broker.host, broker.port), timeout=10) as sock:
        kafka_request(sock, 3, 1, 7, struct.pack(">i", -1))
        assert sock.recv(100) == b""
    # ApiVersions is answered before authentication (clients ask it first).
    with socket.create_connection((broker.host, broker.port), timeout=10) as sock:
        kafka_request(sock, 18, 0, 8, b"")
        assert struct.unpack(">i", read_frame(sock)[:4])[0] == 8
    # A connection that never authenticates is closed after connections.max.unauthenticated.ms.
    with socket.create_connection((broker.host, broker.port), timeout=10) as sock:
        started = time.monotonic()
        assert sock.recv(100) == b""
        assert time.monotonic() - started < 8
    # An oversized token before authentication (sasl.server.max.receive.size) closes it too.
    with socket.create_connection((broker.host, broker.port), timeout=10) as sock:
        sock.sendall(struct.pack(">i", 10_000_000) + b"x" * 1000)
        assert sock.recv(100) == b""
    assert broker.alive()


def test_garbage_in_the_tls_handshake_harms_no_one(brokers, certs):
    broker = brokers("SSL", {"ssl.keystore.location": str(certs["server"])})
    for garbage in [b"\x00" * 64, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x16\x03\x01\x00\x05hello", b""]:
        with socket.create_connection((broker.host, broker.port), timeout=10) as sock:
            sock.sendall(garbage)
            sock.shutdown(socket.SHUT_WR)
            try:
                sock.recv(100)
            except ConnectionResetError:
                pass
    # A plain-text Kafka client gets nothing useful either, and the broker serves TLS clients.
    assert broker.alive()
    conf = client_conf(broker, certs, protocol="SSL")
    topic = c_create_topic(AdminClient(conf), unique("ssl"))
    produce_consume(conf, topic, n=5)
    assert labelled_metric(broker, "weir_tls_handshake_failures_total") >= 3


def test_kcat_and_kafka_python_over_tls(brokers, certs):
    broker = brokers("SASL_SSL", {"ssl.keystore.location": str(certs["server"])})
    weir_user(broker, "create", "alice", "--password", PASSWORD)
    topic = c_create_topic(AdminClient(client_conf(broker, certs)), unique("kp"), partitions=1)
    sasl = dict(security_protocol="SASL_SSL", ssl_cafile=str(certs["ca"]), sasl_mechanism="SCRAM-SHA-512",
                sasl_plain_username="alice", sasl_plain_password=PASSWORD)
    producer = kp_producer(broker.bootstrap, **sasl)
    kp_produce(producer, topic, [{"key": b"k", "value": b"from kafka-python"}])
    producer.close()
    consumer = kp_consumer(broker.bootstrap, group_id=unique("g"), **sasl)
    consumer.subscribe([topic])
    got = []
    deadline = time.monotonic() + TIMEOUT_S
    while not got and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            got += [r.value for r in records]
    consumer.close()
    assert got == [b"from kafka-python"]

    kcat = ["kcat", "-b", broker.bootstrap, "-X", "security.protocol=SASL_SSL", "-X",
            f"ssl.ca.location={certs['ca']}", "-X", "sasl.mechanisms=SCRAM-SHA-256", "-X", "sasl.username=alice",
            "-X", f"sasl.password={PASSWORD}"]
    subprocess.run(kcat + ["-P", "-t", topic], input=b"from kcat\n", check=True, timeout=60)
    out = subprocess.run(kcat + ["-C", "-t", topic, "-e", "-o", "beginning", "-f", "%s\n"], capture_output=True,
                         check=True, timeout=60)
    assert out.stdout.decode().split() == ["from", "kafka-python", "from", "kcat"]
    # Without the CA, kcat refuses the broker's certificate.
    refused = subprocess.run(["kcat", "-b", broker.bootstrap, "-X", "security.protocol=SSL", "-L", "-m", "5"],
                             capture_output=True, timeout=60)
    assert refused.returncode != 0


def test_scram_credentials_through_the_kafka_admin_api(brokers, certs):
    broker = brokers("SASL_SSL", {"ssl.keystore.location": str(certs["server"])})
    weir_user(broker, "create", "admin", "--password", PASSWORD)
    admin = AdminClient(client_conf(broker, certs, user="admin"))
    futures = admin.alter_user_scram_credentials([
        UserScramCredentialUpsertion("bob", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192), b"bob-pw"),
    ])
    for future in futures.values():
        future.result(timeout=30)
    described = {u: f.result(timeout=30) for u, f in admin.describe_user_scram_credentials(["bob"]).items()}
    info = described["bob"].scram_credential_infos
    assert [(i.mechanism, i.iterations) for i in info] == [(ScramMechanism.SCRAM_SHA_256, 8192)]
    AdminClient(client_conf(broker, certs, "SCRAM-SHA-256", "bob", "bob-pw")).list_topics(timeout=10)
    AdminClient(client_conf(broker, certs, "PLAIN", "bob", "bob-pw")).list_topics(timeout=10)
    for future in admin.alter_user_scram_credentials(
        [UserScramCredentialDeletion("bob", ScramMechanism.SCRAM_SHA_256)]
    ).values():
        future.result(timeout=30)
    with pytest.raises(KafkaException):
        AdminClient(client_conf(broker, certs, "SCRAM-SHA-256", "bob", "bob-pw")).list_topics(timeout=5)
    # Too few iterations is refused, as Kafka refuses it.
    bad = admin.alter_user_scram_credentials([
        UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 100), b"pw"),
    ])
    with pytest.raises(KafkaException):
        bad["carol"].result(timeout=30)


def test_reauthentication_keeps_a_producer_going(brokers, certs):
    broker = brokers("SASL_SSL", {"ssl.keystore.location": str(certs["server"]),
                                  "connections.max.reauth.ms": "1500"})
    weir_user(broker, "create", "alice", "--password", PASSWORD)
    conf = client_conf(broker, certs)
    topic = c_create_topic(AdminClient(conf), unique("reauth"))
    producer = Producer({**conf, "linger.ms": 0, "message.timeout.ms": 30000})
    errors = []
    delivered = []
    deadline = time.monotonic() + 5
    i = 0
    while time.monotonic() < deadline:
        producer.produce(topic, f"{i}".encode(),
                         on_delivery=lambda e, m: errors.append(e) if e else delivered.append(m.offset()))
        producer.poll(0.05)
        i += 1
    assert producer.flush(30) == 0
    assert not errors and len(delivered) == i
    # The sessions expired and were renewed on the same connections.
    assert labelled_metric(broker, "weir_authentications_total") >= 3


def served_certificate(broker):
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection((broker.host, broker.port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            return tls.getpeercert(binary_form=True)


def test_a_replaced_certificate_is_served_without_a_restart(brokers, certs, tmp_path):
    keystore = tmp_path / "keystore.pem"
    keystore.write_text(certs["server"].read_text())
    broker = brokers("SSL", {"ssl.keystore.location": str(keystore)})
    first = served_certificate(broker)
    fresh = make_server_cert(certs["dir"], "rotated")
    # Half-written files are not loaded: the old certificate stays until a whole one is there.
    keystore.write_text("-----BEGIN CERTIFICATE-----\nnot a cert\n")
    time.sleep(1.2)
    assert served_certificate(broker) == first
    keystore.write_text(fresh.read_text())
    wait_until(lambda: served_certificate(broker) != first, timeout=10, what="the new certificate served")
    conf = client_conf(broker, certs, protocol="SSL")
    AdminClient(conf).list_topics(timeout=10)


def test_bad_tls_settings_stop_the_start_with_a_clear_error(tmp_path, certs):
    for settings, expected in [
        ({"listeners": "SSL://127.0.0.1:0"}, "ssl.keystore.location"),
        ({"listeners": "SSL://127.0.0.1:0", "ssl.keystore.location": str(certs["ca"])}, "private key"),
        ({"listeners": "SASL_SSL://127.0.0.1:0", "ssl.keystore.location": str(certs["server"]),
          "sasl.enabled.mechanisms": "GSSAPI"}, "sasl.enabled.mechanisms"),
    ]:
        args = [str(weir_bin()), "server", "--data-dir", str(tmp_path / "d")]
        for k, v in settings.items():
            args += ["--set", f"{k}={v}"]
        out = subprocess.run(args, capture_output=True, text=True, timeout=30)
        assert out.returncode != 0
        assert expected in out.stderr, out.stderr


def test_a_plaintext_and_a_sasl_ssl_listener_side_by_side(tmp_path, certs):
    """Two client listeners on one broker: each client is told the broker's address on the
    listener it came in on (Kafka's rule), so a SASL_SSL client never lands on the plain port."""
    from conftest import free_port

    broker = Broker(tmp_path / "two", settings={"ssl.keystore.location": str(certs["server"])}, name="two")
    secure_port = free_port()
    broker.settings["listeners"] = f"PLAINTEXT://127.0.0.1:{broker.port},SASL_SSL://127.0.0.1:{secure_port}"
    _ALL_BROKERS.append(broker)
    try:
        broker.start()
        weir_user(broker, "create", "alice", "--password", PASSWORD)
        plain = AdminClient({"bootstrap.servers": broker.bootstrap})
        assert [b.port for b in plain.list_topics(timeout=10).brokers.values()] == [broker.port]
        conf = client_conf(broker, certs)
        conf["bootstrap.servers"] = f"127.0.0.1:{secure_port}"
        secure = AdminClient(conf)
        assert [b.port for b in secure.list_topics(timeout=10).brokers.values()] == [secure_port]
        topic = c_create_topic(secure, unique("two"))
        produce_consume(conf, topic, n=5)
        # The plain listener reads what came in through the secured one.
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique("g"),
                             "auto.offset.reset": "earliest"})
        try:
            consumer.subscribe([topic])
            assert len(c_consume(consumer, 5)) == 5
        finally:
            consumer.close()
    finally:
        broker.cleanup()
        _ALL_BROKERS.remove(broker)


def test_a_three_node_cluster_with_sasl_ssl_clients(cluster_factory, certs):
    """Three nodes, each with a SASL_SSL listener for clients and PLAINTEXT for replication: a
    replicated topic written and read over SASL_SSL, every broker named by its SASL_SSL port,
    and the writes go on after the partition's leader is killed."""
    from conftest import free_port

    cluster = cluster_factory(voters=3, start=False, settings={"ssl.keystore.location": str(certs["server"]),
                                                                "min.insync.replicas": "2"})
    secure = {}
    for node in cluster.nodes.values():
        secure[node.node_id] = free_port()
        node.settings["listeners"] += f",SASL_SSL://127.0.0.1:{secure[node.node_id]}"
    cluster.start()
    cluster.wait_formed()
    first = cluster.node(1)
    weir_user(first, "create", "alice", "--password", PASSWORD)
    conf = client_conf(first, certs)
    conf["bootstrap.servers"] = ",".join(f"127.0.0.1:{p}" for p in secure.values())
    admin = AdminClient(conf)
    wait_until(lambda: sorted(b.port for b in admin.list_topics(timeout=10).brokers.values()) == sorted(secure.values()),
               what="every broker named by its SASL_SSL port")
    topic = unique("sec-cluster")
    from confluent_kafka.admin import NewTopic

    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=3)])[topic].result(timeout=30)
    producer = Producer({**conf, "acks": "all", "message.timeout.ms": 60000})
    sent = 0

    def send(n):
        nonlocal sent
        errors = []
        for _ in range(n):
            producer.produce(topic, f"m{sent}".encode(), on_delivery=lambda e, m: e and errors.append(e))
            sent += 1
        assert producer.flush(60) == 0 and not errors, errors

    send(50)
    leader = admin.list_topics(topic=topic, timeout=10).topics[topic].partitions[0].leader
    cluster.node(leader).kill9()
    send(50)
    consumer = Consumer({**conf, "group.id": unique("g"), "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        values = [r.value for r in c_consume(consumer, 100, timeout=60)]
    finally:
        consumer.close()
    assert sorted(values) == sorted(f"m{i}".encode() for i in range(100))


def secured_inside_settings(certs, node_cert):
    """The settings of docs/security.md's "A cluster secured inside": replication over SASL_SSL
    (SCRAM-SHA-512 as User:broker), the CONTROLLER listener over mutual TLS, the authorizer on.
    The node's own settings (id, roles, voters, listeners) are the cluster harness's; the files
    are this test's. A PLAINTEXT listener is added for the test's (anonymous) clients, whom
    allow.everyone.if.no.acl.found lets in."""
    from test_docs import shell_block

    script = shell_block("security.md", "### A cluster secured inside").replace("\\\n", " ")
    words = shlex.split(script)
    settings = dict(words[i + 1].split("=", 1) for i, word in enumerate(words) if word == "--set")
    for own in ("node.id", "process.roles", "controller.quorum.voters", "listeners"):
        assert settings.pop(own)
    assert settings.pop("ssl.keystore.location").endswith(".pem")
    assert settings.pop("ssl.truststore.location").endswith(".pem")
    settings.update({
        "ssl.keystore.location": str(node_cert),
        "ssl.truststore.location": str(certs["ca"]),
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT," + settings["listener.security.protocol.map"],
        "inter.broker.listener.name": "SASL_SSL",
        "allow.everyone.if.no.acl.found": "true",
        "min.insync.replicas": "2",
        "replica.lag.time.max.ms": "3000",
    })
    return settings


def is_rpc_answer(port, wrap=None):
    """Whether the CONTROLLER port answers a weir-rpc request (`cluster.node_status`) with an
    RPC frame (version 1, a response or an error); `wrap` makes the socket TLS."""
    method = b"cluster.node_status"
    frame = struct.pack(">BBQH", 1, 0, 7, len(method)) + method + b"{}"
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        if wrap is not None:
            sock = wrap(sock)
        sock.sendall(struct.pack(">I", len(frame)) + frame)
        answer = b""
        while len(answer) < 6:
            chunk = sock.recv(4096)
            if not chunk:
                return False
            answer += chunk
        return answer[4] == 1 and answer[5] in (1, 2)
    except (ssl.SSLError, ConnectionError, socket.timeout):
        return False
    finally:
        sock.close()


def test_a_three_node_cluster_secured_inside(cluster_factory, certs):
    """Replication between brokers over SASL_SSL with SCRAM (the brokers' user made from their
    JAAS login at the first start), the metadata quorum and internal requests over mutual TLS,
    and the authorizer on. Writes with acks=all need the followers: they reach every replica,
    survive the leader's kill -9, and read back whole. The CONTROLLER port refuses plain text
    and a TLS client without a certificate; a broker whose inter-broker password is wrong
    never joins the ISR."""
    from conftest import free_port

    node_cert = make_server_cert(certs["dir"], "node", subject="/CN=weir-node")
    cluster = cluster_factory(voters=3, brokers=1, start=False, settings=secured_inside_settings(certs, node_cert))
    for node in cluster.nodes.values():
        node.settings["listeners"] = (f"PLAINTEXT://127.0.0.1:{node.port},SASL_SSL://127.0.0.1:{free_port()},"
                                      f"CONTROLLER://127.0.0.1:{node.controller_port}")
    intruder = cluster.node(4)
    intruder.settings["listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"] = (
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="broker" password="wrong";')
    cluster.start(ids=[1, 2, 3])
    cluster.wait_formed(ids=[1, 2, 3])
    users = weir_user(cluster.node(1), "list")
    assert "broker" in users, users

    from confluent_kafka.admin import NewTopic

    topic = unique("inside")
    bootstrap = cluster.bootstrap([1, 2, 3])
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=3)])[topic].result(timeout=30)
    cluster.wait_topic(topic, 3, ids=[1, 2, 3])
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 60000,
                         "linger.ms": 5})
    sent = []

    def send(n):
        errors = []
        for _ in range(n):
            value = f"m{len(sent)}".encode()
            producer.produce(topic, value, partition=len(sent) % 3, on_delivery=lambda e, m: e and errors.append(e))
            sent.append(value)
        assert producer.flush(60) == 0 and not errors, errors

    send(90)
    partitions = admin.list_topics(topic=topic, timeout=10).topics[topic].partitions
    assert all(sorted(p.isrs) == [1, 2, 3] for p in partitions.values()), partitions
    logins = sum(labelled_metric(cluster.node(i), "weir_authentications_total") for i in (1, 2, 3))
    assert logins >= 3, "the followers logged in over SASL_SSL"

    # The CONTROLLER port answers a node's certificate only: not plain text, nor TLS without one.
    port = cluster.node(1).controller_port
    anonymous = ssl.create_default_context(cafile=str(certs["ca"]))
    with_cert = ssl.create_default_context(cafile=str(certs["ca"]))
    with_cert.load_cert_chain(str(node_cert))
    assert is_rpc_answer(port, wrap=lambda s: with_cert.wrap_socket(s, server_hostname="127.0.0.1"))
    assert not is_rpc_answer(port), "plain text is not served"
    assert not is_rpc_answer(port, wrap=lambda s: anonymous.wrap_socket(s, server_hostname="127.0.0.1"))

    leader = partitions[0].leader
    cluster.node(leader).kill9()
    send(30)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g"), "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        values = [r.value for r in c_consume(consumer, len(sent), timeout=60)]
    finally:
        consumer.close()
    assert sorted(values) == sorted(sent)
    cluster.start(ids=[leader])

    # A broker with the wrong password registers (its certificate is good) but cannot fetch.
    cluster.start(ids=[4])
    spread = unique("intruder")
    from kafka.admin import NewTopic as KpNewTopic

    kp = helpers.kp_admin(bootstrap)
    try:
        kp.create_topics([KpNewTopic(spread, num_partitions=-1, replication_factor=-1,
                                     replica_assignments={0: [1, 4], 1: [4, 1]})])
    finally:
        kp.close()

    def isr_of_what_node_1_leads():
        parts = admin.list_topics(topic=spread, timeout=10).topics[spread].partitions.values()
        return [sorted(p.isrs) for p in parts if p.leader == 1]

    wait_until(lambda: isr_of_what_node_1_leads() == [[1]], timeout=30, what="broker 4 out of node 1's ISR")
    time.sleep(3)
    assert isr_of_what_node_1_leads() == [[1]], "broker 4 never catches up"
    assert labelled_metric(cluster.node(1), "weir_authentication_failures_total") >= 1


def test_the_admin_api_and_the_rocketmq_listener_speak_tls(tmp_path, certs, brokers):
    """admin.ssl.enable and rocketmq.ssl.enable: the admin API answers HTTPS (urllib and the
    `weir` commands with --admin-ca) and refuses plain HTTP; RocketMQ's gRPC answers over TLS
    (a raw stub, and the official Python producer) and refuses a plain-text channel."""
    import grpc
    from rocketmq import grpc_protocol as pb

    broker = brokers("PLAINTEXT", {
        "admin.ssl.enable": "true",
        "rocketmq.ssl.enable": "true",
        "ssl.keystore.location": str(certs["server"]),
    })
    url = broker.admin_url()
    assert url.startswith("https://"), url
    context = ssl.create_default_context(cafile=str(certs["ca"]))
    with urllib.request.urlopen(f"{url}/v1/broker", timeout=10, context=context) as response:
        assert response.status == 200
    plain = url.replace("https://", "http://")
    with pytest.raises(Exception):
        urllib.request.urlopen(f"{plain}/v1/broker", timeout=10)

    topic = unique("tls-admin")
    created = subprocess.run([str(weir_bin()), "topic", "create", topic, "--admin", url, "--admin-ca", str(certs["ca"])],
                             capture_output=True, text=True, timeout=60)
    assert created.returncode == 0, created.stderr
    no_ca = subprocess.run([str(weir_bin()), "topic", "list", "--admin", url], capture_output=True, text=True, timeout=60)
    assert no_ca.returncode != 0 and "--admin-ca" in no_ca.stderr, no_ca.stderr

    credentials = grpc.ssl_channel_credentials(root_certificates=certs["ca"].read_bytes())
    metadata = [("x-mq-client-id", "tls-test"), ("x-mq-protocol", "v2")]
    with grpc.secure_channel(broker.rocketmq_endpoint, credentials) as channel:
        route = pb.MessagingServiceStub(channel).QueryRoute(
            pb.QueryRouteRequest(topic=pb.Resource(name=topic)), metadata=metadata, timeout=10)
        assert route.status.code == pb.Code.OK and route.message_queues, route
    with grpc.insecure_channel(broker.rocketmq_endpoint) as channel:
        with pytest.raises(grpc.RpcError):
            pb.MessagingServiceStub(channel).QueryRoute(
                pb.QueryRouteRequest(topic=pb.Resource(name=topic)), metadata=metadata, timeout=5)

    # The official client, which trusts gRPC's default roots: pointed at the test CA.
    script = (
        "import sys\n"
        "from rocketmq import ClientConfiguration, Credentials, Message, Producer\n"
        "config = ClientConfiguration(sys.argv[1], Credentials(), request_timeout=10)\n"
        "producer = Producer(config, [sys.argv[2]], tls_enable=True)\n"
        "producer.startup()\n"
        "m = Message()\nm.topic = sys.argv[2]\nm.body = b'over tls'\n"
        "print(producer.send(m).message_id)\n"
        "producer.shutdown()\n"
    )
    sent = subprocess.run(
        [sys.executable, "-c", script, broker.rocketmq_endpoint, topic],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(certs["ca"])},
    )
    assert sent.returncode == 0 and sent.stdout.strip(), sent.stderr[-2000:]
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique("g"), "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(1)])
        got = c_consume(consumer, 1)
        assert [m.value for m in got] == [b"over tls"]
    finally:
        consumer.close()


def make_client_cert(directory, name, subject, ca="ca"):
    """A client key and certificate (subject as given, e.g. /O=Example/OU=eng/CN=alice) signed by `ca`."""
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-subj", subject,
            "-out", f"{name}.csr", cwd=directory)
    (directory / f"{name}.ext").write_text("extendedKeyUsage=clientAuth\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
            "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=directory)
    return directory / f"{name}.crt", directory / f"{name}.key"


def test_a_client_certificate_names_the_principal_the_authorizer_sees(tmp_path, certs, brokers):
    """Mutual TLS (ssl.client.auth=required): the certificate's subject, mapped by
    ssl.principal.mapping.rules, is the principal; ACLs for User:alice let the CN=alice
    certificate write and refuse the CN=mallory one; a client without a certificate is
    turned away in the handshake."""
    broker = brokers("SSL", {
        "ssl.keystore.location": str(certs["server"]),
        "ssl.truststore.location": str(certs["ca"]),
        "ssl.client.auth": "required",
        "ssl.principal.mapping.rules": "RULE:^CN=([a-z]+),OU=eng,.*$/$1/,DEFAULT",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    })
    topic = unique("mtls")
    out = subprocess.run([str(weir_bin()), "topic", "create", topic, "--admin", broker.admin_url()],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    out = subprocess.run([str(weir_bin()), "acl", "create", "--topic", topic, "--principal", "User:alice",
                          "--operation", "write", "--admin", broker.admin_url()], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    alice = make_client_cert(certs["dir"], "alice", "/O=Example/OU=eng/CN=alice")
    mallory = make_client_cert(certs["dir"], "mallory", "/O=Example/OU=eng/CN=mallory")

    def produce(cert):
        conf = client_conf(broker, certs, protocol="SSL")
        if cert is not None:
            conf.update({"ssl.certificate.location": str(cert[0]), "ssl.key.location": str(cert[1])})
        producer = Producer({**conf, "message.timeout.ms": 10000})
        errors = []
        producer.produce(topic, b"signed", on_delivery=lambda e, _m: errors.append(e))
        producer.flush(30)
        return errors

    assert produce(alice) == [None]
    refused = produce(mallory)
    assert refused[0] is not None and refused[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, refused
    anonymous = produce(None)
    assert anonymous[0] is not None and anonymous[0].code() != KafkaError.TOPIC_AUTHORIZATION_FAILED, anonymous
    assert labelled_metric(broker, "weir_tls_handshake_failures_total") >= 1
