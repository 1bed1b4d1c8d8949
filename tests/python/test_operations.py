"""The everyday operator tasks through the `weir` CLI and the admin API, against a real
four-node cluster (three combined nodes and broker-only node 4), shared by the module's tests:
`weir cluster health`, `weir topic describe`'s ISR and replica lag, `weir partition elect`,
`weir partition trim`, `weir partition reassign --generate`, `weir cluster config` (with
confluent-kafka's IncrementalAlterConfigs and DescribeConfigs on the same configs),
`weir cluster decommission` and `weir cluster unregister`.

Each command is asked of a node that is not the partition's leader (or not the controller), so
what the CLI shows is what the cluster says, not what one node happens to host. The tests run
in file order: the one that stops broker 4 brings it back, and decommissioning it comes last.
Every wait is bounded.
"""

import json
import subprocess
import time

import pytest
from confluent_kafka import KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, ResourceType

from kafka.protocol.admin import DeleteRecordsRequest

from cluster import Cluster
from conftest import _ALL_BROKERS, weir_bin
from helpers import c_consumer, c_producer, http, unique
from test_replication import REPLICATION_SETTINGS, create_replicated, partition_states, produce

UNHEALTHY_EXIT = 2
NOT_LEADER_OR_FOLLOWER = 6


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("weir-ops"), voters=3, brokers=1, settings=REPLICATION_SETTINGS)
    _ALL_BROKERS.extend(c.nodes.values())
    try:
        c.start()
        c.wait_formed()
        yield c
    finally:
        c.cleanup()
        for node in c.nodes.values():
            _ALL_BROKERS.remove(node)


def weir(cluster, *args, via=2, admin=None, timeout=90):
    """Runs the CLI against node `via`'s admin API; returns the CompletedProcess."""
    env = {"WEIR_ADMIN": admin or cluster.node(via).admin_url(), "PATH": "/usr/bin:/bin"}
    return subprocess.run([str(weir_bin()), *args], capture_output=True, text=True, env=env, timeout=timeout)


def health(cluster, via=3):
    """`GET /v1/cluster/health` of node `via`."""
    status, body = http("GET", f"{cluster.node(via).admin_url()}/v1/cluster/health")
    assert status == 200, body
    return body


def wait_healthy(cluster, timeout=40):
    return cluster.wait(lambda: health(cluster)["healthy"] and health(cluster), timeout, "a healthy cluster")


def describe(cluster, topic, via=1):
    status, body = http("GET", f"{cluster.node(via).admin_url()}/v1/topics/{topic}")
    assert status == 200, body
    return body


def replicas_on(cluster, broker, via=1):
    """Every partition (of every topic) with a replica on `broker`, as node `via`'s metadata says."""
    status, listed = http("GET", f"{cluster.node(via).admin_url()}/v1/topics")
    assert status == 200, listed
    found = []
    for t in listed["topics"]:
        for p in describe(cluster, t["name"], via=via)["partitions"]:
            if broker in p["replicas"]:
                found.append((t["name"], p["partition"]))
    return found


def test_a_healthy_cluster_reports_nothing_and_exits_0_and_admin_needs_no_scheme(four):
    """`weir cluster health` over `--admin host:port` (no http://): Healthy: true, every check
    at 0, exit 0; the JSON says the same."""
    topic = unique("healthy")
    create_replicated(four, topic, partitions=2, rf=3)
    wait_healthy(four)
    address = four.node(2).admin_url().removeprefix("http://")
    # Node 2 may apply the last ISR change a moment after node 3 did.
    shown = four.wait(
        lambda: (lambda run: run.returncode == 0 and run)(weir(four, "cluster", "health", "--admin", address)),
        15,
        "node 2 reporting healthy",
    )
    assert shown.stdout.startswith("Healthy: true\n"), shown.stdout
    rows = [line.split() for line in shown.stdout.splitlines()[2:]]
    assert len(rows) == 7 and all("0" in row and row[-1] == "-" for row in rows), shown.stdout
    as_json = json.loads(weir(four, "cluster", "health", "--json").stdout)
    assert as_json["healthy"] is True and as_json["fenced_brokers"] == [] and as_json["lagging_followers"] == []
    bad = weir(four, "cluster", "health", "--admin", "ftp://127.0.0.1:1")
    assert bad.returncode == 1 and "expected host:port" in bad.stderr, bad.stderr


