"""Admin operations through confluent-kafka's AdminClient (librdkafka), with Kafka's semantics."""

import time

import pytest
from confluent_kafka import (
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourceType,
)

from helpers import (
    TIMEOUT_S,
    c_admin,
    c_consume,
    c_consumer,
    c_create_topic,
    c_produce,
    c_producer,
    c_read_partition,
    unique,
    wait_for_topic,
    wait_until,
)


def result(futures, key):
    return futures[key].result(timeout=TIMEOUT_S)


def error_code(future):
    """The KafkaError code a future fails with (fails the test if it succeeds)."""
    with pytest.raises(KafkaException) as info:
        future.result(timeout=TIMEOUT_S)
    return info.value.args[0].code()


def all_topics(admin):
    """Topic names from a Metadata request for all topics (which never auto-creates one)."""
    return set(admin.list_topics(timeout=10).topics)


def source(entry):
    """A ConfigEntry's source as a ConfigSource, whether the client gave an enum or an int."""
    return entry.source if isinstance(entry.source, ConfigSource) else ConfigSource(entry.source)


def topic_configs(admin, topic):
    resource = ConfigResource(ResourceType.TOPIC, topic)
    return result(admin.describe_configs([resource]), resource)


def test_describe_cluster_and_metadata(broker):
    admin = c_admin(broker.bootstrap)
    cluster = admin.describe_cluster(request_timeout=TIMEOUT_S).result(timeout=TIMEOUT_S)
    assert [(n.id, n.host, n.port) for n in cluster.nodes] == [(0, "127.0.0.1", broker.port)]
    assert cluster.controller.id == 0
    assert isinstance(cluster.cluster_id, str) and cluster.cluster_id

    md = admin.list_topics(timeout=10)
    assert {b.id: (b.host, b.port) for b in md.brokers.values()} == {0: ("127.0.0.1", broker.port)}
    assert md.controller_id == 0
    assert md.cluster_id == cluster.cluster_id


def test_create_topic_with_configs(broker):
    admin = c_admin(broker.bootstrap)
    name = unique("create")
    c_create_topic(
        admin,
        name,
        partitions=3,
        config={"retention.ms": "3600000", "cleanup.policy": "compact", "max.message.bytes": "65536"},
    )
    md = admin.list_topics(timeout=10).topics[name]
    assert sorted(md.partitions) == [0, 1, 2]
    for p in md.partitions.values():
        assert (p.leader, p.replicas, p.isrs) == (0, [0], [0])

    configs = topic_configs(admin, name)
    for key, value in {"retention.ms": "3600000", "cleanup.policy": "compact", "max.message.bytes": "65536"}.items():
        assert configs[key].value == value
        assert source(configs[key]) == ConfigSource.DYNAMIC_TOPIC_CONFIG, configs[key]
    # A config the topic did not set is described with its default.
    assert configs["retention.bytes"].value == "-1"
    assert source(configs["retention.bytes"]) == ConfigSource.DEFAULT_CONFIG


def test_create_topic_validate_only(broker):
    admin = c_admin(broker.bootstrap)
    name = unique("validate")
    result(admin.create_topics([NewTopic(name, num_partitions=2, replication_factor=1)], validate_only=True), name)
    assert name not in all_topics(admin)

    bad = unique("validate-bad")
    futures = admin.create_topics(
        [NewTopic(bad, num_partitions=1, replication_factor=1, config={"cleanup.policy": "bogus"})],
        validate_only=True,
    )
    assert error_code(futures[bad]) == KafkaError.INVALID_CONFIG
    assert bad not in all_topics(admin)

    # A real create with the same name still works afterwards.
    c_create_topic(admin, name, partitions=2)


