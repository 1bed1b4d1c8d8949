"""FIFO message groups (the group setting consume.fifo) with the official RocketMQ 5 Python
client against a real `weir` process.

The contract: on a topic with message.type=FIFO, every message of one message group lands in
one queue. For a consumer group with consume.fifo=true, per queue, a message group's next
message is handed out only after the one before it is acked (or dead-lettered); a receive never
hands out two messages of one message group at once; other message groups go on meanwhile. A
group without the setting (the default) gets a message group's messages without waiting.
"""

import random
import subprocess
import threading
import time
from collections import defaultdict

from rocketmq import ConsumeResult, MessageListener

from conftest import weir_bin
from helpers import c_admin, c_create_topic, c_produce, c_producer, http, unique
from test_rocketmq import message, push_consumer, send_all, simple_consumer


def fifo_topic(broker, partitions):
    topic = unique("rmq-fifo")
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=partitions, config={"message.type": "FIFO"})
    return topic


def fifo_group_via_http(broker, **configs):
    group = unique("g-fifo")
    body = {"consume.fifo": "true"}
    body.update({k.replace("_", "."): str(v) for k, v in configs.items()})
    status, created = http("POST", f"{broker.admin_url()}/v1/groups", {"name": group, "configs": body})
    assert status == 201, created
    return group


def fifo_group_via_cli(broker):
    group = unique("g-fifo")
    cli = subprocess.run(
        [str(weir_bin()), "group", "create", group, "--fifo", "--admin", broker.admin_url()],
        capture_output=True, text=True, timeout=30,
    )
    assert cli.returncode == 0, cli.stderr
    return group


def group_of(body):
    """Bodies are b"<message group>/<sequence number>"."""
    name, seq = body.decode().rsplit("/", 1)
    return name, int(seq)


def interleaved(topic, groups, per_group):
    """per_group messages of each message group, sent round after round: the groups' messages
    are mixed in every queue."""
    return [message(topic, f"{g}/{i}".encode(), group=g) for i in range(per_group) for g in groups]


