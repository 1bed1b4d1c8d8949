"""Errors clients expect, with Kafka's error codes, through both clients."""

import kafka.errors as Errors
import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import NewTopic
from kafka.admin import NewTopic as KpNewTopic

from helpers import (
    TIMEOUT_S,
    c_admin,
    c_create_topic,
    c_produce,
    c_producer,
    kp_admin,
    kp_producer,
    unique,
)

INVALID_NAMES = ["bad/name", "..", ".", "x" * 250, "with space", "ünï"]


def c_create_error(admin, topic):
    """Creates `topic` (a NewTopic) with confluent-kafka; returns the error code it fails with."""
    futures = admin.create_topics([topic], request_timeout=TIMEOUT_S)
    with pytest.raises(KafkaException) as info:
        futures[topic.topic].result(timeout=TIMEOUT_S)
    return info.value.args[0].code()


def all_topics(admin):
    return set(admin.list_topics(timeout=10).topics)


def test_create_existing_topic(broker, closer):
    admin = c_admin(broker.bootstrap)
    name = c_create_topic(admin, unique("exists"), partitions=2)
    assert c_create_error(admin, NewTopic(name, num_partitions=2, replication_factor=1)) == KafkaError.TOPIC_ALREADY_EXISTS

    kp = closer.add(kp_admin(broker.bootstrap))
    with pytest.raises(Errors.TopicAlreadyExistsError):
        kp.create_topics([KpNewTopic(name, num_partitions=2, replication_factor=1)])


@pytest.mark.parametrize("bad", INVALID_NAMES, ids=["slash", "dotdot", "dot", "too-long", "space", "non-ascii"])
def test_invalid_topic_name(broker, closer, bad):
    admin = c_admin(broker.bootstrap)
    assert c_create_error(admin, NewTopic(bad, num_partitions=1, replication_factor=1)) == KafkaError.TOPIC_EXCEPTION

    kp = closer.add(kp_admin(broker.bootstrap))
    with pytest.raises(Errors.InvalidTopicError):
        kp.create_topics([KpNewTopic(bad, num_partitions=1, replication_factor=1)])
    assert bad not in all_topics(admin)


def test_replication_factor_above_broker_count(broker, closer):
    admin = c_admin(broker.bootstrap)
    name = unique("rf3")
    code = c_create_error(admin, NewTopic(name, num_partitions=1, replication_factor=3))
    assert code == KafkaError.INVALID_REPLICATION_FACTOR

    kp = closer.add(kp_admin(broker.bootstrap))
    with pytest.raises(Errors.InvalidReplicationFactorError):
        kp.create_topics([KpNewTopic(name, num_partitions=1, replication_factor=3)])
    assert name not in all_topics(admin)


def test_invalid_partition_counts(broker, closer):
    admin = c_admin(broker.bootstrap)
    zero = unique("zero-partitions")
    assert c_create_error(admin, NewTopic(zero, num_partitions=0, replication_factor=1)) == KafkaError.INVALID_PARTITIONS

    kp = closer.add(kp_admin(broker.bootstrap))
    with pytest.raises(Errors.InvalidPartitionsError):
        kp.create_topics([KpNewTopic(zero, num_partitions=0, replication_factor=1)])

    # Far too many partitions: refused with a clear error, without trying to make them.
    huge = unique("huge")
    with pytest.raises((Errors.InvalidPartitionsError, Errors.PolicyViolationError)):
        kp.create_topics([KpNewTopic(huge, num_partitions=2**31 - 1, replication_factor=1)])
    topics = all_topics(admin)
    assert zero not in topics and huge not in topics


def test_message_too_large_for_topic(broker, closer):
    """max.message.bytes bounds a batch as stored, i.e. after compression (Kafka's semantics)."""
    admin = c_admin(broker.bootstrap)
    name = c_create_topic(admin, unique("small-max"), config={"max.message.bytes": "1024"})

    producer = closer.add(c_producer(broker.bootstrap, {"linger.ms": 0}))
    reports = []
    producer.produce(name, value=b"x" * 4096, partition=0, on_delivery=lambda err, msg: reports.append(err))
    assert producer.flush(TIMEOUT_S) == 0
    [err] = reports
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err

    kp = closer.add(kp_producer(broker.bootstrap, retries=0, linger_ms=0))
    with pytest.raises(Errors.MessageSizeTooLargeError):
        kp.send(name, value=b"y" * 4096, partition=0).get(timeout=TIMEOUT_S)

    # A small record fits; so does a large one that compresses below the limit.
    assert c_produce(producer, name, [{"value": b"small"}], partition=0) == [(0, 0)]
    gzip_producer = closer.add(c_producer(broker.bootstrap, {"compression.type": "gzip", "linger.ms": 0}))
    assert c_produce(gzip_producer, name, [{"value": bytes(8192)}], partition=0) == [(0, 1)]


def test_message_too_large_for_broker_default(broker, closer):
    """Without a topic override the broker's message.max.bytes (Kafka's default: 1 MiB + 12) applies."""
    admin = c_admin(broker.bootstrap)
    name = c_create_topic(admin, unique("default-max"))
    producer = closer.add(c_producer(broker.bootstrap, {"message.max.bytes": 4 << 20, "batch.size": 4 << 20}))
    reports = []
    value = bytes(range(256)) * (6 << 10)  # 1.5 MiB, no compression
    producer.produce(name, value=value, partition=0, on_delivery=lambda err, msg: reports.append(err))
    assert producer.flush(TIMEOUT_S) == 0
    [err] = reports
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err
