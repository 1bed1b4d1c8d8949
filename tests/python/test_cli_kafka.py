"""The `weir` CLI over the Kafka port (--bootstrap): topics, groups, produce and consume with the
admin HTTP listener disabled; `weir consume --group` as a real member of a consumer group beside
confluent-kafka consumers; `weir group delete-offsets` through both paths."""

import json
import os
import signal
import subprocess
import threading
import time

from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions, KafkaException

from conftest import weir_bin
from helpers import TIMEOUT_S, c_admin, c_consumer, c_create_topic, c_produce, c_producer, unique, wait_until

CLI_TIMEOUT_S = 60


def weir(*args, bootstrap=None, admin=None, stdin=None, check=True):
    """Runs `weir ARGS`; with bootstrap, over the Kafka port (WEIR_BOOTSTRAP), else the admin API."""
    env = {k: v for k, v in os.environ.items() if k not in ("WEIR_BOOTSTRAP", "WEIR_ADMIN")}
    if bootstrap:
        env["WEIR_BOOTSTRAP"] = bootstrap
    if admin:
        env["WEIR_ADMIN"] = admin
    done = subprocess.run([str(weir_bin()), *args], input=stdin, capture_output=True, text=True, env=env,
                          timeout=CLI_TIMEOUT_S)
    if check:
        assert done.returncode == 0, f"weir {' '.join(args)}: {done.stderr}"
    return done


def json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_every_topic_group_produce_and_consume_command_works_with_only_the_kafka_port(broker_factory):
    broker = broker_factory(settings={"admin.listeners": ""})
    kafka = broker.bootstrap
    topic, group = unique("cli"), unique("g")

    created = weir("topic", "create", topic, "--partitions", "3", "--config", "retention.ms=3600000", bootstrap=kafka)
    assert created.stdout == f"created topic '{topic}' with 3 partitions\n"
    listed = json_lines(weir("topic", "list", "--json", bootstrap=kafka).stdout)[0]["topics"]
    assert {t["name"]: t["partitions"] for t in listed}[topic] == 3
    refused = weir("topic", "create", topic, bootstrap=kafka, check=False)
    assert refused.returncode == 1 and "TOPIC_ALREADY_EXISTS" in refused.stderr, refused.stderr

    lines = [f"k{i}:v{i}" for i in range(30)]
    produced = weir("produce", topic, "--key-separator", ":", "--json", bootstrap=kafka, stdin="\n".join(lines) + "\n")
    offsets = json_lines(produced.stdout)
    assert len(offsets) == 30 and all(o["offset"] >= 0 for o in offsets), produced.stdout
    consumed = json_lines(weir("consume", topic, "--from-beginning", "--max-messages", "30", "--timeout", "10",
                               "--json", bootstrap=kafka).stdout)
    assert sorted((r["key"], r["value"]) for r in consumed) == sorted(tuple(line.split(":")) for line in lines)
    # A key always lands on the same partition, whichever path produced it.
    assert {r["key"]: r["partition"] for r in consumed} == {f"k{i}": o["partition"] for i, o in enumerate(offsets)}

    described = json_lines(weir("topic", "describe", topic, "--json", bootstrap=kafka).stdout)[0]
    assert sum(p["high_watermark"] for p in described["partitions"]) == 30
    assert all(p["size_bytes"] > 0 for p in described["partitions"] if p["high_watermark"] > 0), described
    assert {c["name"]: (c["value"], c["source"]) for c in described["configs"]}["retention.ms"] == ("3600000", "topic")
    weir("topic", "alter", topic, "--set", "retention.ms=7200000", "--partitions", "4", bootstrap=kafka)
    described = json_lines(weir("topic", "describe", topic, "--json", bootstrap=kafka).stdout)[0]
    assert len(described["partitions"]) == 4
    assert {c["name"]: c["value"] for c in described["configs"]}["retention.ms"] == "7200000"

    # A group member commits what it printed; the group commands see and move it.
    weir("consume", topic, "--group", group, "--from-beginning", "--max-messages", "30", "--timeout", "10",
         bootstrap=kafka)
    desc = json_lines(weir("group", "describe", group, "--json", bootstrap=kafka).stdout)[0]
    assert desc["state"] == "Empty" and desc["protocol_type"] == "consumer", desc
    assert desc["total_lag"] == 0 and sum(o["committed_offset"] or 0 for o in desc["offsets"]) == 30, desc
    assert group in {g["group_id"] for g in json_lines(weir("group", "list", "--json", bootstrap=kafka).stdout)[0]["groups"]}
    reset = json_lines(weir("group", "reset-offsets", group, "--topic", topic, "--to-earliest", "--json",
                            bootstrap=kafka).stdout)[0]
    assert all(o["new_offset"] == 0 for o in reset["offsets"]) and len(reset["offsets"]) == 4, reset
    desc = json_lines(weir("group", "describe", group, "--json", bootstrap=kafka).stdout)[0]
    assert desc["total_lag"] == 30, desc
    weir("group", "delete", group, bootstrap=kafka)
    gone = weir("group", "describe", group, bootstrap=kafka, check=False)
    assert gone.returncode == 1 and "GROUP_ID_NOT_FOUND" in gone.stderr, gone.stderr

    # The commands that need the admin API say so, and why.
    for command in (["cluster", "info"], ["partition", "reassignments"], ["message", "query", topic, "--key", "k1"],
                    ["group", "create", unique("settings")]):
        done = weir(*command, bootstrap=kafka, check=False)
        assert done.returncode == 1, (command, done.stdout)
        assert "admin HTTP API" in done.stderr, (command, done.stderr)

    weir("topic", "delete", topic, bootstrap=kafka)
    assert topic not in {t["name"] for t in json_lines(weir("topic", "list", "--json", bootstrap=kafka).stdout)[0]["topics"]}


