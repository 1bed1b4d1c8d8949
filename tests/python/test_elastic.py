"""Elastic topics (docs/elastic.md) with real clients against real `weir` processes.

What it proves:
- `weir topic create --elastic` makes a topic of 65,536 logical partitions over stable
  partitions (the ones Kafka clients see) grouped into physical partitions; `weir topic describe`
  and the admin API show each physical partition's ranges, state, leader, replicas and rates.
- Splits and merges happen online, under keyed producers of three kinds (librdkafka with the
  murmur2 partitioner, kafka-python, the RocketMQ 5 client with message groups): every key stays
  in the stable partition Kafka's partitioner gives it, and a classic group, a KIP-848 group, a
  consumer that assigns itself every partition, HTTP consume and RocketMQ FIFO consumers each
  read every acknowledged message with per-key order intact.
- In a 3-node cluster a split moves the upper half of a range to the least loaded broker while
  keyed Kafka producers (one idempotent, acks=all) and a RocketMQ producer sending in message
  groups write; a classic group, a KIP-848 group and RocketMQ FIFO consumers then read every
  acknowledged write in per-key order; a merge brings the half back.
- Bad requests get clear refusals: a split below one stable partition, adding partitions, a
  merge of ranges that are not adjacent, a logical partition on a plain topic or out of range.

Every wait is bounded.
"""

import json
import subprocess
import threading
import time
from collections import defaultdict

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import NewPartitions
from kafka import KafkaProducer

from conftest import weir_bin
from helpers import c_admin, c_consumer, c_producer, http, unique, wait_until
from test_rocketmq import message, producer_for, simple_consumer

MURMUR2_SEED = 0x9747B28C


