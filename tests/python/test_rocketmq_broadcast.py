"""Broadcast groups (the group setting consume.broadcast) with the official RocketMQ 5 Python
client against a real `weir` process.

The contract: in a broadcast group every consumer client (each SimpleConsumer or PushConsumer
instance has a client id of its own) gets every message of the topic and acks it for itself:
one consumer's ack does not take the message from another, and a message one consumer leaves
unacked comes back to that consumer only. In a normal group, the consumers share the messages:
each goes to one of them.
"""

import subprocess
import time

from conftest import weir_bin
from helpers import c_admin, c_create_topic, http, unique
from test_rocketmq import Recorder, message, push_consumer, send_all, simple_consumer


def broadcast_group_via_cli(broker):
    group = unique("g-bcast")
    cli = subprocess.run(
        [str(weir_bin()), "group", "create", group, "--broadcast", "--admin", broker.admin_url()],
        capture_output=True, text=True, timeout=30,
    )
    assert cli.returncode == 0, cli.stderr
    return group


def broadcast_group_via_http(broker):
    group = unique("g-bcast")
    status, created = http("POST", f"{broker.admin_url()}/v1/groups", {"name": group, "configs": {"consume.broadcast": "true"}})
    assert status == 201, created
    assert {c["name"]: (c["value"], c["source"]) for c in created["configs"]}["consume.broadcast"] == ("true", "group"), created
    return group


def topic_with(broker, partitions, n):
    topic = unique("rmq-bcast")
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=partitions)
    bodies = [f"b{i:02d}".encode() for i in range(n)]
    send_all(broker, topic, [message(topic, b) for b in bodies])
    return topic, bodies


def receive_for(consumer, seconds, invisible_s=30, want=None, ack=False):
    """Receives until `want` messages came or `seconds` passed; acks them if told to."""
    got = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and (want is None or len(got) < want):
        for m in consumer.receive(32, invisible_s):
            got.append(m)
            if ack:
                consumer.ack(m)
    return got


def receive_each(consumer, bodies, seconds, invisible_s, ack=False):
    """Receives until every one of `bodies` came at least once or `seconds` passed: every
    delivery, redeliveries included. The Python SimpleConsumer picks a queue at random for each
    receive (it makes a new queue selector every time), so one queue may be asked twice before
    the other once, and a message left unacked there may come again in the meantime."""
    got = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and {m.body for m in got} != set(bodies):
        for m in consumer.receive(32, invisible_s):
            got.append(m)
            if ack:
                consumer.ack(m)
    return got


def test_every_consumer_of_a_broadcast_group_gets_every_message_and_acks_for_itself(broker):
    topic, bodies = topic_with(broker, partitions=2, n=10)
    group = broadcast_group_via_cli(broker)
    a = simple_consumer(broker, group, topic, await_s=1)
    b = simple_consumer(broker, group, topic, await_s=1)
    try:
        assert a.client_id != b.client_id
        # a takes everything and acks it.
        got_a = receive_each(a, bodies, 15, invisible_s=30, ack=True)
        assert sorted(m.body for m in got_a) == bodies
        assert all(m.delivery_attempt == 1 for m in got_a)
        # b still gets everything, first time at attempt 1: a's acks were a's own. b holds them
        # unacked for 2 s.
        got_b = receive_each(b, bodies, 15, invisible_s=2)
        first_b = {}
        for m in got_b:
            first_b.setdefault(m.body, m.delivery_attempt)
        assert sorted(first_b) == bodies
        assert set(first_b.values()) == {1}, first_b
        held_until = time.monotonic() + 2
        # a gets nothing more, not even once b's invisible time has run out.
        assert receive_for(a, 3.5) == [], "a acked everything: nothing comes back to a"
        assert time.monotonic() > held_until + 0.5
        # b's unacked messages come back to b, an attempt higher each time.
        again_b = receive_each(b, bodies, 15, invisible_s=30, ack=True)
        assert sorted(m.body for m in again_b) == bodies
        assert all(m.delivery_attempt >= 2 for m in again_b), [m.delivery_attempt for m in again_b]
        assert receive_for(a, 1.5) == [] and receive_for(b, 1.5) == []
    finally:
        a.shutdown()
        b.shutdown()


def test_in_a_normal_group_two_consumers_share_the_messages_each_to_one_of_them(broker):
    topic, bodies = topic_with(broker, partitions=2, n=10)
    group = unique("g-shared")
    a = simple_consumer(broker, group, topic, await_s=1)
    b = simple_consumer(broker, group, topic, await_s=1)
    try:
        got_a, got_b = [], []
        deadline = time.monotonic() + 15
        while len(got_a) + len(got_b) < 10 and time.monotonic() < deadline:
            got_a += a.receive(3, 30)  # small batches: both take some
            got_b += b.receive(3, 30)
        # And nothing more for either (held for 30 s, nobody else gets them meanwhile).
        got_a += receive_for(a, 1.5)
        got_b += receive_for(b, 1.5)
    finally:
        a.shutdown()
        b.shutdown()
    bodies_a, bodies_b = [m.body for m in got_a], [m.body for m in got_b]
    assert sorted(bodies_a + bodies_b) == bodies, (bodies_a, bodies_b)
    assert bodies_a and bodies_b, "both consumers took some"
    assert not set(bodies_a) & set(bodies_b)


def test_a_message_one_broadcast_consumer_leaves_unacked_comes_back_to_it_only(broker):
    topic, _ = topic_with(broker, partitions=1, n=0)
    group = broadcast_group_via_http(broker)
    a = simple_consumer(broker, group, topic, await_s=1)
    b = simple_consumer(broker, group, topic, await_s=1)
    try:
        send_all(broker, topic, [message(topic, b"for both")])
        [first_a] = receive_for(a, 10, want=1, invisible_s=1)
        [first_b] = receive_for(b, 10, want=1)
        b.ack(first_b)
        # b acked; a did not: after its 1 s, it comes back to a, never to b.
        back = receive_for(a, 10, want=1)
        assert [(m.body, m.delivery_attempt) for m in back] == [(b"for both", 2)]
        assert receive_for(b, 2) == []
        # The first delivery's handle is stale; the second acks it.
        a.ack(back[0])
        assert receive_for(a, 2, invisible_s=1) == []
        assert first_a.message_id == first_b.message_id == back[0].message_id
    finally:
        a.shutdown()
        b.shutdown()


def test_two_push_consumers_of_a_broadcast_group_each_consume_every_message_once(broker):
    topic = unique("rmq-bcast-push")
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=2)
    group = broadcast_group_via_cli(broker)
    log = []
    consumers = [push_consumer(broker, group, topic, Recorder(f"c{i}", log)) for i in range(2)]
    try:
        bodies = sorted(f"p{i:02d}".encode() for i in range(20))
        send_all(broker, topic, [message(topic, b) for b in bodies])
        deadline = time.monotonic() + 30
        while len(log) < 40 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)  # nothing more comes
        consumed = list(log)
    finally:
        for c in consumers:
            c.shutdown()
    for name in ("c0", "c1"):
        mine = sorted(body for who, body, _, _ in consumed if who == name)
        assert mine == bodies, f"{name} consumed {len(mine)} messages: {mine}"
    assert all(attempt == 1 for _, _, attempt, _ in consumed)
