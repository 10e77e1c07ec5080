"""Where a flow's state should live: beside the Spark checkpoint (spark_app.storage) or in a compacted Kafka topic.

The mirror saves its ledger state (`spark_app.ledger.LedgerState`) after every batch, before Spark commits it, and
loads it once at start. This measures both costs for both candidates, with a state the size of a busy flow's
(`--topics` × `--partitions` read positions, two quarantined topics):

- `local`: spark_app.storage on a local folder (a PVC is one);
- `s3a`: spark_app.storage on s3a:// through Hadoop's connector (the jar manifest's `cloud` group), against moto's
  S3 server on loopback;
- `kafka`: one record per save, key = the flow, to a compacted one-partition topic on a test-bed broker, produced
  with acks=all and flushed (what a save must wait for); a load reads the topic from its start to its end and keeps
  the last value, since compaction never touches the active segment (`segment.ms` is 7 days by default).

Prints per candidate the median and p99 save time, and the load time after 1 save and after `--saves` saves. With
`s3a`, it also prints what Spark's own checkpoint costs per batch on s3a and on a local folder (the medians of a
rate-source query's `walCommit` and `commitOffsets`, its offset-log and commit-log writes), to set the saves beside.

Usage: .venv/bin/python bench/state_store.py [--saves 1000] [--topics 50] [--partitions 8]
       [--candidates local,kafka,s3a]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from confluent_kafka import TopicPartition  # noqa: E402

from bench.testbed import clients as kafka_clients  # noqa: E402
from bench.testbed.clients import create_topics, plaintext  # noqa: E402
from bench.testbed.kafka_cluster import ListenerKind  # noqa: E402
from bench.testbed.ports import free_port  # noqa: E402
from bench.testbed.s3 import CREDENTIALS, moto_server  # noqa: E402
from bench.testbed.testbed import TestBed  # noqa: E402
from spark_app.ledger import STATE_FILE  # noqa: E402
from spark_app.storage import checkpoint_files  # noqa: E402


def state(topics: int, partitions: int, batch: int) -> bytes:
    positions = {f"orders-{t}": {str(p): batch * 1000 + p for p in range(partitions)} for t in range(topics)}
    held = {
        f"orders-{t}": {"reason": "x" * 200, "partitions": {str(p): {"first": 5, "next": batch} for p in range(8)}}
        for t in range(2)
    }
    return json.dumps({"version": 1, "quarantined": held, "positions": positions, "adopted": {}}, indent=1).encode()


def timed(save: Callable[[bytes], None], load: Callable[[], bytes | None], args: argparse.Namespace) -> dict:
    first = time.perf_counter()
    save(state(args.topics, args.partitions, 0))
    one_save_s = time.perf_counter() - first
    t = time.perf_counter()
    assert load() is not None
    load_after_1 = time.perf_counter() - t
    times = []
    for batch in range(1, args.saves):
        t = time.perf_counter()
        save(state(args.topics, args.partitions, batch))
        times.append(time.perf_counter() - t)
    t = time.perf_counter()
    assert load() == state(args.topics, args.partitions, args.saves - 1)
    load_after_n = time.perf_counter() - t
    times.sort()
    return {
        "first save ms": round(one_save_s * 1000, 1),
        "save median ms": round(statistics.median(times) * 1000, 2),
        "save p99 ms": round(times[int(len(times) * 0.99)] * 1000, 2),
        "load after 1 save ms": round(load_after_1 * 1000, 1),
        f"load after {args.saves} saves ms": round(load_after_n * 1000, 1),
        "state bytes": len(state(args.topics, args.partitions, args.saves)),
    }


def spark_checkpoint_ms(spark, location: str, seconds: float = 30.0) -> dict:
    """Medians of what Spark's checkpoint costs per batch at `location`: offset log and commit log writes."""
    query = (
        spark.readStream.format("rate").option("rowsPerSecond", 10).load().writeStream.format("noop")
        .option("checkpointLocation", location).trigger(processingTime="200 milliseconds").start()
    )  # fmt: skip
    time.sleep(seconds)
    progress = query.recentProgress[5:]  # past the first batches' warm-up
    query.stop()
    return {
        f"{step} median ms": statistics.median(p.durationMs.get(step, 0) for p in progress)
        for step in ("walCommit", "commitOffsets")
    }


def files_candidate(location: str, spark=None):
    files = checkpoint_files(location, spark)
    return (lambda data: files.write(STATE_FILE, data)), (lambda: files.read(STATE_FILE))


def kafka_candidate(bootstrap: str, topic: str):
    cluster = plaintext(bootstrap)
    producer = kafka_clients.producer(cluster, {"acks": "all", "enable.idempotence": True, "linger.ms": 0})

    def save(data: bytes) -> None:
        producer.produce(topic, key=b"onprem->dr", value=data)
        producer.flush(30)

    def load() -> bytes | None:
        consumer = kafka_clients.consumer(
            cluster, f"load-{time.monotonic_ns()}", {"enable.auto.commit": False, "enable.partition.eof": True}
        )
        consumer.assign([TopicPartition(topic, 0, 0)])
        last = None
        while True:
            msg = consumer.poll(5)
            if msg is None or msg.error():
                break
            last = msg.value()
        consumer.close()
        return last

    return save, load


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--saves", type=int, default=1000)
    parser.add_argument("--topics", type=int, default=50)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--candidates", default="local,kafka,s3a", help="comma-separated: local, kafka, s3a")
    args = parser.parse_args()
    candidates = args.candidates.split(",")
    results = {}
    work = Path(tempfile.mkdtemp(prefix="state-store-"))
    if "local" in candidates:
        results["local"] = timed(*files_candidate(str(work / "ckpt")), args)
    if "kafka" in candidates:
        bed = TestBed()
        try:
            cluster = bed.start("state", ListenerKind.PLAINTEXT)
            create_topics(cluster.admin, {"flow-state": 1}, {"cleanup.policy": "compact"})
            results["kafka"] = timed(*kafka_candidate(cluster.client.bootstrap_servers, "flow-state"), args)
        finally:
            bed.close()
    if "s3a" not in candidates:
        print(json.dumps(results, indent=1))
        return 0
    os.environ.update(CREDENTIALS)
    with moto_server(work, free_port()) as s3:
        s3.bucket("bench")
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.master("local[1]").appName("state-store")
        for key, value in s3.spark_conf().items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        results["s3a"] = timed(*files_candidate("s3a://bench/ckpt", spark), args)
        results["spark checkpoint, s3a"] = spark_checkpoint_ms(spark, "s3a://bench/query")
        results["spark checkpoint, local"] = spark_checkpoint_ms(spark, str(work / "query"))
        spark.stop()
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