def test_both_paths_print_the_same_tables(broker):
    topic, group = unique("same"), unique("g")
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=2)
    weir("produce", topic, "--partition", "1", bootstrap=broker.bootstrap, stdin="a\nb\nc\n")
    weir("consume", topic, "--group", group, "--from-beginning", "--max-messages", "2", "--timeout", "10",
         admin=broker.admin_url())
    # A setting of the group's (Weir metadata) shows through both paths too.
    weir("group", "alter", group, "--set", "max.delivery.attempts=5", admin=broker.admin_url())
    commands = (["group", "describe", group], ["topic", "list"],
                ["group", "reset-offsets", group, "--all-topics", "--shift-by", "-1", "--dry-run"])
    for command in commands:
        over_kafka = weir(*command, bootstrap=broker.bootstrap).stdout
        over_http = weir(*command, admin=broker.admin_url()).stdout
        assert over_kafka == over_http, (command, over_kafka, over_http)
    desc = json_lines(weir("group", "describe", group, "--json", bootstrap=broker.bootstrap).stdout)[0]
    assert {c["name"]: (c["value"], c["source"]) for c in desc["configs"]}["max.delivery.attempts"] == ("5", "group")
    assert [(o["partition"], o["committed_offset"], o["high_watermark"]) for o in desc["offsets"]] == [(0, 0, 0), (1, 2, 3)]


