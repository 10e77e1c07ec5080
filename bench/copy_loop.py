"""The plainest copy librdkafka allows, paced as a real-time slot of the mirror: the latency floor of its clients.

Each slot is a process of its own (as each real-time task is a Python worker of its own) with every n-th partition
of the source topics: one consumer, read `SLOT_CONSUME_BATCH` events at a time waiting at most
`SLOT_CONSUME_WAIT_S`, feeding one idempotent producer with the librdkafka slots' linger, each record with its key,
value, headers, partition and CreateTime, into `<prefix><topic>`. With `--commit-ms` the producer is transactional
and each slot flushes and commits that often, as a real-time slot does to fence zombie tasks; without it, nothing
waits. No policy, no ledger, no reports, no Spark: what the harness measures beyond this loop is the mirror's own cost
(bench/harness.py's `loop` and `loop-txn` latency candidates run it beside the mirror, MirrorMaker 2 and bench/java's
CopyLoop).

Usage: .venv/bin/python bench/copy_loop.py SOURCE TARGET PREFIX TOPIC[,TOPIC...] [--slots 2] [--commit-ms 500]
       (copies until stopped)
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from multiprocessing.connection import wait
from pathlib import Path
from typing import cast

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from confluent_kafka import OFFSET_BEGINNING, TopicPartition  # noqa: E402

from bench.testbed import clients as kafka_clients  # noqa: E402
from bench.testbed.clients import plaintext  # noqa: E402
from spark_app.outbox import Record  # noqa: E402
from spark_app.realtime.task import CONSUMER_SETTINGS, LIBRDKAFKA_LINGER_MS, SLOT_CONSUME_BATCH, SLOT_CONSUME_WAIT_S  # noqa: E402
from spark_app.transactions import TRANSACTION_TIMEOUT_S  # noqa: E402


def copy(source: str, target: str, prefix: str, topics: list[str], slot: int, slots: int, commit_ms: int) -> None:
    """Copy this slot's share of every partition of `topics` until stopped; fail at the first refused record."""
    consumer = kafka_clients.consumer(plaintext(source), "copy-loop", CONSUMER_SETTINGS)
    partitions = [(t, p) for t in topics for p in sorted(consumer.list_topics(t).topics[t].partitions)]
    consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in partitions[slot::slots]])
    settings: dict[str, object] = {"linger.ms": LIBRDKAFKA_LINGER_MS, "enable.idempotence": True, "acks": "all"}
    if commit_ms:
        settings |= {"transactional.id": f"{prefix}copy-loop-{slot}"}
    producer = kafka_clients.producer(plaintext(target), settings)
    if commit_ms:
        producer.init_transactions(TRANSACTION_TIMEOUT_S)
        producer.begin_transaction()

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            raise RuntimeError(f"copy loop slot {slot}: a record was refused: {err}")

    commit_at = time.monotonic() + commit_ms / 1000
    while True:
        # Read from assigned partitions, so topic, partition and offset are set (the stubs say Optional).
        for msg in cast(list[Record], consumer.consume(SLOT_CONSUME_BATCH, SLOT_CONSUME_WAIT_S)):
            if msg.error() is not None:
                raise RuntimeError(f"copy loop slot {slot}: {msg.error()}")
            producer.produce(f"{prefix}{msg.topic()}", msg.value(), msg.key(), partition=msg.partition(),
                             timestamp=msg.timestamp()[1], headers=msg.headers(), on_delivery=delivered)  # fmt: skip
        producer.poll(0)
        if commit_ms and time.monotonic() >= commit_at:
            producer.flush(TRANSACTION_TIMEOUT_S)  # as a real-time slot does before it commits
            producer.commit_transaction(TRANSACTION_TIMEOUT_S)
            producer.begin_transaction()
            commit_at = time.monotonic() + commit_ms / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source")
    parser.add_argument("target")
    parser.add_argument("prefix", help="target topic = prefix + source topic")
    parser.add_argument("topics", help="comma-separated source topics")
    parser.add_argument("--slots", type=int, default=1, help="processes, each with every n-th partition")
    parser.add_argument("--commit-ms", type=int, default=0, help="0: no transactions; else commit this often")
    args = parser.parse_args()
    topics = args.topics.split(",")
    spawn = multiprocessing.get_context("spawn")
    procs = [
        spawn.Process(
            target=copy, args=(args.source, args.target, args.prefix, topics, slot, args.slots, args.commit_ms)
        )  # fmt: skip
        for slot in range(args.slots)
    ]
    for proc in procs:
        proc.start()
    wait([proc.sentinel for proc in procs])  # slots copy until stopped: one that ends failed, and ends the loop
    for proc in procs:
        proc.terminate()
    sys.exit(f"copy loop: a slot ended (exit codes {[proc.exitcode for proc in procs]})")


if __name__ == "__main__":
    main()
