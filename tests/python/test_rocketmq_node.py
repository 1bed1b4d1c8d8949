"""The official RocketMQ 5 Node.js client (npm rocketmq-client-nodejs, installed by scripts/test
into tests/node) against Weir: tests/node/roundtrip.mjs sends and receives, and a Kafka
consumer reads what it sent.
"""

import json
import pathlib
import shutil
import subprocess

from helpers import c_admin, c_create_topic, c_read_partition, unique

NODE_DIR = pathlib.Path(__file__).resolve().parents[1] / "node"


def test_the_nodejs_client_sends_receives_by_tag_and_acks(broker):
    node = shutil.which("node")
    assert node, "node is not installed (scripts/test needs Node.js)"
    assert (NODE_DIR / "node_modules" / "rocketmq-client-nodejs").is_dir(), (
        "rocketmq-client-nodejs is not installed: run scripts/test, or npm ci in tests/node"
    )
    topic, group = unique("rmq-node"), unique("g")
    run = subprocess.run(
        [node, "roundtrip.mjs", broker.rocketmq_endpoint, topic, group],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, f"node exited {run.returncode}\n{run.stdout}\n{run.stderr}"
    seen = json.loads(run.stdout.strip().splitlines()[-1])

    assert [s["offset"] for s in seen["sent"]] == [0, 1, 2]
    received = sorted(seen["received"], key=lambda r: r["body"])
    assert [r["body"] for r in received] == ["node-0", "node-2"], "TagA only"
    assert all(r["tag"] == "TagA" and r["lang"] == "узел.js" and r["attempt"] == 1 for r in received)
    assert [r["keys"] for r in received] == [["key-0"], ["key-2"]]
    assert [r["messageId"] for r in received] == [seen["sent"][0]["messageId"], seen["sent"][2]["messageId"]]
    assert seen["after"] == 0, "acked messages came back"

    # What the Node.js producer sent, as a Kafka consumer reads it.
    got = c_read_partition(broker.bootstrap, topic, 0, 3)
    assert [r.value for r in got] == [b"node-0", b"node-1", b"node-2"]
    assert [dict(r.headers)["weir.tag"] for r in got] == [b"TagA", b"TagB", b"TagA"]


def test_the_nodejs_client_delays_a_message_and_commits_and_rolls_back_transactions(broker):
    node = shutil.which("node")
    assert node, "node is not installed (scripts/test needs Node.js)"
    admin = c_admin(broker.bootstrap)
    delay_topic, tx_topic, group = unique("rmq-node-delay"), unique("rmq-node-tx"), unique("g")
    c_create_topic(admin, delay_topic, config={"message.type": "DELAY"})
    c_create_topic(admin, tx_topic, config={"message.type": "TRANSACTION"})
    try:
        # Below pytest's own timeout, so a hang shows the script's steps.
        run = subprocess.run(
            [node, "messaging.mjs", broker.rocketmq_endpoint, delay_topic, tx_topic, group],
            cwd=NODE_DIR,
            capture_output=True,
            text=True,
            timeout=90,
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"messaging.mjs did not end within 90 s; its steps:\n{e.stderr}\n{e.stdout}") from e
    assert run.returncode == 0, f"node exited {run.returncode}\n{run.stdout}\n{run.stderr}"
    seen = json.loads(run.stdout.strip().splitlines()[-1])

    assert seen["beforeCommit"] == [], "a transactional message was visible before its commit (or the delayed one early)"
    by_body = {r["body"]: r for r in seen["received"]}
    assert set(by_body) == {"node-delayed", "node-committed"}, seen
    delayed = by_body["node-delayed"]
    assert delayed["messageId"] == seen["delayedId"]
    # The client sends whole milliseconds; the broker fires within its window (CI's margin).
    assert seen["dueAt"] - 50 <= delayed["at"] <= seen["dueAt"] + 3000, (delayed["at"] - seen["dueAt"])
    assert delayed["deliveryTimestamp"] is not None and abs(delayed["deliveryTimestamp"] - seen["dueAt"]) < 1000
    assert by_body["node-committed"]["messageId"] == seen["committedId"]
    assert seen["extra"] == [], "the rolled-back message (or a duplicate) was delivered"

    # Kafka sees the committed message once and never the rolled-back one.
    (committed,) = c_read_partition(broker.bootstrap, tx_topic, 0, 1)
    assert committed.value == b"node-committed"