class CliMember:
    """`weir consume --group` running in the background, its records collected as they print."""

    def __init__(self, bootstrap, topic, group, *flags):
        env = {k: v for k, v in os.environ.items() if k != "WEIR_ADMIN"}
        env["WEIR_BOOTSTRAP"] = bootstrap
        self.proc = subprocess.Popen([str(weir_bin()), "consume", topic, "--group", group, "--json", *flags],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.records = []
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            if line.strip():
                with self.lock:
                    self.records.append(json.loads(line))

    def values(self):
        with self.lock:
            return {r["value"] for r in self.records}

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(timeout=CLI_TIMEOUT_S)
        self.reader.join(timeout=TIMEOUT_S)
        return code, self.proc.stderr.read()


def group_members(admin, group):
    try:
        desc = admin.describe_consumer_groups([group])[group].result(timeout=TIMEOUT_S)
    except KafkaException:
        return None  # the coordinator is loading (a new cluster) or moving

    if desc.state != ConsumerGroupState.STABLE:
        return None
    return {m.client_id: {tp.partition for tp in m.assignment.topic_partitions} for m in desc.members}


def test_consume_group_shares_partitions_with_a_confluent_consumer_and_takes_over(broker, closer):
    topic, group = unique("shared"), unique("g")
    admin = c_admin(broker.bootstrap)
    c_create_topic(admin, topic, partitions=4)
    producer = c_producer(broker.bootstrap)
    cli = CliMember(broker.bootstrap, topic, group)
    try:
        wait_until(lambda: group_members(admin, group) == {"weir-cli": {0, 1, 2, 3}}, what="the CLI owns all four")

        other = c_consumer(broker.bootstrap, group, {"client.id": "confluent"})
        other.subscribe([topic])
        got = {}

        def shared():
            msg = other.poll(0.2)
            if msg is not None and not msg.error():
                got[msg.value().decode()] = msg.partition()
            members = group_members(admin, group)
            return members if members and len(members) == 2 else None

        members = wait_until(shared, what="the group rebalanced to two members")
        assert members["weir-cli"] | members["confluent"] == {0, 1, 2, 3}, members
        assert members["weir-cli"] and members["confluent"] and not members["weir-cli"] & members["confluent"], members
        first = [f"first-{i}" for i in range(40)]
        c_produce(producer, topic, [{"value": v.encode(), "partition": i % 4} for i, v in enumerate(first)])

        def all_first_read():
            msg = other.poll(0.2)
            if msg is not None and not msg.error():
                got[msg.value().decode()] = msg.partition()
            return set(first) <= cli.values() | set(got)

        wait_until(all_first_read, what="the two members read every record")
        by_cli = {r["value"] for r in cli.records if r["value"].startswith("first-")}
        assert {r["partition"] for r in cli.records if r["value"] in by_cli} <= members["weir-cli"]
        assert {p for v, p in got.items() if v.startswith("first-")} <= members["confluent"]
        assert not by_cli & {v for v in got if v.startswith("first-")}, "a record went to both members"

        if got:
            other.commit(asynchronous=False)
        other.close()  # LeaveGroup: the CLI takes every partition at once
        wait_until(lambda: group_members(admin, group) == {"weir-cli": {0, 1, 2, 3}}, what="the CLI took over")
        second = [f"second-{i}" for i in range(20)]
        c_produce(producer, topic, [{"value": v.encode(), "partition": i % 4} for i, v in enumerate(second)])
        wait_until(lambda: set(second) <= cli.values(), what="the CLI read the records of every partition")
    finally:
        code, stderr = cli.stop()
    assert code == 130, stderr
    assert f"consumed {len(cli.records)} record(s)" in stderr, stderr
    # It left the group (no session timeout to wait out) and committed what it printed.
    desc = admin.describe_consumer_groups([group])[group].result(timeout=TIMEOUT_S)
    assert desc.state == ConsumerGroupState.EMPTY, desc.state
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(timeout=TIMEOUT_S)
    assert sum(tp.offset for tp in offsets.topic_partitions if tp.offset >= 0) == 60


def test_delete_offsets_removes_one_topics_offsets_through_either_path(broker):
    admin = c_admin(broker.bootstrap)
    kept, dropped, group = unique("kept"), unique("dropped"), unique("g")
    for topic in (kept, dropped):
        c_create_topic(admin, topic, partitions=2)
        weir("produce", topic, bootstrap=broker.bootstrap, stdin="x\ny\nz\n")
        weir("consume", topic, "--group", group, "--from-beginning", "--max-messages", "3", "--timeout", "10",
             bootstrap=broker.bootstrap)

    def committed_topics():
        offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(
            timeout=TIMEOUT_S)
        return {tp.topic for tp in offsets.topic_partitions if tp.offset >= 0}

    assert committed_topics() == {kept, dropped}
    out = weir("group", "delete-offsets", group, "--topic", dropped, bootstrap=broker.bootstrap).stdout
    assert out == f"deleted the committed offsets of group '{group}' for topic '{dropped}' (2 partition(s))\n"
    assert committed_topics() == {kept}
    # Through the admin API too; an unknown topic is named.
    deleted = json_lines(weir("group", "delete-offsets", group, "--topic", kept, "--json",
                              admin=broker.admin_url()).stdout)[0]
    assert deleted == {"group_id": group, "topic": kept, "partitions": [0, 1]}
    assert committed_topics() == set()
    for path in ({"bootstrap": broker.bootstrap}, {"admin": broker.admin_url()}):
        missing = weir("group", "delete-offsets", group, "--topic", unique("none"), check=False, **path)
        assert missing.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in missing.stderr, (path, missing.stderr)


def test_delete_offsets_is_refused_while_a_member_subscribes_to_the_topic(broker):
    admin = c_admin(broker.bootstrap)
    topic, group = unique("busy"), unique("g")
    c_create_topic(admin, topic, partitions=1)
    member = c_consumer(broker.bootstrap, group)
    member.subscribe([topic])
    try:
        wait_until(lambda: (member.poll(0.1), group_members(admin, group))[1], what="the member joined")
        for path in ({"bootstrap": broker.bootstrap}, {"admin": broker.admin_url()}):
            done = weir("group", "delete-offsets", group, "--topic", topic, check=False, **path)
            assert done.returncode == 1 and "GROUP_SUBSCRIBED_TO_TOPIC" in done.stderr, (path, done.stderr)
    finally:
        member.close()


def test_one_bootstrap_node_reaches_every_leader_and_the_coordinator_of_a_cluster(cluster):
    """Partitions led by three brokers and a group coordinated by whichever one holds its
    __consumer_offsets partition: each command given one node finds the rest itself."""
    topic, group = unique("rf3"), unique("g")
    node = {i: cluster.node(i).bootstrap for i in (1, 2, 3)}
    weir("topic", "create", topic, "--partitions", "3", "--replication-factor", "3", bootstrap=node[1])
    leaders = cluster.wait_topic(topic, 3)
    assert sorted(leaders.values()) == [1, 2, 3], leaders
    lines = [f"v{i}" for i in range(30)]
    weir("produce", topic, bootstrap=node[2], stdin="\n".join(lines) + "\n")
    consumed = json_lines(weir("consume", topic, "--group", group, "--from-beginning", "--max-messages", "30",
                               "--timeout", "10", "--json", bootstrap=node[3]).stdout)
    assert sorted(r["value"] for r in consumed) == sorted(lines)
    assert {r["partition"] for r in consumed} == {0, 1, 2}
    desc = json_lines(weir("group", "describe", group, "--json", bootstrap=node[1]).stdout)[0]
    assert desc["total_lag"] == 0 and sum(o["committed_offset"] for o in desc["offsets"]) == 30, desc
    described = json_lines(weir("topic", "describe", topic, "--json", bootstrap=node[2]).stdout)[0]
    assert {p["partition"]: p["leader"] for p in described["partitions"]} == leaders, described
    assert all(sorted(p["isr"]) == [1, 2, 3] for p in described["partitions"]), described


def test_group_describe_lists_rocketmq_consumers_with_their_subscriptions(broker):
    """As `mqadmin consumerConnection`: each connected RocketMQ consumer with its host, type,
    language, version, and each subscribed topic with its filter expression."""
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

    topic, group = unique("rmq-conn"), unique("g")
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=1)
    config = ClientConfiguration(broker.rocketmq_endpoint, Credentials(), request_timeout=10)
    consumer = SimpleConsumer(config, group, {topic: FilterExpression("TagA || TagB")}, await_duration=1)
    consumer.startup()
    try:
        def described():
            done = weir("group", "describe", group, "--json", admin=broker.admin_url(), check=False)
            members = json_lines(done.stdout)[0]["members"] if done.returncode == 0 else []
            return members if members and members[0].get("subscriptions") else None

        [member] = wait_until(described, what="the consumer's subscription is known")
        assert member["client_type"] == "SimpleConsumer", member
        assert member["language"] == "PYTHON" and member["version"], member
        assert member["subscriptions"] == {topic: "TagA || TagB"}, member
        assert member["client_host"].startswith("127.0.0.1:"), member
        table = weir("group", "describe", group, admin=broker.admin_url()).stdout
        header = next(line for line in table.splitlines() if line.startswith("CLIENT-ID"))
        assert header.split() == ["CLIENT-ID", "HOST", "TYPE", "LANGUAGE", "VERSION", "SUBSCRIPTIONS"], table
        row = next(line for line in table.splitlines() if line.startswith(member["client_id"]))
        assert row.split()[2:4] == ["SimpleConsumer", "PYTHON"], table
        assert row.endswith(f"{topic} (TagA || TagB)"), table
    finally:
        consumer.shutdown()


