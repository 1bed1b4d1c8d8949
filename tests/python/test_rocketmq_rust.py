"""The official RocketMQ 5 Rust client (crates.io `rocketmq` 5.0.0) against Weir: the program in
tests/rust-client (built by scripts/test into target/rust-client) sends tagged messages with keys
and properties and a FIFO message group, receives them with a SimpleConsumer and acks them,
checking what it got itself; a Kafka consumer then reads what it sent.
"""

import json
import os
import pathlib
import subprocess

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from helpers import c_admin, c_consume, c_consumer, c_create_topic, c_read_partition, unique

REPO = pathlib.Path(__file__).resolve().parents[2]
CLIENT = pathlib.Path(
    os.environ.get("WEIR_ROCKETMQ_RUST_CLIENT")
    or REPO / "target" / "rust-client" / "debug" / "weir-rocketmq-rust-client"
)
BUILD = "cargo build --locked --manifest-path tests/rust-client/Cargo.toml --target-dir target/rust-client"

BODIES = [f"rust-{i}: ржавчина ✓ 錆 🦀" for i in range(5)]
TAGS = ["TagA", "TagB", "TagA", "TagB", "TagA"]


def test_the_rust_client_sends_receives_by_tag_acks_and_keeps_a_message_group(broker):
    assert CLIENT.is_file(), f"{CLIENT} is missing: run scripts/test, or `{BUILD}`"
    # TOPIC is auto-created by the client's route query, with num.partitions (1) queues: the
    # program's receive after the acks asks that one queue. The FIFO topic has several queues:
    # the broker puts the message group in one of them, the consumer asks them in turn.
    topic, fifo_topic, group = unique("rmq-rust"), unique("rmq-rust-fifo"), unique("g")
    c_create_topic(c_admin(broker.bootstrap), fifo_topic, partitions=3, config={"message.type": "FIFO"})
    run = subprocess.run(
        [str(CLIENT), broker.rocketmq_endpoint, topic, fifo_topic, group],
        capture_output=True,
        text=True,
        timeout=100,
    )
    failure = [line for line in run.stderr.splitlines() if line.startswith("FAILED:")]
    assert run.returncode == 0, f"the Rust client exited {run.returncode}: {failure}\n{run.stderr[-8000:]}"
    seen = json.loads(run.stdout.strip().splitlines()[-1])

    received = seen["received"]
    assert [r["body"] for r in received] == [BODIES[0], BODIES[2], BODIES[4]], "TagA only"
    assert [r["messageId"] for r in received] == [seen["sent"][i] for i in (0, 2, 4)]
    assert [r["keys"] for r in received] == [[f"rust-key-{i}", "rust-common-key"] for i in (0, 2, 4)]
    assert [r["properties"] for r in received] == [{"lang": "ржавчина", "index": str(i)} for i in (0, 2, 4)]
    assert all(r["tag"] == "TagA" and r["attempt"] == 1 for r in received)
    assert seen["after"] == 0, "acked messages came back"
    assert [r["body"] for r in seen["fifoReceived"]] == [f"fifo-{i}: порядок" for i in range(3)]
    assert {r["messageGroup"] for r in seen["fifoReceived"]} == {"rust-order-42"}

    # What the Rust producer sent, as a Kafka consumer reads it.
    got = c_read_partition(broker.bootstrap, topic, 0, 5)
    assert [r.value.decode() for r in got] == BODIES
    headers = [r.headers for r in got]
    assert [dict(h)["weir.tag"] for h in headers] == [t.encode() for t in TAGS]
    assert [[v for k, v in h if k == "weir.key"] for h in headers] == [
        [f"rust-key-{i}".encode(), b"rust-common-key"] for i in range(5)
    ]
    assert [dict(h)["weir.message-id"].decode() for h in headers] == seen["sent"]
    assert all(dict(h)["lang"] == "ржавчина".encode() for h in headers)

    # The message group: one queue, in order, keyed by the group.
    consumer = c_consumer(broker.bootstrap)
    try:
        consumer.assign([TopicPartition(fifo_topic, q, OFFSET_BEGINNING) for q in range(3)])
        fifo = c_consume(consumer, 3)
    finally:
        consumer.close()
    assert len({r.partition for r in fifo}) == 1, "the message group spread over queues"
    assert [r.value.decode() for r in fifo] == [f"fifo-{i}: порядок" for i in range(3)]
    assert {r.key for r in fifo} == {b"rust-order-42"}


def test_the_rust_client_delays_a_message_and_commits_and_rolls_back_transactions(broker):
    assert CLIENT.is_file(), f"{CLIENT} is missing: run scripts/test, or `{BUILD}`"
    admin = c_admin(broker.bootstrap)
    delay_topic, tx_topic, group = unique("rmq-rust-delay"), unique("rmq-rust-tx"), unique("g")
    c_create_topic(admin, delay_topic, config={"message.type": "DELAY"})
    c_create_topic(admin, tx_topic, config={"message.type": "TRANSACTION"})
    run = subprocess.run(
        [str(CLIENT), "messaging", broker.rocketmq_endpoint, delay_topic, tx_topic, group],
        capture_output=True,
        text=True,
        timeout=100,
    )
    failure = [line for line in run.stderr.splitlines() if line.startswith("FAILED:")]
    assert run.returncode == 0, f"the Rust client exited {run.returncode}: {failure}\n{run.stderr[-8000:]}"
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    # The program checked it did not come early; it came within the window (a CI margin).
    assert seen["delayedArrivedMs"] - seen["dueMs"] < 5000, seen
    assert seen["delayedDeliveryTimestamp"] is not None

    # Kafka sees the committed message once, never the rolled-back one, and the delayed one.
    (committed,) = c_read_partition(broker.bootstrap, tx_topic, 0, 1)
    assert committed.value == b"rust-committed"
    assert dict(committed.headers)["weir.message-id"].decode() == seen["committed"]
    (delayed,) = c_read_partition(broker.bootstrap, delay_topic, 0, 1)
    assert delayed.value == b"rust-delayed"
    assert int(dict(delayed.headers)["weir.delivery-timestamp"]) == seen["dueMs"]
