"""RocketMQ consumers read committed data only: records a Kafka transactional producer
(confluent-kafka) aborted are never delivered to a RocketMQ SimpleConsumer, nor found by a query
by key, id or time; records of a transaction still open, and everything after them, wait until
it commits. The group's position steps over the aborted records and the transaction markers, so
the queue is not stuck behind them (its progress, mirrored as the group's Kafka committed
offset, reaches the end of the log).
"""

import time

from helpers import TIMEOUT_S, c_admin, c_create_topic, c_producer, http, unique
from test_rocketmq import Recorder, find, push_consumer, simple_consumer, wait_found


def txn_producer(bootstrap):
    p = c_producer(bootstrap, {"transactional.id": unique("tx"), "linger.ms": 1})
    p.init_transactions(TIMEOUT_S)
    return p


def produce(producer, topic, prefix, n):
    """`n` records `prefix-i`, each with that as its RocketMQ key and the tag `T`."""
    for i in range(n):
        value = f"{prefix}-{i}".encode()
        producer.produce(topic, value=value, partition=0, headers=[("weir.key", value), ("weir.tag", b"T")])


def receive_for(consumer, seconds, want=None):
    """What `consumer` receives (and acks) within `seconds`, or until it has `want`."""
    got = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and (want is None or len(got) < want):
        for m in consumer.receive(32, 30):
            got.append(m)
            consumer.ack(m)
    return [m.body.decode() for m in got]


def test_a_rocketmq_consumer_gets_committed_records_only_and_waits_for_an_open_transaction(broker):
    topic, group = unique("rmq-rc"), unique("g")
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=1, config={"message.index.enable": "true"})
    aborting, committing, open_one = (txn_producer(broker.bootstrap) for _ in range(3))

    aborting.begin_transaction()
    produce(aborting, topic, "aborted", 10)
    aborting.flush(TIMEOUT_S)  # on the broker before the abort, so that there is something to abort
    aborting.abort_transaction(TIMEOUT_S)
    committing.begin_transaction()
    produce(committing, topic, "committed", 5)
    committing.commit_transaction(TIMEOUT_S)
    # Left open while the consumer polls: it, and a plain record after it, must wait.
    open_one.begin_transaction()
    produce(open_one, topic, "open", 3)
    open_one.flush(TIMEOUT_S)
    plain = c_producer(broker.bootstrap)
    produce(plain, topic, "after-open", 2)
    plain.flush(TIMEOUT_S)

    consumer = simple_consumer(broker, group, topic, await_s=1)
    try:
        got = receive_for(consumer, 6, want=6)
        assert sorted(got) == [f"committed-{i}" for i in range(5)], got
        assert receive_for(consumer, 2) == [], "nothing past the open transaction"

        open_one.commit_transaction(TIMEOUT_S)
        got = receive_for(consumer, 15, want=5)
        assert sorted(got) == sorted([f"open-{i}" for i in range(3)] + ["after-open-0", "after-open-1"]), got
        assert receive_for(consumer, 2) == [], "nothing else, and no transaction marker"
    finally:
        consumer.shutdown()

    # The group's position went past every aborted record and marker: its progress, committed as
    # its Kafka offset, is the end of the log (10 aborted + marker, 5 + marker, 3 + 2 + marker).
    log_end = 10 + 1 + 5 + 1 + 3 + 2 + 1
    deadline, offsets = time.monotonic() + 20, None
    while time.monotonic() < deadline:
        status, described = http("GET", f"{broker.admin_url()}/v1/groups/{group}")
        offsets = described.get("offsets") if status == 200 else None
        if offsets and offsets[0]["committed_offset"] == log_end:
            break
        time.sleep(0.5)
    assert offsets and (offsets[0]["committed_offset"], offsets[0]["lag"]) == (log_end, 0), offsets

    # A tag filter served from the message index skips the aborted records too.
    assert wait_found(broker, topic, 1, key="after-open-1"), "the index caught up"
    tagged = simple_consumer(broker, unique("g"), topic, expression="T", await_s=1)
    try:
        got = receive_for(tagged, 15, want=10)
        assert sorted(got) == sorted(
            [f"committed-{i}" for i in range(5)] + [f"open-{i}" for i in range(3)] + ["after-open-0", "after-open-1"]
        ), got
    finally:
        tagged.shutdown()

    # Queries: the aborted records are not found by key, by derived id, nor in a time window.
    assert find(broker, topic, key="aborted-0")[1]["messages"] == []
    assert [m["body"] for m in wait_found(broker, topic, 1, key="committed-3")] == ["committed-3"]
    status, window = find(broker, topic, begin_ms=0, max=1000)
    assert status == 200, window
    assert sorted(m["body"] for m in window["messages"]) == sorted(
        [f"committed-{i}" for i in range(5)] + [f"open-{i}" for i in range(3)] + ["after-open-0", "after-open-1"]
    ), window
    by_offset = {m["offset"]: m for m in window["messages"]}
    assert min(by_offset) == 11, "offsets 0-9 aborted, 10 the abort marker"
    derived = http("GET", f"{broker.admin_url()}/v1/topics/{topic}/messages/{by_offset[11]['message_id']}")
    assert derived[0] == 200 and derived[1]["body"] == "committed-0", derived