def test_dead_letters_are_resent_to_the_partition_they_died_in(broker):
    """A RocketMQ group gives up on two messages (one delivery allowed); `weir group
    resend-dead-letters` appends them to their topic again, without the headers that said where
    they died, and a second resend from where the first ended finds nothing."""
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

    topic, group = unique("rmq-dead"), unique("g")
    admin_url = broker.admin_url()
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=2)
    weir("group", "create", group, "--max-delivery-attempts", "1", admin=admin_url)
    producer = c_producer(broker.bootstrap)
    c_produce(producer, topic, [{"value": b"poison-0", "partition": 0}, {"value": b"poison-1", "partition": 1}])
    config = ClientConfiguration(broker.rocketmq_endpoint, Credentials(), request_timeout=10)
    consumer = SimpleConsumer(config, group, {topic: FilterExpression("*")}, await_duration=1)
    consumer.startup()
    dead_letters = f"%DLQ%{group}"
    try:
        got = []
        wait_until(lambda: got.extend(consumer.receive(16, 1)) or len(got) >= 2, what="both delivered once")

        def dead():
            done = weir("topic", "describe", dead_letters, "--json", bootstrap=broker.bootstrap, check=False)
            return done.returncode == 0 and json_lines(done.stdout)[0]["partitions"][0]["high_watermark"] == 2

        wait_until(dead, what="both dead-lettered after their one delivery")
    finally:
        consumer.shutdown()

    out = weir("group", "resend-dead-letters", group, admin=admin_url).stdout
    assert out.splitlines()[0] == f"resent 2 dead letter(s) of group '{group}': 2 to '{topic}'", out
    assert out.splitlines()[-1].endswith("the next resend begins at --from-offset 2"), out
    records = json_lines(weir("consume", topic, "--from-beginning", "--max-messages", "4", "--timeout", "10",
                              "--json", bootstrap=broker.bootstrap).stdout)
    again = [r for r in records if r["offset"] >= 1]
    assert sorted((r["partition"], r["value"]) for r in again) == [(0, "poison-0"), (1, "poison-1")], records
    assert not any(name.startswith("weir.origin") or name == "weir.delivery-attempts"
                   for r in again for name, _ in r["headers"]), again
    none = json_lines(weir("group", "resend-dead-letters", group, "--from-offset", "2", "--json",
                           admin=admin_url).stdout)[0]
    assert none["resent"] == {} and none["next_offset"] == 2, none
    over_kafka = weir("group", "resend-dead-letters", group, bootstrap=broker.bootstrap, check=False)
    assert over_kafka.returncode == 1 and "admin HTTP API" in over_kafka.stderr, over_kafka.stderr
    unknown = weir("group", "resend-dead-letters", unique("never"), admin=admin_url, check=False)
    assert unknown.returncode == 1 and "has no dead letters" in unknown.stderr, unknown.stderr