def test_topic_describe_shows_the_isr_and_each_followers_lag(four):
    """Three replicas on 1, 2, 3 led by 1, asked of node 4 (which hosts none): the ISR and each
    follower's offsets behind the leader, 0 once they caught up."""
    topic = unique("lag")
    create_replicated(four, topic, assignment=[[1, 2, 3]])
    reports = produce(four.bootstrap(), topic, [f"m{i}".encode() for i in range(50)])
    assert all(err is None for err, _ in reports.values())

    def caught_up():
        [p] = describe(four, topic, via=4)["partitions"]
        lags = {lag["replica"]: lag["offsets_behind"] for lag in p["replica_lags"]}
        return lags == {2: 0, 3: 0} and p

    p = four.wait(caught_up, 20, "followers caught up")
    assert sorted(p["isr"]) == [1, 2, 3] and p["log_end_offset"] == 50, p
    assert all(lag["caught_up_ms_ago"] < 15_000 for lag in p["replica_lags"]), p
    shown = weir(four, "topic", "describe", topic, via=4)
    assert shown.returncode == 0, shown.stderr
    header, row = [line.split() for line in shown.stdout.splitlines() if line.startswith(("PARTITION", "0 "))]
    assert header[:5] == ["PARTITION", "LEADER", "REPLICAS", "ISR", "REPLICA-LAG"], header
    assert row[:5] == ["0", "1", "1,2,3", "1,2,3", "2:0,3:0"], row


def test_preferred_and_unclean_elections(four):
    """The preferred replica changes (a reassignment to the same brokers in another order), so
    a preferred election moves the leadership to it; a second one is not needed; an unclean
    election of a led partition is not needed either; an unknown partition is an error."""
    topic = unique("elect")
    create_replicated(four, topic, assignment=[[1, 2, 3]])
    status, body = http(
        "POST",
        f"{four.node(1).admin_url()}/v1/reassignments",
        {"version": 1, "partitions": [{"topic": topic, "partition": 0, "replicas": [2, 1, 3]}]},
    )
    assert status == 200 and "error" not in body["results"][0], body
    four.wait(lambda: describe(four, topic)["partitions"][0]["replicas"] == [2, 1, 3], 15, "the new order")
    assert describe(four, topic)["partitions"][0]["leader"] == 1

    elected = weir(four, "partition", "elect", "--topic", topic, "--partition", "0", via=3)
    assert elected.returncode == 0, elected.stderr
    assert "elected broker 2" in elected.stdout, elected.stdout
    four.wait(lambda: partition_states(four, topic)[0][0] == 2, 15, "broker 2 leading")

    again = weir(four, "partition", "elect", "--topic", topic, "--json", via=3)
    assert again.returncode == 0, again.stderr
    [result] = json.loads(again.stdout)["results"]
    assert result["error"]["code"] == "ELECTION_NOT_NEEDED", result
    wait_healthy(four)  # every preferred replica in sync: an election over all partitions has no failure
    everywhere = weir(four, "partition", "elect", "--json")
    assert everywhere.returncode == 0, everywhere.stderr
    assert all(r["topic"] != topic for r in json.loads(everywhere.stdout)["results"]), "led by its preferred already"
    unclean = weir(four, "partition", "elect", "--unclean", "--topic", topic, "--json")
    assert json.loads(unclean.stdout)["results"][0]["error"]["code"] == "ELECTION_NOT_NEEDED", unclean.stdout
    missing = weir(four, "partition", "elect", "--topic", topic, "--partition", "7")
    assert missing.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in missing.stderr, missing.stderr
    elections = f"{four.node(1).admin_url()}/v1/elections"
    for bad in ({"type": "dirty"}, {"type": "preferred", "partition": 0}):
        status, body = http("POST", elections, bad)
        assert (status, body["error"]["code"]) == (400, "INVALID_REQUEST"), (bad, status, body)


