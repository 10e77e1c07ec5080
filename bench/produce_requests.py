"""How many produce requests librdkafka sends for records spread over the partitions one broker leads.

The mirror's clients are librdkafka's (confluent-kafka in Python, the rdkafka crate in the compiled core). It puts
one partition's batch in each ProduceRequest, where Kafka's Java producer puts every ready partition of a broker in
one. At a real-time rate spread over many partitions nearly every record is then a request of its own: this counts
them, from librdkafka's own statistics: one record per partition sent at once, and a steady rate round-robin over
the partitions, as the latency probe sends, at each linger.

Usage: .venv/bin/python bench/produce_requests.py [--partitions 64] [--lingers 0,2,5,20] [--rate 10000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import confluent_kafka  # noqa: E402

from bench.testbed import clients as kafka_clients  # noqa: E402
from bench.testbed.testbed import TestBed  # noqa: E402
from spark_app.config import ClusterConfig  # noqa: E402


def produce_requests(cluster: ClusterConfig, topic: str, partitions: int, linger_ms: int, rate: int,
                     seconds: float) -> tuple[int, int]:  # fmt: skip
    """Records sent and ProduceRequests it took one idempotent producer: one record to each of `partitions` flushed
    at once (`rate` 0), else `rate` records a second round-robin over them for `seconds`."""
    kafka_clients.create_topics(cluster, {topic: partitions})
    stats: list[dict] = []
    settings = {"linger.ms": linger_ms, "acks": "all", "enable.idempotence": True, "statistics.interval.ms": 500}
    producer = kafka_clients.producer(cluster, settings | {"stats_cb": lambda s: stats.append(json.loads(s))})
    producer.produce(topic, b"warm-up", partition=0)  # connects, gets its producer id and the topic's metadata
    producer.flush(30)
    before = _produce_requests(producer, stats)
    total = partitions if rate == 0 else int(rate * seconds)
    began = time.perf_counter()
    for n in range(total):
        if rate and (ahead := began + n / rate - time.perf_counter()) > 0.002:
            time.sleep(ahead)
        producer.produce(topic, b"x" * 512, partition=n % partitions)
        producer.poll(0)
    producer.flush(30)
    return total, _produce_requests(producer, stats) - before


def _produce_requests(producer: confluent_kafka.Producer, stats: list[dict]) -> int:
    """ProduceRequests sent so far, from the first statistics emitted after now."""
    seen = len(stats)
    deadline = time.monotonic() + 10
    while len(stats) == seen and time.monotonic() < deadline:
        producer.poll(0.1)
    return sum(b["req"].get("Produce", 0) for b in stats[-1]["brokers"].values() if b["nodeid"] >= 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--lingers", default="0,2,5,20", help="comma-separated linger.ms values")
    parser.add_argument("--rate", type=int, default=10_000, help="records/s of the steady runs")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each steady run")
    args = parser.parse_args()
    bed = TestBed()
    print(f"librdkafka {confluent_kafka.libversion()[0]}, {args.partitions} partitions on one broker, 512 B records")
    try:
        cluster = bed.start("requests", "plaintext").client
        runs = [(linger, rate) for linger in map(int, args.lingers.split(",")) for rate in (0, args.rate)]
        for n, (linger, rate) in enumerate(runs):
            sent, requests = produce_requests(cluster, f"spread-{n}", args.partitions, linger, rate, args.seconds)
            how = "one record per partition, one flush" if rate == 0 else f"{rate:,} records/s for {args.seconds:.0f} s"
            print(f"linger {linger:>3} ms, {how}: {sent:,} records in {requests:,} ProduceRequests"
                  f" ({sent / max(requests, 1):.1f} records per request)")  # fmt: skip
    finally:
        bed.close()


if __name__ == "__main__":
    main()
