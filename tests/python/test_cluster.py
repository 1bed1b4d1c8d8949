"""Cluster mode with real processes: three (or five) `weir server` nodes on 127.0.0.1, each with
its own ports and data directory, and real clients (confluent-kafka, kafka-python, kcat).

What it proves: the nodes form one cluster that every node describes alike; admin requests
through any node are forwarded to the controller and their result reaches every node within a
second; partitions and their leaders are spread over the brokers and data round-trips through
them; consumer groups and transactions span brokers; and the cluster survives the faults a
real one sees: the controller killed (-9), a broker frozen past its session (SIGSTOP), the
majority of the quorum lost, and a restart of every node.

The topics here have one replica per partition (replication and failover are
test_replication.py's), so a partition is unavailable while its broker is down: the tests check
that it says so (LEADER_NOT_AVAILABLE) and that it comes back.

Timings are short (cluster.py: heartbeat 200 ms, session 2 s, election 600 ms) and every wait
is bounded. Figures (propagation, failover, fence and unfence times) are printed: run with -s
to see them.
"""

import json
import os
import shutil
import subprocess
import threading
import time
import uuid

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from kafka import TopicPartition as KpTopicPartition

from cluster import (
    LEADER_NOT_AVAILABLE,
    NO_LEADER,
    NONE,
    NOT_CONTROLLER,
    REQUEST_TIMED_OUT,
    SESSION_TIMEOUT_MS,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from conftest import weir_bin
from helpers import (
    c_consume,
    c_consumer,
    c_produce,
    c_producer,
    http,
    kp_admin,
    kp_consume,
    kp_consumer,
    read_isolated,
    unique,
)

KCAT = shutil.which("kcat")

# A transaction or group operation that the cluster cannot serve fails within this, not the
# suite's 30 s: the coordinators are the part of cluster mode most likely to be unfinished.
COORDINATOR_TIMEOUT_S = 20.0

# How long a new controller may take to accept a topic creation after the old one is killed:
# a session timeout (2 s) plus a few elections (600-1200 ms each), with room for a busy machine.
FAILOVER_BOUND_S = 10.0
# A frozen broker must be fenced once its session (2 s) expires, and unfenced once it
# heartbeats again; both with room for a busy machine.
FENCE_BOUND_S = SESSION_TIMEOUT_MS / 1000 + 6.0
UNFENCE_BOUND_S = 10.0


def figure(text):
    """A measured figure: printed (pytest -s shows it) in a form that is easy to grep."""
    print(f"\n[cluster figure] {text}", flush=True)


def controller_of(cluster, via=None):
    """The active controller, as a node's admin API reports it (Kafka's Metadata names the
    broker answering, which forwards to it)."""
    return cluster.active_controller(via)


def records_for(partitions, per_partition, tag):
    """Distinct, recognizable records for every partition: key, value and a header each."""
    return [
        {
            "partition": p,
            "key": f"k-{tag}-{p}-{i}".encode(),
            "value": f"v-{tag}-{p}-{i}-{uuid.uuid4().hex[:6]}".encode(),
            "headers": [("h", f"{p}:{i}".encode())],
        }
        for p in partitions
        for i in range(per_partition)
    ]


def by_partition(records):
    """[(key, value)] per partition, in order: what a reader of each partition must see."""
    out = {}
    for r in records:
        out.setdefault(r["partition"], []).append((r["key"], r["value"]))
    return out


def produce_acks_all(bootstrap, topic, records):
    producer = c_producer(bootstrap, {"acks": "all", "message.timeout.ms": 20000})
    try:
        return c_produce(producer, topic, records, flush_timeout=25)
    finally:
        producer.flush(5)


def kp_read_all(bootstrap, topic, partitions, n):
    """Every record of the given partitions with kafka-python: [(key, value)] per partition."""
    consumer = kp_consumer(bootstrap)
    try:
        tps = [KpTopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        got = kp_consume(consumer, n, timeout=25)
    finally:
        consumer.close(autocommit=False)
    out = {}
    for r in sorted(got, key=lambda r: (r.partition, r.offset)):
        out.setdefault(r.partition, []).append((r.key, r.value))
    return out


def kcat_read_all(bootstrap, topic):
    """Every record of the topic with kcat -C -e: [(key, value)] per partition."""
    assert KCAT is not None, "kcat is not installed (apt-get install kcat)"
    cmd = [KCAT, "-b", bootstrap, "-m", "10", "-C", "-t", topic, "-o", "beginning", "-e", "-J"]
    proc = subprocess.run(cmd, capture_output=True, timeout=40)
    assert proc.returncode == 0, f"{' '.join(cmd)}: exit {proc.returncode}\n{proc.stderr.decode(errors='replace')}"
    out = {}
    for line in proc.stdout.decode().splitlines():
        if line.strip():
            m = json.loads(line)
            out.setdefault(m["partition"], []).append((m["offset"], m["key"].encode(), m["payload"].encode()))
    return {p: [(k, v) for _, k, v in sorted(rs)] for p, rs in out.items()}


def create_until_it_works(cluster, via, timeout, partitions=1):
    """Asks node `via` to create a fresh topic again and again until one succeeds; returns
    (topic, seconds taken, [errors seen before]). Each attempt has its own name, so an attempt
    that failed for the client but was committed cannot be mistaken for the one that worked."""
    started = time.monotonic()
    errors = []
    while True:
        name = unique("again")
        client = None
        try:
            client = cluster.raw(via, timeout=5)
            code, message = client.create_topic(name, partitions, timeout_ms=5000, timeout=15)
        except (OSError, TimeoutError, ConnectionError) as e:
            code, message = None, repr(e)
        finally:
            if client is not None:
                client.close()
        elapsed = time.monotonic() - started
        if code == NONE:
            return name, elapsed, errors
        errors.append((round(elapsed, 2), code, message))
        assert elapsed < timeout, f"no topic creation through node {via} worked within {timeout}s: {errors}"
        time.sleep(0.1)


def led_by(leaders, node_id):
    return sorted(p for p, l in leaders.items() if l == node_id)


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


# -- a healthy cluster -------------------------------------------------------------------------


def test_three_nodes_form_one_cluster_that_every_node_describes_alike(cluster):
    """Three processes given the same voters form one cluster: each node's Metadata lists the
    three brokers with their advertised host:port and the same cluster id, and names the node
    itself as the controller (as a KRaft broker names a live broker, which forwards to the
    active controller); confluent-kafka's describe_cluster()/list_topics(), kafka-python's
    describe_cluster() and kcat -L, bootstrapped from each node alone, say the same. Every
    node's admin API names the same active controller, a voter."""
    expected = cluster.expected_brokers()
    assert sorted(expected) == [1, 2, 3]
    views = cluster.views()
    cluster_ids = {v.cluster_id for v in views.values()}
    for node_id, view in views.items():
        assert view.brokers == expected, f"node {node_id} lists {view.brokers}"
        assert view.controller_id == node_id, f"node {node_id} names {view.controller_id} as the controller"
    assert len(cluster_ids) == 1 and all(cluster_ids), f"cluster ids seen: {cluster_ids}"
    [cluster_id] = cluster_ids
    actives = {controller_of(cluster, i) for i in (1, 2, 3)}
    assert len(actives) == 1 and actives <= {1, 2, 3}, f"active controllers seen: {actives}"
    [active] = actives

    for node in cluster.live():
        me = node.node_id
        admin = AdminClient({"bootstrap.servers": node.bootstrap})
        d = admin.describe_cluster(request_timeout=10).result(timeout=15)
        assert d.cluster_id == cluster_id
        assert d.controller.id == me
        assert {n.id: (n.host, n.port) for n in d.nodes} == expected
        md = admin.list_topics(timeout=10)
        assert {b.id: (b.host, b.port) for b in md.brokers.values()} == expected
        assert md.controller_id == me and md.cluster_id == cluster_id

        kp = kp_admin(node.bootstrap)
        try:
            kd = kp.describe_cluster()
        finally:
            kp.close()
        assert {b["node_id"]: (b["host"], b["port"]) for b in kd["brokers"]} == expected
        assert kd["controller_id"] == me and kd["cluster_id"] == cluster_id

        assert KCAT is not None, "kcat is not installed"
        out = subprocess.run([KCAT, "-b", node.bootstrap, "-m", "10", "-L", "-J"], capture_output=True, timeout=30)
        assert out.returncode == 0, out.stderr.decode(errors="replace")
        kc = json.loads(out.stdout)
        assert sorted(b["id"] for b in kc["brokers"]) == [1, 2, 3]
        assert {b["id"]: b["name"] for b in kc["brokers"]} == {i: f"{h}:{p}" for i, (h, p) in expected.items()}
        assert kc["controllerid"] == me
    figure(f"formed: active controller {active}, cluster id {cluster_id}")


def test_topic_created_through_a_follower_spreads_leaders_and_round_trips_with_every_client(cluster):
    """CreateTopics sent to a node that is not the controller is forwarded: the topic's six
    partitions appear on every node, led two by each broker. Records produced with acks=all to
    every partition (confluent-kafka, bootstrapped from one node) read back byte for byte with
    kafka-python and kcat. CreatePartitions, AlterConfigs and DeleteTopics through
    non-controllers work and reach every node, and so do confluent-kafka's own
    create_partitions() and delete_records() (sent to each partition's leader)."""
    controller = controller_of(cluster)
    followers = [i for i in cluster.ids() if i != controller]
    name = unique("spread")
    leaders = cluster.create_topic(followers[0], name, 6)
    for node_id in (1, 2, 3):
        assert len(led_by(leaders, node_id)) == 2, f"two leaders per broker: {leaders}"

    records = records_for(range(6), 20, "a")
    delivered = produce_acks_all(cluster.node(followers[0]).bootstrap, name, records)
    assert sorted({p for p, _ in delivered}) == list(range(6))
    expected = by_partition(records)
    assert kp_read_all(cluster.node(controller).bootstrap, name, range(6), len(records)) == expected
    assert kcat_read_all(cluster.node(followers[1]).bootstrap, name) == expected

    # CreatePartitions through the other non-controller: 6 -> 9, every node sees 9 led ones.
    client = cluster.raw(followers[1])
    try:
        code, message = client.create_partitions(name, 9)
    finally:
        client.close()
    assert code == NONE, f"CreatePartitions through node {followers[1]}: {code} {message}"
    leaders = cluster.wait_topic(name, 9)
    assert set(leaders.values()) == {1, 2, 3}, leaders
    # confluent-kafka's client path (it sends admin requests to the controller it is told of).
    admin = AdminClient({"bootstrap.servers": cluster.node(followers[1]).bootstrap})
    admin.create_partitions([NewPartitions(name, 12)], request_timeout=15)[name].result(timeout=20)
    cluster.wait_topic(name, 12)
    more = records_for(range(6, 12), 5, "b")
    produce_acks_all(cluster.bootstrap(), name, more)
    assert kcat_read_all(cluster.node(followers[0]).bootstrap, name) == {**expected, **by_partition(more)}

    # DeleteRecords: the admin client sends each partition's part to its leader, wherever it is.
    doomed = [TopicPartition(name, p, 2) for p in range(6)]
    deleted = admin.delete_records(doomed, request_timeout=15)
    for tp, future in deleted.items():
        assert future.result(timeout=20).low_watermark == 2, tp
    remaining = kcat_read_all(cluster.node(followers[0]).bootstrap, name)
    assert {p: remaining[p] for p in range(6)} == {p: expected[p][2:] for p in range(6)}

    # AlterConfigs through a non-controller: every node describes the new value.
    client = cluster.raw(followers[0])
    try:
        code, message = client.alter_topic_configs(name, {"retention.ms": "123456789"})
    finally:
        client.close()
    assert code == NONE, f"AlterConfigs through node {followers[0]}: {code} {message}"

    def altered_everywhere():
        for i in cluster.ids():
            c = cluster.raw(i)
            try:
                if c.topic_configs(name).get("retention.ms") != "123456789":
                    return False
            finally:
                c.close()
        return True

    cluster.wait(altered_everywhere, 10, f"retention.ms of {name} altered on every node")

    # DeleteTopics through a non-controller: gone from every node.
    client = cluster.raw(followers[1])
    try:
        assert client.delete_topic(name) == NONE
    finally:
        client.close()

    def gone_everywhere():
        return all(
            cluster.metadata(i, [name]).topics[name].error_code == UNKNOWN_TOPIC_OR_PARTITION for i in cluster.ids()
        )

    cluster.wait(gone_everywhere, 10, f"topic {name} deleted on every node")


def test_the_http_api_and_the_cli_produce_and_consume_through_any_node(cluster):
    """The admin HTTP API of any node reaches partitions led by the others: keyless records
    POSTed to node 1 land on all six partitions (led by three brokers); GET through node 2
    returns every one of them, a partition led by node 3 reads through node 1, a max_records
    cap across brokers resumes without losing or repeating a record, and a long poll through
    node 2 wakes for a record appended at another leader. `weir produce` and `weir consume`
    against one node do the same."""
    name = unique("http")
    leaders = cluster.create_topic(1, name, 6)
    assert set(leaders.values()) == {1, 2, 3}, leaders
    base = {i: cluster.node(i).admin_url() for i in (1, 2, 3)}
    values = [f"v{i}" for i in range(60)]
    status, produced = http("POST", f"{base[1]}/v1/topics/{name}/records", {"records": [{"value": v} for v in values]})
    assert status == 200, produced
    assert all(o.get("error") is None and o["offset"] is not None for o in produced["offsets"]), produced
    assert {o["partition"] for o in produced["offsets"]} == set(range(6))

    status, read = http("GET", f"{base[2]}/v1/topics/{name}/records?max_records=1000&timeout_ms=5000")
    assert status == 200, read
    assert sorted(r["value"] for r in read["records"]) == sorted(values)
    assert {p["partition"]: (p["next_offset"], p["high_watermark"]) for p in read["partitions"]} == {
        p: (10, 10) for p in range(6)
    }
    remote = led_by(leaders, 3)[0]
    status, one = http("GET", f"{base[1]}/v1/topics/{name}/partitions/{remote}/records?offset=earliest")
    assert status == 200, one
    assert len(one["records"]) == 10 and one["high_watermark"] == 10 and one["next_offset"] == 10

    # A cap across brokers: page through with the positions each answer gives.
    seen, offsets = [], ",".join(f"{p}:earliest" for p in range(6))
    for _ in range(30):
        status, page = http("GET", f"{base[2]}/v1/topics/{name}/records?max_records=7&offsets={offsets}")
        assert status == 200 and len(page["records"]) <= 7, page
        if not page["records"]:
            break
        seen.extend((r["partition"], r["offset"]) for r in page["records"])
        offsets = ",".join(f"{p['partition']}:{p['next_offset']}" for p in page["partitions"])
    assert sorted(seen) == sorted((p, o) for p in range(6) for o in range(10)), "every record exactly once"

    # A long poll through node 2 over every partition wakes for a record at a remote leader.
    ends = ",".join(f"{p}:10" for p in range(6))
    producer = c_producer(cluster.bootstrap(), {"acks": "all"})
    started = time.monotonic()
    poll = {}

    def long_poll():
        poll["answer"] = http("GET", f"{base[2]}/v1/topics/{name}/records?offsets={ends}&timeout_ms=20000")

    reader = threading.Thread(target=long_poll)
    reader.start()
    time.sleep(0.5)
    producer.produce(name, value=b"late", partition=remote)
    producer.flush(10)
    reader.join(30)
    status, late = poll["answer"]
    assert status == 200 and [r["value"] for r in late["records"]] == ["late"], late
    assert time.monotonic() - started < 15, "the long poll did not wake for the record"

    # The CLI, against node 3 only.
    env = {**os.environ, "WEIR_ADMIN": base[3]}
    cli = str(weir_bin())
    lines = "".join(f"cli{i}\n" for i in range(12))
    subprocess.run([cli, "produce", name], input=lines, text=True, env=env, check=True, timeout=60)
    out = subprocess.run(
        [cli, "consume", name, "--from-beginning", "--max-messages", "73", "--timeout", "10", "--json"],
        capture_output=True, text=True, env=env, check=True, timeout=60,
    ).stdout
    consumed = [json.loads(line)["value"] for line in out.splitlines() if line.strip()]
    assert sorted(consumed) == sorted(values + ["late"] + [f"cli{i}" for i in range(12)])


def test_the_http_api_and_the_cli_reach_the_leaders_of_a_topic_every_node_replicates(cluster):
    """A topic of three replicas on three nodes: every node holds every partition, leading a
    third and following the rest. Through each node, `weir produce` writes to every partition,
    `GET .../records` and `weir consume` read every record, and `weir topic describe` shows
    the leaders' offsets: a node forwards to the leader whenever it is not the leader, not only
    when it holds no replica."""
    name = unique("rf3")
    cli = str(weir_bin())
    base = {i: cluster.node(i).admin_url() for i in (1, 2, 3)}
    env = {i: {**os.environ, "WEIR_ADMIN": base[i]} for i in (1, 2, 3)}
    subprocess.run([cli, "topic", "create", name, "--partitions", "3", "--replication-factor", "3"],
                   env=env[1], check=True, capture_output=True, timeout=60)
    leaders = cluster.wait_topic(name, 3)
    assert sorted(leaders.values()) == [1, 2, 3], leaders
    sent = []
    for via in (1, 2, 3):
        lines = [f"n{via}-{i}" for i in range(9)]
        done = subprocess.run([cli, "produce", name], input="".join(f"{v}\n" for v in lines), text=True,
                              env=env[via], capture_output=True, timeout=60)
        assert done.returncode == 0, f"weir produce through node {via}: {done.stderr}"
        sent += lines
    for via in (1, 2, 3):
        status, read = http("GET", f"{base[via]}/v1/topics/{name}/records?max_records=1000&timeout_ms=5000")
        assert status == 200, (via, read)
        assert sorted(r["value"] for r in read["records"]) == sorted(sent), via
        assert {r["partition"] for r in read["records"]} == {0, 1, 2}, via
        out = subprocess.run(
            [cli, "consume", name, "--from-beginning", "--max-messages", str(len(sent)), "--timeout", "10", "--json"],
            capture_output=True, text=True, env=env[via], timeout=60,
        )
        assert out.returncode == 0, f"weir consume through node {via}: {out.stderr}"
        assert sorted(json.loads(line)["value"] for line in out.stdout.splitlines() if line.strip()) == sorted(sent)
        described = subprocess.run([cli, "topic", "describe", name, "--json"], capture_output=True, text=True,
                                   env=env[via], check=True, timeout=60).stdout
        partitions = [p for line in described.splitlines() if line.strip()
                      for p in json.loads(line).get("partitions", [])]
        assert sum(p["high_watermark"] for p in partitions) == len(sent), (via, described)
        assert {p["partition"]: p["leader"] for p in partitions} == leaders, (via, described)


def test_the_http_api_answers_for_a_group_through_any_node(cluster, closer):
    """A consumer group, coordinated by whichever broker leads its __consumer_offsets partition,
    is described (with the lag of partitions led by every broker), listed, reset (to earliest
    and by timestamp) and deleted through each node's admin API alike: a node that is not the
    coordinator forwards the request to it."""
    name = unique("hg")
    cluster.create_topic(2, name, 6)
    produce_acks_all(cluster.bootstrap(), name, records_for(range(6), 10, "g"))
    group = unique("g")
    consumer = closer.add(c_consumer(cluster.bootstrap(), group, {"session.timeout.ms": 6000}))
    consumer.subscribe([name])
    assert len(c_consume(consumer, 60, timeout=COORDINATOR_TIMEOUT_S)) == 60
    consumer.commit(asynchronous=False)
    consumer.close()
    base = {i: cluster.node(i).admin_url() for i in (1, 2, 3)}

    def described(via):
        status, body = http("GET", f"{base[via]}/v1/groups/{group}")
        assert status == 200, (via, body)
        return {(o["topic"], o["partition"]): (o["committed_offset"], o["lag"]) for o in body["offsets"]}, body

    for via in (1, 2, 3):
        offsets, body = described(via)
        assert offsets == {(name, p): (10, 0) for p in range(6)}, (via, body)
        status, listed = http("GET", f"{base[via]}/v1/groups")
        assert status == 200 and group in [g["group_id"] for g in listed["groups"]], (via, listed)

    status, reset = http("POST", f"{base[1]}/v1/groups/{group}/reset-offsets", {"to": "earliest"})
    assert status == 200 and {o["new_offset"] for o in reset["offsets"]} == {0}, reset
    assert described(2)[0] == {(name, p): (0, 10) for p in range(6)}
    status, reset = http("POST", f"{base[3]}/v1/groups/{group}/reset-offsets", {"to": {"timestamp": 0}, "dry_run": True})
    assert status == 200 and {o["new_offset"] for o in reset["offsets"]} == {0}, reset

    status, deleted = http("DELETE", f"{base[2]}/v1/groups/{group}")
    assert status == 200, deleted
    for via in (1, 2, 3):
        status, body = http("GET", f"{base[via]}/v1/groups/{group}")
        assert status == 404, (via, body)


def test_an_http_read_of_a_topic_skips_the_partitions_of_a_broker_that_is_down(cluster_factory):
    """With one broker killed, a read of the whole topic through another node's admin API still
    returns every record of the partitions that have a live leader; the dead broker's
    partitions carry an error in their positions instead of failing the request."""
    cluster = cluster_factory()
    name = unique("down")
    leaders = cluster.create_topic(1, name, 6)
    records = records_for(range(6), 5, "d")
    produce_acks_all(cluster.bootstrap(), name, records)
    base = cluster.node(1).admin_url()
    victim = 3
    cluster.node(victim).kill9()
    lost = set(led_by(leaders, victim))
    for _ in range(2):  # before and after the controller fences it
        status, body = http("GET", f"{base}/v1/topics/{name}/records?max_records=1000&timeout_ms=1000")
        assert status == 200, body
        assert sorted(r["value"] for r in body["records"]) == sorted(
            r["value"].decode() for r in records if r["partition"] not in lost
        )
        failed = {p["partition"] for p in body["partitions"] if p.get("error")}
        assert failed == lost, body["partitions"]
        time.sleep(SESSION_TIMEOUT_MS / 1000 + 1)


def test_a_topic_created_through_any_node_is_visible_on_every_node_within_a_second(cluster):
    """Propagation of metadata: 21 topics created through each node in turn; after each
    CreateTopics answer, every node's Metadata is polled until it shows the topic with all its
    partitions led. The slowest node's lag behind the answer stays under 1 s every time (the
    max is the p99 of so few samples); p50/p99 are printed."""
    ids = cluster.ids()
    clients = {i: cluster.raw(i) for i in ids}
    lags, creates, slow = [], [], []
    try:
        for k in range(21):
            via = ids[k % len(ids)]
            name = unique("prop")
            started = time.monotonic()
            code, message = clients[via].create_topic(name, 3)
            answered = time.monotonic()
            assert code == NONE, f"CreateTopics through node {via}: {code} {message}"
            creates.append(answered - started)
            pending, seen = set(ids), {}
            while pending and time.monotonic() < answered + 5:
                for i in sorted(pending):
                    t = clients[i].metadata([name]).topics.get(name)
                    if t and t.error_code == NONE and len(t.partitions) == 3:
                        if all(p.leader != NO_LEADER for p in t.partitions.values()):
                            seen[i] = time.monotonic() - answered
                            pending.discard(i)
                time.sleep(0.002)
            assert not pending, f"topic {name} not visible on nodes {sorted(pending)} 5 s after it was created"
            slowest = max(seen, key=seen.get)
            lags.append(seen[slowest])
            slow.append((round(seen[slowest] * 1000, 1), f"via {via}, seen last on {slowest}"))
    finally:
        for c in clients.values():
            c.close()
    p50, p99 = percentile(lags, 0.5) * 1000, max(lags) * 1000
    figure(
        f"propagation over {len(lags)} creations: slowest node sees the topic p50 {p50:.1f} ms, "
        f"p99 (max) {p99:.1f} ms after the CreateTopics answer; CreateTopics itself p50 "
        f"{percentile(creates, 0.5) * 1000:.1f} ms, max {max(creates) * 1000:.1f} ms; slowest samples "
        f"(ms): {sorted(slow, reverse=True)[:3]}"
    )
    assert max(lags) < 1.0, f"propagation lags (s): {sorted(lags)}"


def test_a_consumer_group_spanning_brokers_commits_and_a_new_member_resumes(cluster, closer):
    """A confluent-kafka consumer group reads a six-partition topic whose partitions are led by
    all three brokers (its coordinator on whichever broker leads the group's offsets
    partition), commits, and leaves; a new member of the group, bootstrapped from another
    node, reads exactly the records produced after the commit, and committed() shows the
    offsets on every node's view of the group."""
    name = unique("grp")
    leaders = cluster.create_topic(1, name, 6)
    assert set(leaders.values()) == {1, 2, 3}, leaders
    first = records_for(range(6), 10, "first")
    produce_acks_all(cluster.bootstrap(), name, first)

    group = unique("g")
    conf = {"session.timeout.ms": 6000, "socket.timeout.ms": 10000}
    c1 = closer.add(c_consumer(cluster.node(1).bootstrap, group, conf))
    c1.subscribe([name])
    got = c_consume(c1, len(first), timeout=COORDINATOR_TIMEOUT_S)
    assert sorted(r.value for r in got) == sorted(r["value"] for r in first)
    c1.commit(asynchronous=False)
    committed = c1.committed([TopicPartition(name, p) for p in range(6)], timeout=10)
    assert {tp.partition: tp.offset for tp in committed} == {p: 10 for p in range(6)}
    c1.close()

    second = records_for(range(6), 5, "second")
    produce_acks_all(cluster.bootstrap(), name, second)
    for node in cluster.live():
        # The committed offsets, as a group-less look-up bootstrapped from each node sees them.
        probe = closer.add(Consumer({"bootstrap.servers": node.bootstrap, "group.id": group}))
        seen = probe.committed([TopicPartition(name, p) for p in range(6)], timeout=COORDINATOR_TIMEOUT_S)
        assert {tp.partition: tp.offset for tp in seen} == {p: 10 for p in range(6)}, f"via node {node.node_id}"
        probe.close()
    c2 = closer.add(c_consumer(cluster.node(2).bootstrap, group, conf))
    c2.subscribe([name])
    resumed = c_consume(c2, len(second), timeout=COORDINATOR_TIMEOUT_S)
    assert sorted(r.value for r in resumed) == sorted(r["value"] for r in second)
    assert all(r.offset >= 10 for r in resumed)
    extra = c2.poll(1.0)
    assert extra is None or extra.error() is not None, f"read past the new records: {extra.value()}"


def test_transactions_spanning_brokers_show_exactly_the_committed_records(cluster, closer):
    """A transactional confluent-kafka producer writes to six partitions led by three brokers:
    a committed transaction, an aborted one, another committed one. A read_committed consumer
    sees exactly the committed records (in every partition), a read_uncommitted one sees the
    aborted ones too: the transaction coordinator's markers reached every leader."""
    name = unique("txn")
    leaders = cluster.create_topic(2, name, 6)
    assert set(leaders.values()) == {1, 2, 3}, leaders
    producer = closer.add(
        c_producer(cluster.node(3).bootstrap, {"transactional.id": unique("tx"), "linger.ms": 1})
    )
    producer.init_transactions(COORDINATOR_TIMEOUT_S)
    producer.begin_transaction()
    for i in range(12):
        producer.produce(name, value=f"c{i}".encode(), partition=i % 6)
    producer.commit_transaction(COORDINATOR_TIMEOUT_S)
    producer.begin_transaction()
    for i in range(12):
        producer.produce(name, value=f"a{i}".encode(), partition=i % 6)
    producer.flush(COORDINATOR_TIMEOUT_S)
    producer.abort_transaction(COORDINATOR_TIMEOUT_S)
    producer.begin_transaction()
    for i in range(6):
        producer.produce(name, value=f"z{i}".encode(), partition=i)
    producer.commit_transaction(COORDINATOR_TIMEOUT_S)

    committed = read_isolated(cluster.node(1).bootstrap, name, 6, "read_committed", COORDINATOR_TIMEOUT_S)
    expected = [(i % 6, f"c{i}") for i in range(12)] + [(i, f"z{i}") for i in range(6)]
    assert sorted(committed) == sorted(expected)
    everything = read_isolated(cluster.node(2).bootstrap, name, 6, "read_uncommitted", COORDINATOR_TIMEOUT_S)
    assert sorted(everything) == sorted(expected + [(i % 6, f"a{i}") for i in range(12)])


# -- faults ------------------------------------------------------------------------------------


def test_killing_the_controller_elects_another_and_the_node_rejoins_from_its_data(cluster_factory):
    """kill -9 of the active controller: a topic creation through a surviving node works again
    within FAILOVER_BOUND_S (the time is printed); the killed broker is fenced and its
    partitions lose their leader. Restarted from its data directory, it rejoins: every node
    lists it, its partitions are led by it again with their data, and it knows the topics
    created while it was down."""
    cluster = cluster_factory()
    name = unique("before")
    leaders = cluster.create_topic(1, name, 6)
    records = records_for(range(6), 5, "pre")
    produce_acks_all(cluster.bootstrap(), name, records)

    controller = controller_of(cluster)
    survivors = [i for i in cluster.ids() if i != controller]
    mine = led_by(leaders, controller)
    assert len(mine) == 2, leaders
    cluster.node(controller).kill9()
    after, took, errors = create_until_it_works(cluster, survivors[0], FAILOVER_BOUND_S)
    figure(f"controller {controller} killed: a CreateTopics through node {survivors[0]} worked after {took:.2f} s "
           f"({len(errors)} failed attempts before: {errors[:3]})")
    def agreed_controller():
        seen = {controller_of(cluster, i) for i in survivors}
        return len(seen) == 1 and seen <= set(survivors) and seen.pop()

    cluster.wait(agreed_controller, 10, "the survivors to agree on a new controller")
    # Kafka clients are told of a live broker as the controller: the one they ask.
    for i in survivors:
        assert cluster.metadata(i).controller_id == i

    # The killed broker is fenced: its partitions have no leader on the survivors.
    def fenced():
        for i in survivors:
            view = cluster.metadata(i, [name])
            t = view.topics[name]
            if any(t.partitions[p].leader != NO_LEADER or t.partitions[p].error_code != LEADER_NOT_AVAILABLE
                   for p in mine):
                return False
        return True

    cluster.wait(fenced, FENCE_BOUND_S, f"broker {controller} fenced on the survivors")
    # It leaves the broker list a session timeout after its fencing (Broker::brokers_for_clients).
    cluster.wait(lambda: all(controller not in cluster.metadata(i).brokers for i in survivors),
                 FENCE_BOUND_S, f"broker {controller} off the survivors' broker lists")
    # A topic created now has its partitions on the survivors only.
    placed = cluster.create_topic(survivors[1], unique("while-down"), 4)
    assert set(placed.values()) <= set(survivors), placed

    started = time.monotonic()
    cluster.start([controller])
    cluster.wait_formed(timeout=15)
    back = cluster.wait_topic(name, 6, timeout=UNFENCE_BOUND_S)
    figure(f"node {controller} restarted: serving, listed by all and leading its partitions again after "
           f"{time.monotonic() - started:.2f} s")
    assert back == leaders, f"the restarted broker leads its partitions again: {back} vs {leaders}"
    view = cluster.metadata(controller)
    assert after in view.topics, "the restarted node knows the topic created while it was down"
    assert kp_read_all(cluster.node(controller).bootstrap, name, range(6), len(records)) == by_partition(records)
    more = records_for(mine, 3, "post")
    produce_acks_all(cluster.node(survivors[0]).bootstrap, name, more)


def test_a_frozen_broker_is_fenced_after_its_session_and_unfenced_when_it_wakes(cluster_factory):
    """SIGSTOP of a broker that is not the controller: once its session (2 s) expires the other
    nodes show its partitions with leader -1 and LEADER_NOT_AVAILABLE, and a session later list
    it no more.
    SIGCONT: within UNFENCE_BOUND_S it is listed again and leads its partitions, and produce to
    them works. Both times are printed."""
    cluster = cluster_factory()
    name = unique("fence")
    leaders = cluster.create_topic(1, name, 6)
    controller = controller_of(cluster)
    victim = max(i for i in cluster.ids() if i != controller)
    others = [i for i in cluster.ids() if i != victim]
    mine = led_by(leaders, victim)
    assert len(mine) == 2, leaders

    node = cluster.node(victim)
    node.pause()
    try:
        paused = time.monotonic()

        def fenced():
            for i in others:
                view = cluster.metadata(i, [name])
                t = view.topics[name]
                for p in range(6):
                    want = (NO_LEADER, LEADER_NOT_AVAILABLE) if p in mine else (leaders[p], NONE)
                    if (t.partitions[p].leader, t.partitions[p].error_code) != want:
                        return False
            return True

        cluster.wait(fenced, FENCE_BOUND_S, f"broker {victim} fenced on nodes {others}")
        fenced_after = time.monotonic() - paused
        # Clients are told of it a session timeout more (Broker::brokers_for_clients).
        cluster.wait(lambda: all(victim not in cluster.metadata(i).brokers for i in others),
                     FENCE_BOUND_S, f"broker {victim} off the broker lists of nodes {others}")
        # Partitions of the live brokers still take writes meanwhile.
        produce_acks_all(cluster.bootstrap(others), name, records_for(sorted(set(range(6)) - set(mine)), 2, "x"))
    finally:
        node.resume()
    resumed = time.monotonic()
    cluster.wait(
        lambda: all(
            victim in (view := cluster.metadata(i, [name])).brokers and view.topics[name].leaders() == leaders
            for i in cluster.ids()
        ),
        UNFENCE_BOUND_S,
        f"broker {victim} unfenced and leading {mine} again on every node",
    )
    unfenced_after = time.monotonic() - resumed
    figure(f"broker {victim} SIGSTOPped: fenced on the others after {fenced_after:.2f} s (session "
           f"{SESSION_TIMEOUT_MS} ms); after SIGCONT unfenced, leading again after {unfenced_after:.2f} s")
    records = records_for(mine, 5, "after")
    produce_acks_all(cluster.bootstrap(), name, records)
    got = kp_read_all(cluster.bootstrap(), name, mine, len(records))
    assert got == by_partition(records)


def test_without_a_majority_changes_fail_clearly_and_the_survivor_keeps_serving(cluster_factory):
    """kill -9 of two of three voters (the controller among them): on the survivor a
    CreateTopics fails within 10 s with NOT_CONTROLLER or REQUEST_TIMED_OUT and a message that
    says why, and confluent-kafka's create_topics() fails within its request timeout instead of
    hanging; produce and consume on the partitions the survivor leads still work. Once the two
    are restarted, the cluster recovers and creates topics again."""
    cluster = cluster_factory()
    name = unique("minority")
    leaders = cluster.create_topic(1, name, 6)
    controller = controller_of(cluster)
    survivor = min(i for i in cluster.ids() if i != controller)
    dead = [i for i in cluster.ids() if i != survivor]
    mine = led_by(leaders, survivor)
    for i in dead:
        cluster.node(i).kill9()

    client = cluster.raw(survivor)
    started = time.monotonic()
    try:
        code, message = client.create_topic(unique("nope"), 1, timeout_ms=30_000, timeout=20)
    finally:
        client.close()
    took = time.monotonic() - started
    figure(f"without a majority: CreateTopics through node {survivor} failed after {took:.2f} s with "
           f"error {code}: {message}")
    assert code in (NOT_CONTROLLER, REQUEST_TIMED_OUT), f"error {code}: {message}"
    assert message, "the error says why"
    assert took < 10, f"the failure took {took:.2f} s"

    admin = AdminClient({"bootstrap.servers": cluster.node(survivor).bootstrap})
    started = time.monotonic()
    [future] = admin.create_topics([NewTopic(unique("nope"), 1, 1)], request_timeout=6).values()
    try:
        future.result(timeout=20)
        refused = None
    except KafkaException as e:
        refused = str(e)  # not the exception itself: its traceback would keep the client alive
    took = time.monotonic() - started
    assert refused is not None, "confluent create_topics() succeeded without a majority"
    figure(f"without a majority: confluent create_topics() failed after {took:.2f} s: {refused}")
    assert took < 12
    del admin, future

    records = records_for(mine, 10, "alone")
    produce_acks_all(cluster.node(survivor).bootstrap, name, records)
    assert kp_read_all(cluster.node(survivor).bootstrap, name, mine, len(records)) == by_partition(records)

    cluster.start(dead)
    cluster.wait_formed(timeout=20)
    again, took, errors = create_until_it_works(cluster, survivor, 15)
    figure(f"majority back: CreateTopics through node {survivor} worked {took:.2f} s after the nodes served")
    cluster.wait_topic(name, 6)


def test_five_voters_survive_the_loss_of_two_including_the_controller(cluster_factory):
    """Five voters form a cluster (every node lists five brokers); kill -9 of the controller and
    one more voter leaves a majority of three, which elects a controller and creates topics
    (placed on the three live brokers once the dead ones are fenced)."""
    cluster = cluster_factory(voters=5)
    controller, _ = cluster.wait_formed()
    leaders = cluster.create_topic(2, unique("five"), 10)
    assert sorted(set(leaders.values())) == [1, 2, 3, 4, 5], leaders
    victims = [controller, next(i for i in cluster.ids() if i != controller)]
    survivors = [i for i in cluster.ids() if i not in victims]
    for i in victims:
        cluster.node(i).kill9()
    _, took, errors = create_until_it_works(cluster, survivors[0], FAILOVER_BOUND_S)
    figure(f"5 voters, controller {controller} and voter {victims[1]} killed: CreateTopics through node "
           f"{survivors[0]} worked after {took:.2f} s ({len(errors)} failed attempts before)")
    cluster.wait(
        lambda: all(sorted(cluster.metadata(i).brokers) == survivors for i in survivors),
        FENCE_BOUND_S,
        "the killed brokers fenced",
    )
    placed = cluster.create_topic(survivors[-1], unique("three-left"), 6)
    assert sorted(set(placed.values())) == survivors, placed


def test_a_broker_only_node_follows_the_quorum_and_serves_its_partitions(cluster_factory):
    """A fourth node with process.roles=broker (not a voter) joins three voters: every node
    lists four brokers and a voter as controller; a topic created through the broker-only node
    spreads over all four; data produced through it reads back with kcat from a voter; after
    the controller is killed it forwards to the new one."""
    cluster = cluster_factory(voters=3, brokers=1)
    controller, _ = cluster.wait_formed()
    assert controller in (1, 2, 3)
    name = unique("learner")
    leaders = cluster.create_topic(4, name, 8)
    for node_id in (1, 2, 3, 4):
        assert len(led_by(leaders, node_id)) == 2, leaders
    records = records_for(range(8), 10, "l")
    produce_acks_all(cluster.node(4).bootstrap, name, records)
    assert kcat_read_all(cluster.node(1).bootstrap, name) == by_partition(records)

    cluster.node(controller).kill9()
    _, took, errors = create_until_it_works(cluster, 4, FAILOVER_BOUND_S)
    figure(f"broker-only node 4 forwarded a CreateTopics to the new controller {took:.2f} s after the old "
           f"one was killed")


def test_controller_only_nodes_decide_while_broker_only_nodes_serve(cluster_factory, closer):
    """Three controller-only nodes (process.roles=controller: no Kafka listener) and two
    broker-only nodes: the brokers list only themselves, a topic spreads over both and
    round-trips, a consumer group works, and after a controller is killed (the active one or
    not) topic creation through a broker still works."""
    cluster = cluster_factory(voters=3, brokers=2, controller_only=True)
    controller, _ = cluster.wait_formed()
    assert controller in (1, 2, 3)
    # Kafka clients are told of a broker as the controller, which forwards to the active one.
    assert {i: cluster.metadata(i).controller_id for i in (4, 5)} == {4: 4, 5: 5}
    for node_id in (1, 2, 3):
        assert "controller on 127.0.0.1:" in cluster.node(node_id).log_since(0)
    name = unique("co")
    leaders = cluster.create_topic(4, name, 4)
    assert sorted(leaders.values()) == [4, 4, 5, 5], leaders
    records = records_for(range(4), 10, "co")
    produce_acks_all(cluster.bootstrap(), name, records)
    assert kcat_read_all(cluster.node(5).bootstrap, name) == by_partition(records)
    consumer = closer.add(c_consumer(cluster.bootstrap(), unique("g"), {"session.timeout.ms": 6000}))
    consumer.subscribe([name])
    got = c_consume(consumer, len(records), timeout=COORDINATOR_TIMEOUT_S)
    assert sorted(r.value for r in got) == sorted(r["value"] for r in records)
    consumer.commit(asynchronous=False)
    consumer.close()

    for victim in (1, 2):
        cluster.node(victim).kill9()
        _, took, errors = create_until_it_works(cluster, 4 if victim == 1 else 5, FAILOVER_BOUND_S)
        figure(f"controller-only node {victim} killed: a CreateTopics through a broker worked after {took:.2f} s")
        cluster.node(victim).start()


def test_a_quorum_of_one_voter_takes_broker_only_nodes(cluster_factory):
    """One voter (combined) and two broker-only nodes: the brokers follow the one-voter quorum
    as learners, all three are listed and lead partitions, and data round-trips through them."""
    cluster = cluster_factory(voters=1, brokers=2)
    controller, _ = cluster.wait_formed()
    assert controller == 1
    name = unique("one")
    leaders = cluster.create_topic(3, name, 6)
    assert sorted(leaders.values()) == [1, 1, 2, 2, 3, 3], leaders
    records = records_for(range(6), 5, "one")
    produce_acks_all(cluster.bootstrap(), name, records)
    assert kcat_read_all(cluster.node(2).bootstrap, name) == by_partition(records)


def test_a_node_far_behind_catches_up_from_a_snapshot(cluster_factory):
    """With a metadata snapshot every 10 records, a node killed while 40 topics are created
    comes back behind the leader's purged log: it installs the leader's snapshot, then lists
    every topic and leads its partitions again. (The topics created while it is dead go to
    the live nodes: the controller fences a killed node at once.)"""
    cluster = cluster_factory(settings={"metadata.snapshot.interval.records": "10"})
    controller = controller_of(cluster)
    behind = next(i for i in cluster.ids() if i != controller)
    via = next(i for i in cluster.ids() if i not in (controller, behind))
    first = unique("before")
    leaders = cluster.create_topic(via, first, 3)
    assert behind in leaders.values(), leaders
    cluster.node(behind).kill9()
    names = [unique("snap") for _ in range(40)]
    for name in names:
        client = cluster.raw(via)
        try:
            assert client.create_topic(name, 3)[0] == NONE
        finally:
            client.close()
    cluster.node(behind).start()
    cluster.wait_formed()
    for name in names[-3:]:
        cluster.wait_topic(name, 3)
    cluster.wait_topic(first, 3, leaders_in=cluster.ids())
    view = cluster.metadata(behind)
    assert set(names) <= set(view.topics), "the restarted node lists every topic"
    assert behind in {p.leader for p in view.topics[first].partitions.values()}, "it leads its partition again"
    assert "installed a metadata snapshot from the leader" in cluster.node(behind).log_path.read_text(errors="replace")


def test_a_whole_cluster_restart_keeps_topics_and_data(cluster_factory):
    """SIGTERM to every node at once: each exits 0. Started again from their data directories,
    they form the cluster again with the same cluster id; the topic has the same partitions and
    leaders, and every record reads back with kafka-python and kcat."""
    cluster = cluster_factory()
    _, cluster_id = cluster.wait_formed()
    name = unique("restart")
    leaders = cluster.create_topic(3, name, 6)
    records = records_for(range(6), 15, "r")
    produce_acks_all(cluster.bootstrap(), name, records)

    codes = cluster.stop()
    assert codes == {1: 0, 2: 0, 3: 0}, f"exit codes after SIGTERM: {codes}"
    started = time.monotonic()
    cluster.start()
    _, cluster_id_after = cluster.wait_formed()
    assert cluster_id_after == cluster_id
    assert cluster.wait_topic(name, 6) == leaders
    figure(f"whole-cluster restart: formed and serving the topic {time.monotonic() - started:.2f} s after start")
    expected = by_partition(records)
    assert kp_read_all(cluster.bootstrap(), name, range(6), len(records)) == expected
    assert kcat_read_all(cluster.node(2).bootstrap, name) == expected


def test_a_whole_cluster_restart_keeps_committed_offsets(cluster_factory, closer):
    """A group commits offsets on a six-partition topic spread over three brokers; after every
    node is stopped (SIGTERM) and started again, a new member of the group resumes exactly
    after the commit."""
    cluster = cluster_factory()
    name = unique("restart-grp")
    cluster.create_topic(1, name, 6)
    first = records_for(range(6), 4, "first")
    produce_acks_all(cluster.bootstrap(), name, first)
    group = unique("g")
    c1 = closer.add(c_consumer(cluster.bootstrap(), group))
    c1.subscribe([name])
    assert len(c_consume(c1, len(first), timeout=COORDINATOR_TIMEOUT_S)) == len(first)
    c1.commit(asynchronous=False)
    c1.close()

    codes = cluster.stop()
    assert codes == {1: 0, 2: 0, 3: 0}, f"exit codes after SIGTERM: {codes}"
    cluster.start()
    cluster.wait_formed()
    cluster.wait_topic(name, 6)
    second = records_for(range(6), 3, "second")
    produce_acks_all(cluster.bootstrap(), name, second)
    c2 = closer.add(c_consumer(cluster.bootstrap(), group))
    c2.subscribe([name])
    resumed = c_consume(c2, len(second), timeout=COORDINATOR_TIMEOUT_S)
    assert sorted(r.value for r in resumed) == sorted(r["value"] for r in second)


def test_rocketmq_fifo_sends_reach_each_message_groups_queue_whatever_broker_a_client_picks(cluster):
    """A RocketMQ client picks the broker for a FIFO message by its own hash of the message
    group; Weir's queue for the group (the Kafka partitioner over the group) may be led by
    another broker, which the append is forwarded to. Every send succeeds, each group's messages
    are in one partition, in send order, keyed by the group."""
    from rocketmq import ClientConfiguration, Credentials, Message, Producer

    name = unique("rmq-fifo")
    leaders = cluster.create_topic(1, name, 3)
    assert set(leaders.values()) == {1, 2, 3}, leaders
    status, _ = http("PATCH", f"{cluster.node(1).admin_url()}/v1/topics/{name}/configs", {"set": {"message.type": "FIFO"}})
    assert status == 200
    config = ClientConfiguration(cluster.node(2).rocketmq_endpoint, Credentials(), request_timeout=10)
    producer = Producer(config, [name])
    producer.startup()
    try:
        for n in range(5):
            for g in range(12):
                m = Message()
                m.topic, m.body, m.message_group = name, f"g{g}-{n}".encode(), f"group-{g}"
                producer.send(m)
    finally:
        producer.shutdown()
    consumer = c_consumer(cluster.bootstrap())
    try:
        consumer.assign([TopicPartition(name, p, 0) for p in range(3)])
        records = c_consume(consumer, 60)
    finally:
        consumer.close()
    partitions = {}
    for rec in sorted(records, key=lambda r: (r.partition, r.offset)):
        group = rec.key.decode()
        partitions.setdefault(group, set()).add(rec.partition)
        assert rec.value.decode().startswith(group.replace("group-", "g") + "-")
    assert all(len(p) == 1 for p in partitions.values()), partitions
    assert len({next(iter(p)) for p in partitions.values()}) == 3, "the groups spread over every queue"
    for group in partitions:
        bodies = [r.value.decode() for r in sorted(records, key=lambda r: r.offset) if r.key.decode() == group]
        assert bodies == [f"{group.replace('group-', 'g')}-{n}" for n in range(5)], bodies


def test_a_rocketmq_groups_consumer_and_reset_span_the_brokers_that_lead_its_queues(cluster):
    """A SimpleConsumer reaching the cluster through node 2 receives from queues led by all
    three brokers. Every node's `weir group describe` lists it as the group's one member, and a
    reset to the earliest offsets through node 3 (whichever broker coordinates the group) moves
    its position on every leader: all nine messages come again."""
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

    name, group = unique("rmq-span"), unique("g")
    leaders = cluster.create_topic(1, name, 3)
    assert set(leaders.values()) == {1, 2, 3}, leaders
    config = ClientConfiguration(cluster.node(2).rocketmq_endpoint, Credentials(), request_timeout=10)
    producer = Producer(config, [name])
    producer.startup()
    try:
        for i in range(9):
            m = Message()
            m.topic, m.body = name, f"s{i}".encode()
            producer.send(m)
    finally:
        producer.shutdown()
    consumer = SimpleConsumer(config, group, {name: FilterExpression("*")}, await_duration=2)
    consumer.startup()
    cli = str(weir_bin())
    env = {i: {**os.environ, "WEIR_ADMIN": cluster.node(i).admin_url()} for i in (1, 2, 3)}

    def receive_and_ack(want):
        got, deadline = [], time.monotonic() + 30
        while len(got) < want and time.monotonic() < deadline:
            got += consumer.receive(32, 30)
        for m in got:
            consumer.ack(m)
        return sorted(m.body for m in got)

    try:
        everything = sorted(f"s{i}".encode() for i in range(9))
        assert receive_and_ack(9) == everything
        for via in (1, 2, 3):
            out = subprocess.run([cli, "group", "describe", group, "--json"], capture_output=True, text=True,
                                 env=env[via], timeout=60)
            assert out.returncode == 0, (via, out.stderr)
            described = json.loads(out.stdout)
            assert described["state"] == "Stable" and len(described["members"]) == 1, (via, described)
        subprocess.run([cli, "group", "reset-offsets", group, "--topic", name, "--to-earliest"], env=env[3],
                       check=True, capture_output=True, timeout=60)
        assert receive_and_ack(9) == everything
    finally:
        consumer.shutdown()


def test_a_delayed_message_is_recalled_through_a_broker_other_than_the_one_that_keeps_it(cluster):
    """A delayed message waits in the timer store of the broker that took it (its queue's
    leader); RecallMessage goes to the client's access point, which passes it to that broker.
    The recalled message never reaches its topic, the other one does."""
    import math

    from rocketmq import ClientConfiguration, Credentials, Message, Producer

    name = unique("rmq-recall")
    leaders = cluster.create_topic(1, name, 1)
    status, _ = http("PATCH", f"{cluster.node(1).admin_url()}/v1/topics/{name}/configs", {"set": {"message.type": "DELAY"}})
    assert status == 200
    keeper = leaders[0]
    access = next(i for i in cluster.ids() if i != keeper)
    config = ClientConfiguration(cluster.node(access).rocketmq_endpoint, Credentials(), request_timeout=10)
    producer = Producer(config, [name])
    producer.startup()
    due_s = math.ceil(time.time() + 4)
    try:
        receipts = {}
        for body in (b"recalled", b"kept"):
            m = Message()
            m.topic, m.body, m.delivery_timestamp = name, body, due_s
            receipts[body] = producer.send(m)
        handle = receipts[b"recalled"].recall_handle
        assert handle.startswith("r2."), f"a handle naming its timer shard: {handle}"
        assert producer.recall_message(name, handle) == receipts[b"recalled"].message_id
    finally:
        producer.shutdown()
    time.sleep(max(0.0, due_s + 1 - time.time()))
    consumer = c_consumer(cluster.bootstrap())
    try:
        consumer.assign([TopicPartition(name, 0, 0)])
        records = c_consume(consumer, 1, timeout=30)
        records += c_consume(consumer, 0, timeout=2)
        extra = consumer.poll(2)
    finally:
        consumer.close()
    assert [r.value for r in records] == [b"kept"]
    assert extra is None or extra.error() is not None, f"and nothing else: {extra.value() if extra else None}"


def test_an_admin_client_made_before_the_controller_dies_creates_topics_soon_after(cluster_factory):
    """A confluent-kafka AdminClient that learned the cluster from a node other than the active
    controller keeps working after a kill -9 of the active controller: a create_topics through
    it succeeds within FAILOVER_BOUND_S, as one made after the kill does. (Told of the active
    controller as the controller, it would wait for that dead broker until its metadata is
    refreshed: librdkafka timed out with "Timed out waiting for controller" for over 60 s.)"""
    cluster = cluster_factory()
    controller = controller_of(cluster)
    survivor = next(i for i in cluster.ids() if i != controller)
    admin = AdminClient({"bootstrap.servers": cluster.node(survivor).bootstrap})
    first = unique("admin-before")
    admin.create_topics([NewTopic(first, 1, 1)], request_timeout=10)[first].result(timeout=20)

    cluster.node(controller).kill9()
    killed = time.monotonic()
    errors = []
    while True:
        name = unique("admin-after")
        try:
            admin.create_topics([NewTopic(name, 1, 1)], request_timeout=5)[name].result(timeout=10)
            break
        except KafkaException as e:
            errors.append((round(time.monotonic() - killed, 2), str(e.args[0])))
        assert time.monotonic() - killed < FAILOVER_BOUND_S, (
            f"the old AdminClient created no topic within {FAILOVER_BOUND_S} s of the controller's death: {errors}"
        )
        time.sleep(0.2)
    took = time.monotonic() - killed
    figure(f"controller {controller} killed: an AdminClient made before created a topic after {took:.2f} s "
           f"({len(errors)} failed attempts)")
    cluster.wait_topic(name, 1, ids=[i for i in cluster.ids() if i != controller])


def test_a_voter_whose_peers_never_start_says_so_once_per_peer(cluster_factory):
    """One voter of three started alone (its peers could not bind their ports, say) stands for
    election round after round. Its log says once per peer that the peer does not answer, not
    once per vote request: by the time it reports having waited 5 s (several election rounds
    of 600 ms), each peer has exactly one line and nothing was logged at ERROR."""
    cluster = cluster_factory(start=False)
    node = cluster.node(1)
    node.start(wait=False)
    cluster.wait(lambda: "waited_s=5" in node.log_since(0), 30, "node 1 to report waiting 5 s for a majority")
    lines = node.log_since(0).splitlines()
    for peer in (2, 3):
        about = [line for line in lines if f"node={peer} " in line or f"voter {peer} " in line]
        assert len(about) == 1, f"{len(about)} lines about node {peer}:\n" + "\n".join(about[:10])
    errors = [line for line in lines if " ERROR " in line]
    assert not errors, "\n".join(errors[:10])