def test_trim_deletes_records_before_an_offset_then_before_a_time(four):
    """Ten records, the first five stamped two hours ago: trimming to offset 3 through a node
    that does not lead moves the log start to 3; `--before -1h` then to 5 (the first record
    stamped within the hour); consumers from the earliest offset start there. An offset past
    the high watermark is refused, and a bad time is refused before anything is sent."""
    topic = unique("trim")
    create_replicated(four, topic, assignment=[[3, 1]])
    now_ms = int(time.time() * 1000)
    producer = c_producer(four.bootstrap(), {"acks": "all"})
    for i in range(10):
        stamp = now_ms - 2 * 3600 * 1000 if i < 5 else now_ms
        producer.produce(topic, f"r{i}".encode(), partition=0, timestamp=stamp)
    assert producer.flush(30) == 0

    by_offset = weir(four, "partition", "trim", "--topic", topic, "--offset", "3", via=2)
    assert by_offset.returncode == 0, by_offset.stderr
    assert by_offset.stdout.splitlines()[1].split()[:4] == [topic, "0", "3", "trimmed"], by_offset.stdout
    by_time = weir(four, "partition", "trim", "--topic", topic, "--partition", "0", "--before", "-1h", "--json", via=2)
    assert by_time.returncode == 0, by_time.stderr
    assert json.loads(by_time.stdout)["results"] == [{"partition": 0, "low_watermark": 5}], by_time.stdout
    consumer = c_consumer(four.bootstrap())
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        assert (low, high) == (5, 10)
    finally:
        consumer.close()

    too_far = weir(four, "partition", "trim", "--topic", topic, "--offset", "99")
    assert too_far.returncode == 1 and "OFFSET_OUT_OF_RANGE" in too_far.stdout + too_far.stderr, too_far
    bad_time = weir(four, "partition", "trim", "--topic", topic, "--before", "yesterday")
    assert bad_time.returncode != 0 and "2026-12-01T00:00:00Z" in bad_time.stderr, bad_time.stderr
    older = weir(four, "partition", "trim", "--topic", topic, "--before", "2020-01-01T00:00:00Z", "--json")
    assert json.loads(older.stdout)["results"][0]["low_watermark"] == 5, "nothing that old is left"


def test_human_times_in_consume_and_group_reset_offsets(four):
    """Four records stamped two hours ago, then three now, over two partitions' worth of
    topic: `weir consume --from-time -1h` prints only the three new ones, and `weir group
    reset-offsets --to-datetime` with an RFC 3339 time an hour ago commits the first new
    offset."""
    topic = unique("times")
    create_replicated(four, topic, assignment=[[2, 3]])
    now_ms = int(time.time() * 1000)
    producer = c_producer(four.bootstrap(), {"acks": "all"})
    for i in range(7):
        producer.produce(topic, f"v{i}".encode(), partition=0, timestamp=now_ms - 7_200_000 if i < 4 else now_ms)
    assert producer.flush(30) == 0

    consumed = weir(four, "consume", topic, "--from-time", "-1h", "--max-messages", "3", "--timeout", "10", "--json")
    assert consumed.returncode == 0, consumed.stderr
    records = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert [(r["offset"], r["value"]) for r in records] == [(4, "v4"), (5, "v5"), (6, "v6")], records

    group = unique("g")
    hour_ago = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600))
    reset = weir(four, "group", "reset-offsets", group, "--topic", topic, "--to-datetime", hour_ago, "--json")
    assert reset.returncode == 0, reset.stderr
    described = json.loads(weir(four, "group", "describe", group, "--json").stdout)
    assert [(o["partition"], o["committed_offset"]) for o in described["offsets"]] == [(0, 4)], described


