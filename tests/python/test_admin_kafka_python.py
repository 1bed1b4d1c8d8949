"""Admin operations through kafka-python's KafkaAdminClient and KafkaConsumer offset look-ups.

kafka-python 2.x has no IncrementalAlterConfigs and no ListOffsets(max timestamp): those are
covered by test_admin_confluent.py.
"""

import time

import kafka.errors as Errors
import pytest
from kafka import TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, NewPartitions, NewTopic

from helpers import (
    c_admin,
    c_create_topic,
    c_produce,
    c_producer,
    kp_admin,
    kp_consume,
    kp_consumer,
    kp_read_partition,
    unique,
    wait_until,
)

DYNAMIC_TOPIC_CONFIG = 1
DEFAULT_CONFIG = 5


@pytest.fixture
def admin(broker, closer):
    return closer.add(kp_admin(broker.bootstrap))


def topic_configs(admin, topic):
    """{name: (value, source)} from DescribeConfigs for one topic; fails on a resource error."""
    [response] = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    [resource] = response.to_object()["resources"]
    assert resource["error_code"] == 0, resource
    return {e["config_names"]: (e["config_value"], e.get("config_source")) for e in resource["config_entries"]}


def partition_count(admin, topic):
    [t] = admin.describe_topics([topic])
    assert t["error_code"] == 0, t
    return len(t["partitions"])


def test_describe_cluster(broker, admin):
    cluster = admin.describe_cluster()
    assert [(b["node_id"], b["host"], b["port"]) for b in cluster["brokers"]] == [(0, "127.0.0.1", broker.port)]
    assert cluster["controller_id"] == 0
    assert cluster["cluster_id"]


def test_create_topic_with_configs_validate_only_and_delete(broker, admin):
    name = unique("kp-create")
    configs = {"retention.ms": "3600000", "cleanup.policy": "compact", "max.message.bytes": "65536"}

    admin.create_topics(
        [NewTopic(name, num_partitions=3, replication_factor=1, topic_configs=configs)], validate_only=True
    )
    assert name not in admin.list_topics()

    admin.create_topics([NewTopic(name, num_partitions=3, replication_factor=1, topic_configs=configs)])
    wait_until(lambda: name in admin.list_topics(), what=f"{name} in metadata")
    [t] = admin.describe_topics([name])
    assert sorted(p["partition"] for p in t["partitions"]) == [0, 1, 2]
    assert all(p["leader"] == 0 and p["replicas"] == [0] and p["isr"] == [0] for p in t["partitions"])
    described = topic_configs(admin, name)
    for key, value in configs.items():
        assert described[key] == (value, DYNAMIC_TOPIC_CONFIG)

    with pytest.raises(Errors.TopicAlreadyExistsError):
        admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])

    admin.delete_topics([name])
    wait_until(lambda: name not in admin.list_topics(), what=f"{name} gone from metadata")
    with pytest.raises(Errors.UnknownTopicOrPartitionError):
        admin.delete_topics([name])


def test_create_partitions(broker, admin):
    name = c_create_topic(c_admin(broker.bootstrap), unique("kp-grow"), partitions=2)
    admin.create_partitions({name: NewPartitions(total_count=5)})
    wait_until(lambda: partition_count(admin, name) == 5, what="5 partitions")

    admin.create_partitions({name: NewPartitions(total_count=7)}, validate_only=True)
    assert partition_count(admin, name) == 5
    with pytest.raises(Errors.InvalidPartitionsError):
        admin.create_partitions({name: NewPartitions(total_count=3)})
    assert partition_count(admin, name) == 5