def test_concurrent_simple_consumers_of_a_fifo_group_get_each_message_group_in_order_one_message_at_a_time(broker):
    topic = fifo_topic(broker, partitions=3)
    group = fifo_group_via_http(broker)
    groups = [f"mg{i:02d}" for i in range(12)]
    per_group = 5
    send_all(broker, topic, interleaved(topic, groups, per_group))
    total = len(groups) * per_group

    lock = threading.Lock()
    out = {}                      # message group -> body handed out and not acked yet
    deliveries = defaultdict(list)  # message group -> sequence numbers in delivery order
    acks = defaultdict(list)        # message group -> sequence numbers in ack order
    violations, errors = [], []
    all_acked = threading.Event()

    def consume(name):
        consumer = simple_consumer(broker, group, topic, await_s=1)
        try:
            deadline = time.monotonic() + 60
            while not all_acked.is_set() and time.monotonic() < deadline:
                batch = consumer.receive(16, 15)
                in_batch = [group_of(m.body)[0] for m in batch]
                if len(in_batch) != len(set(in_batch)):
                    with lock:
                        violations.append(f"{name}: one receive handed out {sorted(in_batch)}")
                for m in batch:
                    g, seq = group_of(m.body)
                    with lock:
                        if g in out:
                            violations.append(f"{name} got {m.body!r} while {out[g]!r} was out unacked")
                        out[g] = m.body
                        deliveries[g].append((seq, m.delivery_attempt))
                    time.sleep(random.uniform(0, 0.03))
                    with lock:
                        # Cleared before the ack: once acked, the next may go to another thread.
                        del out[g]
                        acks[g].append(seq)
                        if sum(len(a) for a in acks.values()) == total:
                            all_acked.set()
                    consumer.ack(m)
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(f"{name}: {e!r}")
        finally:
            consumer.shutdown()

    threads = [threading.Thread(target=consume, args=(f"c{i}",), daemon=True) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not errors, errors
    assert not violations, violations[:5]
    assert all_acked.is_set(), f"acked {sum(len(a) for a in acks.values())} of {total} messages"
    for g in groups:
        assert deliveries[g] == [(i, 1) for i in range(per_group)], f"message group {g}: deliveries {deliveries[g]}"
        assert acks[g] == list(range(per_group)), f"message group {g}: acks {acks[g]}"

    # Nothing comes back afterwards: each message was received and acked once.
    again = simple_consumer(broker, group, topic, await_s=1)
    try:
        late = []
        for _ in range(3):  # one receive per queue
            late += again.receive(32, 15)
        assert late == [], [m.body for m in late]
    finally:
        again.shutdown()


def test_an_unacked_message_blocks_only_its_own_message_group_until_it_is_acked(broker):
    # One queue: the blocked group and the flowing one share it.
    topic = fifo_topic(broker, partitions=1)
    group = fifo_group_via_http(broker)
    send_all(broker, topic, [
        message(topic, b"stuck/0", group="stuck"),
        message(topic, b"stuck/1", group="stuck"),
        message(topic, b"free/0", group="free"),
        message(topic, b"free/1", group="free"),
        message(topic, b"free/2", group="free"),
    ])
    consumer = simple_consumer(broker, group, topic, await_s=1)
    log = []  # (body, attempt)
    try:
        acked_stuck_at = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for m in consumer.receive(32, 1):
                log.append((m.body, m.delivery_attempt))
                if m.body.startswith(b"free/"):
                    consumer.ack(m)
                elif m.body == b"stuck/0" and m.delivery_attempt >= 4:
                    # Held through three invisible times while "free" flowed: now let it go.
                    consumer.ack(m)
                    acked_stuck_at = len(log)
            if any(body == b"stuck/1" for body, _ in log):
                break
        # stuck/1 is not redelivered: acked at once below. Nothing else may come.
    finally:
        consumer.shutdown()

    stuck_0 = [attempt for body, attempt in log if body == b"stuck/0"]
    assert stuck_0 == [1, 2, 3, 4], f"stuck/0's deliveries: {stuck_0} (log {log})"
    assert [(b, a) for b, a in log if b.startswith(b"free/")] == [(b"free/0", 1), (b"free/1", 1), (b"free/2", 1)], (
        f"the other message group flows, in order, once each: {log}"
    )
    first_free_2 = log.index((b"free/2", 1))
    first_stuck_2nd = log.index((b"stuck/0", 2))
    assert first_free_2 < first_stuck_2nd, f"free/2 had to wait for stuck/0's redelivery: {log}"
    assert acked_stuck_at is not None, log
    stuck_1 = [(i, attempt) for i, (body, attempt) in enumerate(log) if body == b"stuck/1"]
    assert len(stuck_1) == 1, f"stuck/1 was delivered {len(stuck_1)} times: {log}"
    assert stuck_1[0][0] >= acked_stuck_at, f"stuck/1 came before stuck/0 was acked: {log}"
    assert stuck_1[0][1] == 1, f"stuck/1's first delivery is attempt 1: {log}"


def test_an_unacked_message_with_a_deep_backlog_behind_it_still_blocks_only_its_own_message_group(broker):
    """4,200 messages of one message group, then 3 of another, in one queue (written by a Kafka
    producer: the record key and the weir.message-group header make the message group). While
    the first is held unacked, the other group's messages must still flow: parking the held
    group's backlog must not fill the queue's state (4,096 messages) and stop the queue."""
    topic = fifo_topic(broker, partitions=1)
    group = fifo_group_via_http(broker)
    backlog = 4200

    def record(g, i):
        return {"key": g.encode(), "value": f"{g}/{i}".encode(), "headers": [("weir.message-group", g.encode())]}

    c_produce(c_producer(broker.bootstrap), topic, [record("hot", i) for i in range(backlog)] + [record("cold", i) for i in range(3)])
    consumer = simple_consumer(broker, group, topic, await_s=1)
    got = []
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len([b for b in got if b.startswith(b"cold/")]) < 3:
            for m in consumer.receive(32, 30):
                got.append(m.body)
                if m.body.startswith(b"cold/"):
                    consumer.ack(m)
    finally:
        consumer.shutdown()
    assert got[0] == b"hot/0", got[:5]
    assert [b for b in got if b.startswith(b"hot/")] == [b"hot/0"], "the held message's group waits"
    assert [b for b in got if b.startswith(b"cold/")] == [b"cold/0", b"cold/1", b"cold/2"], (
        f"the other message group did not flow past the held one's backlog: received {got}"
    )


def test_a_message_groups_next_message_follows_once_the_one_before_is_dead_lettered(broker):
    topic = fifo_topic(broker, partitions=1)
    group = fifo_group_via_http(broker, max_delivery_attempts=2)
    send_all(broker, topic, [message(topic, b"poison/0", group="poison"), message(topic, b"poison/1", group="poison")])
    consumer = simple_consumer(broker, group, topic, await_s=1)
    log = []
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(body == b"poison/1" for body, _ in log):
            for m in consumer.receive(32, 1):
                log.append((m.body, m.delivery_attempt))
                if m.body == b"poison/1":
                    consumer.ack(m)
    finally:
        consumer.shutdown()
    assert log == [(b"poison/0", 1), (b"poison/0", 2), (b"poison/1", 1)], (
        f"two attempts of poison/0, then (dead-lettered) poison/1: {log}"
    )


def test_a_parked_message_stays_behind_its_unacked_predecessor_across_kill_9(broker_factory):
    broker = broker_factory()
    topic = fifo_topic(broker, partitions=1)
    group = fifo_group_via_http(broker)
    send_all(broker, topic, [message(topic, f"k/{i}".encode(), group="k") for i in range(3)])
    consumer = simple_consumer(broker, group, topic, await_s=1)
    try:
        got = []
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            got = consumer.receive(32, 2)
        assert [m.body for m in got] == [b"k/0"], [m.body for m in got]
    finally:
        consumer.shutdown()
    broker.kill9()
    broker.start()
    consumer = simple_consumer(broker, group, topic, await_s=1)
    log = []
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len([b for b, _ in log if b == b"k/2"]) == 0:
            for m in consumer.receive(32, 30):
                log.append((m.body, m.delivery_attempt))
                consumer.ack(m)
    finally:
        consumer.shutdown()
    assert log == [(b"k/0", 2), (b"k/1", 1), (b"k/2", 1)], f"k/0 comes back first, then the rest in order: {log}"


def test_a_group_without_the_fifo_setting_gets_a_message_groups_messages_without_waiting(broker):
    topic = fifo_topic(broker, partitions=1)
    bodies = [f"one/{i}".encode() for i in range(3)]
    send_all(broker, topic, [message(topic, b, group="one") for b in bodies])

    # The same topic, a FIFO group: only the first is out until it is acked.
    ordered = simple_consumer(broker, fifo_group_via_cli(broker), topic, await_s=1)
    try:
        got = []
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            got += ordered.receive(32, 30)
        assert [m.body for m in got] == [b"one/0"], [m.body for m in got]
    finally:
        ordered.shutdown()

    # A default group: all three at once, unacked.
    plain = simple_consumer(broker, unique("g-plain"), topic, await_s=1)
    try:
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            got += plain.receive(32, 30)
        assert sorted(m.body for m in got) == bodies, [m.body for m in got]
    finally:
        plain.shutdown()


class OrderedRecorder(MessageListener):
    """Records each consumption (body, attempt); notes a message consumed while another of its
    message group was; fails the first consumption of the bodies in `fail_once`. (A FIFO push
    consumer of the Python client retries a failed message locally, with the same delivery
    attempt, before acking it.)"""

    def __init__(self, log, overlaps, fail_once=()):
        self.log, self.overlaps, self.fail_once = log, overlaps, set(fail_once)
        self.busy = set()
        self.lock = threading.Lock()

    def consume(self, message):
        g = message.message_group
        with self.lock:
            if g in self.busy:
                self.overlaps.append(message.body)
            self.busy.add(g)
        try:
            time.sleep(0.02)
            self.log.append((message.body, message.delivery_attempt))
            if message.body in self.fail_once:
                self.fail_once.discard(message.body)
                return ConsumeResult.FAILURE
            return ConsumeResult.SUCCESS
        finally:
            with self.lock:
                self.busy.discard(g)


def test_a_fifo_push_consumer_learns_fifo_from_its_settings_and_consumes_each_message_group_in_order(broker):
    topic = fifo_topic(broker, partitions=2)
    group = fifo_group_via_cli(broker)
    groups = [f"pg{i}" for i in range(4)]
    per_group = 5
    log, overlaps = [], []
    # The first attempt of pg1/2 fails: its group waits for its retry, the others go on.
    consumer = push_consumer(broker, group, topic, OrderedRecorder(log, overlaps, fail_once={b"pg1/2"}))
    try:
        assert consumer.fifo, "Telemetry told the push consumer its group is FIFO"
        send_all(broker, topic, interleaved(topic, groups, per_group))
        want = len(groups) * per_group + 1
        deadline = time.monotonic() + 30
        while len(log) < want and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1)  # nothing more comes
        consumed = list(log)
    finally:
        consumer.shutdown()
    assert not overlaps, f"consumed while another message of its group was being consumed: {overlaps}"
    assert len(consumed) == want, f"{len(consumed)} consumptions, want {want}: {consumed}"
    assert all(attempt == 1 for _, attempt in consumed), f"each delivered once: {consumed}"
    for g in groups:
        seqs = [group_of(body)[1] for body, _ in consumed if group_of(body)[0] == g]
        expected = [0, 1, 2, 2, 3, 4] if g == "pg1" else list(range(per_group))
        assert seqs == expected, f"message group {g}: {seqs}"
