"""What librdkafka's own test suite found missing, as tests of this project with the real client.

- 0011 (produce_batch, `test_message_single_partition_record_fail`): a batch with some invalid
  records (keyless records on a compacted topic) is refused with per-record errors (KIP-467
  `record_errors`), so librdkafka fails exactly those with INVALID_RECORD; the others fail with
  _INVALID_DIFFERENT_RECORD when they shared the batch, and are written when they did not.
- 0081 (admin): a topic's `compression.type` can be a codec; the broker then stores every batch
  with that codec, recompressing what producers sent with another.
- 0092 (mixed_msgver): deprecated topic configs Kafka 3.x still accepts
  (`message.format.version`, ...) are accepted, and change nothing.

Also: a header name given twice keeps both values, through the broker and back to the client.
"""

import pytest
from confluent_kafka import KafkaError, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from helpers import (
    TIMEOUT_S,
    c_admin,
    c_consumer,
    c_create_topic,
    c_produce,
    c_producer,
    c_read_partition,
    kp_read_partition,
    raw_batches,
    unique,
)

CODEC_IDS = {"uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def produce_collecting(producer, topic, records):
    """Produces every record to partition 0 and returns each one's delivery error (None: ok)."""
    reports = [None] * len(records)
    delivered = [False] * len(records)

    def on_delivery(i):
        def cb(err, _msg):
            reports[i] = err
            delivered[i] = True

        return cb

    for i, (key, value) in enumerate(records):
        producer.produce(topic, key=key, value=value, partition=0, on_delivery=on_delivery(i))
    assert producer.flush(TIMEOUT_S) == 0, "deliveries still pending"
    assert all(delivered), "every message gets a delivery report"
    return reports


def high_watermark(bootstrap, topic):
    consumer = c_consumer(bootstrap)
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT_S)[1]
    finally:
        consumer.close()


def hundred_with_every_tenth_keyless():
    return [(None if i % 10 == 0 else f"k{i}".encode(), f"message {i}".encode()) for i in range(100)]


def test_keyless_records_in_one_batch_fail_alone_with_record_errors(broker, closer):
    """librdkafka reads KIP-467's record errors: in a refused batch the keyless records fail
    with INVALID_RECORD and the others with librdkafka's "part of a batch which had invalid
    records". librdkafka decides the batching, and twice on a loaded CI machine sent these 100
    records in several batches despite the long linger, so the assertions hold for any
    batching; `bad_input.rs` sends one batch of its own and checks the broker's answer exactly."""
    admin = c_admin(broker.bootstrap)
    topic = c_create_topic(admin, unique("compacted-batch"), config={"cleanup.policy": "compact"})
    # One batch for all 100, as far as librdkafka lets us: metadata known before the first
    # produce (no unassigned queue), and the records linger until flush() sends them at once.
    producer = closer.add(c_producer(broker.bootstrap, {"linger.ms": 10_000, "batch.num.messages": 1000}))
    producer.list_topics(topic, timeout=TIMEOUT_S)
    records = hundred_with_every_tenth_keyless()
    reports = produce_collecting(producer, topic, records)
    invalid = [i for i, err in enumerate(reports) if err is not None and err.code() == KafkaError.INVALID_RECORD]
    assert invalid == list(range(0, 100, 10)), f"exactly the keyless ones fail with INVALID_RECORD: {invalid}"
    refused_with_them = [i for i, err in enumerate(reports) if err is not None and i % 10 != 0]
    assert all("invalid record" in reports[i].str().lower() for i in refused_with_them), reports[refused_with_them[0]]
    written = [i for i, err in enumerate(reports) if err is None]
    assert high_watermark(broker.bootstrap, topic) == len(written), "a refused batch writes nothing"
    if written:
        read = c_read_partition(broker.bootstrap, topic, 0, len(written))
        assert [m.key() for m in read] == [records[i][0] for i in written]


def test_keyless_records_in_batches_of_their_own_fail_and_the_others_are_written(broker, closer):
    admin = c_admin(broker.bootstrap)
    topic = c_create_topic(admin, unique("compacted-single"), config={"cleanup.policy": "delete,compact"})
    producer = closer.add(c_producer(broker.bootstrap, {"batch.size": 1, "linger.ms": 0}))
    reports = produce_collecting(producer, topic, hundred_with_every_tenth_keyless())
    failed = [i for i, err in enumerate(reports) if err is not None]
    assert failed == list(range(0, 100, 10)), failed
    assert all(reports[i].code() == KafkaError.INVALID_RECORD for i in failed)
    written = c_read_partition(broker.bootstrap, topic, 0, 90)
    assert [r.key for r in written] == [f"k{i}".encode() for i in range(100) if i % 10 != 0]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd", "uncompressed"])
