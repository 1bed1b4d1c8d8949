"""The commands the docs give, run as they are written, so that the docs cannot drift from what
Weir does.

A test takes a `sh` block from a doc, changes only what a test must (the `weir` on PATH is the
binary under test, data directories go to a scratch directory instead of /var/lib/weir) and
runs it with bash. Where a recipe starts servers in the background and then talks to them, the
test waits until every server printed that it serves before running the rest: a person would
wait too.
"""

import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import time

import pytest

from conftest import REPO, weir_bin
from helpers import http, metric, wait_until
from test_elastic import murmur2

KCAT = shutil.which("kcat")


def shell_block(doc, heading):
    """The first ```sh block after `heading` in docs/`doc`."""
    text = (REPO / "docs" / doc).read_text()
    assert heading in text, f"docs/{doc} has no heading {heading!r}"
    after = text[text.index(heading):]
    match = re.search(r"```sh\n(.*?)```", after, re.S)
    assert match, f"no sh block after {heading!r} in docs/{doc}"
    return match.group(1)


def ports_in(script):
    """Every 127.0.0.1 port a script names, with `$id` expanded for ids 1 to 3."""
    ports = set()
    for host_port in re.findall(r"127\.0\.0\.1:([0-9$a-z]+)", script):
        for node_id in (1, 2, 3):
            port = host_port.replace("$id", str(node_id))
            if port.isdigit():
                ports.add(int(port))
    return ports


def port_is_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Shell:
    """bash with `weir` on PATH as the binary under test, run in a scratch directory."""

    def __init__(self, root):
        self.root = pathlib.Path(root)
        bin_dir = self.root / "bin"
        bin_dir.mkdir()
        (bin_dir / "weir").symlink_to(weir_bin())
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("WEIR_") and k != "RUST_LOG"}
        self.env["PATH"] = f"{bin_dir}:{self.env.get('PATH', '')}"

    def adapt(self, script):
        return script.replace("/var/lib/weir", str(self.root / "data"))


