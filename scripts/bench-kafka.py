#!/usr/bin/env python3
"""Produce and consume throughput of a running Kafka-compatible broker, measured with
confluent-kafka (librdkafka).

Starts nothing: point it at a broker that is already running, e.g.

    target/release/weir server --listen 127.0.0.1:9092 --data-dir /tmp/weir-bench &
    .venv/bin/python scripts/bench-kafka.py --bootstrap 127.0.0.1:9092 --messages 1000000 --pid $!

It creates a fresh topic (--partitions, default 6), produces --messages records of --size bytes
(linger.ms=5, batch.size=1 MiB, acks=1 unless --acks says otherwise), then consumes them all from
the beginning with an assigned (group-less) consumer, and prints MB/s (10^6 bytes of record values
per second) and records per second for both phases. With --pid it also prints the broker's peak
resident memory (VmHWM from /proc/PID/status). --json prints one JSON object instead.

The client runs in this Python process, so at small record sizes the numbers can be bounded by
the client rather than the broker; compare brokers with the same script on the same machine.
Exit status: 0 when every record was acknowledged and read back, 1 otherwise.
"""

import argparse
import json
import os
import sys
import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--bootstrap", default="127.0.0.1:9092", help="broker address (default: %(default)s)")
    p.add_argument("--messages", type=int, default=1_000_000, help="records to produce (default: %(default)s)")
    p.add_argument("--size", type=int, default=1024, help="bytes per record value (default: %(default)s)")
    p.add_argument("--partitions", type=int, default=6, help="partitions of the topic (default: %(default)s)")
    p.add_argument("--acks", default="1", choices=["0", "1", "all", "-1"], help="producer acks (default: 1)")
    p.add_argument("--compression", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"])
    p.add_argument("--pid", type=int, help="the broker's process id, to report its peak RSS")
    p.add_argument("--topic", help="topic name (default: a fresh bench-<uuid>); must not exist")
    p.add_argument("--keep-topic", action="store_true", help="do not delete the topic afterwards")
    p.add_argument("--timeout", type=float, default=600, help="seconds allowed per phase (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    if args.messages <= 0 or args.size < 0 or args.partitions <= 0:
        p.error("--messages and --partitions must be positive, --size not negative")
    return args


def peak_rss_kib(pid):
    """VmHWM (peak resident set size) of a process, in KiB, from /proc/PID/status."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


def create_topic(admin, topic, partitions, timeout):
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    futures[topic].result(timeout=timeout)
    deadline = time.monotonic() + timeout
    while True:
        t = admin.list_topics(topic=topic, timeout=10).topics.get(topic)
        if t is not None and t.error is None and len(t.partitions) == partitions:
            if all(p.leader >= 0 for p in t.partitions.values()):
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {topic} not ready within {timeout}s")
        time.sleep(0.05)


def produce(args, topic):
    errors = []

    def on_error_report(err, msg):  # with delivery.report.only.error, called for failures only
        errors.append(err)

    producer = Producer(
        {
            "bootstrap.servers": args.bootstrap,
            "acks": args.acks,
            "linger.ms": 5,
            "batch.size": 1 << 20,
            "message.max.bytes": max(1 << 20, args.size + 4096),
            "compression.type": args.compression,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1 << 20,
            "enable.idempotence": False,
            "delivery.report.only.error": True,
            "message.timeout.ms": int(args.timeout * 1000),
            "on_delivery": on_error_report,
        }
    )
    value = os.urandom(args.size)  # incompressible, so --compression measures its cost only
    start = time.perf_counter()
    for _ in range(args.messages):
        while True:
            try:
                producer.produce(topic, value=value)
                break
            except BufferError:
                producer.poll(0.001)
    producer.poll(0)
    remaining = producer.flush(args.timeout)
    elapsed = time.perf_counter() - start
    acked = args.messages - len(errors) - remaining
    return {
        "seconds": elapsed,
        "messages_acked": acked,
        "errors": len(errors) + remaining,
        "first_error": str(errors[0]) if errors else None,
        "mb_per_s": acked * args.size / elapsed / 1e6,
        "msg_per_s": acked / elapsed,
    }


def consume(args, topic, expected):
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "fetch.max.bytes": 64 << 20,
            "max.partition.fetch.bytes": 8 << 20,
            "queued.max.messages.kbytes": 256 << 10,
        }
    )
    received = 0
    value_bytes = 0
    errors = []
    start = time.perf_counter()
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(args.partitions)])
    deadline = time.monotonic() + args.timeout
    try:
        while received < expected and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=10_000, timeout=0.5):
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        errors.append(str(err))
                    continue
                received += 1
                value_bytes += len(msg.value() or b"")
        elapsed = time.perf_counter() - start
    finally:
        consumer.close()
    return {
        "seconds": elapsed,
        "messages": received,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "mb_per_s": value_bytes / elapsed / 1e6,
        "msg_per_s": received / elapsed,
    }


def main(argv=None):
    args = parse_args(argv)
    topic = args.topic or f"bench-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    create_topic(admin, topic, args.partitions, timeout=60)
    try:
        produced = produce(args, topic)
        consumed = consume(args, topic, produced["messages_acked"])
    finally:
        if not args.keep_topic:
            admin.delete_topics([topic])[topic].result(timeout=60)

    result = {
        "bootstrap": args.bootstrap,
        "topic": topic,
        "messages": args.messages,
        "size": args.size,
        "partitions": args.partitions,
        "acks": args.acks,
        "compression": args.compression,
        "produce": produced,
        "consume": consumed,
        "broker_peak_rss_kib": peak_rss_kib(args.pid) if args.pid else None,
    }
    ok = (
        produced["errors"] == 0
        and produced["messages_acked"] == args.messages
        and consumed["messages"] == args.messages
        and consumed["errors"] == 0
    )
    result["ok"] = ok

    if args.json:
        print(json.dumps(result))
    else:
        print(f"topic {topic}: {args.messages} records x {args.size} B, {args.partitions} partitions, "
              f"acks={args.acks}, compression={args.compression}")
        for name, r in (("produce", produced), ("consume", consumed)):
            count = r.get("messages_acked", r.get("messages"))
            print(f"{name:8} {r['mb_per_s']:9.1f} MB/s {r['msg_per_s']:12,.0f} msg/s "
                  f"({count} records in {r['seconds']:.2f} s, {r['errors']} errors)")
            if r["first_error"]:
                print(f"         first error: {r['first_error']}")
        if args.pid:
            print(f"broker peak RSS (VmHWM): {result['broker_peak_rss_kib'] / 1024:.1f} MiB")
        if not ok:
            print("FAILED: not every record was acknowledged and read back", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