def test_delete_records_sent_to_a_follower_is_refused_and_trims_nothing(four):
    """Kafka's DeleteRecords sent to a follower gets NOT_LEADER_OR_FOLLOWER (a client then
    asks the leader), and the partition keeps its records (it used to trim the follower's own
    log and answer success)."""
    topic = unique("follower-trim")
    create_replicated(four, topic, assignment=[[1, 2]])
    reports = produce(four.bootstrap(), topic, [f"r{i}".encode() for i in range(5)])
    assert all(err is None for err, _ in reports.values())
    raw = four.raw(2)
    try:
        request = DeleteRecordsRequest[0](topics=[(topic, [(0, 3)])], timeout_ms=10_000)
        [(_, [(partition, low_watermark, error_code)])] = raw.request(request).topics
    finally:
        raw.close()
    assert (partition, error_code) == (0, NOT_LEADER_OR_FOLLOWER), (partition, low_watermark, error_code)
    [info] = describe(four, topic, via=2)["partitions"]
    assert info["log_start_offset"] == 0 and info["log_end_offset"] == 5, info


def test_generated_plans_move_nothing_until_executed(four, tmp_path):
    """`--generate --remove-brokers 1 --topics T` proposes replicas without broker 1 and starts
    nothing; `--balance` over a topic piled on brokers 1 and 2 spreads it to 3 and 4, and the
    written plan, executed with --plan --wait, lands where it said."""
    topic = unique("plan")
    create_replicated(four, topic, assignment=[[1, 2]] * 4)
    removed = weir(four, "partition", "reassign", "--generate", "--remove-brokers", "1", "--topics", topic)
    assert removed.returncode == 0, removed.stderr
    lines = removed.stdout.splitlines()
    assert lines[0] == "Current partition replica assignment" and lines[3].startswith("Proposed"), removed.stdout
    current, proposed = json.loads(lines[1]), json.loads(lines[4])
    assert [p["replicas"] for p in current["partitions"]] == [[1, 2]] * 4
    assert all(1 not in p["replicas"] and 2 in p["replicas"] for p in proposed["partitions"]), proposed
    assert [p["replicas"] for p in describe(four, topic)["partitions"]] == [[1, 2]] * 4, "nothing moved"

    plan_file = tmp_path / "balance.json"
    balanced = weir(four, "partition", "reassign", "--generate", "--balance", "--topics", topic, "--output", str(plan_file))
    assert balanced.returncode == 0, balanced.stderr
    plan = json.loads(plan_file.read_text())
    targets = {p["partition"]: p["replicas"] for p in plan["partitions"]}
    used = {b for replicas in targets.values() for b in replicas}
    assert used & {3, 4} and all(len(r) == 2 for r in targets.values()), plan
    executed = weir(four, "partition", "reassign", "--plan", str(plan_file), "--wait", "--timeout", "60")
    assert executed.returncode == 0, executed.stderr
    executed_via = 2  # --wait polled node 2; ask it, not a node that may apply the end a moment later

    def landed():
        now = {p["partition"]: p["replicas"] for p in describe(four, topic, via=executed_via)["partitions"]}
        return all(now[p] == replicas for p, replicas in targets.items())

    assert landed(), (describe(four, topic, via=executed_via)["partitions"], targets)
    refused = weir(four, "partition", "reassign", "--generate", "--remove-brokers", "9")
    assert refused.returncode == 1 and "broker 9" in refused.stderr, refused.stderr


def broker_config(admin, broker, name):
    """(value, source) of a broker config as DescribeConfigs of broker `broker` says."""
    resource = ConfigResource(ResourceType.BROKER, str(broker))
    entry = admin.describe_configs([resource])[resource].result(timeout=30)[name]
    return entry.value, ConfigSource(getattr(entry.source, "value", entry.source))