def test_a_topic_codec_recompresses_what_producers_send_with_another(broker, closer, codec):
    admin = c_admin(broker.bootstrap)
    topic = c_create_topic(admin, unique(f"codec-{codec}"), config={"compression.type": codec})
    sent_with = "none" if codec != "uncompressed" else "gzip"
    producer = closer.add(c_producer(broker.bootstrap, {"compression.type": sent_with, "linger.ms": 50}))
    records = [
        {"key": f"k{i}".encode(), "value": (f"{i:05d} " + "compressible text " * 30).encode(), "headers": [("h", b"1"), ("h", b"2")]}
        for i in range(200)
    ]
    assert c_produce(producer, topic, records, partition=0) == [(0, i) for i in range(200)]
    batches = raw_batches(broker.bootstrap, topic, 0)
    assert {codec_id for _, _, codec_id, _ in batches} == {CODEC_IDS[codec]}, batches
    assert all(crc_ok for _, _, _, crc_ok in batches), batches
    assert sum(count for _, count, _, _ in batches) == 200
    for read in (c_read_partition, kp_read_partition):
        got = read(broker.bootstrap, topic, 0, 200)
        assert [r.offset for r in got] == list(range(200))
        assert [r.content() for r in got] == [(r["key"], r["value"], r["headers"]) for r in records]
    described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)])
    configs = list(described.values())[0].result(timeout=TIMEOUT_S)
    assert configs["compression.type"].value == codec


def test_a_topic_codec_can_be_altered_and_applies_to_later_batches(broker, closer):
    admin = c_admin(broker.bootstrap)
    topic = c_create_topic(admin, unique("codec-altered"))
    producer = closer.add(c_producer(broker.bootstrap, {"compression.type": "none", "linger.ms": 20}))
    c_produce(producer, topic, [{"value": b"before " * 50}], partition=0)
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[ConfigEntry("compression.type", "zstd", incremental_operation=AlterConfigOpType.SET)],
    )
    list(admin.incremental_alter_configs([resource]).values())[0].result(timeout=TIMEOUT_S)
    c_produce(producer, topic, [{"value": b"after " * 50}], partition=0)
    codecs = [codec_id for _, _, codec_id, _ in raw_batches(broker.bootstrap, topic, 0)]
    assert codecs == [CODEC_IDS["uncompressed"], CODEC_IDS["zstd"]], "stored batches stay as they were"
    bad = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[ConfigEntry("compression.type", "brotli", incremental_operation=AlterConfigOpType.SET)],
    )
    with pytest.raises(Exception) as refused:
        list(admin.incremental_alter_configs([bad]).values())[0].result(timeout=TIMEOUT_S)
    assert "compression.type" in str(refused.value)


def test_deprecated_topic_configs_are_accepted_and_change_nothing(broker, closer):
    admin = c_admin(broker.bootstrap)
    topic = c_create_topic(admin, unique("msgver"), config={"message.downconversion.enable": "true"})
    producer = closer.add(c_producer(broker.bootstrap))
    c_produce(producer, topic, [{"key": b"a", "value": b"v2 batch"}], partition=0)
    # What librdkafka's 0092 does half way through: a non-incremental AlterConfigs.
    log_from = broker.log_size()
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config={"message.format.version": "0.10.0.0"})
    list(admin.alter_configs([resource]).values())[0].result(timeout=TIMEOUT_S)
    c_produce(producer, topic, [{"key": b"b", "value": b"still a v2 batch"}], partition=0)
    got = c_read_partition(broker.bootstrap, topic, 0, 2)
    assert [r.value for r in got] == [b"v2 batch", b"still a v2 batch"]
    described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)])
    configs = list(described.values())[0].result(timeout=TIMEOUT_S)
    assert configs["message.format.version"].value == "0.10.0.0"
    assert "deprecated topic config" in broker.log_since(log_from)


def test_a_repeated_header_name_keeps_every_value_between_clients(broker, closer):
    topic = c_create_topic(c_admin(broker.bootstrap), unique("repeated-headers"))
    headers = [("trace", b"a"), ("other", b"x"), ("trace", b"b"), ("trace", None)]
    producer = closer.add(c_producer(broker.bootstrap))
    c_produce(producer, topic, [{"value": b"v", "headers": headers}], partition=0)
    got = c_read_partition(broker.bootstrap, topic, 0, 1)
    assert got[0].content()[2] == headers