def test_a_group_member_keeps_consuming_when_a_broker_dies(cluster_factory):
    """`weir consume --group` through node 1 while node 3, which leads a partition (and may
    coordinate the group), is killed: it finds the new leaders and coordinator and prints every
    record produced after the kill. With --from-beginning: a kill before its first commit loses
    the group's position, and without commits a member starts where --from-beginning says (the
    end, by default, would skip what was produced meanwhile, as auto.offset.reset=latest does)."""
    cluster = cluster_factory(voters=3)
    topic, group = unique("survive"), unique("g")
    node1 = cluster.node(1).bootstrap
    weir("topic", "create", topic, "--partitions", "3", "--replication-factor", "3", bootstrap=node1)
    cluster.wait_topic(topic, 3)
    admin = c_admin(node1)
    cli = CliMember(node1, topic, group, "--from-beginning")
    try:
        wait_until(lambda: group_members(admin, group) == {"weir-cli": {0, 1, 2}}, what="the CLI owns every partition")
        cluster.node(3).kill9()
        producer = c_producer(node1, {"acks": "all"})
        values = [f"after-{i}" for i in range(30)]
        c_produce(producer, topic, [{"value": v.encode(), "partition": i % 3} for i, v in enumerate(values)])
        deadline = time.monotonic() + 45
        while not set(values) <= cli.values() and cli.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        printed = set(values) <= cli.values()
    finally:
        code, stderr = cli.stop()
    assert printed and set(values) <= cli.values(), (sorted(set(values) - cli.values()), stderr)
    assert code == 130, stderr