def murmur2(data):
    """Kafka's Utils.murmur2 (the Java client's and librdkafka's murmur2 partitioner)."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (MURMUR2_SEED ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    tail = data[length - length % 4:]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def kafka_partition(key, partitions):
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def weir(admin_url, *args, check=True, timeout=120):
    cli = subprocess.run([str(weir_bin()), *args, "--admin", admin_url], capture_output=True, text=True, timeout=timeout)
    if check:
        assert cli.returncode == 0, f"weir {' '.join(args)}: {cli.stderr}"
    return cli


def describe(admin_url, topic):
    return json.loads(weir(admin_url, "topic", "describe", topic, "--json").stdout)


def active(layout):
    return [p for p in layout["elastic"]["physical"] if p["state"] == "active"]


def test_an_elastic_topic_shows_its_layout_and_kafka_clients_see_its_stable_partitions(broker):
    topic = unique("elastic")
    created = weir(broker.admin_url(), "topic", "create", topic, "--elastic", "--partitions", "2")
    assert "32 partitions (stable) over 2 physical, elastic" in created.stdout, created.stdout
    layout = describe(broker.admin_url(), topic)
    assert len(layout["partitions"]) == 32
    elastic = layout["elastic"]
    assert (elastic["logical_partitions"], elastic["stable_partitions"]) == (65536, 32)
    ranges = [(p["id"], p["stable_first"], p["stable_last"], p["logical_first"], p["logical_last"]) for p in active(layout)]
    assert ranges == [(0, 0, 15, 0, 32767), (1, 16, 31, 32768, 65535)]
    assert all(p["leaders"] == [p["leader"]] and p["replicas"] == [p["leader"]] for p in active(layout)), active(layout)
    text = weir(broker.admin_url(), "topic", "describe", topic).stdout
    assert "Elastic: 65536 logical partitions over 32 stable partitions" in text, text
    assert "0-15" in text and "32768-65535" in text, text
    metadata = c_admin(broker.bootstrap).list_topics(topic=topic, timeout=10)
    assert len(metadata.topics[topic].partitions) == 32

    # An explicit logical partition goes to the stable partition that holds it (65536 / 32 = 2048 each).
    status, body = http("POST", f"{broker.admin_url()}/v1/topics/{topic}/records",
                        {"records": [{"value": "a", "logical_partition": 40_000}, {"value": "b", "logical_partition": 0}]})
    assert status == 200, body
    assert [o["partition"] for o in body["offsets"]] == [40_000 // 2048, 0]
    cli = subprocess.run([str(weir_bin()), "produce", topic, "--logical-partition", "65535", "--admin", broker.admin_url()],
                         input="z\n", capture_output=True, text=True, timeout=30)
    assert cli.returncode == 0, cli.stderr
    assert describe(broker.admin_url(), topic)["partitions"][31]["log_end_offset"] == 1

    # Keyed writes over HTTP land where Kafka's partitioner puts the key.
    keys = [f"user-{i}" for i in range(20)]
    status, body = http("POST", f"{broker.admin_url()}/v1/topics/{topic}/records",
                        {"records": [{"key": k, "value": "v"} for k in keys]})
    assert status == 200, body
    assert [o["partition"] for o in body["offsets"]] == [kafka_partition(k, 32) for k in keys]


def test_bad_elastic_requests_are_refused_with_a_clear_message(broker):
    admin = broker.admin_url()
    topic = unique("elastic-bad")
    weir(admin, "topic", "create", topic, "--elastic", "--partitions", "1", "--stable-partitions", "2")
    split = weir(admin, "topic", "split", topic, "--partition", "0")
    assert "into 1,2" in split.stdout, split.stdout
    refused = weir(admin, "topic", "split", topic, "--partition", "1", check=False)
    assert refused.returncode != 0 and "single stable partition" in refused.stderr, refused.stderr
    refused = weir(admin, "topic", "split", topic, "--partition", "0", check=False)
    assert refused.returncode != 0 and "retired" in refused.stderr, refused.stderr
    refused = weir(admin, "topic", "split", topic, "--partition", "9", check=False)
    assert refused.returncode != 0 and "no physical partition 9" in refused.stderr, refused.stderr

    # Kafka's CreatePartitions would move every key: refused, with the reason.
    kafka_admin = c_admin(broker.bootstrap)
    futures = kafka_admin.create_partitions([NewPartitions(topic, 4)], request_timeout=15)
    try:
        futures[topic].result(timeout=15)
        raise AssertionError("CreatePartitions on an elastic topic was accepted")
    except KafkaException as e:
        assert "elastic" in str(e), e

    wide = unique("elastic-wide")
    weir(admin, "topic", "create", wide, "--elastic", "--partitions", "3", "--stable-partitions", "8")
    refused = weir(admin, "topic", "merge", wide, "--partitions", "0,2", check=False)
    assert refused.returncode != 0 and "not adjacent" in refused.stderr, refused.stderr
    refused = weir(admin, "topic", "create", unique("elastic-odd"), "--elastic", "--partitions", "2",
                   "--stable-partitions", "12", check=False)
    assert refused.returncode != 0 and "power of two" in refused.stderr, refused.stderr

    plain = unique("plain")
    weir(admin, "topic", "create", plain, "--partitions", "2")
    refused = weir(admin, "topic", "split", plain, "--partition", "0", check=False)
    assert refused.returncode != 0 and "not elastic" in refused.stderr, refused.stderr
    status, body = http("POST", f"{admin}/v1/topics/{plain}/records", {"records": [{"value": "a", "logical_partition": 3}]})
    assert status == 400 and "elastic" in body["error"]["message"], body
    status, body = http("POST", f"{admin}/v1/topics/{wide}/records", {"records": [{"value": "a", "logical_partition": 65536}]})
    assert status == 400 and "out of range" in body["error"]["message"], body


class KeyedLoad:
    """Keyed producers of three kinds writing `<key>/<source>/<seq>` until stopped, recording what
    each had acknowledged: librdkafka (murmur2 partitioner), kafka-python (murmur2 by default)
    and, when `rocketmq` is set, the RocketMQ 5 client sending the key as its message group."""

    def __init__(self, broker, topic, keys, rocketmq=True):
        self.topic, self.keys = topic, keys
        self.acked = defaultdict(list)  # (key, source) -> acknowledged sequence numbers
        self.errors = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._confluent, args=(broker,), daemon=True),
                        threading.Thread(target=self._kafka_python, args=(broker,), daemon=True)]
        if rocketmq:
            self.threads.append(threading.Thread(target=self._rocketmq, args=(broker,), daemon=True))
        for t in self.threads:
            t.start()

    def _ack(self, key, source, seq):
        with self.lock:
            self.acked[(key, source)].append(seq)

    def _confluent(self, broker):
        producer = c_producer(broker.bootstrap, {"partitioner": "murmur2_random", "enable.idempotence": True, "acks": "all"})
        seq = 0
        try:
            while not self.stop.is_set():
                for key in self.keys:
                    def done(err, msg, key=key, seq=seq):
                        if err is None:
                            self._ack(key, "c", seq)
                        else:
                            self.errors.append(f"confluent {key}/{seq}: {err}")
                    producer.produce(self.topic, key=key, value=f"{key}/c/{seq}", on_delivery=done)
                seq += 1
                producer.poll(0)
                time.sleep(0.3)
        finally:
            producer.flush(30)

    def _kafka_python(self, broker):
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", max_in_flight_requests_per_connection=1,
                                 retries=20, linger_ms=5)
        seq = 0
        try:
            while not self.stop.is_set():
                futures = [(key, producer.send(self.topic, key=key.encode(), value=f"{key}/k/{seq}".encode()))
                           for key in self.keys]
                for key, future in futures:
                    try:
                        future.get(timeout=30)
                        self._ack(key, "k", seq)
                    except Exception as e:  # noqa: BLE001 - any failure is reported by the test
                        self.errors.append(f"kafka-python {key}/{seq}: {e}")
                seq += 1
                time.sleep(0.3)
        finally:
            producer.close(10)

    def _rocketmq(self, broker):
        producer = producer_for(broker, [self.topic])
        seq = 0
        try:
            while not self.stop.is_set():
                for key in self.keys:
                    # A send refused while its queue's leader moves is not stored; the
                    # application sends it again, as RocketMQ's producers retry (maxAttempts).
                    for attempt in range(5):
                        try:
                            producer.send(message(self.topic, f"{key}/r/{seq}".encode(), group=key))
                            self._ack(key, "r", seq)
                            break
                        except Exception as e:  # noqa: BLE001
                            if attempt == 4:
                                self.errors.append(f"rocketmq {key}/{seq}: {e}")
                            time.sleep(0.2)
                seq += 1
                time.sleep(0.4)
        finally:
            producer.shutdown()

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(60)
        assert not self.errors, self.errors[:5]
        return sum(len(v) for v in self.acked.values())


def check_order(acked, received, partitions, what):
    """`received` is (partition, body) in delivery order: every acknowledged message is there,
    per (key, source) in the order it was sent, and each key in the stable partition Kafka's
    partitioner gives it (unless the client does not say: partition None)."""
    seen = defaultdict(list)
    for partition, body in received:
        key, source, seq = body.rsplit("/", 2)
        if partition is not None:
            assert partition == kafka_partition(key, partitions), f"{what}: {body} in partition {partition}"
        seen[(key, source)].append(int(seq))
    for (key, source), seqs in acked.items():
        got = seen.get((key, source), [])
        firsts = list(dict.fromkeys(got))  # redeliveries after the first keep their first place
        assert firsts == sorted(firsts), f"{what}: {key}/{source} out of order: {firsts[:20]}"
        missing = set(seqs) - set(got)
        assert not missing, f"{what}: {key}/{source} lost {sorted(missing)[:10]}"


def acked_bodies(acked):
    """The body of every acknowledged message."""
    return {f"{key}/{source}/{seq}" for (key, source), seqs in acked.items() for seq in seqs}


def drain(consumer, acked, what, timeout):
    """Polls `consumer` until every acknowledged message came (a retried send may come twice, so
    counting is not enough), or the timeout; closes it; returns (partition, body) in order."""
    wanted, received = acked_bodies(acked), []
    deadline = time.monotonic() + timeout
    try:
        while wanted and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            body = msg.value().decode()
            received.append((msg.partition(), body))
            wanted.discard(body)
    finally:
        consumer.close()
    assert not wanted, f"{what}: {len(wanted)} acknowledged messages not read within {timeout} s: {sorted(wanted)[:5]}"
    return received


def consume_kafka(bootstrap, topic, acked, conf, what, timeout=90):
    """A new group's member reads `topic` until every acknowledged message came."""
    if conf.get("group.protocol") == "consumer":
        # The broker holds the session settings of a KIP-848 group.
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g-elastic"), "auto.offset.reset": "earliest",
                             "enable.auto.commit": False, **conf})
    else:
        consumer = c_consumer(bootstrap, unique("g-elastic"), conf)
    consumer.subscribe([topic])
    return drain(consumer, acked, what, timeout)