def test_a_message_id_of_an_aborted_record_is_not_found(broker):
    """A Kafka record stored without an id has one derived from its place; that of an aborted
    record finds nothing."""
    topic, group = unique("rmq-rc-id"), unique("g")
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=1)
    aborting = txn_producer(broker.bootstrap)
    aborting.begin_transaction()
    aborting.produce(topic, value=b"gone", partition=0)
    aborting.flush(TIMEOUT_S)
    aborting.abort_transaction(TIMEOUT_S)
    plain = c_producer(broker.bootstrap)
    plain.produce(topic, value=b"kept", partition=0)
    plain.flush(TIMEOUT_S)
    consumer = simple_consumer(broker, group, topic, await_s=1)
    try:
        deadline, got = time.monotonic() + 10, []
        while not got and time.monotonic() < deadline:
            got = consumer.receive(32, 30)
        [kept] = got
        consumer.ack(kept)
    finally:
        consumer.shutdown()
    assert kept.body == b"kept"
    status, found = http("GET", f"{broker.admin_url()}/v1/topics/{topic}/messages/{kept.message_id}")
    assert (status, found["offset"]) == (200, 2), found
    # A derived id ends with the record's offset (16 hex digits): offset 0 is the aborted record.
    aborted_id = kept.message_id[:-16] + f"{0:016X}"
    status, missing = http("GET", f"{broker.admin_url()}/v1/topics/{topic}/messages/{aborted_id}")
    assert (status, missing["error"]["code"]) == (404, "MESSAGE_NOT_FOUND"), missing


def test_a_push_consumer_gets_committed_records_only(broker):
    """A PushConsumer receives through the same engine: the records of an aborted transaction
    never reach its listener, those of the committed one do, once each."""
    topic, group = unique("rmq-rc-push"), unique("g")
    c_create_topic(c_admin(broker.bootstrap), topic, partitions=1)
    aborting, committing = txn_producer(broker.bootstrap), txn_producer(broker.bootstrap)
    aborting.begin_transaction()
    produce(aborting, topic, "aborted", 10)
    aborting.flush(TIMEOUT_S)
    aborting.abort_transaction(TIMEOUT_S)
    committing.begin_transaction()
    produce(committing, topic, "committed", 3)
    committing.commit_transaction(TIMEOUT_S)

    log = []
    consumer = push_consumer(broker, group, topic, Recorder("c", log))
    try:
        deadline = time.monotonic() + 30
        while len(log) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2)  # nothing more comes
    finally:
        consumer.shutdown()
    assert sorted(body.decode() for _, body, _, _ in log) == [f"committed-{i}" for i in range(3)], log