def test_alter_and_describe_configs(broker, admin):
    name = c_create_topic(
        c_admin(broker.bootstrap), unique("kp-alter"), config={"retention.ms": "3600000", "cleanup.policy": "compact"}
    )
    response = admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, name, configs={"retention.ms": "5000000"})])
    [res] = response.to_object()["resources"]
    assert res["error_code"] == 0, res

    described = topic_configs(admin, name)
    assert described["retention.ms"] == ("5000000", DYNAMIC_TOPIC_CONFIG)
    # AlterConfigs replaces the whole set: cleanup.policy is back to its default.
    assert described["cleanup.policy"] == ("delete", DEFAULT_CONFIG)

    [broker_response] = admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, "0")])
    [res] = broker_response.to_object()["resources"]
    assert res["error_code"] == 0, res
    broker_configs = {e["config_names"]: e["config_value"] for e in res["config_entries"]}
    assert broker_configs["group.initial.rebalance.delay.ms"] == "0"


def test_delete_records(broker, admin, closer):
    name = c_create_topic(c_admin(broker.bootstrap), unique("kp-delrec"))
    producer = closer.add(c_producer(broker.bootstrap))
    c_produce(producer, name, [{"value": f"m{i}".encode()} for i in range(10)], partition=0)
    tp = TopicPartition(name, 0)

    result = admin.delete_records({tp: 6})
    assert result[tp]["low_watermark"] == 6
    consumer = closer.add(kp_consumer(broker.bootstrap))
    assert consumer.beginning_offsets([tp]) == {tp: 6}
    assert consumer.end_offsets([tp]) == {tp: 10}
    got = kp_read_partition(broker.bootstrap, name, 0, 4)
    assert [(r.offset, r.value) for r in got] == [(i, f"m{i}".encode()) for i in range(6, 10)]


def test_offsets_for_times(broker, closer):
    name = c_create_topic(c_admin(broker.bootstrap), unique("kp-times"))
    producer = closer.add(c_producer(broker.bootstrap, {"linger.ms": 0}))
    base = int(time.time() * 1000) - 50_000
    for i in range(5):
        c_produce(producer, name, [{"value": f"m{i}".encode(), "timestamp": base + 10 * i}], partition=0)
    tp = TopicPartition(name, 0)
    consumer = closer.add(kp_consumer(broker.bootstrap))
    assert consumer.beginning_offsets([tp]) == {tp: 0}
    assert consumer.end_offsets([tp]) == {tp: 5}
    found = consumer.offsets_for_times({tp: base + 15})[tp]
    assert (found.offset, found.timestamp) == (2, base + 20)
    assert consumer.offsets_for_times({tp: base + 1000})[tp] is None


def test_consumer_groups(broker, admin, closer):
    name = c_create_topic(c_admin(broker.bootstrap), unique("kp-grp"), partitions=2)
    producer = closer.add(c_producer(broker.bootstrap))
    c_produce(producer, name, [{"value": f"m{i}".encode(), "partition": i % 2} for i in range(10)])

    group = unique("kp-group")
    consumer = kp_consumer(
        broker.bootstrap,
        group_id=group,
        client_id="kp-admin-test",
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
    )
    closer.add(consumer)
    consumer.subscribe([name])
    kp_consume(consumer, 10)
    consumer.commit()

    groups = admin.list_consumer_groups()
    assert group in [g[0] for g in groups], groups
    [info] = admin.describe_consumer_groups([group])
    assert info.group == group
    assert info.state == "Stable"
    assert info.protocol_type == "consumer"
    [member] = info.members
    assert member.client_id == "kp-admin-test"
    assert sorted(member.member_assignment.partitions()) == [TopicPartition(name, 0), TopicPartition(name, 1)]

    offsets = admin.list_consumer_group_offsets(group)
    assert {tp: om.offset for tp, om in offsets.items()} == {TopicPartition(name, 0): 5, TopicPartition(name, 1): 5}

    [(gid, error)] = admin.delete_consumer_groups([group])
    assert (gid, error) == (group, Errors.NonEmptyGroupError)

    consumer.close(autocommit=False)
    wait_until(lambda: admin.describe_consumer_groups([group])[0].state == "Empty", what="group Empty")
    assert admin.delete_consumer_groups([group]) == [(group, Errors.NoError)]
    assert group not in [g[0] for g in admin.list_consumer_groups()]
    assert admin.list_consumer_group_offsets(group) == {}