def assigned_reader(bootstrap, topic, partitions, acked, timeout=60):
    """A consumer without a group that assigns itself every partition from the start."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("unused"), "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    return drain(consumer, acked, "assign-and-fetch consumer", timeout)


def http_reader(admin, topic, acked, timeout=60):
    """`GET /v1/topics/{topic}/records`, every partition from the start, following `partitions`."""
    wanted = acked_bodies(acked)
    positions, received = None, []
    deadline = time.monotonic() + timeout
    while wanted and time.monotonic() < deadline:
        query = "" if positions is None else "offsets=" + ",".join(f"{p}:{o}" for p, o in sorted(positions.items())) + "&"
        status, body = http("GET", f"{admin}/v1/topics/{topic}/records?{query}max_records=1000&timeout_ms=500")
        assert status == 200, body
        for record in body["records"]:
            received.append((record["partition"], record["value"]))
            wanted.discard(record["value"])
        positions = {p["partition"]: p["next_offset"] for p in body["partitions"]}
    assert not wanted, f"HTTP consume: {len(wanted)} acknowledged messages not read"
    return received


def fifo_group(admin):
    """A RocketMQ group with consume.fifo on."""
    group = unique("g-fifo")
    status, body = http("POST", f"{admin}/v1/groups", {"name": group, "configs": {"consume.fifo": "true"}})
    assert status == 201, body
    return group


def fifo_read(broker, group, topic, acked, consumers=4, timeout=90):
    """RocketMQ FIFO consumers of `group` read `topic` until every acknowledged message came. A
    message group's next message goes out only after the one before it is acked, so recording
    each before acking it gives the group's order; returns (None, body) in that order."""
    received, lock = [], threading.Lock()
    wanted = acked_bodies(acked)

    def fifo_consumer():
        consumer = simple_consumer(broker, group, topic, await_s=1)
        deadline = time.monotonic() + timeout
        try:
            while wanted and time.monotonic() < deadline:
                for m in consumer.receive(32, 30):
                    with lock:
                        received.append((None, m.body.decode()))
                        wanted.discard(m.body.decode())
                    consumer.ack(m)
        finally:
            consumer.shutdown()
    started = time.monotonic()
    threads = [threading.Thread(target=fifo_consumer, daemon=True) for _ in range(consumers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 30)
    total = sum(len(v) for v in acked.values())
    print(f"\n[elastic figure] {total} messages acked; {consumers} RocketMQ FIFO consumers took "
          f"{time.monotonic() - started:.1f} s")
    assert not wanted, f"RocketMQ FIFO consumers: {len(wanted)} of {total} acknowledged messages not read"
    return received


def test_splits_and_merges_under_keyed_producers_keep_every_key_in_order_for_every_consumer(broker):
    admin = broker.admin_url()
    topic = unique("elastic-load")
    weir(admin, "topic", "create", topic, "--elastic", "--partitions", "2", "--stable-partitions", "16",
         "--config", "message.type=FIFO")
    group = fifo_group(admin)
    # Enough keys that every queue has some: a FIFO consumer's receive of an empty queue waits
    # out its long poll.
    keys = [f"key-{i:02d}" for i in range(48)]
    load = KeyedLoad(broker, topic, keys)
    try:
        time.sleep(1.0)
        weir(admin, "topic", "split", topic, "--partition", "0")
        time.sleep(0.5)
        weir(admin, "topic", "split", topic, "--partition", "1")
        time.sleep(0.5)
        weir(admin, "topic", "merge", topic, "--partitions", "3,4")
        time.sleep(1.0)
    finally:
        total = load.finish()

    # The leaders' load windows (5 s) saw the traffic.
    def rates_shown():
        return any(p["bytes_in_per_sec"] > 0 for p in active(describe(admin, topic)))
    wait_until(rates_shown, timeout=12, interval=0.5, what="a physical partition's rates in describe")
    layout = describe(admin, topic)
    ranges = [(p["stable_first"], p["stable_last"]) for p in active(layout)]
    assert ranges == [(0, 3), (4, 11), (12, 15)], ranges
    retired = sorted(p["id"] for p in layout["elastic"]["physical"] if p["state"] == "retired")
    assert retired == [0, 1, 3, 4], layout["elastic"]["physical"]
    assert total > 100, total

    check_order(load.acked, consume_kafka(broker.bootstrap, topic, load.acked, {}, "classic group"), 16, "classic group")
    check_order(load.acked, consume_kafka(broker.bootstrap, topic, load.acked, {"group.protocol": "consumer"}, "KIP-848 group"),
                16, "KIP-848 group")

    check_order(load.acked, assigned_reader(broker.bootstrap, topic, 16, load.acked), 16, "assign-and-fetch consumer")
    check_order(load.acked, http_reader(admin, topic, load.acked), 16, "HTTP consume")

    received = fifo_read(broker, group, topic, load.acked)
    check_order(load.acked, received, 16, "RocketMQ FIFO consumer")


def test_a_split_in_a_cluster_moves_half_the_range_to_the_least_loaded_broker_under_load(cluster_factory):
    cluster = cluster_factory(voters=3, settings={"replica.lag.time.max.ms": "2000", "replica.fetch.wait.max.ms": "200"})
    admin = cluster.node(1).admin_url()
    topic = unique("elastic-move")
    weir(admin, "topic", "create", topic, "--elastic", "--partitions", "1", "--stable-partitions", "8",
         "--replication-factor", "1", "--config", "message.type=FIFO")
    group = fifo_group(admin)
    before = describe(admin, topic)
    (parent,) = active(before)
    home = parent["leader"]
    assert home in (1, 2, 3), parent

    class ClusterBroker:  # what KeyedLoad and the RocketMQ clients need of a broker
        bootstrap = cluster.bootstrap()
        rocketmq_endpoint = cluster.node(1).rocketmq_endpoint
    keys = [f"k{i:02d}" for i in range(16)]
    load = KeyedLoad(ClusterBroker, topic, keys)
    try:
        time.sleep(1.5)
        started = time.monotonic()
        split = json.loads(weir(admin, "topic", "split", topic, "--partition", str(parent["id"]), "--json").stdout)
        split_s = time.monotonic() - started
        assert split["in_force"] and split["moving"] == [4, 5, 6, 7], split
        lower, upper = active(describe(admin, topic))
        assert lower["leader"] == home and upper["leader"] not in (-1, home), (lower, upper)
        assert upper["replicas"] == [upper["leader"]], upper
        time.sleep(1.0)
        merged = json.loads(weir(admin, "topic", "merge", topic, "--partitions", f"{lower['id']},{upper['id']}",
                                 "--json").stdout)
        assert merged["in_force"], merged
        (whole,) = active(describe(admin, topic))
        assert (whole["stable_first"], whole["stable_last"], whole["leader"]) == (0, 7, home), whole
        time.sleep(1.0)
    finally:
        total = load.finish()
    print(f"\n[elastic figure] split with a move of 4 stable partitions took {split_s:.2f} s; {total} messages acked")
    check_order(load.acked, consume_kafka(cluster.bootstrap(), topic, load.acked, {}, "classic group"), 8, "classic group")
    check_order(load.acked, consume_kafka(cluster.bootstrap(), topic, load.acked, {"group.protocol": "consumer"},
                                          "KIP-848 group"), 8, "KIP-848 group")
    check_order(load.acked, fifo_read(ClusterBroker, group, topic, load.acked), 8, "RocketMQ FIFO consumer")


def test_a_hot_physical_partition_splits_by_itself_and_the_cold_halves_merge_again(broker):
    """elastic.split.bytes.per.sec and elastic.merge.bytes.per.sec: under keyed producers the
    topic's only physical partition splits once its rate held above the threshold for the window;
    once they stop, the two cold halves merge. Every acknowledged message is read in per-key order."""
    admin = broker.admin_url()
    topic = unique("elastic-auto")
    weir(admin, "topic", "create", topic, "--elastic", "--partitions", "1", "--stable-partitions", "4",
         "--config", "elastic.split.bytes.per.sec=2000", "--config", "elastic.merge.bytes.per.sec=500",
         "--config", "elastic.autoscale.window.ms=5000")
    keys = [f"key-{i:02d}" for i in range(48)]
    load = KeyedLoad(broker, topic, keys, rocketmq=False)
    try:
        def split():
            return any(p["id"] == 0 and p["state"] == "retired" for p in describe(admin, topic)["elastic"]["physical"])
        wait_until(split, timeout=40, interval=1.0, what="an automatic split under load")
    finally:
        total = load.finish()
    physical = {p["id"]: p for p in describe(admin, topic)["elastic"]["physical"]}
    assert physical[0]["children"] == [1, 2], physical

    # (The halves may have split again meanwhile: each is as hot as the threshold allows.)
    def merged():
        return any(len(p["parents"]) == 2 for p in active(describe(admin, topic)))
    wait_until(merged, timeout=40, interval=1.0, what="an automatic merge of cold neighbours")
    check_order(load.acked, consume_kafka(broker.bootstrap, topic, load.acked, {}, "classic group"), 4, "classic group")


def test_kill9_of_the_leader_in_the_middle_of_a_split_loses_no_acknowledged_write(cluster_factory):
    """Replication factor 2 on three nodes: a split starts moving the upper half of the range to
    the least loaded broker, and the leader of the range is killed with SIGKILL at once. A
    surviving replica takes over, the move completes (once the killed node is back, if the move
    needs it), and every write the idempotent acks=all producer had acknowledged is read back in
    per-key order."""
    cluster = cluster_factory(voters=3, settings={"replica.lag.time.max.ms": "2000", "replica.fetch.wait.max.ms": "200"})
    admin_of = {i: cluster.node(i).admin_url() for i in (1, 2, 3)}
    topic = unique("elastic-kill")
    weir(admin_of[1], "topic", "create", topic, "--elastic", "--partitions", "1", "--stable-partitions", "4",
         "--replication-factor", "2")
    (parent,) = active(describe(admin_of[1], topic))
    victim = parent["leader"]
    survivor = next(i for i in (1, 2, 3) if i != victim)

    class ClusterBroker:
        bootstrap = cluster.bootstrap()
    keys = [f"k{i:02d}" for i in range(16)]
    load = KeyedLoad(ClusterBroker, topic, keys, rocketmq=False)
    try:
        time.sleep(2.0)
        split = json.loads(weir(admin_of[survivor], "topic", "split", topic, "--partition", str(parent["id"]),
                                "--wait-ms", "0", "--json").stdout)
        assert split["moving"] == [2, 3] or split["new_leaders"] == [2, 3], split
        cluster.node(victim).kill9()
        time.sleep(3.0)
        cluster.node(victim).start()

        def in_force():
            physical = {p["id"]: p for p in describe(admin_of[survivor], topic)["elastic"]["physical"]}
            return physical[parent["id"]]["state"] == "retired" and all(
                p["leader"] in (1, 2, 3) for p in physical.values() if p["state"] == "active")
        wait_until(in_force, timeout=90, interval=1.0, what="the split's moves done after the kill")
        time.sleep(1.0)
    finally:
        total = load.finish()
    check_order(load.acked, consume_kafka(cluster.bootstrap(), topic, load.acked, {}, "classic group"), 4, "classic group")


def test_the_controller_moves_a_physical_partition_off_a_hot_broker_by_measured_load(cluster_factory):
    """Both physical partitions of a topic on one broker of three, under keyed producers: the
    brokers' heartbeats report the traffic, the controller sees that broker beyond the band and
    moves one physical partition to the coldest broker (`weir cluster balance` shows the loads),
    and every acknowledged write is read back in per-key order."""
    cluster = cluster_factory(voters=3, settings={
        "replica.lag.time.max.ms": "2000", "replica.fetch.wait.max.ms": "200",
        "elastic.balance.interval.ms": "2000", "elastic.balance.min.bytes.per.sec": "100"})
    admin = cluster.node(1).admin_url()
    topic = unique("elastic-balance")
    weir(admin, "topic", "create", topic, "--elastic", "--partitions", "2", "--stable-partitions", "4",
         "--replication-factor", "1")
    first, second = active(describe(admin, topic))
    hot = first["leader"]
    status, body = http("POST", f"{admin}/v1/reassignments", {"version": 1, "partitions": [
        {"topic": topic, "partition": s, "replicas": [hot]} for s in (second["stable_first"], second["stable_last"])]})
    assert status == 200 and not any("error" in r for r in body["results"]), body
    wait_until(lambda: all(p["leader"] == hot and not p.get("moving") for p in active(describe(admin, topic))),
               timeout=30, interval=0.5, what="both physical partitions on one broker")

    class ClusterBroker:
        bootstrap = cluster.bootstrap()
    load = KeyedLoad(ClusterBroker, topic, [f"k{i:02d}" for i in range(16)], rocketmq=False)
    try:
        def moved_off():
            return any(p["leader"] not in (hot, -1) for p in active(describe(admin, topic)))
        wait_until(moved_off, timeout=60, interval=1.0, what="a physical partition moved off the hot broker")
        report = json.loads(weir(admin, "cluster", "balance", "--json").stdout)
        assert report["enabled"] and {b["broker"] for b in report["brokers"]} == {1, 2, 3}, report
        assert all(b["reported"] for b in report["brokers"]), report
        text = weir(admin, "cluster", "balance").stdout
        assert "Load balance: on" in text and "TRAFFIC/S" in text, text
        time.sleep(1.0)
    finally:
        load.finish()
    check_order(load.acked, consume_kafka(cluster.bootstrap(), topic, load.acked, {}, "classic group"), 4, "classic group")


def test_an_elastic_layout_and_its_records_survive_kill9_and_restart(fresh_broker):
    """The layout is metadata (committed to the metadata log): after splits, a merge, kill -9 and
    a restart, describe shows the same physical partitions and the records are all there."""
    admin = fresh_broker.admin_url()
    topic = unique("elastic-restart")
    weir(admin, "topic", "create", topic, "--elastic", "--partitions", "1", "--stable-partitions", "8")
    weir(admin, "topic", "split", topic, "--partition", "0")
    weir(admin, "topic", "split", topic, "--partition", "2")
    weir(admin, "topic", "merge", topic, "--partitions", "3,4")
    status, body = http("POST", f"{admin}/v1/topics/{topic}/records",
                        {"records": [{"key": f"k{i}", "value": f"v{i}"} for i in range(40)]})
    assert status == 200, body
    before = describe(admin, topic)
    fresh_broker.kill9()
    fresh_broker.start()
    admin = fresh_broker.admin_url()
    after = describe(admin, topic)
    shape = lambda d: [(p["id"], p["state"], p["stable_first"], p["stable_last"], p["parents"] if "parents" in p else [])
                       for p in d["elastic"]["physical"]]
    assert shape(after) == shape(before), (shape(before), shape(after))
    assert sum(p["log_end_offset"] for p in after["partitions"]) == 40