def test_delete_topic_then_recreate_is_empty(broker, closer):
    admin = c_admin(broker.bootstrap)
    name = c_create_topic(admin, unique("delete"), partitions=2)
    producer = closer.add(c_producer(broker.bootstrap))
    c_produce(producer, name, [{"value": b"old"}] * 5, partition=0)

    result(admin.delete_topics([name], operation_timeout=TIMEOUT_S), name)
    wait_until(lambda: name not in all_topics(admin), what=f"{name} gone from metadata")

    c_create_topic(admin, name, partitions=1)
    consumer = closer.add(c_consumer(broker.bootstrap))
    assert consumer.get_watermark_offsets(TopicPartition(name, 0), timeout=10) == (0, 0)
    c_produce(producer, name, [{"value": b"new"}], partition=0)
    [rec] = c_read_partition(broker.bootstrap, name, 0, 1)
    assert (rec.offset, rec.value) == (0, b"new")

    missing = unique("never-created")
    futures = admin.delete_topics([missing], operation_timeout=TIMEOUT_S)
    assert error_code(futures[missing]) == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_create_partitions(broker, closer):
    admin = c_admin(broker.bootstrap)
    name = c_create_topic(admin, unique("grow"), partitions=1)

    result(admin.create_partitions([NewPartitions(name, 4)], operation_timeout=TIMEOUT_S), name)
    wait_for_topic(admin, name, 4)
    producer = closer.add(c_producer(broker.bootstrap))
    assert c_produce(producer, name, [{"value": b"in partition 3"}], partition=3) == [(3, 0)]
    [rec] = c_read_partition(broker.bootstrap, name, 3, 1)
    assert rec.value == b"in partition 3"

    # validate_only changes nothing; shrinking is refused.
    result(admin.create_partitions([NewPartitions(name, 6)], validate_only=True), name)
    assert len(admin.list_topics(timeout=10).topics[name].partitions) == 4
    assert error_code(admin.create_partitions([NewPartitions(name, 2)])[name]) == KafkaError.INVALID_PARTITIONS
    assert len(admin.list_topics(timeout=10).topics[name].partitions) == 4


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated")
def test_alter_configs_replaces_the_whole_set(broker):
    """AlterConfigs (the legacy, non-incremental API) sets exactly the given configs: the rest revert."""
    admin = c_admin(broker.bootstrap)
    name = c_create_topic(
        admin, unique("alter"), config={"retention.ms": "3600000", "cleanup.policy": "compact"}
    )
    resource = ConfigResource(ResourceType.TOPIC, name, set_config={"retention.ms": "1000000"})
    result(admin.alter_configs([resource]), resource)

    configs = topic_configs(admin, name)
    assert configs["retention.ms"].value == "1000000"
    assert source(configs["retention.ms"]) == ConfigSource.DYNAMIC_TOPIC_CONFIG
    assert configs["cleanup.policy"].value == "delete"
    assert source(configs["cleanup.policy"]) == ConfigSource.DEFAULT_CONFIG


def test_incremental_alter_configs(broker):
    admin = c_admin(broker.bootstrap)
    name = c_create_topic(
        admin,
        unique("incr"),
        config={"retention.ms": "3600000", "cleanup.policy": "compact", "max.message.bytes": "65536"},
    )
    resource = ConfigResource(
        ResourceType.TOPIC,
        name,
        incremental_configs=[
            ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("cleanup.policy", None, incremental_operation=AlterConfigOpType.DELETE),
        ],
    )
    result(admin.incremental_alter_configs([resource]), resource)

    configs = topic_configs(admin, name)
    assert configs["retention.ms"].value == "7200000"
    assert source(configs["retention.ms"]) == ConfigSource.DYNAMIC_TOPIC_CONFIG
    assert configs["cleanup.policy"].value == "delete"
    assert source(configs["cleanup.policy"]) == ConfigSource.DEFAULT_CONFIG
    assert configs["max.message.bytes"].value == "65536"  # untouched

    invalid = ConfigResource(
        ResourceType.TOPIC,
        name,
        incremental_configs=[ConfigEntry("retention.ms", "not-a-number", incremental_operation=AlterConfigOpType.SET)],
    )
    assert error_code(admin.incremental_alter_configs([invalid])[invalid]) == KafkaError.INVALID_CONFIG
    assert topic_configs(admin, name)["retention.ms"].value == "7200000"


def test_describe_broker_configs(broker):
    """Broker configs use Kafka's names; a setting given with --set is described with its value."""
    admin = c_admin(broker.bootstrap)
    resource = ConfigResource(ResourceType.BROKER, "0")
    configs = result(admin.describe_configs([resource]), resource)
    assert configs["group.initial.rebalance.delay.ms"].value == "0"


def test_delete_records_and_list_offsets(broker, closer):
    admin = c_admin(broker.bootstrap)
    name = c_create_topic(admin, unique("delrec"), partitions=1)
    producer = closer.add(c_producer(broker.bootstrap))
    c_produce(producer, name, [{"value": f"m{i}".encode()} for i in range(10)], partition=0)
    tp = TopicPartition(name, 0)

    deleted = result(admin.delete_records([TopicPartition(name, 0, 4)]), tp)
    assert deleted.low_watermark == 4
    offsets = admin.list_offsets({tp: OffsetSpec.earliest()})
    assert result(offsets, tp).offset == 4
    assert result(admin.list_offsets({tp: OffsetSpec.latest()}), tp).offset == 10
    consumer = closer.add(c_consumer(broker.bootstrap))
    assert consumer.get_watermark_offsets(tp, timeout=10) == (4, 10)

    # Reading from the beginning starts at the new log start offset.
    got = c_read_partition(broker.bootstrap, name, 0, 6)
    assert [(r.offset, r.value) for r in got] == [(i, f"m{i}".encode()) for i in range(4, 10)]

    # Past the high watermark: OFFSET_OUT_OF_RANGE. Offset -1 means "up to the high watermark".
    futures = admin.delete_records([TopicPartition(name, 0, 11)])
    assert error_code(futures[tp]) == KafkaError.OFFSET_OUT_OF_RANGE
    assert result(admin.delete_records([TopicPartition(name, 0, -1)]), tp).low_watermark == 10
    assert result(admin.list_offsets({tp: OffsetSpec.earliest()}), tp).offset == 10


