"""A consume-transform-produce worker with exactly-once semantics (confluent-kafka): reads the
input topic as group `group`, writes `out-<value>` for each record to the output topic, and
commits its consumer offsets inside the same transaction. Prints "txn N" after each commit.

Usage: transformer.py BOOTSTRAP INPUT OUTPUT GROUP TRANSACTIONAL_ID BATCH PAUSE_S MAX_IDLE_S
"""

import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer


def main():
    bootstrap, source, sink, group, txn_id = sys.argv[1:6]
    batch, pause, max_idle = int(sys.argv[6]), float(sys.argv[7]), float(sys.argv[8])
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 1})
    producer.init_transactions(30)
    consumer.subscribe([source])
    idle_since = time.monotonic()
    n = 0
    while time.monotonic() - idle_since < max_idle:
        msgs = [m for m in consumer.consume(batch, timeout=1.0) if not m.error()]
        if not msgs:
            continue
        idle_since = time.monotonic()
        producer.begin_transaction()
        for m in msgs:
            producer.produce(sink, key=m.key(), value=b"out-" + m.value(), partition=m.partition())
        time.sleep(pause)  # widen the window in which a crash leaves the transaction open
        producer.send_offsets_to_transaction(
            consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
        )
        try:
            producer.commit_transaction(30)
        except KafkaException as e:
            print(f"commit failed: {e}", flush=True)
            raise
        n += 1
        print(f"txn {n}", flush=True)
    consumer.close()


if __name__ == "__main__":
    main()