def test_the_three_node_recipe_in_docs_cluster_md_starts_a_cluster_that_serves_a_replicated_topic(tmp_path):
    """docs/cluster.md's "Starting a three-node cluster", as written: the three nodes start (each
    with listeners of its own), form one cluster, and the commands after them list three
    brokers, show the nodes, create a topic of three replicas and round-trip a record through
    node 1, whichever node leads its partition. The servers log no ERROR meanwhile."""
    assert KCAT is not None, "kcat is not installed (apt-get install kcat)"
    script = shell_block("cluster.md", "## Starting a three-node cluster")
    start, sep, rest = script.partition("done\n")
    assert sep, f"the recipe has no `for ... done` loop that starts the nodes:\n{script}"
    busy = sorted(p for p in ports_in(script) if not port_is_free(p))
    if busy:
        pytest.skip(f"the recipe's fixed ports {busy} are taken on this machine")

    shell = Shell(tmp_path)
    log_path = tmp_path / "servers.log"
    with open(log_path, "wb") as log:
        servers = subprocess.Popen(
            # SIGTERM to this shell stops the servers as a person's Ctrl-C would, and waits.
            ["bash", "-c", shell.adapt(start + sep) + "trap 'kill $(jobs -p) 2>/dev/null; wait' TERM\nwait\n"],
            cwd=tmp_path,
            env=shell.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            text = log_path.read_text(errors="replace")
            serving = re.findall(r"^weir \S+ listening on", text, re.M)
            if len(serving) == 3:
                break
            assert servers.poll() is None, f"the servers' shell exited ({servers.returncode}):\n{text[-4000:]}"
            assert "cannot listen" not in text, f"a node could not bind a listener:\n{text[-4000:]}"
            assert time.monotonic() < deadline, f"three nodes did not serve within 60 s:\n{text[-4000:]}"
            time.sleep(0.2)

        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", shell.adapt(rest)],
            cwd=tmp_path,
            env=shell.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        out = done.stdout
        assert done.returncode == 0, f"the recipe's commands failed ({done.returncode}):\n{out}\n{done.stderr}"
        assert re.search(r"3 brokers:", out), f"kcat -L does not list three brokers:\n{out}"
        for node_id in (1, 2, 3):
            assert re.search(rf"broker {node_id} at 127\.0\.0\.1:920{node_id}", out), out
        assert out.rstrip().endswith("hello"), f"weir consume did not print the record:\n{out}"
        text = log_path.read_text(errors="replace")
        errors = [line for line in text.splitlines() if " ERROR " in line]
        assert not errors, "the servers logged errors:\n" + "\n".join(errors[:20])
    finally:
        servers.terminate()
        try:
            servers.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(servers.pid, signal.SIGKILL)
            servers.wait(timeout=10)


def test_the_recipe_in_docs_elastic_md_splits_merges_and_routes_by_key_and_logical_partition(tmp_path, fresh_broker):
    """docs/elastic.md's "Trying it", as written, against a running broker: the split and merge
    name the physical partitions the doc says, the keyed record lands in murmur2("user-7") % 8 and
    the logical partition 40,000 in stable partition 4."""
    script = shell_block("elastic.md", "## Trying it")
    shell = Shell(tmp_path)
    env = dict(shell.env, WEIR_ADMIN=fresh_broker.admin_url())
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", shell.adapt(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    out = done.stdout
    assert done.returncode == 0, f"the recipe failed ({done.returncode}):\n{out}\n{done.stderr}"
    assert "split physical partition(s) 0 of 'clicks' into 2,3" in out, out
    assert "merged physical partition(s) 2,3 of 'clicks' into 4" in out, out
    status, body = http("GET", f"{fresh_broker.admin_url()}/v1/topics/clicks")
    assert status == 200, body
    ends = {p["partition"]: p["log_end_offset"] for p in body["partitions"]}
    key_partition = (murmur2(b"user-7") & 0x7FFFFFFF) % 8
    assert ends[4] >= 1 and ends[key_partition] >= 1, ends
    assert sum(ends.values()) == 2, ends
    states = sorted((p["id"], p["state"], p["stable_first"], p["stable_last"]) for p in body["elastic"]["physical"])
    assert states == [(0, "retired", 0, 3), (1, "active", 4, 7), (2, "retired", 0, 1), (3, "retired", 2, 3),
                      (4, "active", 0, 3)], states


def run_recipe(tmp_path, broker, doc, heading):
    """Runs the recipe under `heading` of docs/`doc` against `broker` (through its admin API,
    and its Kafka listener where the recipe names the default one) and returns the finished
    process, which must have succeeded."""
    shell = Shell(tmp_path)
    env = dict(shell.env, WEIR_ADMIN=broker.admin_url())
    script = shell.adapt(shell_block(doc, heading)).replace("127.0.0.1:9092", broker.bootstrap)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"the recipe failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


def test_the_recipe_in_docs_tiered_storage_md_uploads_closed_segments(tmp_path, broker_factory):
    """docs/tiered-storage.md's "Trying it", as written, against a broker with tiering on: the
    topic's closed segments reach the directory store and the describe shows the tier."""
    broker = broker_factory({"remote.log.storage.system.enable": "true", "remote.log.manager.task.interval.ms": "200"})
    done = run_recipe(tmp_path, broker, "tiered-storage.md", "## Trying it")
    assert "Object store (tiered storage):" in done.stdout, done.stdout

    def uploaded():
        status, body = http("GET", f"{broker.admin_url()}/v1/topics/events")
        assert status == 200, body
        return body["partitions"][0]["remote"]["remote_segments"] >= 5

    wait_until(uploaded, timeout=60, what="the recipe's segments uploaded")
    manifests = list((broker.data_dir / "objects").glob("events-*/0/*.manifest.json"))
    assert len(manifests) >= 5, manifests


def test_the_recipe_in_docs_memory_first_md_answers_once_the_store_has_the_writes(tmp_path, broker_factory):
    """docs/memory-first.md's "Trying it", as written, against a broker with tiering on (the
    directory store): every record comes back, and the writes went to write-ahead objects."""
    broker = broker_factory({"remote.log.storage.system.enable": "true", "memory.flush.ms": "20"})
    done = run_recipe(tmp_path, broker, "memory-first.md", "## Trying it")
    assert done.stdout.split()[-1] == "3000", done.stdout
    assert metric(broker, "weir_memory_flushes_total") >= 1
    assert list((broker.data_dir / "objects" / "wal").glob("*/*.wal")), "no write-ahead object"


def test_the_recipe_in_docs_native_protocol_md_persists_every_line(tmp_path, broker_factory):
    """docs/native-protocol.md's "Trying it", as written: the native producer reports its
    checkpoint moving to the last line and says it persisted all of them."""
    broker = broker_factory({"remote.log.storage.system.enable": "true", "memory.flush.ms": "20"})
    done = run_recipe(tmp_path, broker, "native-protocol.md", "## Trying it")
    assert "produced 10000 record(s) to 'clicks', all persisted" in done.stdout, done.stdout
    assert "through sequence 9999" in done.stdout, done.stdout


def test_the_recipe_in_docs_security_md_sets_and_lists_quotas(tmp_path, fresh_broker):
    """docs/security.md's "Trying quotas", as written: the quotas it sets are listed, and the one
    it deletes is gone."""
    done = run_recipe(tmp_path, fresh_broker, "security.md", "### Trying quotas")
    assert "consumer_byte_rate" in done.stdout and "reports" in done.stdout, done.stdout
    status, body = http("GET", f"{fresh_broker.admin_url()}/v1/quotas")
    assert status == 200, body
    assert sorted((tuple(sorted(q["entity"].items())), q["quotas"]) for q in body) == [
        ((("client_id", "reports"),), {"consumer_byte_rate": 1048576.0}),
        ((("user", "<default>"),), {"producer_byte_rate": 10485760.0}),
    ], body


def test_the_recipe_in_docs_security_md_gives_alice_orders_and_nobody_else(tmp_path):
    """docs/security.md's "Trying it" (ACLs), as written, against a broker with the authorizer,
    a SASL listener and an authenticated admin API: alice produces to `orders` and reads it in
    her group; bob, who has no ACL, is refused."""
    from confluent_kafka import Consumer, KafkaError, Producer

    from conftest import _ALL_BROKERS, Broker

    broker = Broker(tmp_path / "secured", name="secured", settings={
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin",
        "admin.api.require.auth": "true",
    })
    broker.settings["listeners"] = f"SASL_PLAINTEXT://127.0.0.1:{broker.port}"
    _ALL_BROKERS.append(broker)
    try:
        broker.start()
        done = run_recipe(tmp_path, broker, "security.md", "### Trying it")
        assert "User:alice" in done.stdout and "WRITE" in done.stdout, done.stdout

        def sasl(user, password, **extra):
            return {"bootstrap.servers": broker.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                    "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": user, "sasl.password": password,
                    **extra}

        def produce(user, password):
            errors = []
            producer = Producer(sasl(user, password, **{"message.timeout.ms": 10000}))
            producer.produce("orders", value=b"order", on_delivery=lambda err, _msg: errors.append(err))
            producer.flush(30)
            return errors

        assert produce("alice", "alice-secret") == [None]
        consumer = Consumer(sasl("alice", "alice-secret",
                                 **{"group.id": "order-readers", "auto.offset.reset": "earliest"}))
        try:
            consumer.subscribe(["orders"])
            got = None
            deadline = time.monotonic() + 30
            while got is None and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is not None and not msg.error():
                    got = msg.value()
            assert got == b"order"
        finally:
            consumer.close()
        subprocess.run([str(weir_bin()), "user", "create", "bob", "--password", "bob-secret",
                        "--admin", broker.admin_url(), "--admin-user", "admin"],
                       env={**os.environ, "WEIR_ADMIN_PASSWORD": "admin-secret"}, check=True, capture_output=True)
        errors = produce("bob", "bob-secret")
        assert errors[0] is not None and errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        broker.cleanup()
        _ALL_BROKERS.remove(broker)
