"""A broker's partition capacity under its open-file limit (docs/cluster.md, "How many
partitions a broker holds"): a creation past it is refused up front, naming the limit, and what
fits still works."""

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from conftest import _ALL_BROKERS, Broker
from helpers import unique

# 1,000 open files are kept for connections and the like; each replica takes one more.
OPEN_FILES = 1200
CAPACITY = OPEN_FILES - 1000


class LimitedBroker(Broker):
    """A broker started under `prlimit --nofile`, as a unit file's LimitNOFILE= would."""

    def command(self):
        return ["prlimit", f"--nofile={OPEN_FILES}:{OPEN_FILES}", "--", *super().command()]


@pytest.fixture
def limited_broker(tmp_path):
    broker = LimitedBroker(tmp_path / "limited", name="limited")
    _ALL_BROKERS.append(broker)
    try:
        yield broker.start()
    finally:
        broker.cleanup()
        _ALL_BROKERS.remove(broker)


def create(admin, topic):
    admin.create_topics([topic], operation_timeout=30)[topic.topic].result(timeout=60)


def test_a_creation_past_the_open_file_limit_is_refused_naming_it(limited_broker):
    admin = AdminClient({"bootstrap.servers": limited_broker.bootstrap})
    # The internal topics the broker made itself count too.
    hosted = sum(len(t.partitions) for t in admin.list_topics(timeout=10).topics.values())
    room = CAPACITY - hosted
    assert room > 50, f"{hosted} partitions already: no room to test with"
    fits = unique("fits")
    create(admin, NewTopic(fits, room - 50, 1))

    too_many = unique("too-many")
    with pytest.raises(KafkaException) as refused:
        create(admin, NewTopic(too_many, 51, 1))
    error = refused.value.args[0]
    assert error.name() == "INVALID_PARTITIONS", error
    assert f"{OPEN_FILES} open files (ulimit -n)" in error.str(), error.str()
    assert f"more than the {CAPACITY}" in error.str(), error.str()
    assert too_many not in admin.list_topics(timeout=10).topics, "nothing of it was committed"

    # Growing a topic past it is refused the same way; exactly up to it is fine.
    with pytest.raises(KafkaException) as grown:
        admin.create_partitions([NewPartitions(fits, room + 1)])[fits].result(timeout=60)
    assert grown.value.args[0].name() == "INVALID_PARTITIONS", grown.value.args[0]
    admin.create_partitions([NewPartitions(fits, room)])[fits].result(timeout=60)
    assert len(admin.list_topics(fits, timeout=10).topics[fits].partitions) == room

    # The broker is still whole: the last partition takes a record and gives it back.
    producer = Producer({"bootstrap.servers": limited_broker.bootstrap})
    producer.produce(fits, b"still here", partition=room - 1)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": limited_broker.bootstrap, "group.id": unique("g")})
    consumer.assign([TopicPartition(fits, room - 1, 0)])
    message = consumer.poll(30)
    consumer.close()
    assert message is not None and message.error() is None and message.value() == b"still here"