def test_list_offsets_by_timestamp_and_max_timestamp(broker, closer):
    admin = c_admin(broker.bootstrap)
    name = c_create_topic(admin, unique("offsets"), partitions=1)
    producer = closer.add(c_producer(broker.bootstrap, {"linger.ms": 0}))
    base = int(time.time() * 1000) - 100_000
    timestamps = [base, base + 10, base + 20, base + 90, base + 30]
    for i, ts in enumerate(timestamps):  # one batch each
        c_produce(producer, name, [{"value": f"m{i}".encode(), "timestamp": ts}], partition=0)
    tp = TopicPartition(name, 0)

    def offset_for(spec):
        info = result(admin.list_offsets({tp: spec}), tp)
        return info.offset, info.timestamp

    assert offset_for(OffsetSpec.earliest())[0] == 0
    assert offset_for(OffsetSpec.latest())[0] == 5
    assert offset_for(OffsetSpec.for_timestamp(base - 1)) == (0, base)
    assert offset_for(OffsetSpec.for_timestamp(base + 15)) == (2, base + 20)
    assert offset_for(OffsetSpec.for_timestamp(base + 20)) == (2, base + 20)
    assert offset_for(OffsetSpec.for_timestamp(base + 95))[0] == -1
    assert offset_for(OffsetSpec.max_timestamp()) == (3, base + 90)

    # The consumer's offsets_for_times agrees.
    consumer = closer.add(c_consumer(broker.bootstrap))
    [found] = consumer.offsets_for_times([TopicPartition(name, 0, base + 15)], timeout=10)
    assert found.offset == 2


def test_consumer_groups_list_describe_offsets_delete(broker, closer):
    admin = c_admin(broker.bootstrap)
    name = c_create_topic(admin, unique("grp"), partitions=2)
    producer = closer.add(c_producer(broker.bootstrap))
    c_produce(producer, name, [{"value": f"m{i}".encode(), "partition": i % 2} for i in range(10)])

    group = unique("group")
    consumer = c_consumer(broker.bootstrap, group=group, conf={"client.id": "admin-test-client"})
    closer.add(consumer)
    consumer.subscribe([name])
    c_consume(consumer, 10)
    committed = consumer.commit(asynchronous=False)
    assert sorted((tp.partition, tp.offset) for tp in committed) == [(0, 5), (1, 5)]

    listed = admin.list_consumer_groups(request_timeout=TIMEOUT_S).result(timeout=TIMEOUT_S)
    by_id = {g.group_id: g for g in listed.valid}
    assert group in by_id, [g.group_id for g in listed.valid]
    assert by_id[group].state == ConsumerGroupState.STABLE
    assert not by_id[group].is_simple_consumer_group
    assert not listed.errors

    desc = result(admin.describe_consumer_groups([group]), group)
    assert desc.group_id == group
    assert desc.state == ConsumerGroupState.STABLE
    assert desc.coordinator.id == 0
    assert desc.partition_assignor in ("range", "roundrobin")
    [member] = desc.members
    assert member.client_id == "admin-test-client"
    assert sorted((tp.topic, tp.partition) for tp in member.assignment.topic_partitions) == [(name, 0), (name, 1)]

    offsets = result(admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)]), group)
    assert sorted((tp.topic, tp.partition, tp.offset) for tp in offsets.topic_partitions) == [
        (name, 0, 5),
        (name, 1, 5),
    ]

    # A group with a live member cannot be deleted.
    assert error_code(admin.delete_consumer_groups([group])[group]) == KafkaError.NON_EMPTY_GROUP

    consumer.close()
    wait_until(
        lambda: result(admin.describe_consumer_groups([group]), group).state == ConsumerGroupState.EMPTY,
        what="group Empty after its only member left",
    )
    result(admin.delete_consumer_groups([group]), group)
    listed = admin.list_consumer_groups(request_timeout=TIMEOUT_S).result(timeout=TIMEOUT_S)
    assert group not in {g.group_id for g in listed.valid}
    offsets = result(admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)]), group)
    assert [tp for tp in offsets.topic_partitions if tp.offset >= 0] == []
