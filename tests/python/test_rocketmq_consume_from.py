"""Where a new RocketMQ group starts: the group setting `consume.from.where` (RocketMQ's
ConsumeFromWhere), with the official RocketMQ 5 Python client's SimpleConsumer.

- `CONSUME_FROM_FIRST_OFFSET` (the default): the oldest message the queue has.
- `CONSUME_FROM_LAST_OFFSET`: only what is sent after the group's first receive of the queue.
- `CONSUME_FROM_TIMESTAMP`: from the first message stored at or after `consume.timestamp`
  (milliseconds since the epoch, or `-DURATION` before the first receive).

The setting applies only to a queue the group has no position on: once it received from it,
it goes on from where it is, whatever the setting says later.
"""

import os
import subprocess
import time

from conftest import weir_bin
from helpers import c_admin, c_create_topic, unique
from test_rocketmq import message, send_all, simple_consumer


def weir(broker, *args):
    env = {**os.environ, "WEIR_ADMIN": broker.admin_url()}
    done = subprocess.run([str(weir_bin()), *args], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, f"weir {' '.join(args)}: {done.stderr}"
    return done.stdout


def new_topic(broker, prefix):
    topic = unique(prefix)
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=1)
    return topic


def send(broker, topic, *bodies):
    send_all(broker, topic, [message(topic, body.encode()) for body in bodies])


def receive_for(consumer, seconds, want=None):
    """The bodies `consumer` receives (and acks) within `seconds`, or until it has `want`."""
    got = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and (want is None or len(got) < want):
        for m in consumer.receive(32, 30):
            got.append(m.body.decode())
            consumer.ack(m)
    return sorted(got)


def test_a_new_group_starts_at_the_oldest_message_by_default_and_with_first_offset(broker):
    topic = new_topic(broker, "rmq-from-first")
    send(broker, topic, "old-0", "old-1", "old-2")
    explicit = unique("g")
    weir(broker, "group", "create", explicit, "--config", "consume.from.where=CONSUME_FROM_FIRST_OFFSET")
    for group in (unique("g"), explicit):
        consumer = simple_consumer(broker, group, topic, await_s=1)
        try:
            assert receive_for(consumer, 10, want=3) == ["old-0", "old-1", "old-2"], group
        finally:
            consumer.shutdown()


def test_a_new_group_from_the_last_offset_gets_only_what_is_sent_after_its_first_receive(broker):
    topic, group = new_topic(broker, "rmq-from-last"), unique("g")
    send(broker, topic, "old-0", "old-1", "old-2")
    weir(broker, "group", "create", group, "--config", "consume.from.where=CONSUME_FROM_LAST_OFFSET")
    consumer = simple_consumer(broker, group, topic, await_s=1)
    try:
        assert receive_for(consumer, 2) == [], "nothing old"
        send(broker, topic, "new-0", "new-1")
        assert receive_for(consumer, 10, want=2) == ["new-0", "new-1"]
    finally:
        consumer.shutdown()

    # The group has a position now: messages sent while no consumer runs are kept for it, and
    # changing the setting does not move it.
    send(broker, topic, "while-away-0", "while-away-1")
    weir(broker, "group", "alter", group, "--set", "consume.from.where=CONSUME_FROM_FIRST_OFFSET")
    consumer = simple_consumer(broker, group, topic, await_s=1)
    try:
        assert receive_for(consumer, 10, want=2) == ["while-away-0", "while-away-1"]
        assert receive_for(consumer, 2) == [], "no old message: the position is the group's"
    finally:
        consumer.shutdown()


def test_a_position_taken_from_the_last_offset_survives_kill_9(broker_factory):
    """The first receive's position is journalled at once: what is sent after it, while no
    consumer runs, is the group's after a crash and a restart (not skipped by a new "latest")."""
    broker = broker_factory()
    topic, group = new_topic(broker, "rmq-from-last-crash"), unique("g")
    send(broker, topic, "old-0", "old-1")
    weir(broker, "group", "create", group, "--config", "consume.from.where=CONSUME_FROM_LAST_OFFSET")
    consumer = simple_consumer(broker, group, topic, await_s=1)
    try:
        assert receive_for(consumer, 2) == [], "nothing old"
    finally:
        consumer.shutdown()
    send(broker, topic, "meanwhile-0", "meanwhile-1")
    broker.kill9()
    broker.start()
    consumer = simple_consumer(broker, group, topic, await_s=1)
    try:
        assert receive_for(consumer, 15, want=2) == ["meanwhile-0", "meanwhile-1"]
    finally:
        consumer.shutdown()


def test_a_new_group_from_a_timestamp_starts_at_the_first_message_stored_at_or_after_it(broker):
    topic = new_topic(broker, "rmq-from-time")
    send(broker, topic, "before-0", "before-1")
    time.sleep(0.1)  # the later records are stored strictly later
    middle_ms = int(time.time() * 1000)
    time.sleep(0.1)
    send(broker, topic, "after-0", "after-1")

    at_time = unique("g")
    weir(
        broker, "group", "create", at_time,
        "--config", "consume.from.where=CONSUME_FROM_TIMESTAMP", "--config", f"consume.timestamp={middle_ms}",
    )
    consumer = simple_consumer(broker, at_time, topic, await_s=1)
    try:
        assert receive_for(consumer, 10, want=2) == ["after-0", "after-1"]
        assert receive_for(consumer, 1.5) == []
    finally:
        consumer.shutdown()

    # Relative to the first receive: an hour back is every message here; a time after the last
    # message is the queue's end (only what comes next).
    hour_back, future = unique("g"), unique("g")
    weir(broker, "group", "create", hour_back,
         "--config", "consume.from.where=CONSUME_FROM_TIMESTAMP", "--config", "consume.timestamp=-1h")
    weir(broker, "group", "create", future,
         "--config", "consume.from.where=CONSUME_FROM_TIMESTAMP", "--config", f"consume.timestamp={middle_ms + 3_600_000}")
    consumer = simple_consumer(broker, hour_back, topic, await_s=1)
    try:
        assert receive_for(consumer, 10, want=4) == ["after-0", "after-1", "before-0", "before-1"]
    finally:
        consumer.shutdown()
    consumer = simple_consumer(broker, future, topic, await_s=1)
    try:
        assert receive_for(consumer, 2) == []
        send(broker, topic, "next")
        assert receive_for(consumer, 10, want=1) == ["next"]
    finally:
        consumer.shutdown()


def test_a_bad_consume_from_where_is_refused_naming_the_setting(broker):
    env = {**os.environ, "WEIR_ADMIN": broker.admin_url()}
    done = subprocess.run(
        [str(weir_bin()), "group", "create", unique("g"), "--config", "consume.from.where=CONSUME_FROM_MIDDLE"],
        capture_output=True, text=True, env=env, timeout=60,
    )
    assert done.returncode != 0 and "consume.from.where" in done.stderr, done.stderr
    created = weir(broker, "group", "create", unique("g"))
    lines = {line.split()[0]: line.split()[1:] for line in created.splitlines() if line.startswith("consume.")}
    assert lines["consume.from.where"] == ["CONSUME_FROM_FIRST_OFFSET", "default"], created
    assert lines["consume.timestamp"] == ["-30m", "default"], created