def test_dynamic_broker_configs_through_the_cli_and_kafkas_incremental_alter_configs(four):
    """A cluster-wide rate set with the CLI is what DescribeConfigs of broker 2 reports (as the
    dynamic default); one set on broker 3 with IncrementalAlterConfigs is what `weir cluster
    config get --broker 3` reports, and only for broker 3; deleting both brings the defaults
    back. A static config and an unregistered broker are refused with a clear error."""
    rate = "follower.replication.throttled.rate"
    admin = AdminClient({"bootstrap.servers": four.bootstrap()})
    try:
        set_all = weir(four, "cluster", "config", "set", f"{rate}=7000000")
        assert set_all.returncode == 0, set_all.stderr
        assert [rate, "7000000", "cluster"] in [line.split() for line in set_all.stdout.splitlines()], set_all.stdout
        assert broker_config(admin, 2, rate) == ("7000000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)

        on_three = ConfigResource(
            ResourceType.BROKER,
            "3",
            incremental_configs=[ConfigEntry(rate, "5000", incremental_operation=AlterConfigOpType.SET)],
        )
        admin.incremental_alter_configs([on_three])[on_three].result(timeout=30)

        def on_three_says():
            listed = json.loads(weir(four, "cluster", "config", "get", "--broker", "3", "--json").stdout)["configs"]
            return {"name": rate, "value": "5000", "source": "broker"} in listed

        # Node 2, asked here, applies the change a moment after the broker that answered it.
        four.wait(on_three_says, 15, "node 2 showing broker 3's own rate")
        two = json.loads(weir(four, "cluster", "config", "get", "--broker", "2", "--json").stdout)["configs"]
        assert {"name": rate, "value": "7000000", "source": "cluster"} in two, two
        assert broker_config(admin, 3, rate) == ("5000", ConfigSource.DYNAMIC_BROKER_CONFIG)

        static = weir(four, "cluster", "config", "set", "num.partitions=3")
        assert static.returncode == 1 and "cannot change while the broker runs" in static.stderr, static.stderr
        nobody = weir(four, "cluster", "config", "get", "--broker", "9")
        assert nobody.returncode == 1 and "broker 9 is not registered" in nobody.stderr, nobody.stderr
    finally:
        assert weir(four, "cluster", "config", "delete", rate, "--broker", "3").returncode == 0
        cleared = weir(four, "cluster", "config", "delete", rate, "--json")
    assert cleared.returncode == 0, cleared.stderr
    assert {"name": rate, "value": str(2**63 - 1), "source": "default"} in json.loads(cleared.stdout)["configs"]
    four.wait(lambda: broker_config(admin, 3, rate)[1] == ConfigSource.DEFAULT_CONFIG, 15, "broker 3 back to default")


def test_a_topic_default_set_at_run_time_applies_to_topics_without_an_override(four):
    """`message.max.bytes` set cluster-wide while the cluster runs: the topic's effective
    `max.message.bytes` follows (DescribeConfigs of the topic and of broker 1 say so), the
    leader refuses a record above it, and deleting it brings the old limit back. A value the
    topic config could not take is refused."""
    topic = unique("dyn")
    create_replicated(four, topic, assignment=[[1, 2]])
    big = [b"y" * 5000]
    admin = AdminClient({"bootstrap.servers": four.bootstrap()})

    def effective(via):
        configs = {c["name"]: c for c in describe(four, topic, via=via)["configs"]}
        return configs["max.message.bytes"]["value"]

    try:
        set_small = weir(four, "cluster", "config", "set", "message.max.bytes=2000")
        assert set_small.returncode == 0, set_small.stderr
        assert ["message.max.bytes", "2000", "cluster"] in [line.split() for line in set_small.stdout.splitlines()]
        four.wait(lambda: all(effective(n) == "2000" for n in (1, 2, 3, 4)), 15, "every node applied it")
        assert broker_config(admin, 1, "message.max.bytes") == ("2000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)
        # The leader applies the new default as it reconciles, a moment after its metadata.
        def refused():
            [(err, _)] = produce(four.bootstrap(), topic, big, retries=0).values()
            return err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE

        four.wait(refused, 15, "a 5000-byte record refused")
        bad = weir(four, "cluster", "config", "set", "log.retention.ms=soon")
        assert bad.returncode == 1 and "INVALID_CONFIG" in bad.stderr, bad.stderr
    finally:
        cleared = weir(four, "cluster", "config", "delete", "message.max.bytes")
    assert cleared.returncode == 0, cleared.stderr
    four.wait(lambda: effective(1) == "1048588", 15, "the static default back")
    four.wait(lambda: [e for e, _ in produce(four.bootstrap(), topic, big, retries=0).values()] == [None], 15, "accepted")


def test_a_stopped_broker_shows_as_fenced_with_its_partitions_under_replicated(four):
    """Broker 4 stops: health lists it fenced, its partitions under-replicated and, with
    min.insync.replicas=3, under min ISR, and its followers lagging; the CLI exits 2. Back, the
    cluster is healthy again."""
    topic = unique("down")
    create_replicated(four, topic, assignment=[[1, 4, 2]], config={"min.insync.replicas": "3"})
    wait_healthy(four)
    four.node(4).stop()
    try:

        def reported():
            h = health(four)
            names = lambda kind: {(p["topic"], p["partition"]) for p in h[kind]}  # noqa: E731
            lagging = {(f["topic"], f["replica"]) for f in h["lagging_followers"]}
            return (
                4 in h["fenced_brokers"]
                and (topic, 0) in names("under_replicated")
                and (topic, 0) in names("under_min_isr")
                and (topic, 4) in lagging
                and h
            )

        h = four.wait(reported, 30, "broker 4 reported down")
        assert h["healthy"] is False and h["leaderless"] == [], h
        shown = weir(four, "cluster", "health")
        assert shown.returncode == UNHEALTHY_EXIT, (shown.returncode, shown.stderr)
        assert shown.stdout.startswith("Healthy: false\n") and f"{topic}-0" in shown.stdout, shown.stdout
    finally:
        four.start([4])
    wait_healthy(four, timeout=60)


def test_turning_unclean_leader_election_on_at_run_time_elects_an_out_of_sync_replica(four):
    """A partition on brokers 4 and 3: broker 3 stops (the ISR is [4]), then broker 4, and
    broker 3 comes back out of sync: the partition has no leader. `weir cluster config set
    unclean.leader.election.enable=true` makes broker 3 its leader at once, and it takes writes
    again; with the config deleted, broker 4 comes back as a follower."""
    topic = unique("unclean")
    create_replicated(four, topic, assignment=[[4, 3]])
    wait_healthy(four)
    four.node(3).stop()
    try:
        four.wait(lambda: partition_states(four, topic, via=1)[0][2] == [4], 30, "ISR [4]")
        four.node(4).stop()
    finally:
        four.start([3])
    try:
        four.wait(lambda: 3 not in health(four, via=1)["fenced_brokers"], 30, "broker 3 back")
        time.sleep(1.0)  # a moment for anything that would elect it anyway (nothing should)
        assert partition_states(four, topic, via=1)[0][0] == -1, partition_states(four, topic, via=1)
        turned_on = weir(four, "cluster", "config", "set", "unclean.leader.election.enable=true", via=1)
        assert turned_on.returncode == 0, turned_on.stderr
        four.wait(lambda: partition_states(four, topic, via=2)[0][:3:2] == (3, [3]), 15, "broker 3 leading")
        four.wait(
            lambda: [e for e, _ in produce(four.bootstrap([1, 2, 3]), topic, [b"after"], retries=0).values()] == [None],
            15,
            "a write to the new leader",
        )
    finally:
        cleared = weir(four, "cluster", "config", "delete", "unclean.leader.election.enable", via=1)
        four.start([4])
    assert cleared.returncode == 0, cleared.stderr
    wait_healthy(four, timeout=60)


def test_decommissioning_a_broker_drains_it_under_a_throttle_then_it_is_removed(four):
    """Partitions with replicas on broker 4 and data in them: `weir cluster decommission 4`
    under a tight throttle starts the moves and health shows broker 4 draining; the throttle
    lifted, `--wait` (safe to repeat) reports the broker removable once nothing is on it and
    nothing is under-replicated, and every record is still there. Stopped, `weir cluster
    unregister 4` removes it and the cluster is healthy again."""
    topic = unique("drain")
    create_replicated(four, topic, assignment=[[4, 1], [2, 4], [4, 3]])
    values = [(b"x" * 2000) + str(i).encode() for i in range(300)]
    for partition in range(3):
        reports = produce(four.bootstrap(), topic, values, partition=partition)
        assert all(err is None for err, _ in reports.values())

    started = weir(four, "cluster", "decommission", "4", "--throttle", "20000", via=1)
    assert started.returncode == 0, started.stderr
    assert "off broker 4" in started.stdout, started.stdout
    # Asked of node 1, which answered the decommission once it had applied the moves.
    draining = [d for d in health(four, via=1)["draining_brokers"] if d["broker"] == 4]
    assert draining and draining[0]["moving_off"] >= 3, health(four, via=1)
    shown = weir(four, "cluster", "health", via=1)
    assert shown.returncode == UNHEALTHY_EXIT, "the copies are under-replicated meanwhile"
    draining_row = next(line for line in shown.stdout.splitlines() if line.startswith("Draining brokers"))
    assert draining_row.split()[2:4] == ["1", "4"], shown.stdout

    assert weir(four, "partition", "throttle", "--clear").returncode == 0
    done = weir(four, "cluster", "decommission", "4", "--wait", "--timeout", "90", via=3, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "broker 4 holds no replica and nothing is under-replicated" in done.stdout, done.stdout
    assert replicas_on(four, 4, via=3) == []
    h = health(four)
    assert h["under_replicated"] == [] and h["draining_brokers"] == [], h
    for partition in range(3):
        status, body = http(
            "GET",
            f"{four.node(2).admin_url()}/v1/topics/{topic}/partitions/{partition}/records?offset=0&max_records=1000",
        )
        assert status == 200 and len(body["records"]) == 300, (partition, status, len(body.get("records", [])))

    # Removing it (kafka-cluster.sh unregister): refused while it runs, and for a voter; once it
    # is stopped, it leaves the cluster and the health report.
    running = weir(four, "cluster", "unregister", "4", via=1)
    assert running.returncode == 1 and "broker 4 is running" in running.stderr, running.stderr
    voter = weir(four, "cluster", "unregister", "2", via=1)
    assert voter.returncode == 1 and "voter of the metadata quorum" in voter.stderr, voter.stderr
    four.node(4).stop()
    four.wait(lambda: 4 in health(four)["fenced_brokers"], 30, "broker 4 fenced")
    assert weir(four, "cluster", "health", via=1).returncode == UNHEALTHY_EXIT
    removed = weir(four, "cluster", "unregister", "4", via=2)
    assert removed.returncode == 0 and "broker 4 unregistered" in removed.stdout, removed.stderr
    h = wait_healthy(four)
    assert h["fenced_brokers"] == [], h
    status, info = http("GET", f"{four.node(3).admin_url()}/v1/cluster")
    assert status == 200 and [n["id"] for n in info["nodes"]] == [1, 2, 3], info
    again = weir(four, "cluster", "unregister", "4", via=3)
    assert again.returncode == 1 and "no broker 4 is registered" in again.stderr, again.stderr
